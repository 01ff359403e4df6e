//! What a job spends per step, by privacy mode. A DP job's ε at δ follows its mechanism (q, σ)
//! with its accountant (PLD or RDP); a TAN simulation reports and enforces the ε of the recipe
//! it simulates, with RDP (cheap at any σ: the job's own σ' is far below anything PLD could
//! discretise); a non-private baseline has no ε (+∞) and no limit but its plan.
//!
//! Each step's ε is computed once, and the next step's is computed in the background while the
//! step trains ([`Spending::prepare`]), so a low σ (large PLD grids: ~1 s per evaluation at
//! σ = 0.065) never sits on the release path.
//!
//! The one-step work (a PLD's discretisation: up to tens of megabytes) is kept only while a job
//! runs: a queued job holds its step limit and nothing more, and an ended or suspended one lets
//! it go ([`Spending::let_go`]). Jobs of one mechanism share it, and every job's step limit and
//! replayed ε are remembered by mechanism ([`Curves`]), so a sweep of one setting computes them
//! once and a restart does not compute them again per job.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};

use tokio::task::JoinHandle;

use crate::error::AccountantError;
use crate::privacy::contract::{Mode, PrivacyContract};
use crate::privacy::{self, AccountantKind, EpsilonCurve};
use crate::records::ClosedSpend;

/// ε values kept per job (one per step, from the oldest still asked for).
const MEMO_KEPT: usize = 8;

type Computing = JoinHandle<Result<f64, privacy::PrivacyError>>;

/// Values kept per mechanism before the memo starts over (each a few bytes).
const VALUES_KEPT: usize = 1 << 16;

/// A mechanism exactly: the accountant and the bit patterns of q, σ and δ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct MechanismKey {
    kind: AccountantKind,
    sample_rate: u64,
    noise_multiplier: u64,
    delta: u64,
}

/// What is remembered of a mechanism beyond its curve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Value {
    /// The most steps within an ε target (its bits).
    MaxSteps { target: u64 },
    /// ε after this many steps.
    EpsilonAfter { steps: u64 },
}

/// Every job's curves and values by mechanism (see the module docs): curves shared while some
/// job holds them, values kept up to [`VALUES_KEPT`].
#[derive(Debug, Default)]
pub struct Curves {
    shared: Mutex<HashMap<MechanismKey, Weak<EpsilonCurve>>>,
    values: Mutex<HashMap<(MechanismKey, Value), f64>>,
}

impl Curves {
    /// The mechanism's curve: the one a running job holds, else built now (blocking: call it
    /// off the runtime).
    fn curve(&self, key: MechanismKey) -> Result<Arc<EpsilonCurve>, privacy::PrivacyError> {
        if let Some(curve) = self.shared.lock().expect("curves lock").get(&key).and_then(Weak::upgrade) {
            return Ok(curve);
        }
        let (q, sigma, delta) =
            (f64::from_bits(key.sample_rate), f64::from_bits(key.noise_multiplier), f64::from_bits(key.delta));
        let curve = Arc::new(EpsilonCurve::new(key.kind, q, sigma, delta)?);
        let mut shared = self.shared.lock().expect("curves lock");
        shared.retain(|_, weak| weak.strong_count() > 0);
        shared.insert(key, Arc::downgrade(&curve));
        Ok(curve)
    }

    /// A remembered value, or `compute` it with the mechanism's curve (blocking) and remember it.
    fn value(
        &self,
        key: MechanismKey,
        value: Value,
        compute: impl FnOnce(&EpsilonCurve) -> f64,
    ) -> Result<f64, privacy::PrivacyError> {
        if let Some(&kept) = self.values.lock().expect("values lock").get(&(key, value)) {
            return Ok(kept);
        }
        let computed = compute(&*self.curve(key)?);
        let mut values = self.values.lock().expect("values lock");
        if values.len() >= VALUES_KEPT {
            values.clear();
        }
        values.insert((key, value), computed);
        Ok(computed)
    }
}

/// A job's ε curve, held from its first use until the job lets it go.
#[derive(Debug)]
struct Curve {
    key: MechanismKey,
    curves: Arc<Curves>,
    held: Mutex<Option<Arc<EpsilonCurve>>>,
}

