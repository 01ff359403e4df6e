//! dpcap's wire protocol: the `dpcap.v1` gRPC services and messages, the file descriptor set
//! that server reflection serves (so grpcurl needs no `.proto` files), and [`ErrorCode`], the
//! one enum every service maps its errors onto before they become a `tonic::Status`.
//!
//! This crate owns the contract between processes. It must never hold service logic or
//! depend on a service crate: dependencies point from the services to it.

pub mod dataset;
pub mod digest;
pub mod error;
pub mod reflection;
pub mod retry;

/// Generated messages, clients and servers of package `dpcap.v1`.
pub mod v1 {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    tonic::include_proto!("dpcap.v1");
}

/// The encoded `FileDescriptorSet` of every dpcap proto, for tonic-reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("dpcap_v1_descriptor");

pub use error::{ErrorCode, ServiceError, to_status};
pub use retry::{RetryPolicy, is_transient, retry};
