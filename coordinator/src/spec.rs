//! Job specs as the coordinator checks them (an operator's file is read into the `JobSpec`
//! message by `dpcap_proto::spec::SpecFile`), and the first stage of planning: a [`Checked`] spec, every field checked and every choice
//! typed (objective, accountant, privacy mode, audit, rate, length, DP-FedEmb settings), so that
//! the later stages (`plan`: q, steps, δ, σ and ε; `registration`: the contract) read types,
//! never the wire's fields again. Every refusal names its field.

use dpcap_privacy::AccountantKind;
use dpcap_privacy::contract::{Audit, ModeKind, Placement};
use dpcap_proto::contract::SpecChoices;
use dpcap_proto::v1::{self, JobSpec, TelemetryMode};
use dpcap_registry::{Family, FedEmb};

use crate::error::CoordinatorError;

/// Model configuration names every objective accepts: the model registry's.
pub use dpcap_registry::NAMES as MODEL_NAMES;

/// Largest micro-batch accepted: a bigger one is a typo, not a memory plan.
pub const MAX_MICRO_BATCH: u32 = 65_536;

/// Most users a virtual client may group.
pub const MAX_USERS_PER_CLIENT: u32 = 1_000_000;

fn positive(field: &'static str, value: Option<f64>) -> Result<Option<f64>, CoordinatorError> {
    match value {
        Some(v) if !(v > 0.0 && v.is_finite()) => {
            Err(CoordinatorError::invalid(field, format!("{v} must be a finite number > 0")))
        }
        other => Ok(other),
    }
}

/// A spec whose fields passed [`check_fields`], with its enums typed: what [`plan`] takes.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The spec as submitted.
    pub spec: JobSpec,
    /// Its accountant kind (the wire's one conversion: an unknown kind is refused).
    pub kind: AccountantKind,
    /// Its objective, likewise.
    pub family: Family,
    /// A user-level objective's DP-FedEmb settings, every default filled in (the wire's one
    /// conversion); None for the others.
    pub fedemb: Option<FedEmb>,
    /// The privacy mode asked for, its fields checked against each other.
    pub mode: ModeRequest,
    /// The one-run audit asked for, its placement parsed.
    pub audit: Option<Audit>,
    /// How q is given.
    pub rate: Rate,
    /// How long the job runs.
    pub length: Length,
}

/// The privacy mode a spec asks for, before it is resolved over the dataset (`plan`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ModeRequest {
    /// DP: σ fixed, or calibrated for ε (at least one is given; both: σ fixed, ε enforced).
    Dp {
        /// Target ε at δ.
        epsilon: Option<f64>,
        /// Fixed σ (noise multiplier).
        noise_multiplier: Option<f64>,
    },
    /// A non-private baseline: σ = 0, no ε.
    NotPrivate,
    /// A TAN simulation of a target batch, at its σ or at one calibrated for ε.
    Simulate {
        /// The target recipe's expected batch B.
        batch_size: u64,
        /// The target's σ.
        noise_multiplier: Option<f64>,
        /// The target's ε at δ (calibrates σ when it is not given).
        epsilon: Option<f64>,
    },
}

impl ModeRequest {
    /// Whether the job asks for a guarantee (neither a baseline nor a simulation).
    pub fn is_private(&self) -> bool {
        match self {
            ModeRequest::Dp { .. } => true,
            ModeRequest::NotPrivate | ModeRequest::Simulate { .. } => false,
        }
    }
}

/// How a spec gives the Poisson rate q.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rate {
    /// q itself, in (0, 1].
    SampleRate(f64),
    /// The expected batch L = qN (at least 1).
    BatchSize(u64),
}

/// How long a spec runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Length {
    /// Steps (at least 1).
    Steps(u64),
    /// Epochs (> 0): ⌈epochs / q⌉ steps.
    Epochs(f64),
}

/// Checks every field that does not need the dataset; the first problem is returned.
pub fn check_fields(spec: &JobSpec) -> Result<Checked, CoordinatorError> {
    check_choices(spec, SpecChoices::decode(spec)?)
}

