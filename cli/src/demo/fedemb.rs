//! `dpctl demo --objective fedemb`: DP-FedEmb on one machine. Synthesises a user-partitioned
//! identity dataset, trains a `micro` embedder with user-level DP (users sampled, local SGD
//! per user, each user's backbone delta clipped, noise once at the accountant) and its NOT
//! PRIVATE federated baseline (σ = 0), and reports retrieval recall@1/@5 on held-out
//! identities for the DP, non-private and initial models.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use dpcap_dataset::identities::{self, IdentityLayout};
use dpcap_dataset::pipeline::Pipeline;
use dpcap_ml::CpuBackend;
use dpcap_ml::checkpoint::CheckpointStore;
use dpcap_ml::checkpoint::load_weights;
use dpcap_ml::eval::heldout;
use dpcap_ml::eval::retrieval::{self, Recall};
use dpcap_ml::model::{Embedder, EmbedderConfig};
use dpcap_ml::params::ParamSet;
use dpcap_proto::spec::FedEmbFile;
use dpcap_proto::spec::SpecFile;
use serde_json::json;

use super::DemoArgs;
use super::train::{self, Finished};
use crate::jobs::Server;

type Inner = <CpuBackend as burn::tensor::backend::AutodiffBackend>::InnerBackend;

/// The NOT PRIVATE baseline's server learning rate (see `--baseline-server-learning-rate`):
/// the best of 1, 3, 10 and 30 at the demo's defaults (recall@1 4.2, 11.0, 20.0 and 5.8 %;
/// docs/fedemb.md).
pub const BASELINE_SERVER_LEARNING_RATE: f64 = 10.0;
/// The NOT PRIVATE baseline's server SGD momentum.
pub const BASELINE_SERVER_MOMENTUM: f64 = 0.9;

/// The demo's identity set: `--users` users, two identities each, four images of each.
fn layout(args: &DemoArgs) -> IdentityLayout {
    IdentityLayout { users: args.users, identities_per_user: 4, images_per_identity: 3 }
}

/// Writes and indexes the identity set unless it is already there.
pub async fn prepare_data(dir: &Path, args: &DemoArgs) -> Result<PathBuf> {
    let root = dir.join("data/identities");
    let marker = root.join("dataset.json");
    let wanted =
        json!({"users": args.users, "layout": [4, 3], "seed": 0, "index": dpcap_dataset::index::MANIFEST_VERSION});
    if std::fs::read(&marker).ok().and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        == Some(wanted.clone())
    {
        return Ok(root.join("train"));
    }
    let _ = std::fs::remove_dir_all(&root);
    let layout = layout(args);
    eprintln!("synthesising {} users ({} identity images) under {}", layout.users, layout.examples(), root.display());
    let train = root.join("train");
    identities::write_shards(&train, 0, &layout, 250, 32).context("writing identity shards")?;
    // No tokenizer: the embedder reads no captions.
    let options = crate::dataset::IndexOptions { train_tokenizer: false, ..crate::dataset::IndexOptions::synthetic(0) };
    crate::dataset::index_dataset(&train.to_string_lossy(), &options).await?;
    std::fs::write(&marker, wanted.to_string())?;
    Ok(train)
}

