//! A job's dataset as the worker sees it: the manifest (pinned by digest), shard tables read
//! on demand, the tokenizer, and reads of a work unit's examples — range requests in flight
//! concurrently, then decoding and the image pipeline on a thread pool sized to the machine,
//! so the next micro-batches are prepared while the current one computes.

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;
use rayon::prelude::*;

use crate::pipeline::{Crop, Pipeline};
use crate::tokenizer::CaptionTokenizer;
use crate::{DataError, JobDataError};
use crate::{Example, RawExample, ShardReader};

/// Range reads in flight per rank.
const READ_CONCURRENCY: usize = 16;

/// How a read's images are cropped: per (key, step, example) for training, centred for
/// evaluation.
#[derive(Debug, Clone)]
pub enum CropPlan {
    /// `RandomResizedCrop` keyed by the job's augmentation key and the step.
    Train {
        /// The job's augmentation key.
        key: [u8; 32],
        /// The step.
        step: u64,
    },
    /// Shorter side to the model's size, then the centre.
    Eval,
}

/// The pipeline and crop of one read.
#[derive(Debug, Clone)]
pub struct View {
    /// Decode, crop, resize, normalise.
    pub pipeline: Arc<Pipeline>,
    /// Which crop.
    pub crop: CropPlan,
}

impl View {
    /// Centre crops at `side` px (evaluation, probes).
    pub fn eval(side: usize) -> Result<Self, JobDataError> {
        let pipeline = Pipeline::clip(side as u32)?;
        Ok(Self { pipeline: Arc::new(pipeline), crop: CropPlan::Eval })
    }

    fn crop(&self, example: u64) -> Crop {
        match self.crop {
            CropPlan::Train { key, step } => Crop::Train { key, step, example },
            CropPlan::Eval => Crop::Eval,
        }
    }
}

/// Whether the store at `url` changes an object's ETag whenever its content changes: S3, GCS
/// and Azure do; a local file's ETag is metadata (see `ShardReader`).
fn content_e_tags(url: &str) -> bool {
    ["s3://", "s3a://", "gs://", "az://", "abfs://", "abfss://", "azure://"]
        .iter()
        .any(|scheme| url.starts_with(scheme))
}

/// An opened dataset.
#[derive(Debug, Clone)]
pub struct Dataset {
    reader: ShardReader,
}

impl Dataset {
    /// Opens `url` and reads its manifest.
    pub async fn open(url: &str) -> Result<Self, JobDataError> {
        let (store, root) = dpcap_serve::open_existing_store(url)
            .map_err(|source| JobDataError::Location { field: "dataset", source })?;
        let reader = ShardReader::open(store, root)
            .await
            .map_err(|source| JobDataError::Index { url: url.to_owned(), source })?
            .trusting_content_e_tags(content_e_tags(url));
        Ok(Self { reader })
    }

    /// Refuses a dataset other than the one the job was planned and accounted on: a different
    /// index (re-indexed, shards added or removed) could map two sampled positions to one
    /// example or read examples the accounting never saw.
    pub fn check_pinned(&self, digest: &str, examples: u64) -> Result<(), JobDataError> {
        if digest.is_empty() {
            return Err(JobDataError::Spec { field: "dataset", reason: "the job's plan pins no index digest".into() });
        }
        if digest != self.reader.digest() {
            return Err(JobDataError::Spec {
                field: "dataset",
                reason: format!("index digest {} differs from the job's pinned {digest}", self.reader.digest()),
            });
        }
        if examples != self.examples() {
            return Err(JobDataError::Spec {
                field: "dataset",
                reason: format!("index has {} examples, the job's plan {examples}", self.examples()),
            });
        }
        Ok(())
    }

    /// N.
    pub fn examples(&self) -> u64 {
        self.reader.manifest().examples
    }