/// [`check_fields`] given the spec's decoded `choices`: planning decodes first, then checks, so
/// that it visits the wire's conversions once.
pub fn check_choices(spec: &JobSpec, choices: SpecChoices) -> Result<Checked, CoordinatorError> {
    let SpecChoices { family, kind, mode, fedemb } = choices;
    if spec.dataset.trim().is_empty() {
        return Err(CoordinatorError::invalid("dataset", "must name a dataset directory or URL"));
    }
    if !MODEL_NAMES.contains(&spec.model.as_str()) {
        return Err(CoordinatorError::invalid(
            "model",
            format!("{:?} is not one of {}", spec.model, MODEL_NAMES.join(", ")),
        ));
    }
    if v1::Augment::try_from(spec.augment).is_err() {
        return Err(CoordinatorError::invalid("augment", format!("unknown value {}", spec.augment)));
    }
    if TelemetryMode::try_from(spec.telemetry).is_err() {
        return Err(CoordinatorError::invalid("telemetry", format!("unknown value {}", spec.telemetry)));
    }
    positive("epsilon", spec.epsilon)?;
    positive("noise_multiplier", spec.noise_multiplier)?;
    positive("clipping_norm", spec.clipping_norm)?;
    positive("learning_rate", spec.learning_rate)?;
    positive("epochs", spec.epochs)?;
    let mode = mode_request(spec, mode)?;
    let audit = audit(spec, &mode)?;
    check_fedemb(spec, family, &mode)?;
    if let Some(d) = spec.delta
        && !(d > 0.0 && d < 1.0)
    {
        return Err(CoordinatorError::invalid("delta", format!("{d} must be in (0, 1)")));
    }
    let rate = match (spec.sample_rate, spec.batch_size) {
        (Some(_), Some(_)) => {
            return Err(CoordinatorError::invalid("sample_rate", "give sample_rate or batch_size, not both"));
        }
        (None, None) => return Err(CoordinatorError::invalid("sample_rate", "give sample_rate or batch_size")),
        (Some(q), None) if !(q > 0.0 && q <= 1.0) => {
            return Err(CoordinatorError::invalid("sample_rate", format!("{q} must be in (0, 1]")));
        }
        (None, Some(0)) => return Err(CoordinatorError::invalid("batch_size", "0 must be at least 1")),
        (Some(q), None) => Rate::SampleRate(q),
        (None, Some(b)) => Rate::BatchSize(b),
    };
    let length = match (spec.steps, spec.epochs) {
        (Some(_), Some(_)) => return Err(CoordinatorError::invalid("steps", "give steps or epochs, not both")),
        (None, None) => return Err(CoordinatorError::invalid("steps", "give steps or epochs")),
        (Some(0), None) => return Err(CoordinatorError::invalid("steps", "0 must be at least 1")),
        (Some(s), None) => Length::Steps(s),
        (None, Some(e)) => Length::Epochs(e),
    };
    if let Some(m) = spec.micro_batch
        && !(1..=MAX_MICRO_BATCH).contains(&m)
    {
        return Err(CoordinatorError::invalid("micro_batch", format!("{m} must be in 1..={MAX_MICRO_BATCH}")));
    }
    if spec.workers == Some(0) {
        return Err(CoordinatorError::invalid("workers", "0 must be at least 1"));
    }
    if spec.checkpoint_interval == Some(0) {
        return Err(CoordinatorError::invalid("checkpoint_interval", "0 must be at least 1"));
    }
    let budget = spec.dataset_epsilon_budget;
    if budget != 0.0 {
        return Err(CoordinatorError::invalid(
            "dataset_epsilon_budget",
            format!(
                "{budget}: a job cannot set its dataset's budget; a privacy admin sets it (dpctl dataset budget set)"
            ),
        ));
    }
    Ok(Checked { spec: spec.clone(), kind, family, fedemb, mode, audit, rate, length })
}

/// Users per client of a user-level (fedemb) job; None for example-level objectives.
pub fn users_per_client(checked: &Checked) -> Option<u32> {
    checked.fedemb.map(|f| f.users_per_client)
}

/// fedemb settings belong to a fedemb job and must be in range; a simulation of a user-level
/// recipe is not offered.
fn check_fedemb(spec: &JobSpec, family: Family, mode: &ModeRequest) -> Result<(), CoordinatorError> {
    let fedemb = family.is_user_level();
    if fedemb && matches!(mode, ModeRequest::Simulate { .. }) {
        return Err(CoordinatorError::invalid("simulate", "a TAN simulation of a user-level recipe is not offered"));
    }
    let Some(f) = &spec.fedemb else { return Ok(()) };
    if !fedemb {
        return Err(CoordinatorError::invalid("fedemb", "settings for objective fedemb on another objective"));
    }
    positive("fedemb.local_learning_rate", f.local_learning_rate)?;
    positive("fedemb.head_scale", f.head_scale)?;
    if let Some(m) = f.server_momentum
        && !(0.0..1.0).contains(&m)
    {
        return Err(CoordinatorError::invalid("fedemb.server_momentum", format!("{m} must be in [0, 1)")));
    }
    if f.users_per_client > 1 {
        // Grouping users into ⌈users/k⌉ clients makes the grouping depend on the number of
        // users: adding one can change the count and reshuffle every client, which voids the
        // per-client bound. A fixed client count, set apart from the data, is needed first.
        return Err(CoordinatorError::invalid(
            "fedemb.users_per_client",
            format!(
                "{} is not offered yet: virtual clients need a client count fixed apart from the data; use 1 (each user its own client)",
                f.users_per_client
            ),
        ));
    }
    if f.users_per_client > MAX_USERS_PER_CLIENT {
        return Err(CoordinatorError::invalid(
            "fedemb.users_per_client",
            format!("{} must be at most {MAX_USERS_PER_CLIENT}", f.users_per_client),
        ));
    }
    if f.local_batch > MAX_MICRO_BATCH {
        return Err(CoordinatorError::invalid(
            "fedemb.local_batch",
            format!("{} must be at most {MAX_MICRO_BATCH}", f.local_batch),
        ));
    }
    if f.local_steps > 100_000 || f.local_epochs > 1_000 {
        return Err(CoordinatorError::invalid(
            "fedemb.local_steps",
            format!("{} steps or {} epochs per client is a typo, not a plan", f.local_steps, f.local_epochs),
        ));
    }
    Ok(())
}

