//! dpcap's datasets: WebDataset tar shards on an object store, their compact binary index
//! (which fixes N for accounting and pins the data by digest), random access to sampled
//! examples by range reads, the image pipeline (decode, crop, resize, normalise), caption
//! tokenisation, and synthetic datasets for the demo, tests and benchmarks.
//!
//! The coordinator reads only the index's layout; workers and `dpctl` read examples. This
//! crate must never depend on burn or on a service, and it never trusts a byte it reads: every
//! decode is checked, and a failure names the shard or example.

pub mod identities;
pub mod index;
pub mod indexer;
pub mod pipeline;
mod procedural;
pub mod reader;
mod shards;
pub mod stream;
pub mod synth;
pub mod tokenizer;

pub use indexer::{BadShard, BuildOptions, BuiltIndex, build_index};
pub use reader::{CropPlan, Dataset, View};
pub use stream::{DEFAULT_PREFETCH, ExampleStream};

/// One generated example (synthetic scenes, procedural images, identities), before it is
/// written into a shard.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthExample {
    /// WebDataset key.
    pub key: String,
    /// The caption.
    pub caption: String,
    /// Class of the first object (scenes: colour · 3 + shape; identities: the identity).
    pub label: u32,
    /// The image.
    pub image: image::RgbImage,
}
pub use shards::{RawExample, ShardReader};

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
    /// The index (manifest or a shard table) is malformed or does not match.
    #[error("dataset index: {0}")]
    Index(#[from] index::IndexError),
    /// A caption that is not UTF-8.
    #[error("example {key}: cannot decode {member}: {source}")]
    Utf8 {
        /// `shard#position`.
        key: String,
        /// Which member.
        member: &'static str,
        /// Why.
        source: std::string::FromUtf8Error,
    },
    /// A task of the indexer or the reader panicked or was cancelled.
    #[error("{what} task failed: {source}")]
    Task {
        /// Which task.
        what: &'static str,
        /// How it ended.
        source: tokio::task::JoinError,
    },
    /// The dataset has no shards.
    #[error("no .tar shards under {0}")]
    Empty(String),
    /// A shard's bytes are not the ones the index pinned (replaced, truncated, rewritten).
    #[error(
        "shard {shard} is not the one the index pinned: {reason}; restore it, or index the dataset again and submit the job again"
    )]
    Changed {
        /// Shard path.
        shard: String,
        /// What differs.
        reason: String,
    },
    /// An example index past the end.
    #[error("example {index} is out of range for a dataset of {examples} examples")]
    OutOfRange {
        /// The index asked for.
        index: u64,
        /// N.
        examples: u64,
    },
}

/// A job's data refused or failed: the spec's data fields, reading an example or the
/// tokenizer, or a work unit that names data the dataset does not hold. Workers report it as
/// the step's failure; under `telemetry: strict` an error that names an example is withheld
/// ([`JobDataError::names_examples`]).
#[derive(Debug, thiserror::Error)]
pub enum JobDataError {
    /// The job spec's data cannot be run by this worker.
    #[error("invalid {field}: {reason}")]
    Spec {
        /// The spec field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// A location the spec names (the dataset, a tokenizer) could not be opened or read.
    #[error("invalid {field}: {source}")]
    Location {
        /// The spec field.
        field: &'static str,
        /// Why.
        source: dpcap_serve::StoreError,
    },
    /// The dataset's index could not be read (the manifest: it names no example).
    #[error("data: {url}: {source} (index the dataset with `dpctl dataset index {url}`)")]
    Index {
        /// The dataset.
        url: String,
        /// Why.
        source: DataError,
    },
    /// An object the spec names (a tokenizer) could not be read.
    #[error("invalid {field}: {what}: {source}")]
    Unreadable {
        /// The spec field.
        field: &'static str,
        /// Which object, and what to do about it.
        what: String,
        /// The store's error.
        source: object_store::Error,
    },
    /// The tokenizer the spec names is not one.
    #[error("invalid tokenizer: {location}: {source}")]
    Tokenizer {
        /// Where it was read.
        location: String,
        /// Why.
        source: tokenizer::TokenizerError,
    },
    /// The examples are not the ones the job's plan pinned (the job's input, named in full
    /// under any telemetry).
    #[error("invalid dataset: {0}")]
    Changed(#[source] DataError),
    /// Reading the dataset failed (the message may name an example).
    #[error("data: {0}")]
    Data(String),
    /// Reading sampled examples failed (the error may name an example).
    #[error("data: {0}")]
    Read(#[source] DataError),
    /// The image pipeline cannot be built for the model's image side.
    #[error("image pipeline: {0}")]
    Pipeline(#[from] pipeline::PipelineError),
    /// A work unit names a shard or an example the dataset does not hold.
    #[error("rpc: {0}")]
    Protocol(String),
}

impl JobDataError {
    /// Whether the message may name an example (its key, member or bytes come from the sampled
    /// data): `telemetry: strict` withholds it from the job's condition.
    pub fn names_examples(&self) -> bool {
        // A manifest's parse error may quote its values (shard paths): withheld like a read's.
        matches!(self, JobDataError::Data(_) | JobDataError::Read(_) | JobDataError::Index { .. })
    }
}

/// An example ready for the model: pixels through the image pipeline, caption, label.
#[derive(Debug, Clone)]
pub struct Example {
    /// `shard#position`, for messages.
    pub key: String,
    /// [3, side, side] channel-major, normalised (see [`pipeline::Pipeline`]).
    pub pixels: Vec<f32>,
    /// Caption text.
    pub caption: String,
    /// Class label from the metadata, if any.
    pub label: Option<u32>,
}
