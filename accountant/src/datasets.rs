//! Datasets' lifetime privacy budgets, owned by the data's owners (privacy admins), not by the
//! jobs that spend them: one component with its own locks. A budget is for a dataset (the
//! digest of its index, never a URL that could point at other data tomorrow) and one privacy
//! unit. **A dataset has a budget of one unit only**: example-level spend does not bound what
//! one person (with many examples) loses, and user-level spend bounds one example's loss only
//! through a conversion (docs/accounting.md), so two budgets of different units on the same
//! data would not bound each other. A budget of a second unit is refused, and so is a job
//! whose unit is not its dataset's budget's. The NOT PRIVATE allowance is the dataset's: any
//! of its budgets that forbids it refuses such a job. Every private job composes into its
//! budget's spend; a step that would pass it is refused.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::composed::{self, Composed};
use crate::error::AccountantError;
use crate::ledger::Ledger;
use crate::privacy::contract::PrivacyContract;
use crate::privacy::{self, AccountantKind, Segment};
use crate::records::{BudgetKey, DatasetBudget, check_dataset_id};

/// A privacy admin's setting of a budget.
#[derive(Debug, Clone)]
pub struct BudgetSetting {
    /// Lifetime ε at `delta`.
    pub epsilon: f64,
    /// δ of the lifetime budget.
    pub delta: f64,
    /// Why, for the audit log.
    pub reason: String,
    /// Whether NOT PRIVATE jobs may train on the data.
    pub allow_not_private: bool,
    /// A readable name for dashboards; empty keeps the current one.
    pub name: String,
    /// N of the budget's unit (examples, or users for a user-level budget): δ ≤ 1/N.
    pub population: u64,
    /// Lower ε below the open jobs' plans, or change δ ([`crate::Accountant::set_budget`]).
    pub force: bool,
    /// The shards' digest of the index it is set from ([`DatasetBudget::shards_id`]); empty
    /// keeps the current one.
    pub shards_id: String,
}

/// Every budget, what has been spent of each, and one lock per budget that serialises the
/// checks of the steps that compose into it.
#[derive(Debug)]
pub struct Datasets {
    budgets: RwLock<HashMap<BudgetKey, DatasetBudget>>,
    spent: RwLock<HashMap<BudgetKey, f64>>,
    /// ε of what is spent plus every open job's remaining plan, as last composed.
    committed: RwLock<HashMap<BudgetKey, f64>>,
    /// Budgets whose standing changed since it was last composed, and a wake-up for the task
    /// that composes them again ([`crate::Accountant::keep_standings`]).
    touched: Mutex<HashSet<BudgetKey>>,
    touch: tokio::sync::Notify,
    /// The budget version under which everything reserved on a budget (spent plus every open
    /// job's whole plan) was last found to compose within it: see [`Datasets::reserve`].
    reserved: Mutex<HashMap<BudgetKey, u64>>,
    /// How each budget's checks were decided, for the metrics.
    decided: Mutex<HashMap<BudgetKey, [u64; Decided::ALL.len()]>>,
    locks: Mutex<HashMap<BudgetKey, Arc<tokio::sync::Mutex<()>>>>,
    /// Compositions for checks, and apart (their own permits and memory) for standings.
    checks: Composed,
    standings: Composed,
    allow_unbudgeted: bool,
}

/// Which history a composition is of: a check's (spent plus what it checks), or a standing's
/// spent or committed (spent plus every open plan). Each is remembered apart, so that the one
/// never evicts the other, and standings compose apart from checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Of {
    /// A check's history.
    Check,
    /// Everything charged.
    Spent,
    /// Everything charged plus every open job's remaining plan.
    Committed,
}

/// What decided a budget check: the cost of a check follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decided {
    /// A step within its job's reserved plan: no composition at all.
    Reservation,
    /// The RDP bound from each mechanism's kept one-step RDP: microseconds.
    Bound,
    /// The exact composition (PLD): near the budget's boundary only.
    Composition,
}

impl Decided {
    /// Every way, in the order of [`Decided::name`]'s labels.
    pub const ALL: [Decided; 3] = [Decided::Reservation, Decided::Bound, Decided::Composition];

    /// The metric label.
    pub fn name(self) -> &'static str {
        match self {
            Decided::Reservation => "reservation",
            Decided::Bound => "bound",
            Decided::Composition => "composition",
        }
    }
}

