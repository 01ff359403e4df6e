//! Per-example squared gradient norms and clipped gradient sums for each recorded layer, from
//! its input activation a and output gradient δ alone (no per-example gradient is built unless
//! that is cheaper). Sums of per-layer squared norms give each example's total norm.

use burn::backend::Flex;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, FloatDType, IndexingUpdateOp, Int, Tensor, TensorData};
use burn_flex::FlexTensor;

use super::gram::packed_len;
use super::rounding::{LinearShape, MatmulInputs};
use crate::fused::{cast, same};

/// Whether to use the ghost form Σ_{t,s}(a_t·a_s)(δ_t·δ_s) for a Linear layer on a sequence of
/// length T: it costs O(T²(d_in + d_out)) against O(T d_in d_out) for materialising.
pub fn use_ghost(t: usize, d_in: usize, d_out: usize) -> bool {
    2 * t * t < d_in * d_out
}

/// How a Linear weight's per-example norms and its clipped sum are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinearForm {
    /// Norms from Σ_{t,s}(a_t·a_s)(δ_t·δ_s), the sum as aᵀ(c ⊙ δ): no per-example gradient.
    Ghost,
    /// Norms of g_i = a_iᵀδ_i built per example and dropped, the sum as aᵀ(c ⊙ δ).
    Materialised,
    /// g_i built per example, its norm taken, and the sum Σ_i c_i g_i made of those same g_i
    /// (one pass over them in place of the B·T·d_in·d_out product). Only with exact f32
    /// products: the norm is then of the very tensor summed (rounded products have their
    /// bounds for the two forms above).
    Reused,
}

/// The form for a Linear layer of `shape`: ghost where it costs fewer operations
/// ([`use_ghost`]), else the per-example gradients, kept for the sum when products are exact.
/// Reusing them where the ghost form is cheaper was measured slower on a CPU: B·d_in·d_out
/// floats a layer make several memory passes where the ghost form's B·T² stay in cache
/// (docs/benchmarks.md).
pub fn linear_form(shape: LinearShape, inputs: MatmulInputs) -> LinearForm {
    let LinearShape { t, d_in, d_out } = shape;
    match (use_ghost(t, d_in, d_out), inputs.unit()) {
        (true, _) => LinearForm::Ghost,
        (false, None) => LinearForm::Reused,
        (false, Some(_)) => LinearForm::Materialised,
    }
}

/// Σ over all but the first dimension, giving one value per example.
fn per_example<B: Backend>(x: Tensor<B, 3>) -> Tensor<B, 1> {
    let b = x.dims()[0];
    x.reshape([b as i32, -1]).sum_dim(1).squeeze_dim(1)
}

/// The Gram matrix x·xᵀ per example, [B, T, T].
fn full_gram<B: Backend>(x: &Tensor<B, 3>) -> Tensor<B, 3> {
    x.clone().matmul(x.clone().swap_dims(1, 2))
}

/// A Linear input's Gram matrix a·aᵀ per example, in the form [`ghost_sq_norms`] reads on
/// this backend (made by [`gram`] only).
#[derive(Debug, Clone)]
pub struct Gram<B: Backend>(GramForm<B>);

#[derive(Debug, Clone)]
enum GramForm<B: Backend> {
    /// [B, T, T], from the backend's batched matmul.
    Full(Tensor<B, 3>),
    /// On a CPU (f32 burn-flex, so B is `Flex`): each example's lower triangle packed,
    /// off-diagonal doubled, [B, T(T+1)/2], from [`super::gram`]'s kernels.
    Packed(Tensor<Flex, 2>),
}

impl<B: Backend> Gram<B> {
    /// Whether the CPU's symmetric kernels made it (and will read it).
    pub fn is_packed(&self) -> bool {
        matches!(self.0, GramForm::Packed(_))
    }
}

/// a·aᵀ per example for a Linear input a [B, T, d].
pub fn gram<B: Backend>(a: &Tensor<B, 3>) -> Gram<B> {
    match cast::<_, Tensor<Flex, 3>>(a.clone()) {
        Ok(a) if a.dtype() == DType::F32 => Gram(GramForm::Packed(packed_gram(a))),
        _ => Gram(GramForm::Full(full_gram(a))),
    }
}

