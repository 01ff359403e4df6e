//! The fused ops against burn's own: the same values forward and the same input gradients
//! backward, on shapes that are not a multiple of any vector width, contiguous or not; and
//! checks that the fused path (not a fallback) is what ran.

use burn::tensor::activation;
use burn::tensor::{Distribution, Tensor};
use dpcap_ml::CpuBackend;
use dpcap_ml::fused::{self, kernels};

/// f(x) and the gradient of Σ f(x)⊙w with respect to x, as host values.
fn forward_and_grad<const D: usize>(
    x: &Tensor<CpuBackend, D>,
    w: &Tensor<CpuBackend, D>,
    f: impl Fn(Tensor<CpuBackend, D>) -> Tensor<CpuBackend, D>,
) -> (Vec<f32>, Vec<f32>) {
    let leaf = x.clone().detach().require_grad();
    let y = f(leaf.clone());
    let grads = (y.clone() * w.clone()).sum().backward();
    let dx: Vec<f32> = leaf.grad(&grads).expect("x is on the graph").into_data().to_vec().unwrap();
    (y.into_data().to_vec::<f32>().unwrap(), dx)
}

#[test]
fn the_vectorised_erf_stays_within_1e_6_of_erff() {
    let mut worst = (0f32, 0f32);
    for i in -200_000..=200_000 {
        let x = i as f32 * 5e-5;
        let err = (kernels::erf(x) - libm::erff(x)).abs();
        if err > worst.0 {
            worst = (err, x);
        }
    }
    assert!(worst.0 <= 1e-6, "erf is {} off erff at {}", worst.0, worst.1);
    for x in [0.0, -0.0, 1e-30, 30.0, -30.0, f32::INFINITY, f32::NEG_INFINITY] {
        assert!((kernels::erf(x) - libm::erff(x)).abs() <= 1e-6, "erf({x})");
    }
    assert!(kernels::erf(f32::NAN).is_nan(), "a NaN stays a NaN, so its example is left out");
}

#[test]
fn the_fused_gelu_matches_burns_forward_and_backward() {
    let device = Default::default();
    let x = Tensor::<CpuBackend, 3>::random([5, 7, 33], Distribution::Normal(0.0, 3.0), &device);
    let w = Tensor::<CpuBackend, 3>::random([5, 7, 33], Distribution::Normal(0.0, 1.0), &device);
    // Contiguous, and a transposed view (the op copies it once, burn-flex reads it strided).
    for x in [x.clone(), x.swap_dims(0, 2).swap_dims(0, 2).swap_dims(1, 2)] {
        let w = w.clone().reshape(x.dims());
        let (fused_y, fused_dx) = forward_and_grad(&x, &w, fused::gelu);
        let (burn_y, burn_dx) = forward_and_grad(&x, &w, activation::gelu);
        let xs: Vec<f32> = x.clone().into_data().to_vec().unwrap();
        // The fused path ran (not a fallback to burn's op): its values are the kernels' own.
        let ws: Vec<f32> = w.clone().into_data().to_vec().unwrap();
        let (mut want_y, mut want_dx) = (vec![0f32; xs.len()], vec![0f32; xs.len()]);
        kernels::gelu(&xs, &mut want_y);
        kernels::gelu_grad(&xs, &ws, &mut want_dx);
        assert_eq!((&fused_y, &fused_dx), (&want_y, &want_dx));
        for i in 0..xs.len() {
            let scale = xs[i].abs().max(1.0);
            assert!((fused_y[i] - burn_y[i]).abs() <= 2e-6 * scale, "gelu({}): {} vs {}", xs[i], fused_y[i], burn_y[i]);
            assert!(
                (fused_dx[i] - burn_dx[i]).abs() <= 2e-6 * scale,
                "gelu'({}): {} vs {}",
                xs[i],
                fused_dx[i],
                burn_dx[i]
            );
        }
    }
}

