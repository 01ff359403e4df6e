//! Evaluation from weights alone (post-processing of releases): mean-pooled encoder features
//! for probes, greedy captions, and DP-Cap-style caption-likelihood tests on held-out synthetic
//! scenes (zero-shot classification and ARO-style contrasts) that an image-blind model scores
//! at exactly chance; and retrieval recall on held-out identities for embedding models.
//!
//! The likelihood tests see the model only through [`CaptionScorer`], so that their chance
//! and oracle guarantees are checked with test doubles as well as with the real captioner.

pub mod contrast;
pub mod heldout;
pub mod likelihood;
pub mod retrieval;
pub mod slots;
mod tally;
#[cfg(test)]
mod tests;
pub mod zero_shot;

pub use likelihood::{CaptionScorer, ModelScorer, Span, TokenRow, log_likelihoods};

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};

use crate::clip::{Mode, Tape};
use crate::model::{Captioner, Encoder};
use crate::params::ParamSet;
use crate::trainer::images_tensor;
use dpcap_dataset::Example;
use dpcap_dataset::tokenizer::TokenizerError;

type Inner<AB> = <AB as AutodiffBackend>::InnerBackend;

/// Examples per forward pass.
const BATCH: usize = 64;

/// Why an evaluation could not run.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// The inputs do not fit the model or the test (wrong sizes, indices, unbalanced sets).
    #[error("evaluation input: {0}")]
    Input(String),
    /// A caption could not be tokenised or decoded.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// A tensor could not be read back.
    #[error("evaluation tensor: {0:?}")]
    Tensor(burn::tensor::DataError),
    /// The held-out images could not be put through the image pipeline.
    #[error("held-out image {key}: {source}")]
    Image {
        /// The image's key.
        key: String,
        /// The pipeline's refusal.
        source: dpcap_dataset::pipeline::PipelineError,
    },
}

/// Checks that every example holds [3, side, side] pixels: [`images_tensor`] only asserts it
/// in debug builds, and a wrong size would silently mix images.
fn check_pixels(examples: &[Example], side: usize) -> Result<(), EvalError> {
    match examples.iter().find(|e| e.pixels.len() != 3 * side * side) {
        Some(e) => Err(EvalError::Input(format!(
            "image {} has {} values, the model needs 3×{side}×{side}",
            e.key,
            e.pixels.len()
        ))),
        None => Ok(()),
    }
}

/// Mean-pooled encoder features, one row of d values per example.
pub fn features<AB: AutodiffBackend>(
    encoder: &Encoder,
    params: &ParamSet<Inner<AB>>,
    examples: &[Example],
) -> Vec<Vec<f32>> {
    let side = encoder.config().image;
    let device: AB::Device = params.device().clone();
    let mut rows = Vec::with_capacity(examples.len());
    for chunk in examples.chunks(BATCH) {
        let images = images_tensor::<AB>(chunk, side, &device);
        let f = encoder.features::<AB>(params, images);
        let d = f.dims()[1];
        let values = f.into_data().into_vec::<f32>().unwrap_or_default();
        rows.extend(values.chunks(d).map(<[f32]>::to_vec));
    }
    rows
}

/// Greedy decoding: token ids per example, starting from `bos` and stopping at `eos`. Each
/// image is encoded once; every step re-runs only the decoder on its memory.
pub fn greedy_captions<AB: AutodiffBackend>(
    model: &Captioner,
    params: &ParamSet<Inner<AB>>,
    examples: &[Example],
    (bos, eos): (i64, i64),
) -> Vec<Vec<i64>> {
    let config = model.config();
    let seq = config.seq;
    let device: AB::Device = params.device().clone();
    let mut out = Vec::with_capacity(examples.len());
    for chunk in examples.chunks(BATCH) {
        let b = chunk.len();
        let images = images_tensor::<AB>(chunk, config.encoder.image, &device);
        let memory = model.memory(&mut Tape::new(Mode::Frozen, params), images);
        let mut tokens = vec![0i64; b * seq];
        let mut done = vec![false; b];
        for i in 0..b {
            tokens[i * seq] = bos;
        }
        for t in 1..seq {
            if done.iter().all(|&d| d) {
                break;
            }
            let input = Tensor::<AB, 2, Int>::from_data(TensorData::new(tokens.clone(), [b, seq]), &device);
            let logits = model.decode(&mut Tape::new(Mode::Frozen, params), &memory, input);
            let [_, steps, vocab] = logits.dims();
            debug_assert_eq!(steps, seq - 1);
            let next = logits.slice([0..b, t - 1..t, 0..vocab]).reshape([b, vocab]).argmax(1).reshape([b]);
            let next = next.into_data().convert::<i64>().into_vec::<i64>().unwrap_or_default();
            for i in 0..b {
                if !done[i] {
                    tokens[i * seq + t] = next[i];
                    done[i] = next[i] == eos;
                }
            }
        }
        out.extend(tokens.chunks(seq).map(<[i64]>::to_vec));
    }
    out
}
