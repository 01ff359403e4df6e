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
    /// Reading the dataset or tokenizer failed.
    #[error("data: {0}")]
    Data(String),
    /// Writing or reading a checkpoint failed.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// The accountant refused the step: the budget is spent.
    #[error("budget exhausted: {0}")]
    BudgetExhausted(String),
    /// A peer answered something unexpected or failed.
    #[error("rpc: {0}")]
    Protocol(String),
    /// The coordinator no longer knows this worker (lease expired): register again.
    #[error("lease lost")]
    LeaseLost,
    /// A collective among the ranks failed or timed out (NCCL path): the group must re-form.
    #[error("collective: {0}")]
    Collective(#[from] crate::collective::CollectiveError),
    /// The coordinator re-formed this job's group (or ended the job) while the session ran.
    #[error("group re-formed")]
    Superseded,
}

impl From<dpcap_dataset::WorkError> for RuntimeError {
    /// The data and ML crates' errors keep their kind: a data error stays one (and is
    /// withheld under `telemetry: strict`).
    fn from(e: dpcap_dataset::WorkError) -> Self {
        use dpcap_dataset::WorkError as W;
        match e {
            W::Spec { field, reason } => Self::Spec { field, reason },
            W::Data(reason) => Self::Data(reason),
            W::Protocol(reason) => Self::Protocol(reason),
            W::Checkpoint(reason) => Self::Checkpoint(reason),
        }
    }
}

impl From<tonic::Status> for RuntimeError {
    /// Budget exhaustion is recognised by its typed code (never by the message's words).
    fn from(s: tonic::Status) -> Self {
        match dpcap_proto::ErrorCode::of(&s) {
            Some(dpcap_proto::ErrorCode::BudgetExhausted) => Self::BudgetExhausted(s.message().to_owned()),
            Some(code) => Self::Protocol(format!("{}: {}{}", code.as_str(), s.message(), hint(&s))),
            None => Self::Protocol(format!("{:?}: {}{}", s.code(), s.message(), hint(&s))),
        }
    }
}

/// What to do about a misconfiguration (or a likely one), as a suffix of an error message ("" for other errors).
fn hint(s: &tonic::Status) -> String {
    dpcap_proto::hint(s).map(|h| format!(" ({h})")).unwrap_or_default()
}

/// WORKER_NOT_REGISTERED from the coordinator means this worker's lease is gone;
/// STALE_GENERATION, that its group was re-formed (the session ends without failing the job).
pub fn lease_or(s: tonic::Status) -> RuntimeError {
    match dpcap_proto::ErrorCode::of(&s) {
        Some(dpcap_proto::ErrorCode::WorkerNotRegistered) => RuntimeError::LeaseLost,
        Some(dpcap_proto::ErrorCode::StaleGeneration) => RuntimeError::Superseded,
        _ => s.into(),
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
