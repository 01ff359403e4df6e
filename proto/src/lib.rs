//! dpcap's wire protocol: the `dpcap.v1` gRPC services and messages, the file descriptor set
//! that server reflection serves (so grpcurl needs no `.proto` files), and [`ErrorCode`], the
//! one enum every service maps its errors onto before they become a `tonic::Status`.
//!
//! This crate owns the contract between processes. It must never hold service logic or
//! depend on a service crate: dependencies point from the services to it.

pub mod client;
pub mod contract;
pub mod digest;
mod error;
pub mod floats;
pub mod job;
pub mod local;
pub mod plan;
pub mod reflection;
pub mod retry;
pub mod roles;
mod secret;
pub mod spec;

/// Generated messages, clients and servers of package `dpcap.v1`.
pub mod v1 {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    tonic::include_proto!("dpcap.v1");
}

/// Largest WorkerService message either side accepts: a `StepWork` for one rank at the paper's
/// batch (L = 1.31M examples, W = 1) encodes to about 2.7 MB, over tonic's 4 MiB default with
/// shards of more than 16k examples. Checked by a test at that size.
pub const MAX_WORK_MESSAGE_BYTES: usize = 16 << 20;

/// The encoded `FileDescriptorSet` of every dpcap proto, for tonic-reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("dpcap_v1_descriptor");

pub use error::{ErrorCode, ServiceError, budget_exhausted, to_status};
pub use retry::{RetryPolicy, Retryable, hint, is_transient, misconfiguration, retry};
pub use secret::Secret;
