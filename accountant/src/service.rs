//! `dpcap.v1.AccountantService` over the accountant core: converts messages, streams parts in
//! and releases out, and maps every error through [`dpcap_proto::to_status`].

use std::pin::Pin;
use std::sync::Arc;

use dpcap_proto::client::CAPABILITY_HEADER;
use dpcap_proto::contract::{contract_from_proto, contract_to_proto, kind_from_proto, kind_to_proto, unit_is_user};
use dpcap_proto::to_status;
use dpcap_proto::v1::accountant_service_server::AccountantService;
use dpcap_proto::v1::{
    self as pb, AttachJobRequest, AuditJobRequest, AuditReport, CloseJobRequest, EstimateRequest, EstimateResponse,
    FenceJobRequest, FetchReleaseRequest, GetDatasetBudgetRequest, GetSpendRequest, GradientChunk, JobSpend,
    LocalEndpoint, LocalEndpointRequest, RegisterJobRequest, RegisterJobResponse, ReleaseChunk,
    SetDatasetBudgetRequest, SubmitPartResponse, TrimReleasesRequest,
};
use dpcap_serve::capability::{Capabilities, Capability, CapabilityError, StepGrant, now_unix_ms};
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

use crate::core::{Accountant, DatasetView};
use crate::datasets::BudgetSetting;
use crate::error::AccountantError;
use crate::job::{Attempt, Job, MAX_ATTEMPT, Part, PartAssembler, Phase, StreamSlot};
use crate::privacy::{self, AccountantKind, EpsilonCurve};
use crate::records::{BudgetKey, Registration};
use crate::release::Release;

/// Default values per release chunk: 1048576 f32 = 4 MiB, half the 8 MiB message limit
/// ([`dpcap_proto::client::MAX_MESSAGE_BYTES`]): few messages, each a zero-copy slice.
pub const DEFAULT_CHUNK_VALUES: usize = 1 << 20;
/// Largest chunk a client may ask for (6 MiB of values, under the message limit).
pub const MAX_CHUNK_VALUES: usize = 3 << 19;

/// The gRPC face of an [`Accountant`]: it also checks the capability a worker's calls carry.
#[derive(Debug, Clone)]
pub struct AccountantGrpc {
    accountant: Arc<Accountant>,
    capabilities: Capabilities,
    /// The same-host socket this accountant offers (GetLocalEndpoint), if any.
    local: LocalEndpoint,
}

/// A part whose header passed every check, ready for its bytes: its job, its assembler, and
/// its stream's slot (a newer stream of the same part supersedes it).
pub(crate) struct OpenPart {
    pub(crate) job: Arc<Job>,
    pub(crate) assembler: PartAssembler,
    pub(crate) slot: StreamSlot,
}

/// The capability text a gRPC call carries ("" without one).
fn capability_text(metadata: &MetadataMap) -> &str {
    metadata.get(CAPABILITY_HEADER).and_then(|v| v.to_str().ok()).unwrap_or_default()
}

impl AccountantGrpc {
    /// Serves `accountant`, accepting capabilities `capabilities` verifies.
    pub fn new(accountant: Arc<Accountant>, capabilities: Capabilities) -> Self {
        Self { accountant, capabilities, local: LocalEndpoint::default() }
    }

    /// Offers the same-host socket `local` to the ranks that ask.
    pub fn with_local(mut self, local: LocalEndpoint) -> Self {
        self.local = local;
        self
    }

    /// The capability `request` carries, verified and scoped to `job` and its newest generation.
    async fn capability(&self, metadata: &MetadataMap, job: &Job) -> Result<Capability, AccountantError> {
        self.verify(capability_text(metadata), job).await
    }

