//! Multi-head attention on merged heads: softmax(q_h k_hᵀ/√d_h, masked) v_h for every head h,
//! read from and written to [B, T, d] tensors in place, forward and backward.
//!
//! burn-autodiff runs attention as its parts (`attention_fallback`): heads are split with a
//! reshape and a transpose, and each batched matmul then copies its strided operands to
//! contiguous ones, forward and backward; the merge after it copies again. In the `bench`
//! captioner's profile those layout copies (`StridedIter`, `memmove`, `to_contiguous`) were
//! 10-13 % of a step. Here each head's rows are slices of the merged rows (head h owns columns
//! h·d_h..(h+1)·d_h), and every product is a sum of rows weighted by a matrix's entries,
//! out_i = Σ_j W[i,j]·x_j: one vector update per weight, so no copy of q, k or v and no sum
//! across vector lanes. Only the small T×S and d_h×S matrices are transposed.
//!
//! Backward, from the saved weights P (after the softmax) and the gradient G of the output:
//! dV_h = Pᵀ G_h, dP = G_h V_hᵀ, dS = P ⊙ (dP − rowsum(dP ⊙ P))/√d_h, dQ_h = dS K_h,
//! dK_h = dSᵀ Q_h. A masked score weighs exactly 0 (the fused softmax), so it passes no
//! gradient. Upstream this is burn-flex implementing `ModuleOps::attention` with strided
//! heads, and burn-autodiff giving attention a backward of its own.

use std::sync::Arc;

use burn::backend::Flex;
use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_flex::FlexTensor;
use pulp::{Arch, Simd, WithSimd};

use super::kernels;
use crate::CpuBackend;

/// The masked score: e^(−1e9 − max) is exactly 0 in the fused softmax.
const MASKED: f32 = -1e9;

/// The shape of one attention: B examples, T queries, S keys, H heads of width `dh`.
#[derive(Debug, Clone, Copy)]
struct Shape {
    b: usize,
    t: usize,
    s: usize,
    heads: usize,
    dh: usize,
    causal: bool,
}

impl Shape {
    fn d(&self) -> usize {
        self.heads * self.dh
    }
}

/// The op's state for the backward: q, k, v (contiguous f32) and the weights P [B, H, T, S].
#[derive(Debug, Clone)]
struct Saved {
    q: FlexTensor,
    k: FlexTensor,
    v: FlexTensor,
    p: Arc<[f32]>,
}

/// The inputs' values, borrowed from a [`Saved`].
struct Inputs<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
}

impl Saved {
    fn inputs(&self) -> Inputs<'_> {
        Inputs { q: f32s(&self.q), k: f32s(&self.k), v: f32s(&self.v) }
    }
}

/// An f32 tensor's values (contiguous: the forward made it so).
fn f32s(x: &FlexTensor) -> &[f32] {
    x.as_slice::<f32>().expect("f32, checked by `applies`")
}

#[derive(Debug)]
struct Attention(Shape);

