//! Privacy accounting for DP-SGD: the Poisson-subsampled Gaussian mechanism, composed over
//! steps and over segments whose rate or noise may differ, reported as ε at δ.
//!
//! This crate owns the numbers every privacy claim rests on, so it must never under-report:
//! every ε it returns is an upper bound. It is pure math — no I/O, no tokio, no clocks — so the
//! accountant service, the coordinator's calibration and `dpctl` share one implementation.
//! Two accountants: [`pld`] (tight, the default) and [`rdp`]; [`calibrate`] inverts them for σ
//! or for the number of steps.

pub mod audit;
mod calibrate;
pub mod contract;
mod history;
pub mod pld;
pub mod rdp;
pub mod recipes;
pub mod special;

use std::fmt;
use std::str::FromStr;

pub use calibrate::{STEPS_LIMIT, max_steps, noise_multiplier};
pub use contract::{ContractError, Mechanism, Mode, ModeKind, PrivacyContract, PrivacyUnit};
pub use history::{RdpSteps, merged};

/// Which accountant turns a mechanism's history into (ε, δ).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccountantKind {
    /// Privacy loss distributions ("connect the dots", grid 1e-4): tight, an upper bound.
    /// Where no grid can hold the losses (σ far below 0.005) it reports the RDP bound.
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

/// ε at δ after composing `segments` in order. Never below the true ε: the PLD where its grid
/// holds the losses (tight), else the RDP bound; see [`pld_epsilon`]. Segments of one
/// mechanism are composed as one ([`merged`]): the cost follows the mechanisms, not
/// the segments.
pub fn epsilon(kind: AccountantKind, segments: &[Segment], delta: f64) -> Result<f64, PrivacyError> {
    check_delta(delta)?;
    for s in segments {
        Segment::new(s.sample_rate, s.noise_multiplier, s.steps)?;
    }
    let segments = &history::merged(segments);
    Ok(match kind {
        AccountantKind::Rdp => rdp_epsilon(segments, delta),
        AccountantKind::Pld => pld_epsilon(segments, delta),
    })
}

/// ε at δ by RDP over the default orders: a closed-form upper bound at any σ.
fn rdp_epsilon(segments: &[Segment], delta: f64) -> f64 {
    let mut curve = rdp::RdpCurve::new(rdp::default_orders()).expect("the default orders are all > 1");
    segments.iter().for_each(|s| curve.compose(s));
    curve.epsilon(delta).epsilon
}

/// ε at δ by PLD, falling back to RDP where the PLD cannot hold the losses (their support
/// would need more points than allowed even on a grid of about 1 nat: σ far below 0.005, or
/// ε in the millions), where one segment has more steps than an FFT power composes exactly
/// (2^24), or where its numbers went wrong. Where the grid had to be coarsened the smaller of
/// the two upper bounds is reported; on the finest grid the PLD alone, the tighter.
fn pld_epsilon(segments: &[Segment], delta: f64) -> f64 {
    let options = pld::PldOptions::default();
    match pld::Pld::for_segments(segments, options) {
        Ok(pld) => settle(pld.epsilon_for_delta(delta), pld.discretization() > options.discretization, || {
            rdp_epsilon(segments, delta)
        }),
        Err(_) => rdp_epsilon(segments, delta),
    }
}

/// A PLD ε made safe: NaN (lost numbers) gives way to RDP; an infinite one (δ below the mass
/// cut from the tails) or one from a coarsened grid is capped by RDP, as both are upper bounds.
fn settle(pld: f64, coarsened: bool, rdp: impl FnOnce() -> f64) -> f64 {
    if pld.is_nan() {
        rdp()
    } else if coarsened || pld.is_infinite() {
        pld.min(rdp())
    } else {
        pld
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
    /// The one-step PLD on the finest grid; None when one step already spans more than an
    /// eighth of the longest grid (small σ: ε of hundreds of nats within a few steps), where
    /// composing it would hardly ever fit, and each evaluation sizes its own grid instead.
    Pld(Option<pld::Pld>),
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
            AccountantKind::Pld => {
                let options = pld::PldOptions::default();
                let h = options.discretization;
                let mechanism = pld::SubsampledGaussian::new(sample_rate, noise_multiplier);
                let fits = mechanism.grid_points(h) <= options.max_len / 8;
                OneStep::Pld(fits.then(|| pld::Pld::one_step(&mechanism, h)).filter(pld::Pld::is_sane))
            }
        };
        Ok(Self { kind, sample_rate, noise_multiplier, delta, one_step })
    }

    /// The accountant this curve uses.
    pub fn kind(&self) -> AccountantKind {
        self.kind
    }

    /// ε at δ after `steps` steps (0 for none); never below the true ε, as [`epsilon`].
    pub fn epsilon_after(&self, steps: u64) -> f64 {
        if steps == 0 {
            return 0.0;
        }
        let segment = Segment { sample_rate: self.sample_rate, noise_multiplier: self.noise_multiplier, steps };
        match &self.one_step {
            OneStep::Rdp(one) => one.repeated(steps).epsilon(self.delta).epsilon,
            OneStep::Pld(one) => {
                let options = pld::PldOptions::default();
                match one.as_ref().and_then(|one| one.self_compose(steps, options)) {
                    Some(many) => {
                        settle(many.epsilon_for_delta(self.delta), false, || rdp_epsilon(&[segment], self.delta))
                    }
                    None => pld_epsilon(&[segment], self.delta),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pld_falls_back_to_rdp_where_no_grid_holds_the_losses() {
        let segments = [Segment::new(0.5, 1e-4, 10).unwrap()];
        let (pld, rdp) = (epsilon(AccountantKind::Pld, &segments, 1e-5), epsilon(AccountantKind::Rdp, &segments, 1e-5));
        assert_eq!(pld, rdp);
        let curve = EpsilonCurve::new(AccountantKind::Pld, 0.5, 1e-4, 1e-5).unwrap();
        assert_eq!(Ok(curve.epsilon_after(10)), rdp);
        assert!(rdp.unwrap() > 5e7, "one inclusion alone is worth 5e7 nats");
    }
}
