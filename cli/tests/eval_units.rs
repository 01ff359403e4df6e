//! The evaluation suite's parts (`dpctl::eval`): probes, the metrics table and report keys,
//! and the suite itself on freshly initialised `micro` models.

mod probe {
    use dpctl::eval::probe::*;
    use rand_chacha::ChaCha8Rng;
    use rand_chacha::rand_core::{Rng, SeedableRng};

    /// Three well-separated classes in 4 dimensions, with noise from `seed`.
    fn blobs(n: usize, seed: u64) -> (Vec<Vec<f32>>, Vec<u32>) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut noise = || (rng.next_u64() % 1000) as f32 / 1000.0 - 0.5;
        (0..n)
            .map(|i| {
                let class = (i * 7 % 3) as u32;
                let row = (0..4).map(|j| if j == class as usize { 3.0 } else { 0.0 } + noise()).collect();
                (row, class)
            })
            .unzip()
    }

    #[test]
    fn probes_separate_separable_classes_and_are_deterministic() {
        let (x, y) = blobs(90, 1);
        assert_eq!(accuracy(&x, &y).unwrap(), 1.0);
        for shots in [1, 5] {
            let a = few_shot_accuracy(&x, &y, shots, 3, 7).unwrap();
            assert!(a > 0.9, "{shots}-shot {a}");
            assert_eq!(a, few_shot_accuracy(&x, &y, shots, 3, 7).unwrap());
        }
    }

    #[test]
    fn too_few_examples_are_refused_with_the_counts() {
        let (x, y) = blobs(30, 2);
        let err = few_shot_accuracy(&x, &y, 10, 1, 0).unwrap_err().to_string();
        assert!(err.contains("10-shot") && err.contains("in the fit part of 20"), "{err}");
        assert!(accuracy(&x[..5], &y[..5]).unwrap_err().to_string().contains("got 5 features"));
        assert!(few_shot_accuracy(&x, &y, 0, 1, 0).is_err());
    }
}

mod report {
    use dpctl::eval::report::*;
    use dpctl::eval::suite::{SetSizes, SuiteReport};

    fn report(v: f64, captions: bool) -> SuiteReport {
        SuiteReport {
            zero_shot: captions.then_some(v),
            aro_relation: captions.then_some(v),
            aro_attribution: captions.then_some(v),
            layout: captions.then_some(v),
            caption_slot_accuracy: None,
            probe_accuracy: v,
            few_shot_1: v,
            few_shot_5: v,
            few_shot_10: v,
            captions: vec![],
            images: SetSizes { zero_shot: 12, contrast: 12, slots: 12, probe: 360 },
            seconds: 0.5,
        }
    }

    #[test]
    fn every_metric_gets_a_key_per_model() {
        let (dp, random, nonprivate) = (report(0.7, true), report(0.1, true), report(0.9, false));
        let keys = named_keys(&[("dp", &dp), ("random", &random), ("nonprivate", &nonprivate)]);
        for m in ["dp", "random", "nonprivate"] {
            for metric in crate::eval_cli::METRICS {
                assert!(keys.contains_key(&format!("{metric}_{m}")), "{metric}_{m}");
            }
            assert!(keys["caption_slot_accuracy"].get(m).is_some(), "{m}");
        }
        assert_eq!(keys["probe_accuracy_dp"], 0.7);
        assert_eq!(keys["zero_shot_random"], 0.1);
        assert!(keys["layout_nonprivate"].is_null());
        assert_eq!(keys["below_random_dp"], serde_json::json!([]), "0.7 is above 0.1 everywhere");
        assert_eq!(keys.len(), 3 * 8 + 1 + 2, "and below_random_ for dp and nonprivate");
    }

