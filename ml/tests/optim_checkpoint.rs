//! AdamW on a release divided by the expected batch size, the LR schedule, and safetensors
//! round trips of weights and optimizer state.

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};
use dpcap_ml::CpuBackend;
use dpcap_ml::checkpoint::{CheckpointError, load_optimizer, load_weights, save_optimizer, save_weights};
use dpcap_ml::model::{Captioner, CaptionerConfig};
use dpcap_ml::optim::{AdamW, AdamWConfig, Rule, Schedule};
use dpcap_ml::params::{Init, ParamSet};
use dpcap_privacy::contract::ModeKind;
use dpcap_registry::Family;

type Inner = <CpuBackend as AutodiffBackend>::InnerBackend;

fn values(t: Tensor<Inner, 1>) -> Vec<f32> {
    t.into_data().to_vec().unwrap()
}

#[test]
fn first_adamw_step_uses_release_over_expected_batch_size() {
    let device = Default::default();
    let mut ps = ParamSet::<Inner>::new(&device);
    let a = ps.add("a", &[2], Init::Ones);
    let b = ps.add("b", &[1], Init::Zeros);
    let release = [3.0f32, -6.0, 0.5];
    let (expected_batch, lr, c) = (4.0, 0.1, AdamWConfig::default());
    let mut opt = AdamW::new(c, &ps);
    opt.apply_release(&mut ps, Tensor::from_data(TensorData::new(release.to_vec(), [3]), &device), expected_batch, lr);
    // Step 1: m̂ = g, v̂ = g², so the Adam step is g / (|g| + ε) per coordinate.
    let before = [1.0f64, 1.0, 0.0];
    let got: Vec<f32> = [values(ps.value(a)), values(ps.value(b))].concat();
    for i in 0..3 {
        let g = f64::from(release[i]) / expected_batch;
        let want = before[i] - lr * c.weight_decay * before[i] - lr * g / (g.abs() + c.epsilon);
        assert!((f64::from(got[i]) - want).abs() < 1e-6, "coordinate {i}: {} vs {want}", got[i]);
    }
    assert_eq!(opt.steps, 1);
    // Adam's first step is ≈ sign(g) whatever the scale, so the step alone cannot tell R/L
    // from R or R/100: the moments can. m = (1-β1)·g and v = (1-β2)·g² with g = R/L exactly.
    let (m, v) = (
        [values(opt.m[0].clone()), values(opt.m[1].clone())].concat(),
        [values(opt.v[0].clone()), values(opt.v[1].clone())].concat(),
    );
    for i in 0..3 {
        let g = f64::from(release[i]) / expected_batch;
        let (want_m, want_v) = ((1.0 - c.beta1) * g, (1.0 - c.beta2) * g * g);
        assert!((f64::from(m[i]) - want_m).abs() < 1e-6 * want_m.abs().max(1e-3), "m[{i}]: {} vs {want_m}", m[i]);
        assert!((f64::from(v[i]) - want_v).abs() < 1e-6 * want_v.abs().max(1e-3), "v[{i}]: {} vs {want_v}", v[i]);
    }
}

#[test]
fn server_sgd_with_momentum_applies_the_average_delta_and_remembers_it() {
    // fedemb's server: m = β·m + R/L, w −= lr·m; two steps of the same release.
    let device = Default::default();
    let mut ps = ParamSet::<Inner>::new(&device);
    let a = ps.add("a", &[2], Init::Ones);
    let c = AdamWConfig { rule: Rule::Momentum, beta1: 0.9, weight_decay: 0.0, ..AdamWConfig::default() };
    let mut opt = AdamW::new(c, &ps);
    let release = || Tensor::from_data(TensorData::new(vec![2.0f32, -4.0], [2]), &device);
    opt.apply_release(&mut ps, release(), 2.0, 1.0);
    assert_eq!(values(ps.value(a)), vec![0.0, 3.0], "FedAvg's first step: w − R/L");
    opt.apply_release(&mut ps, release(), 2.0, 0.5);
    // m = 0.9·[1, −2] + [1, −2] = [1.9, −3.8]; w = [0, 3] − 0.5·m.
    let got = values(ps.value(a));
    assert!((got[0] + 0.95).abs() < 1e-6 && (got[1] - 4.9).abs() < 1e-6, "{got:?}");
    let saved = save_optimizer(&opt, &ps).unwrap();
    assert_eq!(load_optimizer(&ps, &saved).unwrap().config.rule, Rule::Momentum, "the rule survives a checkpoint");
}

