//! What the ML side refuses or fails at, typed so that the worker runtime keeps each kind: a
//! data error stays one (withheld under `telemetry: strict` when it may name an example), a
//! checkpoint error keeps its store or format cause.

use dpcap_dataset::JobDataError;

use crate::checkpoint::CheckpointError;

/// Why a replica could not be built, fed or updated.
#[derive(Debug, thiserror::Error)]
pub enum MlError {
    /// The job's data, as the dataset crate reported it.
    #[error(transparent)]
    Data(#[from] JobDataError),
    /// The job spec cannot be run by this model (an unknown configuration, a tokenizer that
    /// does not fit, an objective without a batch of examples).
    #[error("invalid {field}: {reason}")]
    Spec {
        /// The spec field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// The weights `init_from` names could not be opened, read, or fitted to this job's model.
    #[error("invalid init_from: {location}{}: {source}", .step.map(|s| format!(" step {s}")).unwrap_or_default())]
    InitFrom {
        /// The checkpoint root.
        location: String,
        /// The step read, once known.
        step: Option<u64>,
        /// Why (boxed: a checkpoint's error is large beside the others).
        source: Box<crate::checkpoint::CheckpointError>,
    },
    /// An example the model cannot take (its caption, its identity label); names the example.
    #[error("data: {0}")]
    Example(String),
    /// An example's caption the tokenizer refuses; names the example.
    #[error("data: example {key}: {source}")]
    Caption {
        /// The example.
        key: String,
        /// The tokenizer's refusal.
        source: dpcap_dataset::tokenizer::TokenizerError,
    },
    /// Writing or reading a checkpoint failed.
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] CheckpointError),
    /// A call the objective does not support (examples to a client trainer, or the reverse).
    #[error("{0}")]
    Unsupported(&'static str),
    /// A release whose length is not the model's P.
    #[error("release of step {step} has {values} values, the model {dim}")]
    ReleaseLength {
        /// The ledger step.
        step: u64,
        /// Values received.
        values: usize,
        /// P.
        dim: usize,
    },
    /// The device's tensor could not be read back as f32 values (burn's error has no Display).
    #[error("tensor read-back: {0:?}")]
    ReadBack(burn::tensor::DataError),
}

impl MlError {
    /// Whether the message may name an example: `telemetry: strict` withholds it.
    pub fn names_examples(&self) -> bool {
        match self {
            MlError::Data(e) => e.names_examples(),
            MlError::Example(_) | MlError::Caption { .. } => true,
            _ => false,
        }
    }
}
