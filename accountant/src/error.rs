//! Every way an accountant request can fail, each mapped to one [`ErrorCode`].

use dpcap_proto::v1::BudgetExhausted;
use dpcap_proto::{ErrorCode, ServiceError};

use crate::privacy::PrivacyError;

/// An accountant failure; messages are lowercase and carry the offending values.
#[derive(Debug, thiserror::Error)]
pub enum AccountantError {
    /// A request field is malformed; names the field and why.
    #[error("invalid {field}: {reason}")]
    InvalidArgument {
        /// The request field (protocol name).
        field: &'static str,
        /// What is wrong with it, with the value.
        reason: String,
    },
    /// A contract field out of range, or fields that contradict each other (names the field).
    #[error(transparent)]
    Contract(#[from] crate::privacy::ContractError),
    /// A dataset id that is not an index digest.
    #[error("{0}; `dpctl dataset index` prints the digest")]
    DatasetId(#[source] crate::privacy::ContractError),
    /// A part's bytes are not P finite f32 values.
    #[error(transparent)]
    Floats(#[from] dpcap_proto::floats::FloatsError),
    /// The job id is not registered.
    #[error("job {job_id} is not registered")]
    UnknownJob {
        /// The job asked for.
        job_id: String,
    },
    /// The job trains on a dataset no privacy admin gave a budget for its privacy unit.
    #[error(
        "dataset {dataset_id:?} has no privacy budget: a privacy admin must set one (dpctl dataset budget set --unit {unit}), or the accountant must run with --allow-unbudgeted-datasets"
    )]
    UnbudgetedDataset {
        /// The dataset (index digest; empty when the job named none).
        dataset_id: String,
        /// The job's privacy unit ("example" or "user").
        unit: String,
    },
    /// No budget was ever set for this dataset and unit.
    #[error("dataset {dataset_id} has no {unit}-level budget")]
    UnknownDataset {
        /// The dataset asked for.
        dataset_id: String,
        /// The unit asked for.
        unit: String,
    },
    /// The job was registered before with a different contract.
    #[error("job {job_id} is already registered with a different mechanism or budget")]
    RegistrationConflict {
        /// The job.
        job_id: String,
    },
    /// The step is not the one the ledger expects, or its release is gone.
    #[error("job {job_id} step {step}: {reason}")]
    StepRefused {
        /// The job.
        job_id: String,
        /// The refused step.
        step: u64,
        /// Which refusal, typed for clients: StepAlreadyCharged, StepNotNext,
        /// ReleaseDiscarded, ReleaseTrimmed or BudgetExhausted.
        code: ErrorCode,
        /// Why (e.g. "the ledger expects step 7").
        reason: String,
    },
    /// The step would take the job (or its dataset) past its budget; nothing was charged.
    #[error(
        "budget exhausted for job {job_id}: step {step} would spend epsilon {epsilon_after:.6} > {scope} target {epsilon_target} (spent {epsilon_spent:.6} at delta {delta:e})"
    )]
    BudgetExhausted {
        /// The job.
        job_id: String,
        /// The step that was refused.
        step: u64,
        /// "job" or "dataset <id>".
        scope: String,
        /// ε spent before this step.
        epsilon_spent: f64,
        /// ε the step would have brought it to.
        epsilon_after: f64,
        /// The target it would pass.
        epsilon_target: f64,
        /// δ of the job.
        delta: f64,
    },
    /// A part with the same (job, step, part) but other bytes was already received.
    #[error("job {job_id} step {step} part {part}: a different part with this number was already received")]
    ConflictingPart {
        /// The job.
        job_id: String,
        /// The step.
        step: u64,
        /// The part index.
        part: u32,
    },
    /// A part from a group generation older than the parts already pending for its step.
    #[error("job {job_id} step {step}: part from attempt {attempt} is stale; attempt {current} is collecting")]
    StalePart {
        /// The job.
        job_id: String,
        /// The step.
        step: u64,
        /// The part's attempt.
        attempt: u64,
        /// The attempt being collected.
        current: u64,
    },
    /// Another accountant process sharing the ledger charged this step first.
    #[error("job {job_id} step {step} was charged by another accountant sharing this ledger")]
    ChargedElsewhere {
        /// The job.
        job_id: String,
        /// The step.
        step: u64,
    },
    /// The job was closed and accepts nothing more.
    #[error("job {job_id} is closed")]
    JobClosed {
        /// The job.
        job_id: String,
    },
    /// A fence asked for a generation below one already fenced (a stale coordinator call).
    #[error("job {job_id}: generation {generation} is already revoked (generation {admitted} is the oldest admitted)")]
    Fenced {
        /// The job.
        job_id: String,
        /// The generation asked for.
        generation: u64,
        /// The oldest generation still admitted.
        admitted: u64,
    },
    /// The step's parts could not have been clipped: nothing is charged or released.
    #[error(
        "job {job_id} step {step}: its parts' L2 norms sum to {norms:.6e}, past C = {clipping_norm} times the \
         {sampled} units sampled ({bound:.6e}): a worker did not clip; nothing was charged or released"
    )]
    Unclipped {
        /// The job.
        job_id: String,
        /// The step.
        step: u64,
        /// Σ of the parts' L2 norms.
        norms: f64,
        /// The contract's C.
        clipping_norm: f64,
        /// Units the coordinator sampled for the step.
        sampled: u64,
        /// What the norms may sum to.
        bound: f64,
    },
    /// One rank's part is past C times the units of that rank's own share: nothing is
    /// charged or released (one rank can never spend another's share of the sensitivity).
    #[error(
        "job {job_id} step {step} part {part}: its L2 norm {norm:.6e} is past C = {clipping_norm} times the \
         {units} units of its rank's share ({bound:.6e}): a worker did not clip; nothing was charged or released"
    )]
    UnclippedPart {
        /// The job.
        job_id: String,
        /// The step.
        step: u64,
        /// The part (the rank, on the CPU path).
        part: u32,
        /// Its L2 norm so far (a stream is cut off as soon as it passes the bound).
        norm: f64,
        /// The contract's C.
        clipping_norm: f64,
        /// Units of the rank's share, as its step capability states them.
        units: u64,
        /// What the norm may reach.
        bound: f64,
    },
    /// A part stream passed one of the limits on what open streams may hold: cut off, its
    /// bytes let go, nothing charged.
    #[error("job {job_id} part {part}: stream cut off by {limit}: {reason}")]
    PartStream {
        /// The job.
        job_id: String,
        /// The part.
        part: u32,
        /// The limit's name: `part_idle` (no chunk within `--part-idle-seconds`; the rank's
        /// retry resends) or `one_stream_per_part` (a newer stream of the part replaced it).
        limit: &'static str,
        /// What happened, with the value.
        reason: String,
    },
    /// The job cannot be audited (yet): registered without canaries, or still open.
    #[error("job {job_id} cannot be audited: {reason}")]
    NotAuditable {
        /// The job.
        job_id: String,
        /// Why.
        reason: String,
    },
    /// The ledger is still being replayed, or the server is draining.
    #[error("accountant unavailable: {0}")]
    Unavailable(String),
    /// The ledger's store failed.
    #[error("ledger storage failed: {0}")]
    Storage(#[from] object_store::Error),
    /// A ledger object could not be decoded.
    #[error("ledger object {path} is corrupt: {reason}")]
    CorruptLedger {
        /// The object path.
        path: String,
        /// Why it failed to decode.
        reason: String,
    },
    /// A privacy parameter is out of its domain.
    #[error(transparent)]
    Privacy(#[from] PrivacyError),
    /// A capability is missing, forged, expired, or for another job, rank or generation.
    #[error(transparent)]
    Capability(#[from] dpcap_serve::capability::CapabilityError),
    /// A job's plan (a new one, or a resumed one's remaining steps) that its dataset's budget
    /// cannot cover beside what is spent and reserved: BUDGET_EXHAUSTED, never a bad argument,
    /// so that automation tells "the budget is spent" from "fix the spec".
    #[error(
        "{} planned steps would bring {} to epsilon {:.4} of its budget {} at delta {:e}: {:.4} is spent and {:.4} reserved by other jobs' plans, {:.4} is free{}; plan fewer steps or a lower epsilon, wait for a running job to end, or ask its privacy admin",
        .0.steps, named(.0), .0.asked, .0.epsilon_budget, .0.delta, .0.spent, .0.reserved, .0.free, larger_delta(.0)
    )]
    PlanRefused(Box<BudgetExhausted>),
    /// A budget change that would end running jobs early, or change what every charge reads as,
    /// asked for without `force`.
    #[error("budget of {dataset} not changed: {reason}")]
    BudgetChange {
        /// The budget's dataset and unit, described.
        dataset: String,
        /// What the change would do, and how to make it anyway.
        reason: String,
    },
    /// A call of a generation the job no longer admits: its group was re-formed, or the job was
    /// suspended (cancelled or failed at the coordinator). STALE_GENERATION: the rank drops its
    /// session, which is the normal end of a cancel, not a failure.
    #[error("job {job_id}: generation {generation} is no longer admitted: {reason}")]
    Revoked {
        /// The job.
        job_id: String,
        /// The generation the call spoke for.
        generation: u64,
        /// Why: re-formed (and which generation is admitted), or suspended.
        reason: String,
    },
    /// A task run apart (a release, a close, a noise pass) panicked or was cancelled: a bug.
    #[error("internal error: {what} task failed: {source}")]
    Task {
        /// Which task.
        what: &'static str,
        /// How it ended.
        source: tokio::task::JoinError,
    },
    /// The operating system gave no randomness (noise, an audit's secret, a fresh key).
    #[error("internal error: no OS entropy: {0}")]
    Entropy(#[from] getrandom::Error),
    /// A dataset's composition failed.
    #[error("internal error: dataset composition: {0}")]
    Composition(#[source] std::sync::Arc<CompositionError>),
    /// A ledger object that is not the JSON it should be.
    #[error("ledger object {path} is corrupt: {source}")]
    LedgerJson {
        /// The object path.
        path: String,
        /// Why it failed to decode.
        source: serde_json::Error,
    },
    /// A stored budget the accountant refuses to load.
    #[error("ledger object {path} is corrupt: {source}")]
    CorruptBudget {
        /// The object path.
        path: String,
        /// Why it was refused.
        source: Box<AccountantError>,
    },
    /// A bug the accountant detected in its own state.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ServiceError for AccountantError {
    fn error_code(&self) -> ErrorCode {
        use AccountantError::*;
        match self {
            InvalidArgument { .. } | Contract(_) | DatasetId(_) | Floats(_) => ErrorCode::InvalidArgument,
            Privacy(PrivacyError::Invalid { .. }) => ErrorCode::InvalidArgument,
            Privacy(PrivacyError::Unreachable { .. }) => ErrorCode::FailedPrecondition,
            UnknownJob { .. } => ErrorCode::JobNotRegistered,
            UnbudgetedDataset { .. } | NotAuditable { .. } => ErrorCode::FailedPrecondition,
            UnknownDataset { .. } => ErrorCode::NotFound,
            RegistrationConflict { .. } => ErrorCode::AlreadyExists,
            StepRefused { code, .. } => *code,
            BudgetExhausted { .. } | PlanRefused(_) => ErrorCode::BudgetExhausted,
            JobClosed { .. } => ErrorCode::JobClosed,
            Fenced { .. } | BudgetChange { .. } => ErrorCode::FailedPrecondition,
            Revoked { .. } => ErrorCode::StaleGeneration,
            Unclipped { .. } | UnclippedPart { .. } => ErrorCode::Unclipped,
            PartStream { limit: "part_idle", .. } => ErrorCode::Unavailable,
            PartStream { .. } => ErrorCode::Aborted,
            ConflictingPart { .. } | StalePart { .. } => ErrorCode::Aborted,
            ChargedElsewhere { .. } => ErrorCode::ReleaseDiscarded,
            Unavailable(_) => ErrorCode::Unavailable,
            Capability(e) => e.error_code(),
            Storage(_)
            | CorruptLedger { .. }
            | LedgerJson { .. }
            | CorruptBudget { .. }
            | Composition(_)
            | Task { .. }
            | Entropy(_)
            | Internal(_) => ErrorCode::Internal,
        }
    }

    fn budget_exhausted(&self) -> Option<BudgetExhausted> {
        match self {
            AccountantError::PlanRefused(figures) => Some(figures.as_ref().clone()),
            _ => None,
        }
    }
}

/// A budget as messages name it: its name first (when it has one), then its digest and unit.
pub(crate) fn described(name: &str, dataset_id: &str, unit: &str) -> String {
    if name.is_empty() {
        format!("dataset {dataset_id} ({unit}-level)")
    } else {
        format!("dataset {name} ({dataset_id}, {unit}-level)")
    }
}

/// Says when the job's own δ is what makes its plan large: σ calibrated for ε at a δ above the
/// budget's is small, and the budget composes it at its own δ.
fn larger_delta(figures: &BudgetExhausted) -> String {
    if figures.job_delta > figures.delta {
        format!(
            " (this job's delta {:e} is above the budget's {:e}: its sigma was calibrated for its epsilon at the \
             larger delta, so at the budget's it costs more; set delta to {:e} or less)",
            figures.job_delta, figures.delta, figures.delta
        )
    } else {
        String::new()
    }
}

/// A refused budget as messages name it: its name first, then its digest and unit.
fn named(figures: &BudgetExhausted) -> String {
    described(&figures.dataset_name, &figures.dataset_id, &figures.unit)
}

impl AccountantError {
    /// Runs `f` on a blocking thread (accounting math, noise passes): never on the async ones.
    pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, Self> {
        tokio::task::spawn_blocking(f).await.map_err(|source| AccountantError::Task { what: "blocking", source })
    }

    /// Runs `work` in a task of its own, to its end whatever the caller does (a handler's
    /// future is dropped when its client goes away): a charge, a revocation or a budget's audit
    /// entry is made durable, or fails, never half.
    pub(crate) async fn detached<T: Send + 'static>(
        what: &'static str,
        work: impl Future<Output = Result<T, Self>> + Send + 'static,
    ) -> Result<T, Self> {
        tokio::spawn(work).await.map_err(|source| AccountantError::Task { what, source })?
    }

    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        AccountantError::InvalidArgument { field, reason: reason.into() }
    }

    pub(crate) fn refused(job_id: &str, step: u64, code: ErrorCode, reason: impl Into<String>) -> Self {
        AccountantError::StepRefused { job_id: job_id.to_owned(), step, code, reason: reason.into() }
    }
}

/// Why a composition gave no ε; shared (in an `Arc`) by every caller awaiting it.
#[derive(Debug, thiserror::Error)]
pub enum CompositionError {
    /// The permits were closed (the accountant is shutting down).
    #[error("composition permits closed: {0}")]
    Closed(#[from] tokio::sync::AcquireError),
    /// The privacy math refused the history.
    #[error(transparent)]
    Privacy(#[from] PrivacyError),
    /// The composition's task panicked or was cancelled.
    #[error("composition task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}
