//! Ops that burn runs as scalar or unfused code on a CPU, as custom autodiff ops for
//! [`CpuBackend`] (`Autodiff<Flex>`). Models call the generic functions here; a backend other
//! than `CpuBackend` (burn-cuda, burn-wgpu, …) gets burn's own op, chosen by the concrete type
//! at run time, so models stay generic and GPUs keep their fused kernels.
//!
//! **GELU** (exact, x·Φ(x)). burn-flex evaluates it and its derivative one element at a time
//! through `libm::erff` and `expf` (`ops/activation.rs`: `unary_op` over a scalar closure),
//! calls the compiler cannot vectorise: 5-6 % of the `bench` captioner's step in `perf`, plus
//! part of `expf`'s 4 %. Here both are branch-free polynomials (Abramowitz-Stegun 7.1.26 for
//! erf, a Cody-Waite reduced exp) in one loop that the compiler vectorises, compiled for
//! AVX-512, AVX2 and NEON with the widest chosen at run time; erf stays within 1e-6 of
//! `erff` (`tests/fused.rs`). Upstream, the same kernels would replace burn-flex's scalar
//! `gelu`/`gelu_backward` closures with its SIMD `unary_op` path, no autodiff change needed.
//!
//! **Softmax** over the last dimension. burn-autodiff has no softmax op, so a training step
//! records burn's five-op decomposition (max, subtract, exp, sum, divide) and differentiates
//! each, with broadcasts between them; burn-flex's own fused softmax is used only without
//! autodiff. Here it is one op: one pass per row forward (the same vectorised exp), and
//! y ⊙ (g − Σ g⊙y) per row backward from the saved output. Upstream this is an
//! `ActivationOps::softmax` with a backward in burn-autodiff, which every backend would gain.
//! **Log-softmax** (the captioner's and the embedder's losses) is the same: burn records
//! max, subtract, exp, sum, log and subtract; here one pass per row forward and g − e^y·Σ g
//! backward, with the vectorised exp in both.
//!
//! **Attention on merged heads** ([`attention`]): see `attention.rs`.
//!
//! **LayerNorm's normalisation** x̂ = (x − μ)/√(σ² + ε) over the last dimension (γ and β stay
//! ordinary ops: the ClipEngine records x̂ and probes the output). burn has no layer-norm op, so
//! a training step records `var_mean_bias`, a subtract, an add, a square root and a divide, with
//! broadcasts, and differentiates each: about ten passes over the activations. Here it is one
//! pass forward (two over each row, in cache) and one backward, dx = (g − mean(g) −
//! x̂·mean(g⊙x̂))/√(σ² + ε) per row, from the saved x̂ and 1/√(σ² + ε). Upstream this is a
//! `ModuleOps::layer_norm` with a backward in burn-autodiff.

use std::any::{Any, TypeId};
use std::sync::Arc;

use burn::backend::Flex;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::ActivationOps;
use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn_flex::FlexTensor;

use crate::CpuBackend;

mod attention;

/// The exact GELU, x·Φ(x) = ½x(1 + erf(x/√2)), elementwise.
pub fn gelu<AB: AutodiffBackend, const D: usize>(x: Tensor<AB, D>) -> Tensor<AB, D> {
    on_cpu(x, |_| true, gelu_cpu, burn::tensor::activation::gelu)
}

/// Softmax over the last dimension (`dim` = D − 1; any other dimension takes burn's op).
pub fn softmax<AB: AutodiffBackend, const D: usize>(x: Tensor<AB, D>, dim: usize) -> Tensor<AB, D> {
    on_cpu(x, |x| dim + 1 == D && x.dims()[D - 1] > 0, softmax_cpu, |x| burn::tensor::activation::softmax(x, dim))
}

/// Log-softmax over the last dimension (`dim` = D − 1; any other dimension takes burn's op).
pub fn log_softmax<AB: AutodiffBackend, const D: usize>(x: Tensor<AB, D>, dim: usize) -> Tensor<AB, D> {
    on_cpu(
        x,
        |x| dim + 1 == D && x.dims()[D - 1] > 0,
        log_softmax_cpu,
        |x| burn::tensor::activation::log_softmax(x, dim),
    )
}

/// (x − μ)/√(σ² + ε) over the last dimension, μ and σ² (biased) of each row.
pub fn layer_norm<AB: AutodiffBackend, const D: usize>(x: Tensor<AB, D>, eps: f64) -> Tensor<AB, D> {
    on_cpu(
        x,
        |x| x.dims()[D - 1] > 0,
        |x| layer_norm_cpu(x, eps as f32),
        |x| {
            let (var, mean) = x.clone().var_mean_bias(D - 1);
            (x - mean) / (var + eps).sqrt()
        },
    )
}

