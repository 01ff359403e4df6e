//! What a job spends per step, by privacy mode. A DP job's ε at δ follows its mechanism (q, σ)
//! with its accountant (PLD or RDP); a TAN simulation reports and enforces the ε of the recipe
//! it simulates, with RDP (cheap at any σ: the job's own σ' is far below anything PLD could
//! discretise); a non-private baseline has no ε (+∞) and no limit but its plan.
//!
//! Each step's ε is computed once, and the next step's is computed in the background while the
//! step trains ([`Spending::prepare`]), so a low σ (large PLD grids: ~1 s per evaluation at
//! σ = 0.065) never sits on the release path.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;

use crate::error::AccountantError;
use crate::ledger::Registration;
use crate::privacy::{self, AccountantKind, EpsilonCurve};

/// ε values kept per job (one per step, from the oldest still asked for).
const MEMO_KEPT: usize = 8;

/// The mechanism a TAN job simulates (recorded in its registration).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Simulated {
    /// The target's Poisson rate q = B/N.
    pub sample_rate: f64,
    /// The target's σ.
    pub noise_multiplier: f64,
}

/// A job's privacy mode, as its registration says.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// ε at δ of the job's own mechanism.
    Dp,
    /// σ = 0: no guarantee.
    NotPrivate,
    /// No guarantee; reports the simulated recipe's ε.
    Simulation(Simulated),
}

impl Mode {
    /// The registration's mode, with its fields checked: a baseline adds no noise and has no
    /// ε target; a simulation names a valid target mechanism.
    pub fn of(r: &Registration) -> Result<Self, AccountantError> {
        // Noise of std σ·C that rounds to 0 (or a subnormal) is no noise: only a baseline has it.
        let noisy = r.noise_multiplier * r.clipping_norm >= f64::MIN_POSITIVE;
        if r.privacy != "not_private" && !noisy {
            return Err(AccountantError::invalid(
                "noise_multiplier",
                format!("{} times clipping_norm {} is no noise", r.noise_multiplier, r.clipping_norm),
            ));
        }
        match (r.privacy.as_str(), r.simulated) {
            ("dp", None) => {
                privacy::check_noise_multiplier(r.noise_multiplier)?;
                check_target(r.epsilon_target)?;
                Ok(Mode::Dp)
            }
            ("not_private", None) => {
                if r.noise_multiplier != 0.0 || r.epsilon_target != 0.0 {
                    return Err(AccountantError::invalid(
                        "privacy",
                        format!(
                            "a NOT_PRIVATE job has noise_multiplier 0 and epsilon_target 0, not {} and {}",
                            r.noise_multiplier, r.epsilon_target
                        ),
                    ));
                }
                Ok(Mode::NotPrivate)
            }
            ("simulation", Some(target)) => {
                privacy::check_noise_multiplier(r.noise_multiplier)?;
                privacy::check_sample_rate(target.sample_rate)?;
                privacy::check_noise_multiplier(target.noise_multiplier)?;
                check_target(r.epsilon_target)?;
                Ok(Mode::Simulation(target))
            }
            ("simulation", None) => {
                Err(AccountantError::invalid("simulated", "a SIMULATION names its target mechanism"))
            }
            (_, Some(_)) => Err(AccountantError::invalid("simulated", "only a SIMULATION names a target mechanism")),
            (other, None) => Err(AccountantError::invalid("privacy", format!("unknown mode {other:?}"))),
        }
    }

    /// The mode's name in the ledger and in metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Dp => "dp",
            Mode::NotPrivate => "not_private",
            Mode::Simulation(_) => "simulation",
        }
    }

    /// Whether releases carry the job's DP guarantee (and count against dataset budgets).
    pub fn is_private(self) -> bool {
        self == Mode::Dp
    }
}

fn check_target(epsilon: f64) -> Result<(), AccountantError> {
    if epsilon > 0.0 && epsilon.is_finite() {
        return Ok(());
    }
    Err(AccountantError::invalid("epsilon_target", format!("{epsilon} must be a finite number > 0")))
}

type Computing = JoinHandle<f64>;

/// One job's ε per step (see the module docs).
#[derive(Debug)]
pub struct Spending {
    mode: Mode,
    /// None for a baseline.
    curve: Option<EpsilonCurve>,
    max_steps: u64,
    memo: Mutex<BTreeMap<u64, f64>>,
    ahead: Mutex<Option<(u64, Computing)>>,
}

impl Spending {
    /// The job's spending with `charged` steps already charged; and ε after them.
    pub async fn build(r: &Registration, charged: u64) -> Result<(Self, f64), AccountantError> {
        let mode = Mode::of(r)?;
        let kind: AccountantKind = r.accountant.parse()?;
        let (delta, target) = (r.delta, r.epsilon_target);
        let mechanism = match mode {
            Mode::Dp => Some((kind, r.sample_rate, r.noise_multiplier)),
            Mode::Simulation(s) => Some((AccountantKind::Rdp, s.sample_rate, s.noise_multiplier)),
            Mode::NotPrivate => None,
        };
        let Some((kind, q, sigma)) = mechanism else {
            let spending = Self::with(mode, None, privacy::calibrate::STEPS_LIMIT);
            return Ok((spending, if charged == 0 { 0.0 } else { f64::INFINITY }));
        };
        let (curve, max_steps, spent) = crate::accountant::blocking(move || -> Result<_, privacy::PrivacyError> {
            let curve = EpsilonCurve::new(kind, q, sigma, delta)?;
            let max_steps = privacy::max_steps(&curve, target).unwrap_or(privacy::calibrate::STEPS_LIMIT);
            let spent = curve.epsilon_after(charged);
            Ok((curve, max_steps, spent))
        })
        .await??;
        let spending = Self::with(mode, Some(curve), max_steps);
        spending.memo.lock().expect("memo lock").insert(charged, spent);
        Ok((spending, spent))
    }

