//! The evaluation suite: every test of one model on held-out synthetic scenes, as one
//! serialisable report. Likelihood tests (zero-shot, ARO relation and attribution, layout) and
//! caption slots need a captioner; the probes need only the encoder, so an MAE gets those.
//! Everything is batched (each image is encoded once per test): `micro` at the default sizes
//! takes a few seconds on two cores.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::tensor::backend::AutodiffBackend;
use dpcap_dataset::pipeline::Pipeline;
use dpcap_dataset::synth::CLASSES;
use dpcap_dataset::tokenizer::CaptionTokenizer;
use dpcap_ml::eval::contrast::{self, Contrast};
use dpcap_ml::eval::heldout::{self, balanced_singles, pair_scenes, probe_singles, render_pairs};
use dpcap_ml::eval::slots::{self, SlotAccuracy};
use dpcap_ml::eval::{self, ModelScorer, zero_shot};
use dpcap_ml::model::Captioner;
use dpcap_ml::params::ParamSet;
use dpcap_ml::trainer::Model;
use serde::Serialize;

use super::probe;

type Inner<AB> = <AB as AutodiffBackend>::InnerBackend;

/// Side of the rendered scenes: the synthetic training data's (the pipeline resizes to the
/// model's side, as it did for training).
const RENDER_SIDE: u32 = 32;

/// Shots per class of the few-shot probes.
pub const SHOTS: [usize; 3] = [1, 5, 10];

/// How much to evaluate.
#[derive(Debug, Clone)]
pub struct SuiteOptions {
    /// Held-out images per likelihood test and for caption slots (zero-shot rounds down to a
    /// multiple of 12, the contrasts to an even number).
    pub images: usize,
    /// Held-out single-shape images for the probes (2/3 fit, 1/3 score).
    pub probe_images: usize,
    /// Draws averaged by each few-shot probe.
    pub few_shot_draws: usize,
    /// Generated captions kept in the report.
    pub samples: usize,
    /// Seed of the synthetic generator: the training dataset's (`dpctl dataset synth --seed`).
    pub seed: u64,
}

impl Default for SuiteOptions {
    fn default() -> Self {
        Self { images: 600, probe_images: 3000, few_shot_draws: 5, samples: 4, seed: 0 }
    }
}

impl SuiteOptions {
    /// Refuses sizes too small for a test to mean anything, naming the option as `flags`
    /// (images, probe images) call it.
    pub fn check(&self, [images, probe_images]: [&str; 2]) -> Result<()> {
        if self.images < CLASSES {
            bail!("{images} {}: must be at least {CLASSES} (one zero-shot image per class)", self.images);
        }
        if self.probe_images < 30 * CLASSES {
            bail!(
                "{probe_images} {}: must be at least {} (enough per class for 10-shot probes)",
                self.probe_images,
                30 * CLASSES
            );
        }
        Ok(())
    }
}

/// A generated caption next to the scene's own.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CaptionSample {
    /// The held-out scene's caption.
    pub reference: String,
    /// Greedy decoding.
    pub generated: String,
}

/// How many held-out images each test used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SetSizes {
    /// Zero-shot (class-balanced).
    pub zero_shot: usize,
    /// Each contrast (mirrored pairs).
    pub contrast: usize,
    /// Caption slots.
    pub slots: usize,
    /// Probes.
    pub probe: usize,
}

/// Every metric of one model. Caption metrics are `None` for a model without a decoder.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SuiteReport {
    /// Zero-shot classification accuracy (12 classes, chance 1/12).
    pub zero_shot: Option<f64>,
    /// ARO relation: true caption vs objects exchanged (chance 0.5).
    pub aro_relation: Option<f64>,
    /// ARO attribution: true caption vs colours exchanged (chance 0.5).
    pub aro_attribution: Option<f64>,
    /// Layout: "above" vs "left of" (chance 0.5).
    pub layout: Option<f64>,
    /// Greedy captions parsed slot by slot.
    pub caption_slot_accuracy: Option<SlotAccuracy>,
    /// Linear probe accuracy (chance about 1/12).
    pub probe_accuracy: f64,
    /// 1-shot probe accuracy.
    pub few_shot_1: f64,
    /// 5-shot probe accuracy.
    pub few_shot_5: f64,
    /// 10-shot probe accuracy.
    pub few_shot_10: f64,
    /// The first generated captions of the slot set.
    pub captions: Vec<CaptionSample>,
    /// Images per test.
    pub images: SetSizes,
    /// Wall time of the whole suite.
    pub seconds: f64,
}

