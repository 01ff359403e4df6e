//! ViP's masked autoencoder: the shared ViT encoder sees a random 25 % of each image's patches,
//! a light decoder reconstructs all of them, and the per-example loss is the MSE on the
//! masked patches. Masks are drawn per example on the data side (part of the batch), so a
//! retried step sees the same masks.

use std::ops::Range;

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Int, Tensor};

use super::encoder::{Encoder, patchify};
use super::layers::{Block, INIT_STD, LayerNorm, Linear};
use crate::clip::{Objective, Tape};
use crate::params::{Init, ParamId, ParamSet};
pub use dpcap_registry::MaeConfig;

/// Images with each example's patch permutation: the first `visible` entries are shown.
#[derive(Debug, Clone)]
pub struct MaeBatch<B: Backend> {
    /// Pixel values [B, 3, H, W].
    pub images: Tensor<B, 4>,
    /// Patch indices in shuffled order [B, N].
    pub shuffle: Tensor<B, 2, Int>,
    /// The inverse permutation [B, N].
    pub restore: Tensor<B, 2, Int>,
}

impl<B: Backend> MaeBatch<B> {
    /// Draws an independent random patch order for every image (backend RNG).
    pub fn new(images: Tensor<B, 4>, patches: usize) -> Self {
        let b = images.dims()[0];
        let noise = Tensor::<B, 2>::random([b, patches], Distribution::Uniform(0.0, 1.0), &images.device());
        let shuffle = noise.argsort(1);
        let restore = shuffle.clone().argsort(1);
        Self { images, shuffle, restore }
    }
}

/// Gathers rows `indices` [B, K] of x [B, N, d].
fn gather_rows<B: Backend>(x: Tensor<B, 3>, indices: Tensor<B, 2, Int>) -> Tensor<B, 3> {
    let [b, k] = indices.dims();
    let d = x.dims()[2];
    x.gather(1, indices.unsqueeze_dim::<3>(2).expand([b, k, d]))
}

/// The masked autoencoder.
#[derive(Debug, Clone)]
pub struct Mae {
    config: MaeConfig,
    encoder: Encoder,
    embed: Linear,
    mask_token: ParamId,
    positions: ParamId,
    blocks: Vec<Block>,
    norm: LayerNorm,
    head: Linear,
}

impl Mae {
    /// Registers every parameter into `ps`.
    pub fn new<B: Backend>(ps: &mut ParamSet<B>, config: MaeConfig) -> Self {
        let (d, n, p) = (config.dec_width, config.encoder.patches(), config.encoder.patch);
        Self {
            config,
            encoder: Encoder::new(ps, "encoder", config.encoder),
            embed: Linear::new(ps, "mae_decoder.embed", config.encoder.width, d),
            mask_token: ps.add("mae_decoder.mask_token", &[1, d], Init::Normal(INIT_STD)),
            positions: ps.add("mae_decoder.positions", &[n, d], Init::Normal(INIT_STD)),
            blocks: (0..config.dec_depth)
                .map(|i| Block::new(ps, &format!("mae_decoder.blocks.{i}"), d, config.dec_heads, false))
                .collect(),
            norm: LayerNorm::new(ps, "mae_decoder.norm", d),
            head: Linear::new(ps, "mae_decoder.head", d, 3 * p * p),
        }
    }

    /// The configuration.
    pub fn config(&self) -> MaeConfig {
        self.config
    }

    /// The encoder (features for evaluation).
    pub fn encoder(&self) -> &Encoder {
        &self.encoder
    }
}

impl<AB: AutodiffBackend> Objective<AB> for Mae {
    type Batch = MaeBatch<AB>;

    fn losses(&self, tape: &mut Tape<'_, AB>, batch: &Self::Batch) -> Tensor<AB, 1> {
        let (n, keep) = (self.config.encoder.patches(), self.config.visible());
        let b = batch.images.dims()[0];
        let tokens = self.encoder.embed(tape, batch.images.clone());
        let visible = gather_rows(tokens, batch.shuffle.clone().slice([0..b, 0..keep]));
        let encoded = self.encoder.encode_tokens(tape, visible);
        let shown = self.embed.forward(tape, encoded);
        let hidden = tape.embedding(self.mask_token, Tensor::<AB, 2, Int>::zeros([b, n - keep], &shown.device()));
        let mut x = gather_rows(Tensor::cat(vec![shown, hidden], 1), batch.restore.clone());
        x = tape.add_free(self.positions, x);
        for block in &self.blocks {
            x = block.forward(tape, x, None);
        }
        let x = self.norm.forward(tape, x);
        let predicted = self.head.forward(tape, x);
        let target = patchify(batch.images.clone(), self.config.encoder.patch);
        let masked = batch.shuffle.clone().slice([0..b, keep..n]);
        let error = (gather_rows(predicted, masked.clone()) - gather_rows(target, masked)).powi_scalar(2);
        error.reshape([b as i32, -1]).mean_dim(1).squeeze_dim(1)
    }

    fn batch_len(&self, batch: &Self::Batch) -> usize {
        batch.images.dims()[0]
    }

    fn slice(&self, batch: &Self::Batch, range: Range<usize>) -> Self::Batch {
        let [_, c, h, w] = batch.images.dims();
        let n = batch.shuffle.dims()[1];
        MaeBatch {
            images: batch.images.clone().slice([range.clone(), 0..c, 0..h, 0..w]),
            shuffle: batch.shuffle.clone().slice([range.clone(), 0..n]),
            restore: batch.restore.clone().slice([range, 0..n]),
        }
    }
}
