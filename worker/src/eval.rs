//! Evaluation from weights alone (post-processing of releases): mean-pooled encoder features
//! for a linear probe, and greedy captions from the captioner.

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};

use crate::clip::{Mode, Tape};
use crate::data::Example;
use crate::model::{CaptionBatch, Captioner, Encoder};
use crate::params::ParamSet;
use crate::runtime::trainer::images_tensor;

type Inner<AB> = <AB as AutodiffBackend>::InnerBackend;

/// Examples per forward pass.
const BATCH: usize = 64;

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

/// Greedy decoding: token ids per example, starting from `bos` and stopping at `eos`.
pub fn greedy_captions<AB: AutodiffBackend>(
    model: &Captioner,
    params: &ParamSet<Inner<AB>>,
    examples: &[Example],
    (bos, eos): (i64, i64),
) -> Vec<Vec<i64>> {
    let config = model.config();
    let (b, seq) = (examples.len(), config.seq);
    let device: AB::Device = params.device().clone();
    let images = images_tensor::<AB>(examples, config.encoder.image, &device);
    let mut tokens = vec![0i64; b * seq];
    let mut done = vec![false; b];
    for i in 0..b {
        tokens[i * seq] = bos;
    }
    for t in 1..seq {
        let batch = CaptionBatch {
            images: images.clone(),
            tokens: Tensor::<AB, 2, Int>::from_data(TensorData::new(tokens.clone(), [b, seq]), &device),
        };
        let mut tape = Tape::new(Mode::Frozen, params);
        let logits = model.logits(&mut tape, &batch);
        let [_, steps, vocab] = logits.dims();
        let next = logits.slice([0..b, t - 1..t, 0..vocab]).reshape([b, vocab]).argmax(1).reshape([b]);
        let next = next.into_data().convert::<i64>().into_vec::<i64>().unwrap_or_default();
        debug_assert_eq!(steps, seq - 1);
        for i in 0..b {
            if !done[i] {
                tokens[i * seq + t] = next[i];
                done[i] = next[i] == eos;
            }
        }
    }
    tokens.chunks(seq).map(<[i64]>::to_vec).collect()
}
