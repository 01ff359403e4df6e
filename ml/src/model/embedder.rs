//! DP-FedEmb's model: the shared ViT encoder, mean-pooled, then a linear projection to the
//! embedding (together, the backbone every client's delta covers). The classification head is
//! not a parameter: each client builds its own from its identities' mean embeddings (cosine
//! prototypes) and it never leaves the client.

use std::ops::Range;

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};

use super::encoder::Encoder;
use super::layers::Linear;
use crate::clip::{Mode, Objective, Tape};
use crate::params::ParamSet;
pub use dpcap_registry::EmbedderConfig;

/// Guards the L2 normalisation of an embedding.
const NORM_FLOOR: f64 = 1e-6;

/// The backbone: encoder and projection.
#[derive(Debug, Clone)]
pub struct Embedder {
    config: EmbedderConfig,
    encoder: Encoder,
    projection: Linear,
}

/// A client's local batch: images, each example's identity as an index into `prototypes`,
/// the client's head (unit rows [C, dim], a constant) and the head's softmax scale.
#[derive(Debug, Clone)]
pub struct EmbedBatch<B: Backend> {
    /// Pixel values [B, 3, H, W].
    pub images: Tensor<B, 4>,
    /// Class of each example within its client [B].
    pub labels: Tensor<B, 1, Int>,
    /// The client's class prototypes [C, dim], unit L2 rows; no gradient flows into them.
    pub prototypes: Tensor<B, 2>,
    /// Softmax scale s of the cosine logits s·cos(e, p_c).
    pub scale: f64,
}

impl Embedder {
    /// Registers `encoder.*` (shared with the other objectives, so `init_from` can move it)
    /// and `embed.proj.*`.
    pub fn new<B: Backend>(ps: &mut ParamSet<B>, config: EmbedderConfig) -> Self {
        Self {
            config,
            encoder: Encoder::new(ps, "encoder", config.encoder),
            projection: Linear::new(ps, "embed.proj", config.encoder.width, config.dim),
        }
    }

    /// The encoder.
    pub fn encoder(&self) -> &Encoder {
        &self.encoder
    }

    /// The shape.
    pub fn config(&self) -> EmbedderConfig {
        self.config
    }

    /// Unit embeddings [B, dim] of `images`, recorded on `tape`.
    pub fn embed<AB: AutodiffBackend>(&self, tape: &mut Tape<'_, AB>, images: Tensor<AB, 4>) -> Tensor<AB, 2> {
        let pooled = self.encoder.forward(tape, images).mean_dim(1); // [B, 1, d]
        let e = self.projection.forward(tape, pooled).squeeze_dim::<2>(1);
        let norm = e.clone().powi_scalar(2).sum_dim(1).sqrt().clamp_min(NORM_FLOOR);
        e / norm
    }

    /// Unit embeddings [B, dim] with no gradients: retrieval and the clients' heads.
    pub fn embeddings<AB: AutodiffBackend>(
        &self,
        params: &ParamSet<AB::InnerBackend>,
        images: Tensor<AB, 4>,
    ) -> Tensor<AB::InnerBackend, 2> {
        let mut tape = Tape::new(Mode::Frozen, params);
        self.embed(&mut tape, images).inner()
    }
}

/// A client's head from its own examples: the mean unit embedding of each class, normalised.
/// `labels[i]` < `classes`; a class with no example gets a zero row (never the case when the
/// labels come from the same examples).
pub fn prototypes<B: Backend>(embeddings: Tensor<B, 2>, labels: &[usize], classes: usize) -> Tensor<B, 2> {
    let [n, d] = embeddings.dims();
    let device = embeddings.device();
    let mut onehot = vec![0f32; classes * n];
    for (i, &c) in labels.iter().enumerate() {
        onehot[c * n + i] = 1.0;
    }
    let assign = Tensor::<B, 2>::from_data(TensorData::new(onehot, [classes, n]), &device);
    let sums = assign.matmul(embeddings); // [C, d]
    let norm = sums.clone().powi_scalar(2).sum_dim(1).sqrt().clamp_min(NORM_FLOOR);
    debug_assert_eq!(sums.dims(), [classes, d]);
    sums / norm
}

impl<AB: AutodiffBackend> Objective<AB> for Embedder {
    type Batch = EmbedBatch<AB>;

    /// Cross-entropy of s·cos(e_i, p_c) against the example's class: examples interact only
    /// through the constant prototypes, so the losses are per-example.
    fn losses(&self, tape: &mut Tape<'_, AB>, batch: &Self::Batch) -> Tensor<AB, 1> {
        let e = self.embed(tape, batch.images.clone());
        let logits = e.matmul(batch.prototypes.clone().transpose()).mul_scalar(batch.scale);
        let logp = crate::fused::log_softmax(logits, 1);
        -logp.gather(1, batch.labels.clone().unsqueeze_dim::<2>(1)).squeeze_dim::<1>(1)
    }

    fn batch_len(&self, batch: &Self::Batch) -> usize {
        batch.labels.dims()[0]
    }

    fn slice(&self, batch: &Self::Batch, range: Range<usize>) -> Self::Batch {
        let [_, c, h, w] = batch.images.dims();
        EmbedBatch {
            images: batch.images.clone().slice([range.clone(), 0..c, 0..h, 0..w]),
            labels: batch.labels.clone().slice([range]),
            prototypes: batch.prototypes.clone(),
            scale: batch.scale,
        }
    }
}
