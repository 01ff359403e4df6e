//! Each recorded layer with its output gradient δ: the per-example squared norms of its
//! parameters' gradients and their clipped sum Σ_i c_i·g_i, by layer kind, and the per-example
//! selections and masks applied to both.

use std::collections::HashMap;

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, FloatDType, Int, Tensor};

use super::GradSum;
use super::norms::{self, LinearForm};
use super::rounding::{self, MatmulInputs};
use super::tape::Record;
use crate::params::ParamSet;

type Inner<AB> = <AB as AutodiffBackend>::InnerBackend;

/// A record with its probe's gradient δ (the layer's output gradient per example) and what
/// its norms computed that its clipped sum reads again ([`Kept`]).
pub(super) struct Delta<AB: AutodiffBackend> {
    pub record: Record<AB>,
    pub delta: Tensor<Inner<AB>, 3>,
    pub kept: Kept<Inner<AB>>,
}

/// Per-example tensors made for the norms and summed again for the clipped sum.
pub(super) struct Kept<B: Backend> {
    /// A Linear layer in [`LinearForm::Reused`]: each example's weight gradient g_i
    /// [B, d_in, d_out].
    pub gradients: Option<Tensor<B, 3>>,
    /// A bias's or β's gradient Σ_t δ_t per example [B, 1, d] ([`norms::row_sum`]).
    pub bias: Option<Tensor<B, 3>>,
    /// A LayerNorm γ's gradient Σ_t δ_t ⊙ x̂_t per example [B, 1, d].
    pub gamma: Option<Tensor<B, 3>>,
}

impl<B: Backend> Kept<B> {
    fn map(self, f: impl Fn(Tensor<B, 3>) -> Tensor<B, 3>) -> Self {
        Self { gradients: self.gradients.map(&f), bias: self.bias.map(&f), gamma: self.gamma.map(&f) }
    }
}

impl<AB: AutodiffBackend> Delta<AB> {
    /// The record (its activations widened to f32) with δ read from `grads`.
    pub fn read(record: Record<AB>, grads: &<AB as AutodiffBackend>::Gradients) -> Self {
        let record = widen_record(record);
        let delta = probe_of(&record).grad(grads).expect("every probe lies on the loss's graph");
        Self { record, delta, kept: Kept { gradients: None, bias: None, gamma: None } }
    }
}

fn probe_of<AB: AutodiffBackend>(record: &Record<AB>) -> &Tensor<AB, 3> {
    match record {
        Record::Linear { probe, .. }
        | Record::LayerNorm { probe, .. }
        | Record::Embedding { probe, .. }
        | Record::Free { probe, .. } => probe,
    }
}

/// Each example's squared gradient norm summed over every layer's parameters (with rounded
/// matmul inputs, its certified upper bound), and with rounded inputs R² = Σ S² over the layers
/// whose clipped sum is a matmul.
pub(super) struct Norms<B: Backend> {
    pub sq: Tensor<B, 1>,
    pub r_sq: Option<Tensor<B, 1>>,
}

