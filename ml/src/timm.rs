//! The encoder as a timm `VisionTransformer` state dict, for PyTorch users who load weights
//! with `model.load_state_dict(file, strict=True)`.
//!
//! Our encoder is a plain ViT in timm's terms: patch embedding (a Linear on channel-major
//! patches = a stride-p convolution), learned positions for the patches only (no class token),
//! pre-norm blocks with exact GELU, a final LayerNorm over every token, and average pooling.
//! The matching timm model is `VisionTransformer(class_token=False, global_pool="avg",
//! fc_norm=False, num_classes=0, norm_layer=LayerNorm(eps=1e-5), ...)`; [`model_args`] gives
//! its arguments. What changes on the way:
//!
//! - names: `encoder.blocks.i.ln1.gamma` → `blocks.i.norm1.weight`, `attn.o` → `attn.proj`, …;
//! - Linear weights are [d_in, d_out] here and [d_out, d_in] in PyTorch: transposed;
//! - q, k, v are three Linears here and one fused `attn.qkv` ([q; k; v] rows) in timm;
//! - the patch Linear [3·p·p, d] becomes the convolution weight [d, 3, p, p];
//! - positions [N, d] become `pos_embed` [1, N, d].
//!
//! The export carries the same provenance metadata as [`export_encoder`]: a NOT PRIVATE model
//! never leaves without its marker.
//!
//! [`export_encoder`]: crate::checkpoint::export_encoder

use std::collections::HashMap;

use burn::tensor::backend::Backend;
use serde_json::{Value, json};

use crate::checkpoint::Manifest;
use crate::checkpoint::{CheckpointError, provenance, serialize, to_bytes};
use crate::model::EncoderConfig;
use crate::model::layers::LN_EPS;
use crate::params::ParamSet;

/// A host copy of a parameter: its shape and row-major values.
struct Host {
    shape: Vec<usize>,
    values: Vec<f32>,
}

impl Host {
    /// [rows, cols] → [cols, rows].
    fn transposed(&self) -> Host {
        let (rows, cols) = (self.shape[0], self.shape[1]);
        let mut values = vec![0.0; self.values.len()];
        for r in 0..rows {
            for c in 0..cols {
                values[c * rows + r] = self.values[r * cols + c];
            }
        }
        Host { shape: vec![cols, rows], values }
    }

    fn reshaped(self, shape: Vec<usize>) -> Host {
        debug_assert_eq!(shape.iter().product::<usize>(), self.values.len());
        Host { shape, values: self.values }
    }
}

/// The timm `VisionTransformer` keyword arguments that build the model these weights fit,
/// except `norm_layer`: LayerNorm with ε = [`LN_EPS`] (timm's default is 1e-6).
pub fn model_args(config: EncoderConfig) -> Value {
    json!({
        "img_size": config.image,
        "patch_size": config.patch,
        "in_chans": 3,
        "embed_dim": config.width,
        "depth": config.depth,
        "num_heads": config.heads,
        "mlp_ratio": 4.0,
        "qkv_bias": true,
        "class_token": false,
        "global_pool": "avg",
        "fc_norm": false,
        "num_classes": 0,
    })
}

