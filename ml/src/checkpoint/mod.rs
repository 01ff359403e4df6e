//! Checkpoints: the weights and optimizer state as safetensors ([`format`]), and the store of a
//! job's checkpoints with their manifests and `latest` pointer ([`store`]).

mod format;

mod store;

pub use format::{
    CheckpointError, export_encoder, load_optimizer, load_weights, load_weights_with_prefix, save_optimizer,
    save_weights, save_weights_with_prefix,
};
pub use store::{CheckpointStore, Manifest};

pub(crate) use format::{provenance, serialize, to_bytes};
