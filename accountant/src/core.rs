//! The accountant's core, independent of gRPC: jobs registered by the coordinator, ranks
//! attached to them, their releases, audits, and the datasets' budgets they spend. One step's
//! release (check, charge, noise, publish) is in [`crate::step`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use tokio::sync::{Mutex, watch};

use dpcap_proto::ErrorCode;
use dpcap_proto::v1::BudgetExhausted;

use crate::ahead::{AheadBudget, NoiseAhead};
use crate::audit::{AuditOutcome, AuditPlan, Placement};
use crate::blocks::BlockPool;
use crate::composed::{self, Composed};
use crate::datasets::{BudgetSetting, Datasets, Of};
use crate::error::AccountantError;
use crate::job::{Job, MAX_PARTS, Phase, Progress, StepState};
use crate::ledger::Ledger;
use crate::metrics;
use crate::noise::{self, NoiseMode};
use crate::privacy::Segment;
use crate::privacy::contract::PrivacyContract;
use crate::records::{BudgetKey, ClosedSpend, DatasetBudget, JobRecord, Registration};
use crate::release::Release;
use crate::spending::{Curves, Spending};

/// What an accountant accepts beyond the safe defaults (both choices are explicit flags), and
/// how much memory it may hold ahead.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// Accept jobs with `insecure_noise_seed` (tests only; recorded in every charge).
    pub allow_seeded_noise: bool,
    /// Accept jobs on datasets no privacy admin gave a budget (no lifetime limit applies).
    pub allow_unbudgeted_datasets: bool,
    /// Bytes of noise drawn ahead, across every job whose ranks have attached, at most (8 per
    /// noised coordinate per job: 1.5 GB at P = 190M). A job past it draws each step's noise
    /// once its parts are in: a release slower by the draw. 0 never draws ahead.
    pub noise_ahead_bytes: u64,
    /// How long a part stream may wait for its next chunk before it is cut off (its bytes let
    /// go, nothing charged): a stalled rank holds no memory past it.
    pub part_idle: std::time::Duration,
}

/// The default idle timeout of a part stream.
pub const DEFAULT_PART_IDLE: std::time::Duration = std::time::Duration::from_secs(60);

/// The default ceiling on noise drawn ahead: two jobs of the paper's P = 190M (1.52 GB each).
pub const DEFAULT_NOISE_AHEAD_BYTES: u64 = 3 << 30;

impl Default for Policy {
    fn default() -> Self {
        Self {
            allow_seeded_noise: false,
            allow_unbudgeted_datasets: false,
            noise_ahead_bytes: DEFAULT_NOISE_AHEAD_BYTES,
            part_idle: DEFAULT_PART_IDLE,
        }
    }
}

/// A budget with what has been spent of it.
#[derive(Debug, Clone)]
pub struct DatasetView {
    /// The budget.
    pub budget: DatasetBudget,
    /// ε spent, reserved by open plans and free, at the budget's δ.
    pub standing: crate::datasets::Standing,
    /// Jobs of its unit registered on the dataset.
    pub jobs: Vec<String>,
    /// What a forced change does (jobs that may end early, the spend read at a new δ), as
    /// sentences; empty for any other answer.
    pub consequences: Vec<String>,
}

/// Longest chain of `init_from_job` links followed when composing a job's lineage.
const MAX_LINEAGE: usize = 64;

/// The accountant: every job's contract, step counter and releases, over one ledger.
#[derive(Debug)]
pub struct Accountant {
    pub(crate) ledger: Ledger,
    jobs: RwLock<HashMap<String, Arc<Job>>>,
    /// Datasets' budgets, by dataset and unit.
    pub(crate) datasets: Datasets,
    /// Jobs' ε composed with the jobs they started from, remembered by what was composed.
    lineage: Composed,
    /// One registration at a time per job id: only one may build the job (slow at large ε)
    /// and write the ledger record.
    registering: std::sync::Mutex<HashMap<String, Arc<Mutex<()>>>>,
    /// Registrations (shared) against the setting of a new budget (exclusive): a budget that
    /// appears under a name a registering job's data also has would change the budget that job
    /// spends between its check and its admission.
    naming: tokio::sync::RwLock<()>,
    pub(crate) policy: Policy,
    ready: AtomicBool,
    pub(crate) draining: watch::Sender<bool>,
    /// Release blocks, reused from one release to the next (every job's blocks are one size).
    pub(crate) blocks: BlockPool,
    /// The ceiling on noise drawn ahead, shared by every job.
    pub(crate) ahead: Arc<AheadBudget>,
    /// ε curves and step limits by mechanism, shared by the jobs that run one.
    curves: Arc<Curves>,
}

/// The least time between two compositions of a budget's standing for the metrics.
pub const STANDING_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

impl Accountant {
    /// An accountant over `ledger`; it serves nothing until [`Accountant::replay`] has run.
    pub fn new(ledger: Ledger, policy: Policy) -> Self {
        Self {
            ledger,
            jobs: RwLock::new(HashMap::new()),
            datasets: Datasets::new(policy.allow_unbudgeted_datasets),
            lineage: Composed::default(),
            registering: std::sync::Mutex::new(HashMap::new()),
            naming: tokio::sync::RwLock::new(()),
            policy,
            ready: AtomicBool::new(false),
            draining: watch::channel(false).0,
            blocks: BlockPool::new(noise::BLOCK_BYTES / 4),
            ahead: AheadBudget::new(policy.noise_ahead_bytes),
            curves: Arc::default(),
        }
    }