/// Whether a history fits its budget, and the upper bound of its ε that decided.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Within {
    /// The history composes to at most the budget's ε (a NaN never does).
    pub fits: bool,
    /// ε at the budget's δ: the RDP bound where it decided (inside the budget), else the
    /// exact composition.
    pub epsilon: f64,
}

impl Datasets {
    /// No budgets yet; `allow_unbudgeted` lets jobs train on datasets that have none at all.
    pub fn new(allow_unbudgeted: bool) -> Self {
        Self {
            budgets: RwLock::default(),
            spent: RwLock::default(),
            committed: RwLock::default(),
            touched: Mutex::default(),
            touch: tokio::sync::Notify::new(),
            reserved: Mutex::default(),
            decided: Mutex::default(),
            locks: Mutex::default(),
            checks: Composed::default(),
            standings: Composed::default(),
            allow_unbudgeted,
        }
    }

    /// Takes a budget read back from the ledger, unless a newer version is already in force
    /// (a privacy admin's change made while the ledger was being replayed). One whose ε or δ
    /// is out of range is refused: a δ of 1 or more would pass every check.
    pub fn load(&self, budget: DatasetBudget) -> Result<(), AccountantError> {
        privacy::check_epsilon(budget.epsilon)?;
        privacy::check_delta(budget.delta)?;
        let mut budgets = self.budgets.write().expect("budgets lock");
        let key = budget.key();
        if budgets.get(&key).is_none_or(|b| b.version < budget.version) {
            budgets.insert(key, budget);
        }
        Ok(())
    }

    /// The budget of `key`, if a privacy admin set one.
    pub fn budget_of(&self, key: &BudgetKey) -> Option<DatasetBudget> {
        self.budgets.read().expect("budgets lock").get(key).cloned()
    }

    /// The budget `contract` spends: keyed by its data (`data_id`: its examples' identities),
    /// unless a name the same data had before carries a budget set then, which stays the one
    /// its jobs spend (budgets are never removed, so the choice never changes under a job): the
    /// index's own digest (before budgets followed the data), or its shards' digest (before
    /// examples had identities).
    /// Else, a budget set from an index of the same shards' bytes binds it too, whatever
    /// example identities its index states.
    pub fn key_of(&self, contract: &PrivacyContract) -> BudgetKey {
        let by_data = BudgetKey::of(contract);
        self.names(contract).into_iter().next().unwrap_or(by_data)
    }

    /// Every budget `contract`'s data is known by, in the order [`Datasets::key_of`] prefers.
    fn names(&self, contract: &PrivacyContract) -> Vec<BudgetKey> {
        let by_data = BudgetKey::of(contract);
        let budgets = self.budgets.read().expect("budgets lock");
        let mut names: Vec<BudgetKey> = legacy_keys(contract, &by_data);
        names.push(by_data.clone());
        names.retain(|k| budgets.contains_key(k));
        let same_shards = |b: &&DatasetBudget| {
            !contract.shards_id.is_empty() && b.shards_id == contract.shards_id && b.unit == by_data.unit
        };
        for alias in budgets.values().filter(same_shards).map(DatasetBudget::key) {
            if !names.contains(&alias) {
                names.push(alias);
            }
        }
        names
    }

    /// Every budget, for metrics.
    pub fn all(&self) -> Vec<DatasetBudget> {
        self.budgets.read().expect("budgets lock").values().cloned().collect()
    }

    /// Refuses a contract whose unit has no budget on its dataset (see the module docs), or a
    /// NOT PRIVATE job its owners did not allow. `registering` words the refusal for a new job.
    pub fn check(&self, contract: &PrivacyContract, registering: bool) -> Result<(), AccountantError> {
        if registering && !contract.dataset_id.is_empty() {
            check_dataset_id(&contract.dataset_id)?;
        }
        let key = self.key_of(contract);
        let other = self.names(contract).into_iter().find(|k| *k != key);
        if let (true, Some(other)) = (registering, other) {
            return Err(AccountantError::invalid(
                "dataset",
                format!(
                    "its data has two budgets: {} and {} (names of the same data: its examples', its index's or \
                     its shards' digest); a job would be held to one only, so none runs on this index until a \
                     privacy admin lowers one budget by what the other has spent and the other to nothing more \
                     (epsilon of what it spent)",
                    key.describe(),
                    other.describe()
                ),
            ));
        }
        if let Some(other) = self.other_unit(&key) {
            return Err(AccountantError::invalid(
                "unit",
                format!(
                    "{} is budgeted at the {other} level: its owners bound {other}-level loss, which a {}-level \
                     job would not be held to; run a {other}-level job, or ask its privacy admin to change the \
                     budget's unit (every index and copy of the same shards shares one budget)",
                    key.dataset_id, key.unit
                ),
            ));
        }
        // The NOT PRIVATE allowance belongs to the dataset: every budget of it must allow it.
        let forbids = |b: &DatasetBudget| b.dataset_id == key.dataset_id && !b.allow_not_private;
        if !contract.mode.is_private() && self.budgets.read().expect("budgets lock").values().any(forbids) {
            let why = if registering {
                "has a privacy budget and its owners have not allowed NOT PRIVATE jobs on it"
            } else {
                "no longer allows NOT PRIVATE jobs (its owners changed its budget)"
            };
            return Err(AccountantError::invalid("privacy", format!("dataset {} {why}", key.dataset_id)));
        }
        if self.budget_of(&key).is_none() && !self.allow_unbudgeted {
            return Err(AccountantError::UnbudgetedDataset { dataset_id: key.dataset_id, unit: key.unit });
        }
        Ok(())
    }

