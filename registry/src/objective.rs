//! The objectives ([`Family`]) and the configurations each builds, with their parameter
//! counts: an objective and its shapes are added here together.

use crate::{block, layer_norm, linear};

/// What a job trains, its objective: the model family a configuration name is built into. The
/// one type of the objective past the wire (`dpcap_proto::contract::family_from_proto`), in
/// specs ("caption", "mae", "fedemb"), manifests and the CLI alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
pub enum Family {
    /// DP-Cap's captioner (objective caption): the default.
    #[default]
    #[serde(rename = "caption")]
    Captioner,
    /// ViP's masked autoencoder (objective mae).
    #[serde(rename = "mae")]
    Mae,
    /// DP-FedEmb's embedder (objective fedemb): user-level privacy.
    #[serde(rename = "fedemb")]
    Embedder,
}

impl Family {
    /// Every objective.
    pub const ALL: [Family; 3] = [Family::Captioner, Family::Mae, Family::Embedder];

    /// "caption", "mae" or "fedemb", as specs, manifests and the CLI name it.
    pub fn name(self) -> &'static str {
        match self {
            Family::Captioner => "caption",
            Family::Mae => "mae",
            Family::Embedder => "fedemb",
        }
    }

    /// Whether the objective protects users (DP-FedEmb samples and clips clients of users).
    /// Exhaustive: a new objective answers it.
    pub fn is_user_level(self) -> bool {
        match self {
            Family::Embedder => true,
            Family::Captioner | Family::Mae => false,
        }
    }

    /// Whether the objective trains on captions (and so needs a tokenizer). Exhaustive: a new
    /// objective answers it.
    pub fn has_captions(self) -> bool {
        match self {
            Family::Captioner => true,
            Family::Mae | Family::Embedder => false,
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An objective name that is not one of [`Family::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid objective: {0:?} is not caption, mae or fedemb")]
pub struct UnknownObjective(pub String);

impl std::str::FromStr for Family {
    type Err = UnknownObjective;
    fn from_str(s: &str) -> Result<Self, UnknownObjective> {
        Family::ALL.into_iter().find(|f| f.name() == s).ok_or_else(|| UnknownObjective(s.to_owned()))
    }
}

/// The trainable parameter count P of configuration `name` in `family`: the length of every
/// gradient part and release. None for an unknown name.
pub fn parameter_count(family: Family, name: &str) -> Option<u64> {
    let count = match family {
        Family::Captioner => CaptionerConfig::named(name)?.parameters(),
        Family::Mae => MaeConfig::named(name)?.parameters(),
        Family::Embedder => EmbedderConfig::named(name)?.parameters(),
    };
    Some(count as u64)
}

/// The ViT encoder every objective shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncoderConfig {
    /// Square image side in pixels.
    pub image: usize,
    /// Square patch side in pixels.
    pub patch: usize,
    /// Token width.
    pub width: usize,
    /// Number of blocks.
    pub depth: usize,
    /// Attention heads.
    pub heads: usize,
}

impl EncoderConfig {
    /// Patches per image.
    pub fn patches(&self) -> usize {
        (self.image / self.patch).pow(2)
    }

    /// Patch embedding (a Linear on unfolded 3·p·p patches), learned positions, the blocks and
    /// the final LayerNorm.
    pub fn parameters(&self) -> usize {
        let d = self.width;
        linear(3 * self.patch * self.patch, d) + self.patches() * d + self.depth * block(d, false) + layer_norm(d)
    }

    /// Matrix-product FLOPs of one image's forward pass (2 per multiply-add): the patch
    /// embedding, then per block the four projections (8·T·d²), the MLP (16·T·d²) and
    /// attention's two products (4·T²·d). Elementwise work is left out, as MFU conventions do.
    pub fn forward_flops(&self) -> u64 {
        let (t, d) = (self.patches() as u64, self.width as u64);
        2 * t * (3 * (self.patch * self.patch) as u64) * d + self.depth as u64 * (24 * t * d * d + 4 * t * t * d)
    }
}

/// DP-Cap's captioner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaptionerConfig {
    /// Image encoder.
    pub encoder: EncoderConfig,
    /// Decoder width.
    pub dec_width: usize,
    /// Decoder blocks.
    pub dec_depth: usize,
    /// Decoder heads.
    pub dec_heads: usize,
    /// Vocabulary size: a tokenizer may use fewer ids, never more.
    pub vocab: usize,
    /// Caption length in tokens (BOS … EOS, padded); the decoder sees `seq - 1` inputs.
    pub seq: usize,
}

impl CaptionerConfig {
    /// A named configuration: micro, bench, tiny, small, base, large.
    pub fn named(name: &str) -> Option<Self> {
        let enc = |image, patch, width, depth, heads| EncoderConfig { image, patch, width, depth, heads };
        let paper =
            |encoder, dec_width, dec_heads| Self { encoder, dec_width, dec_depth: 6, dec_heads, vocab: 30522, seq: 40 };
        Some(match name {
            "micro" => {
                Self { encoder: enc(32, 8, 64, 2, 2), dec_width: 64, dec_depth: 1, dec_heads: 2, vocab: 256, seq: 12 }
            }
            "bench" => Self {
                encoder: enc(32, 4, 128, 4, 4),
                dec_width: 128,
                dec_depth: 2,
                dec_heads: 4,
                vocab: 1000,
                seq: 16,
            },
            "tiny" => paper(enc(224, 16, 384, 12, 6), 384, 6),
            "small" => paper(enc(224, 16, 576, 12, 12), 576, 12),
            "base" => paper(enc(224, 16, 768, 12, 12), 768, 12),
            "large" => paper(enc(224, 16, 1024, 24, 16), 768, 12),
            _ => return None,
        })
    }

    /// Encoder, bridge, token embedding, decoder positions, decoder blocks (with
    /// cross-attention), final LayerNorm and the untied head.
    pub fn parameters(&self) -> usize {
        let d = self.dec_width;
        self.encoder.parameters()
            + linear(self.encoder.width, d)
            + self.vocab * d
            + (self.seq - 1) * d
            + self.dec_depth * block(d, true)
            + layer_norm(d)
            + linear(d, self.vocab)
    }

    /// Matrix-product FLOPs of one example's forward pass: the encoder, the bridge, each
    /// decoder block over S = seq − 1 tokens (self-attention as in the encoder; cross-attention's
    /// q and o over S, k and v over the T encoder tokens, its products S·T·d each) and the head.
    pub fn forward_flops(&self) -> u64 {
        let (t, s, d) = (self.encoder.patches() as u64, (self.seq - 1) as u64, self.dec_width as u64);
        let self_attention = 24 * s * d * d + 4 * s * s * d;
        let cross = 4 * s * d * d + 4 * t * d * d + 4 * s * t * d;
        self.encoder.forward_flops()
            + 2 * t * self.encoder.width as u64 * d
            + self.dec_depth as u64 * (self_attention + cross)
            + 2 * s * d * self.vocab as u64
    }

    /// Training FLOPs per example, forward and backward: three forward passes (the backward
    /// takes the gradients of both inputs and weights), the convention MFU is stated in.
    pub fn train_flops(&self) -> u64 {
        3 * self.forward_flops()
    }
}

/// ViP's masked autoencoder.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MaeConfig {
    /// Image encoder.
    pub encoder: EncoderConfig,
    /// Decoder width.
    pub dec_width: usize,
    /// Decoder blocks.
    pub dec_depth: usize,
    /// Decoder heads.
    pub dec_heads: usize,
    /// Fraction of patches hidden from the encoder.
    pub mask_ratio: f64,
}

impl MaeConfig {
    /// The MAE for a captioner configuration name: same encoder; decoder 512 wide, 4 blocks,
    /// 16 heads for the paper sizes, and a proportionate small decoder for micro and bench.
    pub fn named(name: &str) -> Option<Self> {
        let encoder = CaptionerConfig::named(name)?.encoder;
        let (dec_width, dec_depth, dec_heads) = match name {
            "micro" => (64, 1, 2),
            "bench" => (128, 2, 4),
            _ => (512, 4, 16),
        };
        Some(Self { encoder, dec_width, dec_depth, dec_heads, mask_ratio: 0.75 })
    }

    /// Patches the encoder sees per image.
    pub fn visible(&self) -> usize {
        let n = self.encoder.patches();
        ((n as f64) * (1.0 - self.mask_ratio)).round().clamp(1.0, (n - 1) as f64) as usize
    }

    /// Encoder, decoder embedding, mask token, decoder positions, blocks, LayerNorm and the
    /// pixel head (3·p·p per patch).
    pub fn parameters(&self) -> usize {
        let (d, p) = (self.dec_width, self.encoder.patch);
        self.encoder.parameters()
            + linear(self.encoder.width, d)
            + d
            + self.encoder.patches() * d
            + self.dec_depth * block(d, false)
            + layer_norm(d)
            + linear(d, 3 * p * p)
    }
}

/// DP-FedEmb's embedder: the encoder, mean-pooled, and a projection (the head is per client,
/// never a parameter).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EmbedderConfig {
    /// Image encoder (the captioner configuration's, so names are shared).
    pub encoder: EncoderConfig,
    /// Embedding width.
    pub dim: usize,
}

impl EmbedderConfig {
    /// The embedder for a captioner configuration name: same encoder, embedding as wide as
    /// the encoder's tokens.
    pub fn named(name: &str) -> Option<Self> {
        let encoder = CaptionerConfig::named(name)?.encoder;
        Some(Self { encoder, dim: encoder.width })
    }

    /// Encoder and projection.
    pub fn parameters(&self) -> usize {
        self.encoder.parameters() + linear(self.encoder.width, self.dim)
    }
}
