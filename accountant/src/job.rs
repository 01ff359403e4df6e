//! One registered job's live state: where its step counter stands, the parts of the step being
//! collected, and the recent releases that ranks are still fetching.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use dpcap_proto::floats;
use tokio::sync::{Mutex, watch};
use xxhash_rust::xxh3::Xxh3;

use crate::ahead::NoiseAhead;
use crate::blocks::{Block, BlockPool, Filler};
use crate::error::AccountantError;
use crate::noise::NoiseMode;
use crate::records::Registration;
use crate::release::Release;
use crate::spending::Spending;
use crate::sum::{Chunks, Sum};

/// Largest accepted attempt (group generation): 2^32, far beyond any job's re-formations.
pub const MAX_ATTEMPT: u64 = 1 << 32;

/// Most parts W of one step (ranks on the CPU path).
pub const MAX_PARTS: u32 = 4096;

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

/// The step whose parts are being collected.
#[derive(Debug)]
pub struct Pending {
    /// Its step number.
    pub step: u64,
    /// Running sum of the parts received.
    pub sum: Sum,
    /// A digest of each part received, by part index: W entries, W as the capabilities of
    /// this attempt's ranks state it.
    pub digests: Vec<Option<u64>>,
    /// When the first part arrived.
    pub started: std::time::Instant,
    /// The group generation whose parts these are.
    pub attempt: u64,
    /// That group's nonce: parts of another group with the same generation are never summed
    /// with these.
    pub group: u64,
    /// Units the step sampled, as every part's step capability states it.
    pub sampled: u64,
    /// Σ of the received parts' L2 norms: at most C·sampled when every rank clipped (the
    /// triangle inequality bounds the sum's own norm by it).
    pub norms: f64,
}

/// Mutable step state, behind the job's async mutex (held across the durable charge).
#[derive(Debug)]
pub struct StepState {
    /// The step being collected, if any.
    pub pending: Option<Pending>,
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
    /// ε per step for this job's privacy mode.
    pub spending: Spending,
    /// How this job's noise is keyed.
    pub noise: NoiseMode,
    /// Step state; the lock serialises the release of each step.
    pub state: Mutex<StepState>,
    /// Recent releases by step, outside the step lock: fetches stream a release while the
    /// step's lock is held to store it.
    pub releases: std::sync::Mutex<BTreeMap<u64, Arc<Release>>>,
    /// The next step's noise, drawn while the current step computes.
    pub ahead: NoiseAhead,
    /// Published progress.
    pub progress: watch::Sender<Progress>,
    /// The job's audit (registered with one): its canaries, drawn only while it runs.
    pub audit: Option<Arc<crate::audit::AuditPlan>>,
    /// The lowest generation still admitted: the newest a verified capability has shown, or
    /// the coordinator fenced (a group re-formed, a lease expired). Capabilities of older
    /// generations are refused, whatever their expiry.
    pub generation: AtomicU64,
    /// Suspended by the coordinator (the job was cancelled or failed): no part or release is
    /// served until a fence resumes it at a newer generation.
    pub suspended: std::sync::atomic::AtomicBool,
    /// Serialises the ledger writes of `generation` and `suspended`.
    pub fence_writes: Mutex<()>,
    /// Whether this process has counted the job's audit violation (once per job, however
    /// often the audit is asked for).
    pub violation_counted: std::sync::atomic::AtomicBool,
    /// Which budget refused the job's step, and by how much (the refusal's text): every rank
    /// that asks for the refused release, and GetSpend, say the same.
    pub exhausted_by: std::sync::OnceLock<String>,
    /// The open part streams, by part: at most one each (a newer stream of the same part,
    /// a rank's retry, supersedes the older, which ends at once), so that open streams hold at
    /// most W · 4P bytes of a running job.
    pub streams: std::sync::Mutex<std::collections::HashMap<u32, OpenStream>>,
}

/// One open part stream: its number, and how a newer stream of the same part ends it.
#[derive(Debug)]
pub struct OpenStream {
    id: u64,
    superseded: Arc<tokio::sync::Notify>,
}

/// A part stream's hold on its slot; the slot frees when it drops (unless a newer stream of the
/// part took it).
#[derive(Debug)]
pub struct StreamSlot {
    job: Arc<Job>,
    part: u32,
    id: u64,
    superseded: Arc<tokio::sync::Notify>,
}

impl StreamSlot {
    /// Resolves when a newer stream of the same part takes the slot.
    pub async fn superseded(&self) {
        self.superseded.notified().await
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut streams = self.job.streams.lock().expect("streams lock");
        if streams.get(&self.part).is_some_and(|open| open.id == self.id) {
            streams.remove(&self.part);
        }
    }
}

