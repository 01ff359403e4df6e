//! The coordinator's errors, each mapped to one [`ErrorCode`].

use dpcap_proto::v1::BudgetExhausted;
use dpcap_proto::{ErrorCode, ServiceError};

/// Why a coordinator request failed.
#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    /// A spec or request field is malformed or out of range.
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The field, as the spec names it.
        field: &'static str,
        /// Why, with the offending value.
        reason: String,
    },
    /// A contract or spec field the wire's conversions refused (names the field).
    #[error(transparent)]
    Contract(#[from] dpcap_privacy::ContractError),
    /// An objective name that is not one of the registry's.
    #[error(transparent)]
    Objective(#[from] dpcap_registry::UnknownObjective),
    /// The privacy math refused a field's value (an ε no σ reaches, an unknown accountant).
    #[error("invalid {field}: {source}")]
    Privacy {
        /// The spec field.
        field: &'static str,
        /// The math's refusal.
        source: dpcap_privacy::PrivacyError,
    },
    /// A location a field names could not be opened as a store.
    #[error("invalid {field}: {source}")]
    Location {
        /// The spec or flag field.
        field: &'static str,
        /// Why.
        source: dpcap_serve::StoreError,
    },
    /// An endpoint a field names, or its TLS setup, was refused.
    #[error("invalid {field}: {source}")]
    Endpoint {
        /// The flag.
        field: &'static str,
        /// Why.
        source: dpcap_serve::TlsError,
    },
    /// An object a field names could not be read from its store.
    #[error("invalid {field}: cannot read {what}: {source}")]
    Read {
        /// The spec field.
        field: &'static str,
        /// Which object, and what to do when it is missing.
        what: String,
        /// The store's error.
        source: object_store::Error,
    },
    /// A single object a field names (a tokenizer) could not be opened or read.
    #[error("invalid {field}: {what}: {source}")]
    Unreadable {
        /// The spec field.
        field: &'static str,
        /// Which object, and what to do about it.
        what: String,
        /// The store's error.
        source: dpcap_serve::StoreError,
    },
    /// A job's sampler refused its rate (a record whose contract no planning made).
    #[error("invalid contract.mechanism.sample_rate: {0}")]
    Sampler(#[from] crate::sampler::SamplerError),
    /// A checkpoint manifest that `init_from` names is not a manifest.
    #[error("invalid init_from: {what}: {source}")]
    InitManifest {
        /// Which manifest.
        what: String,
        /// Why.
        source: serde_json::Error,
    },
    /// A dataset's index does not follow the format.
    #[error("invalid dataset: {what}: {source}")]
    Index {
        /// Which part of the index.
        what: String,
        /// Why.
        source: dpcap_dataset::index::IndexError,
    },
    /// The secrets store has no record key while jobs are held: a new key would refuse every
    /// record, so the coordinator does not start.
    #[error(
        "{path} is missing while the stores hold {jobs} jobs: restore it from a backup of the secrets store, or \
         start once with --new-record-key to mint a new one (every existing job record is then refused and its \
         job suspended)"
    )]
    RecordKeyLost {
        /// Where the key should be.
        path: String,
        /// Jobs the stores hold.
        jobs: usize,
    },
    /// No such job.
    #[error("job {0} not found")]
    JobNotFound(String),
    /// The worker is unknown: its lease expired or the coordinator restarted.
    #[error("worker {0} is not registered (lease expired or coordinator restarted); register again")]
    WorkerNotFound(String),
    /// The job's state refuses the request (e.g. cancelling a finished job).
    #[error("job {job_id} is {state}: {reason}")]
    Precondition {
        /// The job.
        job_id: String,
        /// Its state.
        state: String,
        /// Why the request is refused.
        reason: String,
    },
    /// A rank spoke for a generation of a job's group that has been re-formed (or ended): it
    /// must drop the session and take its next assignment.
    #[error("job {job_id}: generation {generation} is no longer running (the group was re-formed)")]
    StaleGeneration {
        /// The job.
        job_id: String,
        /// The generation the rank spoke for.
        generation: u64,
    },
    /// The coordinator is shutting down: long polls end so that the drain is not held open.
    #[error("the coordinator is shutting down; retry against its replacement")]
    Draining,
    /// A WorkerService call without the key its worker registered with.
    #[error(
        "worker {0}: the call's x-dpcap-worker-key is not the key this worker registered with (a worker token alone cannot act as another worker)"
    )]
    WorkerKey(String),
    /// The accountant refused a request for good (a contract, a budget): its code and words.
    #[error("{message}")]
    Refused {
        /// The accountant's error code.
        code: ErrorCode,
        /// Its message.
        message: String,
        /// A dataset budget's refusal in figures, passed on to the caller as it came.
        budget: Option<Box<BudgetExhausted>>,
    },
    /// The accountant holds no contract for a job the coordinator knows: it was never
    /// registered (a job is registered only at submit), or the ledger was lost.
    #[error(
        "job {0}: the accountant holds no privacy contract for it; a job is registered only at submit, never by a \
         restore (was its record added to the store by hand, or the ledger lost?)"
    )]
    NotRegistered(String),
    /// The job's stored contract is not the one the accountant holds (the ledger is the source
    /// of truth).
    #[error("job {job_id}: its record's privacy contract differs from the ledger's: {differences}")]
    ContractMismatch {
        /// The job.
        job_id: String,
        /// Each differing field with the record's value and the ledger's.
        differences: String,
    },
    /// The accountant could not be reached or failed: what the coordinator was doing, and the
    /// call's failure.
    #[error("accountant unavailable: {context}{}", .error.message)]
    Accountant {
        /// What the call was for, ending in ": " (empty for the common calls).
        context: String,
        /// The call's failure (not an error source: its message is already in ours).
        error: Box<dpcap_proto::client::ClientError>,
    },
    /// A job ended but the accountant was not told: its capabilities stop only at their expiry.
    #[error(
        "accountant unavailable: job {0} ended, but the accountant could not be told: its workers' capabilities \
         stop only when they expire"
    )]
    Unrevoked(String),
    /// The job store or the secrets store failed, or holds what no coordinator wrote.
    #[error("job store: {0}")]
    Store(#[from] JobStoreError),
    /// A task the coordinator ran apart (planning, an index check, a transition's effects)
    /// panicked or was cancelled.
    #[error("{what} failed: {source}")]
    Task {
        /// Which task.
        what: &'static str,
        /// How it ended.
        source: tokio::task::JoinError,
    },
    /// The gRPC server failed.
    #[error("grpc server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
    /// The reflection service could not be built from the descriptors.
    #[error("grpc reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The coordinator's state broke one of its own invariants (a bug, not the request's fault).
    #[error("internal: {0}")]
    Invariant(String),
}

