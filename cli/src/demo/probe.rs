//! The linear probe: multinomial logistic regression (linfa) on frozen encoder features of
//! held-out labelled images, trained on one part and scored on the rest.

use anyhow::{Context, Result, bail};
use linfa::prelude::*;
use linfa_logistic::MultiLogisticRegression;
use ndarray::{Array1, Array2};

/// Fraction of examples used to fit the probe; the rest score it.
const TRAIN_FRACTION: f64 = 2.0 / 3.0;

/// Accuracy on the held-out part of `features` (rows) with `labels`.
pub fn accuracy(features: &[Vec<f32>], labels: &[u32]) -> Result<f64> {
    if features.len() != labels.len() || features.len() < 6 {
        bail!(
            "probe needs at least 6 labelled examples with features, got {} features and {} labels",
            features.len(),
            labels.len()
        );
    }
    let d = features[0].len();
    let split = (features.len() as f64 * TRAIN_FRACTION) as usize;
    // Standardise with the training part's statistics.
    let mut mean = vec![0.0f64; d];
    let mut std = vec![0.0f64; d];
    for row in &features[..split] {
        for (m, v) in mean.iter_mut().zip(row) {
            *m += f64::from(*v) / split as f64;
        }
    }
    for row in &features[..split] {
        for ((s, v), m) in std.iter_mut().zip(row).zip(&mean) {
            *s += (f64::from(*v) - m).powi(2) / split as f64;
        }
    }
    let matrix = |rows: &[Vec<f32>]| {
        Array2::from_shape_fn((rows.len(), d), |(i, j)| (f64::from(rows[i][j]) - mean[j]) / (std[j].sqrt() + 1e-8))
    };
    let (x_train, x_test) = (matrix(&features[..split]), matrix(&features[split..]));
    let y_train: Array1<usize> = labels[..split].iter().map(|&l| l as usize).collect();
    let y_test: Vec<usize> = labels[split..].iter().map(|&l| l as usize).collect();
    let model = MultiLogisticRegression::default()
        .alpha(1e-2)
        .max_iterations(300)
        .fit(&Dataset::new(x_train, y_train))
        .context("fitting the linear probe")?;
    let predicted = model.predict(&x_test);
    let correct = predicted.iter().zip(&y_test).filter(|(p, y)| p == y).count();
    Ok(correct as f64 / y_test.len() as f64)
}
