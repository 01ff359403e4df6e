//! A job's privacy contract: the one value that says which guarantee a job's releases carry.
//!
//! The coordinator builds it at submit from the job's plan and registers it with the
//! accountant, which stores it as it is (typed, in the ledger) and enforces it; nobody else may
//! create or change it. Workers never see it as something to write: they attach (P, W) to a
//! contract that already exists. Every check of its fields lives in [`PrivacyContract::check`],
//! so the coordinator (before registering) and the accountant (before storing) refuse exactly
//! the same contracts.

use serde::{Deserialize, Serialize};

use crate::{AccountantKind, check_delta, check_noise_multiplier, check_sample_rate};

/// Most canaries one audit may carry: each has its own coordinate, and its readings cost 4
/// bytes per step.
pub const MAX_AUDIT_CANARIES: u32 = 10_000_000;

/// A contract field that is out of range, or fields that contradict each other.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid {field}: {reason}")]
pub struct ContractError {
    /// The field, as the protocol names it (`contract.` omitted).
    pub field: &'static str,
    /// Why, with the value.
    pub reason: String,
}

fn invalid(field: &'static str, reason: impl Into<String>) -> ContractError {
    ContractError { field, reason: reason.into() }
}

/// One step of DP-SGD as a mechanism: the Poisson-subsampled Gaussian on the clipped sum.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Mechanism {
    /// Poisson rate q in (0, 1]: every privacy unit is in a step's batch with probability q.
    pub sample_rate: f64,
    /// Noise multiplier σ: the noise std is σ·C on the sum (0 only for a NOT PRIVATE baseline).
    pub noise_multiplier: f64,
    /// Per-unit L2 clipping norm C > 0.
    pub clipping_norm: f64,
}

/// The large-batch recipe a TAN simulation stands for (Sander et al. 2023).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Recipe {
    /// The target's Poisson rate q = B/N.
    pub sample_rate: f64,
    /// The target's σ.
    pub noise_multiplier: f64,
}

/// Whether a job's releases carry a DP guarantee.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Mode {
    /// ε at δ of the job's own mechanism.
    Dp,
    /// σ = 0: a non-private baseline; no ε (+∞), NOT PRIVATE wherever it shows.
    NotPrivate,
    /// No guarantee; the job reports (and enforces) the ε of the recipe it simulates, by RDP.
    Simulation {
        /// The simulated recipe.
        target: Recipe,
    },
}

impl Mode {
    /// Its kind, without a simulation's recipe.
    pub fn kind(&self) -> ModeKind {
        match self {
            Mode::Dp => ModeKind::Dp,
            Mode::NotPrivate => ModeKind::NotPrivate,
            Mode::Simulation { .. } => ModeKind::Simulation,
        }
    }

    /// The mode's name in metrics labels, manifests and logs.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// The mode where people read it: "" for DP, else "NOT PRIVATE (...)", the one wording
    /// every surface shows for a job without a guarantee.
    pub fn label(&self) -> &'static str {
        match self {
            Mode::NotPrivate => "NOT PRIVATE (non-private baseline, sigma = 0)",
            Mode::Simulation { .. } => "NOT PRIVATE (TAN simulation)",
            Mode::Dp => "",
        }
    }

    /// Whether releases carry the job's DP guarantee (and spend dataset budgets).
    pub fn is_private(&self) -> bool {
        self.kind().is_private()
    }

    /// Whether the job reports (and enforces) an ε at δ: its own, or a simulated recipe's.
    pub fn reports_epsilon(&self) -> bool {
        !matches!(self, Mode::NotPrivate)
    }

    /// The recipe a simulation stands for; None for every other mode.
    pub fn simulated(&self) -> Option<Recipe> {
        match self {
            Mode::Simulation { target } => Some(*target),
            Mode::Dp | Mode::NotPrivate => None,
        }
    }

    /// The mode of a kind read from a record, with the simulated recipe stored beside it.
    /// A simulation without its recipe is refused: it cannot report the ε it simulates.
    pub fn from_kind(kind: ModeKind, simulated: Option<Recipe>) -> Result<Mode, ContractError> {
        match (kind, simulated) {
            (ModeKind::Dp, _) => Ok(Mode::Dp),
            (ModeKind::NotPrivate, _) => Ok(Mode::NotPrivate),
            (ModeKind::Simulation, Some(target)) => Ok(Mode::Simulation { target }),
            (ModeKind::Simulation, None) => Err(invalid("simulated", "a simulation names the recipe it simulates")),
        }
    }
}