/// Multi-head attention softmax(q_h k_hᵀ/√d_h, masked) v_h over `heads` heads, merged: q
/// [B, T, d], k and v [B, S, d] → [B, T, d], causal (query t sees keys s ≤ t) if asked. On a
/// `CpuBackend` with f32 inputs, one op reading each head in place; otherwise `unfused(q, k, v)`
/// (the caller's own composition, which keeps its precision).
pub fn attention<AB: AutodiffBackend>(
    (q, k, v): (Tensor<AB, 3>, Tensor<AB, 3>, Tensor<AB, 3>),
    heads: usize,
    causal: bool,
    unfused: impl FnOnce(Tensor<AB, 3>, Tensor<AB, 3>, Tensor<AB, 3>) -> Tensor<AB, 3>,
) -> Tensor<AB, 3> {
    let back = |x: Result<Tensor<CpuBackend, 3>, Tensor<AB, 3>>| x.map_or_else(|x| x, same);
    match (cast::<_, Tensor<CpuBackend, 3>>(q), cast(k), cast(v)) {
        (Ok(q), Ok(k), Ok(v)) if attention::applies(&q, &k, &v, heads) => {
            same(attention::forward(q, k, v, heads, causal))
        }
        (q, k, v) => unfused(back(q), back(k), back(v)),
    }
}

/// `fused` on an f32 [`CpuBackend`] tensor for which `applies` holds, else `burn_op`.
fn on_cpu<AB: AutodiffBackend, const D: usize>(
    x: Tensor<AB, D>,
    applies: impl FnOnce(&Tensor<CpuBackend, D>) -> bool,
    fused: impl FnOnce(Tensor<CpuBackend, D>) -> Tensor<CpuBackend, D>,
    burn_op: impl FnOnce(Tensor<AB, D>) -> Tensor<AB, D>,
) -> Tensor<AB, D> {
    match cast::<_, Tensor<CpuBackend, D>>(x) {
        Ok(x) if x.dtype() == DType::F32 && applies(&x) => same(fused(x)),
        Ok(x) => burn_op(same(x)),
        Err(x) => burn_op(x),
    }
}

/// `a` as `B` where the two are known to be one type (a value cast to a type and back).
pub(crate) fn same<A: 'static, B: 'static>(a: A) -> B {
    match cast(a) {
        Ok(b) => b,
        Err(_) => unreachable!("cast back to the type it came from"),
    }
}

/// `a` as a `B` when they are the same type, else `a` back.
pub(crate) fn cast<A: 'static, B: 'static>(a: A) -> Result<B, A> {
    if TypeId::of::<A>() != TypeId::of::<B>() {
        return Err(a);
    }
    match (Box::new(a) as Box<dyn Any>).downcast::<B>() {
        Ok(b) => Ok(*b),
        Err(_) => unreachable!("the type ids are equal"),
    }
}

/// The GELU op: its state for the backward is the input x.
#[derive(Debug)]
struct Gelu;

impl Backward<Flex, 1> for Gelu {
    type State = FlexTensor;

    fn backward(self, ops: Ops<FlexTensor, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let x = ops.state;
        unary::<Flex, _>(ops.parents, ops.node, grads, |grad| match zip_map(&x, &grad, kernels::gelu_grad) {
            Some(dx) => dx,
            None => Flex::gelu_backward(x, grad),
        });
    }
}

/// The softmax op over rows of the last dimension: its state for the backward is the output y
/// (dx = y ⊙ (g − Σ g⊙y) per row).
#[derive(Debug)]
struct Softmax;

impl Backward<Flex, 1> for Softmax {
    type State = FlexTensor;

    fn backward(self, ops: Ops<FlexTensor, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        rows_backward(ops, grads, kernels::softmax_grad, softmax_backward_unfused);
    }
}

/// The log-softmax op over rows of the last dimension: its state for the backward is the
/// output y (dx = g − e^y·Σ g per row).
#[derive(Debug)]
struct LogSoftmax;

impl Backward<Flex, 1> for LogSoftmax {
    type State = FlexTensor;

    fn backward(self, ops: Ops<FlexTensor, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        rows_backward(ops, grads, kernels::log_softmax_grad, |_, _, _| {
            unreachable!("y and its gradient are f32 of one shape: the forward made y")
        });
    }
}