    /// A capability's text, verified (signature, expiry) and scoped to `job`, a generation it
    /// still admits, and a job it has not suspended.
    async fn verify(&self, text: &str, job: &Job) -> Result<Capability, AccountantError> {
        let capability = self.capabilities.verify(text, now_unix_ms())?;
        let out_of_scope = |reason: String| CapabilityError::OutOfScope {
            job_id: capability.job_id.clone(),
            rank: capability.rank,
            generation: capability.generation,
            reason,
        };
        if capability.job_id != job.registration.job_id {
            return Err(out_of_scope(format!("the call is for job {}", job.registration.job_id)).into());
        }
        // Generations are attempts: a huge one would make every legitimate part stale.
        if capability.generation > MAX_ATTEMPT {
            return Err(AccountantError::invalid(
                "attempt",
                format!("{} exceeds {MAX_ATTEMPT}", capability.generation),
            ));
        }
        if let Err(reason) = self.accountant.admit_generation(job, capability.generation).await {
            let (job_id, generation) = (capability.job_id.clone(), capability.generation);
            return Err(AccountantError::Revoked { job_id, generation, reason });
        }
        Ok(capability)
    }

    /// The capability of a part: its step's (the first chunk's `step_capability`, else the
    /// call's), which must state this step and the units the coordinator sampled for it.
    async fn part_capability(
        &self,
        call_capability: &str,
        first: &GradientChunk,
        job: &Job,
    ) -> Result<(Capability, StepGrant), AccountantError> {
        let capability = match first.step_capability.is_empty() {
            true => self.verify(call_capability, job).await?,
            false => self.verify(&first.step_capability, job).await?,
        };
        let scope = |reason: String| CapabilityError::OutOfScope {
            job_id: capability.job_id.clone(),
            rank: capability.rank,
            generation: capability.generation,
            reason,
        };
        if capability.generation != first.attempt || capability.rank != first.part {
            return Err(scope(format!("the part is part {} of attempt {}", first.part, first.attempt)).into());
        }
        match capability.step {
            Some(grant) if grant.step == first.step => Ok((capability.clone(), grant)),
            Some(grant) => {
                Err(scope(format!("it is step {}'s; the part is of step {}", grant.step, first.step)).into())
            }
            None => Err(scope(format!(
                "a part needs its step's capability (StepWork.capability, which states the units sampled for step {})",
                first.step
            ))
            .into()),
        }
    }

    /// Checks a part's first chunk (or the same-host header) and its capability, before a byte
    /// of the part is kept: nothing is charged on a part refused here.
    pub(crate) async fn open_part(
        &self,
        call_capability: &str,
        first: &GradientChunk,
    ) -> Result<OpenPart, AccountantError> {
        let job = self.accountant.job(&first.job_id)?;
        let (capability, grant) = self.part_capability(call_capability, first, &job).await?;
        let attempt = Attempt {
            generation: first.attempt,
            parts: capability.parts,
            group: capability.group,
            sampled: grant.sampled,
            units: grant.units,
        };
        let slot = job.open_stream(first.part);
        let assembler = PartAssembler::new(&job, first.step, first.part, attempt, &self.accountant.blocks)?;
        Ok(OpenPart { job, assembler, slot })
    }

    /// How long a part stream may wait for its next bytes.
    pub(crate) fn part_idle(&self) -> std::time::Duration {
        self.accountant.policy.part_idle
    }

    /// Charges and releases a complete part's step once all its parts are in.
    pub(crate) async fn release_part(&self, job: &Arc<Job>, part: Part) -> Result<SubmitPartResponse, AccountantError> {
        let (step, part_index) = (part.step, part.part);
        // The release (charge, noise, stored release, progress) must run to its end even if the
        // client goes away mid-call: tonic drops a cancelled handler's future, which would leave
        // a durable charge without its release and a ledger position that never moved. A task
        // of its own is not dropped with the request.
        let (accountant, for_task) = (self.accountant.clone(), job.clone());
        let outcome = tokio::spawn(async move { accountant.submit_part(&for_task, part).await })
            .await
            .map_err(|source| AccountantError::Task { what: "part", source })?
            .inspect_err(|e| {
                tracing::warn!(job_id = %job.registration.job_id, step, part = part_index, error = %e, "part refused");
            })?;
        Ok(SubmitPartResponse {
            job_id: job.registration.job_id.clone(),
            step,
            parts_received: outcome.received,
            parts_expected: outcome.expected,
            released: outcome.released,
            accepted_new: outcome.accepted_new,
        })
    }