#[test]
fn the_fused_gelu_keeps_non_finite_values_non_finite() {
    let device = Default::default();
    let x = Tensor::<CpuBackend, 1>::from_floats([f32::NAN, f32::INFINITY, -1.0], &device);
    let y: Vec<f32> = fused::gelu(x).into_data().to_vec().unwrap();
    assert!(y[0].is_nan() && y[1] == f32::INFINITY && y[2].is_finite(), "{y:?}");
}

#[test]
fn the_fused_softmax_matches_burns_forward_and_backward_with_masked_scores() {
    let device = Default::default();
    let [b, h, t, s] = [3, 2, 5, 17];
    let scores = Tensor::<CpuBackend, 4>::random([b, h, t, s], Distribution::Normal(0.0, 4.0), &device);
    // A causal-style mask, as attention fills it: those weights must be exactly 0.
    let mask = Tensor::<CpuBackend, 2, burn::tensor::Bool>::tril_mask([t, s], 0, &device).unsqueeze::<4>();
    let scores = scores.mask_fill(mask.expand([b, h, t, s]), -1e9);
    let w = Tensor::<CpuBackend, 4>::random([b, h, t, s], Distribution::Normal(0.0, 1.0), &device);
    for x in [scores.clone(), scores.swap_dims(1, 2).swap_dims(1, 2)] {
        let (fused_y, fused_dx) = forward_and_grad(&x, &w, |x| fused::softmax(x, 3));
        let (burn_y, burn_dx) = forward_and_grad(&x, &w, |x| activation::softmax(x, 3));
        let xs: Vec<f32> = x.clone().into_data().to_vec().unwrap();
        let mut want_y = vec![0f32; xs.len()];
        kernels::softmax(&xs, &mut want_y, s);
        assert_eq!(fused_y, want_y, "the fused path ran");
        for i in 0..xs.len() {
            assert!((fused_y[i] - burn_y[i]).abs() <= 1e-6, "softmax at {i}: {} vs {}", fused_y[i], burn_y[i]);
            assert!((fused_dx[i] - burn_dx[i]).abs() <= 1e-5, "softmax' at {i}: {} vs {}", fused_dx[i], burn_dx[i]);
            if xs[i] == -1e9 {
                assert_eq!((fused_y[i], fused_dx[i]), (0.0, 0.0), "a masked score weighs nothing");
            }
        }
    }
}

#[test]
fn a_nan_score_makes_its_row_nan_and_leaves_the_others() {
    let device = Default::default();
    let x = Tensor::<CpuBackend, 2>::from_floats([[0.0, f32::NAN, 1.0], [0.0, 1.0, 2.0]], &device);
    let y: Vec<f32> = fused::softmax(x, 1).into_data().to_vec().unwrap();
    assert!(y[..3].iter().all(|v| v.is_nan()), "{y:?}");
    assert!(y[3..].iter().all(|v| v.is_finite()) && (y[3..].iter().sum::<f32>() - 1.0).abs() < 1e-6, "{y:?}");
}

#[test]
fn the_fused_layer_norm_matches_burns_forward_and_backward() {
    let device = Default::default();
    let eps = 1e-6;
    // Rows off the mean, with a scale (the variance must be of each row), contiguous and not.
    let x = Tensor::<CpuBackend, 3>::random([4, 6, 37], Distribution::Normal(3.0, 5.0), &device);
    let w = Tensor::<CpuBackend, 3>::random([4, 6, 37], Distribution::Normal(0.0, 1.0), &device);
    let burn_ln = |x: Tensor<CpuBackend, 3>| {
        let (var, mean) = x.clone().var_mean_bias(2);
        (x - mean) / (var + eps).sqrt()
    };
    for x in [x.clone(), x.swap_dims(0, 1).swap_dims(0, 1)] {
        let (fused_y, fused_dx) = forward_and_grad(&x, &w, |x| fused::layer_norm(x, eps));
        let (burn_y, burn_dx) = forward_and_grad(&x, &w, burn_ln);
        let xs: Vec<f32> = x.clone().into_data().to_vec().unwrap();
        let (mut want_y, mut inv) = (vec![0f32; xs.len()], vec![0f32; xs.len() / 37]);
        kernels::layer_norm(&xs, &mut want_y, &mut inv, 37, eps as f32);
        assert_eq!(fused_y, want_y, "the fused path ran");
        for i in 0..xs.len() {
            assert!((fused_y[i] - burn_y[i]).abs() <= 2e-6, "x̂ at {i}: {} vs {}", fused_y[i], burn_y[i]);
            assert!((fused_dx[i] - burn_dx[i]).abs() <= 2e-6, "dx at {i}: {} vs {}", fused_dx[i], burn_dx[i]);
        }
    }
}

