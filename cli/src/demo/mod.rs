//! `dpctl demo`: the whole product on one machine. Synthesises a captioning dataset, starts an
//! embedded cluster (accountant, coordinator, two CPU workers), submits a `micro` DP-Cap job at
//! ε = 8, δ = 1/N, shows its progress, and reports ε spent and the evaluation suite (zero-shot,
//! ARO, layout, caption slots, linear and few-shot probes; see `dpctl eval`) of the DP model
//! against a randomly initialised one, with a few generated captions.

mod cluster;
mod fedemb;
mod train;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use dpcap_dataset::reader::Dataset;
use dpcap_dataset::synth;
use dpcap_ml::CpuBackend;
use dpcap_ml::checkpoint::export_encoder;
use dpcap_ml::trainer::Trainer;
use dpcap_registry::Family;
use serde_json::json;

use crate::eval::report::named_keys;
use crate::eval::suite::{SuiteOptions, SuiteReport, run_suite};
use crate::jobs::{self, Server};
use fedemb::{BASELINE_SERVER_LEARNING_RATE, BASELINE_SERVER_MOMENTUM};

/// Options of `dpctl demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Working directory (dataset, ledger, job store, report).
    #[arg(long, default_value = "./dpcap-demo")]
    pub dir: PathBuf,
    /// Training examples N.
    #[arg(long, default_value_t = 20_000)]
    pub examples: u64,
    /// Held-out labelled single-shape images for the linear and few-shot probes (2/3 fit
    /// them, 1/3 score them).
    #[arg(long, default_value_t = 3_000)]
    pub eval_examples: u64,
    /// Held-out images per likelihood test (zero-shot, ARO, layout) and for caption slots.
    #[arg(long, default_value_t = 600)]
    pub eval_images: u64,
    /// Target ε (δ = 1/N).
    #[arg(long, default_value_t = 8.0)]
    pub epsilon: f64,
    /// Expected batch size L = qN.
    #[arg(long, default_value_t = 1_500)]
    pub batch_size: u64,
    /// Steps (default: 150 for caption and mae, 100 for fedemb).
    #[arg(long)]
    pub steps: Option<u64>,
    /// Peak learning rate.
    #[arg(long, default_value_t = 3e-3)]
    pub learning_rate: f64,
    /// CPU workers.
    #[arg(long, default_value_t = 2)]
    pub workers: u32,
    /// Objective: caption (DP-Cap, the default), mae (ViP; no captions in the report) or
    /// fedemb (DP-FedEmb: user-level DP embeddings, retrieval recall in the report).
    #[arg(long, default_value = "caption")]
    pub objective: Family,
    /// fedemb: users in the identity dataset (the accounting N; δ = 1/users).
    #[arg(long, default_value_t = 2_000)]
    pub users: u64,
    /// fedemb: expected users sampled per step (q = clients-per-step / users).
    #[arg(long, default_value_t = 200)]
    pub clients_per_step: u64,
    /// fedemb: clipping norm C of each user's backbone delta (L2).
    #[arg(long, default_value_t = 0.5)]
    pub client_clipping_norm: f64,
    /// fedemb: the DP job's server learning rate on the averaged delta (server SGD).
    #[arg(long, default_value_t = 1.0)]
    pub server_learning_rate: f64,
    /// fedemb: the DP job's server SGD momentum.
    #[arg(long, default_value_t = 0.9)]
    pub server_momentum: f64,
    /// fedemb: the NOT PRIVATE baseline's server learning rate, tuned on its own: without
    /// noise in the averaged delta, a larger step is stable, and the DP job's rate leaves the
    /// baseline under-trained (it would not be a ceiling).
    #[arg(long, default_value_t = BASELINE_SERVER_LEARNING_RATE)]
    pub baseline_server_learning_rate: f64,
    /// fedemb: the NOT PRIVATE baseline's server SGD momentum.
    #[arg(long, default_value_t = BASELINE_SERVER_MOMENTUM)]
    pub baseline_server_momentum: f64,
    /// fedemb: local SGD learning rate on each user's examples.
    #[arg(long, default_value_t = 0.5)]
    pub local_learning_rate: f64,
    /// fedemb: held-out identities (owned by no user, four images each) for retrieval.
    #[arg(long, default_value_t = 100)]
    pub heldout_identities: u64,
    /// Generated captions shown in the report.
    #[arg(long, default_value_t = 4)]
    pub captions: usize,
    /// Steps of a NOT PRIVATE warm start before the DP phase (0: none): an MAE job on
    /// procedural images with no private content, whose encoder the DP job and its baseline
    /// start from (`init_from`), as ViP and DP-Cap start from Shaders21k.
    #[arg(long, default_value_t = 0)]
    pub warm_start: u64,
    /// Skip the NOT PRIVATE baseline (σ = 0, same steps, batch and schedule), which doubles
    /// the training time and shows the price of privacy beside the DP model.
    #[arg(long)]
    pub no_baseline: bool,
    /// Audit the DP job in one run with this many gradient-space canaries (0: no audit); the
    /// report gains `audit_*` keys.
    #[arg(long, default_value_t = 0)]
    pub audit: u32,
    /// Where the audit's canaries live: reserved (coordinates set aside for the audit, which
    /// no example moves) or model (the model's own coordinates, blurred by the examples).
    #[arg(long, default_value = "reserved", value_parser = ["reserved", "model"])]
    pub audit_coordinates: String,
}

