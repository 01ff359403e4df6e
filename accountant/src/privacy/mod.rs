//! Privacy accounting for DP-SGD: the Poisson-subsampled Gaussian mechanism, composed over
//! steps and over segments whose rate or noise may differ, reported as ε at δ.
//!
//! Pure math: no I/O, no tokio, no clocks. Two accountants: [`pld`] (tight, the default) and
//! [`rdp`]; [`calibrate`] inverts them for σ or for the number of steps.

pub mod calibrate;
pub mod pld;
pub mod rdp;
pub mod special;

use std::fmt;
use std::str::FromStr;

pub use calibrate::{max_steps, noise_multiplier};

/// Which accountant turns a mechanism's history into (ε, δ).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum AccountantKind {
    /// Privacy loss distributions ("connect the dots", grid 1e-4): tight, an upper bound.
    #[default]
    Pld,
    /// Rényi DP over the default orders: looser, cheap.
    Rdp,
}

impl fmt::Display for AccountantKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AccountantKind::Pld => "pld",
            AccountantKind::Rdp => "rdp",
        })
    }
}

impl FromStr for AccountantKind {
    type Err = PrivacyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pld" => Ok(AccountantKind::Pld),
            "rdp" => Ok(AccountantKind::Rdp),
            other => Err(PrivacyError::invalid("accountant", other, "must be pld or rdp")),
        }
    }
}

/// A bad accounting parameter: which one, its value, and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PrivacyError {
    /// A parameter is outside its domain.
    #[error("invalid {field} {value}: {reason}")]
    Invalid {
        /// The parameter's name (snake_case, as in the job spec and the protocol).
        field: &'static str,
        /// The offending value as given.
        value: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// A calibration has no solution in range.
    #[error("no {what} satisfies epsilon {epsilon} at delta {delta}: {reason}")]
    Unreachable {
        /// What was being solved for.
        what: &'static str,
        /// The ε target.
        epsilon: f64,
        /// The δ.
        delta: f64,
        /// Why there is no solution.
        reason: &'static str,
    },
}

impl PrivacyError {
    pub(crate) fn invalid(field: &'static str, value: impl fmt::Display, reason: &'static str) -> Self {
        PrivacyError::Invalid { field, value: value.to_string(), reason }
    }
}

/// `steps` runs of the Poisson-subsampled Gaussian with rate q and noise multiplier σ.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Segment {
    /// Poisson sampling rate q in (0, 1].
    pub sample_rate: f64,
    /// Noise std divided by the clipping norm C; > 0.
    pub noise_multiplier: f64,
    /// Number of compositions.
    pub steps: u64,
}

impl Segment {
    /// A validated segment.
    pub fn new(sample_rate: f64, noise_multiplier: f64, steps: u64) -> Result<Self, PrivacyError> {
        check_sample_rate(sample_rate)?;
        check_noise_multiplier(noise_multiplier)?;
        Ok(Self { sample_rate, noise_multiplier, steps })
    }
}

/// q must lie in (0, 1].
pub fn check_sample_rate(q: f64) -> Result<(), PrivacyError> {
    if q > 0.0 && q <= 1.0 { Ok(()) } else { Err(PrivacyError::invalid("sample_rate", q, "must be in (0, 1]")) }
}

/// σ must be finite and > 0.
pub fn check_noise_multiplier(sigma: f64) -> Result<(), PrivacyError> {
    if sigma > 0.0 && sigma.is_finite() {
        Ok(())
    } else {
        Err(PrivacyError::invalid("noise_multiplier", sigma, "must be a finite number > 0"))
    }
}

/// δ must lie in (0, 1).
pub fn check_delta(delta: f64) -> Result<(), PrivacyError> {
    if delta > 0.0 && delta < 1.0 { Ok(()) } else { Err(PrivacyError::invalid("delta", delta, "must be in (0, 1)")) }
}

/// ε targets must be finite and > 0.
pub fn check_epsilon(epsilon: f64) -> Result<(), PrivacyError> {
    if epsilon > 0.0 && epsilon.is_finite() {
        Ok(())
    } else {
        Err(PrivacyError::invalid("epsilon", epsilon, "must be a finite number > 0"))
    }
}

/// ε at δ after composing `segments` in order.
pub fn epsilon(kind: AccountantKind, segments: &[Segment], delta: f64) -> Result<f64, PrivacyError> {
    check_delta(delta)?;
    for s in segments {
        Segment::new(s.sample_rate, s.noise_multiplier, s.steps)?;
    }
    match kind {
        AccountantKind::Rdp => {
            let mut curve = rdp::RdpCurve::new(rdp::default_orders())?;
            segments.iter().for_each(|s| curve.compose(s));
            Ok(curve.epsilon(delta).epsilon)
        }
        AccountantKind::Pld => {
            Ok(pld::Pld::for_segments(segments, pld::PldOptions::default())?.epsilon_for_delta(delta))
        }
    }
}

/// ε at δ as a function of the number of steps of one fixed mechanism, with the one-step
/// work (PLD discretisation, RDP per order) done once. The accountant service keeps one per job.
#[derive(Debug, Clone)]
pub struct EpsilonCurve {
    kind: AccountantKind,
    sample_rate: f64,
    noise_multiplier: f64,
    delta: f64,
    one_step: OneStep,
}

#[derive(Debug, Clone)]
enum OneStep {
    Pld(pld::Pld),
    Rdp(rdp::RdpCurve),
}

impl EpsilonCurve {
    /// The curve of the subsampled Gaussian (q, σ) at δ.
    pub fn new(
        kind: AccountantKind,
        sample_rate: f64,
        noise_multiplier: f64,
        delta: f64,
    ) -> Result<Self, PrivacyError> {
        let segment = Segment::new(sample_rate, noise_multiplier, 1)?;
        check_delta(delta)?;
        let one_step = match kind {
            AccountantKind::Rdp => {
                let mut curve = rdp::RdpCurve::new(rdp::default_orders())?;
                curve.compose(&segment);
                OneStep::Rdp(curve)
            }
            AccountantKind::Pld => OneStep::Pld(pld::Pld::for_segments(&[segment], pld::PldOptions::default())?),
        };
        Ok(Self { kind, sample_rate, noise_multiplier, delta, one_step })
    }

    /// The accountant this curve uses.
    pub fn kind(&self) -> AccountantKind {
        self.kind
    }

    /// ε at δ after `steps` steps (0 for none).
    pub fn epsilon_after(&self, steps: u64) -> f64 {
        if steps == 0 {
            return 0.0;
        }
        match &self.one_step {
            OneStep::Rdp(one) => one.repeated(steps).epsilon(self.delta).epsilon,
            OneStep::Pld(one) => {
                let options = pld::PldOptions::default();
                match one.self_compose(steps, options) {
                    Some(many) => many.epsilon_for_delta(self.delta),
                    None => {
                        let segment =
                            Segment { sample_rate: self.sample_rate, noise_multiplier: self.noise_multiplier, steps };
                        pld::Pld::for_segments(&[segment], options)
                            .map(|p| p.epsilon_for_delta(self.delta))
                            .unwrap_or(f64::INFINITY)
                    }
                }
            }
        }
    }
}
