//! The worker runtime: register with the coordinator, keep the lease, take assignments, and
//! run each step of a job (read the sampled examples, clip, send the part to the accountant,
//! fetch the release, update, report; rank 0 checkpoints).

pub mod config;
pub mod reduce;
pub mod session;
pub mod worker;

pub use config::WorkerConfig;
pub use worker::run;

/// Why a worker step or session failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The job spec cannot be run by this worker.
    #[error("invalid {field}: {reason}")]
    Spec {
        /// The spec field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// The job's data, as the dataset crate reported it.
    #[error(transparent)]
    Data(#[from] dpcap_dataset::JobDataError),
    /// A contract, or a spec field the wire's conversions check, out of range or contradicting
    /// itself (names the field).
    #[error(transparent)]
    Contract(#[from] dpcap_privacy::ContractError),
    /// An endpoint (the coordinator's, or the accountant's it announced) or its TLS setup was
    /// refused; `field` names where it came from.
    #[error("invalid {field}: {source}")]
    Endpoint {
        /// "coordinator" (the flag) or "accountant_endpoint" (the coordinator's answer).
        field: &'static str,
        /// The TLS layer's refusal.
        source: dpcap_serve::TlsError,
    },
    /// The replica (model, clipping, update), as the ML crate reported it.
    #[error(transparent)]
    Ml(#[from] dpcap_ml::MlError),
    /// The job's checkpoint store failed.
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] dpcap_ml::checkpoint::CheckpointError),
    /// Checkpoint `step` does not fit this replica, or could not be written.
    #[error("checkpoint {step}: {source}")]
    CheckpointStep {
        /// The checkpoint's step.
        step: u64,
        /// Why.
        #[source]
        source: dpcap_ml::checkpoint::CheckpointError,
    },
    /// A release the checkpoint needs was deleted: the job cannot resume from that checkpoint.
    #[error(
        "checkpoint: release of step {step} was deleted but the checkpoint loaded stops at step {position}: {}",
        .source.message
    )]
    ReleaseTrimmed {
        /// The deleted release's step.
        step: u64,
        /// The step the checkpoint holds the state before.
        position: u64,
        /// The accountant's refusal.
        source: Box<dpcap_proto::client::ClientError>,
    },
    /// The accountant refused the step: the budget is spent.
    #[error("budget exhausted: {0}")]
    BudgetExhausted(#[source] BudgetRefusal),
    /// A peer answered something unexpected or failed.
    #[error("rpc: {0}")]
    Protocol(String),
    /// The coordinator no longer knows this worker (lease expired): register again.
    #[error("lease lost")]
    LeaseLost,
    /// A collective among the ranks failed or timed out (NCCL path): the group must re-form.
    #[error("collective: {0}")]
    Collective(#[from] crate::collective::CollectiveError),
    /// A call failed: its typed code, message, whether a retry may help, and what to change
    /// when it is a misconfiguration.
    #[error("rpc: {0}")]
    Rpc(#[source] Box<dpcap_proto::client::ClientError>),
    /// The accountant no longer admits this rank's generation (the job was cancelled or failed,
    /// or its group re-formed): the normal end of a cancel, reported, never logged as an error.
    #[error("the accountant no longer admits this generation: {0}")]
    Revoked(#[source] Box<dpcap_proto::client::ClientError>),
    /// The coordinator re-formed this job's group (or ended the job) while the session ran.
    #[error("group re-formed")]
    Superseded,
}

impl RuntimeError {
    /// Whether the message may name an example (its key, member or bytes come from the sampled
    /// data): `telemetry: strict` withholds it from the job's condition.
    pub fn names_examples(&self) -> bool {
        match self {
            RuntimeError::Data(e) => e.names_examples(),
            RuntimeError::Ml(e) => e.names_examples(),
            _ => false,
        }
    }
}

/// Who refused a step for its dataset's budget.
#[derive(Debug, thiserror::Error)]
pub enum BudgetRefusal {
    /// The accountant, in its words.
    #[error("{}", .0.message)]
    Accountant(Box<dpcap_proto::client::ClientError>),
    /// The accountant refused rank 0, which told this rank over the collective.
    #[error("rank 0 was refused step {step}")]
    RankZero {
        /// The step refused.
        step: u64,
    },
}

impl From<dpcap_proto::client::ClientError> for RuntimeError {
    /// Budget exhaustion is recognised by its typed code (never by the message's words).
    fn from(e: dpcap_proto::client::ClientError) -> Self {
        match e.code {
            Some(dpcap_proto::ErrorCode::BudgetExhausted) => {
                Self::BudgetExhausted(BudgetRefusal::Accountant(Box::new(e)))
            }
            // The accountant no longer admits this rank's generation: the job was cancelled or
            // failed, or its group re-formed. Reported like any failure (the coordinator turns
            // away a report of a generation it replaced), so a job is never left waiting on it.
            Some(dpcap_proto::ErrorCode::StaleGeneration) => Self::Revoked(Box::new(e)),
            _ => Self::Rpc(Box::new(e)),
        }
    }
}

/// WORKER_NOT_REGISTERED from the coordinator means this worker's lease is gone;
/// STALE_GENERATION, that its group was re-formed (the session ends without failing the job).
pub fn lease_or(e: dpcap_proto::client::ClientError) -> RuntimeError {
    match e.code {
        Some(dpcap_proto::ErrorCode::WorkerNotRegistered) => RuntimeError::LeaseLost,
        Some(dpcap_proto::ErrorCode::StaleGeneration) => RuntimeError::Superseded,
        _ => e.into(),
    }
}

/// Puts `text` in the cell the accountant client reads, unless the capability held is newer:
/// heartbeats and a step's work both renew it, and a heartbeat answered late (computed before
/// the step's work existed) must not replace the step's grant, or the part would be refused
/// and the job fail. Empty text (no capability issued) never replaces one.
pub(crate) fn renew(cell: &dpcap_proto::client::CapabilityCell, text: String) {
    use dpcap_serve::Capability;
    if text.is_empty() {
        return;
    }
    let Some(new) = Capability::peek(&text) else {
        cell.set(text); // not ours to judge: the accountant verifies it
        return;
    };
    cell.renew(text, |held| new.supersedes(Capability::peek(held).as_ref()));
}