/// The DP job (user-level ε at δ = 1/N_users) or, with `not_private`, its federated baseline.
fn spec(args: &DemoArgs, train_dir: &Path, not_private: bool, init: Option<&str>) -> SpecFile {
    SpecFile {
        init_from: init.map(str::to_owned),
        init_public: init.map(|_| true),
        name: if not_private { "demo-fedemb-nonprivate".into() } else { "demo-fedemb".into() },
        dataset: train_dir.to_string_lossy().into_owned(),
        model: "micro".into(),
        objective: Some("fedemb".into()),
        epsilon: (!not_private).then_some(args.epsilon),
        privacy: not_private.then(|| "not_private".into()),
        batch_size: Some(args.clients_per_step),
        steps: Some(args.steps()),
        clipping_norm: Some(args.client_clipping_norm),
        learning_rate: Some(if not_private { args.baseline_server_learning_rate } else { args.server_learning_rate }),
        warmup_steps: Some(0),
        workers: Some(args.workers),
        checkpoint_interval: Some(args.steps()),
        augment: Some("center_crop".into()),
        fedemb: Some(FedEmbFile {
            local_epochs: Some(1),
            local_batch: Some(6),
            local_learning_rate: Some(args.local_learning_rate),
            server_momentum: Some(if not_private { args.baseline_server_momentum } else { args.server_momentum }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A `micro` embedder with the jobs' own initial weights (seed 0), or the warm start's encoder.
async fn initial(init: Option<&Finished>) -> Result<(Embedder, ParamSet<Inner>)> {
    let mut params = ParamSet::<Inner>::seeded(&Default::default(), 0);
    let model = Embedder::new(&mut params, EmbedderConfig::named("micro").context("micro")?);
    if let Some(warm) = init {
        // The warm start's encoder (an MAE's), as `init_from` gives it to the jobs.
        let root = &warm.job.checkpoint_root;
        let checkpoints = CheckpointStore::open(root)?;
        let last = checkpoints.latest().await?.context("the warm start left no checkpoint")?;
        let (manifest, _, _) = checkpoints.load(last).await?;
        let objective = dpcap_registry::Family::Embedder;
        dpcap_ml::init::load_init(&mut params, root, ("micro", objective), (last, manifest.privacy)).await?;
    }
    Ok((model, params))
}

/// The embedder `job` trained, from its last checkpoint.
async fn trained(job: &Finished) -> Result<(Embedder, ParamSet<Inner>)> {
    let (model, mut params) = initial(None).await?;
    let checkpoints = CheckpointStore::open(&job.job.checkpoint_root)?;
    let last = checkpoints.latest().await?.with_context(|| format!("job {} left no checkpoint", job.job.job_id))?;
    let (_, weights, _) = checkpoints.load(last).await?;
    load_weights(&mut params, &weights)?;
    Ok((model, params))
}

/// Recall of one model on the held-out identities.
fn evaluate(
    name: &str,
    (model, params): &(Embedder, ParamSet<Inner>),
    heldout: &[dpcap_dataset::Example],
) -> Result<Recall> {
    let started = Instant::now();
    let recall =
        retrieval::recall::<CpuBackend>(model, params, heldout).with_context(|| format!("evaluating {name}"))?;
    eprintln!(
        "{name}: recall@1 {:.1} %, recall@5 {:.1} % over {} held-out images ({:.1} s)",
        100.0 * recall.at_1,
        100.0 * recall.at_5,
        recall.queries,
        started.elapsed().as_secs_f64()
    );
    Ok(recall)
}

/// Trains, evaluates and writes `DIR/report.json`.
pub async fn train_and_report(
    args: &DemoArgs,
    dir: &Path,
    train_dir: &Path,
    (server, accountant): (&Server, &str),
    warm: Option<&Finished>,
    started: Instant,
) -> Result<()> {
    let init = warm.map(|w| w.job.checkpoint_root.as_str());
    let dp = train::run(server, accountant, spec(args, train_dir, false, init)).await?;
    let baseline = match args.no_baseline {
        true => None,
        false => Some(train::run(server, accountant, spec(args, train_dir, true, init)).await?),
    };
    let layout = layout(args);
    let pipeline = Pipeline::clip(32)?;
    let images = identities::heldout(0, &layout, args.heldout_identities, 4, 32);
    let heldout = heldout::prepare(&images, &pipeline)?;
    let mut recalls = vec![("dp", evaluate("dp", &trained(&dp).await?, &heldout)?)];
    if let Some(b) = &baseline {
        recalls.push(("nonprivate", evaluate("nonprivate (NOT PRIVATE)", &trained(b).await?, &heldout)?));
    }
    recalls.push(("init", evaluate("init", &initial(warm).await?, &heldout)?));

    let plan = dp.job.plan.clone().unwrap_or_default();
    let c = crate::jobs::contract_of(&dp.job)?;
    let mut report = json!({
        "job_id": dp.job.job_id,
        "objective": "fedemb",
        "privacy_unit": "user",
        "epsilon_spent": dp.spend.epsilon_spent,
        "epsilon_target": c.epsilon_target,
        "delta": c.delta,
        "users": plan.users,
        "clients": plan.clients,
        "examples": plan.examples,
        "clients_per_step": dpcap_proto::plan::expected_batch_size(&plan, &c),
        "sample_rate": c.mechanism.sample_rate,
        "noise_multiplier": c.mechanism.noise_multiplier,
        "clipping_norm": c.mechanism.clipping_norm,
        "steps": dp.spend.steps_charged,
        "loss_start": dp.job.progress.as_ref().and_then(|p| p.loss_first),
        "loss_end": dp.job.progress.as_ref().and_then(|p| p.loss),
        "loss_end_nonprivate": baseline.as_ref().and_then(|b| b.job.progress.as_ref().and_then(|p| p.loss)),
        "non_dp_telemetry": ["loss_start", "loss_end", "loss_end_nonprivate"],
        "heldout_identities": args.heldout_identities,
        "heldout_images": heldout.len(),
        "nonprivate_job_id": baseline.as_ref().map(|b| b.job.job_id.clone()),
        "nonprivate_privacy": baseline.as_ref().map(|_| "NOT PRIVATE: sigma = 0, same rounds, clients and schedule"),
        "nonprivate_server_learning_rate": baseline.as_ref().map(|_| args.baseline_server_learning_rate),
        "nonprivate_server_momentum": baseline.as_ref().map(|_| args.baseline_server_momentum),
        "warm_start_job_id": warm.map(|w| w.job.job_id.clone()),
        "checkpoint": dp.job.checkpoint_root,
        "wall_s": started.elapsed().as_secs_f64(),
    });
    if let Some(fields) = report.as_object_mut() {
        for (name, r) in &recalls {
            fields.insert(format!("recall_at_1_{name}"), json!(r.at_1));
            fields.insert(format!("recall_at_5_{name}"), json!(r.at_5));
        }
    }
    std::fs::write(dir.join("report.json"), serde_json::to_vec_pretty(&report)?)?;
    outln!("{}", serde_json::to_string_pretty(&report)?);
    eprintln!(
        "user-level epsilon spent {:.3} of {} at delta {:.2e} over {} steps, {} users; report at {}",
        dp.spend.epsilon_spent,
        c.epsilon_target.unwrap_or(f64::INFINITY),
        c.delta,
        dp.spend.steps_charged,
        plan.users,
        dir.join("report.json").display()
    );
    Ok(())
}