/// The squared norms of a micro-batch of `b` examples; a Linear layer in
/// [`LinearForm::Reused`] keeps the per-example gradients it built in its [`Delta`].
pub(super) fn sq_norms<AB: AutodiffBackend>(
    records: &mut [Delta<AB>],
    b: usize,
    params: &ParamSet<Inner<AB>>,
    inputs: MatmulInputs,
) -> Norms<Inner<AB>> {
    let zeros = || Tensor::<Inner<AB>, 1>::zeros([b], params.device());
    let (mut sq, mut r_sq) = (zeros(), inputs.unit().map(|_| zeros()));
    let mut grams = Grams::default();
    // A row sum kept for the clipped sum, and its squared norms.
    let rows = |x: &Tensor<Inner<AB>, 3>, kept: &mut Option<Tensor<Inner<AB>, 3>>| {
        norms::row_sum_sq_norms(kept.insert(norms::row_sum(x)))
    };
    for Delta { record, delta, kept } in records.iter_mut() {
        sq = sq
            + match record {
                Record::Linear { input, bias, shared, .. } => {
                    let a = Activation { a: input, shared: *shared };
                    let (w, gradients) = linear_sq_norms(a, delta, inputs, &mut r_sq, &mut grams);
                    kept.gradients = gradients;
                    if bias.is_some() { w + rows(delta, &mut kept.bias) } else { w }
                }
                Record::LayerNorm { normalized, .. } => {
                    rows(&(delta.clone() * normalized.clone()), &mut kept.gamma) + rows(delta, &mut kept.bias)
                }
                Record::Embedding { tokens, .. } => {
                    let e = norms::embedding_sq_norms(tokens, delta);
                    match inputs.unit() {
                        None => e,
                        Some(u) => {
                            let [_, t, d] = delta.dims();
                            bounded(e, rounding::embedding(u, t, d), norms::embedding_s(delta))
                        }
                    }
                }
                Record::Free { .. } => norms::free_sq_norms(delta),
            };
    }
    Norms { sq, r_sq }
}

/// The Gram matrices a·aᵀ of shared inputs ([`super::Shared`]) computed so far ([`norms::Gram`]).
type Grams<B> = HashMap<usize, norms::Gram<B>>;

/// A Linear layer's input and the key of the [`super::Shared`] input it is, if any.
struct Activation<'a, B: Backend> {
    a: &'a Tensor<B, 3>,
    shared: Option<usize>,
}

/// A Linear weight's squared norms in the form [`norms::linear_form`] picks, with the
/// per-example gradients when that form keeps them; with rounded inputs, the bound and its S²
/// added to `r_sq`. A shared input's Gram matrix is computed once and kept in `grams`.
fn linear_sq_norms<B: Backend>(
    Activation { a, shared }: Activation<'_, B>,
    delta: &Tensor<B, 3>,
    inputs: MatmulInputs,
    r_sq: &mut Option<Tensor<B, 1>>,
    grams: &mut Grams<B>,
) -> (Tensor<B, 1>, Option<Tensor<B, 3>>) {
    let ([_, t, d_in], d_out) = (a.dims(), delta.dims()[2]);
    let shape = rounding::LinearShape { t, d_in, d_out };
    let form = norms::linear_form(shape, inputs);
    let (w, kept) = match form {
        LinearForm::Ghost => {
            let aa = match shared {
                Some(key) => grams.entry(key).or_insert_with(|| norms::gram(a)).clone(),
                None => norms::gram(a),
            };
            (norms::ghost_sq_norms(&aa, delta), None)
        }
        LinearForm::Materialised | LinearForm::Reused => {
            let g = norms::linear_weight_per_example(a, delta);
            (norms::per_example_sq_norms(&g), (form == LinearForm::Reused).then_some(g))
        }
    };
    let w = match inputs.unit() {
        None => w,
        Some(u) => {
            let bound = match form {
                LinearForm::Ghost => rounding::ghost(u, shape),
                LinearForm::Materialised | LinearForm::Reused => rounding::materialised(u, shape),
            };
            let s = norms::linear_weight_s(a, delta);
            *r_sq = r_sq.take().map(|r| r + s.clone().powi_scalar(2));
            bounded(w, bound, s)
        }
    };
    (w, kept)
}

/// (1 + ρ)·sq + κ·S². No clamp: a NaN must stay NaN so that its example is left out.
fn bounded<B: Backend>(sq: Tensor<B, 1>, bound: rounding::Bound, s: Tensor<B, 1>) -> Tensor<B, 1> {
    sq.mul_scalar(1.0 + bound.rho) + s.powi_scalar(2).mul_scalar(bound.kappa)
}

