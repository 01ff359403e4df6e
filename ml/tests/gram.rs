//! The ghost norms' symmetric Gram kernels on a CPU against the per-example gradients they
//! stand for: ‖a_iᵀ δ_i‖² from one matmul per example, on sequence lengths and widths that
//! leave partial register blocks and scalar tails, and with non-finite values in one example.

use burn::backend::Flex;
use burn::tensor::{Distribution, Tensor, TensorData};
use dpcap_ml::clip::norms;

fn random(b: usize, t: usize, d: usize, seed: u64) -> Tensor<Flex, 3> {
    <Flex as burn::tensor::backend::Backend>::seed(&Default::default(), seed);
    Tensor::random([b, t, d], Distribution::Normal(0.0, 1.0), &Default::default())
}

/// ‖a_iᵀ δ_i‖² per example, through the per-example gradient (a batched matmul).
fn materialised(a: &Tensor<Flex, 3>, delta: &Tensor<Flex, 3>) -> Vec<f32> {
    norms::per_example_sq_norms(&norms::linear_weight_per_example(a, delta)).into_data().to_vec().unwrap()
}

fn ghost(a: &Tensor<Flex, 3>, delta: &Tensor<Flex, 3>) -> Vec<f32> {
    let aa = norms::gram(a);
    assert!(aa.is_packed(), "an f32 CPU tensor takes the packed kernels");
    norms::ghost_sq_norms(&aa, delta).into_data().to_vec().unwrap()
}

#[test]
fn packed_ghost_norms_equal_the_per_example_gradients_norms_on_ragged_shapes() {
    // T past every block size (3, 4) and below it; d with and without a scalar tail, below
    // one vector and over several; d_in ≠ d_out.
    for (t, d_in, d_out) in [(1, 5, 3), (2, 16, 16), (7, 37, 19), (13, 128, 64), (64, 128, 128), (65, 48, 200)] {
        let (a, delta) = (random(3, t, d_in, 7), random(3, t, d_out, 8));
        let (want, got) = (materialised(&a, &delta), ghost(&a, &delta));
        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
            let rel = (w - g).abs() / w.abs().max(1e-6);
            assert!(rel < 1e-4, "T={t} d_in={d_in} d_out={d_out} example {i}: ghost {g}, per-example {w}");
        }
    }
}

#[test]
fn a_non_finite_value_in_one_example_makes_its_norm_non_finite_and_no_other() {
    let (b, t, d) = (4, 9, 21);
    // A middle column (in whole vectors) and the last (a scalar tail at every vector width).
    for (bad, column) in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY].into_iter().flat_map(|v| [(v, d / 2), (v, d - 1)])
    {
        for in_delta in [false, true] {
            let mut values: Vec<f32> = random(b, t, d, 3).into_data().to_vec().unwrap();
            // Example 2 at its last position: in the last, partial block of rows.
            values[2 * t * d + (t - 1) * d + column] = bad;
            let poisoned = Tensor::<Flex, 3>::from_data(TensorData::new(values, [b, t, d]), &Default::default());
            let clean = random(b, t, d, 4);
            let (a, delta) = if in_delta { (clean, poisoned) } else { (poisoned, clean) };
            let sq = ghost(&a, &delta);
            for (i, v) in sq.iter().enumerate() {
                assert_eq!(
                    v.is_finite(),
                    i != 2,
                    "{bad} in {}: example {i} has norm² {v}",
                    if in_delta { "δ" } else { "a" }
                );
            }
        }
    }
}

#[test]
fn an_empty_sequence_has_norm_zero() {
    let (a, delta) = (random(2, 0, 8, 1), random(2, 0, 8, 2));
    assert_eq!(ghost(&a, &delta), vec![0.0, 0.0]);
}