    /// Starts draining: calls waiting for a release end with UNAVAILABLE so that the server's
    /// graceful shutdown is not held by a release that will never come.
    pub fn begin_drain(&self) {
        self.draining.send_replace(true);
    }

    /// Rebuilds every job from the ledger. A charged step whose release was neither stored nor
    /// trimmed is discarded (its noise is gone; it is never released) and recorded so.
    pub async fn replay(&self) -> Result<usize, AccountantError> {
        for budget in self.ledger.budgets().await? {
            let path = format!("datasets/{}", budget.key().path_component());
            self.datasets.load(budget).map_err(|e| AccountantError::CorruptBudget { path, source: Box::new(e) })?;
        }
        let records = self.ledger.replay().await?;
        let count = records.len();
        for mut record in records {
            let lost: Vec<u64> = record
                .charged
                .iter()
                .filter(|&&s| {
                    s >= record.trimmed_before && !record.released.contains(&s) && !record.discarded.contains(&s)
                })
                .copied()
                .collect();
            for step in lost {
                let job_id = &record.registration.job_id;
                tracing::warn!(job_id = %job_id, step, "charged step has no stored release: discarded (stays spent)");
                self.ledger.mark_discarded(job_id, step).await?;
                record.discarded.insert(step);
            }
            // No noise is drawn ahead at replay (every open job at once would take 8·P bytes
            // each): the first step after a restart draws its own, and ahead resumes after it.
            let job = self.build_job(record).await?;
            tracing::info!(job_id = %job.registration.job_id, charged = job.progress().charged,
                discarded = job.progress().discarded, "replayed job from ledger");
            self.jobs.write().expect("jobs lock").insert(job.registration.job_id.clone(), Arc::new(job));
        }
        // Every standing composed from the whole history before anything is served; where
        // everything reserved fits, steps within their plans need no composition.
        for budget in self.datasets.all() {
            let key = budget.key();
            self.compose_standing(&key).await?;
            let reserved = self.reserved_segments(&key, None);
            if self.datasets.within(&budget, crate::privacy::AccountantKind::Pld, reserved).await?.fits {
                self.datasets.reserve(&key, budget.version);
            }
        }
        self.ready.store(true, Ordering::SeqCst);
        Ok(count)
    }