/// ‖Σ_t a_tᵀ δ_t‖² = Σ_{t,s}(a_t·a_s)(δ_t·δ_s) per example for a Linear weight, from the
/// input's Gram matrix `aa` ([`gram`]).
pub fn ghost_sq_norms<B: Backend>(aa: &Gram<B>, delta: &Tensor<B, 3>) -> Tensor<B, 1> {
    match &aa.0 {
        GramForm::Full(aa) => per_example(aa.clone() * full_gram(delta)),
        GramForm::Packed(aa) => {
            let delta: Tensor<Flex, 3> = same(delta.clone());
            same(packed_ghost_sq_norms(aa.clone(), delta.cast(FloatDType::F32)))
        }
    }
}

/// [`Gram::Packed`] of a [B, T, d]: [`super::gram::packed_gram`] per example.
fn packed_gram(a: Tensor<Flex, 3>) -> Tensor<Flex, 2> {
    let ([b, t, d], len) = (a.dims(), packed_len(a.dims()[1]));
    let a = flex_f32(a);
    let mut out = vec![0f32; b * len];
    for i in 0..b {
        let x = &a.as_slice::<f32>().expect("f32")[i * t * d..][..t * d];
        super::gram::packed_gram(x, t, d, &mut out[i * len..][..len]);
    }
    Tensor::from_data(TensorData::new(out, [b, len]), &Default::default())
}

/// [`ghost_sq_norms`] from a [`Gram::Packed`] and δ [B, T, d]:
/// [`super::gram::ghost_sq_norm`] per example.
fn packed_ghost_sq_norms(aa: Tensor<Flex, 2>, delta: Tensor<Flex, 3>) -> Tensor<Flex, 1> {
    let ([b, t, d], len) = (delta.dims(), packed_len(delta.dims()[1]));
    assert_eq!(aa.dims(), [b, len], "the packed Gram of this layer's input: one per example, T(T+1)/2 values");
    let (aa, delta) = (flex_f32(aa), flex_f32(delta));
    let (aa, delta) = (aa.as_slice::<f32>().expect("f32"), delta.as_slice::<f32>().expect("f32"));
    let sq: Vec<f32> =
        (0..b).map(|i| super::gram::ghost_sq_norm(&aa[i * len..][..len], &delta[i * t * d..][..t * d], t, d)).collect();
    Tensor::from_data(TensorData::new(sq, [b]), &Default::default())
}

/// An f32 burn-flex tensor's contiguous storage.
fn flex_f32<const D: usize>(x: Tensor<Flex, D>) -> FlexTensor {
    x.into_primitive().tensor().to_contiguous()
}

/// g_i = Σ_t a_{i,t}ᵀ δ_{i,t} per example, [B, d_in, d_out].
pub fn linear_weight_per_example<B: Backend>(a: &Tensor<B, 3>, delta: &Tensor<B, 3>) -> Tensor<B, 3> {
    a.clone().swap_dims(1, 2).matmul(delta.clone())
}

/// ‖g_i‖² per example of per-example gradients [B, ., .], elementwise (no matmul rounding).
pub fn per_example_sq_norms<B: Backend>(g: &Tensor<B, 3>) -> Tensor<B, 1> {
    per_example(g.clone().powi_scalar(2))
}

/// ‖x_t‖ per position, [B, T, 1], elementwise (no matmul, so no tensor-core rounding).
fn row_norms<B: Backend>(x: &Tensor<B, 3>) -> Tensor<B, 3> {
    x.clone().powi_scalar(2).sum_dim(2).sqrt()
}

/// S = Σ_t ‖a_t‖·‖δ_t‖ per example for a Linear weight: it bounds ‖Σ_t a_tᵀ δ_t‖ and scales
/// its matmuls' rounding error ([`super::rounding`]).
pub fn linear_weight_s<B: Backend>(a: &Tensor<B, 3>, delta: &Tensor<B, 3>) -> Tensor<B, 1> {
    per_example(row_norms(a) * row_norms(delta))
}

/// S = Σ_t ‖δ_t‖ per example for an embedding table (its inputs are one-hot, of norm 1).
pub fn embedding_s<B: Backend>(delta: &Tensor<B, 3>) -> Tensor<B, 1> {
    per_example(row_norms(delta))
}