#[test]
fn schedule_warms_up_linearly_then_decays_by_cosine_to_the_floor() {
    let s = Schedule { peak: 1e-3, warmup_steps: 10, total_steps: 110, floor: 1e-5 };
    assert!((s.lr(0) - 1e-4).abs() < 1e-12);
    assert!((s.lr(9) - 1e-3).abs() < 1e-12);
    assert!((s.lr(10) - 1e-3).abs() < 1e-12);
    assert!((s.lr(60) - (1e-5 + 0.5 * (1e-3 - 1e-5))).abs() < 1e-12);
    assert!((s.lr(110) - 1e-5).abs() < 1e-12 && (s.lr(500) - 1e-5).abs() < 1e-12);
    assert!((10..110).all(|t| s.lr(t + 1) <= s.lr(t)));
}

#[test]
fn weights_and_optimizer_state_round_trip_through_safetensors() {
    let device = Default::default();
    let config = CaptionerConfig::named("micro").unwrap();
    let mut ps = ParamSet::<Inner>::new(&device);
    Captioner::new(&mut ps, config);
    let mut opt = AdamW::new(AdamWConfig::default(), &ps);
    let release = Tensor::<Inner, 1>::ones([ps.numel()], &device);
    opt.apply_release(&mut ps, release, 10.0, 1e-3);

    let weights = save_weights(&ps).unwrap();
    let state = save_optimizer(&opt, &ps).unwrap();
    let mut fresh = ParamSet::<Inner>::new(&device);
    Captioner::new(&mut fresh, config);
    load_weights(&mut fresh, &weights).unwrap();
    let restored = load_optimizer(&fresh, &state).unwrap();
    for id in ps.ids() {
        assert_eq!(values(ps.value(id)), values(fresh.value(id)), "{}", ps.spec(id).name);
        assert_eq!(values(opt.m[id.0].clone()), values(restored.m[id.0].clone()));
        assert_eq!(values(opt.v[id.0].clone()), values(restored.v[id.0].clone()));
    }
    assert_eq!((restored.steps, restored.config), (1, opt.config));
}

#[test]
fn bad_checkpoints_are_refused_with_the_reason() {
    let device = Default::default();
    let mut micro = ParamSet::<Inner>::new(&device);
    Captioner::new(&mut micro, CaptionerConfig::named("micro").unwrap());
    let mut other = ParamSet::<Inner>::new(&device);
    Captioner::new(&mut other, CaptionerConfig::named("bench").unwrap());
    let bench_weights = save_weights(&other).unwrap();
    let err = load_weights(&mut micro, &bench_weights).unwrap_err();
    assert!(matches!(err, CheckpointError::Mismatch { .. }), "{err}");
    assert!(err.to_string().contains("encoder.patch_embed.weight"), "{err}");
    assert!(matches!(load_weights(&mut micro, b"not a checkpoint").unwrap_err(), CheckpointError::Format(_)));
    let mut tiny = ParamSet::<Inner>::new(&device);
    tiny.add("only", &[1], Init::Zeros);
    let err = load_weights(&mut micro, &save_weights(&tiny).unwrap()).unwrap_err();
    assert!(matches!(err, CheckpointError::Missing(ref n) if n == "encoder.patch_embed.weight"), "{err}");
}

