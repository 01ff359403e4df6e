//! The coordinator's API, shared by the gRPC services: each call takes the state lock for a
//! pure transition (never across an await), then persists the touched jobs, tells the
//! accountant about ended jobs, and wakes watchers and waiting ranks.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use dpcap_accountant::client::{AccountantClient, RawClient};
use dpcap_proto::v1::{
    Assignment, AuditJobRequest, CloseJobRequest, GetSpendRequest, Job, JobSpec, JobState, Progress, Reduction,
    StepWork, TrimReleasesRequest, step_work::Action,
};
use dpcap_proto::{RetryPolicy, retry};

use crate::dataset;
use crate::error::CoordinatorError;
use crate::sampler::{JobSecret, PoissonSampler};
use crate::state::{Effects, JobEntry, Report, State, WorkerEntry, condition, is_terminal, now_ms};
use crate::store::{JobStore, Private, hex};

/// One attempt of an ended job's audit (scoring is milliseconds; a stalled call is retried).
const AUDIT_ATTEMPT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// How the coordinator is set up.
#[derive(Clone)]
pub struct Config {
    /// The object-store URL or directory of jobs and checkpoints (workers write here).
    pub store_url: String,
    /// Where job secrets (sampler keys) live: a store workers are never given. Empty: the
    /// job store's location with `-secrets` appended (a sibling directory, or prefix).
    pub secrets_url: String,
    /// The accountant workers send parts to, e.g. "http://127.0.0.1:7070".
    pub accountant_endpoint: String,
    /// TLS towards the accountant (https:// endpoints).
    pub accountant_tls: dpcap_serve::ClientTlsArgs,
    /// The coordinator-role token presented to the accountant.
    pub accountant_token: Option<String>,
    /// A worker silent for this long is dropped and its job's group re-formed.
    pub lease: Duration,
}

impl std::fmt::Debug for Config {
    /// Everything but the token's value.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("store_url", &self.store_url)
            .field("secrets_url", &self.secrets_url)
            .field("accountant_endpoint", &self.accountant_endpoint)
            .field("accountant_tls", &self.accountant_tls)
            .field("accountant_token", &self.accountant_token.as_ref().map(|_| "<set>"))
            .field("lease", &self.lease)
            .finish()
    }
}

/// The coordinator.
#[derive(Debug)]
pub struct Coordinator {
    config: Config,
    store: JobStore,
    accountant: RawClient,
    state: Mutex<State>,
    pub(crate) changed: tokio::sync::watch::Sender<u64>,
    writes: tokio::sync::Mutex<()>,
    draining: tokio::sync::watch::Sender<bool>,
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).expect("OS entropy is available");
    bytes
}

impl Coordinator {
    /// A coordinator over `store`, restoring every stored job: unfinished ones are queued
    /// again in submission order and resume from their stored position.
    pub async fn open(config: Config, store: JobStore) -> Result<Arc<Self>, CoordinatorError> {
        let endpoint = config
            .accountant_tls
            .endpoint(&config.accountant_endpoint)
            .map_err(|e| CoordinatorError::invalid("accountant", e.to_string()))?;
        let accountant = AccountantClient::lazy(endpoint, config.accountant_token.clone()).into_raw();
        let mut state = State::default();
        let mut restored = store.load_all().await?;
        restored.sort_by_key(|(job, _)| (job.created_unix_ms, job.job_id.clone()));
        for (mut job, private) in restored {
            let restored = match is_terminal(job.state) {
                true => Ok(None),
                false => restore_clients(&job).await,
            };
            let clients = match restored {
                Ok(clients) => clients,
                Err(e) => {
                    // Never run a user-level job without its clients: it waits, FAILED and
                    // resumable, until its dataset can be read again.
                    let message = format!("its user table could not be read: {e}; resume the job once it can");
                    condition(&mut job, "Failed", "DatasetUnreadable", message);
                    job.state = JobState::Failed as i32;
                    None
                }
            };
            let running = !is_terminal(job.state);
            if running {
                if job.state == JobState::Running as i32 {
                    condition(&mut job, "Restored", "CoordinatorRestarted", "re-queued after a coordinator restart");
                }
                job.state = JobState::Pending as i32;
                state.queue.push_back(job.job_id.clone());
            }
            let entry = entry_for(job, &private, clients)?;
            state.jobs.insert(entry.job.job_id.clone(), entry);
        }
        tracing::info!(jobs = state.jobs.len(), queued = state.queue.len(), "job store restored");
        Ok(Arc::new(Self {
            accountant,
            config,
            store,
            state: Mutex::new(state),
            changed: tokio::sync::watch::channel(0).0,
            writes: tokio::sync::Mutex::new(()),
            draining: tokio::sync::watch::channel(false).0,
        }))
    }