impl Curve {
    /// The curve, got now if not held (a blocking computation: call it off the runtime).
    fn get(&self) -> Result<Arc<EpsilonCurve>, privacy::PrivacyError> {
        if let Some(curve) = self.held.lock().expect("curve lock").as_ref() {
            return Ok(curve.clone());
        }
        let curve = self.curves.curve(self.key)?;
        *self.held.lock().expect("curve lock") = Some(curve.clone());
        Ok(curve)
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
    /// The job's spending with `charged` steps already charged; and ε after them. The step
    /// limit and that ε come from what its close `recorded` when that covers every charge, else
    /// from `curves` when a job of the same mechanism computed them, else are computed now.
    pub async fn build(
        contract: &PrivacyContract,
        charged: u64,
        recorded: Option<ClosedSpend>,
        curves: &Arc<Curves>,
    ) -> Result<(Self, f64), AccountantError> {
        let mode = contract.mode;
        let (delta, target) = (contract.delta, contract.epsilon_target.unwrap_or(f64::INFINITY));
        let Some((kind, q, sigma)) = contract.epsilon_mechanism() else {
            let spending = Self::with(mode, None, privacy::STEPS_LIMIT);
            return Ok((spending, if charged == 0 { 0.0 } else { f64::INFINITY }));
        };
        privacy::Segment::new(q, sigma, charged)?;
        privacy::check_delta(delta)?;
        let key =
            MechanismKey { kind, sample_rate: q.to_bits(), noise_multiplier: sigma.to_bits(), delta: delta.to_bits() };
        let kept = curves.clone();
        // Only a record that covers every charge and holds sane values stands in for the math.
        let sane = |r: &ClosedSpend| r.charged == charged && r.epsilon_spent >= 0.0 && r.max_steps >= charged;
        let recorded = recorded.filter(sane).map(|r| (r.max_steps, r.epsilon_spent));
        let (max_steps, spent) = match recorded {
            Some(recorded) => recorded,
            None => Self::compute(key, target, charged, kept).await?,
        };
        let curve = Curve { key, curves: curves.clone(), held: Mutex::new(None) };
        let spending = Self::with(mode, Some(Arc::new(curve)), max_steps);
        spending.memo.lock().expect("memo lock").insert(charged, spent);
        Ok((spending, spent))
    }

    /// The step limit at `target` and ε after `charged` steps of the mechanism, from `kept`
    /// or computed (off the runtime).
    async fn compute(
        key: MechanismKey,
        target: f64,
        charged: u64,
        kept: Arc<Curves>,
    ) -> Result<(u64, f64), AccountantError> {
        Ok(AccountantError::blocking(move || -> Result<_, privacy::PrivacyError> {
            let max_steps = kept.value(key, Value::MaxSteps { target: target.to_bits() }, |curve| {
                privacy::max_steps(curve, target).unwrap_or(privacy::STEPS_LIMIT) as f64
            })?;
            let spent =
                kept.value(key, Value::EpsilonAfter { steps: charged }, |curve| curve.epsilon_after(charged))?;
            Ok((max_steps as u64, spent))
        })
        .await??)
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
        self.curve.as_ref().map_or(AccountantKind::Pld, |c| c.key.kind)
    }

    /// The most steps within the ε target.
    pub fn max_steps(&self) -> u64 {
        self.max_steps
    }

    /// Whether the one-step work is held (tests: a queued job holds none).
    pub fn curve_built(&self) -> bool {
        self.curve.as_ref().is_some_and(|c| c.held.lock().expect("curve lock").is_some())
    }

    /// Lets the one-step work go (an ended, suspended or requeued job): it is got again if the
    /// job runs again.
    pub fn let_go(&self) {
        if let Some(curve) = &self.curve {
            *curve.held.lock().expect("curve lock") = None;
        }
        if let Some((_, computing)) = self.ahead.lock().expect("ahead lock").take() {
            computing.abort();
        }
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
        .map_err(|source| AccountantError::Task { what: "epsilon", source })??;
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
            shards_id: String::new(),
            audit: None,
            init_from_job: None,
            planned_steps: 100,
        }
    }

    #[tokio::test]
    async fn epsilon_computed_ahead_equals_epsilon_computed_on_demand() {
        let c = contract(Mode::Dp, 1.0, Some(8.0));
        let (ahead, spent) = Spending::build(&c, 0, None, &Arc::default()).await.unwrap();
        assert_eq!(spent, 0.0);
        ahead.prepare(7);
        let (now, _) = Spending::build(&c, 0, None, &Arc::default()).await.unwrap();
        assert!(!now.curve_built(), "built on first use only");
        assert_eq!(ahead.epsilon_after(7).await.unwrap(), now.epsilon_after(7).await.unwrap());
        assert!(ahead.ahead.lock().unwrap().is_none(), "taken once");
        assert_eq!(ahead.epsilon_after(7).await.unwrap(), now.epsilon_after(7).await.unwrap(), "then remembered");
    }

    #[tokio::test]
    async fn a_simulation_reports_its_targets_epsilon_with_rdp_and_a_baseline_reports_none() {
        let target = Recipe { sample_rate: 0.1, noise_multiplier: 2.0 };
        let (sim, _) =
            Spending::build(&contract(Mode::Simulation { target }, 0.02, Some(8.0)), 0, None, &Arc::default())
                .await
                .unwrap();
        let rdp = EpsilonCurve::new(AccountantKind::Rdp, 0.1, 2.0, 1e-5).unwrap();
        assert_eq!(sim.kind(), AccountantKind::Rdp);
        assert_eq!(sim.epsilon_after(50).await.unwrap(), rdp.epsilon_after(50));
        let (baseline, spent) =
            Spending::build(&contract(Mode::NotPrivate, 0.0, None), 3, None, &Arc::default()).await.unwrap();
        assert_eq!(spent, f64::INFINITY);
        assert_eq!(baseline.epsilon_after(4).await.unwrap(), f64::INFINITY);
        assert_eq!(baseline.max_steps(), privacy::STEPS_LIMIT);
    }

    #[tokio::test]
    async fn jobs_of_one_mechanism_share_its_curve_and_limit_and_a_job_that_lets_go_holds_none() {
        let curves: Arc<Curves> = Arc::default();
        let c = contract(Mode::Dp, 1.0, Some(8.0));
        let (first, _) = Spending::build(&c, 0, None, &curves).await.unwrap();
        let (second, spent) = Spending::build(&c, 40, None, &curves).await.unwrap();
        assert_eq!(first.max_steps(), second.max_steps());
        assert_eq!(spent, second.epsilon_after(40).await.unwrap(), "the replayed epsilon is the curve's");
        first.epsilon_after(3).await.unwrap();
        let (a, b) = (first.curve.as_ref().unwrap().get().unwrap(), second.curve.as_ref().unwrap().get().unwrap());
        assert!(Arc::ptr_eq(&a, &b), "one curve for one mechanism");
        drop((a, b));
        first.let_go();
        second.let_go();
        assert!(!first.curve_built() && !second.curve_built());
        assert!(curves.shared.lock().unwrap().values().all(|w| w.strong_count() == 0), "nothing holds it");
        assert!(first.epsilon_after(4).await.unwrap() > 0.0, "got again when the job runs again");
    }
}
