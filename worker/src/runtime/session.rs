//! One assignment: a rank of a job's group from formation until STOP. Each step: replay any
//! releases the replica has not applied, read the work units, clip, submit the part, fetch the
//! release, apply g = R / L, checkpoint (rank 0), report.

use std::time::Instant;

use burn::tensor::backend::AutodiffBackend;
use dpcap_accountant::client::AccountantClient;
use dpcap_proto::v1::{
    AccountantKind, Assignment, GetStepRequest, JobSpec, Mechanism, Objective, RegisterJobRequest, ReportStepRequest,
    StepOutcome, TelemetryMode, step_work::Action,
};

use crate::checkpoint::{load_optimizer, load_weights, save_optimizer, save_weights};
use crate::clip::ClipEngine;
use crate::collective::Reducer;
use crate::optim::Schedule;
use crate::runtime::RuntimeError;
use crate::runtime::ckpt::{CheckpointStore, Manifest};
use crate::runtime::dataset::Dataset;
use crate::runtime::reduce;
use crate::runtime::trainer::Trainer;
use crate::runtime::worker::{CoordinatorClient, WorkerConfig};

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
    dataset: Dataset,
    checkpoints: CheckpointStore,
    trainer: Trainer<AB>,
    reducer: Reducer,
    /// Releases of steps < position are applied to the replica.
    position: u64,
    discarded: u64,
}

fn since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

