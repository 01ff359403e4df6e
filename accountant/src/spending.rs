//! What a job spends per step, by privacy mode. A DP job's ε at δ follows its mechanism (q, σ)
//! with its accountant (PLD or RDP); a TAN simulation reports and enforces the ε of the recipe
//! it simulates, with RDP (cheap at any σ: the job's own σ' is far below anything PLD could
//! discretise); a non-private baseline has no ε (+∞) and no limit but its plan.
//!
//! Each step's ε is computed once, and the next step's is computed in the background while the
//! step trains ([`Spending::prepare`]), so a low σ (large PLD grids: ~1 s per evaluation at
//! σ = 0.065) never sits on the release path.
//!
//! The one-step work (a PLD's discretisation: megabytes) is kept only once a job asks for ε,
//! i.e. once it runs: a queued job holds its step limit and nothing more.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::task::JoinHandle;

use crate::error::AccountantError;
use crate::privacy::contract::{Mode, PrivacyContract};
use crate::privacy::{self, AccountantKind, EpsilonCurve};

/// ε values kept per job (one per step, from the oldest still asked for).
const MEMO_KEPT: usize = 8;

type Computing = JoinHandle<Result<f64, privacy::PrivacyError>>;

/// A job's ε curve, built on first use from its mechanism.
#[derive(Debug)]
struct Curve {
    kind: AccountantKind,
    sample_rate: f64,
    noise_multiplier: f64,
    delta: f64,
    built: OnceLock<EpsilonCurve>,
}

impl Curve {
    /// The curve, built now if it was not (a blocking computation: call it off the runtime).
    fn get(&self) -> Result<&EpsilonCurve, privacy::PrivacyError> {
        if let Some(curve) = self.built.get() {
            return Ok(curve);
        }
        let curve = EpsilonCurve::new(self.kind, self.sample_rate, self.noise_multiplier, self.delta)?;
        Ok(self.built.get_or_init(|| curve))
    }

    fn epsilon_after(&self, steps: u64) -> Result<f64, privacy::PrivacyError> {
        Ok(self.get()?.epsilon_after(steps))
    }
}

/// One job's ε per step (see the module docs).
#[derive(Debug)]
pub struct Spending {
    mode: Mode,
    /// None for a baseline.
    curve: Option<Arc<Curve>>,
    max_steps: u64,
    memo: Mutex<BTreeMap<u64, f64>>,
    ahead: Mutex<Option<(u64, Computing)>>,
}

impl Spending {
    /// The job's spending with `charged` steps already charged; and ε after them.
    pub async fn build(contract: &PrivacyContract, charged: u64) -> Result<(Self, f64), AccountantError> {
        let mode = contract.mode;
        let (delta, target) = (contract.delta, contract.epsilon_target.unwrap_or(f64::INFINITY));
        let Some((kind, q, sigma)) = contract.epsilon_mechanism() else {
            let spending = Self::with(mode, None, privacy::calibrate::STEPS_LIMIT);
            return Ok((spending, if charged == 0 { 0.0 } else { f64::INFINITY }));
        };
        let (max_steps, spent) = AccountantError::blocking(move || -> Result<_, privacy::PrivacyError> {
            let curve = EpsilonCurve::new(kind, q, sigma, delta)?;
            let max_steps = privacy::max_steps(&curve, target).unwrap_or(privacy::calibrate::STEPS_LIMIT);
            Ok((max_steps, curve.epsilon_after(charged)))
        })
        .await??;
        let curve = Curve { kind, sample_rate: q, noise_multiplier: sigma, delta, built: OnceLock::new() };
        let spending = Self::with(mode, Some(Arc::new(curve)), max_steps);
        spending.memo.lock().expect("memo lock").insert(charged, spent);
        Ok((spending, spent))
    }

    fn with(mode: Mode, curve: Option<Arc<Curve>>, max_steps: u64) -> Self {
        Self { mode, curve, max_steps, memo: Mutex::default(), ahead: Mutex::new(None) }
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The accountant the ε comes from (RDP for a simulation; PLD, unused, for a baseline).
    pub fn kind(&self) -> AccountantKind {
        self.curve.as_ref().map_or(AccountantKind::Pld, |c| c.kind)
    }

    /// The most steps within the ε target.
    pub fn max_steps(&self) -> u64 {
        self.max_steps
    }

    /// Whether the one-step work is held (tests: a queued job holds none).
    pub fn curve_built(&self) -> bool {
        self.curve.as_ref().is_some_and(|c| c.built.get().is_some())
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
        .map_err(|e| AccountantError::Internal(format!("epsilon task failed: {e}")))??;
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
    use crate::privacy::contract::{Mechanism, PrivacyUnit, Recipe};

    fn contract(mode: Mode, sigma: f64, target: Option<f64>) -> PrivacyContract {
        PrivacyContract {
            mechanism: Mechanism { sample_rate: 0.01, noise_multiplier: sigma, clipping_norm: 1.0 },
            accountant: AccountantKind::Pld,
            delta: 1e-5,
            epsilon_target: target,
            mode,
            unit: PrivacyUnit::Example,
            dataset_id: String::new(),
            data_id: String::new(),
            audit: None,
            init_from_job: None,
            planned_steps: 100,
        }
    }

    #[tokio::test]
    async fn epsilon_computed_ahead_equals_epsilon_computed_on_demand() {
        let c = contract(Mode::Dp, 1.0, Some(8.0));
        let (ahead, spent) = Spending::build(&c, 0).await.unwrap();
        assert_eq!(spent, 0.0);
        ahead.prepare(7);
        let (now, _) = Spending::build(&c, 0).await.unwrap();
        assert!(!now.curve_built(), "built on first use only");
        assert_eq!(ahead.epsilon_after(7).await.unwrap(), now.epsilon_after(7).await.unwrap());
        assert!(ahead.ahead.lock().unwrap().is_none(), "taken once");
        assert_eq!(ahead.epsilon_after(7).await.unwrap(), now.epsilon_after(7).await.unwrap(), "then remembered");
    }

    #[tokio::test]
    async fn a_simulation_reports_its_targets_epsilon_with_rdp_and_a_baseline_reports_none() {
        let target = Recipe { sample_rate: 0.1, noise_multiplier: 2.0 };
        let (sim, _) = Spending::build(&contract(Mode::Simulation { target }, 0.02, Some(8.0)), 0).await.unwrap();
        let rdp = EpsilonCurve::new(AccountantKind::Rdp, 0.1, 2.0, 1e-5).unwrap();
        assert_eq!(sim.kind(), AccountantKind::Rdp);
        assert_eq!(sim.epsilon_after(50).await.unwrap(), rdp.epsilon_after(50));
        let (baseline, spent) = Spending::build(&contract(Mode::NotPrivate, 0.0, None), 3).await.unwrap();
        assert_eq!(spent, f64::INFINITY);
        assert_eq!(baseline.epsilon_after(4).await.unwrap(), f64::INFINITY);
        assert_eq!(baseline.max_steps(), privacy::calibrate::STEPS_LIMIT);
    }
}
