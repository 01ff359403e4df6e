//! What the coordinator needs of a dataset: N (for accounting) and examples per shard (for
//! work units), read from the manifest that `dpctl dataset index` writes under `index/`. Only
//! the manifest is read: O(shards) memory (about 4 MB at LAION's 23k shards), never the
//! per-example tables.

use dpcap_proto::index::{Layout, MANIFEST_PATH, Manifest};
use dpcap_serve::open_existing_store;
use object_store::ObjectStoreExt;
use object_store::path::Path;

use crate::error::CoordinatorError;

/// A dataset as planned: shard boundaries and the digest that fixes them.
#[derive(Debug, Clone)]
pub struct DatasetLayout {
    /// Shard boundaries; N is `layout.examples()`.
    pub layout: Layout,
    /// Examples per shard, in shard order (persisted with the job).
    pub counts: Vec<u64>,
    /// [`Manifest::digest`] of the manifest.
    pub digest: String,
}

/// Reads and validates the manifest under the dataset URL.
pub async fn read_layout(dataset: &str) -> Result<DatasetLayout, CoordinatorError> {
    let invalid = |reason: String| CoordinatorError::invalid("dataset", reason);
    let (store, root) = open_existing_store(dataset).map_err(|e| invalid(e.to_string()))?;
    let path = Path::from(format!("{root}/{MANIFEST_PATH}").trim_start_matches('/'));
    let bytes = async { store.get(&path).await?.bytes().await }
        .await
        .map_err(|e| invalid(format!("cannot read {MANIFEST_PATH} in {dataset:?} (run `dpctl dataset index`): {e}")))?;
    let manifest = Manifest::parse(&bytes).map_err(|e| invalid(format!("{MANIFEST_PATH} in {dataset:?}: {e}")))?;
    let counts: Vec<u64> = manifest.shards.iter().map(|s| s.examples).collect();
    Ok(DatasetLayout { layout: Layout::from_counts(&counts), counts, digest: Manifest::digest(&bytes) })
}
