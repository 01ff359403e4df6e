//! The accountant's core: registration, part collection, the release procedure and spend
//! queries, independent of gRPC. The release of step t happens exactly once, under the job's
//! lock: budget check, then the durable charge, then noise, then the release becomes visible.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::{Mutex, watch};

use dpcap_proto::ErrorCode;

use crate::ahead::NoiseAhead;
use crate::audit::{AuditOutcome, Canaries, Placement};
use crate::datasets::DatasetBudget;
use crate::error::AccountantError;
use crate::job::{Job, Part, Pending, Phase, Progress, StepState};
use crate::ledger::{Charge, JobRecord, Ledger, Registration};
use crate::metrics;
use crate::noise::{self, NoiseMode};
use crate::privacy::{self, AccountantKind};
use crate::release::{Release, Stored};
use crate::spending::{Mode, Spending};
use crate::sum::Sum;

/// What became of a submitted part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartOutcome {
    /// Parts of the step received so far (W once released).
    pub received: u32,
    /// True once the step is charged and released.
    pub released: bool,
    /// False when this exact part had been received before (an idempotent retry).
    pub accepted_new: bool,
}

/// What an accountant accepts beyond the safe defaults: both choices are explicit flags.
#[derive(Debug, Clone, Copy, Default)]
pub struct Policy {
    /// Accept jobs with `insecure_noise_seed` (tests only; recorded in every charge).
    pub allow_seeded_noise: bool,
    /// Accept jobs on datasets no privacy admin gave a budget (no lifetime limit applies).
    pub allow_unbudgeted_datasets: bool,
    /// Draw each step's noise only once its parts are in, instead of while the previous step
    /// computes: 8·P bytes less memory per open job, and a release slower by the noise draw.
    pub lazy_noise: bool,
}

/// The accountant: every job's contract, step counter and releases, over one ledger.
#[derive(Debug)]
pub struct Accountant {
    pub(crate) ledger: Ledger,
    pub(crate) jobs: RwLock<HashMap<String, Arc<Job>>>,
    /// Datasets' lifetime budgets, set by privacy admins.
    pub(crate) budgets: RwLock<HashMap<String, DatasetBudget>>,
    /// ε spent per budgeted dataset, as of its latest charge.
    pub(crate) dataset_spent: RwLock<HashMap<String, f64>>,
    pub(crate) dataset_locks: std::sync::Mutex<HashMap<String, Arc<Mutex<()>>>>,
    /// Datasets' composed ε, remembered and computed ahead.
    pub(crate) composed: crate::composed::Composed,
    /// One registration at a time per job id: ranks of a job register at once, and only one
    /// of them may build the job (slow at large ε) and write the ledger record.
    registering: std::sync::Mutex<HashMap<String, Arc<Mutex<()>>>>,
    policy: Policy,
    ready: AtomicBool,
    draining: watch::Sender<bool>,
}

impl Accountant {
    /// An accountant over `ledger`; it serves nothing until [`Accountant::replay`] has run.
    pub fn new(ledger: Ledger, policy: Policy) -> Self {
        Self {
            ledger,
            jobs: RwLock::new(HashMap::new()),
            budgets: RwLock::new(HashMap::new()),
            dataset_spent: RwLock::new(HashMap::new()),
            dataset_locks: std::sync::Mutex::new(HashMap::new()),
            composed: Default::default(),
            registering: std::sync::Mutex::new(HashMap::new()),
            policy,
            ready: AtomicBool::new(false),
            draining: watch::channel(false).0,
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
            self.budgets.write().expect("budgets lock").insert(budget.dataset_id.clone(), budget);
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
            let job = build_job_from_record(record, self.policy, &self.ledger).await?;
            tracing::info!(job_id = %job.registration.job_id, charged = job.progress().charged,
                discarded = job.progress().discarded, "replayed job from ledger");
            self.jobs.write().expect("jobs lock").insert(job.registration.job_id.clone(), Arc::new(job));
        }
        for budget in self.budgets() {
            self.dataset(&budget.dataset_id).await?;
        }
        self.ready.store(true, Ordering::SeqCst);
        Ok(count)
    }