    /// The release of `step` of `job_id` once it exists, for a rank whose capability admits it.
    pub(crate) async fn release_of(
        &self,
        job_id: &str,
        call_capability: &str,
        step: u64,
    ) -> Result<(Arc<Job>, Arc<Release>), AccountantError> {
        let job = self.accountant.job(job_id)?;
        let capability = self.verify(call_capability, &job).await?;
        let release = self.accountant.wait_release(&job, step, capability.generation).await?;
        Ok((job, release))
    }
}

/// A part stream cut off before its end (`limit` names what cut it).
pub(crate) fn cut_off(job: &Job, part: u32, limit: &'static str, reason: String) -> AccountantError {
    AccountantError::PartStream { job_id: job.registration.job_id.clone(), part, limit, reason }
}

/// A part stream that sent nothing for `idle`.
pub(crate) fn idle_cut(job: &Job, part: u32, idle: std::time::Duration) -> AccountantError {
    cut_off(job, part, "part_idle", format!("no chunk for {} s (--part-idle-seconds)", idle.as_secs()))
}

/// A part stream a newer stream of the same part replaced.
pub(crate) fn superseded(job: &Job, part: u32) -> AccountantError {
    cut_off(job, part, "one_stream_per_part", "a newer stream of the same part took its place".into())
}

/// The release's spend, sent with its first bytes.
pub(crate) fn release_spend(job: &Job, release: &Release) -> JobSpend {
    JobSpend { epsilon_spent: release.epsilon_after, ..spend(job) }
}

/// A release that could not be stored: its step stays spent and is never released.
pub(crate) fn release_lost(job: &Job, step: u64) -> AccountantError {
    AccountantError::refused(
        &job.registration.job_id,
        step,
        dpcap_proto::ErrorCode::ReleaseDiscarded,
        "the release could not be stored; the step is discarded (stays spent)",
    )
}

fn registration_from_proto(request: RegisterJobRequest) -> Result<Registration, AccountantError> {
    let contract = request.contract.ok_or_else(|| AccountantError::invalid("contract", "is required"))?;
    Ok(Registration {
        job_id: request.job_id,
        contract: contract_from_proto(contract)?,
        gradient_dim: request.gradient_dim,
        insecure_noise_seed: request.insecure_noise_seed,
        legacy: false,
    })
}

/// The budget a request names: its dataset and unit.
fn budget_key(dataset_id: String, unit: i32) -> Result<BudgetKey, AccountantError> {
    let unit = if unit_is_user(unit)? { "user" } else { "example" };
    Ok(BudgetKey { dataset_id, unit: unit.to_owned() })
}

/// The job's spend as a message (`epsilon_composed` is the job's own ε; GetSpend composes).
pub fn spend(job: &Job) -> JobSpend {
    let r = &job.registration;
    let c = &r.contract;
    let p = job.progress();
    let wire = contract_to_proto(c);
    JobSpend {
        job_id: r.job_id.clone(),
        mechanism: wire.mechanism,
        accountant: kind_to_proto(job.spending.kind()) as i32,
        delta: c.delta,
        epsilon_target: c.epsilon_target.unwrap_or(0.0),
        epsilon_spent: p.epsilon_spent,
        steps_charged: p.charged,
        steps_discarded: p.discarded,
        next_step: p.next_step,
        max_steps: job.spending.max_steps(),
        phase: match p.phase {
            Phase::Open => pb::JobPhase::Open,
            Phase::BudgetExhausted => pb::JobPhase::BudgetExhausted,
            Phase::Closed => pb::JobPhase::Closed,
        } as i32,
        seeded_noise: r.insecure_noise_seed.is_some(),
        privacy: wire.privacy,
        audit_canaries: wire.audit_canaries,
        contract: Some(wire),
        epsilon_composed: p.epsilon_spent,
        gradient_dim: r.gradient_dim,
        exhausted_by: job.exhausted_by.get().cloned().unwrap_or_default(),
    }
}

type ReleaseStream = Pin<Box<dyn Stream<Item = Result<ReleaseChunk, Status>> + Send>>;