    /// The unit of another budget on `key`'s dataset, if any.
    fn other_unit(&self, key: &BudgetKey) -> Option<String> {
        let budgets = self.budgets.read().expect("budgets lock");
        budgets.keys().find(|k| k.dataset_id == key.dataset_id && k.unit != key.unit).map(|k| k.unit.clone())
    }

    /// The lock that serialises the admissions and the releases of every job spending `key`
    /// (their checks compose), whether or not the budget exists yet: a budget set while a job
    /// is admitted or a step checked cannot let either pass unchecked.
    pub fn admission_lock(&self, key: &BudgetKey) -> Arc<tokio::sync::Mutex<()>> {
        self.locks.lock().expect("dataset locks").entry(key.clone()).or_default().clone()
    }

    /// ε at the budget's δ of `segments` (every private job of its unit on the dataset), with
    /// `kind`, exactly; remembered by what `of` names (see [`crate::composed`]).
    pub async fn epsilon(
        &self,
        budget: &DatasetBudget,
        kind: AccountantKind,
        of: Of,
        segments: Vec<Segment>,
    ) -> Result<f64, AccountantError> {
        privacy::check_delta(budget.delta)?;
        let (composed, slot) = match of {
            Of::Check => (&self.checks, "check"),
            Of::Spent => (&self.standings, "spent"),
            Of::Committed => (&self.standings, "committed"),
        };
        let id = format!("{}/{slot}", budget.key().path_component());
        composed::epsilon(composed.get(&id, kind, segments, budget.delta)).await
    }

    /// Whether `segments` compose within the budget: the RDP bound decides when it is inside
    /// (microseconds, whatever the history), the exact composition with `kind` only when the
    /// bound is not. Both are upper bounds of the true ε, so neither can pass a history the
    /// other would refuse wrongly.
    pub async fn within(
        &self,
        budget: &DatasetBudget,
        kind: AccountantKind,
        segments: Vec<Segment>,
    ) -> Result<Within, AccountantError> {
        let bound = self.checks.bound(segments.clone(), budget.delta).await?;
        if !exceeds(bound, budget.epsilon) || kind == AccountantKind::Rdp {
            self.count(&budget.key(), Decided::Bound);
            return Ok(Within { fits: !exceeds(bound, budget.epsilon), epsilon: bound });
        }
        let epsilon = self.epsilon(budget, kind, Of::Check, segments).await?;
        self.count(&budget.key(), Decided::Composition);
        Ok(Within { fits: !exceeds(epsilon, budget.epsilon), epsilon })
    }

    /// Counts a check of `key` decided by `how`.
    fn count(&self, key: &BudgetKey, how: Decided) {
        let mut decided = self.decided.lock().expect("decided lock");
        decided.entry(key.clone()).or_default()[how as usize] += 1;
    }

    /// How many checks of `key` each way decided, in [`Decided::ALL`]'s order.
    pub fn decided(&self, key: &BudgetKey) -> [u64; Decided::ALL.len()] {
        self.decided.lock().expect("decided lock").get(key).copied().unwrap_or_default()
    }

    /// Records that everything reserved on `key` (spent plus every open job's whole plan)
    /// composes within version `version` of its budget. Until the budget changes, a step of an
    /// open job within its plan then needs no composition: its history is part of what was
    /// reserved, and ε only grows with steps. Call it only under the budget's lock, with the
    /// whole reservation composed.
    pub fn reserve(&self, key: &BudgetKey, version: u64) {
        self.reserved.lock().expect("reserved lock").insert(key.clone(), version);
    }

