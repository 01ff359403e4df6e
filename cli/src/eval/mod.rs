//! `dpctl eval`: scores a job's checkpoint on held-out synthetic scenes the training never saw
//! (see [`suite`]): caption-likelihood tests in the style of DP-Cap's zero-shot and ARO
//! evaluations, caption slot accuracy, and linear and few-shot probes. `--random-init` scores
//! a freshly initialised model of the same configuration instead: the baseline every number
//! should be read against.

pub mod probe;
pub mod report;
pub mod suite;

use anyhow::{Context, Result, anyhow};
use clap::Args;
use dpcap_dataset::reader::Dataset;
use dpcap_dataset::tokenizer::CaptionTokenizer;
use dpcap_ml::CpuBackend;
use dpcap_ml::checkpoint::Manifest;
use dpcap_ml::checkpoint::load_weights;
use dpcap_ml::params::ParamSet;
use dpcap_ml::trainer::Model;
use serde_json::{Value, json};

use suite::{SuiteOptions, run_suite};

type Inner = <CpuBackend as burn::tensor::backend::AutodiffBackend>::InnerBackend;

/// Seed of the `--random-init` weights (the demo's random baseline uses the same).
const RANDOM_INIT_SEED: u64 = 0;

/// Options of `dpctl eval`.
#[derive(Debug, Clone, Args)]
pub struct EvalArgs {
    /// The job's checkpoint root: a directory or URL holding STEP/… and `latest`
    /// (`dpctl get JOB` shows it).
    #[arg(long)]
    pub checkpoint: String,
    /// The checkpoint's step (default: the latest).
    #[arg(long)]
    pub step: Option<u64>,
    /// The job's training dataset: its tokenizer.json is the model's.
    #[arg(long)]
    pub dataset: String,
    /// Score a freshly initialised model of the checkpoint's configuration instead.
    #[arg(long)]
    pub random_init: bool,
    /// Held-out images per likelihood test and for caption slots.
    #[arg(long, default_value_t = SuiteOptions::default().images)]
    pub images: usize,
    /// Held-out single-shape images for the linear and few-shot probes.
    #[arg(long, default_value_t = SuiteOptions::default().probe_images)]
    pub probe_images: usize,
    /// Seed of the synthetic generator the training dataset was written with.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// A model of the manifest's configuration with fresh weights from `seed`.
fn build(manifest: &Manifest, tokenizer: Option<CaptionTokenizer>, seed: u64) -> Result<(Model, ParamSet<Inner>)> {
    let mut params = ParamSet::seeded(&Default::default(), seed);
    let model = Model::new(manifest.objective, &manifest.model, tokenizer, &Default::default(), &mut params)?;
    Ok((model, params))
}

/// Loads the checkpoint (or its configuration only, with `--random-init`), runs the suite and
/// prints it.
pub async fn run(args: EvalArgs) -> Result<()> {
    let root = &args.checkpoint;
    let options =
        SuiteOptions { images: args.images, probe_images: args.probe_images, seed: args.seed, ..Default::default() };
    options.check(["--images", "--probe-images"])?;
    let crate::checkpoint::Loaded { step, manifest, weights } = crate::checkpoint::load(root, args.step).await?;
    // Only the caption objective scores captions (and so reads the dataset's tokenizer); every
    // objective's encoder is probed.
    let tokenizer = if manifest.objective.has_captions() {
        let dataset = Dataset::open(&args.dataset).await.map_err(|e| anyhow!("--dataset {}: {e}", args.dataset))?;
        Some(dataset.tokenizer("").await.map_err(|e| anyhow!("--dataset {}: {e}", args.dataset))?)
    } else {
        None
    };
    let (model, mut params) = build(&manifest, tokenizer, RANDOM_INIT_SEED)
        .map_err(|e| anyhow!("--checkpoint {root}: checkpoint {step}: {e}"))?;
    if !args.random_init {
        load_weights(&mut params, &weights).map_err(|e| {
            anyhow!("--checkpoint {root}: checkpoint {step} does not fit model {}: {e}", manifest.model)
        })?;
    }
    let report = run_suite::<CpuBackend>(&model, &params, &options).context("running the evaluation suite")?;
    let weights_from = if args.random_init { "random init" } else { "checkpoint" };
    if args.json {
        let mut out = json!({
            "checkpoint": root,
            "step": step,
            "model": manifest.model,
            "objective": manifest.objective,
            "privacy": manifest.privacy,
            "random_init": args.random_init,
        });
        if let (Some(out), Value::Object(fields)) = (out.as_object_mut(), serde_json::to_value(&report)?) {
            out.extend(fields);
        }
        outln!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        // Weights without the DP guarantee say so wherever they are shown.
        let privacy = manifest.privacy_label();
        outln!(
            "checkpoint {root} step {step}: model {} ({}, {privacy}), weights from {weights_from}",
            manifest.model,
            manifest.objective
        );
        outln!("{}", report::table(&report, None));
    }
    Ok(())
}