impl Job {
    /// Takes part `part`'s stream slot, ending any older stream of it.
    pub fn open_stream(self: &Arc<Self>, part: u32) -> StreamSlot {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let superseded = Arc::new(tokio::sync::Notify::new());
        let open = OpenStream { id, superseded: superseded.clone() };
        if let Some(older) = self.streams.lock().expect("streams lock").insert(part, open) {
            older.superseded.notify_one();
        }
        StreamSlot { job: self.clone(), part, id, superseded }
    }

    /// Part streams open now.
    pub fn open_streams(&self) -> usize {
        self.streams.lock().expect("streams lock").len()
    }

    /// Keeps `release` for fetches, with at most [`RELEASES_KEPT`] in memory.
    pub fn keep_release(&self, release: Arc<Release>) {
        let mut releases = self.releases.lock().expect("releases lock");
        releases.insert(release.step, release);
        while releases.len() > RELEASES_KEPT {
            releases.pop_first();
        }
    }

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
    /// Exactly P finite values, as they arrived.
    pub values: Chunks,
    /// XXH3 of the part's bytes, to tell an identical retry from a conflicting part (not a
    /// security boundary: a rank that wants to send other values simply sends them).
    pub digest: u64,
    /// The group generation that computed it (newer attempts replace pending older parts).
    pub attempt: u64,
    /// Parts W of its step, as its capability states.
    pub parts: u32,
    /// Its group's nonce, as its capability states.
    pub group: u64,
    /// Its L2 norm, taken in the same pass as the finiteness check and the digest.
    pub norm: f64,
    /// Units its step sampled, as the coordinator signed into the part's step capability.
    pub sampled: u64,
}

/// Which group computed a part, as its rank's capability states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt {
    /// The group generation (newer attempts replace pending parts of older ones).
    pub generation: u64,
    /// Parts W its steps sum.
    pub parts: u32,
    /// The group's nonce (see [`Pending::group`]).
    pub group: u64,
    /// Units the step sampled (the coordinator's word, in the part's step capability).
    pub sampled: u64,
    /// Units of this part's rank's share (the coordinator's word, in the same capability): the
    /// part's L2 norm may be at most C times this.
    pub units: u64,
}

/// Relative slack on C·n for the f32 arithmetic of honest parts: each rank sums up to L/W
/// clipped vectors in f32 (and NCCL sums W parts), which can stray from the exact sum by
/// γ_n ≈ n·2⁻²⁴ of the terms' magnitudes in the worst case, far below this.
pub const CLIP_SLACK: f64 = 1e-3;

/// Collects one part's chunks, checking every chunk against the job's shape. The values are
/// copied out of the transport's buffers into reused release-sized blocks
/// ([`BlockPool`], whole blocks however the sender cuts its chunks: [`Filler`]): a part is
/// held until its step's release is filled, and held in the
/// transport's buffers it would make the transport allocate (and the kernel fault in and
/// clear) fresh memory for every part; one copy, checked while it is hot, costs less.
pub struct PartAssembler {
    job_id: String,
    step: u64,
    part: u32,
    values: Chunks,
    hasher: Xxh3,
    dim: usize,
    attempt: u64,
    parts: u32,
    group: u64,
    sampled: u64,
    /// Units of this rank's share.
    units: u64,
    /// The contract's C (L2).
    clipping_norm: f64,
    /// (C · units · (1 + [`CLIP_SLACK`]))²: the part is refused as soon as its Σ x² passes it.
    bound_squared: f64,
    /// Σ x² of the values so far.
    squares: f64,
    /// Gathers the chunks into whole pooled blocks.
    filler: Filler,
}

impl std::fmt::Debug for PartAssembler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartAssembler")
            .field("job_id", &self.job_id)
            .field("step", &self.step)
            .field("part", &self.part)
            .field("values", &self.filler.received())
            .finish_non_exhaustive()
    }
}

impl Job {
    /// Lets go of what only a running job needs: the next step's noise, drawn ahead, the audit's
    /// canaries (both drawn again when its ranks attach), its ε curve, and the releases kept in
    /// memory (each a whole block of 4 MiB or more; a suspended job's are read back from the
    /// ledger if its ranks ask again, a closed job's are never served). Called under the step
    /// lock, so no release is being stored.
    pub fn let_go(&self) {
        self.ahead.clear();
        self.spending.let_go();
        self.releases.lock().expect("releases lock").clear();
        if let Some(plan) = &self.audit {
            plan.clear();
        }
    }
}

/// Keeps a filled block of the part: refused unless every value is finite; hashed, and its
/// squares added to the part's.
fn take_block(block: Block, values: &mut Chunks, hasher: &mut Xxh3, squares: &mut f64) -> Result<(), AccountantError> {
    *squares += floats::check_finite(block.as_ref(), values.len() as u64)?.squares;
    hasher.update(block.as_ref());
    values.push_block(block);
    Ok(())
}