#[tonic::async_trait]
impl AccountantService for AccountantGrpc {
    async fn register_job(
        &self,
        request: Request<RegisterJobRequest>,
    ) -> Result<Response<RegisterJobResponse>, Status> {
        let registration = registration_from_proto(request.into_inner()).map_err(to_status)?;
        let (job, created) = self.accountant.register(registration).await.map_err(to_status)?;
        Ok(Response::new(RegisterJobResponse { spend: Some(spend(&job)), created }))
    }

    async fn attach_job(&self, request: Request<AttachJobRequest>) -> Result<Response<JobSpend>, Status> {
        let job = self.accountant.job(&request.get_ref().job_id).map_err(to_status)?;
        let capability = self.capability(request.metadata(), &job).await.map_err(to_status)?;
        let r = request.into_inner();
        if r.parts != capability.parts {
            return Err(to_status(AccountantError::invalid(
                "parts",
                format!(
                    "{} ranks' parts, but the capability of generation {} says {}",
                    r.parts, capability.generation, capability.parts
                ),
            )));
        }
        self.accountant.attach(&job, r.gradient_dim, r.parts).map_err(to_status)?;
        Ok(Response::new(spend(&job)))
    }

    async fn submit_part(
        &self,
        request: Request<Streaming<GradientChunk>>,
    ) -> Result<Response<SubmitPartResponse>, Status> {
        let metadata = request.metadata().clone();
        let mut chunks = request.into_inner();
        let first = chunks
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("invalid values: the part stream is empty"))?;
        let OpenPart { job, mut assembler, slot } =
            self.open_part(capability_text(&metadata), &first).await.map_err(to_status)?;
        let (idle, part_no) = (self.part_idle(), first.part);
        let mut next = Some(first);
        while let Some(chunk) = next {
            assembler.push(&chunk.job_id, chunk.step, chunk.part, chunk.offset, chunk.data).map_err(to_status)?;
            next = tokio::select! {
                read = tokio::time::timeout(idle, chunks.message()) => match read {
                    Ok(read) => read?,
                    Err(_) => return Err(to_status(idle_cut(&job, part_no, idle))),
                },
                () = slot.superseded() => return Err(to_status(superseded(&job, part_no))),
            };
        }
        drop(slot);
        let part = assembler.finish().map_err(to_status)?;
        let response = self.release_part(&job, part).await.map_err(to_status)?;
        crate::metrics::record_transfer("part", "grpc");
        Ok(Response::new(response))
    }

    type FetchReleaseStream = ReleaseStream;

    async fn fetch_release(
        &self,
        request: Request<FetchReleaseRequest>,
    ) -> Result<Response<Self::FetchReleaseStream>, Status> {
        let call_capability = capability_text(request.metadata()).to_owned();
        let request = request.into_inner();
        let chunk_values = match request.chunk_values as usize {
            0 => DEFAULT_CHUNK_VALUES,
            n if n <= MAX_CHUNK_VALUES => n,
            n => {
                return Err(to_status(AccountantError::invalid(
                    "chunk_values",
                    format!("{n} exceeds {MAX_CHUNK_VALUES}"),
                )));
            }
        };
        let (job, release) =
            self.release_of(&request.job_id, &call_capability, request.step).await.map_err(to_status)?;
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            let mut first_spend = Some(release_spend(&job, &release));
            let lost = || to_status(release_lost(&job, release.step));
            let (chunk_bytes, total) = (chunk_values * 4, release.len());
            let mut offset = 0;
            // Blocks stream as the noise pass fills them.
            for index in 0..release.visible_blocks() {
                let Some(mut block) = release.block(index).await else {
                    let _ = tx.send(Err(lost())).await;
                    return;
                };
                while !block.is_empty() {
                    let data = block.split_to(chunk_bytes.min(block.len()));
                    let end = offset + data.len();
                    let last = end == total;
                    // The last chunk says the release is durable: wait for the ledger's store.
                    if last && !release.durable().await {
                        let _ = tx.send(Err(lost())).await;
                        return;
                    }
                    let chunk = ReleaseChunk {
                        job_id: job.registration.job_id.clone(),
                        step: release.step,
                        offset: (offset / 4) as u64,
                        data,
                        spend: first_spend.take(),
                        last,
                    };
                    if tx.send(Ok(chunk)).await.is_err() {
                        return; // the client went away (the release stays for its retry)
                    }
                    if last {
                        crate::metrics::record_transfer("release", "grpc");
                        return;
                    }
                    offset = end;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx).boxed()))
    }

    async fn get_local_endpoint(
        &self,
        _request: Request<LocalEndpointRequest>,
    ) -> Result<Response<LocalEndpoint>, Status> {
        Ok(Response::new(self.local.clone()))
    }

    async fn audit_job(&self, request: Request<AuditJobRequest>) -> Result<Response<AuditReport>, Status> {
        let job = self.accountant.job(&request.into_inner().job_id).map_err(to_status)?;
        let (outcome, steps) = self.accountant.audit(&job).await.map_err(to_status)?;
        let claimed = job.progress().epsilon_spent;
        let covers = job.registration.contract.audit.map(|a| a.placement.covers()).unwrap_or_default();
        Ok(Response::new(AuditReport {
            job_id: job.registration.job_id.clone(),
            epsilon_claimed: claimed,
            delta: job.registration.contract.delta,
            covers: covers.to_owned(),
            epsilon_lower_bound: outcome.epsilon_lower_bound,
            epsilon_lower_bound_fdp: outcome.epsilon_lower_bound_fdp,
            canaries: outcome.counts.canaries as u32,
            guesses: outcome.counts.guesses as u32,
            correct: outcome.counts.correct as u32,
            confidence: 1.0 - crate::audit::SIGNIFICANCE,
            steps_scored: steps,
            violation: outcome.bound() > claimed,
        }))
    }

    async fn get_spend(&self, request: Request<GetSpendRequest>) -> Result<Response<JobSpend>, Status> {
        let job = self.accountant.job(&request.into_inner().job_id).map_err(to_status)?;
        let epsilon_composed = self.accountant.epsilon_composed(&job).await.map_err(to_status)?;
        Ok(Response::new(JobSpend { epsilon_composed, ..spend(&job) }))
    }

    async fn close_job(&self, request: Request<CloseJobRequest>) -> Result<Response<JobSpend>, Status> {
        let request = request.into_inner();
        let job = self.accountant.job(&request.job_id).map_err(to_status)?;
        if request.resumable {
            let (accountant, suspending) = (self.accountant.clone(), job.clone());
            // Run to the end whatever the client does: a revocation is made durable or fails.
            AccountantError::detached("suspend", async move {
                accountant.suspend(&suspending, &request.reason, request.generation).await
            })
            .await
            .map_err(to_status)?;
            return Ok(Response::new(spend(&job)));
        }
        let (accountant, closing) = (self.accountant.clone(), job.clone());
        // Run to the end whatever the client does: a half-done close would keep charging.
        AccountantError::detached("close", async move { accountant.close(&closing, &request.reason).await })
            .await
            .map_err(to_status)?;
        Ok(Response::new(spend(&job)))
    }

    async fn fence_job(&self, request: Request<FenceJobRequest>) -> Result<Response<JobSpend>, Status> {
        let request = request.into_inner();
        let job = self.accountant.job(&request.job_id).map_err(to_status)?;
        let (accountant, fencing) = (self.accountant.clone(), job.clone());
        // Run to the end whatever the client does: a revocation is made durable or not at all.
        AccountantError::detached("fence", async move {
            accountant.fence(&fencing, request.generation, request.resume).await
        })
        .await
        .map_err(to_status)?;
        let epsilon_composed = self.accountant.epsilon_composed(&job).await.map_err(to_status)?;
        Ok(Response::new(JobSpend { epsilon_composed, ..spend(&job) }))
    }

    async fn trim_releases(&self, request: Request<TrimReleasesRequest>) -> Result<Response<JobSpend>, Status> {
        let request = request.into_inner();
        let job = self.accountant.job(&request.job_id).map_err(to_status)?;
        let (accountant, trimming) = (self.accountant.clone(), job.clone());
        // Run to the end whatever the client does: memory must match what was deleted.
        AccountantError::detached("trim", async move { accountant.trim(&trimming, request.before_step).await })
            .await
            .map_err(to_status)?;
        Ok(Response::new(spend(&job)))
    }

    async fn set_dataset_budget(
        &self,
        request: Request<SetDatasetBudgetRequest>,
    ) -> Result<Response<pb::DatasetBudget>, Status> {
        let r = request.into_inner();
        let key = budget_key(r.dataset_id, r.unit).map_err(to_status)?;
        let setting = BudgetSetting {
            epsilon: r.epsilon,
            delta: r.delta,
            reason: r.reason,
            allow_not_private: r.allow_not_private,
            name: r.name,
            population: r.population,
            force: r.force,
            shards_id: r.shards_id,
        };
        let accountant = self.accountant.clone();
        // Audit entry and current value are written together, whatever the client does.
        let view = AccountantError::detached("budget", async move { accountant.set_budget(&key, setting).await })
            .await
            .map_err(to_status)?;
        Ok(Response::new(dataset_to_proto(view)))
    }

    async fn get_dataset_budget(
        &self,
        request: Request<GetDatasetBudgetRequest>,
    ) -> Result<Response<pb::DatasetBudget>, Status> {
        let r = request.into_inner();
        let key = budget_key(r.dataset_id, r.unit).map_err(to_status)?;
        let view = self.accountant.dataset(&key).await.map_err(to_status)?;
        Ok(Response::new(dataset_to_proto(view)))
    }

    async fn estimate(&self, request: Request<EstimateRequest>) -> Result<Response<EstimateResponse>, Status> {
        let r = request.into_inner();
        let kind = kind_from_proto(r.accountant).map_err(|e| to_status(AccountantError::from(e)))?;
        let result = AccountantError::blocking(move || estimate(kind, r)).await.map_err(to_status)?;
        result.map(Response::new).map_err(to_status)
    }
}

