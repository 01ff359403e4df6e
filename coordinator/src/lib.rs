//! dpcap's coordinator: jobs (spec validation, σ calibration, durable state), the FIFO queue
//! with gang allocation of W workers, worker leases, the step barrier, and the PoissonSampler
//! that decides every step's logical batch, split into work units for the ranks.
//!
//! It must never let the number of workers, a retry or anything but (job secret, step) and the
//! rate q influence which examples a step samples (privacy invariant 3), and it never touches
//! gradients: parts and releases flow between the workers and the accountant only.

mod accounting;
mod coordinator;
mod dataset;
mod error;
mod init;
mod metrics;
mod plan;
mod registration;
mod rendezvous;
mod sampler;
mod server;
mod service;
mod spec;
mod state;
mod store;
mod submit;
mod work;

pub use coordinator::{Config, Coordinator};
pub use error::{CoordinatorError, JobStoreError, RecordError};
pub use init::{InitSource, check as check_init};
pub use metrics::DEPRECATED as DEPRECATED_SERIES;
pub use plan::{Population, Resolved, Terms, plan};
pub use registration::{Provenance, contract};
pub use rendezvous::{NCCL_ID_BYTES, exchange};
pub use sampler::{JobSecret, PoissonSampler, SamplerError};
pub use server::serve;
pub use spec::{Checked, ModeRequest, check_fields};
// The scheduler's pure state, which the suite drives without a server (`tests/scheduler.rs`).
pub use state::{Closing, JobEntry, REPLACEMENT_GRACE, Report, State, WorkerEntry};
pub use store::JobStore;
pub use work::{ClientUnit, WorkUnit, example_units, share_units, split_clients, split_work, step_work};
