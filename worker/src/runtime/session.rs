//! One assignment: a rank of a job's group from formation until STOP. Each step: replay any
//! releases the replica has not applied, stream the work units one micro-batch at a time
//! through the clip engine, submit the part, fetch the release, apply g = R / L, checkpoint
//! (rank 0), report. Calls to the coordinator and the accountant retry transient failures;
//! a charged step whose release was lost is skipped and counted as discarded.

use std::sync::Arc;
use std::time::Instant;

use burn::tensor::backend::AutodiffBackend;
use dpcap_proto::client::{AccountantClient, CapabilityCell, CoordinatorClient, PartKey};
use dpcap_proto::v1::{
    Assignment, AttachJobRequest, Augment, GetStepRequest, JobSpec, ReportStepRequest, StepOutcome, TelemetryMode,
    step_work::Action,
};
use dpcap_proto::{ErrorCode, RetryPolicy, retry};

use crate::collective::Reducer;
use crate::runtime::config::WorkerConfig;
use crate::runtime::reduce::{self, Outcome};
use crate::runtime::{RuntimeError, lease_or};
use dpcap_dataset::pipeline::Pipeline;
use dpcap_dataset::reader::{CropPlan, Dataset, View};
use dpcap_dataset::stream::{DEFAULT_PREFETCH, ExampleStream};
use dpcap_ml::checkpoint::{CheckpointStore, Manifest};
use dpcap_ml::checkpoint::{load_optimizer, load_weights, save_optimizer, save_weights};
use dpcap_ml::clip::{ClipEngine, Telemetry};
use dpcap_ml::optim::Schedule;
use dpcap_ml::trainer::{FedEmbTraining, ReplicaConfig, Trainer};
use dpcap_registry::Family;

/// Seconds of each phase of one step.
#[derive(Debug, Default, Clone, Copy)]
struct Phases {
    compute: f64,
    reduce: f64,
    release: f64,
    update: f64,
    checkpoint: f64,
}

/// A rank's live state in one assignment.
pub struct Session<AB: AutodiffBackend> {
    worker_id: String,
    assignment: Assignment,
    spec: JobSpec,
    coordinator: CoordinatorClient,
    accountant: AccountantClient,
    /// The capability the accountant client carries: renewed by heartbeats and step work.
    capability: CapabilityCell,
    /// Whether this rank attached to the job's contract (before its first part).
    attached: bool,
    dataset: Dataset,
    /// How this job's images become the model's input.
    pipeline: Arc<Pipeline>,
    /// Keys the training crops (from the coordinator; never the sampler's secret).
    augment_key: Option<[u8; 32]>,
    checkpoints: CheckpointStore,
    trainer: Trainer<AB>,
    reducer: Reducer,
    /// Releases of steps < position are applied to the replica (or discarded).
    position: u64,
    /// Releases applied to the replica since step 0.
    applied: u64,
    /// Where the initial weights came from (`init_from` provenance for manifests).
    init_from: String,
    /// Charged steps whose release was lost: skipped, still spent.
    discarded: Vec<u64>,
}

/// Where a replica starts: its latest checkpoint, another job's weights, or its seed.
#[derive(Debug, Default)]
struct Restored {
    position: u64,
    applied: u64,
    discarded: Vec<u64>,
    init_from: String,
}

