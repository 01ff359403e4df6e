//! The TF32 clip bound against an independent f64 computation: every matmul of the clipping
//! path (the norm contractions and the clipped sum's own product aᵀ(c ⊙ δ)) is simulated as a
//! tensor core does it (inputs truncated to 10 mantissa bits, f32 accumulation truncating),
//! the device's square roots and reciprocals are perturbed against us (fast math), and each
//! example's share of the clipped sum is then computed exactly in f64 from the rounded inputs.
//! It must never exceed C.

use dpcap_ml::clip::NORM_EPSILON;
use dpcap_ml::clip::rounding::{
    self, Bound, FAST_MATH_MARGIN, LinearShape, MatmulInputs, bounded_factor, sum_input_error,
};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};

/// Relative error allowed to an approximate square root or reciprocal (PTX `approx` forms).
const FAST_MATH_ERROR: f64 = 1.0 / (1u64 << 21) as f64;

fn unit() -> f64 {
    MatmulInputs::Tf32.unit().unwrap()
}

/// x with its mantissa truncated to TF32's 10 bits, as tensor cores read it.
fn tf32(x: f32) -> f32 {
    f32::from_bits(x.to_bits() & !((1u32 << 13) - 1))
}

/// v rounded toward zero to f32 (a truncating accumulator).
fn toward_zero(v: f64) -> f32 {
    let f = v as f32;
    if f != 0.0 && (f as f64).abs() > v.abs() { f32::from_bits(f.to_bits() - 1) } else { f }
}

/// A tensor-core dot product: truncated inputs, exact products (11 × 11 bits fit in f32),
/// each addition truncated to f32.
fn tensor_core_dot(x: &[f32], y: &[f32]) -> f32 {
    x.iter().zip(y).fold(0f32, |acc, (&a, &b)| toward_zero(acc as f64 + tf32(a) as f64 * tf32(b) as f64))
}

/// One Linear layer's record for one example: a [T, d_in], δ [T, d_out].
struct Layer {
    a: Vec<Vec<f32>>,
    d: Vec<Vec<f32>>,
}

impl Layer {
    fn shape(&self) -> LinearShape {
        LinearShape { t: self.a.len(), d_in: self.a[0].len(), d_out: self.d[0].len() }
    }

    fn column(rows: &[Vec<f32>], i: usize) -> Vec<f32> {
        rows.iter().map(|r| r[i]).collect()
    }

    /// ‖Σ_t a_tᵀ δ_t‖² in f64 from the exact inputs.
    fn exact_sq(&self) -> f64 {
        let mut sq = 0.0;
        for i in 0..self.a[0].len() {
            for j in 0..self.d[0].len() {
                let g: f64 = self.a.iter().zip(&self.d).map(|(a, d)| a[i] as f64 * d[j] as f64).sum();
                sq += g * g;
            }
        }
        sq
    }

    /// The norm as the device computes it, in the form the engine picks (ghost or
    /// materialised), with its bound: (n̂², bound).
    fn computed_sq(&self) -> (f32, Bound) {
        let shape = self.shape();
        if dpcap_ml::clip::norms::use_ghost(shape.t, shape.d_in, shape.d_out) {
            let mut sq = 0f32;
            for s in 0..shape.t {
                for r in 0..shape.t {
                    sq += tensor_core_dot(&self.a[s], &self.a[r]) * tensor_core_dot(&self.d[s], &self.d[r]);
                }
            }
            (sq, rounding::ghost(unit(), shape))
        } else {
            let mut sq = 0f32;
            for i in 0..shape.d_in {
                for j in 0..shape.d_out {
                    let g = tensor_core_dot(&Self::column(&self.a, i), &Self::column(&self.d, j));
                    sq += g * g;
                }
            }
            (sq, rounding::materialised(unit(), shape))
        }
    }

    /// S = Σ_t ‖a_t‖·‖δ_t‖ as the device computes it: elementwise f32, square roots low.
    fn s(&self) -> f32 {
        let norm = |v: &[f32]| sqrt_low(v.iter().map(|x| x * x).sum::<f32>());
        self.a.iter().zip(&self.d).map(|(a, d)| norm(a) * norm(d)).sum()
    }

    /// This example's share of aᵀ(c ⊙ δ) as the tensor core reads it (a truncated, c·δ
    /// rounded to f32 then truncated), summed exactly in f64: ‖share‖².
    fn share_sq(&self, c: f32) -> f64 {
        let mut sq = 0.0;
        for i in 0..self.a[0].len() {
            for j in 0..self.d[0].len() {
                let g: f64 = self.a.iter().zip(&self.d).map(|(a, d)| tf32(a[i]) as f64 * tf32(c * d[j]) as f64).sum();
                sq += g * g;
            }
        }
        sq
    }
}

fn sqrt_low(x: f32) -> f32 {
    (x.sqrt() as f64 * (1.0 - FAST_MATH_ERROR)) as f32
}

