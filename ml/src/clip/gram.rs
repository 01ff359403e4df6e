//! The ghost norms' Gram products on a CPU, using the symmetry a batched matmul cannot.
//!
//! A Linear weight's squared norm per example is ⟨a·aᵀ, δ·δᵀ⟩ = Σ_{t,s}(a_t·a_s)(δ_t·δ_s), and
//! both Grams are symmetric: the lower triangle (s ≤ t) holds everything, with the
//! off-diagonal terms counted twice. burn's matmul computes both triangles (T² dot products
//! where T(T+1)/2 suffice) and writes δ·δᵀ out before it is read once; on the `bench`
//! captioner (T = 64, d = 128) those Grams were about 18 % of the DP step
//! (docs/benchmarks.md). Here a·aᵀ is kept as its packed lower triangle with the off-diagonal
//! doubled, and δ·δᵀ is never stored: each block of its dot products is folded into the norm
//! as it is made.
//!
//! The dot products run in register blocks of R×R rows, each with its own vector accumulator:
//! 4×4 blocks where the vector unit has 32 registers (AVX-512, NEON), 3×3 where it has 16
//! (AVX2), through pulp (the SIMD layer under the gemm crate burn-flex uses), which picks the
//! widest unit at run time. The tool was chosen by measurement: the same blocks as plain
//! loops over arrays were not vectorised (scalar loads and stores to the stack), and made
//! the step slower than burn's matmul. Results are f32 like the matmul's, summed in a
//! different order; a NaN or infinity in a row reaches its diagonal term, so an example with
//! one still gets a non-finite norm and is left out.

use pulp::{Arch, Simd, WithSimd};

/// Entries of a T×T lower triangle packed row by row: T(T+1)/2.
pub fn packed_len(t: usize) -> usize {
    t * (t + 1) / 2
}

/// Where (t, s), s ≤ t, lies in the packed lower triangle.
#[inline(always)]
fn packed_index(t: usize, s: usize) -> usize {
    t * (t + 1) / 2 + s
}

/// The lower triangle of x·xᵀ for one example x [T, d] (row-major), packed row by row into
/// `out` (T(T+1)/2 values), with each off-diagonal entry doubled: what [`ghost_sq_norm`]
/// reads for a layer's input.
pub fn packed_gram(x: &[f32], t: usize, d: usize, out: &mut [f32]) {
    let emit = |i: usize, j: usize, dot: f32| out[packed_index(i, j)] = if i == j { dot } else { 2.0 * dot };
    Arch::new().dispatch(LowerDots { x, t, d, emit })
}

/// Σ_{t,s}(a_t·a_s)(δ_t·δ_s) for one example: `aa` from [`packed_gram`] of its input a, and
/// its output gradient δ [T, d] (row-major).
pub fn ghost_sq_norm(aa: &[f32], delta: &[f32], t: usize, d: usize) -> f32 {
    let mut sum = 0f32;
    let emit = |i: usize, j: usize, dot: f32| sum += aa[packed_index(i, j)] * dot;
    Arch::new().dispatch(LowerDots { x: delta, t, d, emit });
    sum
}

/// `emit(t, s, x_t·x_s)` for every s ≤ t < T of one example x [T, d], block by block.
struct LowerDots<'a, F> {
    x: &'a [f32],
    t: usize,
    d: usize,
    emit: F,
}

impl<F: FnMut(usize, usize, f32)> WithSimd for LowerDots<'_, F> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        if S::REGISTER_COUNT >= 32 { self.run::<S, 4>(simd) } else { self.run::<S, 3>(simd) }
    }
}

impl<F: FnMut(usize, usize, f32)> LowerDots<'_, F> {
    /// R×R blocks on or below the diagonal; a block past the last row repeats that row and
    /// its extra dot products are dropped.
    #[inline(always)]
    fn run<S: Simd, const R: usize>(mut self, simd: S) {
        let (x, t, d) = (self.x, self.t, self.d);
        let row = |r: usize| S::as_simd_f32s(&x[r.min(t - 1) * d..][..d]);
        for i0 in (0..t).step_by(R) {
            let rows: [_; R] = std::array::from_fn(|i| row(i0 + i));
            for j0 in (0..=i0).step_by(R) {
                let cols: [_; R] = std::array::from_fn(|j| row(j0 + j));
                let dots = block(simd, rows, cols);
                for (i, dots) in dots.iter().enumerate().take(t - i0) {
                    for (j, &dot) in dots.iter().enumerate().take((i0 + i + 1).saturating_sub(j0)) {
                        (self.emit)(i0 + i, j0 + j, dot);
                    }
                }
            }
        }
    }
}

/// A row split into whole vectors and a scalar tail.
type Split<'a, S> = (&'a [<S as Simd>::f32s], &'a [f32]);

/// The R×R dot products rows[i]·cols[j]: one vector accumulator per product over the whole
/// vectors, summed across its lanes, plus the scalar tail.
#[inline(always)]
fn block<S: Simd, const R: usize>(simd: S, rows: [Split<'_, S>; R], cols: [Split<'_, S>; R]) -> [[f32; R]; R] {
    // Plain indexed loops: closures here (array::from_fn, iterator adapters) are compiled
    // without the vector unit's target features and their intrinsics are then called, not
    // inlined.
    let zero = simd.splat_f32s(0.0);
    let mut acc = [[zero; R]; R];
    let (mut a, mut b) = ([zero; R], [zero; R]);
    for k in 0..rows[0].0.len() {
        for i in 0..R {
            a[i] = rows[i].0[k];
            b[i] = cols[i].0[k];
        }
        for i in 0..R {
            for j in 0..R {
                acc[i][j] = simd.mul_add_e_f32s(a[i], b[j], acc[i][j]);
            }
        }
    }
    let mut dots = [[0f32; R]; R];
    for i in 0..R {
        for j in 0..R {
            dots[i][j] = simd.reduce_sum_f32s(acc[i][j]);
            for l in 0..rows[i].1.len() {
                dots[i][j] += rows[i].1[l] * cols[j].1[l];
            }
        }
    }
    dots
}