    pub(crate) fn allows_unbudgeted(&self) -> bool {
        self.policy.allow_unbudgeted_datasets
    }

    fn check_ready(&self) -> Result<(), AccountantError> {
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

    /// Every job that is not closed, for metrics.
    pub fn open_jobs(&self) -> Vec<Arc<Job>> {
        let jobs = self.jobs.read().expect("jobs lock");
        jobs.values().filter(|j| j.progress().phase != Phase::Closed).cloned().collect()
    }

    /// Registers a job (idempotent for an identical contract). Returns the job and whether it
    /// was created by this call.
    pub async fn register(&self, mut registration: Registration) -> Result<(Arc<Job>, bool), AccountantError> {
        self.check_ready()?;
        if registration.audit_canaries > 0 && registration.audit_coordinates.is_empty() {
            // Unsaid: a repeated registration keeps the job's placement ("" from a ledger
            // older than placements, which reads as model); a new job gets reserved ones.
            let existing = self.jobs.read().expect("jobs lock").get(&registration.job_id).cloned();
            registration.audit_coordinates = match existing {
                Some(job) => job.registration.audit_coordinates.clone(),
                None => Placement::Reserved.as_str().to_owned(),
            };
        }
        validate_registration(&registration)?;
        if registration.insecure_noise_seed.is_some() && !self.policy.allow_seeded_noise {
            return Err(AccountantError::invalid(
                "insecure_noise_seed",
                "seeded noise is refused unless the accountant runs with --allow-seeded-noise",
            ));
        }
        self.check_dataset(&registration)?;
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
        let record = JobRecord {
            registration: registration.clone(),
            charged: BTreeSet::new(),
            released: BTreeSet::new(),
            discarded: BTreeSet::new(),
            trimmed_before: 0,
            closed: None,
        };
        let job = Arc::new(build_job_from_record(record, self.policy, &self.ledger).await?);
        let created = self.ledger.register(&registration).await?;
        let mut jobs = self.jobs.write().expect("jobs lock");
        let job = jobs
            .entry(registration.job_id.clone())
            .or_insert_with(|| {
                if job.spending.max_steps() > 0 {
                    job.ahead.prepare(0);
                    job.spending.prepare(1);
                }
                job
            })
            .clone();
        tracing::info!(job_id = %registration.job_id, max_steps = job.spending.max_steps(), created, "registered job");
        Ok((job, created))
    }

    /// Adds one complete part. When it is the last of the W parts, charges and releases the
    /// step before returning.
    pub async fn submit_part(&self, job: &Job, part: Part) -> Result<PartOutcome, AccountantError> {
        let Part { step, part, values, digest, attempt } = part;
        let r = &job.registration;
        let mut state = job.state.lock().await;
        let progress = job.progress();
        if let Some((released, digests)) = &state.last_released
            && *released == step
            && digests.get(part as usize) == Some(&Some(digest))
        {
            return Ok(PartOutcome { received: r.parts, released: true, accepted_new: false });
        }
        check_step_open(job, &progress, step)?;
        if let Some(pending) = &state.pending {
            if pending.attempt > attempt {
                return Err(AccountantError::StalePart {
                    job_id: r.job_id.clone(),
                    step,
                    attempt,
                    current: pending.attempt,
                });
            }
            if pending.attempt < attempt {
                // The group that sent these parts was re-formed before the step was complete;
                // nothing was charged or released from them, so dropping them is safe.
                tracing::info!(job_id = %r.job_id, step, attempt, "dropping pending parts of an older attempt");
                state.pending = None;
            }
        }
        let pending = state.pending.get_or_insert_with(|| Pending {
            step,
            sum: Sum::default(),
            digests: vec![None; r.parts as usize],
            started: Instant::now(),
            attempt,
        });
        let slot = &mut pending.digests[part as usize];
        let accepted_new = match slot {
            Some(existing) if *existing == digest => false,
            Some(_) => return Err(AccountantError::ConflictingPart { job_id: r.job_id.clone(), step, part }),
            None => {
                *slot = Some(digest);
                pending.sum.add(values);
                true
            }
        };
        let received = pending.digests.iter().filter(|d| d.is_some()).count() as u32;
        if received < r.parts {
            return Ok(PartOutcome { received, released: false, accepted_new });
        }
        self.release(job, &mut state).await?;
        Ok(PartOutcome { received, released: true, accepted_new })
    }

    /// Budget check, durable charge, noise once, release. Called with the job's lock held and
    /// every part in.
    async fn release(&self, job: &Job, state: &mut StepState) -> Result<(), AccountantError> {
        let r = &job.registration;
        let pending = state.pending.as_ref().expect("release needs a pending step");
        let step = pending.step;
        // Parts are exactly P values (PartAssembler): anything else would reach the audit's
        // reserved coordinates. Checked before the charge, so nothing is spent on it.
        if pending.sum.len() as u64 != r.gradient_dim {
            let got = pending.sum.len();
            state.pending = None;
            return Err(AccountantError::Internal(format!(
                "step {step}'s sum has {got} values, not {}",
                r.gradient_dim
            )));
        }
        let progress = job.progress();
        let _dataset_guard = match self.dataset_lock(r) {
            Some(lock) => Some(lock.lock_owned().await),
            None => None,
        };
        let epsilon_after = job.spending.epsilon_after(progress.charged + 1).await?;
        let private = job.spending.mode().is_private();
        if !matches!(job.spending.mode(), Mode::NotPrivate) && exceeds(epsilon_after, r.epsilon_target) {
            state.pending = None;
            return Err(self.refuse(
                job,
                step,
                "job".into(),
                progress.epsilon_spent,
                epsilon_after,
                r.epsilon_target,
                "job_target",
            ));
        }
        if let Err(e) = self.check_step_dataset(r) {
            state.pending = None;
            return Err(e);
        }
        let mut dataset_after = None;
        // Jobs without a guarantee were let onto the dataset by its owners and never spend it.
        if let Some(budget) = self.budget_of(&r.dataset_id).filter(|_| private) {
            let dataset_eps = self.dataset_epsilon(&budget, Some((job, 1))).await?;
            if exceeds(dataset_eps, budget.epsilon) {
                state.pending = None;
                let spent = self.dataset_epsilon(&budget, None).await?;
                let scope = format!("dataset {}", r.dataset_id);
                return Err(self.refuse(job, step, scope, spent, dataset_eps, budget.epsilon, "dataset_budget"));
            }
            dataset_after = Some(dataset_eps);
        }
        let charge = Charge {
            job_id: r.job_id.clone(),
            step,
            epsilon_after: (job.spending.mode() != Mode::NotPrivate).then_some(epsilon_after),
            noise: job.noise.describe(),
            charged_at_unix_ms: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
        };
        let charged = self.ledger.charge(&charge).await;
        if let (Ok(()) | Err(AccountantError::ChargedElsewhere { .. }), Some(eps)) = (&charged, dataset_after) {
            self.record_dataset_spent(&r.dataset_id, eps);
        }
        if let Err(e) = charged {
            if matches!(e, AccountantError::ChargedElsewhere { .. }) {
                // Another process owns this step; it is spent, and it is not ours to release.
                state.pending = None;
                discard_charged(job, state, step, epsilon_after);
            }
            // Any other failure leaves the parts pending: a retried part re-triggers the release.
            return Err(e);
        }
        let mut pending = state.pending.take().expect("pending step is still held");
        // The charge is durable: only now may noise touch the sum. Noise drawn ahead is this
        // step's (taken once); if it cannot be had, the step stays spent and is discarded,
        // never re-noised.
        let noising = Instant::now();
        let noise = match job.ahead.take(step).await {
            Ok(noise) => noise,
            Err(e) => {
                discard_charged(job, state, step, epsilon_after);
                return Err(self.record_discard(job, step, e).await);
            }
        };
        // Ranks get the model's P coordinates; an audit's reserved ones stay here.
        let (stored, stored_rx) = watch::channel(Stored::Writing);
        let visible = 4 * r.gradient_dim as usize;
        let release =
            Arc::new(Release::filling(step, epsilon_after, visible, 4 * noise.len(), noise::BLOCK_BYTES, stored_rx));
        let pass = {
            let (release, canaries, sum) = (release.clone(), job.audit.clone(), std::mem::take(&mut pending.sum));
            let mut noise = noise;
            tokio::task::spawn_blocking(move || {
                // An audit's canaries are gradients like any example's: in the sum, under the noise.
                if let Some(canaries) = canaries {
                    canaries.inject(step, &mut noise, 1.0);
                }
                noise::apply_each(&sum, &noise, |index, block| release.fill(index, Bytes::from(block)));
            })
        };
        job.keep_release(release.clone());
        state.last_released = Some((step, pending.digests.clone()));
        // Fetches start streaming the blocks the pass has filled, while the release is written;
        // their last chunk waits until it is durable, and ranks apply only a release with its
        // last chunk.
        job.progress.send_modify(|p| {
            p.next_step = step + 1;
            p.charged += 1;
            p.epsilon_spent = epsilon_after;
        });
        let passed = async {
            let passed = pass.await.is_ok();
            if !passed {
                release.fail(); // wakes the store and the fetches waiting for its blocks
            }
            (passed, noising.elapsed().as_secs_f64())
        };
        let ((passed, noise_s), put) = tokio::join!(passed, self.ledger.put_release(&r.job_id, step, &release));
        let put =
            if passed { put } else { Err(AccountantError::Internal(format!("noise pass of step {step} failed"))) };
        if let Err(e) = put {
            release.fail();
            stored.send_replace(Stored::Failed);
            job.releases.lock().expect("releases lock").remove(&step);
            state.discarded.insert(step);
            job.progress.send_modify(|p| p.discarded += 1);
            return Err(self.record_discard(job, step, e).await);
        }
        state.stored.insert(step);
        stored.send_replace(Stored::Done);
        if let Some(canaries) = &job.audit
            && let Err(e) =
                self.ledger.put_audit_readings(&r.job_id, step, canaries.readings(|c| release.value(c))).await
        {
            // The audit then scores one release fewer: weaker, never wrong.
            tracing::warn!(job_id = %r.job_id, step, error = %e, "audit readings not stored");
        }
        // The next step's noise is drawn while the ranks apply this release and compute.
        if step + 1 < job.spending.max_steps() {
            job.ahead.prepare(step + 1);
            job.spending.prepare(progress.charged + 2);
            self.prepare_dataset(job);
        }
        metrics::record_release(pending.started.elapsed());
        // The pass and the store run side by side, both from the charge.
        let stored_s = noising.elapsed().as_secs_f64();
        tracing::info!(job_id = %r.job_id, step, epsilon_after, noise_s, stored_s, "released step");
        Ok(())
    }

    /// The one-run audit of an ended job registered with canaries: every stored step's
    /// readings scored, guesses on the top and bottom 1 %, the ε lower bounds at δ. Returns
    /// the outcome and the number of steps scored.
    pub async fn audit(&self, job: &Job) -> Result<(AuditOutcome, u64), AccountantError> {
        let r = &job.registration;
        let not_auditable =
            |reason: &str| AccountantError::NotAuditable { job_id: r.job_id.clone(), reason: reason.into() };
        let canaries = job.audit.clone().ok_or_else(|| not_auditable("it was registered without audit_canaries"))?;
        let progress = job.progress();
        if progress.phase == Phase::Open {
            return Err(not_auditable("it is still open; its canaries stay secret until it ends"));
        }
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
        let delta = r.delta;
        let outcome = blocking(move || canaries.conclude(&scores, delta, canaries.default_guesses())).await?;
        metrics::record_audit(&r.job_id, outcome.bound(), outcome.bound() > progress.epsilon_spent);
        tracing::info!(job_id = %r.job_id, steps, bound = outcome.bound(), claimed = progress.epsilon_spent, "audited job");
        Ok((outcome, steps))
    }

    /// A charged step's release was lost before it was stored: the ledger must say so too, or
    /// a replay that finds a release object (a put that landed despite its error) would serve
    /// a step the ranks skipped. Returns the original error.
    async fn record_discard(&self, job: &Job, step: u64, error: AccountantError) -> AccountantError {
        let job_id = &job.registration.job_id;
        tracing::error!(job_id = %job_id, step, error = %error, "release not stored: step discarded");
        if let Err(marker) = self.ledger.discard(job_id, step).await {
            tracing::error!(job_id = %job_id, step, error = %marker, "discard not recorded; refusing further steps");
            job.ahead.clear();
            job.progress.send_modify(|p| p.phase = Phase::Closed);
        }
        error
    }

    #[allow(clippy::too_many_arguments)]
    fn refuse(
        &self,
        job: &Job,
        step: u64,
        scope: String,
        spent: f64,
        after: f64,
        target: f64,
        reason: &'static str,
    ) -> AccountantError {
        metrics::record_budget_rejection(reason);
        job.ahead.clear();
        job.progress.send_modify(|p| p.phase = Phase::BudgetExhausted);
        tracing::warn!(job_id = %job.registration.job_id, step, epsilon_after = after, target, reason, "refused step: budget exhausted");
        AccountantError::BudgetExhausted {
            job_id: job.registration.job_id.clone(),
            step,
            scope,
            epsilon_spent: spent,
            epsilon_after: after,
            epsilon_target: target,
            delta: job.registration.delta,
        }
    }

    /// Waits until `step` is released and returns it; fails if it never will be.
    pub async fn wait_release(&self, job: &Job, step: u64) -> Result<Arc<Release>, AccountantError> {
        let mut progress_rx = job.progress.subscribe();
        let mut draining = self.draining.subscribe();
        loop {
            let progress = *progress_rx.borrow_and_update();
            let id = &job.registration.job_id;
            if progress.next_step > step {
                return self.released(job, step).await;
            }
            match progress.phase {
                Phase::BudgetExhausted => {
                    return Err(AccountantError::refused(
                        id,
                        step,
                        ErrorCode::BudgetExhausted,
                        "budget exhausted; the step was not released",
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
            return Err(AccountantError::refused(
                &r.job_id,
                step,
                ErrorCode::ReleaseDiscarded,
                "step was charged but its release was lost (discarded); it is never released",
            ));
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
        job.keep_release(release.clone());
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
        self.ledger.close(&job.registration.job_id, reason).await?;
        // Under the step lock, so that no part can release a step between the ledger's close
        // and the closed phase.
        let mut state = job.state.lock().await;
        state.pending = None;
        job.ahead.clear();
        job.progress.send_modify(|p| p.phase = Phase::Closed);
        drop(state);
        tracing::info!(job_id = %job.registration.job_id, reason, "closed job");
        Ok(())
    }
}

/// A charged step that will never be released: it stays spent, counted as discarded.
fn discard_charged(job: &Job, state: &mut StepState, step: u64, epsilon_after: f64) {
    state.discarded.insert(step);
    job.progress.send_modify(|p| {
        p.next_step = step + 1;
        p.charged += 1;
        p.discarded += 1;
        p.epsilon_spent = epsilon_after;
    });
}

fn check_step_open(job: &Job, progress: &Progress, step: u64) -> Result<(), AccountantError> {
    let id = &job.registration.job_id;
    match progress.phase {
        Phase::Closed => return Err(AccountantError::JobClosed { job_id: id.clone() }),
        Phase::BudgetExhausted => {
            return Err(AccountantError::refused(
                id,
                step,
                ErrorCode::BudgetExhausted,
                format!("budget exhausted after {} steps (epsilon {:.6})", progress.charged, progress.epsilon_spent),
            ));
        }
        Phase::Open => {}
    }
    if step < progress.next_step {
        return Err(AccountantError::refused(
            id,
            step,
            ErrorCode::StepAlreadyCharged,
            format!("step was already charged; the ledger expects step {}", progress.next_step),
        ));
    }
    if step > progress.next_step {
        return Err(AccountantError::refused(
            id,
            step,
            ErrorCode::StepNotNext,
            format!("step is not next; the ledger expects step {}", progress.next_step),
        ));
    }
    Ok(())
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
    privacy::check_sample_rate(r.sample_rate)?;
    privacy::check_delta(r.delta)?;
    if !(r.clipping_norm > 0.0 && r.clipping_norm.is_finite()) {
        return Err(AccountantError::invalid(
            "clipping_norm",
            format!("{} must be a finite number > 0", r.clipping_norm),
        ));
    }
    Mode::of(r)?; // σ and the ε target, as the job's privacy mode requires
    r.accountant.parse::<AccountantKind>()?;
    if r.gradient_dim == 0 || r.gradient_dim > (1 << 34) {
        return Err(AccountantError::invalid("gradient_dim", format!("{} must be in [1, 2^34]", r.gradient_dim)));
    }
    if r.parts == 0 || r.parts > 4096 {
        return Err(AccountantError::invalid("parts", format!("{} must be in [1, 4096]", r.parts)));
    }
    if !(r.dataset_epsilon_budget >= 0.0 && r.dataset_epsilon_budget.is_finite()) {
        return Err(AccountantError::invalid(
            "dataset_epsilon_budget",
            format!("{} must be a finite number >= 0", r.dataset_epsilon_budget),
        ));
    }
    if r.dataset_epsilon_budget > 0.0 && r.dataset_id.is_empty() {
        return Err(AccountantError::invalid("dataset_id", "must be set when dataset_epsilon_budget is"));
    }
    if r.audit_canaries > 0 {
        if r.privacy != "dp" {
            return Err(AccountantError::invalid(
                "audit_canaries",
                format!("a {} job claims no guarantee to audit; only DP jobs can be audited", r.privacy),
            ));
        }
        let placement = placement(r)?;
        let most =
            if placement == Placement::Model { r.gradient_dim.min(MAX_AUDIT_CANARIES) } else { MAX_AUDIT_CANARIES };
        if u64::from(r.audit_canaries) > most {
            return Err(AccountantError::invalid(
                "audit_canaries",
                format!(
                    "{} must be at most {most}: each canary has its own coordinate (gradient_dim {}, coordinates {})",
                    r.audit_canaries,
                    r.gradient_dim,
                    placement.as_str()
                ),
            ));
        }
    } else if !r.audit_coordinates.is_empty() {
        return Err(AccountantError::invalid("audit_coordinates", "must be empty without audit_canaries"));
    }
    Ok(())
}

/// Where an audited job's canaries live; "" is a ledger from before placements (model).
fn placement(r: &Registration) -> Result<Placement, AccountantError> {
    match r.audit_coordinates.as_str() {
        "" => Ok(Placement::Model),
        other => other.parse().map_err(|e: String| AccountantError::invalid("audit_coordinates", e)),
    }
}

/// Most canaries one job may carry (their readings cost 4 bytes each per step).
const MAX_AUDIT_CANARIES: u64 = 10_000_000;

/// Builds a job's live state from its ledger record (a new job is a record with no charges).
async fn build_job_from_record(record: JobRecord, policy: Policy, ledger: &Ledger) -> Result<Job, AccountantError> {
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
    let (spending, epsilon_spent) = Spending::build(&r, charged).await?;
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
    let audit = match r.audit_canaries {
        0 => None,
        m => {
            let secret = ledger.audit_secret(&r.job_id).await?;
            let placement = placement(&r)?;
            Some(Arc::new(Canaries::new(secret, m as usize, dim, r.sample_rate, r.clipping_norm, placement)))
        }
    };
    // Noise covers the model and the audit's reserved coordinates, in one draw and one pass.
    let noised_dim = dim + audit.as_ref().map_or(0, |a| a.reserved());
    let ahead = NoiseAhead::new(noised_dim, r.noise_multiplier * r.clipping_norm, noise, !policy.lazy_noise);
    Ok(Job {
        registration: r,
        spending,
        noise,
        state: Mutex::new(state),
        releases: std::sync::Mutex::new(BTreeMap::new()),
        ahead,
        progress: watch::channel(progress).0,
        audit,
    })
}

/// Whether `epsilon` passes `target`; a NaN ε always does (refused, never charged).
fn exceeds(epsilon: f64, target: f64) -> bool {
    epsilon.is_nan() || epsilon > target
}

pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, AccountantError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| AccountantError::Internal(format!("blocking task failed: {e}")))
}

#[cfg(test)]
mod tests;