fn dataset_to_proto(view: DatasetView) -> pb::DatasetBudget {
    let unit = if view.budget.unit == "user" { pb::PrivacyUnit::User } else { pb::PrivacyUnit::Example };
    pb::DatasetBudget {
        unit: unit as i32,
        dataset_id: view.budget.dataset_id,
        epsilon_budget: view.budget.epsilon,
        delta: view.budget.delta,
        epsilon_spent: view.standing.spent,
        epsilon_reserved: view.standing.reserved,
        epsilon_free: view.standing.free,
        name: view.budget.name,
        jobs: view.jobs,
        version: view.budget.version,
        allow_not_private: view.budget.allow_not_private,
        population: view.budget.population,
        consequences: view.consequences,
    }
}

/// Solves for whichever of σ, steps and ε the request leaves out.
fn estimate(kind: AccountantKind, r: EstimateRequest) -> Result<EstimateResponse, AccountantError> {
    let (q, delta) = (r.sample_rate, r.delta);
    privacy::check_sample_rate(q)?;
    privacy::check_delta(delta)?;
    let (sigma, steps, epsilon) = match (r.noise_multiplier, r.steps, r.epsilon) {
        (Some(sigma), Some(steps), None) => {
            (sigma, steps, EpsilonCurve::new(kind, q, sigma, delta)?.epsilon_after(steps))
        }
        (None, Some(steps), Some(eps)) => (privacy::noise_multiplier(kind, q, steps, eps, delta)?, steps, eps),
        (Some(sigma), None, Some(eps)) => {
            (sigma, privacy::max_steps(&EpsilonCurve::new(kind, q, sigma, delta)?, eps)?, eps)
        }
        _ => return Err(AccountantError::invalid("noise_multiplier/steps/epsilon", "give exactly two of the three")),
    };
    Ok(EstimateResponse {
        sample_rate: q,
        delta,
        accountant: kind_to_proto(kind) as i32,
        noise_multiplier: sigma,
        steps,
        epsilon,
    })
}
