//! Random access to the examples of an indexed dataset: the manifest (N and the shards), each
//! shard's table loaded on first use (checked against the manifest's digest, a bounded number
//! kept), and one example read by range requests for its members only, never whole shards.
//!
//! A dataset is its bytes: before its first read of a shard, a reader checks the shard against
//! the manifest's pin — its size, then its ETag and version where the store derives them from
//! the content (object stores), else its SHA-256, streamed once — and every range read then asks
//! the store for exactly that ETag (and version), so a shard replaced while a job reads it is
//! refused too, naming the shard. A store that gives neither cannot hold a shard to its bytes
//! while it is read, and is refused.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::{Arc, Mutex};

use crate::index::{Layout, MANIFEST_PATH, Manifest, ShardTable, Span, TableEntry, table_path};
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt};
use tokio::sync::OnceCell;

use crate::DataError;
use crate::indexer::join;

/// Shard tables kept in memory per reader (about 0.5 MB each for 10k-example shards).
const TABLES_KEPT: usize = 64;

/// Members of one example closer than this are fetched with a single range request.
const COALESCE_GAP: u64 = 64 << 10;

/// An example's raw members as read from its shard.
#[derive(Debug, Clone)]
pub struct RawExample {
    /// `shard-path#position`, for messages.
    pub key: String,
    /// Encoded image bytes.
    pub image: bytes::Bytes,
    /// Caption text, trimmed.
    pub caption: String,
    /// Class label from the metadata, if any.
    pub label: Option<u32>,
}

type TableCell = Arc<OnceCell<Arc<ShardTable>>>;

/// A shard's checked identity at the store: the ETag and version its range reads must match
/// (both None where the manifest pins no bytes: a version-2 index).
#[derive(Debug, Clone, Default)]
struct Pin {
    e_tag: Option<String>,
    version: Option<String>,
}

type PinCell = Arc<OnceCell<Pin>>;

/// Tables by shard, and the order they were first asked for (the oldest is dropped first).
type TableCache = (HashMap<usize, TableCell>, VecDeque<usize>);

/// An indexed dataset on an object store.
#[derive(Debug, Clone)]
pub struct ShardReader {
    store: Arc<dyn ObjectStore>,
    root: Path,
    manifest: Arc<Manifest>,
    layout: Arc<Layout>,
    digest: String,
    tables: Arc<Mutex<TableCache>>,
    pins: Arc<Mutex<HashMap<usize, PinCell>>>,
    /// Whether the store's ETags change with the content (object stores). A local file's ETag
    /// is its inode, mtime and size: a same-size rewrite can keep it, so local shards are hashed.
    content_e_tags: bool,
}

impl ShardReader {
    /// Reads and validates the manifest under `root`.
    pub async fn open(store: Arc<dyn ObjectStore>, root: Path) -> Result<Self, DataError> {
        let bytes = store.get(&join(&root, MANIFEST_PATH)).await?.bytes().await?;
        let manifest = Manifest::parse(&bytes)?;
        Ok(Self {
            layout: Arc::new(manifest.layout()),
            digest: Manifest::digest(&bytes),
            manifest: Arc::new(manifest),
            store,
            root,
            tables: Arc::default(),
            pins: Arc::default(),
            content_e_tags: false,
        })
    }

