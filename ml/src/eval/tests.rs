//! The likelihood tests' guarantees: exactly chance for image-blind scorers, 1 for an oracle,
//! deterministic for a fixed model, and scores tied to the captioner's own training loss.

use std::collections::HashMap;

use burn::tensor::{Int, Tensor, TensorData};

use super::contrast::{self, Contrast};
use super::heldout::{balanced_singles, prepare, render_pairs};
use super::likelihood::{CaptionScorer, ModelScorer, Span, TokenRow, log_likelihoods};
use super::{EvalError, greedy_captions, zero_shot};
use crate::CpuBackend;
use crate::clip::{Mode, Objective, Tape};
use crate::model::{CaptionBatch, Captioner, CaptionerConfig};
use crate::params::ParamSet;
use dpcap_dataset::Example;
use dpcap_dataset::pipeline::Pipeline;
use dpcap_dataset::synth;
use dpcap_dataset::tokenizer::CaptionTokenizer;

type Inner = <CpuBackend as burn::tensor::backend::AutodiffBackend>::InnerBackend;

fn tokenizer() -> CaptionTokenizer {
    let captions = (0..600).map(|i| synth::generate(11, i, 32).caption);
    CaptionTokenizer::train(captions, 256).unwrap()
}

fn micro(seed: u64) -> (Captioner, ParamSet<Inner>) {
    let mut params = ParamSet::seeded(&Default::default(), seed);
    let model = Captioner::new(&mut params, CaptionerConfig::named("micro").unwrap());
    (model, params)
}

fn pipeline() -> Pipeline {
    Pipeline::clip(32).unwrap()
}

/// The test sets: class-balanced singles and each contrast's mirrored pairs, as images.
struct Sets {
    singles: Vec<Example>,
    contrasts: Vec<(Contrast, Vec<synth::PairScene>, Vec<Example>)>,
}

fn sets(per_class: usize, pairs: usize) -> Sets {
    let singles = prepare(&balanced_singles(0, per_class, 32), &pipeline()).unwrap();
    let contrasts = Contrast::ALL
        .into_iter()
        .map(|c| {
            let scenes = c.scenes(0, pairs);
            let images = prepare(&render_pairs(&scenes, 32), &pipeline()).unwrap();
            (c, scenes, images)
        })
        .collect();
    Sets { singles, contrasts }
}

/// Every likelihood metric for `scorer`: zero-shot, then each contrast.
fn metrics(scorer: &dyn CaptionScorer, sets: &Sets) -> Vec<f64> {
    let mut out = vec![zero_shot::accuracy(scorer, &sets.singles).unwrap()];
    for (c, scenes, images) in &sets.contrasts {
        out.push(contrast::accuracy(scorer, *c, scenes, images).unwrap());
    }
    out
}

const CHANCE: [f64; 4] = [1.0 / 12.0, 0.5, 0.5, 0.5];

/// Scores a caption by its text alone (a hash), never looking at the image.
struct TextOnly;

impl CaptionScorer for TextOnly {
    fn score(&self, _: &[Example], rows: &[(usize, String)], span: Span) -> Result<Vec<f64>, EvalError> {
        let hash = |s: &str| s.bytes().fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
        Ok(rows.iter().map(|(_, c)| -((hash(c) % 997) as f64) - f64::from(u8::from(span == Span::Caption))).collect())
    }
}

/// Scores every caption the same.
struct Constant;

impl CaptionScorer for Constant {
    fn score(&self, _: &[Example], rows: &[(usize, String)], _: Span) -> Result<Vec<f64>, EvalError> {
        Ok(vec![-3.0; rows.len()])
    }
}

/// The real captioner, shown one blank image instead of each row's: each distinct caption is
/// scored once, so the blindness is exact rather than up to batch-position rounding.
struct BlankImage<'a>(ModelScorer<'a, CpuBackend>);

