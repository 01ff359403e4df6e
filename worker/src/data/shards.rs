//! WebDataset shards on an object store: an index of every example's members (byte offset and
//! length inside its tar) that fixes N for accounting, and random access to one example by
//! range reads, never whole shards.

use std::collections::BTreeMap;
use std::io::Read;
use std::ops::Range;

pub use dpcap_proto::dataset::{DatasetIndex, ExampleEntry, Member, ShardIndex};
use futures::TryStreamExt;
use image::RgbImage;
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt};

/// Why a dataset could not be indexed or read.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The object store failed.
    #[error("dataset storage: {0}")]
    Store(#[from] object_store::Error),
    /// A shard is not a readable tar archive.
    #[error("shard {shard} is not a valid tar archive: {reason}")]
    Tar {
        /// Shard path.
        shard: String,
        /// What failed.
        reason: String,
    },
    /// An example lacks a required member.
    #[error("example {key} in shard {shard} has no {member} member")]
    MissingMember {
        /// Example key.
        key: String,
        /// Shard path.
        shard: String,
        /// "image" or "caption".
        member: &'static str,
    },
    /// A member could not be decoded.
    #[error("example {key}: cannot decode {member}: {reason}")]
    Decode {
        /// Example key.
        key: String,
        /// Which member.
        member: &'static str,
        /// Why.
        reason: String,
    },
    /// The dataset has no shards.
    #[error("no .tar shards under {0}")]
    Empty(String),
    /// An example index past the end.
    #[error("example {index} is out of range for a dataset of {examples} examples")]
    OutOfRange {
        /// The index asked for.
        index: u64,
        /// N.
        examples: u64,
    },
}

/// An example read back.
#[derive(Debug, Clone)]
pub struct Example {
    /// WebDataset key.
    pub key: String,
    /// Decoded RGB image.
    pub image: RgbImage,
    /// Caption text.
    pub caption: String,
    /// Class label from the metadata, if any.
    pub label: Option<u32>,
}

const IMAGE_EXTS: [&str; 4] = ["png", "jpg", "jpeg", "webp"];

/// Members of one tar by key, with their positions.
fn index_tar(shard: &str, bytes: &[u8]) -> Result<Vec<ExampleEntry>, DataError> {
    let tar_error = |e: std::io::Error| DataError::Tar { shard: shard.to_owned(), reason: e.to_string() };
    let mut archive = tar::Archive::new(bytes);
    let mut by_key: BTreeMap<String, Vec<Member>> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    for entry in archive.entries().map_err(tar_error)? {
        let entry = entry.map_err(tar_error)?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = entry.path().map_err(tar_error)?.to_string_lossy().into_owned();
        let Some((key, ext)) = name.split_once('.') else { continue };
        let member = Member { ext: ext.to_ascii_lowercase(), offset: entry.raw_file_position(), len: entry.size() };
        if !by_key.contains_key(key) {
            order.push(key.to_owned());
        }
        by_key.entry(key.to_owned()).or_default().push(member);
    }
    order
        .into_iter()
        .map(|key| {
            let members = by_key.remove(&key).unwrap_or_default();
            let find = |pred: &dyn Fn(&str) -> bool| members.iter().find(|m| pred(&m.ext)).cloned();
            let missing = |member| DataError::MissingMember { key: key.clone(), shard: shard.to_owned(), member };
            Ok(ExampleEntry {
                image: find(&|e| IMAGE_EXTS.contains(&e)).ok_or_else(|| missing("image"))?,
                caption: find(&|e| e == "txt").ok_or_else(|| missing("caption"))?,
                meta: find(&|e| e == "json"),
                key,
            })
        })
        .collect()
}

/// Indexes every `.tar` under `root` (in name order), reading each shard once.
pub async fn build_index(store: &dyn ObjectStore, root: &Path) -> Result<DatasetIndex, DataError> {
    let mut objects: Vec<_> = store.list(Some(root)).try_collect().await?;
    objects.retain(|o| o.location.as_ref().ends_with(".tar"));
    objects.sort_by(|a, b| a.location.cmp(&b.location));
    if objects.is_empty() {
        return Err(DataError::Empty(root.to_string()));
    }
    let mut shards = Vec::with_capacity(objects.len());
    for object in objects {
        let relative = object
            .location
            .prefix_match(root)
            .map(|parts| parts.map(|p| p.as_ref().to_owned()).collect::<Vec<_>>().join("/"))
            .unwrap_or_else(|| object.location.to_string());
        let bytes = store.get(&object.location).await?.bytes().await?;
        let examples = index_tar(&relative, &bytes)?;
        shards.push(ShardIndex { path: relative, examples });
    }
    let examples = shards.iter().map(|s| s.examples.len() as u64).sum();
    Ok(DatasetIndex { version: 1, examples, shards })
}

/// (shard, example) of global example `index` in `dataset`.
pub fn locate(dataset: &DatasetIndex, index: u64) -> Result<(&ShardIndex, &ExampleEntry), DataError> {
    dataset.locate(index).ok_or(DataError::OutOfRange { index, examples: dataset.examples })
}

async fn read_member(store: &dyn ObjectStore, shard: &Path, member: &Member) -> Result<bytes::Bytes, DataError> {
    let range: Range<u64> = member.offset..member.offset + member.len;
    let options = GetOptions { range: Some(GetRange::Bounded(range)), ..Default::default() };
    Ok(store.get_opts(shard, options).await?.bytes().await?)
}

/// Reads example `index` by range requests for its members only.
pub async fn read_example(
    store: &dyn ObjectStore,
    root: &Path,
    index: &DatasetIndex,
    example: u64,
) -> Result<Example, DataError> {
    let (shard, entry) = locate(index, example)?;
    let shard_path = Path::from(format!("{root}/{}", shard.path).trim_start_matches('/'));
    let decode = |member: &'static str, reason: String| DataError::Decode { key: entry.key.clone(), member, reason };
    let image_bytes = read_member(store, &shard_path, &entry.image).await?;
    let image = image::load_from_memory(&image_bytes).map_err(|e| decode("image", e.to_string()))?.to_rgb8();
    let mut caption = String::new();
    read_member(store, &shard_path, &entry.caption)
        .await?
        .as_ref()
        .read_to_string(&mut caption)
        .map_err(|e| decode("caption", e.to_string()))?;
    let label = match &entry.meta {
        Some(meta) => {
            let bytes = read_member(store, &shard_path, meta).await?;
            let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| decode("json", e.to_string()))?;
            value["label"].as_u64().map(|l| l as u32)
        }
        None => None,
    };
    Ok(Example { key: entry.key.clone(), image, caption: caption.trim().to_owned(), label })
}

/// Every caption of the dataset, in example order, reading only the caption members.
pub async fn read_captions(
    store: &dyn ObjectStore,
    root: &Path,
    index: &DatasetIndex,
) -> Result<Vec<String>, DataError> {
    let mut captions = Vec::with_capacity(index.examples as usize);
    for shard in &index.shards {
        let shard_path = Path::from(format!("{root}/{}", shard.path).trim_start_matches('/'));
        for entry in &shard.examples {
            let bytes = read_member(store, &shard_path, &entry.caption).await?;
            let text = String::from_utf8(bytes.to_vec()).map_err(|e| DataError::Decode {
                key: entry.key.clone(),
                member: "caption",
                reason: e.to_string(),
            })?;
            captions.push(text.trim().to_owned());
        }
    }
    Ok(captions)
}