    pub(crate) fn check_ready(&self) -> Result<(), AccountantError> {
        if self.ready.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(AccountantError::Unavailable("replaying the ledger".into()))
        }
    }

    /// The job, or NOT_FOUND.
    pub fn job(&self, job_id: &str) -> Result<Arc<Job>, AccountantError> {
        self.check_ready()?;
        self.jobs
            .read()
            .expect("jobs lock")
            .get(job_id)
            .cloned()
            .ok_or_else(|| AccountantError::UnknownJob { job_id: job_id.to_owned() })
    }

    /// Bytes of releases held in memory by every job, closed ones included (for metrics: a
    /// closed job holds none).
    pub fn held_release_bytes(&self) -> usize {
        let jobs = self.jobs.read().expect("jobs lock");
        jobs.values()
            .map(|j| j.releases.lock().expect("releases lock").values().map(|r| r.held_bytes()).sum::<usize>())
            .sum()
    }

    /// Every job that is not closed, for metrics.
    pub fn open_jobs(&self) -> Vec<Arc<Job>> {
        let jobs = self.jobs.read().expect("jobs lock");
        jobs.values().filter(|j| j.progress().phase != Phase::Closed).cloned().collect()
    }

    /// Registers a job's contract (idempotent for an identical one). A new DP job whose
    /// planned steps its dataset's budget cannot cover, beside what is spent and what other
    /// jobs have reserved, is refused now, not at the step that would pass it; an accepted
    /// one reserves its plan until it ends. Returns the job and whether this call created it.
    pub async fn register(&self, registration: Registration) -> Result<(Arc<Job>, bool), AccountantError> {
        self.check_ready()?;
        validate_registration(&registration)?;
        if registration.contract.planned_steps == 0 {
            // Only ledgers written before the plan was part of the contract hold 0.
            return Err(AccountantError::invalid(
                "contract.planned_steps",
                "0 must be at least 1: a contract states the steps it plans, which its dataset's budget reserves",
            ));
        }
        if registration.insecure_noise_seed.is_some() && !self.policy.allow_seeded_noise {
            return Err(AccountantError::invalid(
                "insecure_noise_seed",
                "seeded noise is refused unless the accountant runs with --allow-seeded-noise",
            ));
        }
        let _naming = self.naming.read().await;
        self.datasets.check(&registration.contract, true)?;
        let lock =
            self.registering.lock().expect("registering lock").entry(registration.job_id.clone()).or_default().clone();
        let _single_flight = lock.lock().await;
        if let Some(existing) = self.jobs.read().expect("jobs lock").get(&registration.job_id).cloned() {
            return if existing.registration == registration {
                Ok((existing, false))
            } else {
                Err(AccountantError::RegistrationConflict { job_id: registration.job_id })
            };
        }
        self.check_lineage(&registration)?;
        let job = Arc::new(self.build_job(JobRecord::new(registration.clone())).await?);
        // One admission at a time per budget: two plans never both fit in the same ε.
        let key = self.datasets.key_of(&registration.contract);
        let _admission = self.datasets.admission_lock(&key).lock_owned().await;
        self.check_plan(&job).await?;
        let created = self.ledger.register(&registration).await?;
        // A queued job holds no noise and no ε curve: both come once its ranks attach.
        let job = self.jobs.write().expect("jobs lock").entry(registration.job_id.clone()).or_insert(job).clone();
        tracing::info!(job_id = %registration.job_id, max_steps = job.spending.max_steps(), created, "registered job");
        self.refresh_standing(&job);
        Ok((job, created))
    }

    /// A job started from another's weights names a DP job of the same dataset and unit.
    fn check_lineage(&self, r: &Registration) -> Result<(), AccountantError> {
        let Some(source) = &r.contract.init_from_job else { return Ok(()) };
        let source = self.job(source).map_err(|_| {
            AccountantError::invalid("init_from_job", format!("{source} is not registered with this accountant"))
        })?;
        let (c, s) = (&r.contract, &source.registration.contract);
        if !s.mode.is_private() || s.budget_id() != c.budget_id() || s.unit != c.unit {
            return Err(AccountantError::invalid(
                "init_from_job",
                format!(
                    "{} is a {} job on {} ({}-level); only a DP job on this job's dataset and unit composes into it",
                    source.registration.job_id,
                    s.mode.name(),
                    s.dataset_id,
                    s.unit.name()
                ),
            ));
        }
        Ok(())
    }

    /// Refuses a DP job whose planned steps its dataset's budget cannot cover beside what is
    /// spent and reserved (every open job's plan), naming the dataset, the unit, the ε spent,
    /// reserved and left, and what to do.
    async fn check_plan(&self, job: &Job) -> Result<(), AccountantError> {
        let contract = &job.registration.contract;
        let key = self.datasets.key_of(contract);
        let (Some(budget), true, Some(mechanism)) =
            (self.datasets.budget_of(&key), contract.mode.is_private(), contract.epsilon_mechanism())
        else {
            return Ok(());
        };
        let kind = job.spending.kind();
        let reserved = self.reserved_segments(&key, Some(&job.registration.job_id));
        // A new job's plan; a resumed one's plan or what it charged, if more.
        let steps = contract.planned_steps.max(job.progress().charged);
        let mut with_plan = reserved.clone();
        with_plan.push(Segment { sample_rate: mechanism.1, noise_multiplier: mechanism.2, steps });
        let planned = self.datasets.within(&budget, kind, with_plan).await?;
        if planned.fits {
            // Everything reserved now composes within the budget: steps within their plans
            // need no composition until the budget or the reservations change.
            self.datasets.reserve(&key, budget.version);
            return Ok(());
        }
        let spent = self.datasets.epsilon(&budget, kind, Of::Spent, self.segments(&key, None)).await?;
        let committed = self.datasets.epsilon(&budget, kind, Of::Committed, reserved).await?;
        metrics::record_budget_rejection("dataset_admission");
        Err(AccountantError::PlanRefused(Box::new(BudgetExhausted {
            dataset_name: budget.name.clone(),
            dataset_id: budget.dataset_id.clone(),
            unit: budget.unit.clone(),
            epsilon_budget: budget.epsilon,
            delta: budget.delta,
            spent,
            reserved: (committed - spent).max(0.0),
            free: (budget.epsilon - committed).max(0.0),
            asked: planned.epsilon,
            steps,
            job_delta: contract.delta,
        })))
    }

    /// Segments of every private job spending `key` as reserved: an open job's whole plan (or
    /// what it charged, if more: a ledger from before plans), an ended, exhausted or
    /// suspended one's charged steps only.
    /// `except` leaves one job out (the one being admitted).
    pub(crate) fn reserved_segments(&self, key: &BudgetKey, except: Option<&str>) -> Vec<Segment> {
        self.private_jobs(key)
            .iter()
            .filter(|j| except != Some(j.registration.job_id.as_str()))
            .map(|j| {
                let charged = j.progress().charged;
                let open = j.progress().phase == Phase::Open && !j.suspended.load(Ordering::SeqCst);
                segment(j, if open { charged.max(j.registration.contract.planned_steps) } else { charged })
            })
            .collect()
    }

    /// A rank attaches to its job: its model must have the contract's P. W is checked against
    /// the rank's capability by the caller.
    pub fn attach(&self, job: &Job, gradient_dim: u64, parts: u32) -> Result<(), AccountantError> {
        let r = &job.registration;
        if gradient_dim != r.gradient_dim {
            return Err(AccountantError::invalid(
                "gradient_dim",
                format!(
                    "the rank's model has {gradient_dim} parameters, the contract of {} registered {}: the worker \
                     and the coordinator disagree on the model registry (mismatched versions?)",
                    r.job_id, r.gradient_dim
                ),
            ));
        }
        if parts == 0 || parts > MAX_PARTS {
            return Err(AccountantError::invalid("parts", format!("{parts} must be in [1, {MAX_PARTS}]")));
        }
        if job.progress().phase == Phase::Closed {
            return Err(AccountantError::JobClosed { job_id: r.job_id.clone() });
        }
        // Its ranks have gathered: the next step's noise is drawn now, while they compute (a
        // queued job holds none).
        let next = job.progress();
        job.ahead.prepare_if_idle(next.next_step);
        // And the audit's canaries, which only a running job holds.
        if let Some(plan) = job.audit.clone() {
            let draw = move || drop(plan.canaries());
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn_blocking(draw)),
                Err(_) => draw(),
            }
        }
        if next.charged < job.spending.max_steps() {
            job.spending.prepare(next.charged + 1);
        }
        tracing::info!(job_id = %r.job_id, gradient_dim, parts, "rank attached");
        Ok(())
    }

    /// Admits a capability's generation, or says why not: a suspended job admits none (it was
    /// cancelled or failed), and a generation older than the oldest admitted (its group was
    /// re-formed or revoked) is refused; a newer one becomes the oldest admitted, recorded in
    /// the ledger so that a restart does not forget it.
    pub async fn admit_generation(&self, job: &Job, generation: u64) -> Result<(), String> {
        if job.suspended.load(Ordering::SeqCst) {
            return Err("the job is suspended (cancelled or failed at the coordinator)".into());
        }
        let newest = job.generation.fetch_max(generation, Ordering::SeqCst);
        if generation < newest {
            return Err(format!("the group was re-formed or revoked: generation {newest} is the oldest admitted"));
        }
        if generation > newest
            && let Err(e) = self.record_fence(job).await
        {
            // Memory still refuses older generations; only a restart in this window would
            // forget one a newer capability (not the coordinator's fence) revoked.
            tracing::warn!(job_id = %job.registration.job_id, generation, error = %e, "newest generation not recorded");
        }
        Ok(())
    }

    /// Records the job's fence (its oldest admitted generation and suspension) in the ledger.
    /// Writes are serialised per job and each writes the values current when it runs, so the
    /// last write on record is never older than the state in memory.
    async fn record_fence(&self, job: &Job) -> Result<(), AccountantError> {
        let _serial = job.fence_writes.lock().await;
        let (generation, suspended) = (job.generation.load(Ordering::SeqCst), job.suspended.load(Ordering::SeqCst));
        self.ledger.put_generation(&job.registration.job_id, generation, suspended).await
    }

    /// The coordinator fences a job: generations below `generation` are refused from now on
    /// (their pending parts dropped); with `resume`, a group of `generation` starts and a
    /// suspended job opens to it. A generation below one already admitted is refused.
    pub async fn fence(&self, job: &Job, generation: u64, resume: bool) -> Result<(), AccountantError> {
        let id = &job.registration.job_id;
        let mut state = job.state.lock().await;
        if job.progress().phase == Phase::Closed {
            return Err(AccountantError::JobClosed { job_id: id.clone() });
        }
        let admitted = job.generation.load(Ordering::SeqCst);
        if generation < admitted {
            return Err(AccountantError::Fenced { job_id: id.clone(), generation, admitted });
        }
        // A suspended job's plan was released from its dataset's budget: it is admitted again,
        // like a new plan, before it resumes; the admission lock is held until it is no longer
        // suspended, so that no registration in between sees its plan as released.
        let mut admission = None;
        if resume && job.suspended.load(Ordering::SeqCst) {
            let key = self.datasets.key_of(&job.registration.contract);
            admission = Some(self.datasets.admission_lock(&key).lock_owned().await);
            self.check_plan(job).await?;
        }
        job.generation.fetch_max(generation, Ordering::SeqCst);
        if state.pending.as_ref().is_some_and(|p| p.attempt < generation) {
            state.pending = None;
        }
        if resume {
            job.suspended.store(false, Ordering::SeqCst);
        } else {
            job.let_go(); // a requeued job holds no noise or canaries while it waits
        }
        let readmitted = admission.take().is_some();
        drop(state);
        self.record_fence(job).await?;
        if readmitted {
            self.refresh_standing(job);
        }
        // Waiting fetches of a revoked generation see the change and end.
        job.progress.send_modify(|_| {});
        tracing::info!(job_id = %id, generation, resume, "fenced job");
        Ok(())
    }

    /// Every private job spending budget `key`.
    fn private_jobs(&self, key: &BudgetKey) -> Vec<Arc<Job>> {
        let jobs = self.jobs.read().expect("jobs lock");
        let private =
            |j: &&Arc<Job>| spends(&self.datasets, &j.registration, key) && j.registration.contract.mode.is_private();
        jobs.values().filter(private).cloned().collect()
    }

    /// Segments of every private job spending `key` (with `extra` steps more of one of them).
    pub(crate) fn segments(&self, key: &BudgetKey, extra: Option<(&Job, u64)>) -> Vec<Segment> {
        let mut segments: Vec<Segment> =
            self.private_jobs(key).iter().map(|j| segment(j, j.progress().charged)).collect();
        if let Some((job, steps)) = extra {
            segments.push(segment(job, steps));
        }
        segments
    }

    /// ε at the job's δ composed over the job and the chain of DP jobs it started from
    /// (`init_from_job`); the job's own ε when it started from none.
    pub async fn epsilon_composed(&self, job: &Job) -> Result<f64, AccountantError> {
        let own = job.progress().epsilon_spent;
        let c = &job.registration.contract;
        if c.init_from_job.is_none() || !c.mode.is_private() {
            return Ok(own);
        }
        let mut segments = vec![segment(job, job.progress().charged)];
        let (mut next, mut seen) = (c.init_from_job.clone(), HashSet::new());
        while let Some(id) = next.filter(|id| seen.insert(id.clone()) && seen.len() <= MAX_LINEAGE) {
            let Ok(source) = self.job(&id) else { break };
            segments.push(segment(&source, source.progress().charged));
            next = source.registration.contract.init_from_job.clone();
        }
        let composing = self.lineage.get(&job.registration.job_id, job.spending.kind(), segments, c.delta);
        composed::epsilon(composing).await
    }

    /// The one-run audit of an ended job registered with canaries: every stored step's
    /// readings scored, guesses on the top and bottom 1 %, the ε lower bounds at δ. Returns
    /// the outcome and the number of steps scored.
    pub async fn audit(&self, job: &Job) -> Result<(AuditOutcome, u64), AccountantError> {
        let r = &job.registration;
        let not_auditable =
            |reason: &str| AccountantError::NotAuditable { job_id: r.job_id.clone(), reason: reason.into() };
        let plan = job.audit.as_ref().ok_or_else(|| not_auditable("it was registered without an audit"))?;
        let progress = job.progress();
        if progress.phase == Phase::Open {
            return Err(not_auditable("it is still open; its canaries stay secret until it ends"));
        }
        // Drawn again for the scoring (the job is over: it held none), and let go after it.
        let canaries = plan.canaries();
        plan.clear();
        let mut scores = vec![0.0; canaries.len()];
        let mut steps = 0;
        for step in 0..progress.next_step {
            let Some(readings) = self.ledger.get_audit_readings(&r.job_id, step).await? else { continue };
            if readings.len() != 4 * canaries.len() {
                return Err(AccountantError::CorruptLedger {
                    path: format!("jobs/{}/audit/readings/{step:020}.f32", r.job_id),
                    reason: format!(
                        "{} bytes, expected {} ({} canaries)",
                        readings.len(),
                        4 * canaries.len(),
                        canaries.len()
                    ),
                });
            }
            canaries.score(&readings, &mut scores);
            steps += 1;
        }
        let delta = r.contract.delta;
        let outcome =
            AccountantError::blocking(move || canaries.conclude(&scores, delta, canaries.default_guesses())).await?;
        let violation = outcome.bound() > progress.epsilon_spent;
        let first = violation && !job.violation_counted.swap(true, std::sync::atomic::Ordering::Relaxed);
        metrics::record_audit(&r.job_id, outcome.bound(), first);
        tracing::info!(job_id = %r.job_id, steps, bound = outcome.bound(), claimed = progress.epsilon_spent, "audited job");
        Ok((outcome, steps))
    }

    /// Waits until `step` is released and returns it; fails if it never will be.
    pub async fn wait_release(&self, job: &Job, step: u64, generation: u64) -> Result<Arc<Release>, AccountantError> {
        let mut progress_rx = job.progress.subscribe();
        let mut draining = self.draining.subscribe();
        loop {
            let progress = *progress_rx.borrow_and_update();
            let id = &job.registration.job_id;
            // A fetch of a generation revoked (or a job suspended) while it waited ends now.
            let admitted = job.generation.load(Ordering::SeqCst);
            if job.suspended.load(Ordering::SeqCst) || generation < admitted {
                return Err(AccountantError::Revoked {
                    job_id: id.clone(),
                    generation,
                    reason: format!("revoked while waiting (generation {admitted} is the oldest admitted)"),
                });
            }
            if progress.next_step > step {
                // A closed job serves no release any more (revocation is at once); a step it
                // discarded still says so.
                if progress.phase == Phase::Closed {
                    // Without reading the release back: a closed job holds none in memory.
                    if job.state.lock().await.discarded.contains(&step) {
                        return Err(discarded(id, step));
                    }
                    return Err(AccountantError::JobClosed { job_id: id.clone() });
                }
                return self.released(job, step).await;
            }
            match progress.phase {
                Phase::BudgetExhausted => {
                    let why = job.exhausted_by.get().map_or("budget exhausted", String::as_str);
                    return Err(AccountantError::refused(
                        id,
                        step,
                        ErrorCode::BudgetExhausted,
                        format!("{why}; the step was not released"),
                    ));
                }
                Phase::Closed => return Err(AccountantError::JobClosed { job_id: id.clone() }),
                Phase::Open => {}
            }
            if *draining.borrow_and_update() {
                return Err(AccountantError::Unavailable("the accountant is shutting down".into()));
            }
            tokio::select! {
                changed = progress_rx.changed() => if changed.is_err() {
                    return Err(AccountantError::Unavailable("job dropped".into()));
                },
                _ = draining.changed() => {}
            }
        }
    }

    /// The release of a charged step: from memory, else from the ledger's store. A discarded
    /// or trimmed step is refused with its typed code.
    async fn released(&self, job: &Job, step: u64) -> Result<Arc<Release>, AccountantError> {
        let r = &job.registration;
        // A release being stored is served from memory without the step lock, which its store
        // holds: its chunks stream while it is written, and its last chunk waits for the store.
        if let Some(release) = job.releases.lock().expect("releases lock").get(&step) {
            return Ok(release.clone());
        }
        let state = job.state.lock().await;
        if let Some(release) = job.releases.lock().expect("releases lock").get(&step) {
            return Ok(release.clone());
        }
        if state.discarded.contains(&step) {
            return Err(discarded(&r.job_id, step));
        }
        if step < state.trimmed_before || !state.stored.contains(&step) {
            return Err(AccountantError::refused(
                &r.job_id,
                step,
                ErrorCode::ReleaseTrimmed,
                format!("release was deleted: a checkpoint covers steps before {}", state.trimmed_before),
            ));
        }
        let dim = usize::try_from(r.gradient_dim).map_err(|_| AccountantError::Internal("gradient_dim".into()))?;
        let data =
            self.ledger.get_release(&r.job_id, step, dim).await?.ok_or_else(|| AccountantError::CorruptLedger {
                path: format!("jobs/{}/releases/{step:020}.f32", r.job_id),
                reason: "recorded as stored but missing".into(),
            })?;
        // A PLD evaluation can take tens of milliseconds: off the async threads, like every other.
        let epsilon_after = job.spending.epsilon_after(step + 1).await?;
        let release = Arc::new(Release::from_store(step, data, epsilon_after, noise::BLOCK_BYTES));
        // Kept only for a job that runs: one closed or suspended meanwhile (under this lock) let
        // go of its releases and keeps none.
        if job.progress().phase == Phase::Open && !job.suspended.load(Ordering::SeqCst) {
            job.keep_release(release.clone());
        }
        Ok(release)
    }

    /// A checkpoint covers every step < `before`: their stored releases may go. Never moves
    /// backwards and never past the ledger's next step.
    pub async fn trim(&self, job: &Job, before: u64) -> Result<(), AccountantError> {
        let before = before.min(job.progress().next_step);
        let mut state = job.state.lock().await;
        if before <= state.trimmed_before {
            return Ok(());
        }
        let stored: Vec<u64> = state.stored.range(..before).copied().collect();
        self.ledger.trim(&job.registration.job_id, before, &stored).await?;
        state.trimmed_before = before;
        state.stored.retain(|&s| s >= before);
        job.releases.lock().expect("releases lock").retain(|&s, _| s >= before);
        tracing::info!(job_id = %job.registration.job_id, before, deleted = stored.len(), "trimmed releases");
        Ok(())
    }

    /// Ends a job: parts are refused from now on and its per-job metrics disappear.
    pub async fn close(&self, job: &Job, reason: &str) -> Result<(), AccountantError> {
        let progress = job.progress();
        let spend = ClosedSpend {
            charged: progress.charged,
            epsilon_spent: progress.epsilon_spent,
            max_steps: job.spending.max_steps(),
        };
        self.ledger.close(&job.registration.job_id, reason, spend).await?;
        // Under the step lock, so that no part can release a step between the ledger's close
        // and the closed phase.
        let mut state = job.state.lock().await;
        state.pending = None;
        job.let_go();
        job.progress.send_modify(|p| p.phase = Phase::Closed);
        drop(state);
        tracing::info!(job_id = %job.registration.job_id, reason, "closed job");
        self.refresh_standing(job);
        Ok(())
    }

    /// A job admitted, charged, ended or suspended changes its budget's standing: it is
    /// composed again by [`Accountant::keep_standings`], off the caller's path.
    pub(crate) fn refresh_standing(&self, job: &Job) {
        self.datasets.touch(&self.datasets.key_of(&job.registration.contract));
    }

    /// Composes each touched budget's standing again for the metrics, until the process ends:
    /// at most once per [`STANDING_INTERVAL`] per budget, however many charges touched it
    /// meanwhile (a sweep charges many steps a second; scrapes come every few seconds).
    pub async fn keep_standings(self: Arc<Self>) {
        loop {
            for key in self.datasets.touched().await {
                if self.datasets.budget_of(&key).is_none() {
                    continue;
                }
                if let Err(e) = self.compose_standing(&key).await {
                    tracing::warn!(dataset_id = %key.dataset_id, unit = %key.unit, error = %e, "budget standing not composed");
                }
            }
            tokio::time::sleep(STANDING_INTERVAL).await;
        }
    }

    /// A job that may resume (FAILED, CANCELLED) is suspended: no part or release of any
    /// generation up to `generation` is served from now on (pending parts are dropped, waiting
    /// fetches end), and it releases what it holds in memory (the next step's noise, drawn
    /// ahead: 8 bytes per coordinate). A fence at a later generation resumes it.
    pub async fn suspend(&self, job: &Job, reason: &str, generation: u64) -> Result<(), AccountantError> {
        let mut state = job.state.lock().await;
        job.suspended.store(true, Ordering::SeqCst);
        job.generation.fetch_max(generation.saturating_add(1), Ordering::SeqCst);
        state.pending = None;
        job.let_go();
        drop(state);
        job.progress.send_modify(|_| {});
        self.record_fence(job).await?;
        tracing::info!(job_id = %job.registration.job_id, reason, generation, "suspended job: its generations revoked");
        self.refresh_standing(job);
        Ok(())
    }

    /// A new budget names data, never a name the ledger knows the data of a job by besides its
    /// data digest (one index's digest, or the shards' digest of version 3): a budget there
    /// would bind only that index's jobs, and one added under a running job would move its
    /// spend. A budget set that way before may still be changed. Call it under `naming`.
    fn check_budget_names_data(&self, key: &BudgetKey) -> Result<(), AccountantError> {
        if self.datasets.budget_of(key).is_some() {
            return Ok(());
        }
        let jobs = self.jobs.read().expect("jobs lock");
        let other_name = |c: &PrivacyContract| c.dataset_id == key.dataset_id || c.shards_id == key.dataset_id;
        let indexed = jobs
            .values()
            .map(|j| &j.registration.contract)
            .find(|c| other_name(c) && !c.data_id.is_empty() && c.data_id != key.dataset_id);
        match indexed {
            None => Ok(()),
            Some(c) => Err(AccountantError::invalid(
                "dataset_id",
                format!(
                    "{} is the digest of one index of the data {} (or of its shards): set the budget on the data's digest (`dpctl \
                     dataset budget set DATASET` names it), so that every index and copy of it spends the budget",
                    key.dataset_id, c.data_id
                ),
            )),
        }
    }

    /// Sets a budget (a privacy admin's call), then returns it with its spend.
    pub async fn set_budget(&self, key: &BudgetKey, setting: BudgetSetting) -> Result<DatasetView, AccountantError> {
        // While the ledger replays, a change would race the replayed versions.
        self.check_ready()?;
        // Exclusive while the budget is new: no registration is between its check and its
        // admission when a name its data has gets a budget.
        let _naming = if self.datasets.budget_of(key).is_none() { Some(self.naming.write().await) } else { None };
        self.check_budget_names_data(key)?;
        // The setting's own validity first: a bad value is INVALID_ARGUMENT whatever it changes.
        crate::privacy::check_epsilon(setting.epsilon)?;
        crate::privacy::check_delta(setting.delta)?;
        crate::datasets::check_population(key, setting.delta, setting.population)?;
        let consequences = self.change_consequences(key, &setting).await?;
        if !consequences.is_empty() && !setting.force {
            let reason = format!("{}; pass force (dpctl: --force) to change it anyway", consequences.join("; "));
            return Err(AccountantError::BudgetChange { dataset: key.describe(), reason });
        }
        self.datasets.set(&self.ledger, key, setting).await?;
        Ok(DatasetView { consequences, ..self.dataset(key).await? })
    }

    /// What a change of a budget that jobs already spend does, which needs `force`: a new δ
    /// (every charge's ε reads anew: raising δ shows less spent), or ε below what is spent and
    /// planned (the jobs whose plans are not done would end BUDGET_EXHAUSTED), each named with
    /// its figures. Empty when the change cuts no plan short and reads nothing anew. Lowering is
    /// always safe for privacy; this guards against a typo that silently ends work or makes the
    /// spend look smaller.
    async fn change_consequences(
        &self,
        key: &BudgetKey,
        setting: &BudgetSetting,
    ) -> Result<Vec<String>, AccountantError> {
        let Some(current) = self.datasets.budget_of(key) else { return Ok(Vec::new()) };
        let jobs = self.private_jobs(key);
        let lowered = setting.epsilon < current.epsilon;
        if jobs.is_empty() || (setting.delta == current.delta && !lowered) {
            return Ok(Vec::new()); // nothing spent reads anew and no plan is cut short
        }
        let mut consequences = Vec::new();
        let pld = crate::privacy::AccountantKind::Pld;
        if setting.delta != current.delta {
            let spent = self.datasets.epsilon(&current, pld, Of::Spent, self.segments(key, None)).await?;
            let at_new = DatasetBudget { delta: setting.delta, ..current.clone() };
            let reread = self.datasets.epsilon(&at_new, pld, Of::Spent, self.segments(key, None)).await?;
            consequences.push(format!(
                "delta {:e} → {:e} changes what every charge reads as: epsilon spent {spent:.4} at {:e} reads \
                 {reread:.4} at {:e}",
                current.delta, setting.delta, current.delta, setting.delta
            ));
        }
        // As the checks will: RDP jobs are held to the RDP bound, which is at least the PLD.
        let rdp = jobs.iter().any(|j| j.spending.kind() == crate::privacy::AccountantKind::Rdp);
        let kind = if rdp { crate::privacy::AccountantKind::Rdp } else { pld };
        let at_new = DatasetBudget { delta: setting.delta, ..current.clone() };
        let committed = self.datasets.epsilon(&at_new, kind, Of::Committed, self.reserved_segments(key, None)).await?;
        let mut ending: Vec<String> = jobs
            .iter()
            .filter(|j| j.progress().phase == Phase::Open && !j.suspended.load(Ordering::SeqCst))
            .filter(|j| j.progress().charged < j.registration.contract.planned_steps)
            .map(|j| {
                let (charged, planned) = (j.progress().charged, j.registration.contract.planned_steps);
                format!("{} ({charged} of {planned} steps)", j.registration.job_id)
            })
            .collect();
        ending.sort();
        if setting.epsilon < committed && !ending.is_empty() {
            consequences.push(format!(
                "epsilon {} is below the {committed:.4} that is spent and planned; {} may end BUDGET_EXHAUSTED \
                 before their plans: {}",
                setting.epsilon,
                ending.len(),
                ending.join(", ")
            ));
        }
        Ok(consequences)
    }

    /// A budget and its spend composed from every charge the ledger holds, or NOT_FOUND; while
    /// the ledger replays, UNAVAILABLE (a standing from part of the history would show less
    /// than was spent).
    pub async fn dataset(&self, key: &BudgetKey) -> Result<DatasetView, AccountantError> {
        self.check_ready()?;
        self.compose_standing(key).await
    }

    /// A budget's standing composed now, recorded for the metrics.
    async fn compose_standing(&self, key: &BudgetKey) -> Result<DatasetView, AccountantError> {
        let budget = self.datasets.budget_of(key).ok_or_else(|| AccountantError::UnknownDataset {
            dataset_id: key.dataset_id.clone(),
            unit: key.unit.clone(),
        })?;
        let pld = crate::privacy::AccountantKind::Pld;
        let epsilon_spent = self.datasets.epsilon(&budget, pld, Of::Spent, self.segments(key, None)).await?;
        let committed = self.datasets.epsilon(&budget, pld, Of::Committed, self.reserved_segments(key, None)).await?;
        let mut jobs: Vec<String> = self
            .jobs
            .read()
            .expect("jobs lock")
            .values()
            .filter(|j| spends(&self.datasets, &j.registration, key))
            .map(|j| j.registration.job_id.clone())
            .collect();
        jobs.sort();
        self.datasets.record_standing(key, epsilon_spent, committed);
        let standing = crate::datasets::Standing::new(budget.epsilon, epsilon_spent, committed);
        Ok(DatasetView { budget, standing, jobs, consequences: Vec::new() })
    }
}