    /// Whether [`Datasets::reserve`] holds for `budget` as it is now; a yes is counted as a
    /// check decided by the reservation.
    pub fn check_reserved(&self, budget: &DatasetBudget) -> bool {
        let reserved = self.reserved.lock().expect("reserved lock").get(&budget.key()) == Some(&budget.version);
        if reserved {
            self.count(&budget.key(), Decided::Reservation);
        }
        reserved
    }

    /// Forgets a reservation (a step beyond its job's plan spends what no admission reserved).
    pub fn unreserve(&self, key: &BudgetKey) {
        self.reserved.lock().expect("reserved lock").remove(key);
    }

    /// Marks a budget's standing as changed (a charge, an admission, a job's end): the standing
    /// task composes it again, off every request's path.
    pub fn touch(&self, key: &BudgetKey) {
        self.touched.lock().expect("touched lock").insert(key.clone());
        self.touch.notify_one();
    }

    /// The budgets touched since the last call, once some are.
    pub async fn touched(&self) -> Vec<BudgetKey> {
        loop {
            let keys: Vec<BudgetKey> = self.touched.lock().expect("touched lock").drain().collect();
            if !keys.is_empty() {
                return keys;
            }
            self.touch.notified().await;
        }
    }

    /// Sets a budget (a privacy admin's call): recorded in the audit log, then in force for
    /// every later step of every job of its unit on the dataset.
    pub async fn set(
        &self,
        ledger: &Ledger,
        key: &BudgetKey,
        setting: BudgetSetting,
    ) -> Result<DatasetBudget, AccountantError> {
        check_dataset_id(&key.dataset_id)?;
        privacy::check_epsilon(setting.epsilon)?;
        privacy::check_delta(setting.delta)?;
        check_population(key, setting.delta, setting.population)?;
        if let Some(other) = self.other_unit(key) {
            return Err(AccountantError::invalid(
                "unit",
                format!(
                    "{} is budgeted at the {other} level already; a dataset's budget is of one unit, so that no \
                     job escapes it (change the {other}-level budget; every index and copy of the same shards \
                     shares it)",
                    key.dataset_id
                ),
            ));
        }
        // Dataset-wide, across units: two admins setting budgets of two units at once cannot
        // both pass the one-unit check.
        let whole = BudgetKey { dataset_id: key.dataset_id.clone(), unit: "*".into() };
        let _dataset = self.admission_lock(&whole).lock_owned().await;
        if let Some(other) = self.other_unit(key) {
            return Err(AccountantError::invalid(
                "unit",
                format!(
                    "{} is budgeted at the {other} level already; a dataset's budget is of one unit",
                    key.dataset_id
                ),
            ));
        }
        let lock = self.admission_lock(key);
        let _serial = lock.lock().await;
        let recorded = ledger.budget_version(key).await?;
        let version = self.budget_of(key).map_or(0, |b| b.version).max(recorded) + 1;
        let name = if setting.name.is_empty() {
            self.budget_of(key).map(|b| b.name).unwrap_or_default()
        } else {
            setting.name
        };
        let shards_id = if setting.shards_id.is_empty() {
            self.budget_of(key).map(|b| b.shards_id).unwrap_or_default()
        } else {
            check_dataset_id(&setting.shards_id)?;
            setting.shards_id
        };
        let budget = DatasetBudget {
            dataset_id: key.dataset_id.clone(),
            unit: key.unit.clone(),
            epsilon: setting.epsilon,
            delta: setting.delta,
            version,
            reason: setting.reason,
            allow_not_private: setting.allow_not_private,
            name,
            population: setting.population,
            shards_id,
            set_at_unix_ms: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
        };
        ledger.put_budget(&budget).await?;
        self.budgets.write().expect("budgets lock").insert(key.clone(), budget.clone());
        tracing::info!(dataset_id = %key.dataset_id, unit = %key.unit, setting.epsilon, setting.delta, version, "dataset budget set");
        Ok(budget)
    }

    /// Records a budget's spend and what it has committed (spent plus open plans), as composed.
    pub fn record_standing(&self, key: &BudgetKey, spent: f64, committed: f64) {
        self.spent.write().expect("spent lock").insert(key.clone(), spent);
        self.committed.write().expect("committed lock").insert(key.clone(), committed);
    }