/// Why the job store or the secrets store failed, or holds what no coordinator wrote.
#[derive(Debug, thiserror::Error)]
pub enum JobStoreError {
    /// The object store failed.
    #[error(transparent)]
    Object(#[from] object_store::Error),
    /// A stored JSON object does not encode or decode.
    #[error("{path}: {source}")]
    Json {
        /// The object.
        path: String,
        /// Why.
        source: serde_json::Error,
    },
    /// A job record that does not open under the record key.
    #[error("{path}: {source}")]
    Record {
        /// The record.
        path: String,
        /// Why.
        source: RecordError,
    },
    /// The record key is not a key.
    #[error("{0} is not 64 hex digits: restore it from a backup")]
    Key(String),
    /// A job's sampler secret is not a key.
    #[error("a job's sampler secret is not 64 hex digits")]
    SamplerSecret,
}

/// Why a sealed job record does not open: each is a record the coordinator did not write as it
/// stands, so it is refused and counted.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// No seal's magic.
    #[error("not a sealed record")]
    NotSealed,
    /// Shorter than a seal.
    #[error("truncated")]
    Truncated,
    /// The tag does not verify under the record key, this id and this version.
    #[error("its tag does not verify (changed outside the coordinator, or copied under another id)")]
    Tag,
    /// The sealed bytes are not a `Job`.
    #[error("undecodable: {0}")]
    Decode(#[from] prost::DecodeError),
    /// A record of another job, under this one's path.
    #[error("it holds job {0:?}")]
    OtherJob(String),
    /// An older version than the last one written (a replayed record).
    #[error("version {version} is older than the last written, {last}")]
    Replayed {
        /// The record's version.
        version: u64,
        /// The last version written or read.
        last: u64,
    },
}

impl CoordinatorError {
    /// An invalid field.
    pub fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Self::Invalid { field, reason: reason.into() }
    }

