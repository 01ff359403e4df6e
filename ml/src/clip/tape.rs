//! The forward-pass recorder. In [`Mode::Ghost`] parameters are constants (no gradient) and
//! every trainable layer records its input activation and adds a *probe* leaf to its output
//! (its bias, β or free parameter broadcast to the output's shape; zeros where it has none):
//! one backward then yields each layer's output gradient δ (the probe's gradient) and nothing
//! else. In [`Mode::Plain`] parameters are autodiff leaves, for the non-private baseline and
//! for the naive per-example reference.

use std::collections::HashMap;

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{FloatDType, Int, Tensor};

use super::counters;
use crate::params::{ParamId, ParamSet};

type Inner<AB> = <AB as AutodiffBackend>::InnerBackend;

/// How the tape treats parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Book-keeping with ghost norms: probes on layer outputs, parameters constant.
    Ghost,
    /// Ordinary autodiff with parameters as leaves.
    Plain,
    /// Inference: parameters constant, nothing recorded.
    Frozen,
}

/// The dtype of the matrix products (linear layers and attention). Mixed precision as DP-Cap
/// runs it: with [`Precision::Bf16`] the products run in bf16 and their outputs widen back to
/// f32; LayerNorm, softmax, the residual stream and the losses stay in f32, and the ClipEngine
/// computes per-example norms, clip factors and the gradient sum in f32 from the bf16
/// activations (so each example's contribution is still bounded by C in f32 arithmetic).
/// [`Precision::F16`] is the same scheme for devices without bf16: WGSL (burn-wgpu, Mesa's
/// lavapipe, where `scripts/jit-check.sh` runs the mixed-precision kernels) and pre-Ampere GPUs.
/// Its 5-bit exponent flushes products' inputs below 6e-8 to zero, which bf16's 8 bits do not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// Everything in f32.
    #[default]
    F32,
    /// bf16 matrix products.
    Bf16,
    /// f16 matrix products.
    F16,
}

impl std::str::FromStr for Precision {
    type Err = String;

    /// "f32", "bf16" or "f16".
    fn from_str(name: &str) -> Result<Self, String> {
        match name {
            "f32" => Ok(Self::F32),
            "bf16" => Ok(Self::Bf16),
            "f16" => Ok(Self::F16),
            _ => Err(format!("{name:?} is not f32, bf16 or f16")),
        }
    }
}

impl Precision {
    /// The name it parses from.
    pub fn name(&self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::F16 => "f16",
        }
    }

    /// The dtype the matrix products' inputs are lowered to; `None` in f32.
    pub fn half(&self) -> Option<FloatDType> {
        match self {
            Self::F32 => None,
            Self::Bf16 => Some(FloatDType::BF16),
            Self::F16 => Some(FloatDType::F16),
        }
    }
}

/// What one trainable layer left on the tape (ghost mode). Each variant's doc describes its
/// fields (parameter ids, the layer's input activation, and the probe on its output).
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub enum Record<AB: AutodiffBackend> {
    /// y = a W (+ b) on a sequence: a is [B, T, d_in] (in the compute dtype), the probe
    /// [B, T, d_out] (f32); `shared` names an input other Linear layers read too ([`Shared`]).
    Linear {
        weight: ParamId,
        bias: Option<ParamId>,
        input: Tensor<Inner<AB>, 3>,
        shared: Option<usize>,
        probe: Tensor<AB, 3>,
    },
    /// y = x̂ ⊙ γ + β: x̂ is the normalised input [B, T, d].
    LayerNorm { gamma: ParamId, beta: ParamId, normalized: Tensor<Inner<AB>, 3>, probe: Tensor<AB, 3> },
    /// y = table[tokens]: tokens [B, T].
    Embedding { table: ParamId, tokens: Tensor<Inner<AB>, 2, Int>, probe: Tensor<AB, 3> },
    /// y = x + P with a free parameter P of shape [T, d] shared by every example.
    Free { param: ParamId, probe: Tensor<AB, 3> },
}

/// Weights in half precision, cast once per step and shared by its micro-batches (a step has
/// one precision): in ghost mode weights
/// are constants, so casting them per micro-batch would repeat the same pass over every
/// weight (on a GPU, one kernel and one P-sized allocation per weight per micro-batch).
#[derive(Debug)]
pub struct LoweredWeights<B: Backend>(std::sync::Mutex<HashMap<(ParamId, FloatDType), Tensor<B, 1>>>);

impl<B: Backend> Default for LoweredWeights<B> {
    fn default() -> Self {
        Self(std::sync::Mutex::default())
    }
}

impl<B: Backend> Clone for LoweredWeights<B> {
    fn clone(&self) -> Self {
        Self(std::sync::Mutex::new(self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()))
    }
}

