//! AdamW with linear warmup then cosine decay, applied to the accountant's release.
//!
//! The update uses g = R_t / L with L the *expected* batch size (q·N), never the realised one
//! (privacy invariant 2): [`AdamW::apply_release`] takes no realised count at all. Weights and
//! optimizer state are post-processing of releases and safe to export.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::params::ParamSet;

/// Learning rate as a function of the step: linear warmup to `peak`, cosine to `floor`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    /// Peak learning rate.
    pub peak: f64,
    /// Steps of linear warmup from 0.
    pub warmup_steps: u64,
    /// Total steps; the cosine reaches `floor` here.
    pub total_steps: u64,
    /// Final learning rate.
    pub floor: f64,
}

impl Schedule {
    /// The learning rate for 0-based `step`.
    pub fn lr(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.peak * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let span = self.total_steps.saturating_sub(self.warmup_steps).max(1) as f64;
        let progress = ((step - self.warmup_steps) as f64 / span).min(1.0);
        self.floor + 0.5 * (self.peak - self.floor) * (1.0 + (std::f64::consts::PI * progress).cos())
    }
}

/// How the averaged release moves the weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Rule {
    /// AdamW (DP-Cap, ViP; fedemb's `server_optimizer: adam`).
    #[default]
    Adam,
    /// Heavy-ball SGD, m = β1·m + g, w −= lr·m (fedemb's server SGD; FedAvg with β1 = 0 and
    /// lr = 1). Second moments stay zero.
    Momentum,
}

impl Rule {
    /// The name checkpoints record.
    pub fn name(&self) -> &'static str {
        match self {
            Rule::Adam => "adam",
            Rule::Momentum => "momentum",
        }
    }
}

/// AdamW hyper-parameters (DP-Cap: β = 0.9/0.95, decoupled weight decay 0.005).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    /// Adam, or SGD with momentum β1.
    pub rule: Rule,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator stabiliser.
    pub epsilon: f64,
    /// Decoupled weight decay (multiplied by the learning rate).
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self { rule: Rule::Adam, beta1: 0.9, beta2: 0.95, epsilon: 1e-8, weight_decay: 0.005 }
    }
}

/// AdamW state over a [`ParamSet`]: first and second moments per parameter and the step count.
#[derive(Debug, Clone)]
pub struct AdamW<B: Backend> {
    /// Hyper-parameters.
    pub config: AdamWConfig,
    /// First moments, aligned with the parameter ids.
    pub m: Vec<Tensor<B, 1>>,
    /// Second moments.
    pub v: Vec<Tensor<B, 1>>,
    /// Updates applied so far.
    pub steps: u64,
}

impl<B: Backend> AdamW<B> {
    /// Zero state for `params`.
    pub fn new(config: AdamWConfig, params: &ParamSet<B>) -> Self {
        let zeros =
            || params.ids().map(|id| Tensor::zeros([params.spec(id).numel()], params.device())).collect::<Vec<_>>();
        Self { config, m: zeros(), v: zeros(), steps: 0 }
    }

    /// Applies one update from a released noisy gradient sum `release` (all parameters
    /// concatenated, P values) with g = release / `expected_batch_size`.
    pub fn apply_release(
        &mut self,
        params: &mut ParamSet<B>,
        release: Tensor<B, 1>,
        expected_batch_size: f64,
        lr: f64,
    ) {
        assert!(expected_batch_size > 0.0, "expected batch size must be positive");
        assert_eq!(release.dims()[0], params.numel(), "release length differs from the parameter count");
        let c = self.config;
        self.steps += 1;
        let t = self.steps as i32;
        let (bias1, bias2) = (1.0 - c.beta1.powi(t), 1.0 - c.beta2.powi(t));
        let mut offset = 0;
        for id in params.ids() {
            let n = params.spec(id).numel();
            let g = release.clone().slice(offset..offset + n).div_scalar(expected_batch_size);
            offset += n;
            let i = id.0;
            if c.rule == Rule::Momentum {
                self.m[i] = self.m[i].clone().mul_scalar(c.beta1) + g;
                let w = params.value(id);
                params.set(id, w.clone() - w.mul_scalar(lr * c.weight_decay) - self.m[i].clone().mul_scalar(lr));
                continue;
            }
            self.m[i] = self.m[i].clone().mul_scalar(c.beta1) + g.clone().mul_scalar(1.0 - c.beta1);
            self.v[i] = self.v[i].clone().mul_scalar(c.beta2) + g.powi_scalar(2).mul_scalar(1.0 - c.beta2);
            let step = self.m[i].clone().div_scalar(bias1) / (self.v[i].clone().div_scalar(bias2).sqrt() + c.epsilon);
            let w = params.value(id);
            params.set(id, w.clone() - w.mul_scalar(lr * c.weight_decay) - step.mul_scalar(lr));
        }
    }
}
