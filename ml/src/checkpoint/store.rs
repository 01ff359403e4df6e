//! Checkpoints on the job's object store: `{root}/{STEP}/weights.safetensors`,
//! `optimizer.safetensors` and `manifest.json`, then `{root}/latest` naming STEP, written last so
//! that a reader never sees a pointer to a partial checkpoint. Rank 0 is the only writer.
//! A checkpoint at STEP holds the state after every release of steps < STEP.

use std::sync::Arc;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use super::CheckpointError;

/// What a checkpoint is: the registry's type, which the coordinator reads too.
pub use dpcap_registry::Manifest;

/// The checkpoints of one job.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    store: Arc<dyn ObjectStore>,
    root: Path,
}

impl CheckpointStore {
    /// The store at `root_url` (a directory or URL, see `open_store`).
    pub fn open(root_url: &str) -> Result<Self, CheckpointError> {
        let (store, root) = dpcap_serve::open_store(root_url)?;
        Ok(Self { store, root })
    }

    /// Another job's checkpoints, to read (`init_from`): a local directory must exist.
    pub fn open_existing(root_url: &str) -> Result<Self, CheckpointError> {
        let (store, root) = dpcap_serve::open_existing_store(root_url)?;
        Ok(Self { store, root })
    }

    fn path(&self, rest: &str) -> Path {
        Path::from(format!("{}/{rest}", self.root).trim_start_matches('/'))
    }

    /// The latest complete checkpoint's step, if any.
    pub async fn latest(&self) -> Result<Option<u64>, CheckpointError> {
        match self.store.get(&self.path("latest")).await {
            Ok(r) => {
                let text = r.bytes().await?;
                let step = String::from_utf8_lossy(&text)
                    .trim()
                    .parse()
                    .map_err(|_| CheckpointError::Pointer(String::from_utf8_lossy(&text).into_owned()))?;
                Ok(Some(step))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The steps of the checkpoints under the root, ascending: every `STEP/` folder that holds
    /// a manifest (a save cut short before its manifest is left out).
    pub async fn steps(&self) -> Result<Vec<u64>, CheckpointError> {
        let listing = self.store.list_with_delimiter(Some(&self.root)).await?;
        let mut steps = Vec::new();
        for folder in listing.common_prefixes {
            let Some(step) = folder.filename().and_then(|name| name.parse::<u64>().ok()) else { continue };
            if self.store.head(&self.path(&format!("{step}/manifest.json"))).await.is_ok() {
                steps.push(step);
            }
        }
        steps.sort_unstable();
        Ok(steps)
    }

    /// Writes a checkpoint and then moves `latest` to it.
    pub async fn save(&self, manifest: &Manifest, weights: Vec<u8>, optimizer: Vec<u8>) -> Result<(), CheckpointError> {
        let dir = manifest.step.to_string();
        let json = serde_json::to_vec_pretty(manifest)
            .map_err(|source| CheckpointError::Manifest { step: manifest.step, source })?;
        for (name, body) in
            [("weights.safetensors", weights), ("optimizer.safetensors", optimizer), ("manifest.json", json)]
        {
            self.store.put(&self.path(&format!("{dir}/{name}")), PutPayload::from(body)).await?;
        }
        // Never move `latest` backwards: a superseded rank 0 finishing a save late must not
        // point past releases the accountant has trimmed since.
        if self.latest().await?.is_some_and(|current| current >= manifest.step) {
            tracing::warn!(job_id = %manifest.job_id, step = manifest.step, "a newer checkpoint exists; latest not moved");
            return Ok(());
        }
        self.store.put(&self.path("latest"), PutPayload::from(dir.into_bytes())).await?;
        Ok(())
    }

    /// The manifest, weights and optimizer bytes of checkpoint `step`.
    pub async fn load(&self, step: u64) -> Result<(Manifest, Vec<u8>, Vec<u8>), CheckpointError> {
        let get = |name: &str| {
            let path = self.path(&format!("{step}/{name}"));
            async move { self.store.get(&path).await?.bytes().await }
        };
        let manifest = get("manifest.json").await?;
        let manifest: Manifest =
            serde_json::from_slice(&manifest).map_err(|source| CheckpointError::Manifest { step, source })?;
        let weights = get("weights.safetensors").await?.to_vec();
        let optimizer = get("optimizer.safetensors").await?.to_vec();
        Ok((manifest, weights, optimizer))
    }
}
