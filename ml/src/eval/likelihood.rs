//! Caption log-likelihood: log p(caption | image) = Σ log p(token) over a caption's target
//! tokens, the quantity DP-Cap's zero-shot and ARO evaluations compare between candidates.
//! Images are encoded once and their memory reused for every candidate caption of that image,
//! so scoring k candidates costs one encoder pass and k decoder passes.

use std::collections::HashMap;

use burn::tensor::activation::log_softmax;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};

use super::{EvalError, Inner, check_pixels};
use crate::clip::{Mode, Tape};
use crate::model::Captioner;
use crate::model::captioner::PAD;
use crate::params::ParamSet;
use crate::trainer::images_tensor;
use dpcap_dataset::Example;
use dpcap_dataset::tokenizer::CaptionTokenizer;

/// Images encoded per forward pass.
const IMAGE_BATCH: usize = 64;
/// Candidate captions decoded per forward pass: bounds the [rows, seq-1, vocab] logits.
const ROW_BATCH: usize = 128;

/// Which target tokens of a caption are scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    /// Every non-PAD target (the words and the end token): what the training loss averages.
    Caption,
    /// Every non-PAD target but the last (the end token of an encoded caption): a prompt's
    /// likelihood as the start of a longer caption.
    Prefix,
}

/// One caption to score against one image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRow {
    /// Index of the image in the batch of images.
    pub image: usize,
    /// Token ids [BOS … EOS, PAD …] of the model's caption length.
    pub tokens: Vec<i64>,
}

/// The targets of `tokens` (positions 1..) that `span` scores, as a 0/1 mask.
fn target_mask(tokens: &[i64], span: Span) -> Vec<f32> {
    let targets = &tokens[1..];
    let last = targets.iter().rposition(|&t| t != PAD);
    targets
        .iter()
        .enumerate()
        .map(|(j, &t)| f32::from(u8::from(t != PAD && (span == Span::Caption || Some(j) != last))))
        .collect()
}

/// Σ log p(token) over each row's targets in `span`, in row order. Rows may name images in
/// any order; each referenced image is encoded once.
pub fn log_likelihoods<AB: AutodiffBackend>(
    model: &Captioner,
    params: &ParamSet<Inner<AB>>,
    images: &[Example],
    rows: &[TokenRow],
    span: Span,
) -> Result<Vec<f64>, EvalError> {
    let config = model.config();
    let (seq, vocab) = (config.seq, config.vocab as i64);
    check_pixels(images, config.encoder.image)?;
    for (r, row) in rows.iter().enumerate() {
        if row.image >= images.len() {
            return Err(EvalError::Input(format!("row {r} names image {} of {}", row.image, images.len())));
        }
        if row.tokens.len() != seq {
            return Err(EvalError::Input(format!("row {r} has {} tokens, the model needs {seq}", row.tokens.len())));
        }
        if let Some(bad) = row.tokens.iter().find(|&&t| !(0..vocab).contains(&t)) {
            return Err(EvalError::Input(format!("row {r} has token {bad} outside the vocabulary of {vocab}")));
        }
    }
    let device: AB::Device = params.device().clone();
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by_key(|&r| rows[r].image);
    let mut scores = vec![0.0f64; rows.len()];
    let mut pending = order.as_slice();
    for start in (0..images.len()).step_by(IMAGE_BATCH) {
        let end = (start + IMAGE_BATCH).min(images.len());
        let here = pending.iter().take_while(|&&r| rows[r].image < end).count();
        let (group, rest) = pending.split_at(here);
        pending = rest;
        if group.is_empty() {
            continue;
        }
        let pixels = images_tensor::<AB>(&images[start..end], config.encoder.image, &device);
        let memory = model.memory(&mut Tape::new(Mode::Frozen, params), pixels);
        for batch in group.chunks(ROW_BATCH) {
            let b = batch.len();
            let which: Vec<i64> = batch.iter().map(|&r| (rows[r].image - start) as i64).collect();
            let which = Tensor::<AB, 1, Int>::from_data(TensorData::new(which, [b]), &device);
            let tokens: Vec<i64> = batch.iter().flat_map(|&r| rows[r].tokens.iter().copied()).collect();
            let mask: Vec<f32> = batch.iter().flat_map(|&r| target_mask(&rows[r].tokens, span)).collect();
            let tokens = Tensor::<AB, 2, Int>::from_data(TensorData::new(tokens, [b, seq]), &device);
            let mask = Tensor::<AB, 2>::from_data(TensorData::new(mask, [b, seq - 1]), &device);
            let targets = tokens.clone().slice([0..b, 1..seq]);
            let logits = model.decode(&mut Tape::new(Mode::Frozen, params), &memory.clone().select(0, which), tokens);
            let logp = log_softmax(logits, 2).gather(2, targets.unsqueeze_dim::<3>(2)).squeeze_dim::<2>(2);
            let sums = (logp * mask).sum_dim(1).reshape([b]);
            let sums = sums.into_data().convert::<f32>().into_vec::<f32>().map_err(EvalError::Tensor)?;
            for (&r, s) in batch.iter().zip(sums) {
                scores[r] = f64::from(s);
            }
        }
    }
    Ok(scores)
}

/// log p(caption | image) for captions given as text: what the likelihood tests ask of a
/// model. Implemented by [`ModelScorer`] for the captioner, and by test doubles (an
/// image-blind scorer must score every test at exactly chance; an oracle at 1).
pub trait CaptionScorer {
    /// One score per row (image index into `images`, caption text), in row order.
    fn score(&self, images: &[Example], rows: &[(usize, String)], span: Span) -> Result<Vec<f64>, EvalError>;
}

/// The captioner as a [`CaptionScorer`]: captions through its tokenizer, then
/// [`log_likelihoods`].
#[derive(Debug)]
pub struct ModelScorer<'a, AB: AutodiffBackend> {
    /// The captioner.
    pub model: &'a Captioner,
    /// Its weights.
    pub params: &'a ParamSet<Inner<AB>>,
    /// The tokenizer it was trained with.
    pub tokenizer: &'a CaptionTokenizer,
}

impl<AB: AutodiffBackend> CaptionScorer for ModelScorer<'_, AB> {
    fn score(&self, images: &[Example], rows: &[(usize, String)], span: Span) -> Result<Vec<f64>, EvalError> {
        let seq = self.model.config().seq;
        // The tests score a handful of distinct captions against many images.
        let mut encoded: HashMap<&str, Vec<i64>> = HashMap::new();
        let mut token_rows = Vec::with_capacity(rows.len());
        for (image, caption) in rows {
            let tokens = match encoded.get(caption.as_str()) {
                Some(tokens) => tokens.clone(),
                None => {
                    let tokens = self.tokenizer.encode(caption, seq)?;
                    encoded.insert(caption, tokens.clone());
                    tokens
                }
            };
            token_rows.push(TokenRow { image: *image, tokens });
        }
        log_likelihoods::<AB>(self.model, self.params, images, &token_rows, span)
    }
}