/// The caption metrics of one captioner.
struct CaptionMetrics {
    zero_shot: f64,
    contrasts: [f64; 3],
    slots: SlotAccuracy,
    samples: Vec<CaptionSample>,
}

fn caption_metrics<AB: AutodiffBackend>(
    model: &Captioner,
    params: &ParamSet<Inner<AB>>,
    tokenizer: &CaptionTokenizer,
    pipeline: &Pipeline,
    options: &SuiteOptions,
    sizes: &SetSizes,
) -> Result<CaptionMetrics> {
    let scorer = ModelScorer::<AB> { model, params, tokenizer };
    let singles = heldout::prepare(&balanced_singles(options.seed, sizes.zero_shot / CLASSES, RENDER_SIDE), pipeline)?;
    let zero_shot = zero_shot::accuracy(&scorer, &singles).context("zero-shot classification")?;
    let mut contrasts = [0.0; 3];
    for (out, c) in contrasts.iter_mut().zip(Contrast::ALL) {
        let scenes = c.scenes(options.seed, sizes.contrast / 2);
        let images = heldout::prepare(&render_pairs(&scenes, RENDER_SIDE), pipeline)?;
        *out = contrast::accuracy(&scorer, c, &scenes, &images).with_context(|| format!("{c:?} contrast"))?;
    }
    let scenes = pair_scenes(options.seed, sizes.slots);
    let images = heldout::prepare(&render_pairs(&scenes, RENDER_SIDE), pipeline)?;
    let generated = eval::greedy_captions::<AB>(model, params, &images, tokenizer.bos_eos())
        .iter()
        .map(|ids| tokenizer.decode(&ids[1..]))
        .collect::<Result<Vec<_>, _>>()?;
    let truth: Vec<_> = scenes.iter().map(|s| s.description).collect();
    let slots = slots::accuracy(&generated, &truth)?;
    let samples = images
        .iter()
        .zip(&generated)
        .take(options.samples)
        .map(|(e, g)| CaptionSample { reference: e.caption.clone(), generated: g.clone() })
        .collect();
    Ok(CaptionMetrics { zero_shot, contrasts, slots, samples })
}

/// Runs every test that `model` supports with weights `params`.
pub fn run_suite<AB: AutodiffBackend>(
    model: &Model,
    params: &ParamSet<Inner<AB>>,
    options: &SuiteOptions,
) -> Result<SuiteReport> {
    options.check(["images", "probe_images"])?;
    let started = Instant::now();
    let encoder = model.encoder();
    let pipeline = Pipeline::clip(encoder.config().image as u32)?;
    let sizes = SetSizes {
        zero_shot: options.images / CLASSES * CLASSES,
        contrast: options.images / 2 * 2,
        slots: options.images,
        probe: options.probe_images,
    };
    let probe_set = heldout::prepare(&probe_singles(options.seed, sizes.probe, RENDER_SIDE), &pipeline)?;
    let labels: Vec<u32> = probe_set.iter().map(|e| e.label.unwrap_or(0)).collect();
    let features = eval::features::<AB>(encoder, params, &probe_set);
    let probe_accuracy = probe::accuracy(&features, &labels).context("linear probe")?;
    let mut few_shot = [0.0; SHOTS.len()];
    for (out, shots) in few_shot.iter_mut().zip(SHOTS) {
        *out = probe::few_shot_accuracy(&features, &labels, shots, options.few_shot_draws, options.seed)?;
    }
    let captions = match model.captioner() {
        Some((captioner, tokenizer)) => {
            Some(caption_metrics::<AB>(captioner, params, tokenizer, &pipeline, options, &sizes)?)
        }
        None => None,
    };
    Ok(SuiteReport {
        zero_shot: captions.as_ref().map(|c| c.zero_shot),
        aro_relation: captions.as_ref().map(|c| c.contrasts[0]),
        aro_attribution: captions.as_ref().map(|c| c.contrasts[1]),
        layout: captions.as_ref().map(|c| c.contrasts[2]),
        caption_slot_accuracy: captions.as_ref().map(|c| c.slots),
        probe_accuracy,
        few_shot_1: few_shot[0],
        few_shot_5: few_shot[1],
        few_shot_10: few_shot[2],
        captions: captions.map(|c| c.samples).unwrap_or_default(),
        images: sizes,
        seconds: started.elapsed().as_secs_f64(),
    })
}