impl<B: Backend> LoweredWeights<B> {
    /// Weight `id` in `dtype`, cast on first use (keyed by both, so a cache reused at another
    /// precision never hands out the other dtype's weights).
    fn get(&self, params: &ParamSet<B>, id: ParamId, dtype: FloatDType) -> Tensor<B, 1> {
        let mut lowered = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        lowered
            .entry((id, dtype))
            .or_insert_with(|| {
                counters::count(|c| c.weight_casts += 1);
                params.value(id).cast(dtype)
            })
            .clone()
    }
}

/// An activation that several Linear layers read (q, k and v of a self-attention; k and v of
/// every cross-attention over one memory), made by [`Tape::share`]: the ghost form computes its
/// Gram matrix a·aᵀ once for all of them (an encoder block's q, k and v: 2 of its 12 Gram
/// products saved).
#[derive(Debug, Clone)]
pub struct Shared<AB: AutodiffBackend> {
    tensor: Tensor<AB, 3>,
    key: usize,
}

impl<AB: AutodiffBackend> Shared<AB> {
    /// The activation.
    pub fn tensor(&self) -> &Tensor<AB, 3> {
        &self.tensor
    }
}

/// Records one forward pass over a micro-batch.
#[derive(Debug)]
pub struct Tape<'p, AB: AutodiffBackend> {
    mode: Mode,
    precision: Precision,
    params: &'p ParamSet<Inner<AB>>,
    lowered: Option<&'p LoweredWeights<Inner<AB>>>,
    records: Vec<Record<AB>>,
    leaves: HashMap<ParamId, Tensor<AB, 1>>,
}

impl<'p, AB: AutodiffBackend> Tape<'p, AB> {
    /// A fresh tape over `params`.
    pub fn new(mode: Mode, params: &'p ParamSet<Inner<AB>>) -> Self {
        Self { mode, precision: Precision::F32, params, lowered: None, records: Vec::new(), leaves: HashMap::new() }
    }

    /// The same tape reading its half-precision weights from `lowered` (ghost mode; the step's
    /// cache).
    pub fn with_lowered(self, lowered: &'p LoweredWeights<Inner<AB>>) -> Self {
        Self { lowered: Some(lowered), ..self }
    }

    /// The same tape computing its matrix products in `precision`.
    pub fn with_precision(self, precision: Precision) -> Self {
        Self { precision, ..self }
    }

    /// `t` in the compute dtype (no-op in f32).
    fn lower<const D: usize>(&self, t: Tensor<AB, D>) -> Tensor<AB, D> {
        match self.precision.half() {
            None => t,
            Some(dtype) => {
                counters::count(|c| c.activation_casts += 1);
                t.cast(dtype)
            }
        }
    }

    /// `t` back in f32 (no-op in f32).
    fn widen<const D: usize>(&self, t: Tensor<AB, D>) -> Tensor<AB, D> {
        match self.precision.half() {
            None => t,
            Some(_) => {
                counters::count(|c| c.activation_casts += 1);
                t.cast(FloatDType::F32)
            }
        }
    }

    /// a · b in the compute dtype, returned in f32 (attention's parameter-free products).
    pub fn matmul<const D: usize>(&self, a: Tensor<AB, D>, b: Tensor<AB, D>) -> Tensor<AB, D> {
        self.widen(self.lower(a).matmul(self.lower(b)))
    }

