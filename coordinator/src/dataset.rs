//! What the coordinator needs of a dataset: N (for accounting) and examples per shard (for
//! work units), read from the `index.json` that `dpctl dataset index` writes beside the shards.

use dpcap_proto::dataset::DatasetIndex;
use dpcap_serve::open_store;
use object_store::ObjectStoreExt;
use object_store::path::Path;

use crate::error::CoordinatorError;

/// A dataset as planned: N, examples per shard, and the digest of the index that fixes both.
#[derive(Debug, Clone)]
pub struct Layout {
    /// N.
    pub examples: u64,
    /// Examples per shard, in shard order.
    pub counts: Vec<u64>,
    /// `dpcap_proto::digest::sha256` of `index.json`.
    pub digest: String,
}

/// Reads `index.json` under the dataset URL.
pub async fn read_layout(dataset: &str) -> Result<Layout, CoordinatorError> {
    let invalid = |reason: String| CoordinatorError::invalid("dataset", reason);
    let (store, root) = open_store(dataset).map_err(|e| invalid(e.to_string()))?;
    let path = Path::from(format!("{root}/index.json").trim_start_matches('/'));
    let bytes = async { store.get(&path).await?.bytes().await }
        .await
        .map_err(|e| invalid(format!("cannot read index.json in {dataset:?} (run `dpctl dataset index`): {e}")))?;
    let index: DatasetIndex =
        serde_json::from_slice(&bytes).map_err(|e| invalid(format!("index.json in {dataset:?} is malformed: {e}")))?;
    let counts = index.counts();
    if counts.iter().sum::<u64>() != index.examples {
        return Err(invalid(format!(
            "index.json in {dataset:?} says {} examples but its shards hold {}",
            index.examples,
            counts.iter().sum::<u64>()
        )));
    }
    Ok(Layout { examples: index.examples, counts, digest: dpcap_proto::digest::sha256(&bytes) })
}
