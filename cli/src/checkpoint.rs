//! Reading a job's checkpoint by its root and step, for the commands that score or export one
//! (`dpctl eval`, `dpctl export`). Reading never creates the directory a mistyped path names.

use anyhow::{Result, anyhow, bail};
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

/// Loads checkpoint `step` (default: the latest) under `root`; errors name the checkpoint
/// argument or `--step` with the value, and a step that is not there lists those that are.
pub async fn load(root: &str, step: Option<u64>) -> Result<Loaded> {
    let named = |e: &dyn std::fmt::Display| anyhow!("checkpoint {root}: {e}");
    dpcap_serve::open_existing_store(root).map_err(|e| named(&e))?;
    let store = CheckpointStore::open(root).map_err(|e| named(&e))?;
    let step = match step {
        Some(step) => step,
        None => match store.latest().await.map_err(|e| named(&e))? {
            Some(step) => step,
            None => {
                let steps = store.steps().await.map_err(|e| named(&e))?;
                bail!("checkpoint {root}: no `latest` pointer; {}", listing(&steps))
            }
        },
    };
    match store.load(step).await {
        Ok((manifest, weights, _)) => Ok(Loaded { step, manifest, weights }),
        Err(e) => {
            let steps = store.steps().await.unwrap_or_default();
            bail!("--step {step}: no readable checkpoint {step} under {root} ({e}); {}", listing(&steps))
        }
    }
}

/// What to pass instead: the steps that exist, or that there are none.
fn listing(steps: &[u64]) -> String {
    match steps {
        [] => "it holds no checkpoint: pass a job's checkpoint root (`dpctl get JOB` shows it)".into(),
        _ => {
            let steps: Vec<String> = steps.iter().map(u64::to_string).collect();
            format!("its steps are {}: pass one with --step", steps.join(", "))
        }
    }
}
