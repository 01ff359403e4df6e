//! The ghost norms' Gram products on a CPU, using the symmetry a batched matmul cannot.
//!
//! A Linear weight's squared norm per example is ⟨a·aᵀ, δ·δᵀ⟩ = Σ_{t,s}(a_t·a_s)(δ_t·δ_s), and
//! both Grams are symmetric: the lower triangle (s ≤ t) holds everything, with the
//! off-diagonal terms counted twice. burn's matmul computes both triangles (T² dot products
//! where T(T+1)/2 suffice) and writes δ·δᵀ out before it is read once; on the `bench`
//! captioner (T = 64, d = 128) those Grams were about 18 % of the DP step
//! (docs/benchmarks.md). Here:
//!
//! - a·aᵀ is kept as its packed lower triangle w with the off-diagonal doubled
//!   ([`packed_gram`]: dot products in register blocks of R×R rows, one vector accumulator
//!   each, summed across lanes at the end);
//! - δ·δᵀ is never formed: Σ_t δ_t·u_t with u_t = Σ_{s≤t} w[t,s]·δ_s ([`ghost_sq_norm`]) is
//!   the same multiply-adds as vector updates (a broadcast weight times a row of δ), so no sum
//!   across lanes but the last. Measured 3 % faster on the DP step than folding δ's dot
//!   products into the norm block by block.
//!
//! Blocks are sized by the vector unit's registers (32 for AVX-512 and NEON, 16 for AVX2),
//! through pulp (the SIMD layer under the gemm crate burn-flex uses), which picks the widest
//! unit at run time. Plain loops over arrays were not vectorised (scalar loads and stores to
//! the stack) and made the step slower than burn's matmul; closures inside the kernels are
//! compiled without the unit's target features, so the hot loops are indexed loops. Results
//! are f32 like the matmul's, summed in a different order; a NaN or infinity in a row reaches
//! its diagonal term, so an example with one still gets a non-finite norm and is left out.

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
    Arch::new().dispatch(Fold { w: aa, x: delta, t, d })
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

/// Σ_t x_t·u_t with u_t = Σ_{s≤t} w[t,s]·x_s for one example x [T, d] and a packed lower
/// triangle w: the same multiply-adds as the dot products x_t·x_s, but as vector updates of
/// u_t (a weight broadcast times a row of x), so no sum across lanes until the last.
struct Fold<'a> {
    w: &'a [f32],
    x: &'a [f32],
    t: usize,
    d: usize,
}

impl WithSimd for Fold<'_> {
    type Output = f32;

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) -> f32 {
        if S::REGISTER_COUNT >= 32 { self.run::<S, 4, 4>(simd) } else { self.run::<S, 2, 4>(simd) }
    }
}

impl Fold<'_> {
    /// Blocks of R rows t by V vectors of columns, each u_t block in registers while s runs
    /// over 0..=t; columns past the last whole vector are summed as scalars.
    #[inline(always)]
    #[allow(clippy::needless_range_loop, reason = "indexed loops: iterator closures lose the unit's target features")]
    fn run<S: Simd, const R: usize, const V: usize>(self, simd: S) -> f32 {
        let (w, x, t, d) = (self.w, self.x, self.t, self.d);
        let vectors = d / S::F32_LANES;
        let whole = vectors * S::F32_LANES;
        let row = |r: usize| S::as_simd_f32s(&x[r * d..][..d]).0;
        let zero = simd.splat_f32s(0.0);
        let (mut total, mut tail) = (zero, 0f32);
        for t0 in (0..t).step_by(R) {
            let rows = R.min(t - t0);
            for c0 in (0..vectors).step_by(V) {
                let mut u = [[zero; V]; R];
                for s in 0..t0 + rows {
                    let xs = row(s);
                    let mut xv = [zero; V];
                    for v in 0..V {
                        xv[v] = xs[(c0 + v).min(vectors - 1)];
                    }
                    for i in 0..R {
                        let ti = t0 + i;
                        let weight = if ti < t && s <= ti { w[packed_index(ti, s)] } else { 0.0 };
                        let weight = simd.splat_f32s(weight);
                        for v in 0..V {
                            u[i][v] = simd.mul_add_e_f32s(weight, xv[v], u[i][v]);
                        }
                    }
                }
                for i in 0..rows {
                    let xt = row(t0 + i);
                    for v in 0..V.min(vectors - c0) {
                        total = simd.mul_add_e_f32s(u[i][v], xt[c0 + v], total);
                    }
                }
            }
            for ti in t0..t0 + rows {
                for s in 0..=ti {
                    let dot: f32 = (whole..d).map(|c| x[ti * d + c] * x[s * d + c]).sum();
                    tail += w[packed_index(ti, s)] * dot;
                }
            }
        }
        simd.reduce_sum_f32s(total) + tail
    }
}
