//! Submitting a job: everything that can be checked is checked here, before the job exists —
//! the spec's fields, the dataset's index, the init source, the tokenizer (pinned by digest),
//! the calibration, and at the accountant the contract itself, the dataset's budget for the
//! job's privacy unit and whether the remaining budget covers the plan. A job that is accepted
//! is registered with the accountant before any worker sees it.

use std::sync::Arc;

use dpcap_privacy::contract::PrivacyContract;
use dpcap_proto::contract::contract_to_proto;
use dpcap_proto::v1::{Job, JobSpec, JobState, Plan, Progress, Reduction};

use crate::coordinator::Coordinator;
use crate::dataset;
use crate::error::CoordinatorError;
use crate::init::InitSource;
use crate::plan::Population;
use crate::registration::{self, Provenance};
use crate::state::{condition, now_ms};
use crate::store::random_bytes;
use crate::store::{Private, hex};

/// A spec resolved against its dataset: what the job will be, with nothing written yet.
struct Planned {
    spec: JobSpec,
    plan: Plan,
    /// The job's contract (the plan carries it in the wire's form once the job is recorded).
    contract: PrivacyContract,
    /// Examples per shard, in shard order.
    counts: Vec<u64>,
    /// A user-level job's clients.
    clients: Option<Arc<Vec<Vec<u64>>>>,
    init: Option<InitSource>,
    /// Whether the dataset's index pins its shards' bytes.
    pins_bytes: bool,
}

impl Coordinator {
    /// Validates, calibrates, registers and queues a job; a repeated idempotency key returns
    /// the original.
    pub async fn submit(&self, spec: JobSpec, idempotency_key: &str) -> Result<Job, CoordinatorError> {
        let planned = plan_job(spec).await?;
        let job_id = format!("job-{}", hex(&random_bytes::<6>()));
        if !idempotency_key.is_empty()
            && let Some(existing) = self.store.claim_key(idempotency_key, &job_id).await?
        {
            return self.get(&existing);
        }
        let mut planned = planned;
        if let Some(source) = planned.init.clone() {
            self.check_init_source(&source, &mut planned).await?;
        }
        let Planned { spec, mut plan, contract, counts, clients, init, pins_bytes } = planned;
        // The record's contract, in the wire's form, as the init check left it.
        plan.contract = Some(contract_to_proto(&contract));
        let mut job = Job {
            job_id: job_id.clone(),
            state: JobState::Pending as i32,
            created_unix_ms: now_ms(),
            checkpoint_root: format!("{}/jobs/{job_id}/checkpoints", self.config.store_url.trim_end_matches('/')),
            progress: Some(Progress { steps_total: contract.planned_steps, ..Default::default() }),
            spec: Some(spec),
            plan: Some(plan),
            conditions: vec![],
            reduction: Reduction::Unspecified as i32,
        };
        describe(&mut job, &contract, init.as_ref());
        if !pins_bytes {
            let note = "the dataset's index (version 2) pins its tables, not its shards' bytes: a shard changed \
                        since indexing would be read; re-index it (dpctl dataset index) to pin them";
            condition(&mut job, "Warning", "ShardsNotPinned", note);
        }
        // The record first, then the contract at the accountant: a crash between them leaves a
        // record the accountant does not know (its job fails at restore, reserving nothing),
        // never a registration without a record (which would reserve its plan for good). A
        // refused registration takes the record back. One whose answer never came (the
        // accountant may have written it) is suspended there, and its secret is kept, so that a
        // restore suspends it again if this fails too: it never reserves its plan for good.
        let private = Private { secret: hex(&random_bytes::<32>()), shard_counts: counts };
        self.store.put_private(&job_id, &private).await?;
        self.store.put_job(&job).await?;
        if let Err(e) = self.register(&job).await {
            if e.is_permanent() {
                self.store.delete_job(&job_id).await;
            } else {
                self.store.delete_record(&job_id).await;
                self.suspend_unanswered(&job_id).await;
            }
            return Err(e);
        }
        tracing::info!(job_id, "job submitted");
        self.enqueue(job, &private, clients).await?;
        self.get(&job_id)
    }
}

