//! The ViT image encoder shared by the captioner and the MAE: patch embedding as a Linear on
//! unfolded patches, learned positions, pre-norm blocks, final LayerNorm.

use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};

use super::layers::{Block, INIT_STD, LayerNorm, Linear};
use crate::clip::{Mode, Tape};
use crate::params::{Init, ParamId, ParamSet};

pub use dpcap_registry::EncoderConfig;

/// The ViT encoder.
#[derive(Debug, Clone)]
pub struct Encoder {
    config: EncoderConfig,
    patch_embed: Linear,
    positions: ParamId,
    blocks: Vec<Block>,
    norm: LayerNorm,
}

/// Images [B, 3, H, W] → patches [B, N, 3·p·p] (channel-major within a patch).
pub fn patchify<B: Backend>(images: Tensor<B, 4>, patch: usize) -> Tensor<B, 3> {
    let [b, c, h, w] = images.dims();
    let (gh, gw) = (h / patch, w / patch);
    images.reshape([b, c, gh, patch, gw, patch]).permute([0, 2, 4, 1, 3, 5]).reshape([b, gh * gw, c * patch * patch])
}

impl Encoder {
    /// Registers the encoder's parameters under `name`.
    pub fn new<B: Backend>(ps: &mut ParamSet<B>, name: &str, config: EncoderConfig) -> Self {
        assert!(
            config.image.is_multiple_of(config.patch),
            "image {} is not a multiple of patch {}",
            config.image,
            config.patch
        );
        let d = config.width;
        Self {
            config,
            patch_embed: Linear::new(ps, &format!("{name}.patch_embed"), 3 * config.patch * config.patch, d),
            positions: ps.add(format!("{name}.positions"), &[config.patches(), d], Init::Normal(INIT_STD)),
            blocks: (0..config.depth)
                .map(|i| Block::new(ps, &format!("{name}.blocks.{i}"), d, config.heads, false))
                .collect(),
            norm: LayerNorm::new(ps, &format!("{name}.norm"), d),
        }
    }

    /// The encoder's shape.
    pub fn config(&self) -> EncoderConfig {
        self.config
    }

    /// Patch tokens with positions added: [B, N, d].
    pub fn embed<AB: AutodiffBackend>(&self, tape: &mut Tape<'_, AB>, images: Tensor<AB, 4>) -> Tensor<AB, 3> {
        let x = self.patch_embed.forward(tape, patchify(images, self.config.patch));
        tape.add_free(self.positions, x)
    }

    /// Runs the blocks and the final norm over tokens [B, T, d].
    pub fn encode_tokens<AB: AutodiffBackend>(&self, tape: &mut Tape<'_, AB>, mut x: Tensor<AB, 3>) -> Tensor<AB, 3> {
        for block in &self.blocks {
            x = block.forward(tape, x, None);
        }
        self.norm.forward(tape, x)
    }

    /// Evaluation features: mean-pooled encoder outputs [B, d], no gradients.
    pub fn features<AB: AutodiffBackend>(
        &self,
        params: &ParamSet<AB::InnerBackend>,
        images: Tensor<AB, 4>,
    ) -> Tensor<AB::InnerBackend, 2> {
        self.tokens(params, images).mean_dim(1).squeeze_dim::<2>(1)
    }

    /// Encoded tokens [B, N, d] (after the final norm), no gradients.
    pub fn tokens<AB: AutodiffBackend>(
        &self,
        params: &ParamSet<AB::InnerBackend>,
        images: Tensor<AB, 4>,
    ) -> Tensor<AB::InnerBackend, 3> {
        let mut tape = Tape::new(Mode::Frozen, params);
        self.forward(&mut tape, images).inner()
    }

    /// Images [B, 3, H, W] → encoded tokens [B, N, d].
    pub fn forward<AB: AutodiffBackend>(&self, tape: &mut Tape<'_, AB>, images: Tensor<AB, 4>) -> Tensor<AB, 3> {
        let x = self.embed(tape, images);
        self.encode_tokens(tape, x)
    }
}
