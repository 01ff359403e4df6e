//! `dpctl demo`: the whole product on one machine. Synthesises a captioning dataset, starts an
//! embedded cluster (accountant, coordinator, two CPU workers), submits a `micro` DP-Cap job at
//! ε = 8, δ = 1/N, shows its progress, and reports ε spent, the linear-probe accuracy of the DP
//! encoder against a randomly initialised one, and a few generated captions.

mod cluster;
mod probe;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use dpcap_coordinator::SpecFile;
use dpcap_proto::v1::{GetSpendRequest, JobState, SubmitJobRequest};
use dpcap_worker::checkpoint::{load_weights, save_weights_with_prefix};
use dpcap_worker::clip::ClipEngine;
use dpcap_worker::data::pipeline::Crop;
use dpcap_worker::data::{Example, synth};
use dpcap_worker::optim::Schedule;
use dpcap_worker::runtime::ckpt::CheckpointStore;
use dpcap_worker::runtime::dataset::{Dataset, View};
use dpcap_worker::runtime::trainer::{Model, Trainer};
use dpcap_worker::{CpuBackend, eval};
use serde_json::json;

use crate::jobs::{self, Server};

/// Options of `dpctl demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Working directory (dataset, ledger, job store, report).
    #[arg(long, default_value = "./dpcap-demo")]
    pub dir: PathBuf,
    /// Training examples N.
    #[arg(long, default_value_t = 20_000)]
    pub examples: u64,
    /// Held-out labelled single-shape images for the linear probe (2/3 fit it, 1/3 score it).
    #[arg(long, default_value_t = 3_000)]
    pub eval_examples: u64,
    /// Target ε (δ = 1/N).
    #[arg(long, default_value_t = 8.0)]
    pub epsilon: f64,
    /// Expected batch size L = qN.
    #[arg(long, default_value_t = 1_500)]
    pub batch_size: u64,
    /// Steps.
    #[arg(long, default_value_t = 150)]
    pub steps: u64,
    /// Peak learning rate.
    #[arg(long, default_value_t = 3e-3)]
    pub learning_rate: f64,
    /// CPU workers.
    #[arg(long, default_value_t = 2)]
    pub workers: u32,
    /// Objective: caption (DP-Cap, the default) or mae (ViP; no captions in the report).
    #[arg(long, default_value = "caption")]
    pub objective: String,
    /// Generated captions shown in the report.
    #[arg(long, default_value_t = 4)]
    pub captions: usize,
}

/// Writes and indexes the synthetic dataset unless it is already there.
async fn prepare_data(dir: &Path, args: &DemoArgs) -> Result<(PathBuf, PathBuf)> {
    let (train, eval) = (dir.join("data/train"), dir.join("data/probe"));
    let marker = dir.join("data/dataset.json");
    // The index format is part of what is wanted: data indexed by an older dpctl is redone.
    let wanted = json!({"examples": args.examples, "eval_examples": args.eval_examples, "seed": 0, "probe": "single",
                        "index": dpcap_proto::index::MANIFEST_VERSION});
    if std::fs::read(&marker).ok().and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        == Some(wanted.clone())
    {
        return Ok((train, eval));
    }
    let _ = std::fs::remove_dir_all(dir.join("data"));
    eprintln!(
        "synthesising {} training examples and {} held-out probe images under {}",
        args.examples,
        args.eval_examples,
        dir.join("data").display()
    );
    synth::write_shards(&train, (synth::Scene::Pair, 0), 0..args.examples, 1000, 32)
        .context("writing training shards")?;
    synth::write_shards(&eval, (synth::Scene::Single, 0), 0..args.eval_examples, 1000, 32)
        .context("writing held-out probe shards")?;
    let options = crate::dataset::IndexOptions::quiet(256);
    crate::dataset::index_dataset(&train.to_string_lossy(), &options).await?;
    crate::dataset::index_dataset(&eval.to_string_lossy(), &options).await?;
    std::fs::write(&marker, wanted.to_string())?;
    Ok((train, eval))
}