    /// Trusts the store's ETags as content pins (see [`ShardReader`]'s field); without this,
    /// each shard is hashed once per reader.
    pub fn trusting_content_e_tags(mut self, trust: bool) -> Self {
        self.content_e_tags = trust;
        self
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Shard boundaries.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The store and the dataset's root in it.
    pub fn location(&self) -> (Arc<dyn ObjectStore>, Path) {
        (self.store.clone(), self.root.clone())
    }

    /// The manifest's digest (what a job pins).
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// Shard `shard`'s table: from memory, else read and checked against the manifest.
    pub async fn table(&self, shard: usize) -> Result<Arc<ShardTable>, DataError> {
        let cell = {
            let mut tables = self.tables.lock().expect("tables lock");
            let (cells, order) = &mut *tables;
            if !cells.contains_key(&shard) {
                order.push_back(shard);
                while order.len() > TABLES_KEPT {
                    order.pop_front().map(|old| cells.remove(&old));
                }
            }
            cells.entry(shard).or_default().clone()
        };
        let table = cell
            .get_or_try_init(|| async {
                let path = join(&self.root, &table_path(shard));
                let bytes = self.store.get(&path).await?.bytes().await?;
                let table = self.manifest.check_table(shard, &bytes)?;
                Ok::<_, DataError>(Arc::new(table))
            })
            .await?;
        Ok(table.clone())
    }

    /// Reads example `global` by range requests for its members (one request when they lie
    /// together, as they do in a tar).
    pub async fn read(&self, global: u64) -> Result<RawExample, DataError> {
        let examples = self.layout.examples();
        let (shard, local) = self.layout.locate(global).ok_or(DataError::OutOfRange { index: global, examples })?;
        let table = self.table(shard).await?;
        let entry = *table.entries.get(local as usize).ok_or(DataError::OutOfRange { index: global, examples })?;
        let record = &self.manifest.shards[shard];
        let key = format!("{}#{local}", record.path);
        let pin = self.pinned(shard).await?;
        let location = Location { path: join(&self.root, &record.path), shard: &record.path, pin };
        let members = self.members(&location, &entry).await?;
        let caption = String::from_utf8(members.caption.to_vec()).map_err(|source| DataError::Utf8 {
            key: key.clone(),
            member: "caption",
            source,
        })?;
        // The indexer kept only metadata that parses; a label is read when there is one.
        let label = members
            .meta
            .and_then(|meta| serde_json::from_slice::<serde_json::Value>(&meta).ok())
            .and_then(|value| value["label"].as_u64())
            .and_then(|l| u32::try_from(l).ok());
        Ok(RawExample { image: members.image, caption: caption.trim().to_owned(), label, key })
    }

    /// The shard's checked identity (see the module docs), checked once per reader.
    async fn pinned(&self, shard: usize) -> Result<Pin, DataError> {
        let cell = self.pins.lock().expect("pins lock").entry(shard).or_default().clone();
        let pin = cell.get_or_try_init(|| self.check_pin(shard)).await?;
        Ok(pin.clone())
    }

    async fn check_pin(&self, shard: usize) -> Result<Pin, DataError> {
        let record = &self.manifest.shards[shard];
        if !record.pins_bytes() {
            return Ok(Pin::default()); // a version-2 index: its tables are pinned, its shards are not
        }
        let changed = |reason: String| DataError::Changed { shard: record.path.clone(), reason };
        let path = join(&self.root, &record.path);
        // A versioned store keeps the pinned version after a replacement: ask for it, so the job
        // reads the bytes it was planned on (None asks for the current object).
        let mut version = record.store_version.clone();
        let meta = match self
            .store
            .get_opts(&path, GetOptions { head: true, version: version.clone(), ..Default::default() })
            .await
        {
            Ok(got) => got.meta,
            // A copy of the dataset in another bucket (a sync, a restore) has its own version
            // ids, so the pinned one is unknown there: read the current object, and let its
            // bytes decide below (a matching ETag alone is not trusted across versions).
            Err(object_store::Error::NotFound { .. }) if version.is_some() => {
                version = None;
                self.store.head(&path).await?
            }
            Err(e) => return Err(e.into()),
        };
        let pinned = || GetOptions { version: version.clone(), ..Default::default() };
        if meta.size != record.bytes {
            return Err(changed(format!("{} bytes, the index pinned {}", meta.size, record.bytes)));
        }
        if self.content_e_tags
            && record.e_tag.is_some()
            && meta.e_tag == record.e_tag
            && meta.version == record.store_version
        {
            return Ok(Pin { e_tag: meta.e_tag, version: meta.version });
        }
        // Another ETag (a copy elsewhere, a rewrite) or a local file: the bytes decide, streamed
        // through SHA-256 once (never held whole).
        let got = self.store.get_opts(&path, pinned()).await?;
        let pin = Pin { e_tag: got.meta.e_tag.clone(), version: got.meta.version.clone() };
        let mut stream = got.into_stream();
        let mut hasher = dpcap_proto::digest::Sha256Stream::default();
        while let Some(bytes) = futures::StreamExt::next(&mut stream).await {
            hasher.update(&bytes?);
        }
        let sha256 = hasher.finish();
        if sha256 != record.sha256 {
            return Err(changed(format!("its bytes have digest {sha256}, the index pinned {}", record.sha256)));
        }
        if pin.e_tag.is_none() && pin.version.is_none() {
            return Err(changed(
                "the store gives it no ETag or version, so reads cannot be held to these bytes".into(),
            ));
        }
        tracing::debug!(shard = %record.path, "shard hashed: its bytes are the pinned ones");
        Ok(pin)
    }

    async fn members(&self, shard: &Location<'_>, entry: &TableEntry) -> Result<Members, DataError> {
        let spans: Vec<Span> = [Some(entry.image), Some(entry.caption), entry.meta].into_iter().flatten().collect();
        let start = spans.iter().map(|s| s.offset).min().unwrap_or(0);
        let end = spans.iter().map(Span::end).max().unwrap_or(0);
        // Decoded spans never overflow (the table refuses them); saturate all the same.
        let payload = spans.iter().fold(0u64, |sum, s| sum.saturating_add(s.len));
        let cut = |all: &bytes::Bytes, base: u64, span: Span| {
            all.slice((span.offset - base) as usize..(span.end() - base) as usize)
        };
        if end - start <= payload.saturating_add(COALESCE_GAP) {
            let all = self.range(shard, start..end).await?;
            return Ok(Members {
                image: cut(&all, start, entry.image),
                caption: cut(&all, start, entry.caption),
                meta: entry.meta.map(|m| cut(&all, start, m)),
            });
        }
        let meta = match entry.meta {
            Some(m) => Some(self.range(shard, m.offset..m.end()).await?),
            None => None,
        };
        Ok(Members {
            image: self.range(shard, entry.image.offset..entry.image.end()).await?,
            caption: self.range(shard, entry.caption.offset..entry.caption.end()).await?,
            meta,
        })
    }

    /// Exactly the bytes of `range` of the pinned shard: a shorter answer (a truncated shard),
    /// or a shard whose ETag is no longer the checked one, is an error naming it.
    async fn range(&self, shard: &Location<'_>, range: Range<u64>) -> Result<bytes::Bytes, DataError> {
        let want = range.end - range.start;
        let changed = |reason: &str| DataError::Changed { shard: shard.shard.to_owned(), reason: reason.to_owned() };
        let options = GetOptions {
            range: Some(GetRange::Bounded(range)),
            if_match: shard.pin.e_tag.clone(),
            version: shard.pin.version.clone(),
            ..Default::default()
        };
        let bytes = match self.store.get_opts(&shard.path, options).await {
            Ok(got) => got.bytes().await?,
            Err(object_store::Error::Precondition { .. }) => return Err(changed("it changed while the job read it")),
            Err(object_store::Error::Generic { source, .. }) if source.to_string().contains("range") => {
                return Err(changed(&format!("a read past its end ({source})")));
            }
            Err(e) => return Err(e.into()),
        };
        if bytes.len() as u64 != want {
            return Err(changed("it is shorter than its index says"));
        }
        Ok(bytes)
    }
}

/// Where one example's members are read from: the shard's store path, its manifest path, and
/// the ETag and version its range reads must match.
struct Location<'a> {
    path: Path,
    shard: &'a str,
    pin: Pin,
}

struct Members {
    image: bytes::Bytes,
    caption: bytes::Bytes,
    meta: Option<bytes::Bytes>,
}
