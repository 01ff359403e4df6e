//! One rank's model replica: parameters, optimizer and objective for a job, turning examples
//! into a clipped part (Σ clip_C(g_i) as P f32 values) and applying a release (g = R / L).

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};

use crate::clip::{ClipEngine, ClippedSum, Telemetry};
use crate::error::MlError;
use crate::fed::{LocalConfig, add_clipped, batch_ranges, local_delta};
use crate::model::embedder::prototypes;
use crate::model::{CaptionBatch, Captioner, CaptionerConfig, EmbedBatch, Embedder, EmbedderConfig, Encoder, Mae};
use crate::model::{MaeBatch, MaeConfig};
use crate::optim::{AdamW, AdamWConfig, Rule, Schedule};
use crate::params::ParamSet;
use dpcap_dataset::Example;
use dpcap_dataset::tokenizer::CaptionTokenizer;
use dpcap_registry::{Family, FedEmb, ServerOptimizer};

type Inner<AB> = <AB as AutodiffBackend>::InnerBackend;

/// DP-FedEmb's training of each client and of the server. Only an objective that trains
/// clients ([`Family::is_user_level`]) reads it; the others ignore it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FedEmbTraining {
    /// Each client's local SGD.
    pub local: LocalConfig,
    /// s in s·cos(e, p_c): the cosine head's softmax scale.
    pub head_scale: f64,
    /// The server optimizer (SGD with momentum, or Adam) applying the averaged deltas.
    pub server: AdamWConfig,
}

impl Default for FedEmbTraining {
    /// DP-FedEmb's defaults ([`FedEmb::DEFAULT`]).
    fn default() -> Self {
        FedEmb::DEFAULT.into()
    }
}

impl From<FedEmb> for FedEmbTraining {
    /// The settings as the trainer applies them: the server's optimizer as AdamW's rules.
    fn from(f: FedEmb) -> Self {
        let server = match f.server {
            ServerOptimizer::Sgd { momentum } => {
                AdamWConfig { rule: Rule::Momentum, beta1: momentum, weight_decay: 0.0, ..AdamWConfig::default() }
            }
            ServerOptimizer::Adam => AdamWConfig { weight_decay: 0.0, ..AdamWConfig::default() },
        };
        Self { local: LocalConfig::from(&f), head_scale: f.head_scale, server }
    }
}

/// A job's model: one variant per objective, each with what its training needs.
#[derive(Debug, Clone)]
pub enum Model {
    /// DP-Cap, with the tokenizer its captions go through.
    Caption(Captioner, Box<CaptionTokenizer>),
    /// ViP.
    Mae(Mae),
    /// DP-FedEmb, with its local training and head scale.
    Embed(Embedder, LocalConfig, f64),
}

impl Model {
    /// A fresh model of configuration `name` (`dpcap-registry`) for `objective`, its weights
    /// drawn into `params`. The one place an objective becomes a model: the worker, `dpctl
    /// eval` and the demo all come here. The caption objective needs `tokenizer`, whose
    /// vocabulary must fit the model's.
    pub fn new<B: Backend>(
        objective: Family,
        name: &str,
        tokenizer: Option<CaptionTokenizer>,
        fedemb: &FedEmbTraining,
        params: &mut ParamSet<B>,
    ) -> Result<Model, MlError> {
        let unknown = || MlError::Spec { field: "model", reason: format!("unknown configuration {name:?}") };
        Ok(match objective {
            Family::Mae => Model::Mae(Mae::new(params, MaeConfig::named(name).ok_or_else(unknown)?)),
            Family::Embedder => Model::Embed(
                Embedder::new(params, EmbedderConfig::named(name).ok_or_else(unknown)?),
                fedemb.local,
                fedemb.head_scale,
            ),
            Family::Captioner => {
                let config = CaptionerConfig::named(name).ok_or_else(unknown)?;
                let tokenizer = tokenizer.ok_or(MlError::Spec {
                    field: "tokenizer",
                    reason: "the caption objective needs a tokenizer".into(),
                })?;
                if tokenizer.vocab_size() > config.vocab {
                    return Err(MlError::Spec {
                        field: "tokenizer",
                        reason: format!(
                            "vocabulary of {} exceeds model {name}'s {}",
                            tokenizer.vocab_size(),
                            config.vocab
                        ),
                    });
                }
                Model::Caption(Captioner::new(params, config), Box::new(tokenizer))
            }
        })
    }

    /// The image encoder (what the job exports).
    pub fn encoder(&self) -> &Encoder {
        match self {
            Model::Caption(m, _) => m.encoder(),
            Model::Mae(m) => m.encoder(),
            Model::Embed(m, ..) => m.encoder(),
        }
    }

