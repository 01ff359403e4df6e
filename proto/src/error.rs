//! One error-code enum for every dpcap service, mapped to gRPC status codes in one place.

use tonic::{Code, Status};

/// What kind of failure a service error is, independent of which service raised it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// A request field is malformed or out of range; the message names the field.
    InvalidArgument,
    /// The request is valid but the system state refuses it (budget exhausted, step not next).
    FailedPrecondition,
    /// The named job, step or resource does not exist.
    NotFound,
    /// A create conflicted with an existing, different resource.
    AlreadyExists,
    /// A concurrent writer got there first with different content (e.g. a duplicate part with
    /// other bytes); retrying the same request will not help.
    Aborted,
    /// Missing or wrong credentials.
    Unauthenticated,
    /// The service is starting (ledger replay) or draining; retry later.
    Unavailable,
    /// A bug or a storage failure.
    Internal,
}

impl ErrorCode {
    /// The gRPC status code for this error kind.
    pub fn grpc_code(self) -> Code {
        match self {
            ErrorCode::InvalidArgument => Code::InvalidArgument,
            ErrorCode::FailedPrecondition => Code::FailedPrecondition,
            ErrorCode::NotFound => Code::NotFound,
            ErrorCode::AlreadyExists => Code::AlreadyExists,
            ErrorCode::Aborted => Code::Aborted,
            ErrorCode::Unauthenticated => Code::Unauthenticated,
            ErrorCode::Unavailable => Code::Unavailable,
            ErrorCode::Internal => Code::Internal,
        }
    }
}

/// Implemented by every service's error type so that handlers convert errors uniformly.
pub trait ServiceError: std::error::Error {
    /// The error kind, which decides the gRPC status code.
    fn error_code(&self) -> ErrorCode;
}

/// Converts a service error into a `tonic::Status` carrying its lowercase message.
pub fn to_status<E: ServiceError>(error: E) -> Status {
    Status::new(error.error_code().grpc_code(), error.to_string())
}