/// Loads the job's latest checkpoint into `trainer` (the replica then resumes at its step), or
/// else the `init_from` weights the plan pinned; a fresh job starts from its seed.
async fn restore<AB: AutodiffBackend>(
    trainer: &mut Trainer<AB>,
    checkpoints: &CheckpointStore,
    assignment: &Assignment,
) -> Result<Restored, RuntimeError> {
    let (spec, plan) = (assignment.spec.clone().unwrap_or_default(), assignment.plan.clone().unwrap_or_default());
    if let Some(step) = checkpoints.latest().await? {
        let (manifest, weights, optimizer) = checkpoints.load(step).await?;
        let at_step = |source| RuntimeError::CheckpointStep { step, source };
        load_weights(&mut trainer.params, &weights).map_err(at_step)?;
        trainer.optimizer = load_optimizer(&trainer.params, &optimizer).map_err(at_step)?;
        tracing::info!(job_id = %assignment.job_id, rank = assignment.rank, step, "resumed from checkpoint");
        return Ok(Restored {
            position: manifest.step,
            applied: manifest.applied_steps,
            discarded: manifest.discarded_steps,
            init_from: manifest.init_from,
        });
    }
    if spec.init_from.is_empty() {
        return Ok(Restored::default());
    }
    let pinned: dpcap_privacy::contract::ModeKind =
        plan.init_privacy.parse().map_err(|e| dpcap_privacy::ContractError { field: "init_privacy", ..e })?;
    let model = (spec.model.as_str(), family(&spec)?);
    let source =
        dpcap_ml::init::load_init(&mut trainer.params, &spec.init_from, model, (plan.init_step, pinned)).await?;
    tracing::info!(job_id = %assignment.job_id, rank = assignment.rank, from = %source.job_id, step = source.step,
        "initialised from another job's weights");
    let init_from = format!("job {} step {} ({})", source.job_id, source.step, source.privacy);
    Ok(Restored { init_from, ..Restored::default() })
}

/// A rank's part of a step, before the reduction.
struct Computed {
    /// Σ clip_C(g_i) over its examples, P values.
    part: Vec<f32>,
    /// Non-DP telemetry and the non-finite count.
    telemetry: Telemetry,
    /// Examples sampled for this rank (the realised share: non-DP telemetry).
    examples: usize,
    /// Of those, examples that could not be read or decoded and were left out.
    dropped: usize,
}

/// How a step ended on this rank.
enum StepDone {
    /// The release was applied.
    Applied,
    /// The step was charged but its release was lost: skipped, still spent.
    Discarded,
}

fn since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

impl<AB: AutodiffBackend> Session<AB> {
    /// Builds the replica (from the latest checkpoint if there is one) and forms the reducer
    /// (joining the generation's NCCL group on the GPU path). The job's contract is the
    /// coordinator's, registered at submit; this rank attaches to it before its first part.
    pub async fn start(
        (worker_id, assignment): (String, Assignment),
        clients: Clients,
        (config, device): (&WorkerConfig, &AB::Device),
    ) -> Result<Self, RuntimeError> {
        let Clients { mut coordinator, accountant, capability } = clients;
        let spec = assignment.spec.clone().ok_or_else(|| RuntimeError::Protocol("assignment without a spec".into()))?;
        let plan = assignment.plan.clone().ok_or_else(|| RuntimeError::Protocol("assignment without a plan".into()))?;
        // q, C, the dataset and the steps are the contract's (the plan keeps no copy); this
        // rank checks it against the accountant's before its first part ([`Self::attach`]).
        let contract = dpcap_proto::plan::contract(&plan)?;
        let dataset = Dataset::open(&spec.dataset).await?;
        dataset.check_pinned(&contract.dataset_id, plan.examples)?;
        let objective = family(&spec)?;
        let tokenizer = if !objective.has_captions() {
            None
        } else if !plan.tokenizer.is_empty() {
            Some(Dataset::pinned_tokenizer(&plan.tokenizer, &plan.tokenizer_digest).await?)
        } else {
            Some(dataset.tokenizer(&spec.tokenizer).await?)
        };
        let schedule = Schedule {
            peak: plan.learning_rate,
            warmup_steps: plan.warmup_steps,
            total_steps: contract.planned_steps,
            floor: 0.0,
        };
        let engine = ClipEngine {
            clipping_norm: clipping_norm(&contract),
            micro_batch: plan.micro_batch as usize,
            precision: config.precision,
            matmul_inputs: dpcap_ml::clip::MatmulInputs::for_device(&config.device),
            reads: dpcap_ml::clip::Reads::for_device(&config.device),
            lanes: dpcap_ml::clip::Lanes::for_device(&config.device),
        };
        let fedemb = fedemb_training(&spec)?;
        let mut trainer = tokio::task::block_in_place(|| {
            let replica = ReplicaConfig {
                model_name: &spec.model,
                objective,
                fedemb,
                tokenizer,
                seed: spec.seed,
                engine,
                expected_batch_size: dpcap_proto::plan::expected_batch_size(&plan, &contract),
                schedule,
            };
            Trainer::<AB>::new(replica, device)
        })?;
        let side = trainer.model.encoder().config().image as u32;
        let pipeline = Arc::new(Pipeline::clip(side).map_err(dpcap_dataset::JobDataError::from)?);
        let augment_key = match Augment::try_from(spec.augment) {
            Ok(Augment::CenterCrop) => None,
            _ => Some(<[u8; 32]>::try_from(assignment.augment_key.as_ref()).map_err(|_| {
                RuntimeError::Protocol(format!("augment_key has {} bytes, not 32", assignment.augment_key.len()))
            })?),
        };
        let checkpoints = CheckpointStore::open(&assignment.checkpoint_root)?;
        let restored = restore(&mut trainer, &checkpoints, &assignment).await?;
        let reducer =
            reduce::form(&assignment, (&mut coordinator, &worker_id), (&config.device, config.collective_timeout))
                .await?;
        Ok(Self {
            worker_id,
            assignment,
            spec,
            coordinator,
            accountant,
            capability,
            attached: false,
            dataset,
            pipeline,
            augment_key,
            checkpoints,
            trainer,
            reducer,
            position: restored.position,
            applied: restored.applied,
            discarded: restored.discarded,
            init_from: restored.init_from,
        })
    }