    /// The captioner and its tokenizer, for the objective that has them.
    pub fn captioner(&self) -> Option<(&Captioner, &CaptionTokenizer)> {
        match self {
            Model::Caption(m, tokenizer) => Some((m, tokenizer)),
            Model::Mae(_) | Model::Embed(..) => None,
        }
    }

    /// Whether a part is made of clients' clipped deltas ([`Trainer::accumulate_client`])
    /// rather than examples' clipped gradients ([`Trainer::accumulate`]).
    /// Exhaustive: a new model answers it.
    pub fn trains_clients(&self) -> bool {
        match self {
            Model::Embed(..) => true,
            Model::Caption(..) | Model::Mae(_) => false,
        }
    }
}

/// What a fresh replica is made of (see [`Trainer::new`]).
#[derive(Debug, Clone)]
pub struct ReplicaConfig<'a> {
    /// A model configuration's name (`dpcap-registry`).
    pub model_name: &'a str,
    /// The objective.
    pub objective: Family,
    /// DP-FedEmb's training (read only by an objective that trains clients).
    pub fedemb: FedEmbTraining,
    /// The caption objective's tokenizer (None for the others).
    pub tokenizer: Option<CaptionTokenizer>,
    /// The seed of the initial weights (every rank of a job uses the job's).
    pub seed: u64,
    /// Per-sample clipping: C as an L2 norm, the micro-batch, the precision.
    pub engine: ClipEngine,
    /// L = q·N, the divisor of every release (never the realised batch size).
    pub expected_batch_size: f64,
    /// The learning-rate schedule.
    pub schedule: Schedule,
}

/// A replica: identical on every rank because it starts from the same seed or checkpoint and
/// applies the same releases.
#[derive(Debug)]
pub struct Trainer<AB: AutodiffBackend> {
    /// The objective.
    pub model: Model,
    /// Trainable parameters.
    pub params: ParamSet<Inner<AB>>,
    /// AdamW state.
    pub optimizer: AdamW<Inner<AB>>,
    /// Learning-rate schedule over ledger steps.
    pub schedule: Schedule,
    /// Clipping.
    pub engine: ClipEngine,
    /// L = qN: every update divides the release by it.
    pub expected_batch_size: f64,
}

/// A batch of images as a [B, 3, side, side] tensor.
pub fn images_tensor<B: burn::tensor::backend::Backend>(
    examples: &[Example],
    side: usize,
    device: &B::Device,
) -> Tensor<B, 4> {
    let mut values: Vec<f32> = Vec::with_capacity(examples.len() * 3 * side * side);
    for e in examples {
        // The image pipeline made every example [3, side, side] for this model.
        debug_assert_eq!(e.pixels.len(), 3 * side * side, "example {} was prepared for another size", e.key);
        values.extend_from_slice(&e.pixels);
    }
    Tensor::from_data(TensorData::new(values, [examples.len(), 3, side, side]), device)
}

impl<AB: AutodiffBackend> Trainer<AB> {
    /// A fresh replica for `model_name`/`objective` with weights from `seed`.
    pub fn new(replica: ReplicaConfig<'_>, device: &AB::Device) -> Result<Self, MlError> {
        let ReplicaConfig { model_name, objective, fedemb, tokenizer, seed, engine, expected_batch_size, schedule } =
            replica;
        let mut params = ParamSet::seeded(device, seed);
        let model = Model::new(objective, model_name, tokenizer, &fedemb, &mut params)?;
        // The server applies averaged client deltas with its own optimizer.
        let config = if model.trains_clients() { fedemb.server } else { AdamWConfig::default() };
        let optimizer = AdamW::new(config, &params);
        Ok(Self { model, params, optimizer, schedule, engine, expected_batch_size })
    }

    /// P: the number of values in a part and in a release.
    pub fn dim(&self) -> usize {
        self.params.numel()
    }

    /// Σ_i clip_C(g_i) over `examples` as P values, with non-DP telemetry. No examples: zeros.
    pub fn clipped_part(&self, examples: &[Example]) -> Result<(Vec<f32>, Telemetry), MlError> {
        let mut part = self.begin_part();
        self.accumulate(&mut part, examples)?;
        self.finish_part(part)
    }

    /// An empty part (zeros) to stream examples into.
    pub fn begin_part(&self) -> ClippedSum<Inner<AB>> {
        ClippedSum::zeros(&self.params)
    }

