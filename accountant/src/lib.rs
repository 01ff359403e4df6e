//! dpcap's privacy accountant: the only component that adds noise, the only one that can refuse
//! a step, and the durable ledger of what every job has spent.
//!
//! [`privacy`] is the accounting math (RDP, PLD, calibration): pure, no I/O, no tokio, usable
//! offline by `dpctl`. The service modules own noise, the ledger and the gRPC API. This crate
//! must never depend on burn or see raw examples: it only ever sees sums of clipped gradients,
//! and it must never let a byte of a release leave before that step's charge is durable.

/// The accounting math, re-exported: it is the `dpcap-privacy` crate (pure, no I/O).
pub use dpcap_privacy as privacy;

pub mod ahead;
pub mod audit;
pub mod blocks;
pub mod composed;
pub mod core;
pub mod cost;
pub mod datasets;
pub mod error;
pub mod exposition;
pub mod job;
pub mod ledger;
pub mod metrics;
pub mod noise;
pub mod records;
pub mod release;
pub mod server;
pub mod service;
pub mod spending;
pub mod step;
pub mod sum;
pub mod synced;

pub use crate::core::{Accountant, DEFAULT_NOISE_AHEAD_BYTES, Policy};
pub use error::AccountantError;
pub use step::PartOutcome;