/// softmax(q_h k_hᵀ/√d_h + mask) v_h per head, merged: q [B, T, d], k and v [B, S, d], f32
/// `CpuBackend` tensors (checked by the caller).
pub(super) fn forward(
    q: Tensor<CpuBackend, 3>,
    k: Tensor<CpuBackend, 3>,
    v: Tensor<CpuBackend, 3>,
    heads: usize,
    causal: bool,
) -> Tensor<CpuBackend, 3> {
    let ([b, t, d], s) = (q.dims(), k.dims()[1]);
    let shape = Shape { b, t, s, heads, dh: d / heads, causal };
    let (q, k, v) = (q.into_primitive().tensor(), k.into_primitive().tensor(), v.into_primitive().tensor());
    let (qc, kc, vc) = (q.primitive.to_contiguous(), k.primitive.to_contiguous(), v.primitive.to_contiguous());
    let saved = Saved { q: qc, k: kc, v: vc, p: Arc::from([]) };
    let (out, p) = attend(shape, &saved.inputs());
    let saved = Saved { p: p.into(), ..saved };
    let y = FlexTensor::from_data(TensorData::new(out, [b, t, d]));
    let nodes = [q.node.clone(), k.node.clone(), v.node.clone()];
    let out = match Attention(shape).prepare::<NoCheckpointing>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(saved, y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// Whether the fused op takes these inputs: f32, one width, whole heads.
pub(super) fn applies(
    q: &Tensor<CpuBackend, 3>,
    k: &Tensor<CpuBackend, 3>,
    v: &Tensor<CpuBackend, 3>,
    heads: usize,
) -> bool {
    let ([b, _, d], [bk, s, dk], [bv, sv, dv]) = (q.dims(), k.dims(), v.dims());
    [q.dtype(), k.dtype(), v.dtype()].iter().all(|&t| t == DType::F32)
        && (b, d, s) == (bk, dk, sv)
        && (b, d) == (bv, dv)
        && heads > 0
        && d.is_multiple_of(heads)
        && s > 0
}

/// The output [B, T, d] and the weights P [B, H, T, S].
fn attend(shape: Shape, x: &Inputs<'_>) -> (Vec<f32>, Vec<f32>) {
    let Shape { b, t, s, heads, dh, causal } = shape;
    let d = shape.d();
    let scale = 1.0 / (dh as f32).sqrt();
    let (mut out, mut p) = (vec![0f32; b * t * d], vec![0f32; b * heads * t * s]);
    let mut k_t = vec![0f32; dh * s];
    let mut scores = vec![0f32; t * s];
    for i in 0..b {
        for h in 0..heads {
            let (q, k, v) = (head(x.q, i, t, d, h, dh), head(x.k, i, s, d, h, dh), head(x.v, i, s, d, h, dh));
            times_transposed(q, k, &mut k_t, &mut scores);
            for (r, row) in scores.chunks_exact_mut(s).enumerate() {
                for (c, v) in row.iter_mut().enumerate() {
                    *v = if causal && c > r { MASKED } else { *v * scale };
                }
            }
            let p = &mut p[(i * heads + h) * t * s..][..t * s];
            kernels::softmax(&scores, p, s);
            let out = &mut out[i * t * d..][..t * d];
            weighted_rows(
                Weights::dense(p, t, s),
                (v.rows, Rows::new(dh, v.offset, d)),
                (out, Rows::new(dh, h * dh, d)),
            );
        }
    }
    (out, p)
}

impl Backward<Flex, 3> for Attention {
    type State = Saved;

    fn backward(self, ops: Ops<Saved, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<Flex>(&ops.node);
        let grad = grad.to_contiguous();
        let g = grad.as_slice::<f32>().expect("the output's gradient is f32 like the output");
        let (dq, dk, dv) = gradients(self.0, (&ops.state.inputs(), &ops.state.p), g);
        let Shape { b, t, s, .. } = self.0;
        let d = self.0.d();
        for (parent, (values, rows)) in ops.parents.into_iter().zip([(dq, t), (dk, s), (dv, s)]) {
            if let Some(node) = parent {
                grads.register::<Flex>(node.id, FlexTensor::from_data(TensorData::new(values, [b, rows, d])));
            }
        }
    }
}

/// dQ, dK, dV from the saved inputs and weights and the output's gradient g [B, T, d].
fn gradients(shape: Shape, (x, p): (&Inputs<'_>, &[f32]), g: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let Shape { b, t, s, heads, dh, .. } = shape;
    let d = shape.d();
    let scale = 1.0 / (dh as f32).sqrt();
    let (mut dq, mut dk, mut dv) = (vec![0f32; b * t * d], vec![0f32; b * s * d], vec![0f32; b * s * d]);
    let (mut p_t, mut v_t) = (vec![0f32; s * t], vec![0f32; dh * s]);
    let (mut dp, mut ds, mut ds_t) = (vec![0f32; t * s], vec![0f32; t * s], vec![0f32; s * t]);
    for i in 0..b {
        for h in 0..heads {
            let p = &p[(i * heads + h) * t * s..][..t * s];
            let (q, k, v) = (head(x.q, i, t, d, h, dh), head(x.k, i, s, d, h, dh), head(x.v, i, s, d, h, dh));
            let gh = head(g, i, t, d, h, dh);
            let here = |n: usize| Rows::new(dh, h * dh, d).at(i * n * d);
            // dV_h = Pᵀ G_h.
            transpose(Head { rows: p, offset: 0, len: t, width: s, stride: s }, &mut p_t);
            weighted_rows(Weights::dense(&p_t, s, t), (gh.rows, Rows::new(dh, gh.offset, d)), (&mut dv, here(s)));
            // dP = G_h V_hᵀ, then dS.
            times_transposed(gh, v, &mut v_t, &mut dp);
            kernels::softmax_grad(p, &dp, &mut ds, s);
            ds.iter_mut().for_each(|v| *v *= scale);
            // dQ_h = dS K_h, dK_h = dSᵀ Q_h.
            weighted_rows(Weights::dense(&ds, t, s), (k.rows, Rows::new(dh, k.offset, d)), (&mut dq, here(t)));
            transpose(Head { rows: &ds, offset: 0, len: t, width: s, stride: s }, &mut ds_t);
            weighted_rows(Weights::dense(&ds_t, s, t), (q.rows, Rows::new(dh, q.offset, d)), (&mut dk, here(s)));
        }
    }
    (dq, dk, dv)
}

/// One head's rows: `len` rows of `width` values at `offset` + r·`stride` of `rows`.
#[derive(Clone, Copy)]
struct Head<'a> {
    rows: &'a [f32],
    offset: usize,
    len: usize,
    width: usize,
    stride: usize,
}

/// Head `h` (width `dh`) of example `i` of a merged [B, n, d] tensor.
fn head(x: &[f32], i: usize, n: usize, d: usize, h: usize, dh: usize) -> Head<'_> {
    Head { rows: x, offset: i * n * d + h * dh, len: n, width: dh, stride: d }
}

/// The head's rows transposed into `out` [width, len], row-major.
fn transpose(x: Head<'_>, out: &mut [f32]) {
    for r in 0..x.len {
        let row = &x.rows[x.offset + r * x.stride..][..x.width];
        for (c, &v) in row.iter().enumerate() {
            out[c * x.len + r] = v;
        }
    }
}

/// `out` [a.len, b.len] = a bᵀ for two heads of one width (q kᵀ, G vᵀ), through `b_t`
/// [width, b.len] as scratch: rows of bᵀ weighted by a's entries.
fn times_transposed(a: Head<'_>, b: Head<'_>, b_t: &mut [f32], out: &mut [f32]) {
    transpose(b, b_t);
    out.iter_mut().for_each(|v| *v = 0.0);
    let rows = Rows::new(b.len, 0, b.len);
    weighted_rows(
        Weights { w: a.rows, m: a.len, n: a.width, stride: a.stride, offset: a.offset },
        (b_t, rows),
        (out, rows),
    );
}

/// A matrix W [m, n] read at `offset` + i·`stride` + j.
#[derive(Clone, Copy)]
struct Weights<'a> {
    w: &'a [f32],
    m: usize,
    n: usize,
    stride: usize,
    offset: usize,
}

