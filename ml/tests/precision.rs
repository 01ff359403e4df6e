//! Mixed precision: with bf16 matrix products the ClipEngine's clipped sum stays within bf16
//! rounding of the f32 one, differs from it (bf16 really ran), and still bounds every example's
//! contribution by C in f32 (the sensitivity the accountant's noise assumes).

use burn::tensor::backend::AutodiffBackend;
use dpcap_ml::CpuBackend;
use dpcap_ml::clip::{ClipEngine, ClippedSum, Objective, Precision};
use dpcap_ml::model::{CaptionBatch, Captioner, CaptionerConfig, Mae, MaeBatch, MaeConfig};
use dpcap_ml::params::ParamSet;

type AB = CpuBackend;
type Inner = <AB as AutodiffBackend>::InnerBackend;

fn engine(clipping_norm: f64, micro_batch: usize, precision: Precision) -> ClipEngine {
    ClipEngine {
        clipping_norm,
        micro_batch,
        precision,
        matmul_inputs: Default::default(),
        reads: Default::default(),
        lanes: Default::default(),
    }
}

fn values(sum: &ClippedSum<Inner>) -> Vec<f32> {
    sum.sum.flatten().into_data().to_vec().unwrap()
}

/// max |bf16 − f32| / max |f32| over the clipped sum, and the largest per-example norm gap.
fn compare<M: Objective<AB>>(model: &M, params: &ParamSet<Inner>, batch: &M::Batch, c: f64) -> (f64, f64) {
    compare_at(model, params, batch, c, Precision::Bf16)
}

/// max |half − f32| / max |f32| and the largest per-example norm gap, for `half` products.
fn compare_at<M: Objective<AB>>(
    model: &M,
    params: &ParamSet<Inner>,
    batch: &M::Batch,
    c: f64,
    half: Precision,
) -> (f64, f64) {
    let full = engine(c, 4, Precision::F32).clipped_sum(model, params, batch);
    let half = engine(c, 4, half).clipped_sum(model, params, batch);
    let (f, h) = (values(&full), values(&half));
    let scale = f.iter().fold(0f64, |m, v| m.max(f64::from(v.abs())));
    let err = f.iter().zip(&h).fold(0f64, |m, (a, b)| m.max(f64::from((a - b).abs()))) / scale;
    let norm_gap = full
        .telemetry
        .norms
        .iter()
        .zip(&half.telemetry.norms)
        .fold(0f64, |m, (a, b)| m.max(f64::from((a - b).abs() / a)));
    (err, norm_gap)
}

/// Every example alone, clipped at C below its norm, contributes a vector of norm <= C.
fn assert_bounded<M: Objective<AB>>(model: &M, params: &ParamSet<Inner>, batch: &M::Batch, c: f64) {
    assert_bounded_at(model, params, batch, c, Precision::Bf16);
}

fn assert_bounded_at<M: Objective<AB>>(model: &M, params: &ParamSet<Inner>, batch: &M::Batch, c: f64, half: Precision) {
    for i in 0..model.batch_len(batch) {
        let one = model.slice(batch, i..i + 1);
        let sum = engine(c, 1, half).clipped_sum(model, params, &one);
        assert!(sum.telemetry.norms[0] as f64 > c, "example {i} must be clipped");
        let norm = values(&sum).iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt();
        assert!(norm <= c * (1.0 + 1e-5), "example {i}: contribution {norm} exceeds C = {c}");
    }
}

/// The micro captioner, its parameters and a random batch of 6.
fn micro_captioner() -> (Captioner, ParamSet<Inner>, CaptionBatch<AB>) {
    let config = CaptionerConfig::named("micro").unwrap();
    let mut params = ParamSet::<Inner>::new(&Default::default());
    let model = Captioner::new(&mut params, config);
    let batch = CaptionBatch::<AB>::random(config, 6, &Default::default());
    (model, params, batch)
}

#[test]
fn bf16_captioner_step_tracks_f32_and_stays_bounded_by_c() {
    let (model, params, batch) = micro_captioner();
    let (err, norm_gap) = compare(&model, &params, &batch, 0.05);
    assert!(err > 0.0, "bf16 products must differ from f32 somewhere (was bf16 used?)");
    assert!(err < 3e-2, "clipped sum error {err}");
    assert!(norm_gap < 3e-2, "per-example norm gap {norm_gap}");
    assert_bounded(&model, &params, &batch, 0.05);
}

#[test]
fn bf16_mae_step_tracks_f32_and_stays_bounded_by_c() {
    let config = MaeConfig::named("micro").unwrap();
    let mut params = ParamSet::<Inner>::new(&Default::default());
    let model = Mae::new(&mut params, config);
    let image = config.encoder.image;
    let images = burn::tensor::Tensor::random(
        [4, 3, image, image],
        burn::tensor::Distribution::Normal(0.0, 1.0),
        &Default::default(),
    );
    let batch = MaeBatch::new(images, config.encoder.patches());
    let (err, norm_gap) = compare(&model, &params, &batch, 0.05);
    assert!(err > 0.0 && err < 3e-2, "clipped sum error {err}");
    assert!(norm_gap < 3e-2, "per-example norm gap {norm_gap}");
    assert_bounded(&model, &params, &batch, 0.05);
}

/// f16 (for devices without bf16, such as WGSL's) runs the same mixed precision: its 11-bit
/// significand tracks f32 closer than bf16's 8 bits, so a smaller error than bf16's proves f16
/// (not bf16, not f32) ran, and every example stays bounded by C.
#[test]
fn f16_captioner_step_tracks_f32_closer_than_bf16_and_stays_bounded_by_c() {
    let (model, params, batch) = micro_captioner();
    let (f16, norm_gap) = compare_at(&model, &params, &batch, 0.05, Precision::F16);
    let (bf16, _) = compare_at(&model, &params, &batch, 0.05, Precision::Bf16);
    assert!(f16 > 0.0, "f16 products must differ from f32 somewhere (was f16 used?)");
    assert!(f16 < bf16, "f16 error {f16} must be below bf16's {bf16}");
    assert!(norm_gap < 3e-2, "per-example norm gap {norm_gap}");
    assert_bounded_at(&model, &params, &batch, 0.05, Precision::F16);
    assert_eq!("f16".parse::<Precision>(), Ok(Precision::F16));
    assert_eq!(Precision::F16.name(), "f16");
}