    /// A budget's ε spent, reserved and free, as last composed (for metrics): None before its
    /// first composition, which the replay makes before the accountant serves.
    pub fn standing(&self, budget: &DatasetBudget) -> Option<Standing> {
        let key = budget.key();
        let spent = *self.spent.read().expect("spent lock").get(&key)?;
        let committed = self.committed.read().expect("committed lock").get(&key).copied().unwrap_or(spent);
        Some(Standing::new(budget.epsilon, spent, committed))
    }
}

/// The names `contract`'s data had before `by_data` (its index's digest, its shards' digest),
/// the older first, each once.
fn legacy_keys(contract: &PrivacyContract, by_data: &BudgetKey) -> Vec<BudgetKey> {
    let mut keys: Vec<BudgetKey> = Vec::with_capacity(2);
    for id in [&contract.dataset_id, &contract.shards_id] {
        let key = BudgetKey { dataset_id: id.clone(), unit: by_data.unit.clone() };
        if !id.is_empty() && key != *by_data && !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys
}

/// A budget states N of its unit, and its δ is at most 1/N: a mechanism may publish someone's
/// data outright with probability δ, so a δ above 1/N allows one that publishes somebody's.
pub(crate) fn check_population(key: &BudgetKey, delta: f64, population: u64) -> Result<(), AccountantError> {
    let unit = &key.unit;
    if population == 0 {
        return Err(AccountantError::invalid(
            "population",
            format!(
                "0 must be the dataset's number of {unit}s N, so that delta is held to at most 1/N; `dpctl dataset \
                 budget set` reads it from the index"
            ),
        ));
    }
    let largest = 1.0 / population as f64;
    if delta > largest {
        return Err(AccountantError::invalid(
            "delta",
            format!(
                "{delta:e} is above 1/N = {largest:e} for N = {population} {unit}s: a mechanism may publish someone's \
                 data outright with probability delta; the largest delta allowed is {largest:e} (1/N, or less: \
                 1/(N log N) is common)"
            ),
        ));
    }
    Ok(())
}

/// Whether `epsilon` passes `budget`; a NaN ε always does.
pub fn exceeds(epsilon: f64, budget: f64) -> bool {
    epsilon.is_nan() || epsilon > budget
}

/// A budget's ε at its δ: spent by every job on it, reserved by open jobs' remaining plans
/// (the ε of spent plus plans, minus spent: ε composes, so it is not a sum of jobs' ε), and
/// free for new plans.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Standing {
    /// ε spent.
    pub spent: f64,
    /// ε reserved by open jobs' plans beyond what they spent.
    pub reserved: f64,
    /// ε left for new plans.
    pub free: f64,
}

