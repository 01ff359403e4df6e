//! Reading a job's checkpoint by its root and step, for the commands that score or export one
//! (`dpctl eval`, `dpctl export`). Reading never creates the directory a mistyped path names.

use anyhow::{Result, anyhow};
use dpcap_ml::checkpoint::{CheckpointStore, Manifest};

/// One checkpoint: its step, manifest and weights (safetensors bytes).
#[derive(Debug)]
pub struct Loaded {
    /// The checkpoint's step.
    pub step: u64,
    /// What the weights are (model, objective, privacy, provenance).
    pub manifest: Manifest,
    /// The model's weights as a safetensors file.
    pub weights: Vec<u8>,
}

/// Loads checkpoint `step` (default: the latest) under `root`; errors name `--checkpoint` or
/// `--step` and the value.
pub async fn load(root: &str, step: Option<u64>) -> Result<Loaded> {
    dpcap_serve::open_existing_store(root).map_err(|e| anyhow!("--checkpoint {root}: {e}"))?;
    let store = CheckpointStore::open(root).map_err(|e| anyhow!("--checkpoint {root}: {e}"))?;
    let step = match step {
        Some(step) => step,
        None => store
            .latest()
            .await
            .map_err(|e| anyhow!("--checkpoint {root}: {e}"))?
            .ok_or_else(|| anyhow!("--checkpoint {root}: no checkpoint there (no `latest` pointer)"))?,
    };
    let (manifest, weights, _) = store
        .load(step)
        .await
        .map_err(|e| anyhow!("--step {step}: no readable checkpoint {step} under {root}: {e}"))?;
    Ok(Loaded { step, manifest, weights })
}