/// Runs the demo and writes `DIR/report.json`.
pub async fn run(args: DemoArgs) -> Result<()> {
    let started = Instant::now();
    std::fs::create_dir_all(&args.dir).with_context(|| format!("creating {}", args.dir.display()))?;
    let dir = std::fs::canonicalize(&args.dir)?;
    let (train_dir, eval_dir) = prepare_data(&dir, &args).await?;
    for stale in ["ledger", "store"] {
        let _ = std::fs::remove_dir_all(dir.join(stale));
    }
    let cluster = cluster::Cluster::start(&dir, args.workers as usize).await?;
    eprintln!(
        "cluster up: coordinator {}  accountant {}  metrics {} {}",
        cluster.coordinator, cluster.accountant, cluster.metrics[0], cluster.metrics[1]
    );
    let result = train_and_report(&args, &dir, &train_dir, &eval_dir, &cluster, started).await;
    cluster.stop().await;
    result
}

async fn train_and_report(
    args: &DemoArgs,
    dir: &Path,
    train_dir: &Path,
    eval_dir: &Path,
    cluster: &cluster::Cluster,
    started: Instant,
) -> Result<()> {
    let spec = SpecFile {
        name: "demo".into(),
        dataset: train_dir.to_string_lossy().into_owned(),
        model: "micro".into(),
        objective: Some(args.objective.clone()),
        epsilon: Some(args.epsilon),
        batch_size: Some(args.batch_size),
        steps: Some(args.steps),
        clipping_norm: Some(1.0),
        learning_rate: Some(args.learning_rate),
        micro_batch: Some(128),
        workers: Some(args.workers),
        checkpoint_interval: Some(20),
        // A caption names both shapes of a scene: a random crop that cut one away would make
        // the caption false. LAION-scale jobs keep the default random_resized_crop.
        augment: Some("center_crop".into()),
        ..Default::default()
    };
    let server = Server { coordinator: cluster.coordinator.clone(), token: None, tls: Default::default() };
    // The data's owner sets the dataset's lifetime budget before any job may spend it.
    let dataset_id = crate::budget::dataset_digest(&train_dir.to_string_lossy()).await?;
    let mut accountant = dpcap_accountant::client::AccountantClient::connect(cluster.accountant.clone()).await?;
    let budget = dpcap_proto::v1::SetDatasetBudgetRequest {
        dataset_id,
        epsilon: args.epsilon,
        delta: 1.0 / args.examples as f64,
        reason: "dpctl demo: synthetic data, one job".into(),
    };
    accountant.raw().set_dataset_budget(budget).await.map_err(jobs::status)?;
    let mut client = server.connect().await?;
    let request = SubmitJobRequest { spec: Some(spec.into_proto()?), idempotency_key: String::new() };
    let job = client.submit_job(request).await.map_err(jobs::status)?.into_inner();
    let plan = job.plan.clone().unwrap_or_default();
    eprintln!(
        "job {}: N = {}, q = {:.4}, L = {:.0}, sigma = {:.4} (calibrated for epsilon {} at delta {:.2e}), {} steps",
        job.job_id,
        plan.examples,
        plan.sample_rate,
        plan.expected_batch_size,
        plan.noise_multiplier,
        plan.epsilon_target,
        plan.delta,
        plan.steps
    );
    let job = jobs::follow(&mut client, &job.job_id, true).await?;
    if job.state != JobState::Succeeded as i32 {
        bail!("the demo job ended {}", jobs::state_name(job.state));
    }
    let progress = job.progress.clone().unwrap_or_default();
    let mut accountant = dpcap_accountant::client::AccountantClient::connect(cluster.accountant.clone()).await?;
    let spend = accountant
        .raw()
        .get_spend(GetSpendRequest { job_id: job.job_id.clone() })
        .await
        .map_err(jobs::status)?
        .into_inner();

    eprintln!("evaluating: linear probe on {} held-out labelled images", args.eval_examples);
    let dataset = Dataset::open(&train_dir.to_string_lossy()).await?;
    let tokenizer = dataset.tokenizer("").await?;
    let engine = ClipEngine { clipping_norm: 1.0, micro_batch: 1, precision: Default::default() };
    let schedule = Schedule { peak: 0.0, warmup_steps: 0, total_steps: 1, floor: 0.0 };
    let build = || {
        Trainer::<CpuBackend>::new(
            "micro",
            args.objective == "mae",
            Some(tokenizer.clone()),
            0,
            (engine, 1.0, schedule),
            &Default::default(),
        )
    };
    let (mut dp, random) = (build()?, build()?);
    let checkpoints = CheckpointStore::open(&job.checkpoint_root)?;
    let last = checkpoints.latest().await?.context("the job left no checkpoint")?;
    let (_, weights, _) = checkpoints.load(last).await?;
    load_weights(&mut dp.params, &weights)?;
    let probe = Dataset::open(&eval_dir.to_string_lossy()).await?;
    let view = View::eval(32)?;
    let examples = probe.read((0..probe.examples()).collect(), &view).await?;
    let labels: Vec<u32> = examples.iter().map(|e| e.label.unwrap_or(0)).collect();
    let accuracy_dp =
        probe::accuracy(&eval::features::<CpuBackend>(dp.model.encoder(), &dp.params, &examples), &labels)?;
    let accuracy_random =
        probe::accuracy(&eval::features::<CpuBackend>(random.model.encoder(), &random.params, &examples), &labels)?;
    let captions = match &dp.model {
        Model::Caption(model, tokenizer) => {
            // Held-out scenes from the training distribution (indices past the N training ones).
            let shown: Vec<Example> = (0..args.captions as u64)
                .map(|i| synth::generate(0, args.examples + i, 32))
                .map(|e| {
                    let pixels = view.pipeline.transform(&e.image, &Crop::Eval)?;
                    Ok(Example { key: e.key, pixels, caption: e.caption, label: Some(e.label) })
                })
                .collect::<Result<_>>()?;
            let shown = shown.as_slice();
            let ids = eval::greedy_captions::<CpuBackend>(model, &dp.params, shown, tokenizer.bos_eos());
            shown
                .iter()
                .zip(ids)
                .map(|(e, ids)| Ok(json!({"reference": e.caption, "generated": tokenizer.decode(&ids[1..])?})))
                .collect::<Result<Vec<_>>>()?
        }
        Model::Mae(_) => vec![],
    };
    std::fs::write(dir.join("encoder.safetensors"), save_weights_with_prefix(&dp.params, "encoder.")?)?;
    let report = json!({
        "job_id": job.job_id,
        "epsilon_spent": spend.epsilon_spent,
        "epsilon_target": plan.epsilon_target,
        "delta": plan.delta,
        "accountant": "pld",
        "objective": args.objective,
        "steps": spend.steps_charged,
        "noise_multiplier": plan.noise_multiplier,
        "sample_rate": plan.sample_rate,
        "clipping_norm": plan.clipping_norm,
        "loss_start": progress.loss_first,
        "loss_end": progress.loss,
        "probe_accuracy_dp": accuracy_dp,
        "probe_accuracy_random": accuracy_random,
        "captions": captions,
        "wall_s": started.elapsed().as_secs_f64(),
        "non_dp_telemetry": ["loss_start", "loss_end", "captions.reference"],
        "encoder": dir.join("encoder.safetensors"),
    });
    std::fs::write(dir.join("report.json"), serde_json::to_vec_pretty(&report)?)?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    eprintln!(
        "epsilon spent {:.3} of {} at delta {:.2e} (PLD) over {} steps; probe accuracy DP {:.1} % vs random init {:.1} %; report at {}",
        spend.epsilon_spent,
        plan.epsilon_target,
        plan.delta,
        spend.steps_charged,
        accuracy_dp * 100.0,
        accuracy_random * 100.0,
        dir.join("report.json").display()
    );
    Ok(())
}
