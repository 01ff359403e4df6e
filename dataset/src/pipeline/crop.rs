//! Where an image is cropped: RandomResizedCrop keyed per (key, step, example), or the centre.

use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};

use super::{CROP_KEY_WORD_POS, TRAIN_ATTEMPTS, TRAIN_RATIO, TRAIN_SCALE};

/// How an image is cropped before it is resized to `side × side`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Crop {
    /// Training augmentation: torchvision's `RandomResizedCrop`, drawn from a ChaCha20 stream
    /// that is a pure function of (key, step, example), so a retried step crops identically and
    /// every (step, example) gets its own independent-looking crop.
    ///
    /// Derivation: the per-step crop key is the 32 bytes of ChaCha20(`key`, stream = `step`)
    /// starting at block 2⁶³ (a region the coordinator's sampler, which uses the same key and
    /// stream from block 0, never reaches); the crop's randomness is ChaCha20(crop key,
    /// stream = `example`) from block 0. Distinct (step, example) pairs get distinct streams for
    /// every u64 value of each, with no range split between them.
    Train {
        /// The job's 256-bit augmentation key (the coordinator derives it one-way from the
        /// sampler's secret, which never reaches a worker).
        key: [u8; 32],
        /// Training step (the sampler's step number).
        step: u64,
        /// The example's index in the dataset.
        example: u64,
    },
    /// Evaluation: shorter side resized to `side`, then the centre `side × side`. Deterministic.
    Eval,
}

/// A crop rectangle in source pixels. Fractional for [`Crop::Eval`] (resize-then-crop expressed
/// in source coordinates), whole pixels for [`Crop::Train`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Region {
    /// Left edge, px from the image's left.
    pub left: f64,
    /// Top edge, px from the image's top.
    pub top: f64,
    /// Width, px.
    pub width: f64,
    /// Height, px.
    pub height: f64,
}

/// The crop randomness for (key, step, example); see [`Crop::Train`] for the derivation.
pub(super) fn crop_rng(key: &[u8; 32], step: u64, example: u64) -> ChaCha20Rng {
    let mut job = ChaCha20Rng::from_seed(*key);
    job.set_stream(step);
    job.set_word_pos(CROP_KEY_WORD_POS);
    let mut step_key = [0u8; 32];
    job.fill_bytes(&mut step_key);
    let mut rng = ChaCha20Rng::from_seed(step_key);
    rng.set_stream(example);
    rng
}

/// Uniform in [lo, hi) from 53 random bits.
pub(super) fn uniform(rng: &mut ChaCha20Rng, lo: f64, hi: f64) -> f64 {
    let unit = (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
    lo + (hi - lo) * unit
}

/// Uniform integer in [0, n), unbiased (Lemire's multiply-and-reject). `n` must be positive.
pub(super) fn below(rng: &mut ChaCha20Rng, n: u64) -> u64 {
    let threshold = n.wrapping_neg() % n;
    loop {
        let product = u128::from(rng.next_u64()) * u128::from(n);
        if (product as u64) >= threshold {
            return (product >> 64) as u64;
        }
    }
}

/// torchvision's `RandomResizedCrop.get_params` with the default scale and ratio. Rounding is
/// Python's `round` (ties to even), as torchvision's.
pub(super) fn random_resized_crop(width: u32, height: u32, rng: &mut ChaCha20Rng) -> Region {
    let (w, h) = (f64::from(width), f64::from(height));
    let area = w * h;
    let (log_lo, log_hi) = (TRAIN_RATIO.0.ln(), TRAIN_RATIO.1.ln());
    for _ in 0..TRAIN_ATTEMPTS {
        let target = area * uniform(rng, TRAIN_SCALE.0, TRAIN_SCALE.1);
        let ratio = uniform(rng, log_lo, log_hi).exp();
        let crop_w = (target * ratio).sqrt().round_ties_even();
        let crop_h = (target / ratio).sqrt().round_ties_even();
        if crop_w > 0.0 && crop_w <= w && crop_h > 0.0 && crop_h <= h {
            // Top first, then left, as torchvision draws them.
            let top = below(rng, (h - crop_h) as u64 + 1) as f64;
            let left = below(rng, (w - crop_w) as u64 + 1) as f64;
            return Region { left, top, width: crop_w, height: crop_h };
        }
    }
    // Fallback: the largest centred crop whose ratio is clamped into the range.
    let ratio = w / h;
    let (crop_w, crop_h) = if ratio < TRAIN_RATIO.0 {
        (w, (w / TRAIN_RATIO.0).round_ties_even().min(h))
    } else if ratio > TRAIN_RATIO.1 {
        ((h * TRAIN_RATIO.1).round_ties_even().min(w), h)
    } else {
        (w, h)
    };
    Region { left: ((w - crop_w) / 2.0).floor(), top: ((h - crop_h) / 2.0).floor(), width: crop_w, height: crop_h }
}

/// torchvision's `Resize(side)` then `CenterCrop(side)`, as a rectangle in source pixels: the
/// resized size is (side, ⌊side·long/short⌋), the crop offset Python-rounds half the excess, and
/// the rectangle is that crop scaled back by source/resized per axis.
pub(super) fn eval_region(width: u32, height: u32, side: u32) -> Region {
    let (resized_w, resized_h) = if width <= height {
        (u64::from(side), u64::from(side) * u64::from(height) / u64::from(width))
    } else {
        (u64::from(side) * u64::from(width) / u64::from(height), u64::from(side))
    };
    let axis = |source: u32, resized: u64| {
        let scale = f64::from(source) / resized as f64;
        let offset = ((resized - u64::from(side)) as f64 / 2.0).round_ties_even();
        let start = offset * scale;
        let end = ((offset + f64::from(side)) * scale).min(f64::from(source));
        (start, end - start)
    };
    let (left, crop_w) = axis(width, resized_w);
    let (top, crop_h) = axis(height, resized_h);
    Region { left, top, width: crop_w, height: crop_h }
}
