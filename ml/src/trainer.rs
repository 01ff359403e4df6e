//! One rank's model replica: parameters, optimizer and objective for a job, turning examples
//! into a clipped part (Σ clip_C(g_i) as P f32 values) and applying a release (g = R / L).

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};

use crate::clip::{ClipEngine, ClippedSum, Telemetry};
use crate::fed::{LocalConfig, add_clipped, batch_ranges, local_delta};
use crate::model::embedder::prototypes;
use crate::model::{CaptionBatch, Captioner, CaptionerConfig, EmbedBatch, Embedder, EmbedderConfig, Encoder, Mae};
use crate::model::{MaeBatch, MaeConfig};
use crate::optim::{AdamW, AdamWConfig, Schedule};
use crate::params::ParamSet;
use dpcap_dataset::Example;
use dpcap_dataset::WorkError;
use dpcap_dataset::tokenizer::CaptionTokenizer;

type Inner<AB> = <AB as AutodiffBackend>::InnerBackend;

/// Which objective a replica trains, as the job spec chose it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// DP-Cap.
    Caption,
    /// ViP.
    Mae,
    /// DP-FedEmb: local training per client; `head_scale` is the cosine head's softmax scale.
    FedEmb {
        /// Each client's local SGD.
        local: LocalConfig,
        /// s in s·cos(e, p_c).
        head_scale: f64,
        /// The server optimizer (SGD with momentum, or Adam) applying the averaged deltas.
        server: AdamWConfig,
    },
}

/// Which objective a job trains.
#[derive(Debug, Clone)]
pub enum Model {
    /// DP-Cap, with the tokenizer its captions go through.
    Caption(Captioner, Box<CaptionTokenizer>),
    /// ViP.
    Mae(Mae),
    /// DP-FedEmb, with its local training.
    Embed(Embedder, LocalConfig, f64),
}

impl Model {
    /// The image encoder (what the job exports).
    pub fn encoder(&self) -> &Encoder {
        match self {
            Model::Caption(m, _) => m.encoder(),
            Model::Mae(m) => m.encoder(),
            Model::Embed(m, ..) => m.encoder(),
        }
    }
}

/// What a fresh replica is made of (see [`Trainer::new`]).
#[derive(Debug, Clone)]
pub struct ReplicaConfig<'a> {
    /// A model configuration's name (`dpcap-registry`).
    pub model_name: &'a str,
    /// The objective.
    pub kind: Kind,
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
    pub fn new(replica: ReplicaConfig<'_>, device: &AB::Device) -> Result<Self, WorkError> {
        let ReplicaConfig { model_name, kind, tokenizer, seed, engine, expected_batch_size, schedule } = replica;
        let unknown = || WorkError::Spec { field: "model", reason: format!("unknown configuration {model_name:?}") };
        let mut params = ParamSet::seeded(device, seed);
        let model = if kind == Kind::Mae {
            Model::Mae(Mae::new(&mut params, MaeConfig::named(model_name).ok_or_else(unknown)?))
        } else if let Kind::FedEmb { local, head_scale, .. } = kind {
            Model::Embed(
                Embedder::new(&mut params, EmbedderConfig::named(model_name).ok_or_else(unknown)?),
                local,
                head_scale,
            )
        } else {
            let config = CaptionerConfig::named(model_name).ok_or_else(unknown)?;
            let tokenizer = tokenizer.ok_or(WorkError::Spec {
                field: "tokenizer",
                reason: "the caption objective needs a tokenizer".into(),
            })?;
            if tokenizer.vocab_size() > config.vocab {
                return Err(WorkError::Spec {
                    field: "tokenizer",
                    reason: format!(
                        "vocabulary of {} exceeds model {model_name}'s {}",
                        tokenizer.vocab_size(),
                        config.vocab
                    ),
                });
            }
            Model::Caption(Captioner::new(&mut params, config), Box::new(tokenizer))
        };
        let config = match kind {
            Kind::FedEmb { server, .. } => server,
            _ => AdamWConfig::default(),
        };
        let optimizer = AdamW::new(config, &params);
        Ok(Self { model, params, optimizer, schedule, engine, expected_batch_size })
    }

    /// P: the number of values in a part and in a release.
    pub fn dim(&self) -> usize {
        self.params.numel()
    }

    /// Σ_i clip_C(g_i) over `examples` as P values, with non-DP telemetry. No examples: zeros.
    pub fn clipped_part(&self, examples: &[Example]) -> Result<(Vec<f32>, Telemetry), WorkError> {
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
    pub fn accumulate(&self, part: &mut ClippedSum<Inner<AB>>, examples: &[Example]) -> Result<(), WorkError> {
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
                        .map_err(|err| WorkError::Data(format!("example {}: {err}", e.key)))?;
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
                return Err(WorkError::Protocol("fedemb trains clients, not examples (accumulate_client)".into()));
            }
        }
        Ok(())
    }

    /// DP-FedEmb: trains one client (all its examples, labelled with their identity) from the
    /// current weights and adds its clipped delta to `part`. Returns ‖u‖ before clipping.
    pub fn accumulate_client(&self, part: &mut ClippedSum<Inner<AB>>, examples: &[Example]) -> Result<f64, WorkError> {
        let Model::Embed(model, local, scale) = &self.model else {
            return Err(WorkError::Protocol("only fedemb trains clients".into()));
        };
        if examples.is_empty() {
            return Ok(0.0);
        }
        // The client's own classes, numbered in order of first appearance.
        let mut classes: Vec<u32> = Vec::new();
        let mut labels = Vec::with_capacity(examples.len());
        for e in examples {
            let label = e.label.ok_or_else(|| {
                WorkError::Data(format!("example {} has no identity label (KEY.json `label`)", e.key))
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
    pub fn finish_part(&self, mut part: ClippedSum<Inner<AB>>) -> Result<(Vec<f32>, Telemetry), WorkError> {
        part.settle();
        let values = part.sum.flatten().into_data().into_vec::<f32>().map_err(|e| WorkError::Data(format!("{e:?}")))?;
        Ok((values, part.telemetry))
    }

    /// Applies the release of ledger step `step`: AdamW on R / L at the schedule's rate.
    pub fn apply(&mut self, release: Vec<f32>, step: u64) -> Result<(), WorkError> {
        if release.len() != self.dim() {
            return Err(WorkError::Protocol(format!(
                "release of step {step} has {} values, the model {}",
                release.len(),
                self.dim()
            )));
        }
        let n = release.len();
        let release = Tensor::from_data(TensorData::new(release, [n]), self.params.device());
        let lr = self.schedule.lr(step);
        self.optimizer.apply_release(&mut self.params, release, self.expected_batch_size, lr);
        Ok(())
    }
}
