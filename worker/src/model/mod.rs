//! Models with per-example losses: the DP-Cap captioner (and its ViT encoder).

pub mod captioner;
pub mod encoder;
pub mod layers;

pub use captioner::{CaptionBatch, Captioner, CaptionerConfig};
pub use encoder::{Encoder, EncoderConfig};
