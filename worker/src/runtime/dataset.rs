//! A job's dataset as the worker sees it: the index, the store, and the tokenizer, and reads
//! of the sampled examples of a work unit, concurrently and by range requests only.

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

use crate::data::tokenizer::CaptionTokenizer;
use crate::data::{DatasetIndex, Example, read_example};
use crate::runtime::RuntimeError;

/// Range reads in flight per rank.
const READ_CONCURRENCY: usize = 16;

/// An opened dataset.
#[derive(Debug, Clone)]
pub struct Dataset {
    store: Arc<dyn ObjectStore>,
    root: Path,
    index: Arc<DatasetIndex>,
    starts: Vec<u64>,
    digest: String,
}

async fn read_bytes(store: &dyn ObjectStore, path: &Path) -> Result<bytes::Bytes, object_store::Error> {
    store.get(path).await?.bytes().await
}

impl Dataset {
    /// Opens `url` and reads its `index.json`.
    pub async fn open(url: &str) -> Result<Self, RuntimeError> {
        let (store, root) = dpcap_serve::open_store(url).map_err(|e| RuntimeError::Data(e.to_string()))?;
        let path = Path::from(format!("{root}/index.json").trim_start_matches('/'));
        let bytes = read_bytes(store.as_ref(), &path)
            .await
            .map_err(|e| RuntimeError::Data(format!("{url}/index.json: {e}")))?;
        let digest = dpcap_proto::digest::sha256(&bytes);
        let index: DatasetIndex =
            serde_json::from_slice(&bytes).map_err(|e| RuntimeError::Data(format!("{url}/index.json: {e}")))?;
        let mut starts = Vec::with_capacity(index.shards.len());
        let mut total = 0;
        for shard in &index.shards {
            starts.push(total);
            total += shard.examples.len() as u64;
        }
        Ok(Self { store, root, index: Arc::new(index), starts, digest })
    }

    /// Refuses a dataset other than the one the job was planned and accounted on: a different
    /// index (re-indexed, shards added or removed) could map two sampled positions to one
    /// example or read examples the accounting never saw.
    pub fn check_pinned(&self, digest: &str, examples: u64) -> Result<(), RuntimeError> {
        if !digest.is_empty() && digest != self.digest {
            return Err(RuntimeError::Spec {
                field: "dataset",
                reason: format!("index digest {} differs from the job's pinned {digest}", self.digest),
            });
        }
        if examples != self.index.examples {
            return Err(RuntimeError::Spec {
                field: "dataset",
                reason: format!("index has {} examples, the job's plan {examples}", self.index.examples),
            });
        }
        Ok(())
    }

    /// N.
    pub fn examples(&self) -> u64 {
        self.index.examples
    }

    /// The tokenizer: `location` (a path or URL of a tokenizer.json) or the dataset's own
    /// `tokenizer.json` when empty.
    pub async fn tokenizer(&self, location: &str) -> Result<CaptionTokenizer, RuntimeError> {
        let bytes = if location.is_empty() {
            let path = Path::from(format!("{}/tokenizer.json", self.root).trim_start_matches('/'));
            read_bytes(self.store.as_ref(), &path).await.map_err(|e| RuntimeError::Spec {
                field: "tokenizer",
                reason: format!(
                    "none given and the dataset has no tokenizer.json ({e}); run `dpctl dataset index` or set tokenizer"
                ),
            })?
        } else {
            let (dir, file) = location.rsplit_once('/').unwrap_or((".", location));
            let (store, root) = dpcap_serve::open_store(dir)
                .map_err(|e| RuntimeError::Spec { field: "tokenizer", reason: e.to_string() })?;
            let path = Path::from(format!("{root}/{file}").trim_start_matches('/'));
            read_bytes(store.as_ref(), &path)
                .await
                .map_err(|e| RuntimeError::Spec { field: "tokenizer", reason: format!("{location}: {e}") })?
        };
        CaptionTokenizer::from_bytes(&bytes)
            .map_err(|e| RuntimeError::Spec { field: "tokenizer", reason: e.to_string() })
    }

    /// Global index of position `local` in shard `shard`, bounds-checked against the shard.
    pub fn global(&self, shard: usize, local: u64) -> Result<u64, RuntimeError> {
        let start = self
            .starts
            .get(shard)
            .ok_or_else(|| RuntimeError::Protocol(format!("work unit names shard {shard} of {}", self.starts.len())))?;
        let count = self.index.shards[shard].examples.len() as u64;
        if local >= count {
            return Err(RuntimeError::Protocol(format!(
                "work unit names example {local} of shard {shard}, which holds {count}"
            )));
        }
        Ok(start + local)
    }

    /// Reads examples by global index.
    pub async fn read(&self, indices: Vec<u64>) -> Result<Vec<Example>, RuntimeError> {
        futures::stream::iter(indices)
            .map(|i| async move { read_example(self.store.as_ref(), &self.root, &self.index, i).await })
            .buffered(READ_CONCURRENCY)
            .try_collect()
            .await
            .map_err(|e| RuntimeError::Data(e.to_string()))
    }
}
