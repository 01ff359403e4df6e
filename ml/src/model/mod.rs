//! Models with per-example losses: the DP-Cap captioner, ViP's masked autoencoder,
//! DP-FedEmb's embedder, and the ViT encoder they share.

pub mod captioner;
pub mod embedder;
pub mod encoder;
pub mod layers;
pub mod mae;

pub use captioner::{CaptionBatch, Captioner, CaptionerConfig};
pub use embedder::{EmbedBatch, Embedder, EmbedderConfig};
pub use encoder::{Encoder, EncoderConfig};
pub use mae::{Mae, MaeBatch, MaeConfig};

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Distribution, Tensor};
use dpcap_registry::Family;

use crate::clip::Objective;
use crate::error::MlError;
use crate::params::ParamSet;

/// The image encoder's shape of configuration `name` for `objective` (what a checkpoint
/// exports: DP-FedEmb's backbone without its embedding projection); None for an unknown name.
pub fn encoder_config(objective: Family, name: &str) -> Option<EncoderConfig> {
    match objective {
        Family::Captioner => CaptionerConfig::named(name).map(|c| c.encoder),
        Family::Mae => MaeConfig::named(name).map(|c| c.encoder),
        Family::Embedder => EmbedderConfig::named(name).map(|c| c.encoder),
    }
}

/// Work on one objective's model and a batch of it, generic over the model, so that a caller
/// (a benchmark, a profile) runs on any objective without matching on it.
pub trait OnBatch<AB: AutodiffBackend> {
    /// What the work returns.
    type Output;
    /// Runs on `model` with weights `params` and `batch`.
    fn run<M: Objective<AB>>(self, model: &M, params: &ParamSet<AB::InnerBackend>, batch: &M::Batch) -> Self::Output;
}

/// Runs `work` on a fresh model of configuration `name` for `objective` (unseeded weights)
/// and a batch of `examples` random examples on `device`. An objective that trains clients
/// rather than examples has no such batch and is refused.
pub fn with_random_batch<AB: AutodiffBackend, W: OnBatch<AB>>(
    (objective, name): (Family, &str),
    examples: usize,
    device: &AB::Device,
    work: W,
) -> Result<W::Output, MlError> {
    let unknown = || MlError::Spec { field: "model", reason: format!("unknown configuration {name:?}") };
    let mut params = ParamSet::<AB::InnerBackend>::new(device);
    match objective {
        Family::Captioner => {
            let config = CaptionerConfig::named(name).ok_or_else(unknown)?;
            let model = Captioner::new(&mut params, config);
            let batch = CaptionBatch::<AB>::random(config, examples, device);
            Ok(work.run(&model, &params, &batch))
        }
        Family::Mae => {
            let config = MaeConfig::named(name).ok_or_else(unknown)?;
            let model = Mae::new(&mut params, config);
            let side = config.encoder.image;
            let images = Tensor::random([examples, 3, side, side], Distribution::Normal(0.0, 1.0), device);
            Ok(work.run(&model, &params, &MaeBatch::new(images, config.encoder.patches())))
        }
        Family::Embedder => Err(MlError::Spec {
            field: "objective",
            reason: format!("{objective} clips per client (a user's examples), not per example"),
        }),
    }
}
