//! The named captioner configurations and their parameter counts.

use burn::tensor::backend::AutodiffBackend;
use dpcap_dataset::synth;
use dpcap_dataset::tokenizer::CaptionTokenizer;
use dpcap_ml::CpuBackend;
use dpcap_ml::model::{Captioner, CaptionerConfig};
use dpcap_ml::params::ParamSet;
use dpcap_ml::trainer::{FedEmbTraining, Model};
use dpcap_registry::{Family, NAMES, parameter_count};

type Inner = <CpuBackend as AutodiffBackend>::InnerBackend;

fn count(name: &str) -> usize {
    built(Family::Captioner, name)
}

/// The parameters of the burn model `name` of `family`, as the trainer builds it (shapes only),
/// through its one dispatch on the objective: a new objective needs no arm here.
fn built(family: Family, name: &str) -> usize {
    let mut ps = ParamSet::<Inner>::specs_only(&Default::default());
    let tokenizer = family
        .has_captions()
        .then(|| CaptionTokenizer::train((0..200).map(|i| synth::generate(2, i, 32).caption), 256).expect("tokenizer"));
    Model::new(family, name, tokenizer, &FedEmbTraining::default(), &mut ps).expect("built");
    ps.numel()
}

#[test]
fn the_registrys_parameter_count_is_every_built_models_own() {
    // The coordinator registers P from the registry before any worker builds the model; a
    // rank whose model had another P would be refused at attach.
    for family in Family::ALL {
        for name in NAMES {
            assert_eq!(parameter_count(family, name), Some(built(family, name) as u64), "{family:?} {name}");
        }
    }
}

#[test]
fn parameter_counts_grow_with_size_and_base_is_about_190m() {
    let counts: Vec<usize> = NAMES.iter().map(|n| count(n)).collect();
    assert!(counts.windows(2).all(|w| w[0] < w[1]), "{counts:?}");
    let base = count("base");
    assert!((185_000_000..195_000_000).contains(&base), "base has {base} parameters");
    assert!(CaptionerConfig::named("huge").is_none());
}

#[test]
fn bench_config_is_the_issue_shape() {
    let c = CaptionerConfig::named("bench").unwrap();
    assert_eq!(
        (c.encoder.image, c.encoder.patch, c.encoder.width, c.encoder.depth, c.encoder.heads),
        (32, 4, 128, 4, 4)
    );
    assert_eq!((c.dec_width, c.dec_depth, c.dec_heads, c.vocab, c.seq), (128, 2, 4, 1000, 16));
}

#[test]
fn the_decoder_is_causal_a_later_token_never_changes_an_earlier_prediction() {
    use burn::tensor::{Int, Tensor, TensorData};
    use dpcap_ml::clip::{Mode, Tape};
    use dpcap_ml::model::CaptionBatch;
    let config = CaptionerConfig::named("micro").unwrap();
    let mut ps = ParamSet::<Inner>::new(&Default::default());
    let model = Captioner::new(&mut ps, config);
    let batch = CaptionBatch::<CpuBackend>::random(config, 2, &Default::default());
    let logits = |tokens: Tensor<CpuBackend, 2, Int>| {
        let mut tape = Tape::new(Mode::Frozen, &ps);
        let b = CaptionBatch { images: batch.images.clone(), tokens };
        model.logits(&mut tape, &b).into_data().convert::<f32>().into_vec::<f32>().unwrap()
    };
    let base = logits(batch.tokens.clone());
    let mut changed: Vec<i64> = batch.tokens.clone().into_data().convert::<i64>().into_vec().unwrap();
    let (s, cut) = (config.seq, 5);
    for row in 0..2 {
        for j in cut..s {
            changed[row * s + j] = 7 + j as i64;
        }
    }
    let other = logits(Tensor::from_data(TensorData::new(changed, [2, s]), &Default::default()));
    let per_position = config.vocab;
    for row in 0..2 {
        for position in 0..cut {
            let at = (row * (s - 1) + position) * per_position;
            assert_eq!(base[at..at + per_position], other[at..at + per_position], "position {position} saw the future");
        }
        let at = (row * (s - 1) + cut) * per_position;
        assert_ne!(base[at..at + per_position], other[at..at + per_position], "position {cut} sees its own input");
    }
}