/// A mode without a simulation's recipe: what a checkpoint manifest records of the weights it
/// holds, and every label names ("dp", "not_private", "simulation"). An unknown name is refused,
/// never read as DP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModeKind {
    /// Weights under the job's DP guarantee (the default of manifests from before modes).
    #[default]
    Dp,
    /// A non-private baseline's: NOT PRIVATE.
    NotPrivate,
    /// A TAN simulation's: NOT PRIVATE.
    Simulation,
}

impl ModeKind {
    /// Every kind, in the order names are listed.
    pub const ALL: [ModeKind; 3] = [ModeKind::Dp, ModeKind::NotPrivate, ModeKind::Simulation];

    /// "dp", "not_private" or "simulation".
    pub fn name(self) -> &'static str {
        match self {
            ModeKind::Dp => "dp",
            ModeKind::NotPrivate => "not_private",
            ModeKind::Simulation => "simulation",
        }
    }

    /// Whether it carries a DP guarantee.
    pub fn is_private(self) -> bool {
        self == ModeKind::Dp
    }
}

impl std::fmt::Display for ModeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ModeKind {
    type Err = ContractError;
    fn from_str(s: &str) -> Result<Self, ContractError> {
        Self::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|k| k.name()).collect();
            let (last, rest) = names.split_last().expect("kinds");
            invalid("privacy", format!("{s:?} is not {} or {last}", rest.join(", ")))
        })
    }
}

/// Whose privacy the guarantee protects: the unit that Poisson sampling draws and clipping
/// bounds. Budgets are kept per unit: ε of example-level and user-level jobs never add up.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PrivacyUnit {
    /// Adding or removing one example (image–text pair).
    Example,
    /// Adding or removing one user with all their examples (DP-FedEmb).
    User {
        /// The digest of the user table that defines who owns which example.
        users_digest: String,
    },
}

impl PrivacyUnit {
    /// "example" or "user", as budgets and errors name the unit.
    pub fn name(&self) -> &'static str {
        match self {
            PrivacyUnit::Example => "example",
            PrivacyUnit::User { .. } => "user",
        }
    }
}

/// Where an audit's canaries live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// m coordinates appended after the model's P, noised with the release and never sent to
    /// a rank: no example moves them, so the audit sees the accountant's noise alone.
    Reserved,
    /// The model's own coordinates: the examples' gradients add to the scores.
    Model,
}

impl Placement {
    /// "reserved" or "model".
    pub fn as_str(self) -> &'static str {
        match self {
            Placement::Reserved => "reserved",
            Placement::Model => "model",
        }
    }

    /// What an audit on these coordinates checks, in one line for conditions and reports.
    pub fn covers(self) -> &'static str {
        match self {
            Placement::Reserved => "covers the accountant's noise on reserved coordinates, not the workers' clipping",
            Placement::Model => "covers the release on model coordinates; examples' gradients blur the scores",
        }
    }
}

impl std::str::FromStr for Placement {
    type Err = ContractError;
    fn from_str(s: &str) -> Result<Self, ContractError> {
        match s {
            "reserved" => Ok(Placement::Reserved),
            "model" => Ok(Placement::Model),
            other => Err(invalid("audit.coordinates", format!("{other:?} is not reserved or model"))),
        }
    }
}

/// A one-run audit (Steinke, Nasr and Jagielski 2023).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Audit {
    /// Canaries, 1 to [`MAX_AUDIT_CANARIES`].
    pub canaries: u32,
    /// Where they live.
    pub placement: Placement,
}