    /// The tokenizer: `location` (a path or URL of a `tokenizer.json`, or of a BERT
    /// `vocab.txt`) or the dataset's own `tokenizer.json` when empty.
    pub async fn tokenizer(&self, location: &str) -> Result<CaptionTokenizer, JobDataError> {
        let (store, path, name) = if location.is_empty() {
            let (store, root) = self.reader.location();
            (store, crate::indexer::join(&root, "tokenizer.json"), "tokenizer.json")
        } else {
            let (dir, file) = location.rsplit_once('/').unwrap_or((".", location));
            let (store, root) = dpcap_serve::open_existing_store(dir)
                .map_err(|source| JobDataError::Location { field: "tokenizer", source })?;
            (store, crate::indexer::join(&root, file), file)
        };
        let bytes = async { store.get(&path).await?.bytes().await }.await.map_err(|source| {
            let what = if location.is_empty() {
                "none given and the dataset has no tokenizer.json; set tokenizer (a public vocabulary), or for public \
                 or synthetic captions run `dpctl dataset index --train-tokenizer`"
                    .to_owned()
            } else {
                location.to_owned()
            };
            JobDataError::Unreadable { field: "tokenizer", what, source }
        })?;
        let tokenizer = if name.ends_with(".txt") {
            CaptionTokenizer::from_vocab(&bytes)
        } else {
            CaptionTokenizer::from_bytes(&bytes)
        };
        tokenizer.map_err(|source| JobDataError::Tokenizer { location: location.to_owned(), source })
    }

    /// The tokenizer the job's plan pinned: the bytes at `location` must have `digest` (the
    /// coordinator read them at submit), so a tokenizer replaced since is refused by name.
    pub async fn pinned_tokenizer(location: &str, digest: &str) -> Result<CaptionTokenizer, JobDataError> {
        let spec = |reason: String| JobDataError::Spec { field: "tokenizer", reason };
        let bytes = dpcap_serve::store::read_object(location)
            .await
            .map_err(|source| JobDataError::Location { field: "tokenizer", source })?;
        let found = dpcap_proto::digest::sha256(&bytes);
        if found != digest {
            return Err(spec(format!(
                "{location} has digest {found}, not the {digest} the job pinned at submit: the tokenizer was replaced;                  submit the job again to train with the new one"
            )));
        }
        let tokenizer = if location.ends_with(".txt") {
            CaptionTokenizer::from_vocab(&bytes)
        } else {
            CaptionTokenizer::from_bytes(&bytes)
        };
        tokenizer.map_err(|source| JobDataError::Tokenizer { location: location.to_owned(), source })
    }

    /// Global index of position `local` in shard `shard`, bounds-checked against the shard.
    pub fn global(&self, shard: usize, local: u64) -> Result<u64, JobDataError> {
        let layout = self.reader.layout();
        layout.global(shard, local).ok_or_else(|| match layout.count(shard) {
            None => JobDataError::Protocol(format!("work unit names shard {shard} of {}", layout.shards())),
            Some(count) => {
                JobDataError::Protocol(format!("work unit names example {local} of shard {shard}, which holds {count}"))
            }
        })
    }

    /// Reads examples by global index and puts their images through `view`. An image that the
    /// index accepted but that fails to decode in full (a truncated body) is left out with a
    /// warning: it then contributes nothing, which the accounting allows (a removed example).
    pub async fn read(&self, indices: Vec<u64>, view: &View) -> Result<Vec<Example>, JobDataError> {
        let raw: Vec<(u64, RawExample)> = futures::stream::iter(indices)
            .map(|i| async move { self.reader.read(i).await.map(|raw| (i, raw)) })
            .buffered(READ_CONCURRENCY)
            .try_collect()
            .await
            .map_err(|e| match e {
                // Not the pinned data: the job's input, named in full under any telemetry.
                changed @ DataError::Changed { .. } => JobDataError::Changed(changed),
                other => JobDataError::Read(other),
            })?;
        let view = view.clone();
        tokio::task::spawn_blocking(move || {
            raw.into_par_iter()
                .filter_map(|(i, raw)| match view.pipeline.process(&raw.image, &view.crop(i)) {
                    Ok(pixels) => Some(Example { key: raw.key, pixels, caption: raw.caption, label: raw.label }),
                    Err(e) => {
                        tracing::warn!(example = i, key = %raw.key, error = %e, "undecodable image left out");
                        None
                    }
                })
                .collect()
        })
        .await
        .map_err(|source| JobDataError::Read(DataError::Task { what: "decode", source }))
    }
}
