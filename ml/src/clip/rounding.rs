//! A certified upper bound on each example's contribution to the clipped sum when the device's
//! matmuls round their inputs.
//!
//! On CUDA, cubek runs every f32×f32 matmul on tensor cores as TF32 (10 mantissa bits), with no
//! switch to turn it off. Two kinds of matmul touch the guarantee ‖contribution_i‖ ≤ C:
//!
//! 1. **The norm contractions** (a·aᵀ, δ·δᵀ, aᵀδ) carry about 1e-3 relative error per entry,
//!    and because their terms have mixed signs the error of a norm is not bounded relative to
//!    the norm itself: a computed norm can fall below the true one. The clip factor is taken
//!    from an upper bound instead:
//!
//!      ‖g‖² ≤ (1 + ρ)·n̂² + κ·S²,   S = Σ_t ‖a_t‖·‖δ_t‖,
//!
//!    where n̂² is the norm as computed, S is computed elementwise (no matmul, so no tensor-core
//!    rounding) and bounds every matmul entry's error through Cauchy–Schwarz, and (ρ, κ) follow
//!    from the input rounding unit u and the contraction lengths, with the accumulation unit
//!    taken as truncation (2⁻²³): published measurements of tensor cores (V100, T4, A100) find
//!    their f32 accumulation truncates rather than rounds to nearest.
//! 2. **The clipped sum's own product** aᵀ(c ⊙ δ) reads a and c·δ as TF32 too. Example i's
//!    share of it is Σ_t ã_tᵀ(c_i δ_t)~, which differs from c_i·g_i by at most
//!    e·c_i·S_i in Frobenius norm, e = (1 + u)²(1 + u₃₂) − 1 (two truncated inputs and the f32
//!    product c·δ; products of TF32 values are exact in f32). Over a model's layers,
//!    Minkowski's inequality gives ‖contribution_i‖ ≤ c_i·(‖g_i‖ + e·R_i), R_i² = Σ_layers S_i²,
//!    so the factor is taken as c_i = min(1, C·(1 − m) / (N_i + e·R_i + 1e-6)), N_i the bound
//!    of (1). The f32 accumulation of the sum across examples is the sum's own error, relative
//!    to its terms, which DP libraries (Opacus included) do not bound either.
//!
//! m covers cubecl's fast math: its square roots and reciprocals may be approximate (a few ulp,
//! 2⁻²¹ relative at most in PTX's `approx` forms), and four of them stand between the true
//! norms and c_i; m = 2⁻¹⁶ leaves a factor of eight. With exact f32 inputs (burn-flex) none of
//! this applies: the factor is C / (‖g‖ + 1e-6) as computed. The bound costs O(B·T·d)
//! elementwise work per layer and clips harder only where cancellation makes n̂ untrustworthy
//! (S ≫ n̂): by √(1 + κ) and e·R/N otherwise, 0.4 % at ViT-B's widest layer.

/// Stabiliser in c_i = min(1, C / (‖g_i‖ + 1e-6)): the engine's clip factor and this
/// module's bound share it.
pub const NORM_EPSILON: f64 = 1e-6;

/// How the backend's f32 matmuls treat their inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MatmulInputs {
    /// As given, in f32 (burn-flex): the computed norms are used as they are.
    #[default]
    F32,
    /// Truncated to TF32's 10 mantissa bits (cubek on tensor cores, CUDA): norms are bounded.
    Tf32,
}

impl MatmulInputs {
    /// What `device` ("cpu", "cuda:N") does to f32 matmul inputs: cubek's tensor cores read
    /// TF32 on every CUDA device that has them (Ampere on); an older one rounds less, and the
    /// bound stays valid.
    pub fn for_device(device: &str) -> Self {
        if device.starts_with("cuda") { Self::Tf32 } else { Self::F32 }
    }

    /// The relative rounding unit of one input, or None when inputs are exact.
    pub fn unit(self) -> Option<f64> {
        match self {
            Self::F32 => None,
            // Truncation (not rounding) of 23 mantissa bits to 10: |x − x̃| < 2⁻¹⁰·|x|.
            Self::Tf32 => Some(2f64.powi(-10)),
        }
    }
}

/// f32's unit roundoff (round to nearest): elementwise operations and reductions.
pub const F32_UNIT: f64 = 1.0 / (1u64 << 24) as f64;

/// The unit of a tensor core's f32 accumulation, taken as truncation (twice round-to-nearest's).
pub const ACCUMULATION_UNIT: f64 = 1.0 / (1u64 << 23) as f64;

/// The relative margin m on C for the device's approximate square roots and reciprocals.
pub const FAST_MATH_MARGIN: f64 = 1.0 / (1u64 << 16) as f64;

/// γ_k with unit `unit`: the relative error bound of a k-term sum (or product chain) against
/// the sum of the terms' magnitudes.
pub fn gamma_with(k: usize, unit: f64) -> f64 {
    let ku = k as f64 * unit;
    assert!(ku < 0.5, "a {k}-term f32 sum has no useful error bound");
    ku / (1.0 - ku)
}