/// Everything that decides a job's guarantee (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrivacyContract {
    /// The job's own mechanism (σ' for a simulation, 0 for a baseline).
    pub mechanism: Mechanism,
    /// The accountant ε comes from (RDP for a simulation whatever is said here).
    pub accountant: AccountantKind,
    /// δ at which ε is reported and enforced.
    pub delta: f64,
    /// The ε at δ no release may pass; None for a NOT PRIVATE baseline (no limit but its plan).
    pub epsilon_target: Option<f64>,
    /// DP, NOT PRIVATE, or a TAN simulation.
    pub mode: Mode,
    /// Whose privacy is protected.
    pub unit: PrivacyUnit,
    /// The dataset: the digest of its index as the plan pinned it ("" for none, tests only).
    pub dataset_id: String,
    /// The data: the digest of the index's shard content digests, sorted ("" for an index that
    /// pins no shard bytes). Budgets are keyed by it ([`PrivacyContract::budget_id`]), so a
    /// re-index or an edited copy of the same shards spends the same budget.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub data_id: String,
    /// What an index of version 3 named the same data by (the digest of its shards' content
    /// digests): a budget set under it still binds the data ("" when unknown).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub shards_id: String,
    /// A one-run audit, if any (DP jobs only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<Audit>,
    /// A DP job on the same dataset and unit whose released weights this job starts from: its
    /// charged steps compose into this job's reported ε.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from_job: Option<String>,
    /// The steps the job plans: the accountant charges none past them and reserves them on
    /// the dataset's budget until the job ends. 0 only in ledgers written before it was part
    /// of the contract (no limit but ε, no reservation).
    #[serde(default)]
    pub planned_steps: u64,
}

impl PrivacyContract {
    /// Every field in range and consistent with the mode. The first problem is returned,
    /// naming its field.
    pub fn check(&self) -> Result<(), ContractError> {
        let m = &self.mechanism;
        check_sample_rate(m.sample_rate).map_err(|e| invalid("mechanism.sample_rate", e.to_string()))?;
        check_delta(self.delta).map_err(|e| invalid("delta", e.to_string()))?;
        if !(m.clipping_norm > 0.0 && m.clipping_norm.is_finite()) {
            return Err(invalid("mechanism.clipping_norm", format!("{} must be a finite number > 0", m.clipping_norm)));
        }
        self.check_mode()?;
        if !self.dataset_id.is_empty() {
            check_digest("dataset_id", &self.dataset_id)?;
        }
        if !self.data_id.is_empty() {
            check_digest("data_id", &self.data_id)?;
        }
        if !self.shards_id.is_empty() {
            check_digest("shards_id", &self.shards_id)?;
        }
        if let PrivacyUnit::User { users_digest } = &self.unit {
            check_digest("users_digest", users_digest)?;
        }
        if let Some(audit) = &self.audit {
            if !self.mode.is_private() {
                return Err(invalid(
                    "audit",
                    format!("a {} job claims no guarantee to audit; only DP jobs can be audited", self.mode.name()),
                ));
            }
            if audit.canaries == 0 || audit.canaries > MAX_AUDIT_CANARIES {
                return Err(invalid(
                    "audit.canaries",
                    format!("{} must be in [1, {MAX_AUDIT_CANARIES}]", audit.canaries),
                ));
            }
        }
        if self.init_from_job.as_deref() == Some("") {
            return Err(invalid("init_from_job", "must name a job when set"));
        }
        Ok(())
    }

