//! Datasets' lifetime privacy budgets, owned by the data's owners (privacy admins), not by the
//! jobs that spend them. A dataset is identified by the digest of its index (what a job's plan
//! pins), never by a URL that could point at other data tomorrow. Every job registered on a
//! dataset composes into its spend; a step that would pass the budget is refused.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::accountant::Accountant;
use crate::composed;
use crate::error::AccountantError;
use crate::job::Job;
use crate::ledger::Registration;
use crate::privacy::{self, Segment};

/// A dataset's budget as recorded in the ledger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetBudget {
    /// "sha256:" and 64 lowercase hex digits: the digest of the dataset's index.
    pub dataset_id: String,
    /// The lifetime ε at `delta`, over every job on the dataset.
    pub epsilon: f64,
    /// δ at which the lifetime ε is composed and enforced.
    pub delta: f64,
    /// 1 for the first setting, +1 for every change.
    pub version: u64,
    /// Why, as the privacy admin said.
    pub reason: String,
    /// When, in milliseconds since the Unix epoch.
    pub set_at_unix_ms: u64,
    /// Whether the owners let NOT PRIVATE jobs (baselines, TAN simulations) train on the data.
    /// Off unless said: their outputs carry no guarantee. Budgets from before read as off.
    #[serde(default)]
    pub allow_not_private: bool,
}

/// Refuses an id that is not an index digest.
pub fn check_dataset_id(id: &str) -> Result<(), AccountantError> {
    let hex = id.strip_prefix("sha256:").unwrap_or_default();
    if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        Ok(())
    } else {
        Err(AccountantError::invalid(
            "dataset_id",
            format!(
                "{id:?} is not an index digest (\"sha256:\" and 64 lowercase hex digits; `dpctl dataset index` prints it)"
            ),
        ))
    }
}

/// The ledger path component of a dataset id (no ':' in object paths).
pub fn path_component(id: &str) -> String {
    id.replace(':', "-")
}

/// Validates a requested budget.
pub fn check_budget(epsilon: f64, delta: f64) -> Result<(), AccountantError> {
    privacy::check_epsilon(epsilon)?;
    privacy::check_delta(delta)?;
    Ok(())
}

/// A dataset's budget with what has been spent of it.
#[derive(Debug, Clone)]
pub struct DatasetView {
    /// The budget.
    pub budget: DatasetBudget,
    /// ε at the budget's δ, composed over every job on the dataset.
    pub epsilon_spent: f64,
    /// Jobs registered on the dataset.
    pub jobs: Vec<String>,
}

impl Accountant {
    /// Refuses a registration that would set its own dataset budget, or that trains on a
    /// dataset without a budget (unless the accountant allows unbudgeted datasets).
    pub(crate) fn check_dataset(&self, r: &Registration) -> Result<(), AccountantError> {
        if r.dataset_epsilon_budget != 0.0 {
            return Err(AccountantError::invalid(
                "dataset_epsilon_budget",
                format!(
                    "{} must be 0: a job cannot set its dataset's budget; a privacy admin sets it (SetDatasetBudget)",
                    r.dataset_epsilon_budget
                ),
            ));
        }
        if !r.dataset_id.is_empty() {
            check_dataset_id(&r.dataset_id)?;
        }
        let budget = self.budget_of(&r.dataset_id);
        if budget.is_none() && !self.allows_unbudgeted() {
            return Err(AccountantError::UnbudgetedDataset { dataset_id: r.dataset_id.clone() });
        }
        if let Some(budget) = budget.filter(|b| !b.allow_not_private)
            && !crate::spending::Mode::of(r)?.is_private()
        {
            return Err(AccountantError::invalid(
                "privacy",
                format!(
                    "dataset {} has a privacy budget and its owners have not allowed NOT PRIVATE jobs on it",
                    budget.dataset_id
                ),
            ));
        }
        Ok(())
    }

    /// Refuses a step of a job on a dataset without a budget (a job registered before the
    /// accountant stopped allowing that, or a ledger record from before budgets had owners).
    /// A NOT PRIVATE job is refused as soon as its dataset's owners set a budget without
    /// allowing such jobs, or revoke that permission: consent is checked at every step.
    pub(crate) fn check_step_dataset(&self, r: &Registration) -> Result<(), AccountantError> {
        let budget = self.budget_of(&r.dataset_id);
        if budget.is_none() && !self.allows_unbudgeted() {
            return Err(AccountantError::UnbudgetedDataset { dataset_id: r.dataset_id.clone() });
        }
        if let Some(budget) = budget.filter(|b| !b.allow_not_private)
            && !crate::spending::Mode::of(r)?.is_private()
        {
            return Err(AccountantError::invalid(
                "privacy",
                format!(
                    "dataset {} no longer allows NOT PRIVATE jobs (its owners changed its budget)",
                    budget.dataset_id
                ),
            ));
        }
        Ok(())
    }

    /// The budget of `dataset_id`, if a privacy admin set one.
    pub(crate) fn budget_of(&self, dataset_id: &str) -> Option<DatasetBudget> {
        self.budgets.read().expect("budgets lock").get(dataset_id).cloned()
    }

