//! Building the compact index (`dpcap_proto::index`) of a directory of WebDataset shards as
//! img2dataset writes them: `KEY.jpg|png|webp` + `KEY.txt` (+ `KEY.json`) per example, other
//! files (`.parquet`, `_stats.json`) beside the tars ignored. Shards are indexed in parallel
//! with bounded concurrency, one shard in memory per task, on any object store. An example
//! with a missing or unreadable member is counted, listed in the report and left out: it never
//! reaches a job, and N counts only usable examples. The manifest is written last, so a
//! crashed run leaves no index that a job could pin.

use std::collections::{BTreeMap, HashMap};

use crate::index::{EXAMPLES_PATH, ExampleIdsRecord, encode_examples, example_id};
use crate::index::{ImageKind, MANIFEST_PATH, MANIFEST_VERSION, Manifest, ShardRecord, ShardTable, Skipped};
use crate::index::{Span, TableEntry, USERS_PATH, UserTable, UsersRecord, table_path};
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::Serialize;

use crate::DataError;
use crate::pipeline::{DEFAULT_MAX_PIXELS, PipelineError, decode_dimensions};

/// Skipped examples listed by key in the report, at most (the counts are always complete).
pub const REPORT_LIMIT: usize = 100_000;

/// Where the report of an indexing run goes.
pub const REPORT_PATH: &str = "index/report.json";

/// One example left out, for the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkippedExample {
    /// Shard path.
    pub shard: String,
    /// WebDataset key.
    pub key: String,
    /// `missing_image`, `missing_caption`, `corrupt_image` or `corrupt_caption`.
    pub reason: &'static str,
    /// Detail (the decoder's error).
    pub detail: String,
}

/// What an indexing run produced.
#[derive(Debug, Clone)]
pub struct BuiltIndex {
    /// The manifest as written.
    pub manifest: Manifest,
    /// Its digest, which pins a job to this dataset.
    pub digest: String,
    /// Skipped examples, up to [`REPORT_LIMIT`].
    pub report: Vec<SkippedExample>,
    /// Shards left out whole.
    pub bad_shards: Vec<BadShard>,
}

/// One example's members by lower-case extension.
type Members = BTreeMap<String, Span>;

/// The members of one tar, grouped by key in tar order.
fn members(shard: &str, bytes: &[u8]) -> Result<Vec<(String, Members)>, DataError> {
    let tar_error = |e: std::io::Error| DataError::Tar { shard: shard.to_owned(), reason: e.to_string() };
    let mut archive = tar::Archive::new(bytes);
    let mut order: Vec<(String, Members)> = Vec::new();
    let mut position: BTreeMap<String, usize> = BTreeMap::new();
    for entry in archive.entries().map_err(tar_error)? {
        let entry = entry.map_err(tar_error)?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = entry.path().map_err(tar_error)?.to_string_lossy().into_owned();
        // The key is the path up to the first dot of the file name (WebDataset's rule).
        let (dir, file) = name.rsplit_once('/').map_or(("", name.as_str()), |(d, f)| (d, f));
        let Some((stem, ext)) = file.split_once('.') else { continue };
        let key = if dir.is_empty() { stem.to_owned() } else { format!("{dir}/{stem}") };
        let span = Span { offset: entry.raw_file_position(), len: entry.size() };
        let slot = *position.entry(key.clone()).or_insert_with(|| {
            order.push((key, BTreeMap::new()));
            order.len() - 1
        });
        order[slot].1.insert(ext.to_ascii_lowercase(), span);
    }
    Ok(order)
}

fn slice(bytes: &[u8], span: Span) -> &[u8] {
    bytes.get(span.offset as usize..span.end() as usize).unwrap_or_default()
}

/// One shard indexed: its table, why examples were left out, and for each indexed example its
/// user (from `KEY.json`'s `user`, a string or a number), its key and its identity.
struct IndexedShard {
    table: ShardTable,
    skipped: Skipped,
    report: Vec<SkippedExample>,
    users: Vec<Option<String>>,
    keys: Vec<String>,
    ids: Vec<u64>,
}

/// A shard as the manifest records it (its table's pin filled in once its duplicates are
/// left out), and its indexing.
type ShardOutcome = (ShardRecord, IndexedShard);