    /// Runs steps until the coordinator says STOP.
    pub async fn run(mut self) -> Result<(), RuntimeError> {
        loop {
            let request = GetStepRequest {
                worker_id: self.worker_id.clone(),
                job_id: self.assignment.job_id.clone(),
                generation: self.assignment.generation,
            };
            let work = retry(RetryPolicy::default(), "get_step", || {
                let (mut client, request) = (self.coordinator.clone(), request.clone());
                async move { client.get_step(request).await }
            })
            .await
            .map_err(lease_or)?;
            if work.action != Action::Run as i32 {
                tracing::info!(job_id = %self.assignment.job_id, rank = self.assignment.rank, "stopping: job ended or group re-formed");
                return Ok(());
            }
            if !work.capability.is_empty() {
                super::renew(&self.capability, work.capability.clone());
            }
            if !self.attached {
                self.attach().await?;
            }
            let step = work.step;
            let mut report = ReportStepRequest {
                worker_id: self.worker_id.clone(),
                job_id: self.assignment.job_id.clone(),
                generation: self.assignment.generation,
                step,
                ..Default::default()
            };
            match self.step(step, &work.units, work.checkpoint, &mut report).await {
                Ok(StepDone::Applied) => report.outcome = StepOutcome::Done as i32,
                Ok(StepDone::Discarded) => report.outcome = StepOutcome::Discarded as i32,
                Err(e @ (RuntimeError::LeaseLost | RuntimeError::Superseded)) => return Err(e),
                Err(e) => {
                    let rank = self.assignment.rank;
                    if matches!(e, RuntimeError::BudgetExhausted(_)) {
                        // The budget's end is the job's outcome, not this rank's fault.
                        tracing::warn!(job_id = %report.job_id, step, rank, error = %e, "step refused by the budget");
                    } else if matches!(e, RuntimeError::Revoked(_)) {
                        tracing::info!(job_id = %report.job_id, step, rank, error = %e, "step revoked; reporting it");
                    } else {
                        tracing::error!(job_id = %report.job_id, step, rank, error = %e, "step failed");
                    }
                    report.outcome = match e {
                        RuntimeError::BudgetExhausted(_) => StepOutcome::BudgetExhausted,
                        RuntimeError::Collective(_) => StepOutcome::PeerLost,
                        _ => StepOutcome::Failed,
                    } as i32;
                    report.message = reported_error(&e, self.spec.telemetry == TelemetryMode::Strict as i32);
                }
            }
            retry(RetryPolicy::default(), "report_step", || {
                let (mut client, report) = (self.coordinator.clone(), report.clone());
                async move { client.report_step(report).await }
            })
            .await
            .map_err(lease_or)?;
        }
    }