/// The input gradient of a row op over the last dimension from its saved tensor (x or y) and
/// its output's gradient: `kernel(saved, g, dx, row)`, or `fallback(saved, g, row)` where the
/// kernel cannot run.
fn rows_backward(
    ops: Ops<FlexTensor, 1>,
    grads: &mut Gradients,
    kernel: impl FnOnce(&[f32], &[f32], &mut [f32], usize),
    fallback: impl FnOnce(FlexTensor, FlexTensor, usize) -> FlexTensor,
) {
    let saved = ops.state;
    unary::<Flex, _>(ops.parents, ops.node, grads, |grad| {
        let row = saved.layout().shape().iter().last().copied().unwrap_or(1);
        match zip_map(&saved, &grad, |x, g, out| kernel(x, g, out, row)) {
            Some(dx) => dx,
            None => fallback(saved, grad, row),
        }
    });
}

/// burn-flex's own ops for the softmax backward, where [`kernels::softmax_grad`] cannot run.
fn softmax_backward_unfused(y: FlexTensor, grad: FlexTensor, row: usize) -> FlexTensor {
    let shape = y.layout().shape().clone();
    let y = Tensor::<Flex, 1>::from_primitive(TensorPrimitive::Float(y)).reshape([-1, row as i32]);
    let g = Tensor::<Flex, 1>::from_primitive(TensorPrimitive::Float(grad)).reshape([-1, row as i32]);
    let dot = (g.clone() * y.clone()).sum_dim(1);
    (y * (g - dot)).into_primitive().tensor().reshape(shape)
}

/// The LayerNorm normalisation op over rows of the last dimension: its state for the backward
/// is x̂ and each row's 1/√(σ² + ε).
#[derive(Debug)]
struct LayerNorm;

impl Backward<Flex, 1> for LayerNorm {
    type State = (FlexTensor, Arc<[f32]>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let Ops { parents, node, state: (xhat, inv) } = ops;
        let kernel = |x: &[f32], g: &[f32], out: &mut [f32], row| kernels::layer_norm_grad(x, &inv, g, out, row);
        rows_backward(Ops { parents, node, state: xhat }, grads, kernel, |_, _, _| {
            unreachable!("x̂ and its gradient are f32 of one shape: the forward made x̂")
        });
    }
}

