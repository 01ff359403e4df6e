//! The demo's training jobs: the DP job and its NOT PRIVATE baseline, identical but for σ
//! (same steps, batch, schedule, clipping and seed), run through the embedded cluster one
//! after the other; and their trained weights, loaded back from each job's last checkpoint.

use std::path::Path;

use anyhow::{Context, Result, bail};
use dpcap_dataset::tokenizer::CaptionTokenizer;
use dpcap_ml::CpuBackend;
use dpcap_ml::checkpoint::load_weights;
use dpcap_ml::checkpoint::{CheckpointStore, Manifest};
use dpcap_ml::clip::{ClipEngine, Lanes};
use dpcap_ml::optim::Schedule;
use dpcap_ml::trainer::{ReplicaConfig, Trainer};
use dpcap_proto::spec::SpecFile;
use dpcap_proto::v1::{GetSpendRequest, Job, JobSpend, JobState};

use super::DemoArgs;
use crate::jobs::{self, Server};

/// The DP job's spec; `not_private` turns it into its baseline (σ = 0, no ε); `init` is the
/// checkpoint root of the warm start both begin from.
pub fn spec(args: &DemoArgs, train_dir: &Path, not_private: bool, init: Option<&str>) -> SpecFile {
    SpecFile {
        init_from: init.map(str::to_owned),
        // The warm start saw procedural images only (`dataset synth --kind procedural`).
        init_public: init.map(|_| true),
        name: if not_private { "demo-nonprivate".into() } else { "demo".into() },
        dataset: train_dir.to_string_lossy().into_owned(),
        model: "micro".into(),
        objective: Some(args.objective.name().to_owned()),
        epsilon: (!not_private).then_some(args.epsilon),
        privacy: not_private.then(|| "not_private".into()),
        batch_size: Some(args.batch_size),
        steps: Some(args.steps()),
        clipping_norm: Some(1.0),
        learning_rate: Some(args.learning_rate),
        micro_batch: Some(128),
        workers: Some(args.workers),
        checkpoint_interval: Some(20),
        // A caption names both shapes of a scene: a random crop that cut one away would make
        // the caption false. LAION-scale jobs keep the default random_resized_crop.
        augment: Some("center_crop".into()),
        audit: (!not_private && args.audit > 0).then(|| dpcap_proto::spec::AuditFile {
            canaries: args.audit,
            kind: None,
            coordinates: Some(args.audit_coordinates.clone()),
        }),
        ..Default::default()
    }
}

/// The NOT PRIVATE warm start: an MAE (ViP) job on procedural images with no private content,
/// at the demo's batch, for `steps` steps. Its encoder starts the DP job and its baseline.
pub fn warm_start_spec(args: &DemoArgs, procedural_dir: &Path, steps: u64) -> SpecFile {
    SpecFile {
        name: "demo-warm-start".into(),
        dataset: procedural_dir.to_string_lossy().into_owned(),
        model: "micro".into(),
        objective: Some("mae".into()),
        privacy: Some("not_private".into()),
        batch_size: Some(args.batch_size.min(args.examples)),
        steps: Some(steps),
        learning_rate: Some(args.learning_rate),
        micro_batch: Some(128),
        workers: Some(args.workers),
        checkpoint_interval: Some(steps),
        augment: Some("center_crop".into()),
        ..Default::default()
    }
}

/// A finished job and what the accountant says it spent.
pub struct Finished {
    pub job: Job,
    pub spend: JobSpend,
}

/// Submits `spec`, follows it with a progress bar to its end, and reads its spend.
pub async fn run(server: &Server, accountant: &str, spec: SpecFile) -> Result<Finished> {
    let mut client = server.connect().await?;
    let job = client.submit(spec.into_proto()?, String::new()).await?;
    let plan = job.plan.clone().unwrap_or_default();
    let c = jobs::contract_of(&job)?;
    match dpcap_proto::plan::notice(&plan, &c) {
        Some(notice) => eprintln!("job {}: {notice}; {} steps", job.job_id, c.planned_steps),
        None => eprintln!(
            "job {}: N = {}{}, q = {:.4}, L = {:.0}, sigma = {:.4} (calibrated for epsilon {} at delta {:.2e}), {} steps",
            job.job_id,
            if plan.clients > 0 { plan.clients } else { plan.examples },
            match plan.clients {
                0 => String::new(),
                c if c == plan.users => " users".to_owned(),
                _ => format!(" virtual clients of {} users", plan.users),
            },
            c.mechanism.sample_rate,
            dpcap_proto::plan::expected_batch_size(&plan, &c),
            c.mechanism.noise_multiplier,
            c.epsilon_target.unwrap_or(f64::INFINITY),
            c.delta,
            c.planned_steps
        ),
    }
    let job = jobs::follow(&mut client, &job.job_id, true).await?;
    if job.state != JobState::Succeeded as i32 {
        bail!("the demo job {} ended {}", job.job_id, jobs::state_name(job.state));
    }
    let mut accountant = dpcap_proto::client::AccountantClient::connect(accountant.to_owned()).await?;
    let spend = accountant
        .raw()
        .get_spend(GetSpendRequest { job_id: job.job_id.clone() })
        .await
        .map_err(jobs::status)?
        .into_inner();
    Ok(Finished { job, spend })
}

/// A `micro` model of the demo's objective with fresh weights (seed 0, the jobs' own init).
pub fn fresh(args: &DemoArgs, tokenizer: &CaptionTokenizer) -> Result<Trainer<CpuBackend>> {
    let engine = ClipEngine {
        clipping_norm: 1.0,
        micro_batch: 1,
        precision: Default::default(),
        matmul_inputs: Default::default(),
        reads: Default::default(),
        lanes: Lanes::for_device("cpu"),
    };
    let schedule = Schedule { peak: 0.0, warmup_steps: 0, total_steps: 1, floor: 0.0 };
    let replica = ReplicaConfig {
        model_name: "micro",
        objective: args.objective,
        fedemb: Default::default(),
        tokenizer: args.objective.has_captions().then(|| tokenizer.clone()),
        seed: 0,
        engine,
        expected_batch_size: 1.0,
        schedule,
    };
    Ok(Trainer::<CpuBackend>::new(replica, &Default::default())?)
}

/// The model `job` trained: its last checkpoint's weights and manifest.
pub async fn trained(
    args: &DemoArgs,
    tokenizer: &CaptionTokenizer,
    job: &Job,
) -> Result<(Trainer<CpuBackend>, Manifest)> {
    let mut trainer = fresh(args, tokenizer)?;
    let checkpoints = CheckpointStore::open(&job.checkpoint_root)?;
    let last = checkpoints.latest().await?.with_context(|| format!("job {} left no checkpoint", job.job_id))?;
    let (manifest, weights, _) = checkpoints.load(last).await?;
    load_weights(&mut trainer.params, &weights)?;
    Ok((trainer, manifest))
}