#[test]
fn a_nan_in_a_row_makes_its_layer_norm_nan_and_leaves_the_others() {
    let device = Default::default();
    let x = Tensor::<CpuBackend, 2>::from_floats([[0.0, f32::NAN, 1.0], [0.0, 1.0, 2.0]], &device);
    let y: Vec<f32> = fused::layer_norm(x, 1e-6).into_data().to_vec().unwrap();
    assert!(y[..3].iter().all(|v| v.is_nan()), "{y:?}");
    assert!(y[3..].iter().all(|v| v.is_finite()), "{y:?}");
}

/// Attention from burn's ops: heads split by reshapes, masked like the model's.
fn attention_unfused(
    q: Tensor<CpuBackend, 3>,
    k: Tensor<CpuBackend, 3>,
    v: Tensor<CpuBackend, 3>,
    heads: usize,
    causal: bool,
) -> Tensor<CpuBackend, 3> {
    let ([b, t, d], s) = (q.dims(), k.dims()[1]);
    let split = |x: Tensor<CpuBackend, 3>, n: usize| x.reshape([b, n, heads, d / heads]).swap_dims(1, 2);
    let mut scores = split(q, t).matmul(split(k, s).swap_dims(2, 3)).div_scalar(((d / heads) as f64).sqrt());
    if causal {
        let mask = Tensor::<CpuBackend, 2, burn::tensor::Bool>::tril_mask([t, s], 0, &scores.device());
        scores = scores.mask_fill(mask.unsqueeze::<4>().expand([b, heads, t, s]), -1e9);
    }
    activation::softmax(scores, 3).matmul(split(v, s)).swap_dims(1, 2).reshape([b, t, d])
}

/// The output and the gradients of Σ out⊙w for q, k and v, as host values.
fn attention_and_grads(
    (q, k, v): (&Tensor<CpuBackend, 3>, &Tensor<CpuBackend, 3>, &Tensor<CpuBackend, 3>),
    w: &Tensor<CpuBackend, 3>,
    f: impl FnOnce(Tensor<CpuBackend, 3>, Tensor<CpuBackend, 3>, Tensor<CpuBackend, 3>) -> Tensor<CpuBackend, 3>,
) -> [Vec<f32>; 4] {
    let leaf = |x: &Tensor<CpuBackend, 3>| x.clone().detach().require_grad();
    let (q, k, v) = (leaf(q), leaf(k), leaf(v));
    let y = f(q.clone(), k.clone(), v.clone());
    let grads = (y.clone() * w.clone()).sum().backward();
    let host = |x: Tensor<CpuBackend, 3>| x.into_data().to_vec::<f32>().unwrap();
    let grad = |x: &Tensor<CpuBackend, 3>| x.grad(&grads).expect("on the graph").into_data().to_vec::<f32>().unwrap();
    [host(y), grad(&q), grad(&k), grad(&v)]
}

