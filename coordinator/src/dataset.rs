//! What the coordinator needs of a dataset: N (for accounting) and examples per shard (for
//! work units), read from the manifest that `dpctl dataset index` writes under `index/`. Only
//! the manifest is read: O(shards) memory (about 4 MB at LAION's 23k shards), never the
//! per-example tables.

use std::collections::HashSet;
use std::sync::{LazyLock, Mutex};

use dpcap_dataset::index::{EXAMPLES_PATH, ExampleIdsRecord, ExamplesCheck, Layout, MANIFEST_PATH, Manifest};
use dpcap_dataset::index::{MANIFEST_VERSION_DP, USERS_PATH};
use dpcap_serve::open_existing_store;
use futures::TryStreamExt;
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
    /// [`Manifest::shards_digest`]: what version 3 named the data by.
    pub shards_id: Option<String>,
    /// The manifest's format version.
    pub version: u32,
    /// The example identities' pin (version 4).
    pub example_ids: Option<ExampleIdsRecord>,
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
        shards_id: manifest.shards_digest(),
        version: manifest.version,
        example_ids: manifest.example_ids,
    })
}

/// Example-identity files already found sorted, distinct and N long, by their digest and N: a
/// sweep on one dataset reads its file once. What is checked is a property of the bytes the
/// digest names, wherever they lie.
static CHECKED_EXAMPLES: LazyLock<Mutex<HashSet<(String, u64)>>> = LazyLock::new(Mutex::default);

/// Refuses an index a DP job cannot train on: one without example identities (versions 2 and
/// 3: no budget can bind its examples, and an example held twice, sampled at about 2q and
/// contributing up to 2C, would go unseen), or one whose identities file is not the pinned one,
/// not N long, or holds an id twice. Streams the file (8 bytes an example: 1.9 GB at N =
/// 233.8M) in O(1) memory, once per file.
pub async fn check_examples(dataset: &str, layout: &DatasetLayout) -> Result<(), CoordinatorError> {
    let Some(pin) = layout.example_ids.as_ref().filter(|_| layout.version >= MANIFEST_VERSION_DP) else {
        let shards = if layout.pins_bytes { "" } else { " nor its shards' bytes" };
        return Err(CoordinatorError::invalid(
            "dataset",
            format!(
                "the index of {dataset:?} is version {}: it pins no example identities{shards}, so no privacy \
                 budget can bind its examples and an example it holds twice would count once; a DP job needs \
                 version {MANIFEST_VERSION_DP}: index it again with `dpctl dataset index {dataset}`",
                layout.version
            ),
        ));
    };
    let checked = (pin.sha256.clone(), layout.layout.examples());
    if CHECKED_EXAMPLES.lock().expect("checked examples lock").contains(&checked) {
        return Ok(());
    }
    let (store, root) = open_existing_store(dataset).map_err(location)?;
    let path = Path::from(format!("{root}/{EXAMPLES_PATH}").trim_start_matches('/'));
    let unread = |source| CoordinatorError::Read {
        field: "dataset",
        what: format!("{EXAMPLES_PATH} in {dataset:?} (index it again with `dpctl dataset index`)"),
        source,
    };
    let mut stream = store.get(&path).await.map_err(unread)?.into_stream();
    let what = || format!("{EXAMPLES_PATH} in {dataset:?}");
    let mut check = ExamplesCheck::default();
    while let Some(chunk) = stream.try_next().await.map_err(unread)? {
        check.update(&chunk).map_err(|source| CoordinatorError::Index { what: what(), source })?;
    }
    check
        .finish(layout.layout.examples(), &pin.sha256)
        .map_err(|source| CoordinatorError::Index { what: what(), source })?;
    CHECKED_EXAMPLES.lock().expect("checked examples lock").insert(checked);
    Ok(())
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