impl<'a> Weights<'a> {
    fn dense(w: &'a [f32], m: usize, n: usize) -> Self {
        Self { w, m, n, stride: n, offset: 0 }
    }

    fn at(&self, i: usize, j: usize) -> f32 {
        self.w[self.offset + i * self.stride + j]
    }
}

/// Row j of a matrix: `width` values at `offset` + j·`stride`.
#[derive(Clone, Copy)]
struct Rows {
    width: usize,
    offset: usize,
    stride: usize,
}

impl Rows {
    fn new(width: usize, offset: usize, stride: usize) -> Self {
        Self { width, offset, stride }
    }

    fn at(self, base: usize) -> Self {
        Self { offset: self.offset + base, ..self }
    }

    fn start(&self, j: usize) -> usize {
        self.offset + j * self.stride
    }
}

/// out_i += Σ_j W[i,j]·x_j for i < m: rows x_j of `x` and out_i of `out`, each as laid out by
/// its [`Rows`] (of one width).
fn weighted_rows(w: Weights<'_>, (x, xr): (&[f32], Rows), (out, or): (&mut [f32], Rows)) {
    Arch::new().dispatch(WeightedRows { w, x, xr, out, or })
}

struct WeightedRows<'a> {
    w: Weights<'a>,
    x: &'a [f32],
    xr: Rows,
    out: &'a mut [f32],
    or: Rows,
}

impl WithSimd for WeightedRows<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        if S::REGISTER_COUNT >= 32 { self.run::<S, 4, 4>(simd) } else { self.run::<S, 2, 4>(simd) }
    }
}

impl WeightedRows<'_> {
    /// Blocks of R output rows by V vectors of columns held in registers while j runs over
    /// 0..n (a weight broadcast times a vector of x_j each); columns past the last whole
    /// vector as scalars. Indexed loops, as in `clip::gram`: closures here lose the vector
    /// unit's target features.
    #[inline(always)]
    #[allow(clippy::needless_range_loop, reason = "indexed loops: iterator closures lose the unit's target features")]
    fn run<S: Simd, const R: usize, const V: usize>(self, simd: S) {
        let Self { w, x, xr, out, or } = self;
        let width = xr.width;
        let vectors = width / S::F32_LANES;
        let whole = vectors * S::F32_LANES;
        let zero = simd.splat_f32s(0.0);
        for i0 in (0..w.m).step_by(R) {
            let rows = R.min(w.m - i0);
            for c0 in (0..vectors).step_by(V) {
                let mut acc = [[zero; V]; R];
                for j in 0..w.n {
                    let xj = S::as_simd_f32s(&x[xr.start(j)..][..width]).0;
                    let mut xv = [zero; V];
                    for v in 0..V {
                        xv[v] = xj[(c0 + v).min(vectors - 1)];
                    }
                    for i in 0..R {
                        let weight = simd.splat_f32s(if i < rows { w.at(i0 + i, j) } else { 0.0 });
                        for v in 0..V {
                            acc[i][v] = simd.mul_add_e_f32s(weight, xv[v], acc[i][v]);
                        }
                    }
                }
                for i in 0..rows {
                    let o = S::as_mut_simd_f32s(&mut out[or.start(i0 + i)..][..width]).0;
                    for v in 0..V.min(vectors - c0) {
                        o[c0 + v] = simd.add_f32s(o[c0 + v], acc[i][v]);
                    }
                }
            }
            for i in i0..i0 + rows {
                for c in whole..width {
                    let sum: f32 = (0..w.n).map(|j| w.at(i, j) * x[xr.start(j) + c]).sum();
                    out[or.start(i) + c] += sum;
                }
            }
        }
    }
}
