//! Training data: WebDataset tar shards on an object store, their index (which fixes N for
//! accounting), random access to sampled examples by range reads, and a synthetic captioning
//! dataset for the demo, tests and benchmarks.

pub mod shards;
pub mod synth;
pub mod tokenizer;

pub use shards::{DataError, DatasetIndex, Example, build_index, read_captions, read_example};