/// The `user` field of an example's metadata, if there is one.
fn user_of(meta: &serde_json::Value) -> Option<String> {
    match meta.get("user")? {
        serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// One shard's table, its skipped counts, the skipped examples and the examples' users.
fn index_shard(shard: &str, bytes: &[u8]) -> Result<IndexedShard, DataError> {
    let (mut table, mut skipped, mut report) = (ShardTable::default(), Skipped::default(), Vec::new());
    let (mut users, mut keys, mut ids) = (Vec::new(), Vec::new(), Vec::new());
    for (key, members) in members(shard, bytes)? {
        let mut skip = |reason: &'static str, detail: String| {
            report.push(SkippedExample { shard: shard.to_owned(), key: key.clone(), reason, detail });
            reason
        };
        let image = members.iter().find_map(|(ext, span)| ImageKind::from_ext(ext).map(|kind| (kind, *span)));
        let reason = match (image, members.get("txt")) {
            (None, _) => skip("missing_image", "no .jpg, .jpeg, .png or .webp member".into()),
            (_, None) => skip("missing_caption", "no .txt member".into()),
            (Some((image_kind, image)), Some(&caption)) => {
                let text = std::str::from_utf8(slice(bytes, caption));
                let dimensions = decode_dimensions(slice(bytes, image)).and_then(|(w, h)| {
                    if u64::from(w) * u64::from(h) > DEFAULT_MAX_PIXELS {
                        let pixels = u64::from(w) * u64::from(h);
                        Err(PipelineError::TooLarge { width: w, height: h, pixels, limit: DEFAULT_MAX_PIXELS })
                    } else {
                        Ok((w, h))
                    }
                });
                match (dimensions, text) {
                    (Err(e), _) => skip("corrupt_image", e.to_string()),
                    (_, Err(e)) => skip("corrupt_caption", format!("not UTF-8: {e}")),
                    (_, Ok(text)) if text.trim().is_empty() => skip("corrupt_caption", "empty".into()),
                    (Ok(_), Ok(_)) => {
                        // Metadata that is not JSON is dropped here, not the example: only
                        // evaluation labels come from it.
                        let parsed = members.get("json").and_then(|m| {
                            serde_json::from_slice::<serde_json::Value>(slice(bytes, *m)).ok().map(|v| (*m, v))
                        });
                        users.push(parsed.as_ref().and_then(|(_, v)| user_of(v)));
                        ids.push(example_id(slice(bytes, image), slice(bytes, caption)));
                        keys.push(key.clone());
                        let meta = parsed.map(|(m, _)| m);
                        table.entries.push(TableEntry { image_kind, image, caption, meta });
                        continue;
                    }
                }
            }
        };
        match reason {
            "missing_image" => skipped.missing_image += 1,
            "missing_caption" => skipped.missing_caption += 1,
            "corrupt_image" => skipped.corrupt_image += 1,
            _ => skipped.corrupt_caption += 1,
        }
    }
    Ok(IndexedShard { table, skipped, report, users, keys, ids })
}

/// `root/relative` as a store path.
pub fn join(root: &Path, relative: &str) -> Path {
    Path::from(format!("{root}/{relative}").trim_start_matches('/'))
}

/// A shard left out of the index whole: not a tar archive, or an empty file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BadShard {
    /// Shard path.
    pub path: String,
    /// Why.
    pub reason: String,
}

/// How an indexing run treats what it finds.
#[derive(Debug, Clone, Copy)]
pub struct BuildOptions {
    /// Shards read at once.
    pub concurrency: usize,
    /// Refuse the whole dataset when one shard is not a readable tar (else the shard is left
    /// out and reported, as a corrupt member inside a shard is).
    pub strict: bool,
}

/// One shard indexed: its record (bytes pinned) and its indexing; or why the whole shard was
/// left out.
enum Indexed {
    Shard(Box<ShardOutcome>),
    Bad(BadShard),
}

