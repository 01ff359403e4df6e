//! Probes: multinomial logistic regression (linfa) on frozen encoder features of held-out
//! labelled images. The linear probe fits on the first part and scores the rest; few-shot
//! probes fit on k examples per class drawn from that same first part and score the same rest,
//! averaged over a few seeded draws. Features are standardised with the first part's
//! statistics in both cases (label-free, so a few-shot probe sees no extra labels).

use anyhow::{Context, Result, bail};
use linfa::prelude::*;
use linfa_logistic::MultiLogisticRegression;
use ndarray::{Array1, Array2};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};

/// Fraction of examples used to fit the probe; the rest score it.
const TRAIN_FRACTION: f64 = 2.0 / 3.0;

/// L-BFGS iterations. linfa 0.8's multinomial loss takes log-sum-exp against the *global*
/// maximum logit and clamps at 1e-15, so once the weights grow its cost and gradient disagree
/// and each further iteration's line search costs more without converging: on the demo's 2,000
/// × 64 features, 50 iterations took 0.9 s and 300 took 8.5 s (release), with the same
/// accuracy (DP 41.2 %, random init 39.1 %; 10 iterations gave 38.4 %).
const MAX_ITERATIONS: u64 = 50;

/// Features split into the fit part and the scored part, standardised.
struct Split {
    fit: Array2<f64>,
    fit_labels: Vec<usize>,
    test: Array2<f64>,
    test_labels: Vec<usize>,
}

impl Split {
    fn new(features: &[Vec<f32>], labels: &[u32]) -> Result<Self> {
        if features.len() != labels.len() || features.len() < 6 {
            bail!(
                "probe needs at least 6 labelled examples with features, got {} features and {} labels",
                features.len(),
                labels.len()
            );
        }
        let d = features[0].len();
        if let Some(bad) = features.iter().position(|row| row.len() != d) {
            bail!("probe feature row {bad} has {} values, row 0 has {d}", features[bad].len());
        }
        let split = (features.len() as f64 * TRAIN_FRACTION) as usize;
        let mut mean = vec![0.0f64; d];
        let mut var = vec![0.0f64; d];
        for row in &features[..split] {
            for (m, v) in mean.iter_mut().zip(row) {
                *m += f64::from(*v) / split as f64;
            }
        }
        for row in &features[..split] {
            for ((s, v), m) in var.iter_mut().zip(row).zip(&mean) {
                *s += (f64::from(*v) - m).powi(2) / split as f64;
            }
        }
        let matrix = |rows: &[Vec<f32>]| {
            Array2::from_shape_fn((rows.len(), d), |(i, j)| (f64::from(rows[i][j]) - mean[j]) / (var[j].sqrt() + 1e-8))
        };
        let as_usize = |l: &[u32]| l.iter().map(|&l| l as usize).collect();
        Ok(Self {
            fit: matrix(&features[..split]),
            fit_labels: as_usize(&labels[..split]),
            test: matrix(&features[split..]),
            test_labels: as_usize(&labels[split..]),
        })
    }

    /// Fits on the fit rows `rows` and scores on the whole test part.
    fn score(&self, rows: &[usize]) -> Result<f64> {
        let x = self.fit.select(ndarray::Axis(0), rows);
        let y: Array1<usize> = rows.iter().map(|&r| self.fit_labels[r]).collect();
        let model = MultiLogisticRegression::default()
            .alpha(1e-2)
            .max_iterations(MAX_ITERATIONS)
            .fit(&Dataset::new(x, y))
            .context("fitting the probe")?;
        let predicted = model.predict(&self.test);
        let correct = predicted.iter().zip(&self.test_labels).filter(|(p, y)| p == y).count();
        Ok(correct as f64 / self.test_labels.len() as f64)
    }
}

/// Linear-probe accuracy on the held-out part of `features` (rows) with `labels`.
pub fn accuracy(features: &[Vec<f32>], labels: &[u32]) -> Result<f64> {
    let split = Split::new(features, labels)?;
    split.score(&(0..split.fit_labels.len()).collect::<Vec<_>>())
}

/// Mean accuracy over `draws` probes each fit on `shots` examples per class (every class of
/// the fit part), drawn with `seed`.
pub fn few_shot_accuracy(features: &[Vec<f32>], labels: &[u32], shots: usize, draws: usize, seed: u64) -> Result<f64> {
    if shots == 0 || draws == 0 {
        bail!("few-shot probe needs at least one shot and one draw, got {shots} shots and {draws} draws");
    }
    let split = Split::new(features, labels)?;
    let classes = split.fit_labels.iter().max().map_or(0, |&m| m + 1);
    let mut by_class: Vec<Vec<usize>> = vec![Vec::new(); classes];
    for (i, &l) in split.fit_labels.iter().enumerate() {
        by_class[l].push(i);
    }
    if let Some((class, members)) = by_class.iter().enumerate().find(|(_, m)| m.len() < shots) {
        bail!(
            "{shots}-shot probe: class {class} has {} examples in the fit part of {} (use more probe images)",
            members.len(),
            split.fit_labels.len()
        );
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut total = 0.0;
    for _ in 0..draws {
        let mut rows = Vec::with_capacity(shots * classes);
        for members in &by_class {
            // A partial Fisher–Yates shuffle: the first `shots` of a random permutation.
            let mut pool = members.clone();
            for i in 0..shots {
                let j = i + (rng.next_u64() % (pool.len() - i) as u64) as usize;
                pool.swap(i, j);
            }
            rows.extend_from_slice(&pool[..shots]);
        }
        total += split.score(&rows)?;
    }
    Ok(total / draws as f64)
}