impl DemoArgs {
    /// The steps of each job: `--steps`, or the objective's default.
    pub fn steps(&self) -> u64 {
        self.steps.unwrap_or(if self.objective.is_user_level() { 100 } else { 150 })
    }
}

/// Writes and indexes the synthetic training set unless it is already there. (Held-out
/// evaluation scenes are rendered in memory by the suite, from generator indices no dataset
/// reaches.)
async fn prepare_data(dir: &Path, args: &DemoArgs) -> Result<PathBuf> {
    let train = dir.join("data/train");
    let marker = dir.join("data/dataset.json");
    // The index format is part of what is wanted: data indexed by an older dpctl is redone.
    let wanted = json!({"examples": args.examples, "seed": 0, "index": dpcap_dataset::index::MANIFEST_VERSION});
    if std::fs::read(&marker).ok().and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        == Some(wanted.clone())
    {
        return Ok(train);
    }
    let _ = std::fs::remove_dir_all(dir.join("data"));
    eprintln!("synthesising {} training examples under {}", args.examples, dir.join("data").display());
    synth::write_shards(&train, (synth::Scene::Pair, 0), 0..args.examples, 1000, 32)
        .context("writing training shards")?;
    let options = crate::dataset::IndexOptions::synthetic(256);
    crate::dataset::index_dataset(&train.to_string_lossy(), &options).await?;
    std::fs::write(&marker, wanted.to_string())?;
    Ok(train)
}

/// Writes, indexes and budgets the procedural warm-start set (its owner allows NOT PRIVATE
/// jobs: it holds no private content), then runs the warm start to its end.
async fn warm_start(
    args: &DemoArgs,
    dir: &Path,
    (server, accountant): (&Server, &str),
    steps: u64,
) -> Result<train::Finished> {
    let procedural = dir.join("data/procedural");
    if !procedural.join("index/manifest.json").exists() {
        eprintln!("synthesising {} procedural warm-start images under {}", args.examples, procedural.display());
        synth::write_shards(&procedural, (synth::Scene::Procedural, 0), 0..args.examples, 1000, 32)
            .context("writing procedural shards")?;
        let options = crate::dataset::IndexOptions::synthetic(256);
        crate::dataset::index_dataset(&procedural.to_string_lossy(), &options).await?;
    }
    let index = crate::budget::indexed(&procedural.to_string_lossy()).await?;
    let budget = dpcap_proto::v1::SetDatasetBudgetRequest {
        dataset_id: index.budget_id,
        epsilon: args.epsilon,
        delta: 1.0 / index.examples as f64,
        reason: "dpctl demo: procedural images, no private content".into(),
        allow_not_private: true,
        unit: dpcap_proto::v1::PrivacyUnit::Example as i32,
        name: "demo".into(),
        population: index.examples,
        force: false,
        shards_id: index.shards_id.unwrap_or_default(),
    };
    set_dataset_budget(accountant, budget).await?;
    train::run(server, accountant, train::warm_start_spec(args, &procedural, steps)).await
}