/// Indexes one shard: reads it whole, pins its size, content digest and the store's ETag or
/// version, and builds its table (written by the caller at the shard's final position).
async fn index_one(
    store: &dyn ObjectStore,
    root: &Path,
    object: object_store::ObjectMeta,
) -> Result<Indexed, DataError> {
    let relative = object
        .location
        .prefix_match(root)
        .map(|parts| parts.map(|p| p.as_ref().to_owned()).collect::<Vec<_>>().join("/"))
        .unwrap_or_else(|| object.location.to_string());
    if object.size == 0 {
        return Ok(Indexed::Bad(BadShard { path: relative, reason: "an empty file".into() }));
    }
    let got = store.get(&object.location).await?;
    let (e_tag, store_version) = (got.meta.e_tag.clone(), got.meta.version.clone());
    let bytes = got.bytes().await?;
    let name = relative.clone();
    let indexed = tokio::task::spawn_blocking(move || {
        let sha256 = dpcap_proto::digest::sha256(&bytes);
        index_shard(&name, &bytes).map(|outcome| (outcome, sha256, bytes.len() as u64))
    })
    .await
    .map_err(|source| DataError::Task { what: "indexing", source })?;
    let (indexed, sha256, size) = match indexed {
        Ok(indexed) => indexed,
        Err(DataError::Tar { reason, .. }) => return Ok(Indexed::Bad(BadShard { path: relative, reason })),
        Err(e) => return Err(e),
    };
    let record = ShardRecord { path: relative, bytes: size, sha256, e_tag, store_version, ..Default::default() };
    Ok(Indexed::Shard(Box::new((record, indexed))))
}

/// Leaves out of `shard` every example already indexed (`seen`: identity → where it was first
/// found, the shard's number above bit 32 and its place in the shard below; `paths`: the shards
/// indexed so far), counting and reporting each; then pins its table in its record and returns
/// the table's bytes. An example is held once, whichever shards hold copies of it.
fn leave_out_duplicates((record, shard): &mut ShardOutcome, seen: &mut HashMap<u64, u64>, paths: &[String]) -> Vec<u8> {
    let number = paths.len() as u64;
    let mut kept = Vec::with_capacity(shard.ids.len());
    for (local, (id, key)) in shard.ids.iter().zip(&shard.keys).enumerate() {
        let here = number << 32 | local as u64;
        let first = *seen.entry(*id).or_insert(here);
        kept.push(first == here);
        if first != here {
            let first = paths.get((first >> 32) as usize).unwrap_or(&record.path);
            let detail = format!("the same image and caption bytes as an example of shard {first} (id {id:#018x})");
            shard.report.push(SkippedExample {
                shard: record.path.clone(),
                key: key.clone(),
                reason: "duplicate",
                detail,
            });
            shard.skipped.duplicate += 1;
        }
    }
    retain(&mut shard.table.entries, &kept);
    retain(&mut shard.users, &kept);
    retain(&mut shard.ids, &kept);
    retain(&mut shard.keys, &kept);
    let encoded = shard.table.encode();
    record.examples = shard.table.entries.len() as u64;
    record.skipped = shard.skipped.total();
    record.table_bytes = encoded.len() as u64;
    record.table_sha256 = dpcap_proto::digest::sha256(&encoded);
    encoded
}

/// Keeps the items whose flag is set, one flag an item.
fn retain<T>(items: &mut Vec<T>, kept: &[bool]) {
    let mut flags = kept.iter();
    items.retain(|_| flags.next().copied().unwrap_or(true));
}

/// Leaves out a shard with the same bytes as one already indexed (`contents`: digest → path):
/// a copy under another name would put each of its examples in twice.
fn refuse_copies(shard: Indexed, contents: &mut HashMap<String, String>) -> Indexed {
    match shard {
        Indexed::Shard(outcome) if contents.contains_key(&outcome.0.sha256) => {
            let reason = format!("the same bytes as {}", contents[&outcome.0.sha256]);
            Indexed::Bad(BadShard { path: outcome.0.path.clone(), reason })
        }
        Indexed::Shard(outcome) => {
            contents.insert(outcome.0.sha256.clone(), outcome.0.path.clone());
            Indexed::Shard(outcome)
        }
        bad => bad,
    }
}

/// Writes the dataset's example identities, sorted (each is there once: the indexer left out
/// every copy), and returns their pin.
async fn write_example_ids(
    store: &dyn ObjectStore,
    root: &Path,
    mut ids: Vec<u64>,
) -> Result<ExampleIdsRecord, DataError> {
    ids.sort_unstable();
    let file = encode_examples(&ids);
    let record = ExampleIdsRecord { bytes: file.len() as u64, sha256: dpcap_proto::digest::sha256(&file) };
    store.put(&join(root, EXAMPLES_PATH), PutPayload::from(file)).await?;
    Ok(record)
}