impl CaptionScorer for BlankImage<'_> {
    fn score(&self, images: &[Example], rows: &[(usize, String)], span: Span) -> Result<Vec<f64>, EvalError> {
        let blank = Example { pixels: vec![0.0; images[0].pixels.len()], ..images[0].clone() };
        let mut distinct: Vec<String> = rows.iter().map(|(_, c)| c.clone()).collect();
        distinct.sort();
        distinct.dedup();
        let once: Vec<(usize, String)> = distinct.iter().map(|c| (0, c.clone())).collect();
        let scores = self.0.score(&[blank], &once, span)?;
        let by_caption: HashMap<&String, f64> = distinct.iter().zip(scores).collect();
        Ok(rows.iter().map(|(_, c)| by_caption[c]).collect())
    }
}

/// Knows each image's true caption: 0 for it, −1 for anything else.
struct Oracle;

impl CaptionScorer for Oracle {
    fn score(&self, images: &[Example], rows: &[(usize, String)], _: Span) -> Result<Vec<f64>, EvalError> {
        Ok(rows.iter().map(|(i, c)| if *c == images[*i].caption { 0.0 } else { -1.0 }).collect())
    }
}

#[test]
fn every_likelihood_metric_is_exactly_chance_for_an_image_blind_scorer() {
    let sets = sets(3, 12);
    let (model, params) = micro(5);
    let tokenizer = tokenizer();
    let real = BlankImage(ModelScorer { model: &model, params: &params, tokenizer: &tokenizer });
    for (name, scorer) in
        [("text only", &TextOnly as &dyn CaptionScorer), ("constant", &Constant), ("blank image", &real)]
    {
        assert_eq!(metrics(scorer, &sets), CHANCE, "{name}");
    }
}

#[test]
fn an_oracle_scores_every_likelihood_metric_perfectly() {
    let sets = sets(1, 2);
    assert_eq!(metrics(&Oracle, &sets), [1.0; 4]);
}

#[test]
fn unbalanced_or_mismatched_sets_are_refused() {
    let sets = sets(2, 2);
    let err = zero_shot::accuracy(&Oracle, &sets.singles[1..]).unwrap_err();
    assert!(err.to_string().contains("class-balanced"), "{err}");
    let (c, scenes, images) = &sets.contrasts[0];
    assert!(contrast::accuracy(&Oracle, *c, &scenes[1..], images).is_err());
    let same = synth::PairScene {
        description: synth::Description::parse("a small red circle above a small red circle").unwrap(),
        jitter: (0, 0),
    };
    let err = contrast::accuracy(&Oracle, Contrast::Relation, &[same], &images[..1]).unwrap_err();
    assert!(err.to_string().contains("a small red circle above a small red circle"), "{err}");
}

#[test]
fn metrics_and_captions_are_deterministic_for_a_fixed_model() {
    let sets = sets(2, 6);
    let (model, params) = micro(9);
    let tokenizer = tokenizer();
    let scorer = ModelScorer::<CpuBackend> { model: &model, params: &params, tokenizer: &tokenizer };
    let first = metrics(&scorer, &sets);
    assert_eq!(first, metrics(&scorer, &sets));
    let images = &sets.contrasts[0].2;
    let bos_eos = tokenizer.bos_eos();
    assert_eq!(
        greedy_captions::<CpuBackend>(&model, &params, images, bos_eos),
        greedy_captions::<CpuBackend>(&model, &params, images, bos_eos)
    );
}