impl Coordinator {
    /// The init source's checkpoint manifest is written by a worker, so it vouches for nothing:
    /// the ledger says what the weights are. A manifest that claims DP weights of a job the
    /// accountant does not know is refused (nothing composes its spend, and nothing shows the
    /// weights were trained with DP); one that claims NOT PRIVATE weights was already held to
    /// `init_public` ([`crate::init::check`]). A ledger that cannot be read now refuses the
    /// submit as unavailable (retry), never lets it through.
    ///
    /// Whether the source trained on this job's data is the ledger's word too (the contracts'
    /// `budget_id`, so a copy or re-index counts as the same data): NOT PRIVATE weights of it
    /// never start a DP job, and a DP source's spend always composes into the job's ε.
    async fn check_init_source(&self, source: &InitSource, planned: &mut Planned) -> Result<(), CoordinatorError> {
        let mut client = self.accountant.clone();
        let spend = match client.get_spend(&source.job_id).await {
            Ok(spend) => spend,
            Err(e) if e.status == tonic::Code::NotFound => {
                if !source.is_private() {
                    return Ok(());
                }
                return Err(CoordinatorError::invalid(
                    "init_from",
                    format!(
                        "the checkpoint's manifest says job {} trained it with {}, but the accountant knows no such \
                         job: nothing vouches for that (a manifest is written by a worker); start from a checkpoint \
                         of a job this cluster ran",
                        source.job_id, source.privacy
                    ),
                ));
            }
            Err(e) => {
                let context = format!("reading the ledger of init_from's job {}: ", source.job_id);
                return Err(CoordinatorError::accountant(context, e));
            }
        };
        let Some(contract) = spend.contract else {
            return Err(CoordinatorError::invalid(
                "init_from",
                format!("the ledger holds no contract of job {}", source.job_id),
            ));
        };
        let contract = dpcap_proto::contract::contract_from_proto(contract)?;
        if contract.mode.kind() != source.privacy
            || (!source.dataset.is_empty() && contract.dataset_id != source.dataset)
        {
            return Err(CoordinatorError::invalid(
                "init_from",
                format!(
                    "the checkpoint's manifest says job {} was {} on {:?}, its ledger says {} on {}: the manifest was altered",
                    source.job_id,
                    source.privacy,
                    source.dataset,
                    contract.mode.name(),
                    contract.dataset_id
                ),
            ));
        }
        let job = &mut planned.contract;
        if !job.mode.is_private() || contract.budget_id() != job.budget_id() || contract.unit != job.unit {
            return Ok(());
        }
        if !contract.mode.is_private() {
            return Err(CoordinatorError::invalid(
                "init_from",
                format!(
                    "job {} trained NOT PRIVATE weights on this job's own data ({}, by the ledger): they would void \
                     its guarantee",
                    source.job_id,
                    job.budget_id()
                ),
            ));
        }
        if job.init_from_job.is_none() {
            job.init_from_job = Some(source.job_id.clone());
        }
        Ok(())
    }
}

