//! The values the ledger records, typed: a job's registration (its privacy contract as the
//! coordinator registered it), a charge, a job's record at replay, and a dataset's budget.
//!
//! A leaf: every other module of the accountant may use these, and this module uses none of
//! them. Registrations written before contracts existed (flat fields, the privacy mode as a
//! string) still read, converted to the same typed contract ([`Registration`]'s `Deserialize`).

use std::collections::BTreeSet;

use serde::{Deserialize, Deserializer, Serialize};

use crate::privacy::AccountantKind;
use crate::privacy::contract::{
    Audit, Mechanism, Mode, ModeKind, Placement, PrivacyContract, PrivacyUnit, Recipe, check_digest,
};

/// A job as the accountant knows it: the coordinator's contract and the gradient dimension.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Registration {
    /// The job id (validated: `[A-Za-z0-9._-]{1,128}`).
    pub job_id: String,
    /// The privacy contract, as registered.
    pub contract: PrivacyContract,
    /// Gradient dimension P: every part and release has exactly P f32 values.
    pub gradient_dim: u64,
    /// The fixed test seed, when the job uses insecure seeded noise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure_noise_seed: Option<u64>,
    /// Read from a registration written before typed contracts, which named no privacy unit:
    /// its spend counts in every unit's budget of its dataset (it may have been user-level).
    #[serde(skip)]
    pub legacy: bool,
}

impl<'de> Deserialize<'de> for Registration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Current {
            job_id: String,
            contract: PrivacyContract,
            gradient_dim: u64,
            #[serde(default)]
            insecure_noise_seed: Option<u64>,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Stored {
            Current(Current),
            Legacy(LegacyRegistration),
        }
        Ok(match Stored::deserialize(deserializer)? {
            Stored::Current(c) => Registration {
                job_id: c.job_id,
                contract: c.contract,
                gradient_dim: c.gradient_dim,
                insecure_noise_seed: c.insecure_noise_seed,
                legacy: false,
            },
            Stored::Legacy(legacy) => legacy.into_registration().map_err(serde::de::Error::custom)?,
        })
    }
}

/// A registration as ledgers before typed contracts wrote it (each rank registered it).
#[derive(Debug, Clone, Deserialize)]
struct LegacyRegistration {
    job_id: String,
    sample_rate: f64,
    noise_multiplier: f64,
    clipping_norm: f64,
    delta: f64,
    epsilon_target: f64,
    accountant: AccountantKind,
    gradient_dim: u64,
    #[serde(default)]
    dataset_id: String,
    #[serde(default)]
    insecure_noise_seed: Option<u64>,
    /// "dp" before modes existed.
    #[serde(default = "dp")]
    privacy: String,
    #[serde(default)]
    simulated: Option<Recipe>,
    #[serde(default)]
    audit_canaries: u32,
    /// "" with canaries: from before placements, which had model coordinates only.
    #[serde(default)]
    audit_coordinates: String,
}

fn dp() -> String {
    "dp".into()
}

impl LegacyRegistration {
    fn into_registration(self) -> Result<Registration, String> {
        let mode = self
            .privacy
            .parse::<ModeKind>()
            .and_then(|kind| Mode::from_kind(kind, self.simulated))
            .map_err(|e| format!("legacy registration of {}: {e}", self.job_id))?;
        let placement = match self.audit_coordinates.as_str() {
            "" | "model" => Placement::Model,
            _ => Placement::Reserved,
        };
        let contract = PrivacyContract {
            mechanism: Mechanism {
                sample_rate: self.sample_rate,
                noise_multiplier: self.noise_multiplier,
                clipping_norm: self.clipping_norm,
            },
            accountant: self.accountant,
            delta: self.delta,
            epsilon_target: mode.reports_epsilon().then_some(self.epsilon_target),
            mode,
            // Unknown before units (fedemb jobs registered without one): read as example-level,
            // and `legacy` makes every unit's budget of the dataset count its spend.
            unit: PrivacyUnit::Example,
            dataset_id: self.dataset_id,
            // Before budgets followed the data: keyed by the index digest, as then.
            data_id: String::new(),
            shards_id: String::new(),
            audit: (self.audit_canaries > 0).then_some(Audit { canaries: self.audit_canaries, placement }),
            init_from_job: None,
            // Before plans were part of the contract: no limit but ε, no reservation.
            planned_steps: 0,
        };
        Ok(Registration {
            job_id: self.job_id,
            contract,
            gradient_dim: self.gradient_dim,
            insecure_noise_seed: self.insecure_noise_seed,
            legacy: true,
        })
    }
}

