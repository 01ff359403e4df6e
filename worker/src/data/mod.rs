//! Training data: WebDataset tar shards on an object store, their compact index (which fixes N
//! for accounting), random access to sampled examples by range reads, the image pipeline
//! (decode, crop, resize, normalise), caption tokenisation, and a synthetic captioning dataset
//! for the demo, tests and benchmarks.

pub mod identities;
pub mod index;
pub mod pipeline;
pub mod procedural;
pub mod shards;
pub mod synth;
pub mod tokenizer;

pub use index::{BuiltIndex, build_index};

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
    /// The index (manifest or a shard table) is missing, malformed or does not match.
    #[error("dataset index: {0}")]
    Index(String),
    /// A member could not be decoded.
    #[error("example {key}: cannot decode {member}: {reason}")]
    Decode {
        /// `shard#position`.
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