#[test]
fn fused_attention_on_merged_heads_matches_burns_forward_and_backward() {
    let device = Default::default();
    let normal = |dims: [usize; 3]| Tensor::<CpuBackend, 3>::random(dims, Distribution::Normal(0.0, 1.5), &device);
    // Self-attention, causal and not; cross-attention (S ≠ T); head widths of whole vectors and
    // with scalar tails (5, 24); one head and several.
    for (b, t, s, d, heads, causal) in
        [(2, 9, 9, 64, 4, true), (2, 9, 9, 64, 4, false), (3, 5, 13, 15, 3, false), (1, 7, 7, 24, 1, true)]
    {
        let (q, k, v, w) = (normal([b, t, d]), normal([b, s, d]), normal([b, s, d]), normal([b, t, d]));
        let fused = attention_and_grads((&q, &k, &v), &w, |q, k, v| {
            fused::attention((q, k, v), heads, causal, |_, _, _| panic!("the fused op fell back to burn's"))
        });
        let burn = attention_and_grads((&q, &k, &v), &w, |q, k, v| attention_unfused(q, k, v, heads, causal));
        for (name, (f, r)) in ["out", "dq", "dk", "dv"].iter().zip(fused.iter().zip(&burn)) {
            let worst = f.iter().zip(r).map(|(f, r)| (f - r).abs() / r.abs().max(1.0)).fold(0f32, f32::max);
            assert!(worst < 1e-5, "{name} (b={b} t={t} s={s} d={d} heads={heads} causal={causal}): off by {worst}");
        }
    }
}

#[test]
fn a_nan_key_poisons_only_its_own_example_in_fused_attention() {
    let device = Default::default();
    let x = Tensor::<CpuBackend, 3>::random([2, 4, 8], Distribution::Normal(0.0, 1.0), &device);
    let mut k: Vec<f32> = x.clone().into_data().to_vec().unwrap();
    k[3] = f32::NAN;
    let k = Tensor::<CpuBackend, 3>::from_data(burn::tensor::TensorData::new(k, [2, 4, 8]), &device);
    let y: Vec<f32> =
        fused::attention((x.clone(), k, x), 2, false, |_, _, _| panic!("fell back")).into_data().to_vec().unwrap();
    assert!(y[..32].iter().any(|v| v.is_nan()), "example 0 read a NaN key");
    assert!(y[32..].iter().all(|v| v.is_finite()), "example 1 is untouched");
}

#[test]
fn the_fused_log_softmax_matches_burns_forward_and_backward() {
    let device = Default::default();
    let x = Tensor::<CpuBackend, 3>::random([3, 5, 41], Distribution::Normal(0.0, 6.0), &device);
    let w = Tensor::<CpuBackend, 3>::random([3, 5, 41], Distribution::Normal(0.0, 1.0), &device);
    for x in [x.clone(), x.swap_dims(0, 1).swap_dims(0, 1)] {
        let (fused_y, fused_dx) = forward_and_grad(&x, &w, |x| fused::log_softmax(x, 2));
        let (burn_y, burn_dx) = forward_and_grad(&x, &w, |x| activation::log_softmax(x, 2));
        let xs: Vec<f32> = x.clone().into_data().to_vec().unwrap();
        let mut want_y = vec![0f32; xs.len()];
        kernels::log_softmax(&xs, &mut want_y, 41);
        assert_eq!(fused_y, want_y, "the fused path ran");
        for i in 0..xs.len() {
            let scale = burn_y[i].abs().max(1.0);
            assert!((fused_y[i] - burn_y[i]).abs() <= 2e-6 * scale, "log p at {i}: {} vs {}", fused_y[i], burn_y[i]);
            let scale = burn_dx[i].abs().max(1.0);
            assert!((fused_dx[i] - burn_dx[i]).abs() <= 2e-6 * scale, "dx at {i}: {} vs {}", fused_dx[i], burn_dx[i]);
        }
    }
    let nan = Tensor::<CpuBackend, 2>::from_floats([[0.0, f32::NAN, 1.0], [0.0, 1.0, 2.0]], &device);
    let y: Vec<f32> = fused::log_softmax(nan, 1).into_data().to_vec().unwrap();
    assert!(y[..3].iter().all(|v| v.is_nan()) && y[3..].iter().all(|v| v.is_finite()), "{y:?}");
}
