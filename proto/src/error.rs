//! One error-code enum for every dpcap service, mapped to gRPC status codes in one place and
//! carried across the wire in the status details, so that a client branches on
//! [`ErrorCode::of`], never on a message's text. The details follow the gRPC convention: a
//! `google.rpc.Status` whose `details` hold a `dpcap.v1.ErrorDetail` as an `Any`, which grpcurl
//! and every gRPC client can parse.

use prost::Message;
use tonic::{Code, Status};

use crate::v1::{BudgetExhausted, ErrorDetail};

macro_rules! error_codes {
    ($($(#[$doc:meta])* $name:ident = $wire:literal => $grpc:ident,)*) => {
        /// What kind of failure a service error is, independent of which service raised it.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $($(#[$doc])* $name,)*
        }

        impl ErrorCode {
            /// The gRPC status code for this error kind.
            pub fn grpc_code(self) -> Code {
                match self { $(ErrorCode::$name => Code::$grpc,)* }
            }

            /// The name carried in [`ErrorDetail::code`].
            pub fn as_str(self) -> &'static str {
                match self { $(ErrorCode::$name => $wire,)* }
            }

            /// The code for a wire name; None for a name this build does not know.
            pub fn from_name(name: &str) -> Option<Self> {
                match name { $($wire => Some(ErrorCode::$name),)* _ => None }
            }
        }
    };
}

error_codes! {
    /// A request field is malformed or out of range; the message names the field.
    InvalidArgument = "INVALID_ARGUMENT" => InvalidArgument,
    /// The request is valid but the system state refuses it.
    FailedPrecondition = "FAILED_PRECONDITION" => FailedPrecondition,
    /// The step would take the job (or its dataset) past its ε budget; nothing was charged.
    BudgetExhausted = "BUDGET_EXHAUSTED" => FailedPrecondition,
    /// The step was charged already (the ledger expects a later step): its part is not needed,
    /// its release may be fetched.
    StepAlreadyCharged = "STEP_ALREADY_CHARGED" => FailedPrecondition,
    /// The step is ahead of the ledger's next step.
    StepNotNext = "STEP_NOT_NEXT" => FailedPrecondition,
    /// The step was charged but its release was lost: it stays spent and is never released.
    ReleaseDiscarded = "RELEASE_DISCARDED" => FailedPrecondition,
    /// The step's release was deleted because a checkpoint covers it.
    ReleaseTrimmed = "RELEASE_TRIMMED" => FailedPrecondition,
    /// The job was closed and accepts nothing more.
    JobClosed = "JOB_CLOSED" => FailedPrecondition,
    /// The step's parts are not clipped: their L2 norms sum past C times the units the
    /// coordinator sampled. Nothing was charged or released; no retry can fix it.
    Unclipped = "UNCLIPPED" => FailedPrecondition,
    /// The named job, step or resource does not exist.
    NotFound = "NOT_FOUND" => NotFound,
    /// The job is not registered with the accountant.
    JobNotRegistered = "JOB_NOT_REGISTERED" => NotFound,
    /// The worker is not registered with the coordinator (lease expired or restart).
    WorkerNotRegistered = "WORKER_NOT_REGISTERED" => NotFound,
    /// A create conflicted with an existing, different resource.
    AlreadyExists = "ALREADY_EXISTS" => AlreadyExists,
    /// A concurrent writer got there first with different content; retrying will not help.
    Aborted = "ABORTED" => Aborted,
    /// The rank spoke for a group generation that was re-formed: drop the session.
    StaleGeneration = "STALE_GENERATION" => Aborted,
    /// Missing or wrong credentials.
    Unauthenticated = "UNAUTHENTICATED" => Unauthenticated,
    /// Valid credentials whose role may not make this call.
    PermissionDenied = "PERMISSION_DENIED" => PermissionDenied,
    /// The service is starting (ledger replay) or draining; retry later.
    Unavailable = "UNAVAILABLE" => Unavailable,
    /// A bug or a storage failure.
    Internal = "INTERNAL" => Internal,
}

/// `google.protobuf.Any`, as the rich-error convention packs details.
#[derive(Clone, PartialEq, prost::Message)]
struct Any {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

/// `google.rpc.Status`: what `grpc-status-details-bin` holds by convention.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<Any>,
}