/// The refusal of a step whose release was lost.
fn discarded(job_id: &str, step: u64) -> AccountantError {
    AccountantError::refused(
        job_id,
        step,
        ErrorCode::ReleaseDiscarded,
        "step was charged but its release was lost (discarded); it is never released",
    )
}

/// Whether a job spends budget `key`: its own, or, for a job registered before privacy units
/// (its unit unknown), every unit's budget of its dataset.
fn spends(datasets: &Datasets, r: &Registration, key: &BudgetKey) -> bool {
    let own = datasets.key_of(&r.contract);
    own == *key || (r.legacy && own.dataset_id == key.dataset_id)
}

/// A job's steps as a segment of its mechanism (the ε it reports: the simulated recipe's for
/// a simulation).
fn segment(job: &Job, steps: u64) -> Segment {
    let (_, sample_rate, noise_multiplier) = job.registration.contract.epsilon_mechanism().unwrap_or_default();
    Segment { sample_rate, noise_multiplier, steps }
}

fn validate_registration(r: &Registration) -> Result<(), AccountantError> {
    let id_ok = !r.job_id.is_empty()
        && r.job_id.len() <= 128
        && r.job_id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if !id_ok {
        return Err(AccountantError::invalid(
            "job_id",
            format!("{:?} must be 1-128 characters of [A-Za-z0-9._-]", r.job_id),
        ));
    }
    r.contract.check()?;
    if r.gradient_dim == 0 || r.gradient_dim > (1 << 34) {
        return Err(AccountantError::invalid("gradient_dim", format!("{} must be in [1, 2^34]", r.gradient_dim)));
    }
    if let Some(audit) = r.contract.audit
        && audit.placement == Placement::Model
        && u64::from(audit.canaries) > r.gradient_dim
    {
        return Err(AccountantError::invalid(
            "audit_canaries",
            format!(
                "{} must be at most gradient_dim {} on model coordinates (each canary has its own)",
                audit.canaries, r.gradient_dim
            ),
        ));
    }
    Ok(())
}

