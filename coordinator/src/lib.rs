//! dpcap's coordinator: jobs (spec validation, σ calibration, durable state), the FIFO queue
//! with gang allocation of W workers, worker leases, the step barrier, and the PoissonSampler
//! that decides every step's logical batch, split into work units for the ranks.
//!
//! It must never let the number of workers, a retry or anything but (job secret, step) and the
//! rate q influence which examples a step samples (privacy invariant 3), and it never touches
//! gradients: parts and releases flow between the workers and the accountant only.

pub mod accounting;
pub mod coordinator;
pub mod dataset;
pub mod error;
pub mod init;
pub mod metrics;
pub mod plan;
pub mod registration;
pub mod rendezvous;
pub mod sampler;
pub mod server;
pub mod service;
pub mod spec;
pub mod state;
pub mod store;
pub mod submit;
pub mod work;

pub use coordinator::{Config, Coordinator};
pub use error::CoordinatorError;
pub use sampler::{JobSecret, PoissonSampler};
pub use spec::SpecFile;
pub use work::{ClientUnit, WorkUnit, share_units, split_clients, split_work, step_work};