    #[test]
    fn a_dp_score_below_the_random_init_encoder_is_marked_in_the_table_and_the_keys() {
        let random = report(0.42, true);
        let dp = SuiteReport { few_shot_5: 0.388, few_shot_10: 0.390, ..report(0.6, true) };
        assert_eq!(below(&dp, &random), ["few_shot_5", "few_shot_10"]);
        let t = table(&dp, Some(&random));
        let marked: Vec<&str> = t.lines().filter(|l| l.contains("below the random-init encoder")).collect();
        assert_eq!(marked.len(), 2, "{t}");
        assert!(marked[0].starts_with("5-shot probe") && marked[0].contains("0.420"), "{t}");
        assert!(t.lines().next().unwrap().ends_with("random"), "the random column is headed: {t}");
        let keys = named_keys(&[("dp", &dp), ("random", &random)]);
        assert_eq!(keys["below_random_dp"], serde_json::json!(["few_shot_5", "few_shot_10"]));
    }

    #[test]
    fn the_table_names_every_metric() {
        let t = table(&report(0.25, true), None);
        for label in
            ["zero-shot", "ARO relation", "ARO attribution", "layout", "linear probe", "10-shot", "caption slots"]
        {
            assert!(t.contains(label), "{label} in\n{t}");
        }
        assert!(table(&report(0.25, false), None).contains("n/a"));
    }
}

mod suite {
    use burn::tensor::backend::AutodiffBackend;
    use dpcap_dataset::synth;
    use dpcap_dataset::tokenizer::CaptionTokenizer;
    use dpcap_ml::CpuBackend;
    use dpcap_ml::model::{Captioner, CaptionerConfig, Mae, MaeConfig};
    use dpcap_ml::params::ParamSet;
    use dpcap_ml::trainer::Model;

    use dpctl::eval::suite::*;

    type Params = ParamSet<<CpuBackend as AutodiffBackend>::InnerBackend>;

    fn captioner(seed: u64) -> (Model, Params) {
        let tokenizer = CaptionTokenizer::train((0..400).map(|i| synth::generate(2, i, 32).caption), 256).unwrap();
        let mut params = ParamSet::seeded(&Default::default(), seed);
        let model = Captioner::new(&mut params, CaptionerConfig::named("micro").unwrap());
        (Model::Caption(model, Box::new(tokenizer)), params)
    }

    fn small() -> SuiteOptions {
        SuiteOptions { images: 24, probe_images: 360, few_shot_draws: 2, samples: 2, seed: 0 }
    }

    fn without_time(mut r: SuiteReport) -> SuiteReport {
        r.seconds = 0.0;
        r
    }

    #[test]
    fn the_suite_reports_every_metric_and_is_deterministic() {
        let (model, params) = captioner(4);
        let first = run_suite::<CpuBackend>(&model, &params, &small()).unwrap();
        let again = run_suite::<CpuBackend>(&model, &params, &small()).unwrap();
        assert_eq!(without_time(first.clone()), without_time(again));
        for v in [first.zero_shot, first.aro_relation, first.aro_attribution, first.layout] {
            assert!(v.is_some_and(|v| (0.0..=1.0).contains(&v)), "{first:?}");
        }
        for v in [first.probe_accuracy, first.few_shot_1, first.few_shot_5, first.few_shot_10] {
            assert!((0.0..=1.0).contains(&v), "{first:?}");
        }
        assert!(first.caption_slot_accuracy.is_some());
        assert_eq!(first.captions.len(), 2);
        assert_eq!(first.images, SetSizes { zero_shot: 24, contrast: 24, slots: 24, probe: 360 });
    }

    #[test]
    fn an_encoder_without_a_decoder_gets_the_probes_only() {
        let mut params = ParamSet::seeded(&Default::default(), 1);
        let model = Model::Mae(Mae::new(&mut params, MaeConfig::named("micro").unwrap()));
        let r = run_suite::<CpuBackend>(&model, &params, &small()).unwrap();
        assert_eq!((r.zero_shot, r.layout, r.caption_slot_accuracy), (None, None, None));
        assert!(r.captions.is_empty() && r.probe_accuracy > 0.0);
    }

    #[test]
    fn sizes_too_small_are_refused_naming_the_flag() {
        let err = SuiteOptions { images: 11, ..small() }.check(["--images", "--probe-images"]).unwrap_err();
        assert!(err.to_string().starts_with("--images 11:"), "{err}");
        let err = SuiteOptions { probe_images: 100, ..small() }.check(["--images", "--eval-examples"]).unwrap_err();
        assert!(err.to_string().starts_with("--eval-examples 100:"), "{err}");
    }
}