/// How much the demo evaluates.
fn suite_options(args: &DemoArgs) -> SuiteOptions {
    SuiteOptions {
        images: args.eval_images as usize,
        probe_images: args.eval_examples as usize,
        samples: args.captions,
        ..Default::default()
    }
}

/// The evaluation suite of one named model (dp, random, or a further baseline), with progress.
fn evaluate(name: &str, trainer: &Trainer<CpuBackend>, options: &SuiteOptions) -> Result<SuiteReport> {
    eprintln!("evaluating the {name} model on held-out scenes");
    let report = run_suite::<CpuBackend>(&trainer.model, &trainer.params, options)
        .with_context(|| format!("evaluating the {name} model"))?;
    eprintln!("evaluated the {name} model in {:.1} s", report.seconds);
    Ok(report)
}

/// Runs the demo and writes `DIR/report.json`.
pub async fn run(args: DemoArgs) -> Result<()> {
    let started = Instant::now();
    // Refuse bad evaluation sizes before training, not after.
    suite_options(&args).check(["--eval-images", "--eval-examples"])?;
    std::fs::create_dir_all(&args.dir).with_context(|| format!("creating {}", args.dir.display()))?;
    let dir = std::fs::canonicalize(&args.dir)?;
    // A user-level objective needs examples that belong to users (identities).
    let train_dir = if args.objective.is_user_level() {
        fedemb::prepare_data(&dir, &args).await?
    } else {
        prepare_data(&dir, &args).await?
    };
    for stale in ["ledger", "store"] {
        let _ = std::fs::remove_dir_all(dir.join(stale));
    }
    let cluster = cluster::Cluster::start(&dir, args.workers as usize).await?;
    eprintln!(
        "cluster up: coordinator {}  accountant {}  metrics {} {}",
        cluster.coordinator, cluster.accountant, cluster.metrics[0], cluster.metrics[1]
    );
    let result = train_and_report(&args, &dir, &train_dir, &cluster, started).await;
    cluster.stop().await;
    result
}

async fn train_and_report(
    args: &DemoArgs,
    dir: &Path,
    train_dir: &Path,
    cluster: &cluster::Cluster,
    started: Instant,
) -> Result<()> {
    let server = Server { coordinator: cluster.coordinator.clone(), token: None, tls: Default::default() };
    set_budget(args, train_dir, &cluster.accountant).await?;
    let warm = match args.warm_start {
        0 => None,
        steps => Some(warm_start(args, dir, (&server, &cluster.accountant), steps).await?),
    };
    if args.objective.is_user_level() {
        return fedemb::train_and_report(args, dir, train_dir, (&server, &cluster.accountant), warm.as_ref(), started)
            .await;
    }
    let init = warm.as_ref().map(|w| w.job.checkpoint_root.as_str());
    let dp_job = train::run(&server, &cluster.accountant, train::spec(args, train_dir, false, init)).await?;
    let baseline = match args.no_baseline {
        true => None,
        false => Some(train::run(&server, &cluster.accountant, train::spec(args, train_dir, true, init)).await?),
    };
    let reports = evaluate_jobs(args, dir, train_dir, &dp_job, baseline.as_ref()).await?;
    let jobs = Jobs { dp: &dp_job, baseline: baseline.as_ref(), warm: warm.as_ref() };
    let mut report = summary(args, dir, &jobs, &reports, started);
    if args.audit > 0 {
        add_audit(&mut report, args, &cluster.accountant, &dp_job.job.job_id).await?;
    }
    std::fs::write(dir.join("report.json"), serde_json::to_vec_pretty(&report)?)?;
    outln!("{}", serde_json::to_string_pretty(&report)?);
    let random = reports.iter().find(|(name, _)| *name == "random").map(|(_, r)| r);
    for (name, r) in &reports {
        let label = if *name == "nonprivate" { " (NOT PRIVATE)" } else { "" };
        let floor = random.filter(|_| *name != "random");
        eprintln!("{name} model{label}:\n{}", crate::eval::report::table(r, floor));
    }
    let (c, spend) = (crate::jobs::contract_of(&dp_job.job)?, &dp_job.spend);
    eprintln!(
        "epsilon spent {:.3} of {} at delta {:.2e} (PLD) over {} steps; report at {}",
        spend.epsilon_spent,
        c.epsilon_target.unwrap_or(f64::INFINITY),
        c.delta,
        spend.steps_charged,
        dir.join("report.json").display()
    );
    Ok(())
}

