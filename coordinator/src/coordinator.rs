//! The coordinator's API, shared by the gRPC services: each call takes the state lock for a
//! pure transition (never across an await), then persists the touched jobs, tells the
//! accountant about ended jobs, and wakes watchers and waiting ranks. Submitting is in
//! [`crate::submit`], the calls to the accountant in [`crate::accounting`].

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use dpcap_proto::client::{AccountantClient, CallCredentials};
use dpcap_proto::job::{BUDGET_REFUSED, is_terminal};
use dpcap_proto::v1::{Assignment, Job, JobState, Reduction, StepWork, step_work::Action};
use dpcap_serve::{Capabilities, Capability, StepGrant};

use crate::dataset;
use crate::error::CoordinatorError;
use crate::sampler::{JobSecret, PoissonSampler};
use crate::state::{AUDIT_REASONS, Effects, JobEntry, Report, State, WorkerEntry, condition};
use crate::store::{JobStore, Private, hex, random_bytes};

/// How the coordinator is set up.
#[derive(Debug, Clone)]
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
    pub accountant_token: Option<dpcap_proto::Secret>,
    /// A worker silent for this long is dropped and its job's group re-formed.
    pub lease: Duration,
    /// Signs the capabilities workers carry to the accountant (the accountant's keys).
    pub capabilities: Capabilities,
    /// How long a capability stays valid; workers renew theirs with every heartbeat.
    pub capability_ttl: Duration,
    /// Mint a new record key when the secrets store has none although jobs are held (every
    /// existing record is then refused): an operator's explicit choice, never a default.
    pub new_record_key: bool,
}

/// The coordinator.
#[derive(Debug)]
pub struct Coordinator {
    pub(crate) config: Config,
    pub(crate) store: JobStore,
    pub(crate) accountant: AccountantClient,
    state: Mutex<State>,
    pub(crate) changed: tokio::sync::watch::Sender<u64>,
    pub(crate) writes: tokio::sync::Mutex<()>,
    draining: tokio::sync::watch::Sender<bool>,
    /// Ended jobs' audits, as computed once (served to `dpctl audit` without a new scoring).
    pub(crate) audits: Mutex<std::collections::HashMap<String, dpcap_proto::v1::AuditReport>>,
    /// Itself, for the tasks that carry a transition's effects out (see [`Coordinator::apply`]).
    me: Weak<Coordinator>,
}

/// Ends a transition's effects, however they end (done, panicked, or dropped with the
/// runtime): its ended jobs are shown to watchers, and watchers and waiting ranks are woken.
struct Settle {
    coordinator: Arc<Coordinator>,
    jobs: Vec<String>,
}

impl Drop for Settle {
    fn drop(&mut self) {
        self.coordinator.lock().settled(&self.jobs);
        self.coordinator.changed.send_modify(|v| *v += 1);
    }
}

