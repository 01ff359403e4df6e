//! Transformer building blocks whose trainable layers all go through the [`Tape`], so the
//! ClipEngine sees every parameter.

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, Tensor};

use crate::clip::{Precision, Shared, Tape};
use crate::params::{Init, ParamId, ParamSet};

/// Standard deviation of weight initialisation.
pub const INIT_STD: f64 = 0.02;
/// LayerNorm ε.
pub const LN_EPS: f64 = 1e-5;

/// y = x W + b, W of shape [d_in, d_out].
#[derive(Debug, Clone, Copy)]
pub struct Linear {
    weight: ParamId,
    bias: ParamId,
}

impl Linear {
    /// Registers `name.weight` and `name.bias`.
    pub fn new<B: Backend>(ps: &mut ParamSet<B>, name: &str, d_in: usize, d_out: usize) -> Self {
        Self {
            weight: ps.add(format!("{name}.weight"), &[d_in, d_out], Init::Normal(INIT_STD)),
            bias: ps.add(format!("{name}.bias"), &[d_out], Init::Zeros),
        }
    }

    /// Applies the layer to [B, T, d_in].
    pub fn forward<AB: AutodiffBackend>(&self, tape: &mut Tape<'_, AB>, x: Tensor<AB, 3>) -> Tensor<AB, 3> {
        tape.linear(self.weight, Some(self.bias), x)
    }

    /// Applies the layer to an input other layers read too.
    pub fn forward_shared<AB: AutodiffBackend>(&self, tape: &mut Tape<'_, AB>, x: &Shared<AB>) -> Tensor<AB, 3> {
        tape.linear_shared(self.weight, Some(self.bias), x)
    }
}

/// LayerNorm over the last dimension.
#[derive(Debug, Clone, Copy)]
pub struct LayerNorm {
    gamma: ParamId,
    beta: ParamId,
}

impl LayerNorm {
    /// Registers `name.gamma` and `name.beta`.
    pub fn new<B: Backend>(ps: &mut ParamSet<B>, name: &str, d: usize) -> Self {
        Self {
            gamma: ps.add(format!("{name}.gamma"), &[d], Init::Ones),
            beta: ps.add(format!("{name}.beta"), &[d], Init::Zeros),
        }
    }

    /// Normalises [B, T, d].
    pub fn forward<AB: AutodiffBackend>(&self, tape: &mut Tape<'_, AB>, x: Tensor<AB, 3>) -> Tensor<AB, 3> {
        tape.layer_norm(self.gamma, self.beta, x, LN_EPS)
    }
}

/// Multi-head attention; keys and values from `memory` (cross) or from the input (self).
#[derive(Debug, Clone, Copy)]
pub struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    heads: usize,
}

impl Attention {
    /// Registers q, k, v, o projections of width `d`.
    pub fn new<B: Backend>(ps: &mut ParamSet<B>, name: &str, d: usize, heads: usize) -> Self {
        assert!(d.is_multiple_of(heads), "width {d} is not divisible by {heads} heads");
        Self {
            q: Linear::new(ps, &format!("{name}.q"), d, d),
            k: Linear::new(ps, &format!("{name}.k"), d, d),
            v: Linear::new(ps, &format!("{name}.v"), d, d),
            o: Linear::new(ps, &format!("{name}.o"), d, d),
            heads,
        }
    }

    fn split<B: Backend>(&self, x: Tensor<B, 3>) -> Tensor<B, 4> {
        let [b, t, d] = x.dims();
        x.reshape([b, t, self.heads, d / self.heads]).swap_dims(1, 2)
    }