impl PartAssembler {
    /// Starts part `part` of `step` of `job`, computed by the group of `attempt`, to be held in
    /// blocks of `blocks`.
    pub fn new(job: &Job, step: u64, part: u32, attempt: Attempt, blocks: &BlockPool) -> Result<Self, AccountantError> {
        let Attempt { generation: attempt, parts, group, sampled, units } = attempt;
        let r = &job.registration;
        // Attempts are group generations: a huge one would make every legitimate part stale.
        if attempt > MAX_ATTEMPT {
            return Err(AccountantError::invalid("attempt", format!("{attempt} exceeds {MAX_ATTEMPT}")));
        }
        if parts == 0 || parts > MAX_PARTS {
            return Err(AccountantError::invalid("parts", format!("{parts} must be in [1, {MAX_PARTS}]")));
        }
        if part >= parts {
            return Err(AccountantError::invalid("part", format!("part {part} is out of range for {parts} parts")));
        }
        if units > sampled {
            return Err(AccountantError::invalid(
                "step_capability",
                format!("its share of {units} units is more than the {sampled} its step sampled"),
            ));
        }
        let bound = r.contract.mechanism.clipping_norm * units as f64 * (1.0 + CLIP_SLACK);
        let dim = usize::try_from(r.gradient_dim)
            .map_err(|_| AccountantError::invalid("gradient_dim", "too large for this host"))?;
        blocks.expect_step(dim);
        Ok(Self {
            job_id: r.job_id.clone(),
            step,
            part,
            values: Chunks::default(),
            hasher: Xxh3::new(),
            dim,
            attempt,
            parts,
            group,
            sampled,
            units,
            clipping_norm: r.contract.mechanism.clipping_norm,
            bound_squared: bound * bound,
            squares: 0.0,
            filler: Filler::new(blocks, dim),
        })
    }

    /// Appends one chunk (`data`: little-endian f32, copied into blocks); its header must
    /// repeat the part's and its offset must follow on.
    pub fn push(
        &mut self,
        job_id: &str,
        step: u64,
        part: u32,
        offset: u64,
        data: bytes::Bytes,
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
        let received = self.filler.received();
        if offset != received as u64 {
            return Err(AccountantError::invalid("offset", format!("chunk offset {offset}, expected {received}")));
        }
        let count = floats::count(&data)?;
        if received + count > self.dim {
            return Err(AccountantError::invalid(
                "data",
                format!("part has more than gradient_dim {} values ({} so far)", self.dim, received + count),
            ));
        }
        let (values, hasher, squares) = (&mut self.values, &mut self.hasher, &mut self.squares);
        self.filler.fill(&data, |block| take_block(block, values, hasher, squares))?;
        // Cut off as soon as the rank's share is passed: nothing more of it is held.
        self.check_clipped()
    }

    /// The bytes the part's next values go to, read in place from a socket (the same-host
    /// path): empty once all P values are in.
    pub fn spare(&mut self) -> &mut [u8] {
        self.filler.spare()
    }

    /// `bytes` more of [`Self::spare`] hold the part's next bytes: each block that fills is
    /// checked (finite, hashed, its squares summed) exactly as a pushed chunk's.
    pub fn advance(&mut self, bytes: usize) -> Result<(), AccountantError> {
        let (values, hasher, squares) = (&mut self.values, &mut self.hasher, &mut self.squares);
        self.filler.advance(bytes, |block| take_block(block, values, hasher, squares))?;
        self.check_clipped()
    }

    /// The part so far is within C times its rank's share of the step.
    fn check_clipped(&self) -> Result<(), AccountantError> {
        if self.squares <= self.bound_squared {
            return Ok(());
        }
        Err(AccountantError::UnclippedPart {
            job_id: self.job_id.clone(),
            step: self.step,
            part: self.part,
            norm: self.squares.sqrt(),
            clipping_norm: self.clipping_norm,
            units: self.units,
            bound: self.bound_squared.sqrt(),
        })
    }

    /// The complete part, or an error if it is short of P values.
    pub fn finish(self) -> Result<Part, AccountantError> {
        self.check_clipped()?;
        if self.values.len() != self.dim {
            return Err(AccountantError::invalid(
                "data",
                format!("part has {} values, gradient_dim is {}", self.filler.received(), self.dim),
            ));
        }
        Ok(Part {
            step: self.step,
            part: self.part,
            values: self.values,
            digest: self.hasher.digest(),
            attempt: self.attempt,
            parts: self.parts,
            group: self.group,
            norm: self.squares.sqrt(),
            sampled: self.sampled,
        })
    }
}