impl Coordinator {
    /// A coordinator over `store`, restoring every stored job: unfinished ones are queued
    /// again in submission order and resume from their stored position.
    pub async fn open(config: Config, store: JobStore) -> Result<Arc<Self>, CoordinatorError> {
        let endpoint = config
            .accountant_tls
            .endpoint(&config.accountant_endpoint)
            .map_err(|source| CoordinatorError::Endpoint { field: "accountant", source })?;
        let credentials = CallCredentials::token(config.accountant_token.clone());
        let accountant = AccountantClient::lazy(endpoint, credentials);
        let mut state = State::default();
        let (mut restored, refused) = store.load_all().await?;
        restored.sort_by_key(|(job, _)| (job.created_unix_ms, job.job_id.clone()));
        for (mut job, private) in restored {
            if state.jobs.contains_key(&job.job_id) {
                continue;
            }
            let checked = match is_terminal(job.state) {
                true => None,
                false => match revalidate(&job) {
                    Ok(checked) => Some(checked),
                    Err(e) => {
                        // A stored job is checked like a new spec: one a newer coordinator
                        // refuses never runs; the operator sees why.
                        condition(&mut job, "Failed", "InvalidSpec", format!("refused on restore: {e}"));
                        job.state = JobState::Failed as i32;
                        None
                    }
                },
            };
            let restored = match &checked {
                Some(checked) => restore_clients(&job, checked).await,
                None => Ok(None),
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
            let job_id = job.job_id.clone();
            match entry_for(job, &private, clients) {
                Ok(entry) => {
                    state.jobs.insert(job_id, entry);
                }
                Err(e) => {
                    // Sealed by this coordinator yet unusable (a contract a newer version
                    // refuses): it cannot run, and one such record must not stop the others.
                    state.queue.retain(|id| id != &job_id);
                    tracing::error!(job_id, error = %e, "stored job cannot be restored; left out");
                }
            }
        }
        tracing::info!(jobs = state.jobs.len(), queued = state.queue.len(), "job store restored");
        Ok(Arc::new_cyclic(|me| Self {
            me: me.clone(),
            accountant,
            config,
            store,
            state: Mutex::new(state),
            changed: tokio::sync::watch::channel(0).0,
            writes: tokio::sync::Mutex::new(()),
            draining: tokio::sync::watch::channel(false).0,
            audits: Mutex::default(),
        }))
        .inspect(|coordinator| {
            coordinator.audit_unaudited();
            coordinator.suspend_refused(refused);
        })
    }

    /// Suspends, in the background, the jobs whose records were refused at restore: they can
    /// never run from this store, and a suspended job reserves nothing of its dataset's budget
    /// and admits no capability. (A record copied under a new id names no registered job.)
    fn suspend_refused(self: &Arc<Self>, refused: Vec<String>) {
        for job_id in refused {
            let this = self.clone();
            tokio::spawn(async move {
                this.close_all(&[never_resumed(job_id, "its job record was refused at restore")]).await;
            });
        }
    }

    /// A submission whose registration got no answer (the accountant may have written it) is
    /// suspended there at once, best effort: a job it does not know is no error.
    pub(crate) async fn suspend_unanswered(&self, job_id: &str) {
        self.close_all(&[never_resumed(job_id.to_owned(), "its submission's registration got no answer")]).await;
    }

    /// Settles, in the background, every audited job that ended for good (SUCCEEDED or
    /// BUDGET_EXHAUSTED) but whose audit was never recorded: the coordinator stopped between
    /// its end and its audit, perhaps before closing it at the accountant (which audits only
    /// closed jobs), so it is closed again (idempotent) and then audited.
    fn audit_unaudited(self: &Arc<Self>) {
        let for_good = |state: i32| state == JobState::Succeeded as i32 || state == JobState::BudgetExhausted as i32;
        let unaudited: Vec<String> = self
            .lock()
            .jobs
            .values()
            .filter(|e| for_good(e.job.state) && e.job.spec.as_ref().is_some_and(|s| s.audit.is_some()))
            .filter(|e| !e.job.conditions.iter().any(|c| AUDIT_REASONS.contains(&c.reason.as_str())))
            .map(|e| e.job.job_id.clone())
            .collect();
        for job_id in unaudited {
            let this = self.clone();
            tokio::spawn(async move {
                let reason = "ended before the coordinator restarted".to_owned();
                let closing = crate::state::Closing { job_id: job_id.clone(), reason, resumable: false, generation: 0 };
                let _ = this.close_all(&[closing]).await;
                this.record_audit(&job_id).await;
                this.changed.send_modify(|v| *v += 1);
            });
        }
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

    /// Reads spends, persists, closes and notifies after a transition. The effects run on
    /// their own task, to the end, whatever becomes of the call that caused them: a caller
    /// that goes away (a worker whose session ended while its report of the final step was in
    /// flight) must not leave a job closed at the accountant but never shown as ended, nor
    /// its audit unrecorded.
    pub(crate) async fn apply(&self, effects: Effects) -> Result<(), CoordinatorError> {
        let ended: Vec<String> = effects.close.iter().map(|c| c.job_id.clone()).collect();
        let Some(this) = self.me.upgrade() else {
            // Only while the coordinator itself is being dropped: nobody is left to watch.
            self.lock().settled(&ended);
            return Err(CoordinatorError::Draining);
        };
        let settle = Settle { coordinator: this.clone(), jobs: ended };
        tokio::spawn(async move {
            let _settle = settle;
            this.carry_out(effects).await
        })
        .await
        .unwrap_or_else(|source| Err(CoordinatorError::Task { what: "a transition's effects", source }))
    }

    async fn carry_out(&self, effects: Effects) -> Result<(), CoordinatorError> {
        // Revocation first: a dissolved group's, a cancelled or ended job's capabilities stop
        // working before anything else happens (and before a cancel is acknowledged).
        self.revoke(&effects.fence).await;
        let (audits, unclosed) = self.close_all(&effects.close).await;
        // ε and the charged steps come from the ledger, read once nothing more can be charged
        // for an ended job, and before the record is written.
        for job_id in &effects.spend {
            if let Some(spend) = self.ledger_spend(job_id).await {
                self.lock().record_spend(job_id, &spend);
            }
        }
        let result = self.persist(&effects.persist).await;
        self.trim_all(&effects.trim).await;
        // A job that ended but that the accountant was not told of is reported (its capabilities
        // then stop only at their expiry), after everything else was carried out.
        let result = match (result, unclosed.first()) {
            (Ok(()), Some(job_id)) => Err(CoordinatorError::Unrevoked(job_id.clone())),
            (result, _) => result,
        };
        // An audited job's audit is in its conditions before any watcher sees it ended.
        for job_id in &audits {
            self.record_audit(job_id).await;
        }
        result
    }

    /// Records an ended job's audit as a condition, and persists it.
    async fn record_audit(&self, job_id: &str) {
        let (kind, reason, message) = self.audit_condition(job_id).await;
        tracing::info!(job_id, reason, message, "audit");
        let snapshot = self.lock().jobs.get_mut(job_id).map(|entry| {
            condition(&mut entry.job, kind, reason, message);
            entry.version += 1;
            entry.job.clone()
        });
        if let Some(job) = snapshot {
            let _serial = self.writes.lock().await;
            if let Err(e) = self.store.put_job(&job).await {
                tracing::warn!(job_id, error = %e, "could not persist the audit condition");
            }
        }
    }

    async fn persist(&self, jobs: &[String]) -> Result<(), CoordinatorError> {
        let _serial = self.writes.lock().await;
        for job_id in jobs {
            let snapshot = self.lock().jobs.get(job_id).map(|e| e.job.clone());
            if let Some(job) = snapshot {
                self.store.put_job(&job).await?;
            }
        }
        Ok(())
    }

    /// Queues a new job and schedules.
    pub(crate) async fn enqueue(
        &self,
        job: Job,
        private: &Private,
        clients: Option<Arc<Vec<Vec<u64>>>>,
    ) -> Result<(), CoordinatorError> {
        let job_id = job.job_id.clone();
        let effects = {
            let mut state = self.lock();
            state.jobs.insert(job_id.clone(), entry_for(job, private, clients)?);
            state.queue.push_back(job_id.clone());
            state.warn_short(&job_id);
            state.schedule()
        };
        self.apply(effects).await
    }

    /// One job, with its place in the queue while it waits.
    pub fn get(&self, job_id: &str) -> Result<Job, CoordinatorError> {
        self.lock().view(job_id).ok_or_else(|| CoordinatorError::JobNotFound(job_id.into()))
    }

    /// Every job, oldest first.
    pub fn list(&self) -> Vec<Job> {
        let state = self.lock();
        let mut jobs: Vec<Job> = state.jobs.keys().filter_map(|id| state.view(id)).collect();
        jobs.sort_by_key(|j| (j.created_unix_ms, j.job_id.clone()));
        jobs
    }

    /// The job's version and record as watchers may see them: None while its end settles
    /// (see [`JobEntry::settling`]).
    pub fn snapshot(&self, job_id: &str) -> Result<Option<(u64, Job)>, CoordinatorError> {
        let state = self.lock();
        let entry = state.jobs.get(job_id).ok_or_else(|| CoordinatorError::JobNotFound(job_id.into()))?;
        Ok(entry.shown().map(|(version, job)| (version, job.clone())))
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
    /// Its spec is checked again like a new one's, and its remaining plan is admitted by the
    /// accountant before the answer (its next generation opens there): a resume its dataset's
    /// budget cannot cover is refused now, with the budget's figures, never said yes to and
    /// failed later.
    pub async fn resume(&self, job_id: &str) -> Result<Job, CoordinatorError> {
        let (job, checked, missing) = {
            let state = self.lock();
            let entry = state.jobs.get(job_id).ok_or_else(|| CoordinatorError::JobNotFound(job_id.into()))?;
            resumable(entry)?;
            (entry.job.clone(), revalidate(&entry.job)?, entry.clients.is_none())
        };
        if missing
            && let Some(clients) = restore_clients(&job, &checked).await?
            && let Some(entry) = self.lock().jobs.get_mut(job_id)
        {
            entry.clients = Some(clients);
        }
        let next = job.progress.as_ref().map_or(0, |p| p.generation) + 1;
        self.fence(&job, next, true).await?;
        let effects = {
            let mut state = self.lock();
            let entry = state.jobs.get(job_id).ok_or_else(|| CoordinatorError::JobNotFound(job_id.into()))?;
            resumable(entry)?;
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

    /// Registers a worker and schedules queued jobs onto it. Returns its id and its key, the
    /// secret its later calls carry.
    pub async fn register_worker(&self, name: String, device: String) -> Result<(String, String), CoordinatorError> {
        if name.is_empty() {
            return Err(CoordinatorError::invalid("name", "a worker needs a name"));
        }
        let worker_id = format!("w-{}", hex(&random_bytes::<4>()));
        let key = hex(&random_bytes::<32>());
        tracing::info!(worker_id, name, device, "worker registered");
        let effects = {
            let mut state = self.lock();
            state.workers.insert(
                worker_id.clone(),
                WorkerEntry { name, device, last_seen: Instant::now(), job: None, key: key.clone() },
            );
            state.schedule()
        };
        self.apply(effects).await?;
        Ok((worker_id, key))
    }

    /// Refuses a WorkerService call whose key is not the one `worker_id` registered with.
    pub fn authenticate(&self, worker_id: &str, key: &str) -> Result<(), CoordinatorError> {
        let state = self.lock();
        let worker = state.workers.get(worker_id).ok_or_else(|| CoordinatorError::WorkerNotFound(worker_id.into()))?;
        let same = worker.key.len() == key.len()
            && worker.key.bytes().zip(key.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
        if same { Ok(()) } else { Err(CoordinatorError::WorkerKey(worker_id.into())) }
    }

    /// A capability for `rank` of the job's current generation, valid for the TTL; for one
    /// step (`Some`), it also states the step, the units sampled for it and the units of the
    /// part this rank sends (its own share, or the whole step's when one part carries the
    /// group's NCCL sum).
    fn capability(&self, entry: &JobEntry, rank: usize, step: Option<u64>) -> String {
        let Some(group) = entry.group.as_ref() else { return String::new() };
        let parts = if entry.job.reduction == Reduction::Nccl as i32 { 1 } else { group.members.len() as u32 };
        let expires = std::time::SystemTime::now() + self.config.capability_ttl;
        self.config.capabilities.issue(&Capability {
            job_id: entry.job.job_id.clone(),
            rank: rank as u32,
            generation: group.generation,
            group: group.nonce,
            parts,
            expires_unix_ms: expires.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
            step: step.map(|step| StepGrant {
                step,
                sampled: group.sampled,
                units: if parts == 1 { group.sampled } else { group.shares.get(rank).copied().unwrap_or(0) },
            }),
        })
    }

    /// Renews a lease and returns the worker's assignment, if it has one, with a fresh
    /// capability.
    pub fn heartbeat(&self, worker_id: &str) -> Result<Option<Assignment>, CoordinatorError> {
        let mut state = self.lock();
        let worker =
            state.workers.get_mut(worker_id).ok_or_else(|| CoordinatorError::WorkerNotFound(worker_id.into()))?;
        worker.last_seen = Instant::now();
        let Some(job_id) = worker.job.clone() else { return Ok(None) };
        let Some(entry) = state.jobs.get(&job_id) else { return Ok(None) };
        let Some(group) = entry.group.as_ref() else { return Ok(None) };
        // Only a member of the group gets its assignment (and a capability).
        let Some(rank) = group.members.iter().position(|m| m == worker_id) else { return Ok(None) };
        // Renewed every beat: it carries the current step's grant once the step's work exists,
        // so that a part sent after a step of any length has a capability that has not expired.
        let step = group.step.filter(|_| group.work.is_some());
        Ok(Some(Assignment {
            capability: self.capability(entry, rank, step),
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
                let planned_steps = entry.contract.planned_steps;
                let Some(group) =
                    entry.group.as_ref().filter(|g| g.generation == generation && !is_terminal(entry.job.state))
                else {
                    return Ok(stop);
                };
                let Some(rank) = group.members.iter().position(|m| m == worker_id) else { return Ok(stop) };
                match group.step {
                    None => true,
                    Some(step) if step >= planned_steps => return Ok(stop),
                    Some(_) if group.reported[rank] => false,
                    Some(_) => {
                        let (step, units) = state.work_for(job_id, rank).ok_or_else(|| {
                            CoordinatorError::Invariant(format!("job {job_id}: work units unavailable"))
                        })?;
                        let checkpoint = (step + 1) % plan.checkpoint_interval.max(1) == 0 || step + 1 >= planned_steps;
                        let capability =
                            state.jobs.get(job_id).map(|e| self.capability(e, rank, Some(step))).unwrap_or_default();
                        return Ok(StepWork { capability, ..crate::work::step_work(step, units, checkpoint) });
                    }
                }
            };
            if need_position {
                self.position_group(job_id, generation).await?;
                continue;
            }
            // Wait for the other ranks (or a re-formation); wake periodically to renew the lease.
            tokio::select! {
                _ = tokio::time::timeout(Duration::from_secs(5), changed.changed()) => {}
                _ = draining.changed() => {}
            }
        }
    }

    /// Starts a new group at the ledger's next step, never at a worker's word: the accountant
    /// is told the new generation first (older ones are refused from then on, and a suspended
    /// job opens to it), and the job's contract is checked against the ledger's. A refusal no
    /// retry can fix (a contract the ledger does not hold) fails the job with its reason. A
    /// job whose planned steps were all charged before a restart succeeds.
    async fn position_group(&self, job_id: &str, generation: u64) -> Result<(), CoordinatorError> {
        let job = self.get(job_id)?;
        let spend = match self.fence(&job, generation, true).await {
            Ok(spend) => spend,
            Err(e) if e.is_permanent() => {
                let effects = {
                    let mut state = self.lock();
                    let current = state.jobs.get(job_id).and_then(|e| e.group.as_ref()).map(|g| g.generation);
                    if current != Some(generation) {
                        return Ok(());
                    }
                    // FAILED either way (a raised budget lets it resume), but a budget's refusal
                    // says so in its reason: `dpctl wait` tells it apart (exit 5).
                    let reason = if e.is_budget() { BUDGET_REFUSED } else { "Refused" };
                    state.finish(job_id, JobState::Failed, reason, format!("the accountant refused the job: {e}"))
                };
                return self.apply(effects).await;
            }
            Err(e) => return Err(e),
        };
        let effects = {
            let mut state = self.lock();
            let mut done = false;
            if let Some(entry) = state.jobs.get_mut(job_id)
                && let Some(group) = entry.group.as_mut().filter(|g| g.generation == generation && g.step.is_none())
            {
                let progress = entry.job.progress.get_or_insert_with(Default::default);
                progress.steps_discarded = progress.steps_discarded.max(spend.steps_discarded);
                let step = spend.next_step.max(progress.step);
                group.step = Some(step);
                entry.version += 1;
                done = step >= entry.contract.planned_steps;
            }
            if done {
                let message = "all planned steps were already charged".into();
                state.finish(job_id, JobState::Succeeded, "Succeeded", message)
            } else {
                Effects::default()
            }
        };
        self.apply(effects).await
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
        let report = self.confirm_exhaustion(job_id, report).await;
        let report = self.confirm_charged(job_id, step, report).await?;
        let effects = {
            let mut state = self.lock();
            let worker =
                state.workers.get_mut(worker_id).ok_or_else(|| CoordinatorError::WorkerNotFound(worker_id.into()))?;
            worker.last_seen = Instant::now();
            let failed = report.outcome != dpcap_proto::v1::StepOutcome::Done
                && report.outcome != dpcap_proto::v1::StepOutcome::Discarded;
            let Some(rank) = state.reporting_rank(job_id, worker_id, (generation, step), failed)? else {
                return Ok(()); // already counted, or the job already ended
            };
            tracing::debug!(job_id, step, rank, outcome = ?report.outcome, "step reported");
            state.report(job_id, rank, &report)
        };
        self.apply(effects).await
    }

    /// A rank's word that the budget is spent would end the job for good: it stands only if
    /// the accountant's ledger says so; otherwise the step failed (and the job may resume).
    /// The condition then says which budget refused (the job's or its dataset's), in the
    /// ledger's words, whichever rank reported.
    async fn confirm_exhaustion(&self, job_id: &str, report: Report) -> Report {
        if report.outcome != dpcap_proto::v1::StepOutcome::BudgetExhausted {
            return report;
        }
        let Ok(job) = self.get(job_id) else { return report };
        match self.spend(&job).await {
            Ok(spend) if spend.phase == dpcap_proto::v1::JobPhase::BudgetExhausted as i32 => {
                if spend.exhausted_by.is_empty() { report } else { Report { message: spend.exhausted_by, ..report } }
            }
            Ok(_) => Report {
                outcome: dpcap_proto::v1::StepOutcome::Failed,
                message: format!(
                    "a rank reported an exhausted budget the accountant does not confirm: {}",
                    report.message
                ),
                ..report
            },
            Err(e) => Report {
                outcome: dpcap_proto::v1::StepOutcome::Failed,
                message: format!("budget exhaustion reported but not confirmed ({e}): {}", report.message),
                ..report
            },
        }
    }

    /// A rank's word that `step` is done (or discarded) stands only if the ledger holds the
    /// step's charge: a step completes when it is charged, never on the ranks' word alone. A
    /// report of a step the ledger has not charged fails the job, naming it (no retry could
    /// make it true); a ledger that cannot be read now is an error the rank retries.
    async fn confirm_charged(&self, job_id: &str, step: u64, report: Report) -> Result<Report, CoordinatorError> {
        use dpcap_proto::v1::StepOutcome;
        if !matches!(report.outcome, StepOutcome::Done | StepOutcome::Discarded) {
            return Ok(report);
        }
        let Ok(job) = self.get(job_id) else { return Ok(report) };
        let spend = self.spend(&job).await?;
        if spend.next_step > step {
            return Ok(report);
        }
        tracing::error!(job_id, step, ledger_next = spend.next_step, "a rank reported an uncharged step done");
        Ok(Report {
            outcome: StepOutcome::Failed,
            message: format!(
                "reported step {step} {}, but the ledger holds no charge for it (its next step is {}): a step \
                 completes only once the accountant has charged it",
                if report.outcome == StepOutcome::Done { "done" } else { "discarded" },
                spend.next_step
            ),
            ..report
        })
    }

    /// Text for `/metrics`.
    pub fn render_metrics(&self) -> String {
        crate::metrics::render(&self.lock(), self.store.refused())
    }
}

/// Refuses to resume a job that is not FAILED or CANCELLED.
fn resumable(entry: &JobEntry) -> Result<(), CoordinatorError> {
    match JobState::try_from(entry.job.state) {
        Ok(JobState::Failed | JobState::Cancelled) => Ok(()),
        state => Err(CoordinatorError::Precondition {
            job_id: entry.job.job_id.clone(),
            state: state.map(|s| s.as_str_name()).unwrap_or("UNKNOWN").into(),
            reason: "only a FAILED or CANCELLED job can be resumed".into(),
        }),
    }
}

/// A stored job checked like a new one: its spec's fields (returned, typed) and, where it has
/// one, its contract.
fn revalidate(job: &Job) -> Result<crate::spec::Checked, CoordinatorError> {
    let spec = job.spec.as_ref().ok_or_else(|| CoordinatorError::invalid("spec", "missing"))?;
    let checked = crate::spec::check_fields(spec)?;
    if let Some(contract) = job.plan.as_ref().and_then(|p| p.contract.clone()) {
        dpcap_proto::contract::contract_from_proto(contract)?;
    }
    Ok(checked)
}

/// A user-level job's clients, read again from its pinned dataset; None for other jobs.
async fn restore_clients(
    job: &Job,
    checked: &crate::spec::Checked,
) -> Result<Option<Arc<Vec<Vec<u64>>>>, CoordinatorError> {
    let (Some(spec), Some(plan)) = (&job.spec, &job.plan) else { return Ok(None) };
    let Some(k) = crate::spec::users_per_client(checked) else { return Ok(None) };
    let dataset_id = dpcap_proto::plan::contract(plan)?.dataset_id;
    let clients = dataset::read_clients(&spec.dataset, &dataset_id, k).await?.clients;
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
    let contract = dpcap_proto::plan::contract(&plan)?;
    let secret: JobSecret = private.job_secret()?;
    // The sampler's N is the accounting N: clients for a user-level job (the plan says so even
    // while its user table is unreadable), else examples; q is the contract's.
    let sampler = PoissonSampler::new(secret, dpcap_proto::plan::units(&plan), contract.mechanism.sample_rate)
        .map_err(CoordinatorError::Sampler)?;
    Ok(JobEntry {
        job,
        contract,
        sampler,
        layout: dpcap_dataset::index::Layout::from_counts(&private.shard_counts),
        clients,
        group: None,
        phase_seconds: [0.0; 5],
        phase_reports: 0,
        version: 0,
        held: Default::default(),
        requeued_at: None,
        settling: 0,
    })
}

/// A suspension past any generation the job had: it never resumes from this coordinator's
/// records, and it reserves nothing of its dataset's budget.
fn never_resumed(job_id: String, reason: &str) -> crate::state::Closing {
    crate::state::Closing { job_id, reason: reason.to_owned(), resumable: true, generation: u64::from(u32::MAX) }
}