/// One charged step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Charge {
    /// The job.
    pub job_id: String,
    /// The step charged.
    pub step: u64,
    /// ε at δ after this step; none for a job without a guarantee (NOT PRIVATE).
    pub epsilon_after: Option<f64>,
    /// How the step's noise was keyed ("os-entropy" or "insecure-seeded:SEED").
    pub noise: String,
    /// Wall-clock time of the charge, milliseconds since the Unix epoch.
    pub charged_at_unix_ms: u64,
}

/// Everything the ledger holds about one job, as read back at start-up.
#[derive(Debug, Clone)]
pub struct JobRecord {
    /// The contract.
    pub registration: Registration,
    /// Charged step numbers.
    pub charged: BTreeSet<u64>,
    /// Step numbers whose release is stored.
    pub released: BTreeSet<u64>,
    /// Step numbers recorded as discarded.
    pub discarded: BTreeSet<u64>,
    /// Releases of steps below this may have been trimmed (a checkpoint covers them).
    pub trimmed_before: u64,
    /// The reason given when the job was closed, if it was.
    pub closed: Option<String>,
    /// What the close recorded of the job's spend, when it did (ledgers from before do not).
    pub closed_spend: Option<ClosedSpend>,
    /// The lowest group generation still admitted.
    pub generation: u64,
    /// Whether the coordinator suspended the job (cancelled, failed).
    pub suspended: bool,
}

/// A job's spend as recorded at its close, so that a replay need not compute it again: its ε
/// and step limit, valid for exactly `charged` charges (a step charged while the close was
/// being recorded makes the record stale, and the replay computes it instead).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ClosedSpend {
    /// Charged steps when recorded.
    pub charged: u64,
    /// ε at the job's δ after them.
    pub epsilon_spent: f64,
    /// The most steps within the job's ε target.
    pub max_steps: u64,
}

impl JobRecord {
    /// A job registered now: nothing charged yet.
    pub fn new(registration: Registration) -> Self {
        Self {
            registration,
            charged: BTreeSet::new(),
            released: BTreeSet::new(),
            discarded: BTreeSet::new(),
            trimmed_before: 0,
            closed: None,
            closed_spend: None,
            generation: 0,
            suspended: false,
        }
    }
}

/// Which budget: a dataset, for one privacy unit. Example-level and user-level spend on the
/// same data are different guarantees and never compose into one number.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BudgetKey {
    /// The dataset's index digest.
    pub dataset_id: String,
    /// "example" or "user".
    pub unit: String,
}

impl BudgetKey {
    /// The budget a job with `contract` spends: keyed by the data (its shards' digests), so
    /// that every index of the same shards spends it.
    pub fn of(contract: &PrivacyContract) -> Self {
        Self { dataset_id: contract.budget_id().to_owned(), unit: contract.unit.name().to_owned() }
    }

    /// The ledger directory name: the digest without ':', and `~user` for user-level budgets
    /// (example-level budgets keep the name they had before units).
    pub fn path_component(&self) -> String {
        let dataset = self.dataset_id.replace(':', "-");
        if self.unit == "example" { dataset } else { format!("{dataset}~{}", self.unit) }
    }

    /// `dataset (unit)`, as errors and logs name a budget.
    pub fn describe(&self) -> String {
        crate::error::described("", &self.dataset_id, &self.unit)
    }
}

/// A dataset's budget for one privacy unit, as recorded in the ledger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetBudget {
    /// "sha256:" and 64 lowercase hex digits: the digest of the dataset's index.
    pub dataset_id: String,
    /// "example" or "user"; budgets from before units read as "example".
    #[serde(default = "example")]
    pub unit: String,
    /// The lifetime ε at `delta`, over every job of this unit on the dataset.
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
    /// A readable name for dashboards (the admin's, else the dataset's URL as given at
    /// `dpctl dataset budget set`); empty for budgets from before names: the digest stands in.
    #[serde(default)]
    pub name: String,
    /// N of the budget's unit (examples, or users) as its admin stated it: δ is at most 1/N.
    /// 0 for budgets set before it was stated.
    #[serde(default)]
    pub population: u64,
    /// The shards' digest of the index it was set from: a job on the same shards' bytes spends
    /// it, whatever example identities its index states (they are the indexer's word, the
    /// shards' bytes are pinned and checked by every reader). Empty for budgets set before.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub shards_id: String,
}

impl DatasetBudget {
    /// The budget as messages name it: its name first, then its digest and unit.
    pub fn describe(&self) -> String {
        crate::error::described(&self.name, &self.dataset_id, &self.unit)
    }

    /// The name dashboards show: the budget's own, else its digest.
    pub fn display_name(&self) -> &str {
        if self.name.is_empty() { &self.dataset_id } else { &self.name }
    }
}

fn example() -> String {
    "example".into()
}

impl DatasetBudget {
    /// Its key.
    pub fn key(&self) -> BudgetKey {
        BudgetKey { dataset_id: self.dataset_id.clone(), unit: self.unit.clone() }
    }
}