/// The data's owner sets the dataset's lifetime budget before any job may spend it; the data is
/// synthetic, so its owner also lets the NOT PRIVATE baseline train on it.
async fn set_budget(args: &DemoArgs, train_dir: &Path, accountant: &str) -> Result<()> {
    let index = crate::budget::indexed(&train_dir.to_string_lossy()).await?;
    let fedemb = args.objective.is_user_level();
    // The privacy unit's count as indexed: users for fedemb, examples otherwise.
    let population = if fedemb { index.users.unwrap_or(args.users) } else { index.examples };
    let budget = dpcap_proto::v1::SetDatasetBudgetRequest {
        dataset_id: index.budget_id,
        shards_id: index.shards_id.unwrap_or_default(),
        epsilon: args.epsilon,
        delta: 1.0 / population as f64,
        population,
        force: false,
        reason: "dpctl demo: synthetic data; one DP job and its non-private baseline".into(),
        allow_not_private: !args.no_baseline,
        // fedemb protects users: its budget is a user-level one.
        unit: if fedemb { dpcap_proto::v1::PrivacyUnit::User } else { dpcap_proto::v1::PrivacyUnit::Example } as i32,
        name: if fedemb { "demo-fedemb" } else { "demo" }.into(),
    };
    set_dataset_budget(accountant, budget).await
}

/// Sets a budget as the data's owner, retrying while the embedded accountant is still
/// replaying its ledger (it serves health before it serves jobs).
async fn set_dataset_budget(accountant: &str, budget: dpcap_proto::v1::SetDatasetBudgetRequest) -> Result<()> {
    let client = dpcap_proto::client::AccountantClient::connect(accountant.to_owned()).await?;
    let policy = dpcap_proto::RetryPolicy { deadline: std::time::Duration::from_secs(60), ..Default::default() };
    dpcap_proto::retry(policy, "set_dataset_budget", || {
        let (mut client, budget) = (client.clone(), budget.clone());
        async move { client.raw().set_dataset_budget(budget).await }
    })
    .await
    .map_err(jobs::status)?;
    Ok(())
}

/// The jobs a demo ran.
struct Jobs<'a> {
    dp: &'a train::Finished,
    baseline: Option<&'a train::Finished>,
    warm: Option<&'a train::Finished>,
}

/// The evaluation suite on the DP model, its baseline and a random initialisation; the trained
/// encoders are written beside the report.
async fn evaluate_jobs(
    args: &DemoArgs,
    dir: &Path,
    train_dir: &Path,
    dp_job: &train::Finished,
    baseline: Option<&train::Finished>,
) -> Result<Vec<(&'static str, SuiteReport)>> {
    let options = suite_options(args);
    let tokenizer = Dataset::open(&train_dir.to_string_lossy()).await?.tokenizer("").await?;
    let (dp, dp_manifest) = train::trained(args, &tokenizer, &dp_job.job).await?;
    let mut reports = vec![("dp", evaluate("dp", &dp, &options)?)];
    if let Some(baseline) = baseline {
        let (nonprivate, manifest) = train::trained(args, &tokenizer, &baseline.job).await?;
        reports.push(("nonprivate", evaluate("nonprivate (NOT PRIVATE)", &nonprivate, &options)?));
        std::fs::write(dir.join("encoder-nonprivate.safetensors"), export_encoder(&nonprivate.params, &manifest)?)?;
    }
    reports.push(("random", evaluate("random", &train::fresh(args, &tokenizer)?, &options)?));
    std::fs::write(dir.join("encoder.safetensors"), export_encoder(&dp.params, &dp_manifest)?)?;
    Ok(reports)
}