/// The encoder (parameters `encoder.*` of `params`) as a timm state dict in safetensors, with
/// provenance (`dpcap.*`), `timm.model_args` (JSON) and `timm.norm_eps` in the metadata.
pub fn export_timm<B: Backend>(
    params: &ParamSet<B>,
    config: EncoderConfig,
    manifest: &Manifest,
) -> Result<Vec<u8>, CheckpointError> {
    let mut host: HashMap<String, Host> = params
        .ids()
        .filter_map(|id| {
            let spec = params.spec(id);
            let name = spec.name.strip_prefix("encoder.")?;
            let values = params.value(id).into_data().convert::<f32>().to_vec().expect("f32 tensor data");
            Some((name.to_owned(), Host { shape: spec.shape.clone(), values }))
        })
        .collect();
    let mut take = |name: &str| host.remove(name).ok_or_else(|| CheckpointError::Missing(format!("encoder.{name}")));
    let (p, d) = (config.patch, config.width);
    let mut out: Vec<(String, Host)> = Vec::new();
    out.push(("patch_embed.proj.weight".into(), take("patch_embed.weight")?.transposed().reshaped(vec![d, 3, p, p])));
    out.push(("patch_embed.proj.bias".into(), take("patch_embed.bias")?));
    out.push(("pos_embed".into(), take("positions")?.reshaped(vec![1, config.patches(), d])));
    for i in 0..config.depth {
        let block = format!("blocks.{i}");
        for (from, to) in [("ln1", "norm1"), ("ln2", "norm2")] {
            out.push((format!("{block}.{to}.weight"), take(&format!("{block}.{from}.gamma"))?));
            out.push((format!("{block}.{to}.bias"), take(&format!("{block}.{from}.beta"))?));
        }
        let (mut weight, mut bias) = (Vec::with_capacity(3 * d * d), Vec::with_capacity(3 * d));
        for part in ["q", "k", "v"] {
            weight.extend(take(&format!("{block}.attn.{part}.weight"))?.transposed().values);
            bias.extend(take(&format!("{block}.attn.{part}.bias"))?.values);
        }
        out.push((format!("{block}.attn.qkv.weight"), Host { shape: vec![3 * d, d], values: weight }));
        out.push((format!("{block}.attn.qkv.bias"), Host { shape: vec![3 * d], values: bias }));
        for (from, to) in [("attn.o", "attn.proj"), ("fc1", "mlp.fc1"), ("fc2", "mlp.fc2")] {
            out.push((format!("{block}.{to}.weight"), take(&format!("{block}.{from}.weight"))?.transposed()));
            out.push((format!("{block}.{to}.bias"), take(&format!("{block}.{from}.bias"))?));
        }
    }
    out.push(("norm.weight".into(), take("norm.gamma")?));
    out.push(("norm.bias".into(), take("norm.beta")?));
    if let Some(name) = host.keys().min() {
        return Err(CheckpointError::Mismatch {
            name: format!("encoder.{name}"),
            found: "a parameter".into(),
            expected: "no parameter outside the ViT encoder's".into(),
        });
    }
    let mut metadata = provenance(manifest);
    metadata.insert("timm.model_args".into(), model_args(config).to_string());
    metadata.insert("timm.norm_eps".into(), LN_EPS.to_string());
    let named = out
        .into_iter()
        .map(|(name, h)| (name, h.shape, h.values.iter().flat_map(|v| v.to_le_bytes()).collect()))
        .collect();
    serialize(named, Some(metadata))
}

/// Vectors to check an export against: `images` [n, 3, H, W] (N(0, 1) pixels after
/// normalisation, seeded), and our encoder's `tokens` [n, N, d] and mean-pooled `features`
/// [n, d] on them. timm's `forward_features(images)` and `model(images)` must match them
/// (`reference/timm_check.py`).
pub fn check_vectors<AB: burn::tensor::backend::AutodiffBackend>(
    encoder: &crate::model::Encoder,
    params: &ParamSet<AB::InnerBackend>,
    n: usize,
    seed: u64,
) -> Result<Vec<u8>, CheckpointError> {
    let config = encoder.config();
    let shape = [n, 3, config.image, config.image];
    let pixels = crate::params::normal_values(seed, 0, shape.iter().product(), 1.0);
    let images =
        burn::tensor::Tensor::<AB, 4>::from_data(burn::tensor::TensorData::new(pixels.clone(), shape), params.device());
    let tokens = encoder.tokens(params, images);
    let features = tokens.clone().mean_dim(1).reshape([n, config.width]);
    let flat = |t: Vec<f32>| t.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    let tokens_shape = tokens.dims().to_vec();
    let named = vec![
        ("images".to_owned(), shape.to_vec(), flat(pixels)),
        ("tokens".to_owned(), tokens_shape, to_bytes(tokens.flatten::<1>(0, 2))),
        ("features".to_owned(), vec![n, config.width], to_bytes(features.flatten::<1>(0, 1))),
    ];
    serialize(named, Some(HashMap::from([("timm.model_args".to_owned(), model_args(config).to_string())])))
}