#[test]
fn an_exported_encoder_carries_its_privacy_and_a_not_private_one_says_so() {
    use dpcap_ml::checkpoint::Manifest;
    use dpcap_ml::checkpoint::export_encoder;
    let mut params = ParamSet::<Inner>::new(&Default::default());
    let _model = Captioner::new(&mut params, CaptionerConfig::named("micro").unwrap());
    let manifest = |privacy: &str| Manifest {
        job_id: "job-1".into(),
        step: 5,
        ledger_position: 5,
        model: "micro".into(),
        objective: Family::Captioner,
        parameters: params.numel() as u64,
        generation: 1,
        created_unix_ms: 0,
        applied_steps: 5,
        discarded_steps: vec![],
        privacy: privacy.parse().unwrap(),
        dataset: String::new(),
        init_from: String::new(),
    };
    for privacy in ["dp", "not_private", "simulation"] {
        let bytes = export_encoder(&params, &manifest(privacy)).unwrap();
        let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        let metadata = header.metadata().clone().unwrap_or_default();
        assert_eq!(metadata.get("dpcap.privacy").map(String::as_str), Some(privacy));
        let notice = metadata.get("dpcap.notice");
        assert_eq!(notice.is_some(), privacy != "dp", "{privacy}: {notice:?}");
        assert!(notice.is_none_or(|n| n.starts_with("NOT PRIVATE")), "{notice:?}");
        let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert!(file.names().iter().all(|n| n.starts_with("encoder.")), "the encoder only");
    }
    let old: Manifest = serde_json::from_str(
        r#"{"job_id":"j","step":1,"ledger_position":1,"model":"micro","objective":"caption","parameters":1,"generation":1,"created_unix_ms":0}"#,
    )
    .unwrap();
    assert!(old.is_private(), "a checkpoint from before modes was DP");
}

#[tokio::test]
async fn a_job_starts_from_another_jobs_weights_the_encoder_alone_across_objectives_and_never_another_model() {
    use dpcap_ml::checkpoint::save_weights;
    use dpcap_ml::checkpoint::{CheckpointStore, Manifest};
    use dpcap_ml::init::load_init;
    let micro = || CaptionerConfig::named("micro").unwrap();
    let mut source = ParamSet::<Inner>::seeded(&Default::default(), 7);
    let _model = Captioner::new(&mut source, micro());
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, model: &str, objective: &str| {
        let root = dir.path().join(name).to_string_lossy().into_owned();
        let manifest = Manifest {
            job_id: "job-src".into(),
            step: 3,
            ledger_position: 3,
            model: model.into(),
            objective: objective.parse().unwrap(),
            parameters: source.numel() as u64,
            generation: 1,
            created_unix_ms: 0,
            applied_steps: 3,
            discarded_steps: vec![],
            privacy: ModeKind::NotPrivate,
            dataset: String::new(),
            init_from: String::new(),
        };
        let weights = save_weights(&source).unwrap();
        async move {
            CheckpointStore::open(&root).unwrap().save(&manifest, weights, Vec::new()).await.unwrap();
            root
        }
    };
    let fresh = || {
        let mut params = ParamSet::<Inner>::seeded(&Default::default(), 0);
        let _model = Captioner::new(&mut params, micro());
        params
    };
    let same = write("caption", "micro", "caption").await;
    let mut params = fresh();
    let manifest =
        load_init(&mut params, &same, ("micro", Family::Captioner), (3, ModeKind::NotPrivate)).await.unwrap();
    assert_eq!((manifest.job_id.as_str(), manifest.step), ("job-src", 3));
    for id in params.ids() {
        assert_eq!(values(params.value(id)), values(source.value(id)), "{}", params.spec(id).name);
    }
    let mae = write("mae", "micro", "mae").await;
    let (mut params, untouched) = (fresh(), fresh());
    load_init(&mut params, &mae, ("micro", Family::Captioner), (3, ModeKind::NotPrivate)).await.unwrap();
    for id in params.ids() {
        let name = &params.spec(id).name;
        let want = if name.starts_with("encoder.") { &source } else { &untouched };
        assert_eq!(values(params.value(id)), values(want.value(id)), "{name}: the encoder only");
    }
    let bench = write("bench", "bench", "caption").await;
    let err = load_init(&mut fresh(), &bench, ("micro", Family::Captioner), (3, ModeKind::NotPrivate))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("invalid init_from:") && err.contains("bench"), "{err}");
    let nowhere = dir.path().join("nowhere").to_string_lossy().into_owned();
    assert!(load_init(&mut fresh(), &nowhere, ("micro", Family::Captioner), (3, ModeKind::NotPrivate)).await.is_err());
    let err =
        load_init(&mut fresh(), &same, ("micro", Family::Captioner), (3, ModeKind::Dp)).await.unwrap_err().to_string();
    assert!(err.contains("not the dp checked at submission"), "privacy re-checked where it is loaded: {err}");
    assert!(!dir.path().join("nowhere").exists(), "reading a path never creates it");
}
