//! A model's trainable parameters as one flat, named list on the inner (non-autodiff) backend.
//! Flat storage makes the optimizer, safetensors export and the accountant's P-vector
//! (all parameters concatenated in order) the same simple loop.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};

/// Index of a parameter in its [`ParamSet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ParamId(pub usize);

/// A parameter's name (dotted path) and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamSpec {
    /// Dotted path, e.g. `encoder.blocks.0.attn.q.weight`.
    pub name: String,
    /// Shape; Linear weights are `[d_in, d_out]` (y = x W + b).
    pub shape: Vec<usize>,
}

impl ParamSpec {
    /// Number of scalars.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// How a parameter is initialised.
#[derive(Debug, Clone, Copy)]
pub enum Init {
    /// N(0, std²).
    Normal(f64),
    /// All zeros (biases, LayerNorm β).
    Zeros,
    /// All ones (LayerNorm γ).
    Ones,
}

/// Every trainable parameter of a model, flat, in registration order.
#[derive(Debug, Clone)]
pub struct ParamSet<B: Backend> {
    specs: Vec<ParamSpec>,
    values: Vec<Tensor<B, 1>>,
    device: B::Device,
    materialized: bool,
    seed: u64,
}

impl<B: Backend> ParamSet<B> {
    /// An empty set on `device` whose initial values come from seed 0.
    pub fn new(device: &B::Device) -> Self {
        Self::seeded(device, 0)
    }

    /// An empty set whose initial values are a pure function of `seed` and each parameter's
    /// position: every rank of a job, on any device and in any process, starts identical.
    pub fn seeded(device: &B::Device, seed: u64) -> Self {
        Self { specs: Vec::new(), values: Vec::new(), device: device.clone(), materialized: true, seed }
    }

    /// A set that records names and shapes only (no memory): for counting the parameters of
    /// large configurations. Reading a value from it is a programming error.
    pub fn specs_only(device: &B::Device) -> Self {
        Self { materialized: false, ..Self::new(device) }
    }

    /// Registers a parameter and returns its id.
    pub fn add(&mut self, name: impl Into<String>, shape: &[usize], init: Init) -> ParamId {
        let spec = ParamSpec { name: name.into(), shape: shape.to_vec() };
        let n = spec.numel();
        self.specs.push(spec);
        if !self.materialized {
            return ParamId(self.specs.len() - 1);
        }
        let value = match init {
            Init::Normal(std) => {
                let values = normal_values(self.seed, self.specs.len() as u64, n, std);
                Tensor::from_data(TensorData::new(values, [n]), &self.device)
            }
            Init::Zeros => Tensor::zeros([n], &self.device),
            Init::Ones => Tensor::ones([n], &self.device),
        };
        self.values.push(value);
        ParamId(self.values.len() - 1)
    }

    /// The flat value of a parameter.
    pub fn value(&self, id: ParamId) -> Tensor<B, 1> {
        assert!(self.materialized, "parameter values of a specs-only set were read");
        self.values[id.0].clone()
    }

    /// Replaces a parameter's flat value (same length).
    pub fn set(&mut self, id: ParamId, value: Tensor<B, 1>) {
        debug_assert_eq!(value.dims()[0], self.specs[id.0].numel());
        self.values[id.0] = value;
    }

    /// Name and shape of a parameter.
    pub fn spec(&self, id: ParamId) -> &ParamSpec {
        &self.specs[id.0]
    }

    /// Number of parameters (tensors).
    pub fn len(&self) -> usize {
        self.specs.len()
    }

    /// True when no parameter is registered.
    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    /// Total number of scalars P.
    pub fn numel(&self) -> usize {
        self.specs.iter().map(ParamSpec::numel).sum()
    }

    /// Ids in registration order.
    pub fn ids(&self) -> impl Iterator<Item = ParamId> + use<B> {
        (0..self.specs.len()).map(ParamId)
    }

    /// The device the parameters live on.
    pub fn device(&self) -> &B::Device {
        &self.device
    }
}

/// `n` draws of N(0, std²) from the ChaCha20 stream `stream` of `seed` (Box–Muller).
pub(crate) fn normal_values(seed: u64, stream: u64, n: usize, std: f64) -> Vec<f32> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    let mut unit = || ((rng.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64;
    let mut out = Vec::with_capacity(n + 1);
    while out.len() < n {
        let (radius, angle) = ((-2.0 * unit().ln()).sqrt() * std, std::f64::consts::TAU * unit());
        out.push((radius * angle.cos()) as f32);
        out.push((radius * angle.sin()) as f32);
    }
    out.truncate(n);
    out
}