/// Σ_t x_t per example, [B, 1, d]: a bias's gradient with x = δ, a LayerNorm γ's with
/// x = δ ⊙ x̂. Its squared norm ([`row_sum_sq_norms`]) and its clipped sum ([`weighted_sum`])
/// both read it, so it is made once.
pub fn row_sum<B: Backend>(x: &Tensor<B, 3>) -> Tensor<B, 3> {
    x.clone().sum_dim(1)
}

/// ‖Σ_t x_t‖² per example from its [`row_sum`].
pub fn row_sum_sq_norms<B: Backend>(rows: &Tensor<B, 3>) -> Tensor<B, 1> {
    per_example(rows.clone().powi_scalar(2))
}

/// Σ_{t,s} [tok_t = tok_s] (δ_t·δ_s) per example for an embedding table.
pub fn embedding_sq_norms<B: Backend>(tokens: &Tensor<B, 2, Int>, delta: &Tensor<B, 3>) -> Tensor<B, 1> {
    let same = tokens.clone().unsqueeze_dim::<3>(2).equal(tokens.clone().unsqueeze_dim::<3>(1)).float();
    per_example(same * full_gram(delta))
}

/// ‖δ‖² per example for a free parameter added to every example.
pub fn free_sq_norms<B: Backend>(delta: &Tensor<B, 3>) -> Tensor<B, 1> {
    per_example(delta.clone().powi_scalar(2))
}

/// δ scaled by each example's clip factor c: [B, T, d] ⊙ [B, 1, 1].
pub fn scale<B: Backend>(delta: &Tensor<B, 3>, factors: &Tensor<B, 1>) -> Tensor<B, 3> {
    delta.clone() * factors.clone().unsqueeze_dims::<3>(&[1, 2])
}

/// Σ_i c_i Σ_t a_{i,t}ᵀ δ_{i,t} over all B·T rows: one matmul, with the clip factors applied to
/// the narrower of a and δ when products are `exact`. With rounded products always to δ: the
/// rounding bound ([`super::rounding::sum_input_error`]) is derived for aᵀ(c ⊙ δ).
pub fn linear_weight_sum<B: Backend>(
    a: &Tensor<B, 3>,
    delta: &Tensor<B, 3>,
    factors: &Tensor<B, 1>,
    exact: bool,
) -> Tensor<B, 1> {
    let [b, t, d_in] = a.dims();
    let d_out = delta.dims()[2];
    let (a, delta) =
        if exact && d_in < d_out { (scale(a, factors), delta.clone()) } else { (a.clone(), scale(delta, factors)) };
    let a2 = a.reshape([b * t, d_in]);
    let d2 = delta.reshape([b * t, d_out]);
    a2.transpose().matmul(d2).reshape([d_in * d_out])
}

/// Σ_i c_i x_i over examples x [B, r, c], flat [r·c]: elementwise products and a sum (no
/// matmul, so no rounded inputs on any device).
pub fn weighted_sum<B: Backend>(x: &Tensor<B, 3>, factors: &Tensor<B, 1>) -> Tensor<B, 1> {
    let [_, r, c] = x.dims();
    scale(x, factors).sum_dim(0).reshape([r * c])
}

/// Σ_i c_i g_i over per-example gradients g [B, d_in, d_out] as one product cᵀG (exact f32
/// products only: [`LinearForm::Reused`]).
pub fn per_example_sum<B: Backend>(g: &Tensor<B, 3>, factors: &Tensor<B, 1>) -> Tensor<B, 1> {
    let [b, d_in, d_out] = g.dims();
    factors.clone().reshape([1, b]).matmul(g.clone().reshape([b, d_in * d_out])).reshape([d_in * d_out])
}

/// `running` (a table's running sum, flat [rows·d]) plus Σ_i c_i Σ_t onehot(tok_{i,t}) δ_{i,t}ᵀ,
/// scattered into it: no zeroed table of the vocabulary's size (30522×768 for `base`) per
/// micro-batch, and no second pass to add one.
pub fn add_embedding_sum<B: Backend>(
    running: Tensor<B, 1>,
    tokens: &Tensor<B, 2, Int>,
    scaled: &Tensor<B, 3>,
) -> Tensor<B, 1> {
    let [b, t, d] = scaled.dims();
    let rows = running.dims()[0] / d;
    let indices = tokens.clone().reshape([b * t]);
    running
        .reshape([rows, d])
        .select_assign(0, indices, scaled.clone().reshape([b * t, d]), IndexingUpdateOp::Add)
        .reshape([rows * d])
}
