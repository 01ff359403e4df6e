//! Zero-shot classification as DP-Cap scores it: an image's class is the one whose prompts the
//! captioner finds likeliest. Prompts are "a {small|large} {colour} {shape}" scored as caption
//! prefixes (no end token); a class's score is the log-sum-exp over its two sizes, i.e. the
//! likelihood of "a {colour} {shape} of either size".
//!
//! The set must be class-balanced: an image-blind scorer then predicts the same class (or the
//! same tie) for every image and is right on exactly 1/12 of them.

use super::EvalError;
use super::likelihood::{CaptionScorer, Span};
use super::tally::Tally;
use dpcap_dataset::Example;
use dpcap_dataset::synth::{CLASSES, COLOURS, Object, SHAPES};

/// The prompts of `class`: its small and its large object.
pub fn prompts(class: u32) -> [String; 2] {
    let (colour, shape) = (class as usize / SHAPES.len(), class as usize % SHAPES.len());
    [false, true].map(|large| format!("a {}", Object { shape, colour, large }.describe()))
}

fn log_sum_exp(values: &[f64]) -> f64 {
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return max;
    }
    max + values.iter().map(|v| (v - max).exp()).sum::<f64>().ln()
}

/// Accuracy on `images` whose labels are their classes; errors unless every class has the
/// same number of images.
pub fn accuracy(scorer: &dyn CaptionScorer, images: &[Example]) -> Result<f64, EvalError> {
    debug_assert_eq!(CLASSES, COLOURS.len() * SHAPES.len());
    let mut labels = Vec::with_capacity(images.len());
    let mut counts = [0usize; CLASSES];
    for e in images {
        match e.label {
            Some(l) if (l as usize) < CLASSES => {
                counts[l as usize] += 1;
                labels.push(l as usize);
            }
            other => {
                return Err(EvalError::Input(format!(
                    "image {} has label {other:?}, not one of {CLASSES} classes",
                    e.key
                )));
            }
        }
    }
    if counts.iter().any(|&c| c != counts[0]) || counts[0] == 0 {
        return Err(EvalError::Input(format!("zero-shot set is not class-balanced: {counts:?} images per class")));
    }
    let prompts: Vec<String> = (0..CLASSES as u32).flat_map(prompts).collect();
    let rows: Vec<(usize, String)> =
        (0..images.len()).flat_map(|i| prompts.iter().map(move |p| (i, p.clone()))).collect();
    let scores = scorer.score(images, &rows, Span::Prefix)?;
    let mut tally = Tally::default();
    for (per_image, &label) in scores.chunks(prompts.len()).zip(&labels) {
        let classes: Vec<f64> = per_image.chunks(2).map(log_sum_exp).collect();
        tally.record(&classes, label);
    }
    Ok(tally.accuracy())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_name_the_class_at_both_sizes() {
        assert_eq!(prompts(0), ["a small red circle".to_owned(), "a large red circle".to_owned()]);
        assert_eq!(prompts(11), ["a small yellow triangle".to_owned(), "a large yellow triangle".to_owned()]);
        for class in 0..CLASSES as u32 {
            assert_eq!(dpcap_dataset::synth::class_name(class), prompts(class)[0]["a small ".len()..]);
        }
    }

    #[test]
    fn log_sum_exp_is_stable() {
        assert!((log_sum_exp(&[0.0, 0.0]) - 2f64.ln()).abs() < 1e-12);
        assert!((log_sum_exp(&[-1000.0, -1000.0]) - (-1000.0 + 2f64.ln())).abs() < 1e-9);
        assert_eq!(log_sum_exp(&[f64::NEG_INFINITY, f64::NEG_INFINITY]), f64::NEG_INFINITY);
    }
}