    /// Attends from x [B, T, d] to `memory` [B, S, d] (x itself when None), causally if asked.
    pub fn forward<AB: AutodiffBackend>(
        &self,
        tape: &mut Tape<'_, AB>,
        x: Tensor<AB, 3>,
        memory: Option<&Shared<AB>>,
        causal: bool,
    ) -> Tensor<AB, 3> {
        let [b, t, d] = x.dims();
        let x = tape.share(x);
        let memory = memory.unwrap_or(&x);
        let s = memory.tensor().dims()[1];
        let q = self.q.forward_shared(tape, &x);
        let k = self.k.forward_shared(tape, memory);
        let v = self.v.forward_shared(tape, memory);
        let out = match tape.precision() {
            Precision::F32 => crate::fused::attention((q, k, v), self.heads, causal, |q, k, v| {
                self.unfused(tape, (q, k, v), [b, t, s, d], causal)
            }),
            _ => self.unfused(tape, (q, k, v), [b, t, s, d], causal),
        };
        self.o.forward(tape, out)
    }

    /// Attention as burn's ops, heads split and merged by reshapes, the products in the tape's
    /// precision.
    fn unfused<AB: AutodiffBackend>(
        &self,
        tape: &Tape<'_, AB>,
        (q, k, v): (Tensor<AB, 3>, Tensor<AB, 3>, Tensor<AB, 3>),
        [b, t, s, d]: [usize; 4],
        causal: bool,
    ) -> Tensor<AB, 3> {
        let (q, k, v) = (self.split(q), self.split(k), self.split(v));
        let mut scores = tape.matmul(q, k.swap_dims(2, 3)).div_scalar(((d / self.heads) as f64).sqrt());
        if causal {
            // burn's masks are inverted from their names: `tril_mask` is true strictly *above*
            // the diagonal, i.e. exactly the future positions to hide (docs/burn.md).
            let mask = Tensor::<AB, 2, Bool>::tril_mask([t, s], 0, &scores.device()).unsqueeze::<4>();
            scores = scores.mask_fill(mask.expand([b, self.heads, t, s]), -1e9);
        }
        tape.matmul(crate::fused::softmax(scores, 3), v).swap_dims(1, 2).reshape([b, t, d])
    }
}

/// A pre-norm transformer block: self-attention, optional cross-attention, GELU MLP (4×).
#[derive(Debug, Clone, Copy)]
pub struct Block {
    ln1: LayerNorm,
    attn: Attention,
    cross: Option<(LayerNorm, Attention)>,
    ln2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    causal: bool,
}

impl Block {
    /// An encoder block (bidirectional) or, with `decoder`, a causal block with cross-attention.
    pub fn new<B: Backend>(ps: &mut ParamSet<B>, name: &str, d: usize, heads: usize, decoder: bool) -> Self {
        Self {
            ln1: LayerNorm::new(ps, &format!("{name}.ln1"), d),
            attn: Attention::new(ps, &format!("{name}.attn"), d, heads),
            cross: decoder.then(|| {
                (
                    LayerNorm::new(ps, &format!("{name}.ln_cross"), d),
                    Attention::new(ps, &format!("{name}.cross"), d, heads),
                )
            }),
            ln2: LayerNorm::new(ps, &format!("{name}.ln2"), d),
            fc1: Linear::new(ps, &format!("{name}.fc1"), d, 4 * d),
            fc2: Linear::new(ps, &format!("{name}.fc2"), 4 * d, d),
            causal: decoder,
        }
    }

    /// Applies the block; `memory` is required for decoder blocks.
    pub fn forward<AB: AutodiffBackend>(
        &self,
        tape: &mut Tape<'_, AB>,
        x: Tensor<AB, 3>,
        memory: Option<&Shared<AB>>,
    ) -> Tensor<AB, 3> {
        let h = self.ln1.forward(tape, x.clone());
        let mut x = x + self.attn.forward(tape, h, None, self.causal);
        if let Some((ln, cross)) = &self.cross {
            let h = ln.forward(tape, x.clone());
            x = x + cross.forward(tape, h, memory, false);
        }
        let h = self.ln2.forward(tape, x.clone());
        let h = self.fc1.forward(tape, h);
        x.clone() + self.fc2.forward(tape, crate::fused::gelu(h))
    }
}
