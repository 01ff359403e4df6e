//! One registered job's live state: where its step counter stands, the parts of the step being
//! collected, and the recent releases that ranks are still fetching.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hasher};
use std::sync::Arc;

use tokio::sync::{Mutex, watch};

use crate::error::AccountantError;
use crate::ledger::Registration;
use crate::noise::NoiseMode;
use crate::privacy::EpsilonCurve;

/// Largest accepted attempt (group generation): 2^32, far beyond any job's re-formations.
pub const MAX_ATTEMPT: u64 = 1 << 32;

/// Releases kept in memory per job for ranks that have not fetched them yet (older ones are
/// read back from the ledger's store).
pub const RELEASES_KEPT: usize = 4;

/// Where a job stands: readable without locking, published on every change.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    /// The step number the ledger expects next.
    pub next_step: u64,
    /// Steps charged (released and discarded alike).
    pub charged: u64,
    /// Charged steps whose release never reached the job.
    pub discarded: u64,
    /// ε at δ after the charged steps.
    pub epsilon_spent: f64,
    /// Open, budget exhausted, or closed.
    pub phase: Phase,
}

/// The accountant's view of a job's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Accepting parts.
    Open,
    /// A step was refused for budget; nothing more will be charged.
    BudgetExhausted,
    /// The job was closed by its owner.
    Closed,
}

/// A released step: the noised sum, identical bytes for every fetch.
#[derive(Debug)]
pub struct Release {
    /// The step.
    pub step: u64,
    /// R_t = Σ parts + N(0, σ²C²), P values.
    pub values: Vec<f32>,
    /// ε spent after this step.
    pub epsilon_after: f64,
}

/// The step whose parts are being collected.
#[derive(Debug)]
pub struct Pending {
    /// Its step number.
    pub step: u64,
    /// Running sum of the parts received, in f64.
    pub sum: Vec<f64>,
    /// A digest of each part received, by part index.
    pub digests: Vec<Option<u64>>,
    /// When the first part arrived.
    pub started: std::time::Instant,
    /// The group generation whose parts these are.
    pub attempt: u64,
}

/// Mutable step state, behind the job's async mutex (held across the durable charge).
#[derive(Debug)]
pub struct StepState {
    /// The step being collected, if any.
    pub pending: Option<Pending>,
    /// Recent releases by step.
    pub releases: BTreeMap<u64, Arc<Release>>,
    /// Steps charged whose release was lost (a crash before it was stored, or charged by
    /// another process): spent, never released.
    pub discarded: BTreeSet<u64>,
    /// Steps whose release is in the ledger's store (fetchable after a restart).
    pub stored: BTreeSet<u64>,
    /// Releases of steps below this are covered by a checkpoint and may be deleted.
    pub trimmed_before: u64,
    /// The part digests of the last released step, so that a retried identical part that
    /// raced with the release is answered as the idempotent duplicate it is.
    pub last_released: Option<(u64, Vec<Option<u64>>)>,
}

/// A registered job.
#[derive(Debug)]
pub struct Job {
    /// The contract.
    pub registration: Registration,
    /// ε as a function of steps for this job's mechanism.
    pub curve: EpsilonCurve,
    /// The most steps the job can be charged within its target.
    pub max_steps: u64,
    /// How this job's noise is keyed.
    pub noise: NoiseMode,
    /// Step state; the lock serialises the release of each step.
    pub state: Mutex<StepState>,
    /// Published progress.
    pub progress: watch::Sender<Progress>,
}

impl Job {
    /// The current progress snapshot.
    pub fn progress(&self) -> Progress {
        *self.progress.borrow()
    }
}

/// One complete, validated part of a step.
#[derive(Debug)]
pub struct Part {
    /// The step it belongs to.
    pub step: u64,
    /// Its index, 0 <= part < W.
    pub part: u32,
    /// Exactly P finite values.
    pub values: Vec<f32>,
    /// A digest of the values, to tell an identical retry from a conflicting part.
    pub digest: u64,
    /// The group generation that computed it (newer attempts replace pending older parts).
    pub attempt: u64,
}

/// Collects one part's chunks, checking every chunk against the job's shape.
#[derive(Debug)]
pub struct PartAssembler {
    job_id: String,
    step: u64,
    part: u32,
    values: Vec<f32>,
    dim: usize,
    attempt: u64,
}

impl PartAssembler {
    /// Starts a part of (job, step, part) computed by group generation `attempt`, for a job of dimension `dim` and `parts` parts.
    pub fn new(job: &Job, step: u64, part: u32, attempt: u64) -> Result<Self, AccountantError> {
        let r = &job.registration;
        // Attempts are group generations: a huge one would make every legitimate part stale.
        if attempt > MAX_ATTEMPT {
            return Err(AccountantError::invalid("attempt", format!("{attempt} exceeds {MAX_ATTEMPT}")));
        }
        if part >= r.parts {
            return Err(AccountantError::invalid(
                "part",
                format!("part {part} is out of range for a job of {} parts", r.parts),
            ));
        }
        let dim = usize::try_from(r.gradient_dim)
            .map_err(|_| AccountantError::invalid("gradient_dim", "too large for this host"))?;
        Ok(Self { job_id: r.job_id.clone(), step, part, values: Vec::with_capacity(dim), dim, attempt })
    }

    /// Appends one chunk; its header must repeat the part's and its offset must follow on.
    pub fn push(
        &mut self,
        job_id: &str,
        step: u64,
        part: u32,
        offset: u64,
        values: &[f32],
    ) -> Result<(), AccountantError> {
        if job_id != self.job_id || step != self.step || part != self.part {
            return Err(AccountantError::invalid(
                "job_id/step/part",
                format!(
                    "chunk for ({job_id}, {step}, {part}) inside the stream of ({}, {}, {})",
                    self.job_id, self.step, self.part
                ),
            ));
        }
        if offset != self.values.len() as u64 {
            return Err(AccountantError::invalid(
                "offset",
                format!("chunk offset {offset}, expected {}", self.values.len()),
            ));
        }
        if self.values.len() + values.len() > self.dim {
            return Err(AccountantError::invalid(
                "values",
                format!(
                    "part has more than gradient_dim {} values ({} so far)",
                    self.dim,
                    self.values.len() + values.len()
                ),
            ));
        }
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(AccountantError::invalid(
                "values",
                format!("value {} at index {} is not finite", values[i], offset as usize + i),
            ));
        }
        self.values.extend_from_slice(values);
        Ok(())
    }

    /// The complete part, or an error if it is short of P values.
    pub fn finish(self) -> Result<Part, AccountantError> {
        if self.values.len() != self.dim {
            return Err(AccountantError::invalid(
                "values",
                format!("part has {} values, gradient_dim is {}", self.values.len(), self.dim),
            ));
        }
        let mut hasher = DefaultHasher::new();
        for v in &self.values {
            hasher.write_u32(v.to_bits());
        }
        Ok(Part {
            step: self.step,
            part: self.part,
            values: self.values,
            digest: hasher.finish(),
            attempt: self.attempt,
        })
    }
}