/// γ_k for f32 rounded to nearest (elementwise work and reductions, off the tensor cores).
pub fn gamma(k: usize) -> f64 {
    gamma_with(k, F32_UNIT)
}

/// The error bound of one matmul entry Σ_k x_k·y_k relative to Σ_k |x_k|·|y_k|: both inputs
/// rounded with unit `u`, products accumulated over `k` terms by a tensor core (truncating).
pub fn entry_error(u: f64, k: usize) -> f64 {
    let products = 2.0 * u + u * u;
    products + gamma_with(k + 1, ACCUMULATION_UNIT) * (1.0 + u) * (1.0 + u)
}

/// e: how far example i's share of the clipped sum aᵀ(c ⊙ δ) may stray from c_i·g_i, per unit
/// of c_i·S_i, when the product reads its inputs with unit `u` (a truncated, and c·δ rounded in
/// f32 and then truncated).
pub fn sum_input_error(u: f64) -> f64 {
    (1.0 + u) * (1.0 + u) * (1.0 + F32_UNIT) - 1.0
}

/// The clip factor c_i = min(1, C·(1 − m) / (N + e·R + 1e-6)) of an example whose norm is at
/// most `norm_bound` (N) and whose layers' S values have root-sum-square `r` (R), for inputs
/// rounded with unit `u`: ‖c_i·g_i + the sum's rounding‖ ≤ C (module docs). The ClipEngine
/// computes the same on tensors.
pub fn bounded_factor(norm_bound: f64, r: f64, clipping_norm: f64, u: f64) -> f64 {
    let denominator = norm_bound + sum_input_error(u) * r + NORM_EPSILON;
    (clipping_norm * (1.0 - FAST_MATH_MARGIN) / denominator).min(1.0)
}

/// The coefficients of ‖g‖² ≤ (1 + ρ)·n̂² + κ·S² for one layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bound {
    /// The relative slack on the computed squared norm.
    pub rho: f64,
    /// The weight of S², the triangle-inequality bound on the norm squared.
    pub kappa: f64,
}

/// The shape of a Linear layer's norm computation: T positions, d_in inputs, d_out outputs.
#[derive(Debug, Clone, Copy)]
pub struct LinearShape {
    /// Sequence length T.
    pub t: usize,
    /// Input width.
    pub d_in: usize,
    /// Output width.
    pub d_out: usize,
}

/// How much S itself may be underestimated: row sums of squares, square roots, products and
/// the sum over T, in f32.
fn s_slack(shape: LinearShape) -> f64 {
    let g = gamma(shape.d_in.max(shape.d_out) + shape.t + 4);
    (1.0 + g) * (1.0 + g)
}

/// The ghost form n̂² = Σ_{t,s} (a_t·a_s)(δ_t·δ_s): each Gram entry is off by at most
/// γ·‖a_t‖‖a_s‖ (resp. ‖δ_t‖‖δ_s‖), so the double sum is off by (γ_a + γ_δ + γ_aγ_δ)·S², plus
/// the f32 error of the final T²-term sum of products.
pub fn ghost(u: f64, shape: LinearShape) -> Bound {
    let (ga, gd) = (entry_error(u, shape.d_in), entry_error(u, shape.d_out));
    let reduction = gamma(shape.t * shape.t + 1) * (1.0 + ga) * (1.0 + gd);
    Bound { rho: 0.0, kappa: (ga + gd + ga * gd + reduction) * s_slack(shape) }
}

/// The materialised form n̂² = ‖ĝ‖², ĝ = aᵀδ: ‖ĝ − g‖_F ≤ γ·‖|a|ᵀ|δ|‖_F ≤ γ·S, and the sum of
/// d_in·d_out squares (non-negative terms) is low by at most a factor 1 − γ_N. With
/// ‖ĝ‖ ≤ (1 + γ)·S, (‖ĝ‖ + γS)² ≤ ‖ĝ‖² + (2γ(1 + γ) + γ²)·S².
pub fn materialised(u: f64, shape: LinearShape) -> Bound {
    let g = entry_error(u, shape.t);
    let gn = gamma(shape.d_in * shape.d_out + 1);
    let rho = gn / (1.0 - gn);
    Bound { rho, kappa: (2.0 * g * (1.0 + g) + g * g) * (1.0 + rho) * s_slack(shape) }
}