    fn with(mode: Mode, curve: Option<EpsilonCurve>, max_steps: u64) -> Self {
        Self { mode, curve, max_steps, memo: Mutex::default(), ahead: Mutex::new(None) }
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The accountant the ε comes from (RDP for a simulation; PLD, unused, for a baseline).
    pub fn kind(&self) -> AccountantKind {
        self.curve.as_ref().map_or(AccountantKind::Pld, EpsilonCurve::kind)
    }

    /// The most steps within the ε target.
    pub fn max_steps(&self) -> u64 {
        self.max_steps
    }

    /// Starts computing ε after `steps` in the background (replacing any other).
    pub fn prepare(&self, steps: u64) {
        let Some(curve) = self.curve.clone() else { return };
        if self.memo.lock().expect("memo lock").contains_key(&steps) {
            return;
        }
        let task = tokio::task::spawn_blocking(move || curve.epsilon_after(steps));
        if let Some((_, stale)) = self.ahead.lock().expect("ahead lock").replace((steps, task)) {
            stale.abort();
        }
    }

    /// ε at δ after `steps` steps: remembered, computed ahead, or computed now.
    pub async fn epsilon_after(&self, steps: u64) -> Result<f64, AccountantError> {
        let Some(curve) = self.curve.clone() else {
            return Ok(if steps == 0 { 0.0 } else { f64::INFINITY });
        };
        if let Some(&epsilon) = self.memo.lock().expect("memo lock").get(&steps) {
            return Ok(epsilon);
        }
        let ready = {
            let mut ahead = self.ahead.lock().expect("ahead lock");
            if ahead.as_ref().is_some_and(|(s, _)| *s == steps) { ahead.take() } else { None }
        };
        let epsilon = match ready {
            Some((_, task)) => task.await,
            None => tokio::task::spawn_blocking(move || curve.epsilon_after(steps)).await,
        }
        .map_err(|e| AccountantError::Internal(format!("epsilon task failed: {e}")))?;
        let mut memo = self.memo.lock().expect("memo lock");
        memo.insert(steps, epsilon);
        while memo.len() > MEMO_KEPT {
            memo.pop_first();
        }
        Ok(epsilon)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registration(privacy: &str, sigma: f64, target: f64, simulated: Option<Simulated>) -> Registration {
        Registration {
            job_id: "j".into(),
            sample_rate: 0.01,
            noise_multiplier: sigma,
            clipping_norm: 1.0,
            delta: 1e-5,
            epsilon_target: target,
            accountant: "pld".into(),
            gradient_dim: 4,
            parts: 1,
            dataset_id: String::new(),
            dataset_epsilon_budget: 0.0,
            insecure_noise_seed: None,
            privacy: privacy.into(),
            simulated,
            audit_canaries: 0,
            audit_coordinates: String::new(),
        }
    }

    #[tokio::test]
    async fn epsilon_computed_ahead_equals_epsilon_computed_on_demand() {
        let r = registration("dp", 1.0, 8.0, None);
        let (ahead, spent) = Spending::build(&r, 0).await.unwrap();
        assert_eq!(spent, 0.0);
        ahead.prepare(7);
        let (now, _) = Spending::build(&r, 0).await.unwrap();
        assert_eq!(ahead.epsilon_after(7).await.unwrap(), now.epsilon_after(7).await.unwrap());
        assert!(ahead.ahead.lock().unwrap().is_none(), "taken once");
        assert_eq!(ahead.epsilon_after(7).await.unwrap(), now.epsilon_after(7).await.unwrap(), "then remembered");
    }

    #[tokio::test]
    async fn a_simulation_reports_its_targets_epsilon_with_rdp_and_a_baseline_reports_none() {
        let target = Simulated { sample_rate: 0.1, noise_multiplier: 2.0 };
        let (sim, _) = Spending::build(&registration("simulation", 0.02, 8.0, Some(target)), 0).await.unwrap();
        let rdp = EpsilonCurve::new(AccountantKind::Rdp, 0.1, 2.0, 1e-5).unwrap();
        assert_eq!(sim.kind(), AccountantKind::Rdp);
        assert_eq!(sim.epsilon_after(50).await.unwrap(), rdp.epsilon_after(50));
        let (baseline, spent) = Spending::build(&registration("not_private", 0.0, 0.0, None), 3).await.unwrap();
        assert_eq!(spent, f64::INFINITY);
        assert_eq!(baseline.epsilon_after(4).await.unwrap(), f64::INFINITY);
        assert_eq!(baseline.max_steps(), privacy::calibrate::STEPS_LIMIT);
    }

    #[test]
    fn modes_check_their_fields() {
        let bad = [
            registration("not_private", 0.5, 0.0, None),
            registration("not_private", 0.0, 8.0, None),
            registration("simulation", 0.5, 8.0, None),
            registration("dp", 0.5, 8.0, Some(Simulated { sample_rate: 0.1, noise_multiplier: 1.0 })),
            registration("dp", 0.0, 8.0, None),
            registration("none", 0.5, 8.0, None),
            registration("dp", 1e-320, 8.0, None),
        ];
        for r in bad {
            assert!(Mode::of(&r).is_err(), "{} sigma {} target {}", r.privacy, r.noise_multiplier, r.epsilon_target);
        }
        assert_eq!(Mode::of(&registration("not_private", 0.0, 0.0, None)).unwrap(), Mode::NotPrivate);
        assert!(Mode::of(&registration("dp", 0.5, 8.0, None)).unwrap().is_private());
    }
}