    /// Adds the clipped gradients of `examples` (one micro-batch or a few) to `part`; only
    /// these examples are ever tensorised at once.
    pub fn accumulate(&self, part: &mut ClippedSum<Inner<AB>>, examples: &[Example]) -> Result<(), MlError> {
        if examples.is_empty() {
            return Ok(());
        }
        let device = self.params.device().clone();
        let side = self.model.encoder().config().image;
        let images = images_tensor::<AB>(examples, side, &device);
        match &self.model {
            Model::Caption(model, tokenizer) => {
                let seq = model.config().seq;
                let mut tokens = Vec::with_capacity(examples.len() * seq);
                for e in examples {
                    let ids = tokenizer
                        .encode(&e.caption, seq)
                        .map_err(|source| MlError::Caption { key: e.key.clone(), source })?;
                    tokens.extend(ids);
                }
                let tokens = Tensor::<AB, 2, Int>::from_data(TensorData::new(tokens, [examples.len(), seq]), &device);
                self.engine.accumulate(model, &self.params, &CaptionBatch { images, tokens }, part);
            }
            Model::Mae(model) => {
                let batch = MaeBatch::new(images, model.encoder().config().patches());
                self.engine.accumulate(model, &self.params, &batch, part);
            }
            Model::Embed(..) => {
                return Err(MlError::Unsupported("fedemb trains clients, not examples (accumulate_client)"));
            }
        }
        Ok(())
    }

    /// DP-FedEmb: trains one client (all its examples, labelled with their identity) from the
    /// current weights and adds its clipped delta to `part`. Returns ‖u‖ before clipping.
    pub fn accumulate_client(&self, part: &mut ClippedSum<Inner<AB>>, examples: &[Example]) -> Result<f64, MlError> {
        let Model::Embed(model, local, scale) = &self.model else {
            return Err(MlError::Unsupported("only fedemb trains clients"));
        };
        if examples.is_empty() {
            return Ok(0.0);
        }
        // The client's own classes, numbered in order of first appearance.
        let mut classes: Vec<u32> = Vec::new();
        let mut labels = Vec::with_capacity(examples.len());
        for e in examples {
            let label = e.label.ok_or_else(|| {
                MlError::Example(format!("example {} has no identity label (KEY.json `label`)", e.key))
            })?;
            let class = classes.iter().position(|&c| c == label).unwrap_or_else(|| {
                classes.push(label);
                classes.len() - 1
            });
            labels.push(class);
        }
        let device = self.params.device().clone();
        let side = model.encoder().config().image;
        let images = images_tensor::<AB>(examples, side, &device);
        let label_tensor = Tensor::<AB, 1, Int>::from_data(
            TensorData::new(labels.iter().map(|&c| c as i64).collect::<Vec<_>>(), [labels.len()]),
            &device,
        );
        let ranges = batch_ranges(examples.len(), local.batch);
        let client = local_delta::<AB, _>(model, &self.params, local, |weights| {
            // The head is rebuilt from the current local backbone at every pass; it stays here.
            let embeddings = model.embeddings::<AB>(weights, images.clone());
            let head = Tensor::from_inner(prototypes(embeddings, &labels, classes.len()));
            let whole =
                EmbedBatch { images: images.clone(), labels: label_tensor.clone(), prototypes: head, scale: *scale };
            ranges.iter().map(|r| crate::clip::Objective::<AB>::slice(model, &whole, r.clone())).collect()
        });
        Ok(add_clipped(part, client, self.engine.clipping_norm))
    }

    /// The part as P values (the step's one device-to-host copy of P values) and its telemetry
    /// (under [`crate::clip::Reads::PerPart`], the one read of every micro-batch's norms).
    pub fn finish_part(&self, mut part: ClippedSum<Inner<AB>>) -> Result<(Vec<f32>, Telemetry), MlError> {
        part.settle();
        let values = part.sum.flatten().into_data().into_vec::<f32>().map_err(MlError::ReadBack)?;
        Ok((values, part.telemetry))
    }

    /// Applies the release of ledger step `step`: AdamW on R / L at the schedule's rate.
    pub fn apply(&mut self, release: Vec<f32>, step: u64) -> Result<(), MlError> {
        if release.len() != self.dim() {
            return Err(MlError::ReleaseLength { step, values: release.len(), dim: self.dim() });
        }
        let n = release.len();
        let release = Tensor::from_data(TensorData::new(release, [n]), self.params.device());
        let lr = self.schedule.lr(step);
        self.optimizer.apply_release(&mut self.params, release, self.expected_batch_size, lr);
        Ok(())
    }
}