fn layer_norm_cpu<const D: usize>(x: Tensor<CpuBackend, D>, eps: f32) -> Tensor<CpuBackend, D> {
    let row = x.dims()[D - 1];
    let x = x.into_primitive().tensor();
    let contiguous = x.primitive.to_contiguous();
    let src = contiguous.as_slice::<f32>().expect("on_cpu passes f32 only");
    let (mut out, mut inv) = (vec![0f32; src.len()], vec![0f32; src.len() / row]);
    kernels::layer_norm(src, &mut out, &mut inv, row, eps);
    let y = FlexTensor::from_data(TensorData::new(out, contiguous.layout().shape().clone()));
    let out = match LayerNorm.prepare::<NoCheckpointing>([x.node.clone()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish((y.clone(), inv.into()), y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

fn softmax_cpu<const D: usize>(x: Tensor<CpuBackend, D>) -> Tensor<CpuBackend, D> {
    rows_cpu(x, Softmax, kernels::softmax, burn::tensor::activation::softmax)
}

fn log_softmax_cpu<const D: usize>(x: Tensor<CpuBackend, D>) -> Tensor<CpuBackend, D> {
    rows_cpu(x, LogSoftmax, kernels::log_softmax, burn::tensor::activation::log_softmax)
}

/// `kernel` over the rows of x's last dimension as the op `op`, whose backward reads the
/// output; burn's `burn_op` over that dimension where x does not hold f32.
fn rows_cpu<const D: usize, O: Backward<Flex, 1, State = FlexTensor>>(
    x: Tensor<CpuBackend, D>,
    op: O,
    kernel: fn(&[f32], &mut [f32], usize),
    burn_op: fn(Tensor<CpuBackend, D>, usize) -> Tensor<CpuBackend, D>,
) -> Tensor<CpuBackend, D> {
    let row = x.dims()[D - 1];
    let x = x.into_primitive().tensor();
    let Some(y) = map(&x.primitive, |x, out| kernel(x, out, row)) else {
        return burn_op(Tensor::from_primitive(TensorPrimitive::Float(x)), D - 1);
    };
    let out = match op.prepare::<NoCheckpointing>([x.node.clone()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(y.clone(), y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

fn gelu_cpu<const D: usize>(x: Tensor<CpuBackend, D>) -> Tensor<CpuBackend, D> {
    let x = x.into_primitive().tensor();
    let y = map(&x.primitive, kernels::gelu).unwrap_or_else(|| Flex::gelu(x.primitive.clone()));
    let out = match Gelu.prepare::<NoCheckpointing>([x.node.clone()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(x.primitive, y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// `f` over x into a new tensor of x's shape; None unless x holds f32 (burn-flex's own op
/// then runs).
fn map(x: &FlexTensor, f: impl FnOnce(&[f32], &mut [f32])) -> Option<FlexTensor> {
    let x = x.to_contiguous();
    let src = x.as_slice::<f32>()?;
    let mut out = vec![0f32; src.len()];
    f(src, &mut out);
    Some(FlexTensor::from_data(TensorData::new(out, x.layout().shape().clone())))
}

/// `f` over (x, g) pairs into a new tensor of x's shape; None unless both hold f32 of one
/// shape.
fn zip_map(x: &FlexTensor, g: &FlexTensor, f: impl FnOnce(&[f32], &[f32], &mut [f32])) -> Option<FlexTensor> {
    let (x, g) = (x.to_contiguous(), g.to_contiguous());
    let (xs, gs) = (x.as_slice::<f32>()?, g.as_slice::<f32>()?);
    if x.layout().shape() != g.layout().shape() {
        return None;
    }
    let mut out = vec![0f32; xs.len()];
    f(xs, gs, &mut out);
    Some(FlexTensor::from_data(TensorData::new(out, x.layout().shape().clone())))
}

/// The elementwise kernels, as plain loops over slices that the compiler vectorises.
pub mod kernels {
    use std::f32::consts::{FRAC_1_SQRT_2, LOG2_E};

    /// 1/√(2π).
    const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;

    /// e^x for x ≤ 0 (the only uses: erf's e^(−x²), softmax's e^(x − max)), relative error
    /// about 2e-7: n = ⌊x·log₂e⌉, r = x − n·ln 2 in two steps (Cody-Waite), Cephes's degree-6
    /// polynomial for e^r, and 2^n from the exponent bits. Exactly 0 below −87.3 (where e^x
    /// leaves f32's normal range), as a masked attention score must weigh; NaN stays NaN.
    #[inline(always)]
    pub fn exp_neg(x: f32) -> f32 {
        let underflow = x < -87.3;
        // A select, not `max`: `max` would turn a NaN into −87.3.
        let x = if underflow { -87.3 } else { x };
        let n = (x * LOG2_E + 0.5).floor();
        let r = x - n * 0.693_359_4 + n * 2.121_944_4e-4;
        let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
            + 1.666_666_5e-1)
            * r
            + 0.5;
        let p = p * r * r + r + 1.0;
        let e = p * f32::from_bits(((n as i32 + 127) as u32) << 23);
        if underflow { 0.0 } else { e }
    }

    /// erf(x) by Abramowitz and Stegun 7.1.26 (|error| ≤ 1.5e-7), odd by its sign.
    #[inline(always)]
    pub fn erf(x: f32) -> f32 {
        let a = x.abs();
        let t = 1.0 / (1.0 + 0.327_591_1 * a);
        let poly = t * (0.254_829_6 + t * (-0.284_496_74 + t * (1.421_413_8 + t * (-1.453_152 + t * 1.061_405_4))));
        (1.0 - poly * exp_neg(-a * a)).copysign(x)
    }

    /// Softmax of each row of `row` values: e^(x − max) / Σ e^(x − max). A NaN anywhere in a
    /// row makes the whole row NaN (`max` skips it, the exponent does not), as burn's does.
    #[multiversion::multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+fma", "x86_64+avx2+fma", "aarch64+neon"))]
    pub fn softmax(x: &[f32], out: &mut [f32], row: usize) {
        for (x, out) in x.chunks_exact(row).zip(out.chunks_exact_mut(row)) {
            let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            for (o, &v) in out.iter_mut().zip(x) {
                *o = exp_neg(v - max);
            }
            let inv = 1.0 / out.iter().sum::<f32>();
            out.iter_mut().for_each(|o| *o *= inv);
        }
    }

    /// Log-softmax of each row of `row` values: x − max − ln Σ e^(x − max). A NaN anywhere in
    /// a row makes the whole row NaN, as in [`softmax`].
    #[multiversion::multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+fma", "x86_64+avx2+fma", "aarch64+neon"))]
    pub fn log_softmax(x: &[f32], out: &mut [f32], row: usize) {
        for (x, out) in x.chunks_exact(row).zip(out.chunks_exact_mut(row)) {
            let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            let sum: f32 = x.iter().map(|&v| exp_neg(v - max)).sum();
            let shift = max + sum.ln();
            for (o, &v) in out.iter_mut().zip(x) {
                *o = v - shift;
            }
        }
    }

    /// The log-softmax's input gradient g − e^y·Σ g for each row of `row` values, from its
    /// output y (≤ 0, so e^y is [`exp_neg`]'s).
    #[multiversion::multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+fma", "x86_64+avx2+fma", "aarch64+neon"))]
    pub fn log_softmax_grad(y: &[f32], g: &[f32], out: &mut [f32], row: usize) {
        let rows = y.chunks_exact(row).zip(g.chunks_exact(row)).zip(out.chunks_exact_mut(row));
        for ((y, g), out) in rows {
            let total: f32 = g.iter().sum();
            for ((o, &y), &g) in out.iter_mut().zip(y).zip(g) {
                *o = g - exp_neg(y) * total;
            }
        }
    }

    /// The softmax's input gradient y ⊙ (g − Σ g⊙y) for each row of `row` values.
    #[multiversion::multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+fma", "x86_64+avx2+fma", "aarch64+neon"))]
    pub fn softmax_grad(y: &[f32], g: &[f32], out: &mut [f32], row: usize) {
        let rows = y.chunks_exact(row).zip(g.chunks_exact(row)).zip(out.chunks_exact_mut(row));
        for ((y, g), out) in rows {
            let dot: f32 = y.iter().zip(g).map(|(y, g)| y * g).sum();
            for ((o, &y), &g) in out.iter_mut().zip(y).zip(g) {
                *o = y * (g - dot);
            }
        }
    }

    /// x̂ = (x − μ)·r for each row of `row` values, with μ the row's mean, r = 1/√(σ² + ε)
    /// and σ² its biased variance (two passes, as burn's `var_mean_bias`); r goes to `inv`.
    #[multiversion::multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+fma", "x86_64+avx2+fma", "aarch64+neon"))]
    pub fn layer_norm(x: &[f32], out: &mut [f32], inv: &mut [f32], row: usize, eps: f32) {
        for ((x, out), inv) in x.chunks_exact(row).zip(out.chunks_exact_mut(row)).zip(inv.iter_mut()) {
            let n = row as f32;
            let mean = x.iter().sum::<f32>() / n;
            let var = x.iter().map(|&v| (v - mean) * (v - mean)).sum::<f32>() / n;
            *inv = 1.0 / (var + eps).sqrt();
            for (o, &v) in out.iter_mut().zip(x) {
                *o = (v - mean) * *inv;
            }
        }
    }

    /// The normalisation's input gradient r·(g − mean(g) − x̂·mean(g⊙x̂)) for each row of `row`
    /// values, from x̂ and r = 1/√(σ² + ε) ([`layer_norm`]).
    #[multiversion::multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+fma", "x86_64+avx2+fma", "aarch64+neon"))]
    pub fn layer_norm_grad(xhat: &[f32], inv: &[f32], g: &[f32], out: &mut [f32], row: usize) {
        let rows = xhat.chunks_exact(row).zip(g.chunks_exact(row)).zip(out.chunks_exact_mut(row)).zip(inv);
        for (((x, g), out), &r) in rows {
            let n = row as f32;
            let mean_g = g.iter().sum::<f32>() / n;
            let mean_gx = x.iter().zip(g).map(|(x, g)| x * g).sum::<f32>() / n;
            for ((o, &x), &g) in out.iter_mut().zip(x).zip(g) {
                *o = r * (g - mean_g - x * mean_gx);
            }
        }
    }

    /// x·Φ(x) for each x.
    #[multiversion::multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+fma", "x86_64+avx2+fma", "aarch64+neon"))]
    pub fn gelu(x: &[f32], out: &mut [f32]) {
        for (y, &x) in out.iter_mut().zip(x) {
            *y = 0.5 * x * (1.0 + erf(x * FRAC_1_SQRT_2));
        }
    }

    /// g·(Φ(x) + x·φ(x)) for each (x, g): the GELU's input gradient from its output's.
    #[multiversion::multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+fma", "x86_64+avx2+fma", "aarch64+neon"))]
    pub fn gelu_grad(x: &[f32], g: &[f32], out: &mut [f32]) {
        for ((y, &x), &g) in out.iter_mut().zip(x).zip(g) {
            let cdf = 0.5 * (1.0 + erf(x * FRAC_1_SQRT_2));
            let pdf = FRAC_1_SQRT_2PI * exp_neg(-0.5 * x * x);
            *y = g * (cdf + x * pdf);
        }
    }
}