    /// The fields in which `other` differs from this contract, each with both values under
    /// the names of their sources, for a refusal that names them ("mechanism.sample_rate: 1 in
    /// the record, 0.12 in the ledger").
    pub fn differences(&self, other: &PrivacyContract, (ours, theirs): (&str, &str)) -> Vec<String> {
        let mut out = Vec::new();
        let mut field = |name: &str, a: String, b: String| {
            if a != b {
                out.push(format!("{name}: {a} {ours}, {b} {theirs}"));
            }
        };
        let (m, o) = (&self.mechanism, &other.mechanism);
        field("mechanism.sample_rate", m.sample_rate.to_string(), o.sample_rate.to_string());
        field("mechanism.noise_multiplier", m.noise_multiplier.to_string(), o.noise_multiplier.to_string());
        field("mechanism.clipping_norm", m.clipping_norm.to_string(), o.clipping_norm.to_string());
        field("accountant", self.accountant.to_string(), other.accountant.to_string());
        field("delta", self.delta.to_string(), other.delta.to_string());
        field("epsilon_target", format!("{:?}", self.epsilon_target), format!("{:?}", other.epsilon_target));
        field("mode", format!("{:?}", self.mode), format!("{:?}", other.mode));
        field("unit", format!("{:?}", self.unit), format!("{:?}", other.unit));
        field("dataset_id", self.dataset_id.clone(), other.dataset_id.clone());
        field("data_id", self.data_id.clone(), other.data_id.clone());
        field("shards_id", self.shards_id.clone(), other.shards_id.clone());
        field("audit", format!("{:?}", self.audit), format!("{:?}", other.audit));
        field("init_from_job", format!("{:?}", self.init_from_job), format!("{:?}", other.init_from_job));
        field("planned_steps", self.planned_steps.to_string(), other.planned_steps.to_string());
        out
    }

    /// What the job's dataset budget is keyed by: the data's digest where the index pins its
    /// shards' bytes, else the index's digest.
    pub fn budget_id(&self) -> &str {
        if self.data_id.is_empty() { &self.dataset_id } else { &self.data_id }
    }

    fn check_mode(&self) -> Result<(), ContractError> {
        let sigma = self.mechanism.noise_multiplier;
        match (&self.mode, self.epsilon_target) {
            (Mode::NotPrivate, None) if sigma == 0.0 => Ok(()),
            (Mode::NotPrivate, _) => Err(invalid(
                "privacy",
                format!(
                    "a NOT_PRIVATE job has noise_multiplier 0 and no epsilon_target, not {sigma} and {:?}",
                    self.epsilon_target
                ),
            )),
            (_, None) => Err(invalid("epsilon_target", "a DP or SIMULATION job needs a finite target > 0")),
            (mode, Some(target)) => {
                if !(target > 0.0 && target.is_finite()) {
                    return Err(invalid("epsilon_target", format!("{target} must be a finite number > 0")));
                }
                // Noise of std σ·C that rounds to 0 (or a subnormal) is no noise.
                check_noise_multiplier(sigma).map_err(|e| invalid("mechanism.noise_multiplier", e.to_string()))?;
                if sigma * self.mechanism.clipping_norm < f64::MIN_POSITIVE {
                    return Err(invalid(
                        "mechanism.noise_multiplier",
                        format!("{sigma} times clipping_norm {} is no noise", self.mechanism.clipping_norm),
                    ));
                }
                if let Mode::Simulation { target } = mode {
                    check_sample_rate(target.sample_rate)
                        .map_err(|e| invalid("simulated.sample_rate", e.to_string()))?;
                    check_noise_multiplier(target.noise_multiplier)
                        .map_err(|e| invalid("simulated.noise_multiplier", e.to_string()))?;
                }
                Ok(())
            }
        }
    }

    /// The accountant, rate and σ whose ε the job reports: its own (DP), the simulated
    /// recipe's by RDP (simulation), or none (baseline).
    pub fn epsilon_mechanism(&self) -> Option<(AccountantKind, f64, f64)> {
        match self.mode {
            Mode::Dp => Some((self.accountant, self.mechanism.sample_rate, self.mechanism.noise_multiplier)),
            Mode::Simulation { target } => Some((AccountantKind::Rdp, target.sample_rate, target.noise_multiplier)),
            Mode::NotPrivate => None,
        }
    }

    /// The noise std σ·C the accountant adds to every sum.
    pub fn noise_std(&self) -> f64 {
        self.mechanism.noise_multiplier * self.mechanism.clipping_norm
    }
}