impl Standing {
    /// From the budget's ε, the ε spent and the ε of spent plus plans.
    pub fn new(budget: f64, spent: f64, committed: f64) -> Self {
        let committed = committed.max(spent);
        Self { spent, reserved: committed - spent, free: (budget - committed).max(0.0) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::privacy::contract::{Mechanism, Mode, PrivacyUnit};

    fn contract(unit: PrivacyUnit, mode: Mode) -> PrivacyContract {
        PrivacyContract {
            mechanism: Mechanism { sample_rate: 0.01, noise_multiplier: 1.0, clipping_norm: 1.0 },
            accountant: AccountantKind::Pld,
            delta: 1e-5,
            epsilon_target: Some(8.0),
            mode,
            unit,
            dataset_id: format!("sha256:{}", "ab".repeat(32)),
            data_id: String::new(),
            shards_id: String::new(),
            audit: None,
            init_from_job: None,
            planned_steps: 100,
        }
    }

    fn budget(unit: &str, version: u64) -> DatasetBudget {
        DatasetBudget {
            dataset_id: format!("sha256:{}", "ab".repeat(32)),
            unit: unit.into(),
            epsilon: 8.0,
            delta: 1e-5,
            version,
            reason: String::new(),
            set_at_unix_ms: 0,
            allow_not_private: false,
            name: String::new(),
            population: 100_000,
            shards_id: String::new(),
        }
    }

    #[test]
    fn a_job_spends_its_datas_budget_unless_its_index_kept_a_budget_from_before_and_never_two() {
        let datasets = Datasets::new(false);
        let data = format!("sha256:{}", "ef".repeat(32));
        let job = PrivacyContract { data_id: data.clone(), ..contract(PrivacyUnit::Example, Mode::Dp) };
        assert_eq!(datasets.key_of(&job).dataset_id, data, "keyed by the data");
        datasets.load(DatasetBudget { dataset_id: data.clone(), ..budget("example", 1) }).unwrap();
        assert!(datasets.check(&job, true).is_ok());
        let copy = PrivacyContract { dataset_id: format!("sha256:{}", "01".repeat(32)), ..job.clone() };
        assert_eq!(datasets.key_of(&copy), datasets.key_of(&job), "another index of the same data: the same budget");

        let legacy = Datasets::new(false);
        legacy.load(budget("example", 1)).unwrap(); // keyed by the index digest, as budgets were before
        assert_eq!(legacy.key_of(&job).dataset_id, job.dataset_id, "the index's budget from before stays its own");
        assert!(legacy.check(&job, true).is_ok());
        legacy.load(DatasetBudget { dataset_id: data, ..budget("example", 1) }).unwrap();
        let refused = legacy.check(&job, true).unwrap_err().to_string();
        assert!(refused.starts_with("invalid dataset:") && refused.contains("two budgets"), "{refused}");

        // A budget set under the shards' digest (before examples had identities) binds the same
        // shards indexed again, now named by their examples.
        let shards = format!("sha256:{}", "5a".repeat(32));
        let before = Datasets::new(false);
        before.load(DatasetBudget { dataset_id: shards.clone(), ..budget("example", 1) }).unwrap();
        let reindexed = PrivacyContract { shards_id: shards.clone(), ..job.clone() };
        assert_eq!(before.key_of(&reindexed).dataset_id, shards, "the shards' budget stays its own");
        assert!(before.check(&reindexed, true).is_ok());
        before.load(DatasetBudget { dataset_id: job.data_id.clone(), ..budget("example", 1) }).unwrap();
        assert!(before.check(&reindexed, true).unwrap_err().to_string().contains("two budgets"));

        // A budget set from an index of some shards binds a job on the same shards' bytes whose
        // index states other example identities (written by hand).
        let owned = Datasets::new(false);
        let set_from =
            DatasetBudget { dataset_id: job.data_id.clone(), shards_id: shards.clone(), ..budget("example", 1) };
        owned.load(set_from).unwrap();
        let forged = PrivacyContract { data_id: format!("sha256:{}", "f0".repeat(32)), ..reindexed.clone() };
        assert_eq!(owned.key_of(&forged).dataset_id, job.data_id, "bound by the shards it was set from");
        assert!(owned.check(&forged, true).is_ok());
    }

    #[test]
    fn a_budgets_standing_reserves_what_plans_add_past_the_spend_and_never_shows_less_than_zero() {
        let standing = Standing::new(8.0, 3.0, 7.5);
        assert_eq!((standing.spent, standing.reserved, standing.free), (3.0, 4.5, 0.5));
        let over = Standing::new(8.0, 3.0, 9.0);
        assert_eq!((over.reserved, over.free), (6.0, 0.0), "a budget lowered under its plans has none free");
        let stale = Standing::new(8.0, 3.0, 2.0);
        assert_eq!((stale.reserved, stale.free), (0.0, 5.0), "committed is at least what is spent");
    }

    #[test]
    fn a_job_of_another_unit_than_its_datasets_budget_is_refused_even_where_unbudgeted_data_is_allowed() {
        let datasets = Datasets::new(true);
        let user = PrivacyUnit::User { users_digest: format!("sha256:{}", "cd".repeat(32)) };
        assert!(datasets.check(&contract(user.clone(), Mode::Dp), true).is_ok(), "no budget at all: allowed");
        datasets.load(budget("example", 1)).unwrap();
        assert!(datasets.check(&contract(PrivacyUnit::Example, Mode::Dp), true).is_ok());
        let refused = datasets.check(&contract(user.clone(), Mode::Dp), true).unwrap_err().to_string();
        assert!(refused.contains("budgeted at the example level") && refused.contains("user-level job"), "{refused}");
        let baseline = datasets.check(&contract(PrivacyUnit::Example, Mode::NotPrivate), true).unwrap_err();
        assert!(baseline.to_string().contains("not allowed NOT PRIVATE"), "{baseline}");
        // A ledger from before one unit per dataset, with both: every job is refused.
        datasets.load(budget("user", 1)).unwrap();
        assert!(datasets.check(&contract(user, Mode::Dp), true).is_err());
        assert!(datasets.check(&contract(PrivacyUnit::Example, Mode::Dp), true).is_err());
    }

    #[test]
    fn a_replayed_budget_never_replaces_a_newer_one() {
        let datasets = Datasets::new(false);
        datasets.load(budget("example", 3)).unwrap();
        datasets.load(budget("example", 2)).unwrap();
        assert_eq!(datasets.budget_of(&budget("example", 0).key()).unwrap().version, 3);
    }
}
