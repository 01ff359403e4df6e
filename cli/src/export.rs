//! `dpctl export`: a checkpoint's image encoder as a file other tools load. `--format dpcap`
//! keeps our names and layout (Linear weights [d_in, d_out]); `--format timm` writes a timm
//! `VisionTransformer` state dict that loads with `strict=True` (`dpcap_ml::timm`). Both
//! carry the checkpoint's provenance, and a NOT PRIVATE model's notice, in the metadata.

use std::path::PathBuf;

use anyhow::{Result, anyhow};
use clap::{Args, ValueEnum};
use dpcap_ml::CpuBackend;
use dpcap_ml::checkpoint::{export_encoder, load_weights_with_prefix};
use dpcap_ml::model::{Encoder, EncoderConfig};
use dpcap_ml::params::ParamSet;
use dpcap_ml::timm;
use dpcap_registry::Family;
use serde_json::json;

type Inner = <CpuBackend as burn::tensor::backend::AutodiffBackend>::InnerBackend;

/// Images in the `--check-vectors` file.
const CHECK_IMAGES: usize = 4;
/// Seed of the `--check-vectors` images.
const CHECK_SEED: u64 = 7;

/// Layout of the exported file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Our parameter names, Linear weights as [d_in, d_out] (`safetensors.torch` loads it).
    Dpcap,
    /// A timm VisionTransformer state dict (timm names, [out, in], fused qkv, conv patches).
    Timm,
}

/// Options of `dpctl export`.
#[derive(Debug, Clone, Args)]
pub struct ExportArgs {
    /// The job's checkpoint root: a directory or URL holding STEP/… and `latest`.
    pub checkpoint: String,
    /// The checkpoint's step (default: the latest).
    #[arg(long)]
    pub step: Option<u64>,
    /// Layout of the exported encoder.
    #[arg(long, value_enum, default_value_t = Format::Dpcap)]
    pub format: Format,
    /// Where to write the safetensors file.
    #[arg(long)]
    pub out: PathBuf,
    /// Also write seeded images and our encoder's tokens and features on them, to check the
    /// export with another implementation (`reference/timm_check.py`).
    #[arg(long)]
    pub check_vectors: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// The encoder shape of a checkpoint's model and objective.
fn encoder_config(model: &str, objective: Family) -> Result<EncoderConfig> {
    dpcap_ml::model::encoder_config(objective, model)
        .ok_or_else(|| anyhow!("the checkpoint's model {model:?} is not a known configuration"))
}

/// Loads the checkpoint's encoder and writes it (and the check vectors) in the chosen format.
pub async fn run(args: ExportArgs) -> Result<()> {
    let root = &args.checkpoint;
    let loaded = crate::checkpoint::load(root, args.step).await?;
    let (step, manifest) = (loaded.step, &loaded.manifest);
    let config = encoder_config(&manifest.model, manifest.objective)
        .map_err(|e| anyhow!("checkpoint {root} step {step}: {e}"))?;
    let mut params = ParamSet::<Inner>::seeded(&Default::default(), 0);
    let encoder = Encoder::new(&mut params, "encoder", config);
    load_weights_with_prefix(&mut params, &loaded.weights, "encoder.")
        .map_err(|e| anyhow!("checkpoint {root} step {step} does not fit model {}: {e}", manifest.model))?;
    let bytes = match args.format {
        Format::Dpcap => export_encoder(&params, manifest)?,
        Format::Timm => timm::export_timm(&params, config, manifest)?,
    };
    std::fs::write(&args.out, bytes).map_err(|e| anyhow!("--out {}: {e}", args.out.display()))?;
    if let Some(path) = &args.check_vectors {
        let vectors = timm::check_vectors::<CpuBackend>(&encoder, &params, CHECK_IMAGES, CHECK_SEED)?;
        std::fs::write(path, vectors).map_err(|e| anyhow!("--check-vectors {}: {e}", path.display()))?;
    }
    let privacy = manifest.privacy_label();
    if args.json {
        let out = json!({
            "checkpoint": root,
            "step": step,
            "model": manifest.model,
            "privacy": manifest.privacy,
            "format": format!("{:?}", args.format).to_lowercase(),
            "out": args.out,
            "timm_model_args": timm::model_args(config),
        });
        outln!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    outln!("wrote the encoder of {root} step {step} ({}, {privacy}) to {}", manifest.model, args.out.display());
    if args.format == Format::Timm {
        outln!("load it with timm:");
        outln!(
            "  model = timm.models.VisionTransformer({}, norm_layer=partial(torch.nn.LayerNorm, eps=1e-5))",
            python_kwargs(&timm::model_args(config))
        );
        outln!(
            "  model.load_state_dict(safetensors.torch.load_file({:?}), strict=True)",
            args.out.display().to_string()
        );
    }
    Ok(())
}

/// `{"a": true, "b": "avg"}` as Python keyword arguments: `a=True, b='avg'`.
fn python_kwargs(args: &serde_json::Value) -> String {
    let value = |v: &serde_json::Value| match v {
        serde_json::Value::Bool(b) => if *b { "True" } else { "False" }.to_owned(),
        serde_json::Value::String(s) => format!("'{s}'"),
        other => other.to_string(),
    };
    args.as_object()
        .map(|fields| fields.iter().map(|(k, v)| format!("{k}={}", value(v))).collect::<Vec<_>>().join(", "))
        .unwrap_or_default()
}
