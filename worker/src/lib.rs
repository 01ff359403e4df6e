//! dpcap's worker runtime: register with the coordinator, keep the lease on a task of its own,
//! take assignments, and run each step of a job — read the sampled examples, clip them into the
//! rank's part (`dpcap-ml`), reduce (the accountant, or NCCL among CUDA ranks), fetch the
//! release, update, report; rank 0 checkpoints.
//!
//! It holds only what its assignment needs: a worker token, its registration key and the
//! capability of its current job. It must never add noise, divide by a realised batch size, or
//! apply a release that is not durably stored (the last chunk says so).

// The NCCL path's pieces (settling a collective, the release status it broadcasts) are built
// and unit-tested without CUDA, but used only with it.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod collective;
#[cfg(feature = "cuda")]
mod cuda;
pub mod preflight;
pub mod runtime;

/// The runtime's surface for embedders (`dpctl demo`, the binary): start a worker with its
/// configuration, and the collective's default bound.
pub use collective::DEFAULT_TIMEOUT as DEFAULT_COLLECTIVE_TIMEOUT;
pub use dpcap_ml::CpuBackend;
#[cfg(feature = "cuda")]
pub use dpcap_ml::CudaBackend;
pub use runtime::{WorkerConfig, run};
