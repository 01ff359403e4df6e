//! Weights and optimizer state as safetensors. Weights keep their names and shapes (Linear
//! weights are [d_in, d_out]: transpose for PyTorch's nn.Linear); optimizer moments are stored
//! as `m.NAME` / `v.NAME` with the step count and hyper-parameters in the metadata.
//! Loading checks every name, shape and dtype and reports the first mismatch; a bad file never
//! panics.

use std::collections::HashMap;

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use safetensors::{Dtype, SafeTensors, tensor::TensorView};

use crate::optim::{AdamW, AdamWConfig};
use crate::params::ParamSet;

/// Why a checkpoint could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The bytes are not a safetensors file.
    #[error("not a safetensors file: {0}")]
    Format(#[from] safetensors::SafeTensorError),
    /// A tensor the model needs is missing.
    #[error("checkpoint has no tensor {0}")]
    Missing(String),
    /// A tensor has another shape or dtype than the model's.
    #[error("tensor {name}: checkpoint has {found}, model needs {expected}")]
    Mismatch {
        /// Tensor name.
        name: String,
        /// What the file holds.
        found: String,
        /// What the model needs.
        expected: String,
    },
    /// Metadata is missing or malformed.
    #[error("checkpoint metadata {key}: {reason}")]
    Metadata {
        /// The metadata key.
        key: &'static str,
        /// Why it is unusable.
        reason: String,
    },
    /// A number in the metadata that does not parse.
    #[error("checkpoint metadata {key}: {raw:?}: {source}")]
    Number {
        /// The metadata key.
        key: &'static str,
        /// Its value.
        raw: String,
        /// Why.
        source: std::num::ParseFloatError,
    },
    /// The step count in the metadata does not parse.
    #[error("checkpoint metadata steps: {raw:?}: {source}")]
    Steps {
        /// Its value.
        raw: String,
        /// Why.
        source: std::num::ParseIntError,
    },
    /// The checkpoint location cannot be opened.
    #[error("checkpoint location: {0}")]
    Location(#[from] dpcap_serve::StoreError),
    /// The object store failed.
    #[error("checkpoint store: {0}")]
    Store(#[from] object_store::Error),
    /// `latest` does not name a step.
    #[error("latest pointer {0:?} is not a step number")]
    Pointer(String),
    /// A manifest could not be read or written as JSON.
    #[error("checkpoint {step} manifest: {source}")]
    Manifest {
        /// The checkpoint's step.
        step: u64,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
}

pub(crate) fn to_bytes<B: Backend>(t: Tensor<B, 1>) -> Vec<u8> {
    let values: Vec<f32> = t.into_data().convert::<f32>().to_vec().expect("f32 tensor data");
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub(crate) fn serialize(
    named: Vec<(String, Vec<usize>, Vec<u8>)>,
    metadata: Option<HashMap<String, String>>,
) -> Result<Vec<u8>, CheckpointError> {
    let views: Vec<(String, TensorView<'_>)> = named
        .iter()
        .map(|(name, shape, bytes)| Ok((name.clone(), TensorView::new(Dtype::F32, shape.clone(), bytes)?)))
        .collect::<Result<_, safetensors::SafeTensorError>>()?;
    Ok(safetensors::serialize(views, metadata)?)
}

fn read<B: Backend>(
    file: &SafeTensors<'_>,
    name: &str,
    shape: &[usize],
    device: &B::Device,
) -> Result<Tensor<B, 1>, CheckpointError> {
    let view = file.tensor(name).map_err(|_| CheckpointError::Missing(name.to_owned()))?;
    if view.dtype() != Dtype::F32 || view.shape() != shape {
        return Err(CheckpointError::Mismatch {
            name: name.to_owned(),
            found: format!("{:?} {:?}", view.dtype(), view.shape()),
            expected: format!("F32 {shape:?}"),
        });
    }
    let values: Vec<f32> = view.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let n = values.len();
    Ok(Tensor::from_data(TensorData::new(values, [n]), device))
}

/// The model's weights as a safetensors file.
pub fn save_weights<B: Backend>(params: &ParamSet<B>) -> Result<Vec<u8>, CheckpointError> {
    save_weights_with_prefix(params, "")
}

/// The weights whose names start with `prefix` (e.g. "encoder." to export the encoder).
pub fn save_weights_with_prefix<B: Backend>(params: &ParamSet<B>, prefix: &str) -> Result<Vec<u8>, CheckpointError> {
    serialize(named(params, prefix), None)
}

fn named<B: Backend>(params: &ParamSet<B>, prefix: &str) -> Vec<(String, Vec<usize>, Vec<u8>)> {
    params
        .ids()
        .filter(|&id| params.spec(id).name.starts_with(prefix))
        .map(|id| (params.spec(id).name.clone(), params.spec(id).shape.clone(), to_bytes(params.value(id))))
        .collect()
}

/// The encoder of a checkpoint as a safetensors file for other tools, with its provenance in
/// the metadata: `dpcap.job_id`, `dpcap.step`, `dpcap.privacy` (the mode's name, as
/// `ModeKind` spells it) and, for weights without a guarantee, `dpcap.notice` = "NOT PRIVATE: ...".
/// Exports go through here so that no NOT PRIVATE model leaves without its marker.
pub fn export_encoder<B: Backend>(
    params: &ParamSet<B>,
    manifest: &crate::checkpoint::Manifest,
) -> Result<Vec<u8>, CheckpointError> {
    serialize(named(params, "encoder."), Some(provenance(manifest)))
}

/// The `dpcap.*` metadata of every export (see [`export_encoder`]).
pub(crate) fn provenance(manifest: &crate::checkpoint::Manifest) -> HashMap<String, String> {
    let mut metadata = HashMap::from([
        ("dpcap.job_id".to_owned(), manifest.job_id.clone()),
        ("dpcap.step".to_owned(), manifest.step.to_string()),
        ("dpcap.privacy".to_owned(), manifest.privacy.name().to_owned()),
    ]);
    if !manifest.init_from.is_empty() {
        metadata.insert("dpcap.init_from".to_owned(), manifest.init_from.clone());
    }
    if !manifest.is_private() {
        let notice = format!("NOT PRIVATE: trained as {}; these weights carry no privacy guarantee", manifest.privacy);
        metadata.insert("dpcap.notice".to_owned(), notice);
    }
    metadata
}

/// Loads weights into `params`; every parameter must be present with its shape.
pub fn load_weights<B: Backend>(params: &mut ParamSet<B>, bytes: &[u8]) -> Result<(), CheckpointError> {
    load_weights_with_prefix(params, bytes, "")
}

/// Loads the weights whose names start with `prefix` (e.g. "encoder." to start a captioner
/// from a ViP encoder); each must be present with its shape, the others keep their values.
pub fn load_weights_with_prefix<B: Backend>(
    params: &mut ParamSet<B>,
    bytes: &[u8],
    prefix: &str,
) -> Result<(), CheckpointError> {
    let file = SafeTensors::deserialize(bytes)?;
    let device = params.device().clone();
    let loaded: Vec<_> = params
        .ids()
        .filter(|&id| params.spec(id).name.starts_with(prefix))
        .map(|id| read::<B>(&file, &params.spec(id).name, &params.spec(id).shape, &device).map(|t| (id, t)))
        .collect::<Result<_, _>>()?;
    for (id, t) in loaded {
        params.set(id, t);
    }
    Ok(())
}

/// The optimizer's state as a safetensors file.
pub fn save_optimizer<B: Backend>(opt: &AdamW<B>, params: &ParamSet<B>) -> Result<Vec<u8>, CheckpointError> {
    let mut named = Vec::new();
    for id in params.ids() {
        let spec = params.spec(id);
        named.push((format!("m.{}", spec.name), vec![spec.numel()], to_bytes(opt.m[id.0].clone())));
        named.push((format!("v.{}", spec.name), vec![spec.numel()], to_bytes(opt.v[id.0].clone())));
    }
    let c = opt.config;
    let metadata = HashMap::from([
        ("steps".to_owned(), opt.steps.to_string()),
        ("beta1".to_owned(), c.beta1.to_string()),
        ("beta2".to_owned(), c.beta2.to_string()),
        ("epsilon".to_owned(), c.epsilon.to_string()),
        ("weight_decay".to_owned(), c.weight_decay.to_string()),
        ("rule".to_owned(), c.rule.name().to_owned()),
    ]);
    serialize(named, Some(metadata))
}

/// Reads optimizer state saved by [`save_optimizer`] for the same parameters.
pub fn load_optimizer<B: Backend>(params: &ParamSet<B>, bytes: &[u8]) -> Result<AdamW<B>, CheckpointError> {
    let file = SafeTensors::deserialize(bytes)?;
    let (_, header) = SafeTensors::read_metadata(bytes)?;
    let metadata = header.metadata().clone().unwrap_or_default();
    let number = |key: &'static str| -> Result<f64, CheckpointError> {
        let raw = metadata.get(key).ok_or(CheckpointError::Metadata { key, reason: "missing".into() })?;
        raw.parse().map_err(|source| CheckpointError::Number { key, raw: raw.clone(), source })
    };
    let rule = match metadata.get("rule").map(String::as_str) {
        None | Some("adam") => crate::optim::Rule::Adam,
        Some("momentum") => crate::optim::Rule::Momentum,
        Some(other) => {
            return Err(CheckpointError::Metadata {
                key: "rule",
                reason: format!("{other:?} is not adam or momentum"),
            });
        }
    };
    let config = AdamWConfig {
        rule,
        beta1: number("beta1")?,
        beta2: number("beta2")?,
        epsilon: number("epsilon")?,
        weight_decay: number("weight_decay")?,
    };
    let steps_raw =
        metadata.get("steps").ok_or(CheckpointError::Metadata { key: "steps", reason: "missing".into() })?;
    let steps = steps_raw.parse().map_err(|source| CheckpointError::Steps { raw: steps_raw.clone(), source })?;
    let device = params.device().clone();
    let mut opt = AdamW::new(config, params);
    for id in params.ids() {
        let spec = params.spec(id);
        opt.m[id.0] = read::<B>(&file, &format!("m.{}", spec.name), &[spec.numel()], &device)?;
        opt.v[id.0] = read::<B>(&file, &format!("v.{}", spec.name), &[spec.numel()], &device)?;
    }
    opt.steps = steps;
    Ok(opt)
}