    /// Attaches this rank to the job's contract: the accountant refuses a model whose P differs
    /// from the one the coordinator registered, or a W other than the capability's; this rank
    /// refuses an assignment whose contract is not the ledger's, so that it clips with the
    /// ledger's C whatever the coordinator's store says.
    async fn attach(&mut self) -> Result<(), RuntimeError> {
        let request = AttachJobRequest {
            job_id: self.assignment.job_id.clone(),
            gradient_dim: self.trainer.dim() as u64,
            parts: self.reducer.parts(self.assignment.world_size),
        };
        let spend = retry(RetryPolicy::default(), "attach_job", || {
            let (mut client, request) = (self.accountant.clone(), request.clone());
            async move { client.attach_job(request).await }
        })
        .await?;
        let plan = self.assignment.plan.as_ref().ok_or_else(|| RuntimeError::Protocol("no plan".into()))?;
        let assigned = dpcap_proto::plan::contract(plan)?;
        let ledger = spend
            .contract
            .map(dpcap_proto::contract::contract_from_proto)
            .transpose()?
            .ok_or_else(|| RuntimeError::Protocol("the accountant's attach named no contract".into()))?;
        if assigned != ledger {
            let differences = assigned.differences(&ledger, ("in the assignment", "in the ledger")).join("; ");
            return Err(RuntimeError::Spec { field: "contract", reason: format!("refused: {differences}") });
        }
        self.trainer.engine.clipping_norm = clipping_norm(&ledger);
        self.attached = true;
        // Parts and releases over the accountant's same-host socket when both ends agree.
        match self.accountant.use_local().await {
            Ok(choice) => tracing::info!(job_id = %self.assignment.job_id, ?choice, "accountant transport for parts"),
            Err(e) => tracing::warn!(error = %e, "the accountant's same-host socket is unknown; parts go over grpc"),
        }
        Ok(())
    }

    /// Applies releases of steps in [position, step): after a restart the replica catches up
    /// from its checkpoint with the releases the accountant stores until a checkpoint covers
    /// them. A discarded step stays spent and is skipped; a trimmed one cannot be rebuilt.
    async fn catch_up(&mut self, step: u64) -> Result<(), RuntimeError> {
        while self.position < step {
            let t = self.position;
            let job_id = self.assignment.job_id.clone();
            let fetched = retry(RetryPolicy::default(), "fetch_release", || {
                let (mut client, job_id) = (self.accountant.clone(), job_id.clone());
                async move { client.fetch_release(&job_id, t).await }
            })
            .await;
            match fetched {
                Ok((values, _)) => {
                    tokio::task::block_in_place(|| self.trainer.apply(values, t))?;
                    self.applied += 1;
                }
                Err(e) if e.code == Some(ErrorCode::ReleaseDiscarded) => {
                    tracing::warn!(job_id, step = t, "release was lost; step stays spent (discarded)");
                    self.discarded.push(t);
                }
                Err(e) if e.code == Some(ErrorCode::ReleaseTrimmed) => {
                    return Err(RuntimeError::ReleaseTrimmed { step: t, position: self.position, source: Box::new(e) });
                }
                Err(e) => return Err(e.into()),
            }
            self.position += 1;
        }
        Ok(())
    }

    async fn step(
        &mut self,
        step: u64,
        units: &[dpcap_proto::v1::ExampleRange],
        checkpoint: bool,
        report: &mut ReportStepRequest,
    ) -> Result<StepDone, RuntimeError> {
        let job_id = self.assignment.job_id.clone();
        let (rank, generation) = (self.assignment.rank, self.assignment.generation);
        self.catch_up(step).await?;
        let mut phases = Phases::default();

        let t = Instant::now();
        let computed = self.compute(step, units).await?;
        phases.compute = since(t);

        let outcome = reduce::release(
            &self.reducer,
            &mut self.accountant,
            reduce::StepKey { job_id: &job_id, part: PartKey { step, part: rank, attempt: generation } },
            computed.part,
        )
        .await?;
        let released = match outcome {
            Outcome::Released(released) => released,
            Outcome::Discarded => {
                tracing::warn!(job_id, step, rank, "step was charged but its release was lost; skipped (discarded)");
                self.discarded.push(step);
                self.position = step + 1;
                return Ok(StepDone::Discarded);
            }
        };
        (phases.reduce, phases.release) = (released.reduce_seconds, released.release_seconds);

        let t = Instant::now();
        tokio::task::block_in_place(|| self.trainer.apply(released.values, step))?;
        self.position = step + 1;
        self.applied += 1;
        phases.update = since(t);

        if checkpoint && rank == 0 {
            let t = Instant::now();
            self.save_checkpoint(step + 1).await?;
            phases.checkpoint = since(t);
            report.checkpoint_step = step + 1;
        }
        report.dropped_examples = computed.dropped as u64;
        self.fill_report(report, &computed.telemetry, computed.examples, phases);
        Ok(StepDone::Applied)
    }