/// "sha256:" and 64 lowercase hex digits.
pub fn check_digest(field: &'static str, digest: &str) -> Result<(), ContractError> {
    let hex = digest.strip_prefix("sha256:").unwrap_or_default();
    if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Ok(());
    }
    Err(invalid(field, format!("{digest:?} is not a digest (\"sha256:\" and 64 lowercase hex digits)")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dp() -> PrivacyContract {
        PrivacyContract {
            mechanism: Mechanism { sample_rate: 0.01, noise_multiplier: 1.0, clipping_norm: 1.0 },
            accountant: AccountantKind::Pld,
            delta: 1e-5,
            epsilon_target: Some(8.0),
            mode: Mode::Dp,
            unit: PrivacyUnit::Example,
            dataset_id: format!("sha256:{}", "ab".repeat(32)),
            data_id: format!("sha256:{}", "cd".repeat(32)),
            shards_id: String::new(),
            audit: None,
            init_from_job: None,
            planned_steps: 100,
        }
    }

    #[test]
    fn a_contract_reads_back_from_json_as_the_same_typed_value() {
        let mut c = dp();
        c.mode = Mode::Simulation { target: Recipe { sample_rate: 0.3, noise_multiplier: 0.728 } };
        c.unit = PrivacyUnit::User { users_digest: format!("sha256:{}", "cd".repeat(32)) };
        c.audit = Some(Audit { canaries: 1000, placement: Placement::Reserved });
        c.init_from_job = Some("job-1".into());
        let json = serde_json::to_string(&c).unwrap();
        assert!(json.contains("\"kind\":\"simulation\"") && json.contains("\"kind\":\"user\""), "{json}");
        assert_eq!(serde_json::from_str::<PrivacyContract>(&json).unwrap(), c);
    }

    #[test]
    fn a_budget_is_keyed_by_the_data_where_the_index_pins_it_else_by_the_index() {
        let mut c = dp();
        assert_eq!(c.budget_id(), c.data_id);
        c.data_id.clear();
        assert_eq!(c.budget_id(), c.dataset_id);
    }

    #[test]
    fn modes_check_their_fields_and_name_them() {
        assert_eq!(dp().check(), Ok(()));
        type Break = fn(&mut PrivacyContract);
        let cases: [(&str, Break); 10] = [
            ("mechanism.noise_multiplier", |c| c.mechanism.noise_multiplier = 0.0),
            ("mechanism.noise_multiplier", |c| c.mechanism.noise_multiplier = 1e-320),
            ("epsilon_target", |c| c.epsilon_target = None),
            ("epsilon_target", |c| c.epsilon_target = Some(f64::INFINITY)),
            ("privacy", |c| c.mode = Mode::NotPrivate),
            ("mechanism.sample_rate", |c| c.mechanism.sample_rate = 1.5),
            ("delta", |c| c.delta = 1.0),
            ("dataset_id", |c| c.dataset_id = "s3://bucket/laion".into()),
            ("data_id", |c| c.data_id = "laion-400m".into()),
            ("audit.canaries", |c| c.audit = Some(Audit { canaries: 0, placement: Placement::Model })),
        ];
        for (field, break_it) in cases {
            let mut c = dp();
            break_it(&mut c);
            assert_eq!(c.check().map_err(|e| e.field), Err(field), "{c:?}");
        }
        let mut baseline = dp();
        (baseline.mode, baseline.mechanism.noise_multiplier, baseline.epsilon_target) = (Mode::NotPrivate, 0.0, None);
        assert_eq!(baseline.check(), Ok(()));
        baseline.audit = Some(Audit { canaries: 10, placement: Placement::Reserved });
        assert_eq!(baseline.check().map_err(|e| e.field), Err("audit"));
    }

    #[test]
    fn differences_name_each_field_that_differs_with_both_values() {
        let mut other = dp();
        let names = ("in the record", "in the ledger");
        assert!(dp().differences(&other, names).is_empty());
        (other.mechanism.sample_rate, other.mechanism.clipping_norm) = (1.0, 100.0);
        assert_eq!(
            other.differences(&dp(), names),
            [
                "mechanism.sample_rate: 1 in the record, 0.01 in the ledger",
                "mechanism.clipping_norm: 100 in the record, 1 in the ledger"
            ]
        );
    }
}