    /// The accountant's failure of a call made for `context` (ending in ": ").
    pub fn accountant(context: impl Into<String>, error: dpcap_proto::client::ClientError) -> Self {
        Self::Accountant { context: context.into(), error: Box::new(error) }
    }

    /// Whether no retry can fix it: the job it concerns must end with its reason instead of
    /// waiting (a contract the accountant refuses or does not hold, a budget refused).
    pub fn is_permanent(&self) -> bool {
        match self {
            Self::NotRegistered(_) | Self::ContractMismatch { .. } | Self::Invalid { .. } => true,
            Self::Contract(_) | Self::Objective(_) | Self::Privacy { .. } | Self::Index { .. } => true,
            Self::Location { .. } | Self::Endpoint { .. } | Self::Read { .. } | Self::Unreadable { .. } => true,
            Self::Sampler(_) | Self::InitManifest { .. } => true,
            Self::Refused { code, .. } => !matches!(code, ErrorCode::Unavailable | ErrorCode::Internal),
            _ => false,
        }
    }

    /// Whether the accountant refused for a budget: the plan does not fit what is left.
    pub fn is_budget(&self) -> bool {
        matches!(self, Self::Refused { code: ErrorCode::BudgetExhausted, .. })
    }
}

impl ServiceError for CoordinatorError {
    fn error_code(&self) -> ErrorCode {
        match self {
            Self::Invalid { .. } | Self::Contract(_) | Self::Objective(_) | Self::Privacy { .. } => {
                ErrorCode::InvalidArgument
            }
            Self::Location { .. }
            | Self::Endpoint { .. }
            | Self::Read { .. }
            | Self::Unreadable { .. }
            | Self::Sampler(_)
            | Self::InitManifest { .. }
            | Self::Index { .. } => ErrorCode::InvalidArgument,
            Self::JobNotFound(_) => ErrorCode::NotFound,
            Self::WorkerNotFound(_) => ErrorCode::WorkerNotRegistered,
            Self::Precondition { .. } | Self::NotRegistered(_) | Self::ContractMismatch { .. } => {
                ErrorCode::FailedPrecondition
            }
            Self::StaleGeneration { .. } => ErrorCode::StaleGeneration,
            Self::WorkerKey(_) => ErrorCode::PermissionDenied,
            Self::Refused { code, .. } => *code,
            Self::Accountant { .. } | Self::Unrevoked(_) | Self::Draining => ErrorCode::Unavailable,
            Self::Store(_) | Self::Task { .. } | Self::Serve(_) | Self::Reflection(_) | Self::Invariant(_) => {
                ErrorCode::Internal
            }
            Self::RecordKeyLost { .. } => ErrorCode::FailedPrecondition,
        }
    }

    fn budget_exhausted(&self) -> Option<BudgetExhausted> {
        match self {
            Self::Refused { budget, .. } => budget.as_deref().cloned(),
            _ => None,
        }
    }
}

impl From<object_store::Error> for CoordinatorError {
    fn from(e: object_store::Error) -> Self {
        Self::Store(JobStoreError::Object(e))
    }
}