/// An embedding's n̂² = Σ_{t,s} [tok_t = tok_s](δ_t·δ_s): the mask is exact, the δ Gram entries
/// are off by γ·‖δ_t‖‖δ_s‖, so S = Σ_t ‖δ_t‖ (one-hot inputs of norm 1).
pub fn embedding(u: f64, t: usize, d: usize) -> Bound {
    let shape = LinearShape { t, d_in: 1, d_out: d };
    let gd = entry_error(u, d);
    let reduction = gamma(t * t + 1) * (1.0 + gd);
    Bound { rho: 0.0, kappa: (gd + reduction) * s_slack(shape) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::ChaCha8Rng;
    use rand_chacha::rand_core::{Rng, SeedableRng};

    /// Uniform in [lo, hi).
    fn uniform(rng: &mut ChaCha8Rng, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * (rng.next_u32() >> 8) as f32 / (1u32 << 24) as f32
    }

    /// x with its mantissa truncated to TF32's 10 bits, as tensor cores read it.
    fn tf32(x: f32) -> f32 {
        f32::from_bits(x.to_bits() & !((1u32 << 13) - 1))
    }

    /// Σ_k x_k·y_k as a TF32 matmul entry: truncated inputs, f32 products and sum.
    fn dot(x: &[f32], y: &[f32]) -> f32 {
        x.iter().zip(y).map(|(&a, &b)| tf32(a) * tf32(b)).sum()
    }

    struct Case {
        a: Vec<Vec<f32>>,
        d: Vec<Vec<f32>>,
    }

    impl Case {
        fn shape(&self) -> LinearShape {
            LinearShape { t: self.a.len(), d_in: self.a[0].len(), d_out: self.d[0].len() }
        }

        /// ‖Σ_t a_tᵀ δ_t‖² in f64 from the exact inputs.
        fn exact(&self) -> f64 {
            let mut sq = 0.0;
            for i in 0..self.a[0].len() {
                for j in 0..self.d[0].len() {
                    let g: f64 = (0..self.a.len()).map(|t| self.a[t][i] as f64 * self.d[t][j] as f64).sum();
                    sq += g * g;
                }
            }
            sq
        }

        fn s(&self) -> f64 {
            let norm = |v: &[f32]| v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
            (0..self.a.len()).map(|t| norm(&self.a[t]) * norm(&self.d[t])).sum()
        }

        fn ghost(&self) -> f64 {
            let t = self.a.len();
            let mut sq = 0f32;
            for i in 0..t {
                for j in 0..t {
                    sq += dot(&self.a[i], &self.a[j]) * dot(&self.d[i], &self.d[j]);
                }
            }
            sq as f64
        }

        fn materialised(&self) -> f64 {
            let t = self.a.len();
            let mut sq = 0f32;
            for i in 0..self.a[0].len() {
                for j in 0..self.d[0].len() {
                    let col_a: Vec<f32> = (0..t).map(|s| self.a[s][i]).collect();
                    let col_d: Vec<f32> = (0..t).map(|s| self.d[s][j]).collect();
                    let g = dot(&col_a, &col_d);
                    sq += g * g;
                }
            }
            sq as f64
        }
    }

    /// Rows that nearly cancel across positions: δ_t alternates sign while a_t barely changes,
    /// so ‖g‖ ≪ S and TF32's per-entry error dominates the norm.
    fn cancelling(rng: &mut ChaCha8Rng, t: usize, d_in: usize, d_out: usize) -> Case {
        let base_a: Vec<f32> = (0..d_in).map(|_| uniform(rng, -1.0, 1.0)).collect();
        let base_d: Vec<f32> = (0..d_out).map(|_| uniform(rng, -1.0, 1.0)).collect();
        let a = (0..t).map(|_| base_a.iter().map(|&x| x * (1.0 + uniform(rng, -1e-3, 1e-3))).collect()).collect();
        let sign = |s: usize| if s.is_multiple_of(2) { 1.0 } else { -1.0 };
        let d =
            (0..t).map(|s| base_d.iter().map(|&x| sign(s) * x * (1.0 + uniform(rng, -1e-3, 1e-3))).collect()).collect();
        Case { a, d }
    }

    #[test]
    fn tf32_norms_can_fall_below_the_true_norm_and_the_bound_never_does() {
        let u = MatmulInputs::Tf32.unit().unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut below = 0;
        for _ in 0..40 {
            let case = cancelling(&mut rng, 8, 24, 16);
            let (exact, s) = (case.exact(), case.s());
            for (computed, bound) in
                [(case.ghost(), ghost(u, case.shape())), (case.materialised(), materialised(u, case.shape()))]
            {
                below += usize::from(computed < exact);
                let upper = (1.0 + bound.rho) * computed.max(0.0) + bound.kappa * s * s;
                assert!(upper >= exact, "bound {upper} below the true squared norm {exact} (computed {computed})");
            }
        }
        assert!(below > 0, "the cases must exercise an underestimate, or they test nothing");
    }

    #[test]
    fn the_bound_is_tight_enough_to_clip_little_harder_without_cancellation() {
        let u = MatmulInputs::Tf32.unit().unwrap();
        let shape = LinearShape { t: 197, d_in: 768, d_out: 3072 };
        // Aligned rows (no cancellation): S = ‖g‖, so the factor shrinks by √(1 + κ): 0.3 % at
        // ViT-B's widest layer, a third of it from the worst-case order of the T²-term sum.
        let shrink = 1.0 / (1.0 + ghost(u, shape).kappa).sqrt();
        assert!(shrink > 0.996, "{shrink}");
        assert!(materialised(u, shape).kappa < 5e-3);
        assert!(embedding(u, 77, 512).kappa < 3e-3);
        assert_eq!(MatmulInputs::F32.unit(), None, "exact inputs need no bound");
    }
}