const DETAIL_TYPE_URL: &str = "type.googleapis.com/dpcap.v1.ErrorDetail";

impl ErrorCode {
    /// The dpcap error code a status carries in its details; None for a status that did not
    /// come from a dpcap service (a transport error, a proxy, an interceptor).
    pub fn of(status: &Status) -> Option<Self> {
        Self::from_name(&detail(status)?.code)
    }
}

/// The dpcap detail a status carries; None for a status that did not come from a dpcap service.
fn detail(status: &Status) -> Option<ErrorDetail> {
    let rich = RpcStatus::decode(status.details()).ok()?;
    let any = rich.details.iter().find(|a| a.type_url == DETAIL_TYPE_URL)?;
    ErrorDetail::decode(any.value.as_slice()).ok()
}

/// The figures of a dataset budget's refusal a status carries, when it is one.
pub fn budget_exhausted(status: &Status) -> Option<BudgetExhausted> {
    detail(status)?.budget_exhausted
}

/// Implemented by every service's error type so that handlers convert errors uniformly.
pub trait ServiceError: std::error::Error {
    /// The error kind, which decides the gRPC status code.
    fn error_code(&self) -> ErrorCode;

    /// A dataset budget's refusal in figures, for the errors that are one.
    fn budget_exhausted(&self) -> Option<BudgetExhausted> {
        None
    }
}

/// Converts a service error into a `tonic::Status` carrying its lowercase message and its
/// [`ErrorCode`] in the binary details.
pub fn to_status<E: ServiceError>(error: E) -> Status {
    let code = error.error_code();
    let message = error.to_string();
    let detail =
        ErrorDetail { code: code.as_str().to_owned(), budget_exhausted: error.budget_exhausted() }.encode_to_vec();
    let rich = RpcStatus {
        code: code.grpc_code() as i32,
        message: message.clone(),
        details: vec![Any { type_url: DETAIL_TYPE_URL.to_owned(), value: detail }],
    };
    Status::with_details(code.grpc_code(), message, rich.encode_to_vec().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("budget exhausted somewhere")]
    struct Spent;

    impl ServiceError for Spent {
        fn error_code(&self) -> ErrorCode {
            ErrorCode::BudgetExhausted
        }
    }

    #[test]
    fn a_status_carries_its_typed_code_whatever_its_message_says() {
        let status = to_status(Spent);
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(ErrorCode::of(&status), Some(ErrorCode::BudgetExhausted));
        let reworded =
            Status::with_details(status.code(), "entirely different words", status.details().to_vec().into());
        assert_eq!(ErrorCode::of(&reworded), Some(ErrorCode::BudgetExhausted));
        assert_eq!(ErrorCode::of(&Status::failed_precondition("budget exhausted")), None, "text is never trusted");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("plan refused")]
    struct Refused;

    impl ServiceError for Refused {
        fn error_code(&self) -> ErrorCode {
            ErrorCode::BudgetExhausted
        }

        fn budget_exhausted(&self) -> Option<BudgetExhausted> {
            Some(BudgetExhausted { dataset_name: "train".into(), spent: 5.09, free: 0.5, ..Default::default() })
        }
    }

    #[test]
    fn a_budget_refusal_carries_its_figures_beside_its_code() {
        let status = to_status(Refused);
        assert_eq!(ErrorCode::of(&status), Some(ErrorCode::BudgetExhausted));
        let figures = budget_exhausted(&status).expect("figures");
        assert_eq!((figures.dataset_name.as_str(), figures.spent, figures.free), ("train", 5.09, 0.5));
        assert_eq!(budget_exhausted(&to_status(Spent)), None, "only a budget's refusal has figures");
    }

    #[test]
    fn every_code_round_trips_through_its_wire_name() {
        for code in [ErrorCode::ReleaseDiscarded, ErrorCode::StaleGeneration, ErrorCode::WorkerNotRegistered] {
            assert_eq!(ErrorCode::from_name(code.as_str()), Some(code));
        }
        assert_eq!(ErrorCode::from_name("NO_SUCH_CODE"), None);
    }
}
