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
