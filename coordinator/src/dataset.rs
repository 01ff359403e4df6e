//! What the coordinator needs of a dataset: N (for accounting) and examples per shard (for
//! work units), read from the manifest that `dpctl dataset index` writes under `index/`. Only
//! the manifest is read: O(shards) memory (about 4 MB at LAION's 23k shards), never the
//! per-example tables.

use dpcap_dataset::index::{Layout, MANIFEST_PATH, Manifest, USERS_PATH};
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
    /// Whether the index pins every shard's bytes (version 3), not only its tables.
    pub pins_bytes: bool,
    /// [`Manifest::data_digest`]: what the data is, whatever indexed it (None for an index
    /// that pins no shard bytes).
    pub data_id: Option<String>,
}

/// A dataset location that cannot be opened.
fn location(source: dpcap_serve::StoreError) -> CoordinatorError {
    CoordinatorError::Location { field: "dataset", source }
}

/// Reads and validates the manifest under the dataset URL.
pub async fn read_layout(dataset: &str) -> Result<DatasetLayout, CoordinatorError> {
    let (store, root) = open_existing_store(dataset).map_err(location)?;
    let path = Path::from(format!("{root}/{MANIFEST_PATH}").trim_start_matches('/'));
    let bytes = async { store.get(&path).await?.bytes().await }.await.map_err(|source| CoordinatorError::Read {
        field: "dataset",
        what: format!("{MANIFEST_PATH} in {dataset:?} (run `dpctl dataset index`)"),
        source,
    })?;
    let manifest = Manifest::parse(&bytes)
        .map_err(|source| CoordinatorError::Index { what: format!("{MANIFEST_PATH} in {dataset:?}"), source })?;
    let counts: Vec<u64> = manifest.shards.iter().map(|s| s.examples).collect();
    let pins_bytes = manifest.shards.iter().all(|s| s.pins_bytes());
    Ok(DatasetLayout {
        layout: Layout::from_counts(&counts),
        counts,
        digest: Manifest::digest(&bytes),
        pins_bytes,
        data_id: manifest.data_digest(),
    })
}

/// A user-level job's privacy units.
#[derive(Debug, Clone)]
pub struct Users {
    /// Distinct users.
    pub users: u64,
    /// Each client's examples (global, ascending).
    pub clients: Vec<Vec<u64>>,
    /// The user table's digest, as the manifest pins it (the contract names it).
    pub users_digest: String,
}

/// The clients of a user-level job: the dataset's user table (checked against the manifest,
/// whose digest must be `digest`, the one the job pinned) grouped `per_client` users a client.
pub async fn read_clients(dataset: &str, digest: &str, per_client: u32) -> Result<Users, CoordinatorError> {
    let invalid = |reason: String| CoordinatorError::invalid("dataset", reason);
    let (store, root) = open_existing_store(dataset).map_err(location)?;
    let read = |rel: &'static str| {
        let (store, path) = (store.clone(), Path::from(format!("{root}/{rel}").trim_start_matches('/')));
        async move { store.get(&path).await?.bytes().await }
    };
    let unread =
        |what: &'static str| move |source| CoordinatorError::Read { field: "dataset", what: what.to_owned(), source };
    let manifest_bytes = read(MANIFEST_PATH).await.map_err(unread(MANIFEST_PATH))?;
    if Manifest::digest(&manifest_bytes) != digest {
        return Err(invalid(format!("the index of {dataset:?} is no longer the one the job pinned ({digest})")));
    }
    let manifest = Manifest::parse(&manifest_bytes)
        .map_err(|source| CoordinatorError::Index { what: MANIFEST_PATH.to_owned(), source })?;
    let Some(users_digest) = manifest.users.as_ref().map(|u| u.table_sha256.clone()) else {
        return Err(CoordinatorError::invalid(
            "objective",
            format!("fedemb needs users: no example of {dataset:?} names a `user` in its KEY.json"),
        ));
    };
    let users = read(USERS_PATH).await.map_err(unread(USERS_PATH))?;
    let table = tokio::task::spawn_blocking(move || manifest.check_users(&users))
        .await
        .map_err(|source| CoordinatorError::Task { what: "the users table's check", source })?
        .map_err(|source| CoordinatorError::Index { what: USERS_PATH.to_owned(), source })?;
    Ok(Users { users: table.users() as u64, clients: table.clients(per_client), users_digest })
}
