//! The coordinator's in-memory state and its pure transitions: the FIFO queue, gang allocation
//! of W free workers, leases, step barriers and job outcomes. No I/O here: [`crate::Coordinator`]
//! persists and notifies after each transition.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant, SystemTime};

use dpcap_proto::job::is_terminal;
use dpcap_proto::v1::{Condition, Job, JobState, Reduction, StepOutcome};

use crate::error::CoordinatorError;
use crate::sampler::PoissonSampler;
use crate::work::{ClientUnit, example_units, share_units, split_clients, split_work};
use dpcap_dataset::index::Layout;

/// A fresh group nonce from the OS.
fn group_nonce() -> u64 {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("OS entropy is available");
    u64::from_le_bytes(bytes)
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Appends a condition to a job.
pub fn condition(job: &mut Job, kind: &str, reason: &str, message: impl Into<String>) {
    job.conditions.push(Condition {
        r#type: kind.into(),
        reason: reason.into(),
        message: message.into(),
        time_unix_ms: now_ms(),
    });
}

/// Adds left-out examples to the job's progress; the first dropped ones add a warning.
fn show_counts(job: &mut Job, counts: HeldCounts) {
    let progress = job.progress.get_or_insert_with(Default::default);
    progress.nonfinite_examples = progress.nonfinite_examples.saturating_add(counts.nonfinite);
    let first_drop = progress.dropped_examples == 0 && counts.dropped > 0;
    progress.dropped_examples = progress.dropped_examples.saturating_add(counts.dropped);
    if first_drop {
        let message = "sampled examples could not be read or decoded and were left out (they add nothing); \
                       progress.dropped_examples counts them: the data under the pinned index is damaged";
        condition(job, "Warning", "ExamplesDropped", message);
    }
}

/// Whether a worker's device is a CUDA GPU ("cuda:N").
pub fn is_cuda(device: &str) -> bool {
    device.starts_with("cuda")
}

/// Whether a job runs under `telemetry: strict` (nothing that depends on its sample leaves
/// the workers: no loss, realised batch size, or step timings).
pub fn is_strict(job: &Job) -> bool {
    job.spec.as_ref().is_some_and(|s| s.telemetry == dpcap_proto::v1::TelemetryMode::Strict as i32)
}

/// Phases of a step, in the order of `dpcap_step_duration_seconds{phase}`.
pub const PHASES: [&str; 5] = ["compute", "reduce", "release", "update", "checkpoint"];

/// A job's running group: W workers in rank order, at one step.
#[derive(Debug)]
pub struct Group {
    /// Increases with every re-formation; stale ranks get STOP.
    pub generation: u64,
    /// Random, drawn at formation: told to the accountant in capabilities, so that a group of
    /// a generation number re-used after a coordinator restart is never mixed with the old one.
    pub nonce: u64,
    /// Worker ids by rank.
    pub members: Vec<String>,
    /// The step being run; `None` until the ledger's next step is known.
    pub step: Option<u64>,
    /// Ranks that reported the current step.
    pub reported: Vec<bool>,
    /// The current step's work units by rank.
    pub work: Option<Vec<Vec<ClientUnit>>>,
    /// When the current step's work was handed out.
    pub step_started: Instant,
    /// Examples and loss·examples reported for the current step.
    pub step_examples: u64,
    /// Σ loss · examples reported for the current step (non-DP telemetry).
    pub step_loss: f64,
    /// Examples of the reports that carried a loss (a rank whose examples were all left out
    /// as non-finite reports none).
    pub step_loss_examples: u64,
    /// The NCCL unique id rank 0 published for this generation (NCCL reduction only).
    pub nccl_id: Option<Vec<u8>>,
    /// Units (examples, or a user-level job's clients) the sampler drew for the current step:
    /// signed into each rank's step capability.
    pub sampled: u64,
    /// Each rank's units of the current step (its share of `sampled`): signed into its step
    /// capability, so that the accountant holds each rank's part to C times its own share.
    pub shares: Vec<u64>,
}

/// The reasons of an audit's condition: passed, violated, or not scored.
pub(crate) const AUDIT_PASSED: &str = "AuditPassed";
pub(crate) const AUDIT_VIOLATION: &str = "AuditViolation";
pub(crate) const AUDIT_FAILED: &str = "AuditFailed";
/// Every reason an audit's condition may carry.
pub(crate) const AUDIT_REASONS: [&str; 3] = [AUDIT_PASSED, AUDIT_VIOLATION, AUDIT_FAILED];

/// A job and what the coordinator derives from it.
#[derive(Debug)]
pub struct JobEntry {
    /// The operator-visible record (persisted).
    pub job: Job,
    /// Its privacy contract, typed: the record's, checked against the ledger's before each
    /// group's first step. The sampler's q and the step count come from here.
    pub contract: dpcap_privacy::contract::PrivacyContract,
    /// Its sampler.
    pub sampler: PoissonSampler,
    /// Its shards.
    pub layout: Layout,
    /// User-level objectives: each client's examples (global, ascending); the sampler draws
    /// client numbers. None for example-level objectives.
    pub clients: Option<std::sync::Arc<Vec<Vec<u64>>>>,
    /// The running group, if any.
    pub group: Option<Group>,
    /// Seconds by phase summed over reports, and the number of reports.
    pub phase_seconds: [f64; 5],
    /// Reports summed into `phase_seconds`.
    pub phase_reports: u64,
    /// Bumped on every change (watchers compare it).
    pub version: u64,
    /// Under `telemetry: strict`, the counts of left-out examples, shown only when the job
    /// ends: per step they would tell when a damaged example was sampled.
    pub held: HeldCounts,
    /// When its group last lost a worker (see [`REPLACEMENT_GRACE`]).
    pub requeued_at: Option<Instant>,
    /// Ends of the job whose effects (the record made durable, the job closed at the
    /// accountant, its audit recorded) are still being carried out: watchers are not shown
    /// the job until there are none, so a watcher that sees an ended job can rely on all
    /// three. A count, not a flag: a job resumed and ended again while its first end settles
    /// must wait for both.
    pub settling: u32,
}

impl JobEntry {
    /// The version and record watchers may be shown: None while an end is settling.
    pub fn shown(&self) -> Option<(u64, &Job)> {
        (self.settling == 0).then_some((self.version, &self.job))
    }
}

/// How long a job whose group lost a worker holds the head of the queue for a replacement
/// (a restarted pod, a returning worker) before later jobs may take free workers beside it:
/// long enough for a process to restart, short enough that a worker gone for good never
/// stalls the queue.
pub const REPLACEMENT_GRACE: Duration = Duration::from_secs(120);

/// Counts a strict job shows only at its end (in memory: a restart of the coordinator loses them).
#[derive(Debug, Clone, Copy, Default)]
pub struct HeldCounts {
    /// See `Progress.nonfinite_examples`.
    pub nonfinite: u64,
    /// See `Progress.dropped_examples`.
    pub dropped: u64,
}

/// A registered worker.
#[derive(Debug)]
pub struct WorkerEntry {
    /// Shown in listings.
    pub name: String,
    /// "cpu" or "cuda:N".
    pub device: String,
    /// Its last heartbeat (or other call): the lease runs from here.
    pub last_seen: Instant,
    /// The job whose group it belongs to.
    pub job: Option<String>,
    /// The registration's secret: its later calls carry it, so that a worker token alone
    /// cannot act (or read assignments and capabilities) as this worker.
    pub key: String,
}

/// Everything behind the coordinator's lock.
#[derive(Debug, Default)]
pub struct State {
    /// Every job by id.
    pub jobs: BTreeMap<String, JobEntry>,
    /// Jobs waiting for workers, first in first served.
    pub queue: VecDeque<String>,
    /// Workers holding a lease, by id.
    pub workers: BTreeMap<String, WorkerEntry>,
}

/// What a transition asks the async layer to do afterwards.
#[derive(Debug, Default)]
pub struct Effects {
    /// Jobs whose record must be persisted.
    pub persist: Vec<String>,
    /// Jobs to close at the accountant.
    pub close: Vec<Closing>,
    /// Jobs whose releases before a step rank 0 reports a durable checkpoint covers (trimmed
    /// once the stored `latest` confirms it).
    pub trim: Vec<(String, u64)>,
    /// Jobs whose spend to read from the accountant (a step completed, the job ended).
    pub spend: Vec<String>,
    /// Generations to revoke at the accountant before anything else: (job, the lowest
    /// generation still admitted). A dissolved group's capabilities stop working at once.
    pub fence: Vec<(String, u64)>,
}

/// A job ending at the accountant.
#[derive(Debug, Clone, PartialEq)]
pub struct Closing {
    /// The job.
    pub job_id: String,
    /// Why, for the ledger.
    pub reason: String,
    /// FAILED or CANCELLED: it may resume, so it stays open, suspended (no part or release of
    /// any generation up to `generation` is served), and releases what it holds.
    pub resumable: bool,
    /// The job's current group generation.
    pub generation: u64,
}

impl Effects {
    fn merge(&mut self, other: Effects) {
        self.persist.extend(other.persist);
        self.close.extend(other.close);
        self.trim.extend(other.trim);
        self.spend.extend(other.spend);
        self.fence.extend(other.fence);
    }
}

impl State {
    /// Copies the ledger's ε, discarded steps and composed ε into the job's progress: never
    /// fewer charged steps than the ledger holds (a step charged just before a cancel counts,
    /// reported or not).
    pub(crate) fn record_spend(&mut self, job_id: &str, spend: &dpcap_proto::v1::JobSpend) {
        if let Some(entry) = self.jobs.get_mut(job_id) {
            let progress = entry.job.progress.get_or_insert_with(Default::default);
            progress.step = progress.step.max(spend.next_step);
            progress.epsilon_spent = spend.epsilon_spent;
            progress.epsilon_composed = spend.epsilon_composed;
            progress.steps_discarded = progress.steps_discarded.max(spend.steps_discarded);
            entry.version += 1;
        }
    }

    /// One end of each of these jobs is carried out (or abandoned): watchers see each job
    /// once none of its ends is settling.
    pub fn settled(&mut self, job_ids: &[String]) {
        for job_id in job_ids {
            if let Some(entry) = self.jobs.get_mut(job_id) {
                entry.settling = entry.settling.saturating_sub(1);
                entry.version += 1;
            }
        }
    }

    fn touch(&mut self, job_id: &str) {
        if let Some(entry) = self.jobs.get_mut(job_id) {
            entry.version += 1;
        }
    }

    /// Frees a job's workers and drops its group.
    fn dissolve(&mut self, job_id: &str) {
        let Some(group) = self.jobs.get_mut(job_id).and_then(|e| e.group.take()) else { return };
        for id in group.members {
            if let Some(w) = self.workers.get_mut(&id) {
                w.job = None;
            }
        }
    }

    /// Ends a job in a final state with a condition.
    pub fn finish(&mut self, job_id: &str, state: JobState, reason: &str, message: String) -> Effects {
        self.dissolve(job_id);
        self.queue.retain(|id| id != job_id);
        let Some(entry) = self.jobs.get_mut(job_id) else { return Effects::default() };
        entry.job.state = state as i32;
        let held = std::mem::take(&mut entry.held);
        show_counts(&mut entry.job, held);
        tracing::info!(job_id, state = ?state, reason, %message, "job finished");
        condition(&mut entry.job, "Finished", reason, message);
        entry.settling += 1;
        let generation = entry.job.progress.as_ref().map_or(0, |p| p.generation);
        self.touch(job_id);
        // The ledger's charged steps are shown once the accountant has stopped charging.
        let mut effects =
            Effects { persist: vec![job_id.to_owned()], spend: vec![job_id.to_owned()], ..Effects::default() };
        // FAILED and CANCELLED jobs can be resumed: only a job that can never run again is
        // closed at the accountant; the others are suspended there (nothing of any generation
        // so far is served) and release the noise drawn ahead for them.
        let resumable = !matches!(state, JobState::Succeeded | JobState::BudgetExhausted);
        effects.close.push(Closing { job_id: job_id.to_owned(), reason: reason.to_owned(), resumable, generation });
        effects.merge(self.schedule());
        effects
    }

    /// A copy of the job with its queue position (1 at the head) while it waits.
    pub fn view(&self, job_id: &str) -> Option<Job> {
        let mut job = self.jobs.get(job_id)?.job.clone();
        if let Some(position) = self.queue.iter().position(|id| id == job_id) {
            job.progress.get_or_insert_with(Default::default).queue_position = position as u32 + 1;
        }
        Some(job)
    }

    /// The workers `entry`'s job needs, and how many registered workers could serve it (CUDA
    /// ones only once it reduces over NCCL).
    fn demand(&self, entry: &JobEntry) -> (usize, Vec<(&String, &WorkerEntry)>) {
        let want = entry.job.plan.as_ref().map_or(1, |p| p.workers).max(1) as usize;
        // A job that reduces over NCCL keeps doing so: later groups need CUDA workers too.
        let nccl_only = entry.job.reduction == Reduction::Nccl as i32;
        (want, self.workers.iter().filter(|(_, w)| !nccl_only || is_cuda(&w.device)).collect())
    }

    /// A job just queued that needs more workers than are registered says so at submit, and
    /// what happens meanwhile.
    pub fn warn_short(&mut self, job_id: &str) {
        let Some(entry) = self.jobs.get(job_id) else { return };
        let (want, eligible) = self.demand(entry);
        let registered = eligible.len();
        if registered >= want || !self.queue.iter().any(|id| id == job_id) {
            return;
        }
        let Some(entry) = self.jobs.get_mut(job_id) else { return };
        let warning = format!(
            "the job needs {want} workers and {registered} are registered: it waits until {} more register; \
             meanwhile later jobs that fit the registered workers run beside it (backfill)",
            want - registered
        );
        condition(&mut entry.job, "Warning", "NotEnoughWorkers", warning);
        self.touch(job_id);
    }

    /// Gang allocation in FIFO order: a job starts when all its W workers are free. The head
    /// is never overtaken by a job that would take workers it is waiting for; but while the
    /// head needs more workers than are registered at all (it waits for workers to arrive, not
    /// to finish), later jobs that fit now run beside it (backfill). A job that cannot start
    /// says why in a condition.
    pub fn schedule(&mut self) -> Effects {
        let mut effects = Effects::default();
        let mut position = 0;
        while let Some(job_id) = self.queue.get(position).cloned() {
            let Some(entry) = self.jobs.get(&job_id) else {
                self.queue.remove(position);
                continue;
            };
            let (want, eligible) = self.demand(entry);
            let registered = eligible.len();
            let free: Vec<String> =
                eligible.iter().filter(|(_, w)| w.job.is_none()).map(|(id, _)| (*id).clone()).take(want).collect();
            if free.len() >= want {
                self.queue.remove(position);
                self.start(&job_id, free);
                effects.persist.push(job_id);
                continue;
            }
            // A job whose group just lost a worker expects it (or a replacement) back: for a
            // while, jobs behind it wait, or they could take the workers it is waiting for.
            let replacing = entry.requeued_at.is_some_and(|at| at.elapsed() < REPLACEMENT_GRACE);
            let waiting = format!("waiting for {want} workers ({registered} registered, {} free)", free.len());
            if self.note_waiting(&job_id, waiting) {
                effects.persist.push(job_id);
            }
            if registered >= want || replacing {
                break; // it starts as soon as workers free up or return: nobody overtakes it
            }
            position += 1;
        }
        effects
    }

    /// Records why a queued job waits: a new reason updates the job's last condition when that
    /// one says it waits already (so conditions do not grow while workers come and go), else
    /// adds one. Returns whether anything changed.
    fn note_waiting(&mut self, job_id: &str, message: String) -> bool {
        let Some(entry) = self.jobs.get_mut(job_id) else { return false };
        match entry.job.conditions.last_mut() {
            Some(last) if last.reason == "WaitingForWorkers" && last.message == message => return false,
            Some(last) if last.reason == "WaitingForWorkers" => {
                (last.message, last.time_unix_ms) = (message, now_ms());
            }
            _ => condition(&mut entry.job, "Pending", "WaitingForWorkers", message),
        }
        self.touch(job_id);
        true
    }

    /// Forms a group of `members` for a queued job and starts it.
    fn start(&mut self, job_id: &str, members: Vec<String>) {
        for id in &members {
            if let Some(w) = self.workers.get_mut(id) {
                w.job = Some(job_id.to_owned());
            }
        }
        let all_cuda = members.iter().all(|id| self.workers.get(id).is_some_and(|w| is_cuda(&w.device)));
        let Some(entry) = self.jobs.get_mut(job_id) else { return };
        if entry.job.reduction == Reduction::Unspecified as i32 {
            entry.job.reduction = if all_cuda { Reduction::Nccl } else { Reduction::Accountant } as i32;
        }
        let progress = entry.job.progress.get_or_insert_with(Default::default);
        progress.generation += 1;
        progress.workers = members.clone();
        let generation = progress.generation;
        entry.job.state = JobState::Running as i32;
        let scheduled = format!("generation {generation} on {}", members.join(", "));
        tracing::info!(job_id, generation, workers = ?members, "job scheduled");
        entry.group = Some(Group {
            generation,
            nonce: group_nonce(),
            reported: vec![false; members.len()],
            members,
            step: None,
            work: None,
            step_started: Instant::now(),
            step_examples: 0,
            step_loss: 0.0,
            step_loss_examples: 0,
            nccl_id: None,
            sampled: 0,
            shares: Vec::new(),
        });
        condition(&mut entry.job, "Scheduled", "WorkersAllocated", scheduled);
        self.touch(job_id);
    }

    /// Drops workers whose lease expired; their jobs go back to the head of the queue.
    pub fn reap(&mut self, lease: Duration) -> Effects {
        let now = Instant::now();
        let expired: Vec<String> = self
            .workers
            .iter()
            .filter(|(_, w)| now.duration_since(w.last_seen) > lease)
            .map(|(id, _)| id.clone())
            .collect();
        let mut effects = Effects::default();
        for id in expired {
            let Some(worker) = self.workers.remove(&id) else { continue };
            tracing::warn!(worker_id = %id, name = %worker.name, "worker lease expired");
            if let Some(job_id) = worker.job {
                let message = format!("worker {id} ({}) stopped answering; re-forming the group", worker.name);
                effects.merge(self.requeue(&job_id, "LeaseExpired", message));
            }
        }
        effects.merge(self.schedule());
        effects
    }

    /// A worker that is stopping leaves: its group is re-formed at once.
    pub fn leave(&mut self, worker_id: &str) -> Effects {
        let Some(worker) = self.workers.remove(worker_id) else { return Effects::default() };
        tracing::info!(worker_id, name = %worker.name, "worker left");
        let mut effects = Effects::default();
        if let Some(job_id) = worker.job {
            let message = format!("worker {worker_id} ({}) left (shutting down); re-forming the group", worker.name);
            effects.merge(self.requeue(&job_id, "WorkerLeft", message));
        }
        effects.merge(self.schedule());
        effects
    }

    /// Queues a FAILED or CANCELLED job again; it resumes at the ledger's next step.
    pub fn resume(&mut self, job_id: &str) -> Effects {
        let Some(entry) = self.jobs.get_mut(job_id) else { return Effects::default() };
        entry.job.state = JobState::Pending as i32;
        condition(&mut entry.job, "Resumed", "ResumedByOperator", "queued again; continues at the ledger's next step");
        self.queue.push_back(job_id.to_owned());
        self.touch(job_id);
        let mut effects = Effects { persist: vec![job_id.to_owned()], ..Effects::default() };
        effects.merge(self.schedule());
        effects
    }

    /// Dissolves a job's group and puts the job back at the head of the queue (nothing of an
    /// unfinished step was charged; the next group reruns it with the same sample). The old
    /// generation is revoked at the accountant before anything else.
    fn requeue(&mut self, job_id: &str, reason: &str, message: String) -> Effects {
        self.dissolve(job_id);
        let Some(entry) = self.jobs.get_mut(job_id) else { return Effects::default() };
        let generation = entry.job.progress.as_ref().map_or(0, |p| p.generation);
        entry.job.state = JobState::Pending as i32;
        tracing::warn!(job_id, reason, %message, "re-forming the group");
        condition(&mut entry.job, "WorkerLost", reason, message);
        entry.requeued_at = Some(Instant::now());
        self.queue.push_front(job_id.to_owned());
        self.touch(job_id);
        Effects {
            persist: vec![job_id.to_owned()],
            fence: vec![(job_id.to_owned(), generation + 1)],
            ..Effects::default()
        }
    }

    /// The work units of `rank` for the group's current step, computing them once per step.
    pub fn work_for(&mut self, job_id: &str, rank: usize) -> Option<(u64, Vec<ClientUnit>)> {
        let entry = self.jobs.get_mut(job_id)?;
        let group = entry.group.as_mut()?;
        let step = group.step?;
        if group.work.is_none() {
            // A user-level job never runs without its clients: its sample numbers clients.
            let plan_clients = entry.job.plan.as_ref().map_or(0, |p| p.clients);
            // (the sampler's q is the contract's: see `JobEntry::contract`)
            if plan_clients > 0 && entry.clients.is_none() {
                return None;
            }
            let sample = entry.sampler.sample(step);
            group.sampled = sample.len() as u64;
            let ranks = group.members.len();
            let work = match &entry.clients {
                // The sampler's numbers are clients; a number past the table cannot happen
                // (the sampler's N is the table's length) and is dropped, never remapped.
                Some(clients) => {
                    let sampled: Vec<&[u64]> =
                        sample.iter().filter_map(|&c| clients.get(c as usize).map(Vec::as_slice)).collect();
                    split_clients(&sampled, &entry.layout, ranks)
                }
                None => split_work(&sample, &entry.layout, ranks).into_iter().map(example_units).collect(),
            };
            let user_level = entry.clients.is_some();
            group.shares = work.iter().map(|units| share_units(units, user_level)).collect();
            group.work = Some(work);
            group.step_started = Instant::now();
        }
        Some((step, group.work.as_ref()?.get(rank)?.clone()))
    }

    /// The rank whose report of `step` (generation `generation`) from `worker_id` is to be
    /// recorded; `None` when there is nothing to record: the job already ended (a late report),
    /// or the step already completed with this rank's report (a retry whose first answer was
    /// lost). A stale generation, a worker outside the group or any other step is refused.
    ///
    /// A failure (`failed`) is taken for any step before the group is positioned: a rank whose
    /// session could not start (the accountant refused its attach, say) must be able to end
    /// the job with the reason, never leave it RUNNING.
    pub fn reporting_rank(
        &self,
        job_id: &str,
        worker_id: &str,
        (generation, step): (u64, u64),
        failed: bool,
    ) -> Result<Option<usize>, CoordinatorError> {
        let entry = self.jobs.get(job_id).ok_or_else(|| CoordinatorError::JobNotFound(job_id.into()))?;
        if is_terminal(entry.job.state) {
            return Ok(None);
        }
        let Some(group) = entry.group.as_ref().filter(|g| g.generation == generation) else {
            return Err(CoordinatorError::StaleGeneration { job_id: job_id.into(), generation });
        };
        let Some(rank) = group.members.iter().position(|m| m == worker_id) else {
            return Err(CoordinatorError::invalid("worker_id", format!("{worker_id} is not in the group of {job_id}")));
        };
        match group.step {
            Some(current) if step == current => Ok(Some(rank)),
            // A failure ends the job whatever step it names (a rank that could not learn the
            // step still reports); a done report of an older step is a retry already counted.
            _ if failed => Ok(Some(rank)),
            Some(current) if step < current => Ok(None),
            current => Err(CoordinatorError::invalid("step", format!("{step} is not the current step {current:?}"))),
        }
    }

    /// Applies one rank's report of the current step: a failure ends or re-forms the job; a
    /// done (or discarded) step is recorded, and completes once every rank has reported.
    pub fn report(&mut self, job_id: &str, rank: usize, report: &Report) -> Effects {
        if !self.jobs.contains_key(job_id) {
            return Effects::default();
        }
        match report.outcome {
            StepOutcome::BudgetExhausted => {
                return self.finish(job_id, JobState::BudgetExhausted, "BudgetExhausted", report.message.clone());
            }
            StepOutcome::Failed | StepOutcome::Unspecified => {
                let message = format!("rank {rank}: {}", report.message);
                return self.finish(job_id, JobState::Failed, "WorkerFailed", message);
            }
            StepOutcome::PeerLost => {
                let message = format!("rank {rank}: {}", report.message);
                let mut effects = self.requeue(job_id, "CollectiveFailed", message);
                effects.merge(self.schedule());
                return effects;
            }
            // A discarded step is spent and over: the group moves on exactly as after a release.
            StepOutcome::Done | StepOutcome::Discarded => {}
        }
        if !self.record(job_id, rank, report) {
            return Effects::default();
        }
        self.complete_step(job_id)
    }

    /// Records one rank's done step (telemetry, checkpoint, counts). Returns whether
    /// every rank of the group has now reported.
    fn record(&mut self, job_id: &str, rank: usize, report: &Report) -> bool {
        let Some(entry) = self.jobs.get_mut(job_id) else { return false };
        let strict = is_strict(&entry.job);
        let Some(group) = entry.group.as_mut() else { return false };
        if group.reported[rank] {
            return false;
        }
        group.reported[rank] = true;
        // What this rank was assigned (the coordinator's own work units): its counts' ceiling.
        let assigned: usize = group
            .work
            .as_ref()
            .and_then(|w| w.get(rank))
            .map_or(0, |units| units.iter().map(|u| u.unit.indices.len()).sum());
        group.step_examples += report.examples;
        if let Some(loss) = report.loss {
            group.step_loss += loss * report.examples as f64;
            group.step_loss_examples += report.examples;
        }
        let all_reported = group.reported.iter().all(|r| *r);
        // Under telemetry: strict, step timings (which grow with the realised batch) are
        // neither recorded nor exported, and work is split evenly.
        if !strict {
            for (sum, s) in entry.phase_seconds.iter_mut().zip(report.phases) {
                *sum += s;
            }
            entry.phase_reports += 1;
        }
        // A rank's counts are bounded by what it was assigned (it cannot inflate them).
        let counts = HeldCounts {
            nonfinite: report.nonfinite_examples.min(assigned as u64),
            dropped: report.dropped_examples.min(assigned as u64),
        };
        if strict {
            entry.held.nonfinite = entry.held.nonfinite.saturating_add(counts.nonfinite);
            entry.held.dropped = entry.held.dropped.saturating_add(counts.dropped);
        } else {
            show_counts(&mut entry.job, counts);
        }
        // Only rank 0 writes checkpoints; another rank's word is no reason to trim.
        if report.checkpoint_step > 0 && rank == 0 {
            entry.job.progress.get_or_insert_with(Default::default).checkpoint_step = report.checkpoint_step;
        }
        entry.version += 1;
        all_reported
    }

    /// Every rank has applied the step: the group moves to the next one (or the job succeeds),
    /// releases the latest checkpoint covers may go, and the step's spend is read from the
    /// ledger.
    fn complete_step(&mut self, job_id: &str) -> Effects {
        let Some(entry) = self.jobs.get_mut(job_id) else { return Effects::default() };
        let strict = is_strict(&entry.job);
        let plan_steps = entry.contract.planned_steps;
        let expected =
            entry.job.plan.as_ref().map_or(0.0, |p| dpcap_proto::plan::expected_batch_size(p, &entry.contract));
        let Some(group) = entry.group.as_mut() else { return Effects::default() };
        let progress = entry.job.progress.get_or_insert_with(Default::default);
        // Not earlier than now: a rank that has not fetched a release yet would find it trimmed.
        let trim = match progress.checkpoint_step {
            0 => Vec::new(),
            covered => vec![(job_id.to_owned(), covered)],
        };
        let step = group.step.unwrap_or(0);
        let seconds = group.step_started.elapsed().as_secs_f64().max(1e-9);
        progress.step = step + 1;
        progress.steps_total = plan_steps;
        // From the expected batch size L (public), not the realised one (non-DP telemetry).
        if !strict {
            progress.examples_per_second = expected / seconds;
            progress.eta_seconds = seconds * plan_steps.saturating_sub(step + 1) as f64;
        }
        // A step whose every example was left out shows no loss (absent, not 0, not stale).
        progress.loss = (group.step_loss_examples > 0 && group.step_loss.is_finite())
            .then(|| group.step_loss / group.step_loss_examples as f64);
        if let Some(loss) = progress.loss {
            progress.loss_first.get_or_insert(loss);
        }
        group.step = Some(step + 1);
        group.reported.iter_mut().for_each(|r| *r = false);
        group.work = None;
        group.step_examples = 0;
        group.step_loss = 0.0;
        group.step_loss_examples = 0;
        entry.version += 1;
        let spend = vec![job_id.to_owned()];
        if step + 1 >= plan_steps {
            let mut effects = self.finish(job_id, JobState::Succeeded, "Succeeded", format!("{plan_steps} steps done"));
            effects.trim.extend(trim);
            effects.spend.extend(spend);
            return effects;
        }
        Effects { persist: vec![job_id.to_owned()], trim, spend, ..Effects::default() }
    }
}

/// One rank's report, decoded.
#[derive(Debug, Clone)]
pub struct Report {
    /// Done, discarded, budget exhausted, failed, or peer lost.
    pub outcome: StepOutcome,
    /// Why, for a failure.
    pub message: String,
    /// Realised examples (non-DP telemetry; 0 under strict).
    pub examples: u64,
    /// Mean per-example loss (non-DP telemetry; none under strict).
    pub loss: Option<f64>,
    /// Seconds by phase, in [`PHASES`] order.
    pub phases: [f64; 5],
    /// A checkpoint rank 0 wrote covering steps below it (0: none).
    pub checkpoint_step: u64,
    /// Examples of this rank's part left out for a non-finite loss or gradient.
    pub nonfinite_examples: u64,
    /// Examples of this rank's share that could not be read or decoded.
    pub dropped_examples: u64,
}