/// The record, δ and per-example gradients with every per-example tensor passed through
/// `float` (activations, δ, g) or `tokens` (token indices); the probe, no longer needed, is kept.
fn map_examples<AB: AutodiffBackend>(
    Delta { record, delta, kept }: Delta<AB>,
    float: impl Fn(Tensor<Inner<AB>, 3>) -> Tensor<Inner<AB>, 3>,
    tokens: impl FnOnce(Tensor<Inner<AB>, 2, Int>) -> Tensor<Inner<AB>, 2, Int>,
) -> Delta<AB> {
    let record = match record {
        Record::Linear { weight, bias, input, shared, probe } => {
            Record::Linear { weight, bias, input: float(input), shared, probe }
        }
        Record::LayerNorm { gamma, beta, normalized, probe } => {
            Record::LayerNorm { gamma, beta, normalized: float(normalized), probe }
        }
        Record::Embedding { table, tokens: t, probe } => Record::Embedding { table, tokens: tokens(t), probe },
        free @ Record::Free { .. } => free,
    };
    Delta { record, delta: float(delta), kept: kept.map(&float) }
}

/// The record and δ of the examples `rows` only.
pub(super) fn select_rows<AB: AutodiffBackend>(delta: Delta<AB>, rows: &Tensor<Inner<AB>, 1, Int>) -> Delta<AB> {
    map_examples(delta, |x| x.select(0, rows.clone()), |t| t.select(0, rows.clone()))
}

/// The record and δ with the examples `bad` zeroed wherever an activation or δ is summed
/// (token indices stay: the scatter adds their zeroed δ rows; free parameters have δ alone).
pub(super) fn mask_rows<AB: AutodiffBackend>(delta: Delta<AB>, bad: &Tensor<Inner<AB>, 1, Bool>) -> Delta<AB> {
    map_examples(delta, |x| super::finite::zero_rows(x, bad), |t| t)
}

/// Adds Σ_i c_i·g_i per layer, computed directly from the records: one product per Linear
/// (aᵀ(c ⊙ δ), or cᵀG over the per-example gradients it kept), and per-example row sums
/// weighted by c for biases and LayerNorm, so c ⊙ δ is built only where a product needs it.
pub(super) fn add_clipped_sums<AB: AutodiffBackend>(
    records: &[Delta<AB>],
    factors: &Tensor<Inner<AB>, 1>,
    sum: &mut GradSum<Inner<AB>>,
    inputs: MatmulInputs,
) {
    let exact = inputs.unit().is_none();
    let row_sum = |kept: &Option<Tensor<Inner<AB>, 3>>| {
        norms::weighted_sum(kept.as_ref().expect("the norms kept every row sum the sum reads"), factors)
    };
    for Delta { record, delta, kept } in records {
        match record {
            Record::Linear { weight, bias, input, .. } => {
                let w = match &kept.gradients {
                    Some(g) => norms::per_example_sum(g, factors),
                    None => norms::linear_weight_sum(input, delta, factors, exact),
                };
                sum.add(*weight, w);
                if let Some(bias) = bias {
                    sum.add(*bias, row_sum(&kept.bias));
                }
            }
            Record::LayerNorm { gamma, beta, .. } => {
                sum.add(*gamma, row_sum(&kept.gamma));
                sum.add(*beta, row_sum(&kept.bias));
            }
            Record::Embedding { table, tokens, .. } => {
                let scaled = norms::scale(delta, factors);
                sum.update(*table, |running| norms::add_embedding_sum(running, tokens, &scaled));
            }
            Record::Free { param, .. } => sum.add(*param, norms::weighted_sum(delta, factors)),
        }
    }
}

/// A record whose activations are f32 (half-precision linear inputs widened), so every norm,
/// clip factor and sum below is computed in f32.
fn widen_record<AB: AutodiffBackend>(record: Record<AB>) -> Record<AB> {
    match record {
        Record::Linear { weight, bias, input, shared, probe } => {
            Record::Linear { weight, bias, input: input.cast(FloatDType::F32), shared, probe }
        }
        other => other,
    }
}