    /// This rank's part of `step`: its work units' examples read, streamed one micro-batch at a
    /// time through the clip engine (fedemb: one client at a time), summed.
    async fn compute(&mut self, step: u64, units: &[dpcap_proto::v1::ExampleRange]) -> Result<Computed, RuntimeError> {
        let mut indices = Vec::with_capacity(units.iter().map(|u| u.indices.len()).sum());
        // fedemb: each example's client (a client's ranges are adjacent in `units`).
        let mut clients = Vec::with_capacity(indices.capacity());
        for unit in units {
            for &local in &unit.indices {
                indices.push(self.dataset.global(unit.shard as usize, local)?);
                clients.push(unit.client);
            }
        }
        let examples = indices.len();
        let crop = match self.augment_key {
            Some(key) => CropPlan::Train { key, step },
            None => CropPlan::Eval,
        };
        let view = View { pipeline: self.pipeline.clone(), crop };
        let mut part = self.trainer.begin_part();
        let mut produced = 0;
        if self.trainer.model.trains_clients() {
            // One client at a time, each read on its own: an image that fails to decode is then
            // left out of its own client only, never shifting examples into the next client
            // (which would let one user move two clipped deltas).
            let mut start = 0;
            while start < indices.len() {
                let end = (start..indices.len()).find(|&i| clients[i] != clients[start]).unwrap_or(indices.len());
                let client = self.dataset.read(indices[start..end].to_vec(), &view).await?;
                produced += client.len();
                tokio::task::block_in_place(|| self.trainer.accumulate_client(&mut part, &client))?;
                start = end;
            }
        } else {
            let micro_batch = self.trainer.engine.micro_batch;
            let mut stream = ExampleStream::start(self.dataset.clone(), (indices, view), micro_batch, DEFAULT_PREFETCH);
            while let Some(chunk) = stream.next().await {
                let chunk = chunk?;
                produced += chunk.len();
                tokio::task::block_in_place(|| self.trainer.accumulate(&mut part, &chunk))?;
            }
        }
        let (part, telemetry) = tokio::task::block_in_place(|| self.trainer.finish_part(part))?;
        Ok(Computed { part, telemetry, examples, dropped: examples.saturating_sub(produced) })
    }

    /// What the coordinator hears of a done step: counts always; the realised batch size, the
    /// loss and the phase timings (non-DP telemetry) only without `telemetry: strict`.
    fn fill_report(&self, report: &mut ReportStepRequest, telemetry: &Telemetry, examples: usize, phases: Phases) {
        report.nonfinite_examples = telemetry.nonfinite;
        let strict = self.spec.telemetry == TelemetryMode::Strict as i32;
        if !strict && examples > 0 {
            report.examples = examples as u64;
            report.loss = telemetry.mean_loss();
        }
        if !strict {
            (report.compute_seconds, report.reduce_seconds, report.release_seconds) =
                (phases.compute, phases.reduce, phases.release);
            (report.update_seconds, report.checkpoint_seconds) = (phases.update, phases.checkpoint);
        }
        let (examples, compute_s) = if strict { (None, None) } else { (Some(examples), Some(phases.compute)) };
        let (job_id, step, rank) = (&self.assignment.job_id, report.step, self.assignment.rank);
        tracing::info!(job_id, step, rank, examples, compute_s, "step done");
    }