    /// Starts draining: long polls (GetStep, WatchJob) end with UNAVAILABLE so that the
    /// server's graceful shutdown is not held open by a connected watcher or a waiting rank.
    pub fn begin_drain(&self) {
        self.draining.send_replace(true);
    }

    /// A receiver that turns true when the coordinator starts draining.
    pub fn draining(&self) -> tokio::sync::watch::Receiver<bool> {
        self.draining.subscribe()
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Persists, closes and notifies after a transition.
    async fn apply(&self, effects: Effects) -> Result<(), CoordinatorError> {
        // Watchers are woken after the record is durable and ended jobs are closed at the
        // accountant, so a watcher that sees SUCCEEDED can rely on both.
        let result = self.persist_and_close(effects).await;
        // An audited job's audit is in its conditions before any watcher sees it ended.
        for job_id in result.as_deref().unwrap_or_default() {
            self.record_audit(job_id).await;
        }
        self.changed.send_modify(|v| *v += 1);
        result.map(|_| ())
    }

    /// Asks the accountant for an ended job's one-run audit and records it as a condition:
    /// `Audited`/`AuditPassed`, or `Warning`/`AuditViolation` when the lower bound passes the
    /// claimed ε (the accountant also counts it in `dpcap_audit_violations_total`).
    async fn record_audit(&self, job_id: &str) {
        let request = AuditJobRequest { job_id: job_id.to_owned() };
        let audited = retry(self.accountant_retry(), "audit_job", || {
            let (mut client, mut request) = (self.accountant.clone(), tonic::Request::new(request.clone()));
            // A stalled attempt ends DEADLINE_EXCEEDED and is retried: the job's watchers wake
            // only after its audit, so one stuck call must never hold them.
            request.set_timeout(AUDIT_ATTEMPT_TIMEOUT);
            async move { client.audit_job(request).await }
        })
        .await;
        let (kind, reason, message) = match audited {
            Ok(report) => {
                let r = report.into_inner();
                let (kind, reason) =
                    if r.violation { ("Warning", "AuditViolation") } else { ("Audited", "AuditPassed") };
                let message = format!(
                    "epsilon lower bound {:.4} vs claimed {:.4} at delta {:.2e} (95 % confidence): {} of {} guesses \
                     right on {} canaries over {} releases",
                    r.epsilon_lower_bound, r.epsilon_claimed, r.delta, r.correct, r.guesses, r.canaries, r.steps_scored
                );
                (kind, reason, message)
            }
            Err(s) => ("Warning", "AuditFailed", format!("the accountant could not audit the job: {}", s.message())),
        };
        tracing::info!(job_id, reason, message, "audit");
        let snapshot = {
            let mut state = self.lock();
            state.jobs.get_mut(job_id).map(|entry| {
                condition(&mut entry.job, kind, reason, message);
                entry.job.clone()
            })
        };
        if let Some(job) = snapshot {
            let _serial = self.writes.lock().await;
            if let Err(e) = self.store.put_job(&job).await {
                tracing::warn!(job_id, error = %e, "could not persist the audit condition");
            }
        }
    }

    /// Persists and closes; returns the closed jobs that were submitted with an audit.
    async fn persist_and_close(&self, effects: Effects) -> Result<Vec<String>, CoordinatorError> {
        let _serial = self.writes.lock().await;
        for job_id in effects.persist {
            let snapshot = self.lock().jobs.get(&job_id).map(|e| e.job.clone());
            if let Some(job) = snapshot {
                self.store.put_job(&job).await?;
            }
        }
        let mut audits = Vec::new();
        for (job_id, reason) in effects.close {
            let request = CloseJobRequest { job_id: job_id.clone(), reason };
            let closed = retry(self.accountant_retry(), "close_job", || {
                let (mut client, request) = (self.accountant.clone(), request.clone());
                async move { client.close_job(request).await }
            })
            .await;
            match closed {
                Ok(_) if self.is_audited(&job_id) => audits.push(job_id),
                Ok(_) => {}
                Err(s) if s.code() == tonic::Code::NotFound => {}
                Err(s) => tracing::warn!(job_id, error = %s, "could not close the job at the accountant"),
            }
        }
        for (job_id, before_step) in effects.trim {
            let request = TrimReleasesRequest { job_id: job_id.clone(), before_step };
            let trimmed = retry(self.accountant_retry(), "trim_releases", || {
                let (mut client, request) = (self.accountant.clone(), request.clone());
                async move { client.trim_releases(request).await }
            })
            .await;
            if let Err(s) = trimmed {
                // Untrimmed releases only cost storage; the next checkpoint trims them.
                tracing::warn!(job_id, before_step, error = %s, "could not trim releases at the accountant");
            }
        }
        Ok(audits)
    }

    fn is_audited(&self, job_id: &str) -> bool {
        self.lock().jobs.get(job_id).and_then(|e| e.job.spec.as_ref()).is_some_and(|spec| spec.audit.is_some())
    }

    /// Retries of accountant calls made while holding the write lock: bounded well below a
    /// lease so that a down accountant delays, but never wedges, the coordinator.
    fn accountant_retry(&self) -> RetryPolicy {
        RetryPolicy { deadline: self.config.lease.max(Duration::from_secs(5)), ..RetryPolicy::default() }
    }

    /// Validates, calibrates and queues a job; a repeated idempotency key returns the original.
    pub async fn submit(&self, spec: JobSpec, idempotency_key: &str) -> Result<Job, CoordinatorError> {
        crate::spec::check_fields(&spec)?;
        let layout = dataset::read_layout(&spec.dataset).await?;
        let init = crate::init::check(&spec, &layout.digest).await?;
        let (examples, counts) = (layout.layout.examples(), layout.counts);
        // User-level objectives sample and account clients, not examples.
        let (users, clients) = match crate::spec::users_per_client(&spec) {
            Some(k) => {
                let (users, clients) = dataset::read_clients(&spec.dataset, &layout.digest, k).await?;
                (users, Some(Arc::new(clients)))
            }
            None => (0, None),
        };
        let units = clients.as_ref().map_or(examples, |c| c.len() as u64);
        let mut for_plan = spec.clone();
        if clients.is_some() && for_plan.delta.is_none() {
            // δ defaults to 1/N_users, the privacy unit's count (never the larger 1/N_clients
            // of virtual clients).
            for_plan.delta = Some(1.0 / users.max(1) as f64);
        }
        let mut plan = tokio::task::spawn_blocking(move || crate::spec::plan(&for_plan, units))
            .await
            .map_err(|e| CoordinatorError::Store(e.to_string()))??;
        if let Some(clients) = &clients {
            (plan.examples, plan.clients, plan.users) = (examples, clients.len() as u64, users);
        }
        plan.dataset_digest = layout.digest;
        if let Some(source) = &init {
            (plan.init_step, plan.init_privacy) = (source.step, source.privacy.clone());
        }
        let job_id = format!("job-{}", hex(&random_bytes::<6>()));
        if !idempotency_key.is_empty()
            && let Some(existing) = self.store.claim_key(idempotency_key, &job_id).await?
        {
            return self.get(&existing);
        }
        let secret = random_bytes::<32>();
        let mut job = Job {
            job_id: job_id.clone(),
            state: JobState::Pending as i32,
            created_unix_ms: now_ms(),
            checkpoint_root: format!("{}/jobs/{job_id}/checkpoints", self.config.store_url.trim_end_matches('/')),
            progress: Some(Progress { steps_total: plan.steps, ..Default::default() }),
            spec: Some(spec),
            plan: Some(plan),
            conditions: vec![],
            reduction: Reduction::Unspecified as i32,
        };
        let plan = job.plan.clone().unwrap_or_default();
        condition(
            &mut job,
            "Submitted",
            "Accepted",
            format!(
                "N = {examples}, q = {:.6}, L = {:.1}, {} steps",
                plan.sample_rate, plan.expected_batch_size, plan.steps
            ),
        );
        let how = if plan.calibrated { "calibrated" } else { "fixed" };
        if let Some(source) = &init {
            let from = format!("weights of job {} step {} ({})", source.job_id, source.step, source.privacy);
            condition(&mut job, "Initialised", "InitFrom", from.clone());
            if source.privacy != "dp" && crate::mode::is_private(plan.privacy()) {
                let stated =
                    format!("{from} are NOT PRIVATE; init_public states they saw public or synthetic data only");
                condition(&mut job, "Warning", "InitNotPrivate", stated);
            }
        }
        if let Some(notice) = crate::mode::notice(&plan) {
            // First, and in every listing: the job's releases carry no guarantee.
            condition(&mut job, "Privacy", "NotPrivate", notice);
        }
        condition(
            &mut job,
            "Calibrated",
            if plan.calibrated { "Calibrated" } else { "Fixed" },
            format!(
                "sigma = {:.4} ({how}); epsilon {:.4} planned, target {:.4} at delta {:.3e}",
                plan.noise_multiplier, plan.epsilon_planned, plan.epsilon_target, plan.delta
            ),
        );
        if plan.epsilon_planned > plan.epsilon_target * (1.0 + 1e-9) {
            condition(
                &mut job,
                "Warning",
                "BudgetWillExhaust",
                format!(
                    "{} steps at sigma {:.4} spend epsilon {:.4} > target {:.4}: the job will end BUDGET_EXHAUSTED",
                    plan.steps, plan.noise_multiplier, plan.epsilon_planned, plan.epsilon_target
                ),
            );
        }
        let private = Private { secret: hex(&secret), shard_counts: counts };
        self.store.put_private(&job_id, &private).await?;
        self.store.put_job(&job).await?;
        tracing::info!(job_id, sigma = plan.noise_multiplier, steps = plan.steps, "job submitted");
        let effects = {
            let mut state = self.lock();
            state.jobs.insert(job_id.clone(), entry_for(job, &private, clients)?);
            state.queue.push_back(job_id.clone());
            state.schedule()
        };
        self.apply(effects).await?;
        self.get(&job_id)
    }

    /// One job.
    pub fn get(&self, job_id: &str) -> Result<Job, CoordinatorError> {
        self.lock().jobs.get(job_id).map(|e| e.job.clone()).ok_or_else(|| CoordinatorError::JobNotFound(job_id.into()))
    }

    /// Every job, oldest first.
    pub fn list(&self) -> Vec<Job> {
        let mut jobs: Vec<Job> = self.lock().jobs.values().map(|e| e.job.clone()).collect();
        jobs.sort_by_key(|j| (j.created_unix_ms, j.job_id.clone()));
        jobs
    }

    /// The job's version and snapshot, for watchers.
    pub fn snapshot(&self, job_id: &str) -> Result<(u64, Job), CoordinatorError> {
        let state = self.lock();
        let entry = state.jobs.get(job_id).ok_or_else(|| CoordinatorError::JobNotFound(job_id.into()))?;
        Ok((entry.version, entry.job.clone()))
    }

    /// A receiver that changes whenever any job or worker does.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Cancels a pending or running job.
    pub async fn cancel(&self, job_id: &str) -> Result<Job, CoordinatorError> {
        let effects = {
            let mut state = self.lock();
            let entry = state.jobs.get(job_id).ok_or_else(|| CoordinatorError::JobNotFound(job_id.into()))?;
            if is_terminal(entry.job.state) {
                return Err(CoordinatorError::Precondition {
                    job_id: job_id.into(),
                    state: JobState::try_from(entry.job.state).map(|s| s.as_str_name()).unwrap_or("UNKNOWN").into(),
                    reason: "it has already ended".into(),
                });
            }
            state.finish(job_id, JobState::Cancelled, "Cancelled", "cancelled by the operator".into())
        };
        self.apply(effects).await?;
        self.get(job_id)
    }

    /// Queues a FAILED or CANCELLED job again. It continues from its latest checkpoint at the
    /// ledger's next step, so no step number is reused and ε keeps counting from the ledger.
    pub async fn resume(&self, job_id: &str) -> Result<Job, CoordinatorError> {
        let missing = {
            let state = self.lock();
            let entry = state.jobs.get(job_id).ok_or_else(|| CoordinatorError::JobNotFound(job_id.into()))?;
            entry.clients.is_none().then(|| entry.job.clone())
        };
        if let Some(job) = missing
            && let Some(clients) = restore_clients(&job).await?
            && let Some(entry) = self.lock().jobs.get_mut(job_id)
        {
            entry.clients = Some(clients);
        }
        let effects = {
            let mut state = self.lock();
            let entry = state.jobs.get(job_id).ok_or_else(|| CoordinatorError::JobNotFound(job_id.into()))?;
            let resumable = matches!(JobState::try_from(entry.job.state), Ok(JobState::Failed | JobState::Cancelled));
            if !resumable {
                return Err(CoordinatorError::Precondition {
                    job_id: job_id.into(),
                    state: JobState::try_from(entry.job.state).map(|s| s.as_str_name()).unwrap_or("UNKNOWN").into(),
                    reason: "only a FAILED or CANCELLED job can be resumed".into(),
                });
            }
            state.resume(job_id)
        };
        self.apply(effects).await?;
        self.get(job_id)
    }

    /// A stopping worker leaves: its group is re-formed now rather than after its lease.
    pub async fn leave(&self, worker_id: &str) -> Result<(), CoordinatorError> {
        let effects = {
            let mut state = self.lock();
            if !state.workers.contains_key(worker_id) {
                return Err(CoordinatorError::WorkerNotFound(worker_id.into()));
            }
            state.leave(worker_id)
        };
        self.apply(effects).await
    }

    /// Registers a worker and schedules queued jobs onto it.
    pub async fn register_worker(
        &self,
        name: String,
        device: String,
        throughput: f64,
    ) -> Result<String, CoordinatorError> {
        if name.is_empty() {
            return Err(CoordinatorError::invalid("name", "a worker needs a name"));
        }
        if !(throughput >= 0.0 && throughput.is_finite()) {
            return Err(CoordinatorError::invalid("throughput", format!("{throughput} must be finite and >= 0")));
        }
        let worker_id = format!("w-{}", hex(&random_bytes::<4>()));
        let throughput = if throughput > 0.0 { throughput } else { 1.0 };
        tracing::info!(worker_id, name, device, throughput, "worker registered");
        let effects = {
            let mut state = self.lock();
            state.workers.insert(
                worker_id.clone(),
                WorkerEntry { name, device, throughput, last_seen: Instant::now(), job: None, measured: false },
            );
            state.schedule()
        };
        self.apply(effects).await?;
        Ok(worker_id)
    }

    /// Renews a lease and returns the worker's assignment, if it has one.
    pub fn heartbeat(&self, worker_id: &str) -> Result<Option<Assignment>, CoordinatorError> {
        let mut state = self.lock();
        let worker =
            state.workers.get_mut(worker_id).ok_or_else(|| CoordinatorError::WorkerNotFound(worker_id.into()))?;
        worker.last_seen = Instant::now();
        let Some(job_id) = worker.job.clone() else { return Ok(None) };
        let Some(entry) = state.jobs.get(&job_id) else { return Ok(None) };
        let Some(group) = entry.group.as_ref() else { return Ok(None) };
        let rank = group.members.iter().position(|m| m == worker_id).unwrap_or(0);
        Ok(Some(Assignment {
            job_id,
            spec: entry.job.spec.clone(),
            plan: entry.job.plan.clone(),
            rank: rank as u32,
            world_size: group.members.len() as u32,
            generation: group.generation,
            checkpoint_root: entry.job.checkpoint_root.clone(),
            reduction: entry.job.reduction,
            augment_key: entry.sampler.augment_key().to_vec().into(),
        }))
    }

    /// Drops workers whose lease expired.
    pub async fn reap(&self) -> Result<(), CoordinatorError> {
        let effects = self.lock().reap(self.config.lease);
        if !effects.persist.is_empty() {
            self.apply(effects).await?;
        }
        Ok(())
    }

    /// The accountant's next step and discarded count for a job ((0, 0) before registration).
    async fn ledger_position(&self, job_id: &str) -> Result<(u64, u64), CoordinatorError> {
        let spend = retry(self.accountant_retry(), "get_spend", || {
            let mut client = self.accountant.clone();
            async move { client.get_spend(GetSpendRequest { job_id: job_id.into() }).await }
        })
        .await;
        match spend {
            Ok(spend) => {
                let spend = spend.into_inner();
                Ok((spend.next_step, spend.steps_discarded))
            }
            Err(s) if s.code() == tonic::Code::NotFound => Ok((0, 0)),
            Err(s) => Err(CoordinatorError::Accountant(s.message().to_owned())),
        }
    }

    /// Waits until this rank has work: the current step's units, or STOP when the job ended or
    /// the group was re-formed.
    pub async fn next_step(
        &self,
        worker_id: &str,
        job_id: &str,
        generation: u64,
    ) -> Result<StepWork, CoordinatorError> {
        let stop = StepWork { action: Action::Stop as i32, ..Default::default() };
        let mut draining = self.draining();
        loop {
            if *draining.borrow_and_update() {
                return Err(CoordinatorError::Draining);
            }
            let mut changed = self.changed.subscribe();
            let need_position = {
                let mut state = self.lock();
                let worker = state
                    .workers
                    .get_mut(worker_id)
                    .ok_or_else(|| CoordinatorError::WorkerNotFound(worker_id.into()))?;
                worker.last_seen = Instant::now();
                let entry = state.jobs.get(job_id).ok_or_else(|| CoordinatorError::JobNotFound(job_id.into()))?;
                let plan = entry.job.plan.clone().unwrap_or_default();
                let Some(group) =
                    entry.group.as_ref().filter(|g| g.generation == generation && !is_terminal(entry.job.state))
                else {
                    return Ok(stop);
                };
                let Some(rank) = group.members.iter().position(|m| m == worker_id) else { return Ok(stop) };
                match group.step {
                    None => true,
                    Some(step) if step >= plan.steps => return Ok(stop),
                    Some(_) if group.reported[rank] => false,
                    Some(_) => {
                        let (step, units) = state
                            .work_for(job_id, rank)
                            .ok_or_else(|| CoordinatorError::Store("work units unavailable".into()))?;
                        let checkpoint = (step + 1) % plan.checkpoint_interval.max(1) == 0 || step + 1 >= plan.steps;
                        return Ok(crate::work::step_work(step, units, checkpoint));
                    }
                }
            };
            if need_position {
                let (next, discarded) = self.ledger_position(job_id).await?;
                let effects = {
                    let mut state = self.lock();
                    let mut done = false;
                    if let Some(entry) = state.jobs.get_mut(job_id)
                        && let Some(group) =
                            entry.group.as_mut().filter(|g| g.generation == generation && g.step.is_none())
                    {
                        let progress = entry.job.progress.get_or_insert_with(Default::default);
                        progress.steps_discarded = progress.steps_discarded.max(discarded);
                        let step = next.max(progress.step);
                        group.step = Some(step);
                        entry.version += 1;
                        done = step >= entry.job.plan.as_ref().map_or(0, |p| p.steps);
                    }
                    if done {
                        // Every planned step was charged before a restart: nothing left to run.
                        state.finish(
                            job_id,
                            JobState::Succeeded,
                            "Succeeded",
                            "all planned steps were already charged".into(),
                        )
                    } else {
                        Effects::default()
                    }
                };
                self.apply(effects).await?;
                continue;
            }
            // Wait for the other ranks (or a re-formation); wake periodically to renew the lease.
            tokio::select! {
                _ = tokio::time::timeout(Duration::from_secs(5), changed.changed()) => {}
                _ = draining.changed() => {}
            }
        }
    }

    /// Records one rank's report of the current step.
    pub async fn report(
        &self,
        worker_id: &str,
        job_id: &str,
        generation: u64,
        step: u64,
        report: Report,
    ) -> Result<(), CoordinatorError> {
        let effects = {
            let mut state = self.lock();
            let worker =
                state.workers.get_mut(worker_id).ok_or_else(|| CoordinatorError::WorkerNotFound(worker_id.into()))?;
            worker.last_seen = Instant::now();
            let Some(rank) = state.reporting_rank(job_id, worker_id, generation, step)? else {
                return Ok(()); // already counted, or the job already ended
            };
            tracing::debug!(job_id, step, rank, outcome = ?report.outcome, "step reported");
            state.report(job_id, rank, &report)
        };
        self.apply(effects).await
    }

    /// Text for `/metrics`.
    pub fn render_metrics(&self) -> String {
        crate::metrics::render(&self.lock())
    }
}

/// A user-level job's clients, read again from its pinned dataset; None for other jobs.
async fn restore_clients(job: &Job) -> Result<Option<Arc<Vec<Vec<u64>>>>, CoordinatorError> {
    let (Some(spec), Some(plan)) = (&job.spec, &job.plan) else { return Ok(None) };
    let Some(k) = crate::spec::users_per_client(spec) else { return Ok(None) };
    let (_, clients) = dataset::read_clients(&spec.dataset, &plan.dataset_digest, k).await?;
    if clients.len() as u64 != plan.clients {
        return Err(CoordinatorError::invalid(
            "dataset",
            format!("{} clients now, the job was planned on {}", clients.len(), plan.clients),
        ));
    }
    Ok(Some(Arc::new(clients)))
}

fn entry_for(job: Job, private: &Private, clients: Option<Arc<Vec<Vec<u64>>>>) -> Result<JobEntry, CoordinatorError> {
    let plan = job.plan.clone().unwrap_or_default();
    let secret: JobSecret = private.job_secret()?;
    // The sampler's N is the accounting N: clients for a user-level job (the plan says so even
    // while its user table is unreadable), else examples.
    let units = if plan.clients > 0 { plan.clients } else { plan.examples };
    let sampler = PoissonSampler::new(secret, units, plan.sample_rate)
        .map_err(|e| CoordinatorError::invalid("sample_rate", e.to_string()))?;
    Ok(JobEntry {
        job,
        sampler,
        layout: dpcap_proto::index::Layout::from_counts(&private.shard_counts),
        clients,
        group: None,
        phase_seconds: [0.0; 5],
        phase_reports: 0,
        version: 0,
    })
}