impl Accountant {
    /// Builds a job's live state from its ledger record (a new job is a record with no charges).
    async fn build_job(&self, record: JobRecord) -> Result<Job, AccountantError> {
        build_job(record, self.policy, &self.ledger, &self.ahead, &self.curves).await
    }
}

async fn build_job(
    record: JobRecord,
    policy: Policy,
    ledger: &Ledger,
    ahead: &Arc<AheadBudget>,
    curves: &Arc<Curves>,
) -> Result<Job, AccountantError> {
    let r = record.registration;
    validate_registration(&r)?;
    let noise = match r.insecure_noise_seed {
        Some(seed) if policy.allow_seeded_noise => NoiseMode::Seeded(seed),
        Some(_) => {
            return Err(AccountantError::Unavailable(format!(
                "job {} uses seeded noise; restart with --allow-seeded-noise",
                r.job_id
            )));
        }
        None => NoiseMode::OsEntropy,
    };
    let charged = record.charged.len() as u64;
    let (spending, epsilon_spent) = Spending::build(&r.contract, charged, record.closed_spend, curves).await?;
    let next_step = record.charged.last().map_or(0, |s| s + 1);
    let discarded = record.discarded;
    let phase = if record.closed.is_some() {
        Phase::Closed
    } else if charged >= spending.max_steps() {
        Phase::BudgetExhausted
    } else {
        Phase::Open
    };
    let progress = Progress { next_step, charged, discarded: discarded.len() as u64, epsilon_spent, phase };
    let state = StepState {
        pending: None,
        discarded,
        stored: record.released.into_iter().filter(|&s| s >= record.trimmed_before).collect(),
        trimmed_before: record.trimmed_before,
        last_released: None,
    };
    let dim = usize::try_from(r.gradient_dim)
        .map_err(|_| AccountantError::invalid("gradient_dim", "too large for this host"))?;
    let audit = match r.contract.audit {
        None => None,
        Some(a) => {
            let secret = ledger.audit_secret(&r.job_id).await?;
            let (q, c) = (r.contract.mechanism.sample_rate, r.contract.mechanism.clipping_norm);
            Some(Arc::new(AuditPlan::new(secret, a.canaries as usize, dim, q, c, a.placement)))
        }
    };
    // Noise covers the model and the audit's reserved coordinates, in one draw and one pass.
    let noised_dim = dim + audit.as_ref().map_or(0, |a| a.reserved());
    let ahead = NoiseAhead::new(noised_dim, r.contract.noise_std(), noise, ahead.clone());
    Ok(Job {
        registration: r,
        spending,
        noise,
        state: Mutex::new(state),
        releases: std::sync::Mutex::new(BTreeMap::new()),
        ahead,
        progress: watch::channel(progress).0,
        audit,
        generation: AtomicU64::new(record.generation),
        suspended: record.suspended.into(),
        fence_writes: Default::default(),
        violation_counted: Default::default(),
        exhausted_by: Default::default(),
        streams: Default::default(),
    })
}

#[cfg(test)]
mod tests;
