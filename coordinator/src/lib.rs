//! dpcap's coordinator. So far: the PoissonSampler that decides every step's logical batch,
//! and the split of a batch into work units for the ranks. The gRPC services, job store and
//! scheduler come next (issue 4).
//!
//! It must never let the number of workers, a retry or anything but (job secret, step) and the
//! rate q influence which examples a step samples (privacy invariant 3).

pub mod sampler;
pub mod work;

pub use sampler::{JobSecret, PoissonSampler};
pub use work::{ShardLayout, WorkUnit, split_work};