/// `report.json`: the privacy spend, the plan, the losses (non-DP telemetry, named so) and
/// every model's scores.
fn summary(
    args: &DemoArgs,
    dir: &Path,
    jobs: &Jobs<'_>,
    reports: &[(&'static str, SuiteReport)],
    started: Instant,
) -> serde_json::Value {
    let (dp_job, baseline, warm) = (jobs.dp, jobs.baseline, jobs.warm);
    let progress = dp_job.job.progress.clone().unwrap_or_default();
    let c = dp_job.job.plan.as_ref().and_then(|p| dpcap_proto::plan::contract(p).ok());
    let m = c.as_ref().map(|c| c.mechanism);
    let spend = &dp_job.spend;
    let score = |name: &str| reports.iter().find(|(n, _)| *n == name).map(|(_, r)| r);
    let captions: Vec<_> = score("dp")
        .map(|r| r.captions.iter().map(|c| json!({"reference": c.reference, "generated": c.generated})).collect())
        .unwrap_or_default();
    let mut report = json!({
        "job_id": dp_job.job.job_id,
        "epsilon_spent": spend.epsilon_spent,
        "epsilon_target": c.as_ref().and_then(|c| c.epsilon_target),
        "delta": c.as_ref().map(|c| c.delta),
        "accountant": "pld",
        "objective": args.objective,
        "steps": spend.steps_charged,
        "noise_multiplier": m.map(|m| m.noise_multiplier),
        "sample_rate": m.map(|m| m.sample_rate),
        "clipping_norm": m.map(|m| m.clipping_norm),
        "loss_start": progress.loss_first,
        "loss_end": progress.loss,
        "captions": captions,
        "nonprivate_job_id": baseline.map(|b| b.job.job_id.clone()),
        "warm_start_job_id": warm.map(|w| w.job.job_id.clone()),
        "warm_start_steps": args.warm_start,
        "nonprivate_privacy": baseline.map(|_| "NOT PRIVATE: sigma = 0, same steps, batch and schedule"),
        "loss_end_nonprivate": baseline.and_then(|b| b.job.progress.as_ref().and_then(|p| p.loss)),
        "wall_s": started.elapsed().as_secs_f64(),
        "non_dp_telemetry": ["loss_start", "loss_end", "loss_end_nonprivate", "captions.reference"],
        "encoder": dir.join("encoder.safetensors"),
        "checkpoint": dp_job.job.checkpoint_root,
        "checkpoint_nonprivate": baseline.map(|b| b.job.checkpoint_root.clone()),
    });
    if let Some(fields) = report.as_object_mut() {
        let named: Vec<(&str, &SuiteReport)> = reports.iter().map(|(name, r)| (*name, r)).collect();
        fields.extend(named_keys(&named));
    }
    report
}

/// The DP job's one-run audit, into the report.
async fn add_audit(report: &mut serde_json::Value, args: &DemoArgs, accountant: &str, job_id: &str) -> Result<()> {
    let mut client = dpcap_proto::client::AccountantClient::connect(accountant.to_owned()).await?;
    let request = dpcap_proto::v1::AuditJobRequest { job_id: job_id.to_owned() };
    let audit = client.raw().audit_job(request).await.map_err(jobs::status)?.into_inner();
    if let Some(fields) = report.as_object_mut() {
        fields.extend([
            ("audit_canaries".to_owned(), json!(audit.canaries)),
            ("audit_coordinates".to_owned(), json!(args.audit_coordinates)),
            ("audit_guesses".to_owned(), json!(audit.guesses)),
            ("audit_correct".to_owned(), json!(audit.correct)),
            ("audit_epsilon_lower_bound".to_owned(), json!(audit.epsilon_lower_bound)),
            ("audit_epsilon_lower_bound_fdp".to_owned(), json!(audit.epsilon_lower_bound_fdp)),
            ("audit_violation".to_owned(), json!(audit.violation)),
            ("audit_covers".to_owned(), json!(audit.covers)),
        ]);
    }
    Ok(())
}