    async fn save_checkpoint(&self, step: u64) -> Result<(), RuntimeError> {
        let (weights, optimizer) = tokio::task::block_in_place(|| {
            Ok::<_, RuntimeError>((
                save_weights(&self.trainer.params).map_err(|source| RuntimeError::CheckpointStep { step, source })?,
                save_optimizer(&self.trainer.optimizer, &self.trainer.params)
                    .map_err(|source| RuntimeError::CheckpointStep { step, source })?,
            ))
        })?;
        let manifest = Manifest {
            job_id: self.assignment.job_id.clone(),
            step,
            ledger_position: step,
            model: self.spec.model.clone(),
            objective: family(&self.spec)?,
            parameters: self.trainer.dim() as u64,
            generation: self.assignment.generation,
            created_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0),
            applied_steps: self.applied,
            discarded_steps: self.discarded.clone(),
            // The contract's mode; fails closed: a plan without one is not "dp".
            privacy: self.mode_kind(),
            dataset: self.contract().map(|c| c.dataset_id).unwrap_or_default(),
            init_from: self.init_from.clone(),
        };
        self.checkpoints.save(&manifest, weights, optimizer).await?;
        tracing::info!(job_id = %manifest.job_id, step, "checkpoint written");
        Ok(())
    }
}

impl<AB: AutodiffBackend> Session<AB> {
    /// The assignment's contract, if it has a valid one.
    fn contract(&self) -> Option<dpcap_privacy::contract::PrivacyContract> {
        self.assignment.plan.as_ref().and_then(|p| dpcap_proto::plan::contract(p).ok())
    }

    /// The job's privacy mode as manifests record it, from its contract; fails closed: without
    /// a valid contract the weights are NOT PRIVATE.
    fn mode_kind(&self) -> dpcap_privacy::contract::ModeKind {
        self.contract().map_or(dpcap_privacy::contract::ModeKind::NotPrivate, |c| c.mode.kind())
    }
}

/// The C a rank clips to: the contract's. A debug build with the test-only feature
/// `test-skip-clipping`, started with `DPCAP_TEST_SKIP_CLIPPING=1`, clips to +∞ instead (it
/// sends unclipped sums), so that the suite can prove the accountant refuses them.
fn clipping_norm(contract: &dpcap_privacy::contract::PrivacyContract) -> f64 {
    // Debug builds only: a release build of the workspace (which unifies the suite's features)
    // never honours the switch.
    #[cfg(all(feature = "test-skip-clipping", debug_assertions))]
    if std::env::var("DPCAP_TEST_SKIP_CLIPPING").is_ok_and(|v| v == "1") {
        tracing::warn!("DPCAP_TEST_SKIP_CLIPPING=1: this test worker sends unclipped sums");
        return f64::INFINITY;
    }
    contract.mechanism.clipping_norm
}

/// The clients a session talks through.
pub struct Clients {
    /// The coordinator, with the worker's key.
    pub coordinator: CoordinatorClient,
    /// The accountant, carrying `capability`.
    pub accountant: AccountantClient,
    /// The capability the lease task renews.
    pub capability: CapabilityCell,
}

/// The failure as the job's condition shows it. Under `telemetry: strict` a data error names
/// no example (its key, member or bytes come from the sampled data); the rank's own log keeps
/// the detail.
pub fn reported_error(error: &RuntimeError, strict: bool) -> String {
    if strict && error.names_examples() {
        "data: a sampled example could not be read or decoded (details withheld under telemetry: strict)".into()
    } else {
        error.to_string()
    }
}

/// The spec's objective (the wire's one conversion: an unknown value is refused).
fn family(spec: &JobSpec) -> Result<Family, RuntimeError> {
    Ok(dpcap_proto::contract::family_from_proto(spec.objective)?)
}

/// DP-FedEmb's training as the spec sets it, with its defaults filled in (read only by an
/// objective that trains clients); an unknown server optimizer is refused.
pub fn fedemb_training(spec: &JobSpec) -> Result<FedEmbTraining, RuntimeError> {
    Ok(dpcap_proto::contract::fedemb_from_proto(spec.fedemb.as_ref())?.into())
}
