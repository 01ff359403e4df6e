//! Leaving out the examples whose loss or gradient is not finite, and when the host learns
//! which they were.
//!
//! One NaN voids a whole part, and scaling an example by 0 does not remove it (0·NaN is NaN),
//! so a non-finite example is removed either by selection (its rows are never summed) or by
//! masking (its rows are replaced by zeros before they are summed). Selection needs the host to
//! know the bad rows, a device→host read per micro-batch that drains a GPU's queue; masking
//! needs none, at the price of a pass over every record, which on a CPU backend costs more than
//! the read. [`Reads`] picks one per device.

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Tensor};

/// When the host reads a micro-batch's squared norms and losses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Reads {
    /// After every micro-batch: non-finite examples are left out by selection.
    #[default]
    PerMicroBatch,
    /// Once, when the part is complete ([`super::ClippedSum::settle`]): non-finite examples
    /// are masked on the device, and no micro-batch waits for the host.
    PerPart,
}

impl Reads {
    /// The choice for a device string: a GPU (cuda, wgpu) masks and reads once per part (each
    /// read would stall its queue), a CPU selects (its reads are free and masking is not).
    pub fn for_device(device: &str) -> Self {
        if device.starts_with("cuda") || device.starts_with("wgpu") { Self::PerPart } else { Self::PerMicroBatch }
    }
}

/// The examples of one micro-batch, read from the device, whose squared norm `sq` and loss
/// are both finite: the ones the sum keeps.
pub fn kept(sq: &[f32], losses: &[f32]) -> Vec<usize> {
    (0..sq.len()).filter(|&i| sq[i].is_finite() && losses[i].is_finite()).collect()
}

/// The examples (rows of dimension 0) whose squared norm or loss is not finite. A non-finite
/// activation or output gradient anywhere in an example makes its squared norm non-finite
/// (a·a or δ·δ is, and ∞·0 is NaN), so this finds them all.
pub fn bad_rows<B: Backend>(sq: &Tensor<B, 1>, losses: &Tensor<B, 1>) -> Tensor<B, 1, Bool> {
    sq.clone().is_finite().bool_and(losses.clone().is_finite()).bool_not()
}

/// `x` with the rows `bad` replaced by zeros (whatever they held, NaN included).
pub fn zero_rows<B: Backend>(x: Tensor<B, 3>, bad: &Tensor<B, 1, Bool>) -> Tensor<B, 3> {
    let dims = x.dims();
    let mask = bad.clone().reshape([dims[0], 1, 1]).expand(dims);
    x.mask_fill(mask, 0.0)
}

/// `x` with the entries `bad` replaced by zeros.
pub fn zero_entries<B: Backend>(x: Tensor<B, 1>, bad: &Tensor<B, 1, Bool>) -> Tensor<B, 1> {
    x.mask_fill(bad.clone(), 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CpuBackend;
    use burn::tensor::TensorData;

    type B = <CpuBackend as burn::tensor::backend::AutodiffBackend>::InnerBackend;

    #[test]
    fn a_gpu_reads_once_per_part_and_a_cpu_once_per_micro_batch() {
        assert_eq!(Reads::for_device("cuda:3"), Reads::PerPart);
        assert_eq!(Reads::for_device("wgpu"), Reads::PerPart);
        assert_eq!(Reads::for_device("cpu"), Reads::PerMicroBatch);
    }

    #[test]
    fn an_example_is_kept_only_when_its_squared_norm_and_its_loss_are_finite() {
        assert_eq!(kept(&[4.0, f32::NAN, 9.0, 1.0], &[0.5, 0.1, f32::INFINITY, 0.25]), [0, 3]);
    }

    #[test]
    fn masked_rows_are_zero_even_where_they_held_nan_and_the_others_are_untouched() {
        let device = Default::default();
        let sq = Tensor::<B, 1>::from_data(TensorData::new(vec![1.0f32, f32::NAN, 2.0], [3]), &device);
        let losses = Tensor::<B, 1>::from_data(TensorData::new(vec![0.5f32, 0.5, f32::NEG_INFINITY], [3]), &device);
        let bad = bad_rows(&sq, &losses);
        let x = Tensor::<B, 3>::from_data(
            TensorData::new(vec![1.0f32, 2.0, f32::NAN, f32::INFINITY, 5.0, 6.0], [3, 1, 2]),
            &device,
        );
        let zeroed: Vec<f32> = zero_rows(x, &bad).into_data().into_vec().unwrap();
        assert_eq!(zeroed, [1.0, 2.0, 0.0, 0.0, 0.0, 0.0]);
        let factors: Vec<f32> = zero_entries(sq, &bad).into_data().into_vec().unwrap();
        assert_eq!(factors, [1.0, 0.0, 0.0]);
    }
}
