//! dpcap's privacy accountant: the only component that adds noise, the only one that can refuse
//! a step, and the durable ledger of what every job has spent.
//!
//! [`privacy`] is the accounting math (RDP, PLD, calibration): pure, no I/O, no tokio, usable
//! offline by `dpctl`. The service modules own noise, the ledger and the gRPC API. This crate
//! must never depend on burn or see raw examples: it only ever sees sums of clipped gradients,
//! and it must never let a byte of a release leave before that step's charge is durable.

/// The accounting math, re-exported: it is the `dpcap-privacy` crate (pure, no I/O).
pub use dpcap_privacy as privacy;

mod ahead;
mod audit;
mod blocks;
mod composed;
mod core;
mod datasets;
mod error;
mod exposition;
mod job;
mod ledger;
mod local;
mod metrics;
mod noise;
mod records;
mod release;
mod server;
mod service;
mod spending;
mod step;
mod sum;
mod synced;

// Benchmark code: compiled only for `dpctl bench scale|budget` and `cargo bench --features bench`.
#[cfg(feature = "bench")]
#[path = "../bench/budget.rs"]
pub mod budget;
#[cfg(feature = "bench")]
#[path = "../bench/cost.rs"]
pub mod cost;

pub use crate::core::{Accountant, DEFAULT_NOISE_AHEAD_BYTES, DEFAULT_PART_IDLE, Policy};
pub use error::AccountantError;
pub use exposition::DEPRECATED as DEPRECATED_SERIES;
pub use local::{LocalError, LocalSetup};
pub use server::{ServeError, Setup, open_ledger, serve};
pub use step::PartOutcome;