/// Writes the user table of `(user, example)` pairs under `root` and returns its record.
async fn write_users(
    store: &dyn ObjectStore,
    root: &Path,
    pairs: Vec<(String, u64)>,
    without_user: u64,
) -> Result<UsersRecord, DataError> {
    let table = UserTable::from_pairs(pairs);
    let users = table.users() as u64;
    let table = table.encode();
    let record = UsersRecord {
        users,
        without_user,
        table_bytes: table.len() as u64,
        table_sha256: dpcap_proto::digest::sha256(&table),
    };
    store.put(&join(root, USERS_PATH), PutPayload::from(table)).await?;
    Ok(record)
}

/// Indexes every `.tar` under `root` (in name order), `options.concurrency` shards at a time,
/// writing one table per shard, the report and then the manifest under `root/index/`. A shard
/// that is not a readable tar, or an empty file, is left out and reported (refused under
/// `options.strict`). `progress` is called once per indexed shard, in order.
pub async fn build_index(
    store: &dyn ObjectStore,
    root: &Path,
    options: BuildOptions,
    progress: &(dyn Fn(&ShardRecord) + Sync),
) -> Result<BuiltIndex, DataError> {
    let mut objects: Vec<_> = store.list(Some(root)).try_collect().await?;
    objects.retain(|o| o.location.as_ref().ends_with(".tar"));
    objects.sort_by(|a, b| a.location.cmp(&b.location));
    if objects.is_empty() {
        return Err(DataError::Empty(root.to_string()));
    }
    let shards = futures::stream::iter(objects)
        .map(|object| index_one(store, root, object))
        .buffered(options.concurrency.max(1));
    futures::pin_mut!(shards);
    let mut manifest = Manifest {
        version: MANIFEST_VERSION,
        examples: 0,
        shards: Vec::new(),
        skipped: Skipped::default(),
        users: None,
        example_ids: None,
    };
    let (mut report, mut pairs, mut without_user, mut bad) = (Vec::new(), Vec::new(), 0u64, Vec::new());
    let (mut contents, mut seen, mut paths, mut ids) = (HashMap::new(), HashMap::new(), Vec::new(), Vec::new());
    while let Some(shard) = shards.next().await {
        let mut outcome = match refuse_copies(shard?, &mut contents) {
            Indexed::Shard(outcome) => outcome,
            Indexed::Bad(shard) if options.strict => {
                return Err(DataError::Tar { shard: shard.path, reason: format!("{} (--strict)", shard.reason) });
            }
            Indexed::Bad(shard) => {
                tracing::warn!(shard = %shard.path, reason = %shard.reason, "shard left out of the index");
                bad.push(shard);
                continue;
            }
        };
        let table = leave_out_duplicates(&mut outcome, &mut seen, &paths);
        let (record, shard) = *outcome;
        store.put(&join(root, &table_path(manifest.shards.len())), PutPayload::from(table)).await?;
        progress(&record);
        paths.push(record.path.clone());
        ids.extend(shard.ids);
        for (local, user) in shard.users.into_iter().enumerate() {
            match user {
                Some(user) => pairs.push((user, manifest.examples + local as u64)),
                None => without_user += 1,
            }
        }
        manifest.examples += record.examples;
        manifest.skipped.add(&shard.skipped);
        manifest.shards.push(record);
        report.extend(shard.report.into_iter().take(REPORT_LIMIT.saturating_sub(report.len())));
    }
    drop(seen);
    if manifest.shards.is_empty() {
        return Err(DataError::Empty(format!("{root} (every .tar was left out: {bad:?})")));
    }
    let report_body = serde_json::json!({"skipped": manifest.skipped, "examples": report, "bad_shards": bad});
    store
        .put(&join(root, REPORT_PATH), PutPayload::from(serde_json::to_vec_pretty(&report_body).expect("json")))
        .await?;
    if !pairs.is_empty() {
        manifest.users = Some(write_users(store, root, pairs, without_user).await?);
    }
    manifest.example_ids = Some(write_example_ids(store, root, ids).await?);
    let body = serde_json::to_vec_pretty(&manifest).expect("manifest serialises");
    let digest = Manifest::digest(&body);
    store.put(&join(root, MANIFEST_PATH), PutPayload::from(body)).await?;
    Ok(BuiltIndex { manifest, digest, report, bad_shards: bad })
}
