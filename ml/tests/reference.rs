//! The `micro` captioner against an independent PyTorch implementation of the same model
//! (`reference/captioner_reference.py` at the repository root, fixture
//! `data/captioner_reference.json`): with the same deterministic weights and inputs,
//! per-example losses and gradient norms, and the per-parameter norms of the gradient sum
//! unclipped and clipped, agree. The ClipEngine tests compare against burn's own autodiff of
//! *our* forward; this one catches a forward that is not the model it claims to be (a causal
//! mask off by one, a LayerNorm ε, patch order).

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};
use dpcap_ml::CpuBackend;
use dpcap_ml::clip::{ClipEngine, ClippedSum};
use dpcap_ml::model::{CaptionBatch, Captioner, CaptionerConfig};
use dpcap_ml::params::ParamSet;
use serde_json::Value;

type Inner = <CpuBackend as AutodiffBackend>::InnerBackend;

const TOKENS: [[i64; 12]; 3] = [
    [1, 5, 9, 13, 20, 2, 0, 0, 0, 0, 0, 0],
    [1, 7, 8, 2, 0, 0, 0, 0, 0, 0, 0, 0],
    [1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 2, 0],
];

/// The reference's weights: parameter k at flat index i is 0.15·sin(0.37 i + 1.3 k + 0.1),
/// plus 1 for LayerNorm gammas.
fn reference_model() -> (Captioner, ParamSet<Inner>) {
    let device = Default::default();
    let mut params = ParamSet::<Inner>::new(&device);
    let model = Captioner::new(&mut params, CaptionerConfig::named("micro").expect("micro exists"));
    let ids: Vec<_> = params.ids().collect();
    for (k, id) in ids.into_iter().enumerate() {
        let spec = params.spec(id).clone();
        let base = if spec.name.ends_with("gamma") { 1.0 } else { 0.0 };
        let values: Vec<f32> =
            (0..spec.numel()).map(|i| base + 0.15 * (0.37 * i as f32 + 1.3 * k as f32 + 0.1).sin()).collect();
        params.set(id, Tensor::from_data(TensorData::new(values, [spec.numel()]), &device));
    }
    (model, params)
}

/// The reference's inputs: image b at flat index j of [3, 32, 32] is sin(0.013 j + b).
fn reference_batch() -> CaptionBatch<CpuBackend> {
    let device = Default::default();
    let (b, pixels) = (TOKENS.len(), 3 * 32 * 32);
    let images: Vec<f32> = (0..b * pixels).map(|j| (0.013 * (j % pixels) as f32 + (j / pixels) as f32).sin()).collect();
    CaptionBatch {
        images: Tensor::from_data(TensorData::new(images, [b, 3, 32, 32]), &device),
        tokens: Tensor::<CpuBackend, 2, Int>::from_data(TensorData::new(TOKENS.concat(), [b, 12]), &device),
    }
}

fn numbers(value: &Value) -> Vec<f64> {
    value.as_array().expect("an array").iter().map(|v| v.as_f64().expect("a number")).collect()
}

fn assert_close(what: &str, got: f64, want: f64, relative: f64, absolute: f64) {
    assert!((got - want).abs() <= relative * want.abs() + absolute, "{what}: dpcap {got:.8e}, PyTorch {want:.8e}");
}

fn assert_sum_norms(what: &str, out: &ClippedSum<Inner>, params: &ParamSet<Inner>, want: &Value) {
    for (id, grad) in params.ids().zip(&out.sum.grads) {
        let name = &params.spec(id).name;
        let want = want[name].as_f64().unwrap_or_else(|| panic!("the reference has no {name}"));
        let got = f64::from(grad.clone().powi_scalar(2).sum().into_scalar()).sqrt();
        // f32 against float64: 1 % on every parameter, with a floor for gradients that are
        // zero in exact arithmetic (key biases under softmax's shift invariance).
        assert_close(&format!("{what} {name}"), got, want, 1e-2, 1e-6);
    }
}

#[test]
fn the_captioner_matches_an_independent_pytorch_implementation() {
    let reference: Value = serde_json::from_str(include_str!("data/captioner_reference.json")).expect("valid JSON");
    let (model, params) = reference_model();
    let batch = reference_batch();
    let unclipped = ClipEngine {
        clipping_norm: 1e9,
        micro_batch: 2,
        precision: Default::default(),
        matmul_inputs: Default::default(),
        reads: Default::default(),
        lanes: Default::default(),
    };
    let out = unclipped.clipped_sum(&model, &params, &batch);
    for (b, want) in numbers(&reference["losses"]).into_iter().enumerate() {
        assert_close(&format!("loss of example {b}"), f64::from(out.telemetry.losses[b]), want, 1e-5, 0.0);
    }
    for (b, want) in numbers(&reference["norms"]).into_iter().enumerate() {
        assert_close(&format!("gradient norm of example {b}"), f64::from(out.telemetry.norms[b]), want, 1e-4, 0.0);
    }
    assert_sum_norms("sum", &out, &params, &reference["sum_norms"]);

    // C between the examples' norms, so that some are clipped and one is not.
    let c = reference["clipping_norm"].as_f64().expect("clipping_norm");
    let clipped = ClipEngine { clipping_norm: c, ..unclipped };
    let out = clipped.clipped_sum(&model, &params, &batch);
    assert_sum_norms("clipped sum", &out, &params, &reference["clipped_sum_norms"]);
}