    /// Serialises the releases of every job on a budgeted dataset (their checks compose).
    pub(crate) fn dataset_lock(&self, r: &Registration) -> Option<Arc<Mutex<()>>> {
        self.budget_of(&r.dataset_id)?;
        Some(self.dataset_locks.lock().expect("dataset locks").entry(r.dataset_id.clone()).or_default().clone())
    }

    /// ε at the budget's δ over every private job on the dataset, plus `extra` steps of one
    /// of them (remembered and computed ahead: see [`crate::composed`]).
    pub(crate) async fn dataset_epsilon(
        &self,
        budget: &DatasetBudget,
        extra: Option<(&Job, u64)>,
    ) -> Result<f64, AccountantError> {
        composed::epsilon(self.composition(budget, extra)).await
    }

    /// Starts composing the dataset's ε for `job`'s next step while the step trains.
    pub(crate) fn prepare_dataset(&self, job: &Job) {
        if let Some(budget) = self.budget_of(&job.registration.dataset_id).filter(|_| job.spending.mode().is_private())
        {
            drop(self.composition(&budget, Some((job, 1))));
        }
    }

    fn composition(&self, budget: &DatasetBudget, extra: Option<(&Job, u64)>) -> composed::Composing {
        let mut segments: Vec<Segment> = self
            .jobs
            .read()
            .expect("jobs lock")
            .values()
            .filter(|j| j.registration.dataset_id == budget.dataset_id && j.spending.mode().is_private())
            .map(|j| Segment {
                sample_rate: j.registration.sample_rate,
                noise_multiplier: j.registration.noise_multiplier,
                steps: j.progress().charged,
            })
            .collect();
        let mut kind = privacy::AccountantKind::Pld;
        if let Some((job, steps)) = extra {
            let r = &job.registration;
            segments.push(Segment { sample_rate: r.sample_rate, noise_multiplier: r.noise_multiplier, steps });
            kind = job.spending.kind();
        }
        self.composed.get(&budget.dataset_id, kind, segments, budget.delta)
    }

    /// Sets a dataset's lifetime budget (a privacy admin's call): recorded in the audit log,
    /// then in force for every later step of every job on the dataset.
    pub async fn set_budget(
        &self,
        dataset_id: &str,
        (epsilon, delta): (f64, f64),
        (reason, allow_not_private): (&str, bool),
    ) -> Result<DatasetView, AccountantError> {
        check_dataset_id(dataset_id)?;
        check_budget(epsilon, delta)?;
        let lock = self.dataset_locks.lock().expect("dataset locks").entry(dataset_id.to_owned()).or_default().clone();
        let _serial = lock.lock().await;
        let recorded = self.ledger.budget_version(dataset_id).await?;
        let version = self.budget_of(dataset_id).map_or(0, |b| b.version).max(recorded) + 1;
        let budget = DatasetBudget {
            dataset_id: dataset_id.to_owned(),
            epsilon,
            delta,
            version,
            reason: reason.to_owned(),
            allow_not_private,
            set_at_unix_ms: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
        };
        self.ledger.put_budget(&budget).await?;
        self.budgets.write().expect("budgets lock").insert(dataset_id.to_owned(), budget);
        tracing::info!(dataset_id, epsilon, delta, version, reason, "dataset budget set");
        drop(_serial);
        self.dataset(dataset_id).await
    }

    /// A dataset's budget and spend, or NOT_FOUND.
    pub async fn dataset(&self, dataset_id: &str) -> Result<DatasetView, AccountantError> {
        let budget = self
            .budget_of(dataset_id)
            .ok_or_else(|| AccountantError::UnknownDataset { dataset_id: dataset_id.to_owned() })?;
        let epsilon_spent = self.dataset_epsilon(&budget, None).await?;
        let mut jobs: Vec<String> = self
            .jobs
            .read()
            .expect("jobs lock")
            .values()
            .filter(|j| j.registration.dataset_id == dataset_id)
            .map(|j| j.registration.job_id.clone())
            .collect();
        jobs.sort();
        self.record_dataset_spent(dataset_id, epsilon_spent);
        Ok(DatasetView { budget, epsilon_spent, jobs })
    }

    /// Every budgeted dataset, for metrics.
    pub fn budgets(&self) -> Vec<DatasetBudget> {
        self.budgets.read().expect("budgets lock").values().cloned().collect()
    }

    /// ε spent of a dataset as of its latest charge (0 before any), for metrics.
    pub fn dataset_spent(&self, dataset_id: &str) -> f64 {
        self.dataset_spent.read().expect("spent lock").get(dataset_id).copied().unwrap_or(0.0)
    }

    /// Records a dataset's spend after a charge or a recomputation.
    pub(crate) fn record_dataset_spent(&self, dataset_id: &str, epsilon: f64) {
        self.dataset_spent.write().expect("spent lock").insert(dataset_id.to_owned(), epsilon);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_index_digests_name_datasets() {
        let digest = format!("sha256:{}", "ab".repeat(32));
        assert!(check_dataset_id(&digest).is_ok());
        for bad in ["", "s3://bucket/laion", "sha256:xyz", &format!("sha256:{}", "AB".repeat(32))] {
            assert!(check_dataset_id(bad).is_err(), "{bad}");
        }
        assert_eq!(path_component(&digest), format!("sha256-{}", "ab".repeat(32)));
    }
}
