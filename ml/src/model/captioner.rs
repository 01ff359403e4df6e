//! DP-Cap's captioner: ViT encoder, linear bridge, causal text decoder with cross-attention,
//! LayerNorm and an untied output head. Per-example loss: mean token cross-entropy over the
//! non-pad targets (next-token prediction).

use std::ops::Range;

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Int, Tensor, TensorData};

use super::encoder::Encoder;
use super::layers::{Block, INIT_STD, LayerNorm, Linear};
use crate::clip::{Objective, Tape};
use crate::params::{Init, ParamId, ParamSet};
pub use dpcap_registry::CaptionerConfig;

/// Token id of padding; targets equal to it carry no loss.
pub const PAD: i64 = 0;

/// A batch: images [B, 3, H, W] and captions [B, seq] (PAD after EOS).
#[derive(Debug, Clone)]
pub struct CaptionBatch<B: Backend> {
    /// Pixel values, roughly zero-mean unit-variance.
    pub images: Tensor<B, 4>,
    /// Token ids.
    pub tokens: Tensor<B, 2, Int>,
}

impl<B: Backend> CaptionBatch<B> {
    /// A batch of N(0, 1) images and token sequences of varied lengths (BOS = 1, words,
    /// EOS = 2, then PAD), for benchmarks and tests.
    pub fn random(config: CaptionerConfig, b: usize, device: &B::Device) -> Self {
        let s = config.seq;
        let tokens: Vec<i64> = (0..b)
            .flat_map(|i| {
                let len = 3 + (i * 7) % (s - 3);
                (0..s).map(move |j| match j {
                    0 => 1,
                    j if j < len => 3 + ((i * 131 + j * 71) % (config.vocab - 3)) as i64,
                    j if j == len => 2,
                    _ => PAD,
                })
            })
            .collect();
        let image = config.encoder.image;
        Self {
            images: Tensor::random([b, 3, image, image], Distribution::Normal(0.0, 1.0), device),
            tokens: Tensor::from_data(TensorData::new(tokens, [b, s]), device),
        }
    }
}

/// The captioner.
#[derive(Debug, Clone)]
pub struct Captioner {
    config: CaptionerConfig,
    encoder: Encoder,
    bridge: Linear,
    token_embed: ParamId,
    positions: ParamId,
    blocks: Vec<Block>,
    norm: LayerNorm,
    head: Linear,
}

impl Captioner {
    /// Registers every parameter into `ps`.
    pub fn new<B: Backend>(ps: &mut ParamSet<B>, config: CaptionerConfig) -> Self {
        let d = config.dec_width;
        Self {
            config,
            encoder: Encoder::new(ps, "encoder", config.encoder),
            bridge: Linear::new(ps, "bridge", config.encoder.width, d),
            token_embed: ps.add("decoder.token_embed", &[config.vocab, d], Init::Normal(INIT_STD)),
            positions: ps.add("decoder.positions", &[config.seq - 1, d], Init::Normal(INIT_STD)),
            blocks: (0..config.dec_depth)
                .map(|i| Block::new(ps, &format!("decoder.blocks.{i}"), d, config.dec_heads, true))
                .collect(),
            norm: LayerNorm::new(ps, "decoder.norm", d),
            head: Linear::new(ps, "decoder.head", d, config.vocab),
        }
    }

    /// The configuration.
    pub fn config(&self) -> CaptionerConfig {
        self.config
    }

    /// The image encoder (features for evaluation).
    pub fn encoder(&self) -> &Encoder {
        &self.encoder
    }

    /// Next-token logits [B, seq-1, vocab] for captions [B, seq]: [`Captioner::memory`] of
    /// the images, then [`Captioner::decode`].
    pub fn logits<AB: AutodiffBackend>(&self, tape: &mut Tape<'_, AB>, batch: &CaptionBatch<AB>) -> Tensor<AB, 3> {
        let memory = self.memory(tape, batch.images.clone());
        self.decode(tape, &memory, batch.tokens.clone())
    }

    /// What the decoder's cross-attention reads for images [B, 3, H, W]: encoder tokens
    /// through the bridge, [B, patches, dec_width]. Split from [`Captioner::decode`] so that
    /// evaluation encodes an image once and scores many candidate captions against it.
    pub fn memory<AB: AutodiffBackend>(&self, tape: &mut Tape<'_, AB>, images: Tensor<AB, 4>) -> Tensor<AB, 3> {
        let memory = self.encoder.forward(tape, images);
        self.bridge.forward(tape, memory)
    }

    /// Next-token logits [B, seq-1, vocab] for captions `tokens` [B, seq], caption i attending
    /// to row i of `memory` [B, patches, dec_width].
    pub fn decode<AB: AutodiffBackend>(
        &self,
        tape: &mut Tape<'_, AB>,
        memory: &Tensor<AB, 3>,
        tokens: Tensor<AB, 2, Int>,
    ) -> Tensor<AB, 3> {
        let [b, s] = tokens.dims();
        let inputs = tokens.slice([0..b, 0..s - 1]);
        let mut x = tape.embedding(self.token_embed, inputs);
        x = tape.add_free(self.positions, x);
        // Every block's cross-attention reads the same memory: one Gram matrix for all of them.
        let memory = tape.share(memory.clone());
        for block in &self.blocks {
            x = block.forward(tape, x, Some(&memory));
        }
        let x = self.norm.forward(tape, x);
        self.head.forward(tape, x)
    }
}

impl<AB: AutodiffBackend> Objective<AB> for Captioner {
    type Batch = CaptionBatch<AB>;

    fn losses(&self, tape: &mut Tape<'_, AB>, batch: &Self::Batch) -> Tensor<AB, 1> {
        let logits = self.logits(tape, batch);
        let [b, t, _] = logits.dims();
        let targets = batch.tokens.clone().slice([0..b, 1..t + 1]);
        let logp =
            crate::fused::log_softmax(logits, 2).gather(2, targets.clone().unsqueeze_dim::<3>(2)).squeeze_dim::<2>(2);
        let mask = targets.not_equal_elem(PAD).float();
        let count = mask.clone().sum_dim(1).clamp_min(1.0).squeeze_dim::<1>(1);
        -(logp * mask).sum_dim(1).squeeze_dim::<1>(1) / count
    }

    fn batch_len(&self, batch: &Self::Batch) -> usize {
        batch.tokens.dims()[0]
    }

    fn slice(&self, batch: &Self::Batch, range: Range<usize>) -> Self::Batch {
        let [_, c, h, w] = batch.images.dims();
        let s = batch.tokens.dims()[1];
        CaptionBatch {
            images: batch.images.clone().slice([range.clone(), 0..c, 0..h, 0..w]),
            tokens: batch.tokens.clone().slice([range, 0..s]),
        }
    }
}