/// Refuses an id that is not an index digest.
pub fn check_dataset_id(id: &str) -> Result<(), crate::error::AccountantError> {
    check_digest("dataset_id", id).map_err(crate::error::AccountantError::DatasetId)
}

#[cfg(test)]
mod tests {
    use rand_chacha::ChaCha20Rng;
    use rand_chacha::rand_core::{Rng, SeedableRng};

    use super::*;

    #[test]
    fn any_registration_reads_back_equal_after_the_ledgers_json_round_trip() {
        // A re-registration (a restarted coordinator) is compared with what the ledger stored:
        // every f64 must survive JSON exactly, and every mode and unit keep their type.
        let mut rng = ChaCha20Rng::seed_from_u64(3);
        let mut any = || f64::from_bits(rng.next_u64() >> 2 | 0x3000_0000_0000_0000);
        for i in 0..10_000 {
            let mode = match i % 3 {
                0 => Mode::Dp,
                1 => Mode::NotPrivate,
                _ => Mode::Simulation { target: Recipe { sample_rate: any(), noise_multiplier: any() } },
            };
            let registration = Registration {
                job_id: format!("job-{i}"),
                contract: PrivacyContract {
                    mechanism: Mechanism { sample_rate: any(), noise_multiplier: any(), clipping_norm: any() },
                    accountant: if i % 2 == 0 { AccountantKind::Pld } else { AccountantKind::Rdp },
                    delta: any(),
                    epsilon_target: (mode != Mode::NotPrivate).then(&mut any),
                    mode,
                    unit: if i % 5 == 0 {
                        PrivacyUnit::User { users_digest: format!("sha256:{i:064x}") }
                    } else {
                        PrivacyUnit::Example
                    },
                    dataset_id: String::new(),
                    data_id: String::new(),
                    shards_id: String::new(),
                    audit: (i % 2 == 1).then_some(Audit { canaries: 1000, placement: Placement::Reserved }),
                    init_from_job: (i % 7 == 0).then(|| "job-0".to_owned()),
                    planned_steps: 100,
                },
                gradient_dim: 1 << 20,
                insecure_noise_seed: (i % 11 == 0).then_some(i as u64),
                legacy: false,
            };
            let bytes = serde_json::to_vec_pretty(&registration).unwrap();
            let back: Registration = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(back, registration, "{}", String::from_utf8_lossy(&bytes));
        }
    }

    #[test]
    fn a_registration_from_before_contracts_reads_as_the_same_typed_contract() {
        let legacy = r#"{"job_id":"old","sample_rate":0.01,"noise_multiplier":1.0,"clipping_norm":1.0,
            "delta":1e-5,"epsilon_target":8.0,"accountant":"rdp","gradient_dim":100,"parts":2,
            "dataset_id":"","dataset_epsilon_budget":0.0,"insecure_noise_seed":null,
            "audit_canaries":10}"#;
        let r: Registration = serde_json::from_str(legacy).unwrap();
        assert_eq!(r.contract.mode, Mode::Dp, "no privacy field: from before modes");
        assert_eq!(r.contract.accountant, AccountantKind::Rdp);
        assert_eq!(r.contract.audit, Some(Audit { canaries: 10, placement: Placement::Model }));
        assert!(r.legacy, "its unit is unknown: every unit's budget counts it");
        let baseline = legacy
            .replace("\"audit_canaries\":10", "\"privacy\":\"not_private\"")
            .replace("\"noise_multiplier\":1.0", "\"noise_multiplier\":0.0");
        let r: Registration = serde_json::from_str(&baseline).unwrap();
        assert_eq!((r.contract.mode, r.contract.epsilon_target), (Mode::NotPrivate, None));
        // Written back, it is a current registration that reads as itself (no longer legacy).
        let again: Registration = serde_json::from_slice(&serde_json::to_vec(&r).unwrap()).unwrap();
        assert_eq!(again, Registration { legacy: false, ..r });
    }

    #[test]
    fn budgets_of_each_unit_have_their_own_ledger_directory() {
        let id = format!("sha256:{}", "ab".repeat(32));
        let example = BudgetKey { dataset_id: id.clone(), unit: "example".into() };
        let user = BudgetKey { dataset_id: id, unit: "user".into() };
        assert_eq!(example.path_component(), format!("sha256-{}", "ab".repeat(32)));
        assert_eq!(user.path_component(), format!("sha256-{}~user", "ab".repeat(32)));
        let old: DatasetBudget = serde_json::from_str(
            r#"{"dataset_id":"d","epsilon":8,"delta":1e-5,"version":1,"reason":"","set_at_unix_ms":0}"#,
        )
        .unwrap();
        assert_eq!(old.unit, "example");
    }
}
