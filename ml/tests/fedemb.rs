//! DP-FedEmb's client update against its privacy contract: whatever a client's local training
//! does, it moves a part by at most C; and in the degenerate case (one example per user, one
//! local step at learning rate 1, no head) the clipped sum of client deltas is DP-SGD's
//! clipped sum of per-example gradients.

use burn::tensor::backend::AutodiffBackend;
use dpcap_dataset::Example;
use dpcap_ml::CpuBackend;
use dpcap_ml::clip::{ClipEngine, ClippedSum, GradSum, Objective, naive_clipped_sum};
use dpcap_ml::fed::{LocalConfig, add_clipped, local_delta};
use dpcap_ml::model::{CaptionBatch, Captioner, CaptionerConfig};
use dpcap_ml::optim::{AdamWConfig, Rule, Schedule};
use dpcap_ml::params::ParamSet;
use dpcap_ml::trainer::{FedEmbTraining, ReplicaConfig, Trainer};
use dpcap_registry::Family;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};

type AB = CpuBackend;
type Inner = <AB as AutodiffBackend>::InnerBackend;

fn flat(sum: &GradSum<Inner>) -> Vec<f32> {
    sum.flatten().into_data().to_vec().unwrap()
}

fn norm(v: &[f32]) -> f64 {
    v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt()
}

/// A fedemb replica of `micro` whose clients train with `local`.
fn trainer(local: LocalConfig, clipping_norm: f64) -> Trainer<AB> {
    let engine = ClipEngine {
        clipping_norm,
        micro_batch: 8,
        precision: Default::default(),
        matmul_inputs: Default::default(),
        reads: Default::default(),
        lanes: Default::default(),
    };
    let schedule = Schedule { peak: 1.0, warmup_steps: 0, total_steps: 1, floor: 0.0 };
    let server = AdamWConfig { rule: Rule::Momentum, weight_decay: 0.0, ..AdamWConfig::default() };
    let replica = ReplicaConfig {
        model_name: "micro",
        objective: Family::Embedder,
        fedemb: FedEmbTraining { local, head_scale: 10.0, server },
        tokenizer: None,
        seed: 3,
        engine,
        expected_batch_size: 10.0,
        schedule,
    };
    Trainer::<AB>::new(replica, &Default::default()).unwrap()
}

/// A client's examples: `n` random 32 px images of two identities.
fn client(seed: u64, n: usize) -> Vec<Example> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|i| Example {
            key: format!("client{seed}#{i}"),
            pixels: (0..3 * 32 * 32).map(|_| (rng.next_u32() as f32 / u32::MAX as f32) * 2.0 - 1.0).collect(),
            caption: String::new(),
            label: Some((i % 2) as u32),
        })
        .collect()
}

fn part(trainer: &Trainer<AB>, clients: &[Vec<Example>]) -> (Vec<f32>, Vec<f64>) {
    let mut part = trainer.begin_part();
    let norms = clients.iter().map(|c| trainer.accumulate_client(&mut part, c).unwrap()).collect();
    (flat(&part.sum), norms)
}

#[test]
fn one_client_with_a_huge_delta_moves_the_sum_by_at_most_c() {
    let c = 0.5;
    let calm = trainer(LocalConfig { steps: 2, epochs: 1, learning_rate: 0.05, batch: 4 }, c);
    let (before, _) = part(&calm, &[client(1, 8), client(2, 8)]);
    // The same replica, but the third client's local training runs wild (learning rate 1e4).
    let wild = trainer(LocalConfig { steps: 3, epochs: 1, learning_rate: 1e4, batch: 4 }, c);
    let mut sum = calm.begin_part();
    for examples in [client(1, 8), client(2, 8)] {
        calm.accumulate_client(&mut sum, &examples).unwrap();
    }
    let huge = wild.accumulate_client(&mut sum, &client(3, 8)).unwrap();
    assert!(huge > 100.0 * c, "the wild client's delta is huge before clipping: {huge}");
    let after = flat(&sum.sum);
    let moved: Vec<f32> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert!(norm(&moved) <= c * (1.0 + 1e-4), "one client moved the part by {} > C = {c}", norm(&moved));
    assert!(norm(&moved) >= c * 0.99, "a clipped huge delta has norm C: {}", norm(&moved));
}

#[test]
fn every_clients_contribution_is_within_c_and_small_deltas_pass_unclipped() {
    let c = 1e3;
    let t = trainer(LocalConfig::default(), c);
    let (sum, norms) = part(&t, &[client(4, 6)]);
    assert!(norms[0] > 0.0 && norms[0] < c, "a normal client is not clipped at C = {c}: {}", norms[0]);
    assert!((norm(&sum) - norms[0]).abs() <= 1e-4 * norms[0], "an unclipped delta is added as it is");
    let tight = trainer(LocalConfig::default(), norms[0] / 10.0);
    let (sum, _) = part(&tight, &[client(4, 6)]);
    assert!((norm(&sum) - norms[0] / 10.0).abs() <= 1e-4 * norms[0], "clipped to C exactly: {}", norm(&sum));
}

#[test]
fn with_one_example_per_user_one_local_step_and_no_head_the_update_is_dp_sgd() {
    // The captioner has no local head: a client of one example, one SGD step at learning rate
    // 1, gives u = θ − (θ − g) = g, so Σ clip_C(u_i) must be DP-SGD's Σ clip_C(g_i).
    let config = CaptionerConfig::named("micro").unwrap();
    let mut params = ParamSet::<Inner>::seeded(&Default::default(), 11);
    let model = Captioner::new(&mut params, config);
    let batch = CaptionBatch::random(config, 6, &Default::default());
    let unclipped = naive_clipped_sum(&model, &params, &batch, f64::INFINITY);
    let mut sorted = unclipped.telemetry.norms.clone();
    sorted.sort_by(f32::total_cmp);
    let c = f64::from(sorted[3]);
    let naive = flat(&naive_clipped_sum(&model, &params, &batch, c).sum);

    let local = LocalConfig { steps: 1, epochs: 1, learning_rate: 1.0, batch: 1 };
    let mut fed = ClippedSum::zeros(&params);
    for i in 0..6 {
        let example = Objective::<AB>::slice(&model, &batch, i..i + 1);
        let delta = local_delta::<AB, _>(&model, &params, &local, |_| vec![example.clone()]);
        assert_eq!(delta.steps, 1);
        add_clipped(&mut fed, delta, c);
    }
    let fed = flat(&fed.sum);
    let scale = naive.iter().fold(0f32, |m, v| m.max(v.abs()));
    let err = fed.iter().zip(&naive).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(err <= 1e-4 * scale, "federated vs DP-SGD clipped sums: max error {err} vs scale {scale}");
    let clipped = unclipped.telemetry.norms.iter().filter(|&&n| f64::from(n) > c).count();
    assert!(clipped > 0 && clipped < 6, "C = {c} clips some examples and not others");
}

#[test]
fn a_client_whose_local_training_diverged_to_nan_adds_nothing() {
    let t = trainer(LocalConfig::default(), 1.0);
    let mut part = t.begin_part();
    t.accumulate_client(&mut part, &client(5, 4)).unwrap();
    let before = flat(&part.sum);
    let nan = GradSum { grads: GradSum::zeros(&t.params).grads.into_iter().map(|g| g.add_scalar(f32::NAN)).collect() };
    let norm = add_clipped(&mut part, dpcap_ml::fed::ClientDelta { delta: nan, first_loss: 0.0, steps: 1 }, 1.0);
    assert!(norm.is_nan());
    assert_eq!(flat(&part.sum), before, "a NaN delta would void the release; it adds zero, which is within C");
}