    /// The dtype of its matrix products.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The tape's mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The parameter set the tape reads.
    pub fn params(&self) -> &'p ParamSet<Inner<AB>> {
        self.params
    }

    /// A parameter reshaped to `D` dims: a constant in ghost mode, an autodiff leaf in plain mode.
    fn param<const D: usize>(&mut self, id: ParamId) -> Tensor<AB, D> {
        let shape: [usize; D] = self.params.spec(id).shape.clone().try_into().expect("parameter rank");
        let flat = match self.mode {
            Mode::Ghost | Mode::Frozen => Tensor::from_inner(self.params.value(id)),
            Mode::Plain => {
                let params = self.params;
                self.leaves.entry(id).or_insert_with(|| Tensor::from_inner(params.value(id)).require_grad()).clone()
            }
        };
        flat.reshape(shape)
    }

    /// A linear layer's weight in the compute dtype: from the step's cache when there is one
    /// (ghost mode: a constant), else cast here (plain mode: the cast is on the graph).
    fn weight(&mut self, id: ParamId) -> Tensor<AB, 2> {
        match (self.mode, self.precision.half(), self.lowered) {
            (_, None, _) => self.param(id),
            (Mode::Ghost, Some(dtype), Some(lowered)) => {
                let shape: [usize; 2] = self.params.spec(id).shape.clone().try_into().expect("weight rank");
                Tensor::from_inner(lowered.get(self.params, id, dtype)).reshape(shape)
            }
            (_, Some(dtype), _) => {
                counters::count(|c| c.weight_casts += 1);
                self.param::<2>(id).cast(dtype)
            }
        }
    }

    /// y + c for a parameter term c broadcast over y's leading dimensions ([1, 1, d] or
    /// [1, T, d]; none for a layer without one), and in ghost mode the probe whose gradient is
    /// y's: the broadcast c itself as a leaf of y's shape (a stride-0 view, so no tensor is
    /// filled and no second add made; c is a constant there), else a zero leaf added to y.
    fn probed(&self, y: Tensor<AB, 3>, c: Option<Tensor<AB, 3>>) -> (Tensor<AB, 3>, Option<Tensor<AB, 3>>) {
        match (self.mode, c) {
            (Mode::Ghost, Some(c)) => {
                let probe = Tensor::<AB, 3>::from_inner(c.expand(y.dims()).inner()).require_grad();
                (y + probe.clone(), Some(probe))
            }
            (Mode::Ghost, None) => {
                let probe = Tensor::<AB, 3>::zeros(y.dims(), &y.device()).require_grad();
                (y + probe.clone(), Some(probe))
            }
            (Mode::Plain | Mode::Frozen, Some(c)) => (y + c, None),
            (Mode::Plain | Mode::Frozen, None) => (y, None),
        }
    }

    /// `x` as an input that several Linear layers read ([`Shared`]).
    pub fn share(&mut self, x: Tensor<AB, 3>) -> Shared<AB> {
        // Unique in the process, not per tape: a `Shared` carried to another tape (a mistake)
        // can then never name another input's Gram matrix.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        Shared { tensor: x, key: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) }
    }

    /// y = x W + b for x of shape [B, T, d_in].
    pub fn linear(&mut self, weight: ParamId, bias: Option<ParamId>, x: Tensor<AB, 3>) -> Tensor<AB, 3> {
        self.linear_keyed(weight, bias, x, None)
    }

    /// y = x W + b for a shared x ([`Tape::share`]).
    pub fn linear_shared(&mut self, weight: ParamId, bias: Option<ParamId>, x: &Shared<AB>) -> Tensor<AB, 3> {
        self.linear_keyed(weight, bias, x.tensor.clone(), Some(x.key))
    }

    fn linear_keyed(
        &mut self,
        weight: ParamId,
        bias: Option<ParamId>,
        x: Tensor<AB, 3>,
        shared: Option<usize>,
    ) -> Tensor<AB, 3> {
        let w = self.weight(weight);
        // One [B·T, d_in] × [d_in, d_out] gemm: far faster than B broadcast matmuls.
        let [batch, t, d_in] = x.dims();
        let d_out = w.dims()[1];
        let x = self.lower(x);
        let y = self.widen(x.clone().reshape([batch * t, d_in]).matmul(w).reshape([batch, t, d_out]));
        let b = bias.map(|b| self.param::<1>(b).unsqueeze::<3>());
        let (y, probe) = self.probed(y, b);
        if let Some(probe) = probe {
            self.records.push(Record::Linear { weight, bias, input: x.inner(), shared, probe });
        }
        y
    }

    /// LayerNorm over the last dimension with learned γ, β.
    pub fn layer_norm(&mut self, gamma: ParamId, beta: ParamId, x: Tensor<AB, 3>, eps: f64) -> Tensor<AB, 3> {
        let normalized = crate::fused::layer_norm(x, eps);
        let y = normalized.clone() * self.param::<1>(gamma).unsqueeze::<3>();
        let b = self.param::<1>(beta).unsqueeze::<3>();
        let (y, probe) = self.probed(y, Some(b));
        if let Some(probe) = probe {
            self.records.push(Record::LayerNorm { gamma, beta, normalized: normalized.inner(), probe });
        }
        y
    }

    /// Rows of the embedding table for tokens [B, T].
    pub fn embedding(&mut self, table: ParamId, tokens: Tensor<AB, 2, Int>) -> Tensor<AB, 3> {
        let [b, t] = tokens.dims();
        let w: Tensor<AB, 2> = self.param(table);
        let d = w.dims()[1];
        let y = w.select(0, tokens.clone().reshape([b * t])).reshape([b, t, d]);
        let (y, probe) = self.probed(y, None);
        if let Some(probe) = probe {
            self.records.push(Record::Embedding { table, tokens: tokens.inner(), probe });
        }
        y
    }

    /// x + P for a free parameter P of shape [T, d] (learned positions), added to every example.
    pub fn add_free(&mut self, param: ParamId, x: Tensor<AB, 3>) -> Tensor<AB, 3> {
        let p: Tensor<AB, 2> = self.param(param);
        assert_eq!(p.dims()[0], x.dims()[1], "free parameter {} has the wrong length", self.params.spec(param).name);
        let (y, probe) = self.probed(x, Some(p.unsqueeze::<3>()));
        if let Some(probe) = probe {
            self.records.push(Record::Free { param, probe });
        }
        y
    }

    /// The records left by a ghost-mode forward.
    pub fn into_records(self) -> Vec<Record<AB>> {
        self.records
    }

    /// The autodiff leaves created by a plain-mode forward.
    pub fn into_leaves(self) -> HashMap<ParamId, Tensor<AB, 1>> {
        self.leaves
    }
}