impl<AB: AutodiffBackend> Session<AB> {
    /// Builds the replica (from the latest checkpoint if there is one), registers the job with
    /// the accountant (idempotent: every rank sends the identical registration) and forms the
    /// reducer (joining the generation's NCCL group on the GPU path).
    pub async fn start(
        (worker_id, assignment): (String, Assignment),
        (mut coordinator, mut accountant): (CoordinatorClient, AccountantClient),
        (config, device): (&WorkerConfig, &AB::Device),
    ) -> Result<Self, RuntimeError> {
        let spec = assignment.spec.clone().ok_or_else(|| RuntimeError::Protocol("assignment without a spec".into()))?;
        let plan = assignment.plan.ok_or_else(|| RuntimeError::Protocol("assignment without a plan".into()))?;
        let dataset = Dataset::open(&spec.dataset).await?;
        let mae = spec.objective == Objective::Mae as i32;
        let tokenizer = if mae { None } else { Some(dataset.tokenizer(&spec.tokenizer).await?) };
        let schedule =
            Schedule { peak: plan.learning_rate, warmup_steps: plan.warmup_steps, total_steps: plan.steps, floor: 0.0 };
        let engine = ClipEngine {
            clipping_norm: plan.clipping_norm,
            micro_batch: plan.micro_batch as usize,
            precision: config.precision,
        };
        let mut trainer = tokio::task::block_in_place(|| {
            Trainer::<AB>::new(
                &spec.model,
                mae,
                tokenizer,
                spec.seed,
                (engine, plan.expected_batch_size, schedule),
                device,
            )
        })?;
        let checkpoints = CheckpointStore::open(&assignment.checkpoint_root)?;
        let mut position = 0;
        if let Some(step) = checkpoints.latest().await? {
            let (manifest, weights, optimizer) = checkpoints.load(step).await?;
            load_weights(&mut trainer.params, &weights)
                .map_err(|e| RuntimeError::Checkpoint(format!("checkpoint {step}: {e}")))?;
            trainer.optimizer = load_optimizer(&trainer.params, &optimizer)
                .map_err(|e| RuntimeError::Checkpoint(format!("checkpoint {step}: {e}")))?;
            position = manifest.step;
            tracing::info!(job_id = %assignment.job_id, rank = assignment.rank, step, "resumed from checkpoint");
        }
        let reducer =
            reduce::form(&assignment, (&mut coordinator, &worker_id), (&config.device, config.collective_timeout))
                .await?;
        let registration = RegisterJobRequest {
            job_id: assignment.job_id.clone(),
            mechanism: Some(Mechanism {
                sample_rate: plan.sample_rate,
                noise_multiplier: plan.noise_multiplier,
                clipping_norm: plan.clipping_norm,
            }),
            delta: plan.delta,
            epsilon_target: plan.epsilon_target,
            accountant: AccountantKind::try_from(plan.accountant).unwrap_or_default() as i32,
            gradient_dim: trainer.dim() as u64,
            parts: reducer.parts(assignment.world_size),
            dataset_id: spec.dataset.clone(),
            dataset_epsilon_budget: spec.dataset_epsilon_budget,
            insecure_noise_seed: None,
        };
        accountant.raw().register_job(registration).await?;
        Ok(Self {
            worker_id,
            assignment,
            spec,
            coordinator,
            accountant,
            dataset,
            checkpoints,
            trainer,
            reducer,
            position,
            discarded: 0,
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
            let work = self.coordinator.get_step(request).await.map_err(lease_or)?.into_inner();
            if work.action != Action::Run as i32 {
                tracing::info!(job_id = %self.assignment.job_id, rank = self.assignment.rank, "stopping: job ended or group re-formed");
                return Ok(());
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
                Ok(()) => report.outcome = StepOutcome::Done as i32,
                Err(e @ (RuntimeError::LeaseLost | RuntimeError::Superseded)) => return Err(e),
                Err(e) => {
                    tracing::error!(job_id = %report.job_id, step, rank = self.assignment.rank, error = %e, "step failed");
                    report.outcome = match e {
                        RuntimeError::BudgetExhausted(_) => StepOutcome::BudgetExhausted,
                        RuntimeError::Collective(_) => StepOutcome::PeerLost,
                        _ => StepOutcome::Failed,
                    } as i32;
                    report.message = e.to_string();
                }
            }
            self.coordinator.report_step(report).await.map_err(lease_or)?;
        }
    }

    /// Applies releases of steps in [position, step): after a restart the replica catches up
    /// from its checkpoint. A release the accountant no longer holds was discarded; its step
    /// stays spent and the replica skips it.
    async fn catch_up(&mut self, step: u64) -> Result<(), RuntimeError> {
        while self.position < step {
            let t = self.position;
            match self.accountant.fetch_release(&self.assignment.job_id, t).await {
                Ok((values, _)) => tokio::task::block_in_place(|| self.trainer.apply(values, t))?,
                Err(s) if s.code() == tonic::Code::FailedPrecondition || s.code() == tonic::Code::NotFound => {
                    tracing::warn!(job_id = %self.assignment.job_id, step = t, reason = %s.message(), "release unavailable; step stays spent (discarded)");
                    self.discarded += 1;
                }
                Err(s) => return Err(s.into()),
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
    ) -> Result<(), RuntimeError> {
        let job_id = self.assignment.job_id.clone();
        let (rank, generation) = (self.assignment.rank, self.assignment.generation);
        self.catch_up(step).await?;
        let mut phases = Phases::default();

        let t = Instant::now();
        let mut indices = Vec::new();
        for unit in units {
            for &local in &unit.indices {
                indices.push(self.dataset.global(unit.shard as usize, local)?);
            }
        }
        let examples = self.dataset.read(indices).await?;
        let (part, telemetry) = tokio::task::block_in_place(|| self.trainer.clipped_part(&examples))?;
        phases.compute = since(t);

        let released =
            reduce::release(&self.reducer, &mut self.accountant, (&job_id, step, rank, generation), part).await?;
        (phases.reduce, phases.release) = (released.reduce_seconds, released.release_seconds);
        let (release, spend) = (released.values, released.spend);

        let t = Instant::now();
        tokio::task::block_in_place(|| self.trainer.apply(release, step))?;
        self.position = step + 1;
        phases.update = since(t);

        if checkpoint && rank == 0 {
            let t = Instant::now();
            self.save_checkpoint(step + 1).await?;
            phases.checkpoint = since(t);
            report.checkpoint_step = step + 1;
        }
        if let Some(spend) = spend {
            report.epsilon_spent = spend.epsilon_spent;
            report.steps_discarded = spend.steps_discarded;
        }
        // The realised batch size and the loss are non-DP telemetry: none of it under strict.
        let strict = self.spec.telemetry == TelemetryMode::Strict as i32;
        if !strict && !examples.is_empty() {
            report.examples = examples.len() as u64;
            report.loss = Some(telemetry.mean_loss());
        }
        (report.compute_seconds, report.reduce_seconds, report.release_seconds) =
            (phases.compute, phases.reduce, phases.release);
        (report.update_seconds, report.checkpoint_seconds) = (phases.update, phases.checkpoint);
        let examples = if strict { None } else { Some(examples.len()) };
        tracing::info!(job_id, step, rank, examples, compute_s = phases.compute, "step done");
        Ok(())
    }

    async fn save_checkpoint(&self, step: u64) -> Result<(), RuntimeError> {
        let (weights, optimizer) = tokio::task::block_in_place(|| {
            Ok::<_, RuntimeError>((
                save_weights(&self.trainer.params).map_err(|e| RuntimeError::Checkpoint(e.to_string()))?,
                save_optimizer(&self.trainer.optimizer, &self.trainer.params)
                    .map_err(|e| RuntimeError::Checkpoint(e.to_string()))?,
            ))
        })?;
        let manifest = Manifest {
            job_id: self.assignment.job_id.clone(),
            step,
            ledger_position: step,
            model: self.spec.model.clone(),
            objective: Objective::try_from(self.spec.objective)
                .unwrap_or(Objective::Caption)
                .as_str_name()
                .trim_start_matches("OBJECTIVE_")
                .to_lowercase(),
            parameters: self.trainer.dim() as u64,
            generation: self.assignment.generation,
            created_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0),
        };
        self.checkpoints.save(&manifest, weights, optimizer).await?;
        tracing::info!(job_id = %manifest.job_id, step, "checkpoint written");
        Ok(())
    }
}

/// NOT_FOUND from the coordinator means this worker's lease is gone; ABORTED, that its group
/// was re-formed (the session ends without failing the job).
pub fn lease_or(s: tonic::Status) -> RuntimeError {
    match s.code() {
        tonic::Code::NotFound if s.message().contains("not registered") => RuntimeError::LeaseLost,
        tonic::Code::Aborted => RuntimeError::Superseded,
        _ => s.into(),
    }
}
