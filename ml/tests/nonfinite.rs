//! One bad example cannot stop a job: an example whose loss or gradient is NaN or infinite is
//! left out of the clipped sum by selection or by masking its rows to zero (never by
//! multiplying: 0·NaN is NaN), and counted. Both ways are tested: selection after a read per
//! micro-batch (a CPU), masking with one read per part (a GPU).
//! The images here carry the NaN and the ∞ directly, a test-only input: real images decode to
//! finite pixels, and diverged weights reach the same code path.

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};
use dpcap_ml::CpuBackend;
use dpcap_ml::clip::norms::LinearForm;
use dpcap_ml::clip::{ClipEngine, Lanes, MatmulInputs, Objective, Precision, Reads};
use dpcap_ml::model::{CaptionBatch, Captioner, CaptionerConfig};
use dpcap_ml::params::ParamSet;

type Inner = <CpuBackend as AutodiffBackend>::InnerBackend;

fn flat(sum: &dpcap_ml::clip::GradSum<Inner>) -> Vec<f32> {
    sum.flatten().into_data().convert::<f32>().into_vec().unwrap()
}

#[test]
fn a_nan_and_an_infinite_example_add_nothing_are_counted_and_leave_a_part_the_accountant_accepts() {
    let config = CaptionerConfig::named("micro").unwrap();
    let device = Default::default();
    let mut params = ParamSet::<Inner>::seeded(&device, 7);
    let model = Captioner::new(&mut params, config);
    let batch = CaptionBatch::<CpuBackend>::random(config, 6, &device);
    // Example 1 sees a NaN pixel and example 4 an infinite one.
    let mut pixels: Vec<f32> = batch.images.clone().into_data().convert::<f32>().into_vec().unwrap();
    let per_image = 3 * config.encoder.image * config.encoder.image;
    pixels[per_image + 5] = f32::NAN;
    pixels[4 * per_image + 9] = f32::INFINITY;
    let dims = batch.images.dims();
    let poisoned = CaptionBatch { images: Tensor::from_data(TensorData::new(pixels, dims), &device), ..batch.clone() };
    // With the TF32 norm bound too: its terms keep a NaN a NaN, so the example is still left out.
    let mut got_flat = Vec::new();
    let ways = [MatmulInputs::F32, MatmulInputs::Tf32]
        .into_iter()
        .flat_map(|m| [(m, Reads::PerMicroBatch), (m, Reads::PerPart)]);
    for (matmul_inputs, reads) in ways {
        // Two lanes, each with one of the bad examples (1 and 4).
        let lanes = Lanes::new(2);
        let engine =
            ClipEngine { clipping_norm: 0.5, micro_batch: 4, precision: Precision::F32, matmul_inputs, reads, lanes };
        let got = engine.clipped_sum(&model, &params, &poisoned);
        assert_eq!(got.telemetry.nonfinite, 2, "both counted");
        assert_eq!(got.telemetry.losses.len(), 4, "telemetry of the finite examples only");

        // The sum over the four finite examples alone, in the same micro-batches' worth of work.
        let finite = [0, 2, 3, 5].map(|i| model.slice(&batch, i..i + 1));
        let mut want = vec![0.0f32; got.sum.grads.iter().map(|g| g.dims()[0]).sum()];
        for example in &finite {
            let one = engine.clipped_sum(&model, &params, example);
            want.iter_mut().zip(flat(&one.sum)).for_each(|(w, v)| *w += v);
        }
        got_flat = flat(&got.sum);
        let scale = want.iter().map(|v| v.abs()).fold(0.0f32, f32::max);
        for (i, (g, w)) in got_flat.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-4 * scale, "{reads:?}, coordinate {i}: {g} vs {w}");
        }
    }
    // The accountant's own check of a part's bytes.
    let bytes = dpcap_proto::floats::to_bytes(&got_flat);
    let mut values = Vec::new();
    dpcap_proto::floats::extend_finite(&mut values, &bytes, 0).expect("every value of the part is finite");
}

/// A linear layer on a sequence whose input holds +∞ for one example: with all weights 1 its
/// outputs are +∞, tanh saturates at 1 and the loss is finite, but the output gradient is 0,
/// so that example's weight gradient is ∞·0 = NaN. The loss alone cannot catch it; the
/// squared norm does, as long as it is read before any clamp.
#[derive(Debug, Clone, Copy)]
struct Saturated {
    weight: dpcap_ml::params::ParamId,
    bias: dpcap_ml::params::ParamId,
}

impl Objective<CpuBackend> for Saturated {
    type Batch = Tensor<CpuBackend, 3>;
    fn losses(&self, tape: &mut dpcap_ml::clip::Tape<'_, CpuBackend>, x: &Self::Batch) -> Tensor<CpuBackend, 1> {
        let y = tape.linear(self.weight, Some(self.bias), x.clone());
        let [b, _, _] = y.dims();
        y.tanh().powi_scalar(2).reshape([b as i32, -1]).mean_dim(1).squeeze_dim(1)
    }
    fn batch_len(&self, x: &Self::Batch) -> usize {
        x.dims()[0]
    }
    fn slice(&self, x: &Self::Batch, range: std::ops::Range<usize>) -> Self::Batch {
        x.clone().slice([range])
    }
}

#[test]
fn an_example_with_a_finite_loss_but_a_nan_gradient_is_left_out_too() {
    use dpcap_ml::params::Init;
    let device = Default::default();
    let mut params = ParamSet::<Inner>::seeded(&device, 3);
    let model = Saturated { weight: params.add("w", &[4, 3], Init::Ones), bias: params.add("b", &[3], Init::Zeros) };
    // T = 2 takes the ghost form, T = 4 keeps its per-example gradients for the sum (Reused):
    // the NaN gradient must be left out of both, by selection and by masking.
    let ways = [2, 4].into_iter().flat_map(|t| [(t, Reads::PerMicroBatch), (t, Reads::PerPart)]);
    for (t, reads) in ways {
        let shape = dpcap_ml::clip::rounding::LinearShape { t, d_in: 4, d_out: 3 };
        let form = dpcap_ml::clip::norms::linear_form(shape, MatmulInputs::F32);
        let want_form = if t == 2 { LinearForm::Ghost } else { LinearForm::Reused };
        assert_eq!(form, want_form, "T = {t}");
        let mut x: Vec<f32> = (0..3 * t * 4).map(|i| (i % 5) as f32 * 0.1 - 0.2).collect();
        x[t * 4] = f32::INFINITY; // example 1, token 0, feature 0
        let batch = Tensor::<CpuBackend, 3>::from_data(TensorData::new(x, [3, t, 4]), &device);
        let engine = ClipEngine {
            clipping_norm: 1.0,
            micro_batch: 3,
            precision: Precision::F32,
            matmul_inputs: Default::default(),
            reads,
            lanes: Default::default(),
        };
        let got = engine.clipped_sum(&model, &params, &batch);
        assert_eq!(got.telemetry.nonfinite, 1, "{reads:?}: {:?}", got.telemetry);
        assert!(got.telemetry.losses.iter().all(|l| l.is_finite()));
        let values = flat(&got.sum);
        assert!(values.iter().all(|v| v.is_finite()), "{reads:?}: {values:?}");
        let finite = [0, 2].map(|i| engine.clipped_sum(&model, &params, &model.slice(&batch, i..i + 1)));
        let want: Vec<f32> = flat(&finite[0].sum).iter().zip(flat(&finite[1].sum)).map(|(a, b)| a + b).collect();
        for (g, w) in values.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{reads:?}: {g} vs {w}");
        }
    }
}