/// The clip factor as the device computes it: the engine's formula in f32, each square root
/// rounded low and the reciprocal high.
fn device_factor(layers: &[Layer], clipping_norm: f64) -> f32 {
    let (mut sq, mut r_sq) = (0f32, 0f32);
    for layer in layers {
        let (n_sq, bound) = layer.computed_sq();
        let s = layer.s();
        sq += (1.0 + bound.rho as f32) * n_sq + bound.kappa as f32 * s * s;
        r_sq += s * s;
    }
    let denominator = sqrt_low(sq.max(0.0)) + sqrt_low(r_sq) * sum_input_error(unit()) as f32 + NORM_EPSILON as f32;
    let reciprocal = (1.0 / denominator as f64 * (1.0 + FAST_MATH_ERROR)) as f32;
    (reciprocal * (clipping_norm * (1.0 - FAST_MATH_MARGIN)) as f32).min(1.0)
}

fn uniform(rng: &mut ChaCha8Rng, lo: f32, hi: f32) -> f32 {
    lo + (hi - lo) * (rng.next_u32() >> 8) as f32 / (1u32 << 24) as f32
}

/// x with the 13 mantissa bits TF32 drops all set: truncation loses the most it can.
fn worst_bits(x: f32) -> f32 {
    f32::from_bits(x.to_bits() | ((1u32 << 13) - 1))
}

/// Rows that cancel across positions (δ alternates sign while a changes by at most `jitter`),
/// with every value's dropped bits set: ‖g‖ ≪ S for a small jitter, and truncation errs as
/// far as it can.
fn cancelling(rng: &mut ChaCha8Rng, (t, d_in, d_out): (usize, usize, usize), jitter: f32) -> Layer {
    let base_a: Vec<f32> = (0..d_in).map(|_| uniform(rng, -1.0, 1.0)).collect();
    let base_d: Vec<f32> = (0..d_out).map(|_| uniform(rng, -1.0, 1.0)).collect();
    let mut jitter = |x: f32, sign: f32| worst_bits(sign * x * (1.0 + uniform(rng, -jitter, jitter)));
    let a = (0..t).map(|_| base_a.iter().map(|&x| jitter(x, 1.0)).collect()).collect();
    let d = (0..t).map(|s| base_d.iter().map(|&x| jitter(x, if s % 2 == 0 { 1.0 } else { -1.0 })).collect()).collect();
    Layer { a, d }
}

#[test]
fn under_simulated_tf32_with_truncation_no_example_contributes_more_than_c() {
    let mut rng = ChaCha8Rng::seed_from_u64(43);
    let (mut worst, mut underestimated, mut moved) = (0f64, 0, 0f64);
    for case in 0..60 {
        // A ghost-form layer (2T² < d_in·d_out) and a materialised one, cancelling hard (the
        // norms' rounding dominates), mildly, or hardly at all (the clip factor near C/‖g‖).
        let jitter = [1e-3, 1e-1, 1.0][case % 3];
        let layers = [cancelling(&mut rng, (8, 24, 16), jitter), cancelling(&mut rng, (8, 4, 6), jitter)];
        let exact: f64 = layers.iter().map(Layer::exact_sq).sum::<f64>().sqrt();
        underestimated += layers.iter().filter(|l| (l.computed_sq().0 as f64) < l.exact_sq()).count();
        // C below the norm, so the factor clips (half the cases far below, half just below).
        let clipping_norm = exact * if case % 2 == 0 { 0.3 } else { 0.95 };
        let c = device_factor(&layers, clipping_norm);
        assert!(c < 1.0, "case {case}: C must be active");
        let share: f64 = layers.iter().map(|l| l.share_sq(c)).sum::<f64>().sqrt();
        assert!(share <= clipping_norm, "case {case}: an example contributes {} C", share / clipping_norm);
        worst = worst.max(share / clipping_norm);
        moved = moved.max((share - c as f64 * exact).abs() / clipping_norm);
    }
    assert!(underestimated > 0, "the cases must make TF32 underestimate some norm, or they test nothing");
    assert!(moved > 1e-4, "the sum's own rounding must move some contribution, or it is not exercised: {moved}");
    assert!(worst > 0.5, "the bound clips far harder than it needs to: at most {worst} C");
}

/// The worst the norm bound allows: n̂² as low as (1 + ρ)n̂² + κS² = ‖g‖² permits, and the sum's
/// rounding error e·c·S all along g. The factor must keep ‖g‖ + e·S within C / c.
#[test]
fn the_clipped_sums_rounding_is_folded_into_the_factor_where_the_norm_bound_alone_would_exceed_c() {
    let e = sum_input_error(unit());
    let clipping_norm = 1.0;
    let mut unfolded_worst = 0f64;
    for ratio in [1.0, 2.0, 4.0, 8.0, 16.0, 64.0] {
        // S = ratio·‖g‖ with ‖g‖ = 2 (so the factor clips), N = ‖g‖ exactly.
        let (g, s) = (2.0, 2.0 * ratio);
        let folded = bounded_factor(g, s, clipping_norm, unit()) * (1.0 + FAST_MATH_ERROR).powi(4);
        assert!(folded * (g + e * s) <= clipping_norm, "S/‖g‖ = {ratio}: {} C", folded * (g + e * s));
        let unfolded = clipping_norm / (g + NORM_EPSILON);
        unfolded_worst = unfolded_worst.max(unfolded * (g + e * s));
    }
    assert!(unfolded_worst > 1.02, "without the fold an example could contribute {unfolded_worst} C");
}