/// Most canaries a job may ask for (the accountant's limit).
pub const MAX_AUDIT_CANARIES: u32 = 10_000_000;

/// An audit needs a DP job (the others claim nothing to audit), a known kind, and a count the
/// accountant accepts (it checks the model's parameter count itself).
fn audit(spec: &JobSpec, mode: &ModeRequest) -> Result<Option<Audit>, CoordinatorError> {
    let Some(audit) = &spec.audit else { return Ok(None) };
    if !matches!(audit.kind.as_str(), "" | "gradient") {
        return Err(CoordinatorError::invalid("audit.kind", format!("{:?} is not gradient", audit.kind)));
    }
    let placement = if audit.coordinates.is_empty() { Placement::Reserved } else { audit.coordinates.parse()? };
    if audit.canaries == 0 || audit.canaries > MAX_AUDIT_CANARIES {
        return Err(CoordinatorError::invalid(
            "audit.canaries",
            format!("{} must be in [1, {MAX_AUDIT_CANARIES}]", audit.canaries),
        ));
    }
    if !mode.is_private() {
        return Err(CoordinatorError::invalid("audit", "a NOT PRIVATE job claims no guarantee to audit"));
    }
    Ok(Some(Audit { canaries: audit.canaries, placement }))
}

/// The privacy mode the spec asks for (`privacy`, else the older `not_private`, else a
/// simulation when `simulate` is given, else DP), its fields checked against each other
/// (before the dataset is read).
fn mode_request(spec: &JobSpec, asked: Option<ModeKind>) -> Result<ModeRequest, CoordinatorError> {
    fn invalid(field: &'static str, reason: impl Into<String>) -> CoordinatorError {
        CoordinatorError::invalid(field, reason)
    }
    let implied = if spec.not_private {
        ModeKind::NotPrivate
    } else if spec.simulate.is_some() {
        ModeKind::Simulation
    } else {
        ModeKind::Dp
    };
    let kind = asked.unwrap_or(implied);
    if spec.not_private && kind != ModeKind::NotPrivate {
        return Err(invalid(
            "not_private",
            format!("is the older spelling of privacy: not_private, but privacy is {kind}"),
        ));
    }
    match kind {
        ModeKind::NotPrivate => {
            if spec.epsilon.is_some() || spec.noise_multiplier.is_some() || spec.simulate.is_some() {
                let field = if asked.is_none() { "not_private" } else { "privacy" };
                return Err(invalid(field, "a non-private job has no epsilon, noise_multiplier or simulate"));
            }
            Ok(ModeRequest::NotPrivate)
        }
        ModeKind::Simulation => simulation(spec),
        ModeKind::Dp => {
            if spec.simulate.is_some() {
                return Err(invalid("simulate", "only privacy: simulation simulates a recipe"));
            }
            if spec.epsilon.is_none() && spec.noise_multiplier.is_none() {
                return Err(invalid("epsilon", "give a target epsilon, a fixed noise_multiplier, or both"));
            }
            Ok(ModeRequest::Dp { epsilon: spec.epsilon, noise_multiplier: spec.noise_multiplier })
        }
    }
}

/// A simulation's request: the recipe in `simulate`, whose σ is given or calibrated for ε.
fn simulation(spec: &JobSpec) -> Result<ModeRequest, CoordinatorError> {
    let Some(simulate) = &spec.simulate else {
        return Err(CoordinatorError::invalid(
            "simulate",
            "a simulation names its target recipe (batch_size, noise_multiplier)",
        ));
    };
    if spec.noise_multiplier.is_some() {
        return Err(CoordinatorError::invalid(
            "noise_multiplier",
            "a simulation derives sigma' from simulate; set simulate.noise_multiplier",
        ));
    }
    if simulate.batch_size == 0 {
        return Err(CoordinatorError::invalid("simulate.batch_size", "0 must be at least 1"));
    }
    match simulate.noise_multiplier {
        Some(s) if !(s > 0.0 && s.is_finite()) => {
            return Err(CoordinatorError::invalid(
                "simulate.noise_multiplier",
                format!("{s} must be a finite number > 0"),
            ));
        }
        None if spec.epsilon.is_none() => {
            return Err(CoordinatorError::invalid(
                "simulate.noise_multiplier",
                "give it, or a target epsilon to calibrate it",
            ));
        }
        _ => {}
    }
    let (batch_size, noise_multiplier) = (simulate.batch_size, simulate.noise_multiplier);
    Ok(ModeRequest::Simulate { batch_size, noise_multiplier, epsilon: spec.epsilon })
}