#[test]
fn a_caption_scores_minus_its_training_loss_times_its_target_count() {
    let (model, params) = micro(3);
    let tokenizer = tokenizer();
    let seq = model.config().seq;
    // More images than one encoder batch, rows out of image order, several rows per image.
    let scenes = super::heldout::pair_scenes(4, 70);
    let images = prepare(&render_pairs(&scenes, 32), &pipeline()).unwrap();
    let captions = ["a small red circle", "a large blue square left of a small green triangle"];
    let rows: Vec<TokenRow> = (0..images.len())
        .rev()
        .flat_map(|i| {
            let own = images[i].caption.clone();
            [own, captions[i % 2].to_owned()].map(|c| TokenRow { image: i, tokens: tokenizer.encode(&c, seq).unwrap() })
        })
        .collect();
    let scores = log_likelihoods::<CpuBackend>(&model, &params, &images, &rows, Span::Caption).unwrap();

    let device = Default::default();
    let pixels: Vec<f32> = rows.iter().flat_map(|r| images[r.image].pixels.clone()).collect();
    let tokens: Vec<i64> = rows.iter().flat_map(|r| r.tokens.clone()).collect();
    let batch = CaptionBatch::<CpuBackend> {
        images: Tensor::from_data(TensorData::new(pixels, [rows.len(), 3, 32, 32]), &device),
        tokens: Tensor::<CpuBackend, 2, Int>::from_data(TensorData::new(tokens, [rows.len(), seq]), &device),
    };
    let losses = model.losses(&mut Tape::new(Mode::Frozen, &params), &batch);
    let losses = losses.into_data().convert::<f32>().into_vec::<f32>().unwrap();
    for ((row, score), loss) in rows.iter().zip(&scores).zip(losses) {
        let targets = row.tokens[1..].iter().filter(|&&t| t != 0).count() as f64;
        let expected = -f64::from(loss) * targets;
        assert!((score - expected).abs() <= 1e-4 * expected.abs().max(1.0), "{score} vs {expected} for {row:?}");
    }

    // A prefix leaves out exactly the end token: the same as scoring the caption cut before it.
    let prefix = log_likelihoods::<CpuBackend>(&model, &params, &images, &rows, Span::Prefix).unwrap();
    let eos = tokenizer.bos_eos().1;
    let cut: Vec<TokenRow> = rows
        .iter()
        .map(|r| TokenRow { image: r.image, tokens: r.tokens.iter().map(|&t| if t == eos { 0 } else { t }).collect() })
        .collect();
    let cut = log_likelihoods::<CpuBackend>(&model, &params, &images, &cut, Span::Caption).unwrap();
    for (p, c) in prefix.iter().zip(&cut) {
        assert!((p - c).abs() < 1e-4, "{p} vs {c}");
    }
    for (p, s) in prefix.iter().zip(&scores) {
        assert!(p > s, "dropping the end token raises the log-likelihood: {p} vs {s}");
    }
}

#[test]
fn rows_that_do_not_fit_the_model_are_refused_naming_the_value() {
    let (model, params) = micro(1);
    let seq = model.config().seq;
    let images = prepare(&balanced_singles(0, 1, 32)[..1], &pipeline()).unwrap();
    let good = vec![1, 5, 2].into_iter().chain(std::iter::repeat(0)).take(seq).collect::<Vec<i64>>();
    let cases = [
        (TokenRow { image: 1, tokens: good.clone() }, "image 1 of 1"),
        (TokenRow { image: 0, tokens: good[..seq - 1].to_vec() }, "has 11 tokens"),
        (
            TokenRow {
                image: 0,
                tokens: [&good[..2], &[999]].concat().into_iter().chain(good[3..].iter().copied()).collect(),
            },
            "token 999",
        ),
    ];
    for (row, needle) in cases {
        let err = log_likelihoods::<CpuBackend>(&model, &params, &images, &[row], Span::Caption).unwrap_err();
        assert!(err.to_string().contains(needle), "{err}");
    }
    let small = Example { pixels: vec![0.0; 12], ..images[0].clone() };
    let err =
        log_likelihoods::<CpuBackend>(&model, &params, &[small], &[TokenRow { image: 0, tokens: good }], Span::Caption)
            .unwrap_err();
    assert!(err.to_string().contains("has 12 values"), "{err}");
}