/// Everything a job is checked against, read and computed, in one pass of typed stages (spec,
/// checked spec, plan and terms, contract); no side effects.
async fn plan_job(spec: JobSpec) -> Result<Planned, CoordinatorError> {
    let choices = dpcap_proto::contract::SpecChoices::decode(&spec)?;
    let checked = crate::spec::check_choices(&spec, choices)?;
    let layout = dataset::read_layout(&spec.dataset).await?;
    // User-level objectives sample and account clients, not examples.
    let users = match crate::spec::users_per_client(&checked) {
        Some(k) => Some(dataset::read_clients(&spec.dataset, &layout.digest, k).await?),
        None => None,
    };
    let init = crate::init::check(&checked, &layout.digest).await?;
    let examples = layout.layout.examples();
    let population = match &users {
        // δ defaults to 1/N_users, the privacy unit's count (never the larger 1/N_clients of
        // virtual clients).
        Some(u) => Population { units: u.clients.len() as u64, default_delta: 1.0 / u.users.max(1) as f64 },
        None => Population::of(examples),
    };
    let (checked, planned) = tokio::task::spawn_blocking(move || {
        let planned = crate::plan::plan(&checked, population);
        (checked, planned)
    })
    .await
    .map_err(|source| CoordinatorError::Task { what: "planning", source })?;
    let (mut plan, terms) = planned?;
    if let Some(users) = &users {
        (plan.examples, plan.clients, plan.users) = (examples, users.clients.len() as u64, users.users);
    }
    plan.gradient_dim = registration::gradient_dim(&checked)?;
    if let Some(source) = &init {
        (plan.init_step, plan.init_privacy) = (source.step, source.privacy.name().to_owned());
    }
    if let Some((location, digest)) = registration::pin_tokenizer(&checked).await? {
        (plan.tokenizer, plan.tokenizer_digest) = (location, digest);
    }
    if matches!(checked.mode, crate::spec::ModeRequest::Dp { .. }) {
        dataset::check_examples(&spec.dataset, &layout).await?;
    }
    let provenance = Provenance {
        dataset_id: layout.digest,
        data_id: layout.data_id.unwrap_or_default(),
        shards_id: layout.shards_id.unwrap_or_default(),
        users_digest: users.as_ref().map(|u| u.users_digest.clone()),
        init: init.as_ref(),
    };
    let contract = registration::contract(&checked, &terms, provenance)?;
    let clients = users.map(|u| Arc::new(u.clients));
    Ok(Planned { spec, plan, contract, counts: layout.counts, clients, init, pins_bytes: layout.pins_bytes })
}

/// The conditions a new job starts with: what was accepted, where its weights come from, its
/// privacy mode, its calibration, and a warning when its plan passes its own target.
fn describe(job: &mut Job, contract: &PrivacyContract, init: Option<&InitSource>) {
    let plan = job.plan.clone().unwrap_or_default();
    let (q, steps) = (contract.mechanism.sample_rate, contract.planned_steps);
    let expected = dpcap_proto::plan::expected_batch_size(&plan, contract);
    let accepted = format!("N = {}, q = {q:.6}, L = {expected:.1}, {steps} steps", dpcap_proto::plan::units(&plan));
    condition(job, "Submitted", "Accepted", accepted);
    if let Some(source) = init {
        let from = format!("weights of job {} step {} ({})", source.job_id, source.step, source.privacy);
        condition(job, "Initialised", "InitFrom", from.clone());
        if !source.is_private() && contract.mode.is_private() {
            let stated = format!("{from} are NOT PRIVATE; init_public states they saw public or synthetic data only");
            condition(job, "Warning", "InitNotPrivate", stated);
        }
        if contract.init_from_job.is_some() {
            let note = format!("their epsilon composes with this job's in its status (epsilon_composed): {from}");
            condition(job, "Privacy", "ComposedWithInit", note);
        }
    }
    if let Some(notice) = dpcap_proto::plan::notice(&plan, contract) {
        // In every listing: the job's releases carry no guarantee.
        condition(job, "Privacy", "NotPrivate", notice);
    }
    let Some(target) = contract.epsilon_target else { return };
    let how = if plan.calibrated { "calibrated" } else { "fixed" };
    // The σ whose ε is reported: a simulation's target recipe's, else the job's own.
    let sigma = contract.epsilon_mechanism().map_or(contract.mechanism.noise_multiplier, |(_, _, sigma)| sigma);
    let calibrated = format!(
        "sigma = {sigma:.4} ({how}); epsilon {:.4} planned, target {target:.4} at delta {:.3e}",
        plan.epsilon_planned, contract.delta
    );
    condition(job, "Calibrated", if plan.calibrated { "Calibrated" } else { "Fixed" }, calibrated);
    if plan.epsilon_planned > target * (1.0 + 1e-9) {
        let warning = format!(
            "{steps} steps at sigma {sigma:.4} spend epsilon {:.4} > target {target:.4}: the job will end \
             BUDGET_EXHAUSTED",
            plan.epsilon_planned
        );
        condition(job, "Warning", "BudgetWillExhaust", warning);
    }
}
