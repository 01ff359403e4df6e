//! What one clipped step costs beyond its arithmetic, counted on CPU so that it cannot regress
//! unseen before a GPU run: device→host reads (each drains a GPU's queue), uploads, and casts.

use burn::tensor::backend::AutodiffBackend;
use dpcap_ml::CpuBackend;
use dpcap_ml::clip::counters::{Counts, counts};
use dpcap_ml::clip::{ClipEngine, ClippedSum, Lanes, Objective, Precision, Reads};
use dpcap_ml::model::{CaptionBatch, Captioner, CaptionerConfig};
use dpcap_ml::params::ParamSet;

type AB = CpuBackend;
type Inner = <AB as AutodiffBackend>::InnerBackend;

/// The counts of one bf16 clipped step of `examples` examples in micro-batches of `micro`:
/// while the part streams, and in settling it once it is complete.
fn step(examples: usize, micro: usize, reads: Reads) -> (Counts, Counts) {
    step_on(examples, micro, reads, Lanes::default())
}

/// [`step`] with its examples on `lanes` side by side.
fn step_on(examples: usize, micro: usize, reads: Reads, lanes: Lanes) -> (Counts, Counts) {
    let config = CaptionerConfig::named("micro").unwrap();
    let mut params = ParamSet::<Inner>::new(&Default::default());
    let model = Captioner::new(&mut params, config);
    let batch = CaptionBatch::<AB>::random(config, examples, &Default::default());
    let engine = ClipEngine {
        clipping_norm: 0.05,
        micro_batch: micro,
        precision: Precision::Bf16,
        matmul_inputs: Default::default(),
        reads,
        lanes,
    };
    let before = counts();
    // As a rank streams its share: one part, one `accumulate` per chunk of a micro-batch.
    let mut sum = ClippedSum::zeros(&params);
    for start in (0..examples).step_by(micro) {
        let chunk = Objective::<AB>::slice(&model, &batch, start..(start + micro).min(examples));
        engine.accumulate(&model, &params, &chunk, &mut sum);
    }
    let streamed = counts();
    sum.settle();
    let settled = counts();
    assert_eq!(sum.telemetry.norms.len(), examples, "every example was finite and kept");
    (streamed - before, settled - streamed)
}

#[test]
fn a_bf16_clipped_step_reads_the_device_once_per_micro_batch_and_casts_each_weight_once() {
    let (one, _) = step(2, 2, Reads::PerMicroBatch);
    let (three, settled) = step(6, 2, Reads::PerMicroBatch);
    eprintln!("one micro-batch: {one:?}; three: {three:?}");
    assert_eq!((one.syncs, three.syncs), (1, 3), "one device read per micro-batch: {one:?} {three:?}");
    assert_eq!(settled, Counts::default(), "nothing is left to read once the part is complete");
    assert_eq!((one.uploads, three.uploads), (0, 0), "nothing uploaded while every example is finite");
    assert!(one.weight_casts > 0, "the weights were cast to bf16: {one:?}");
    assert_eq!(three.weight_casts, one.weight_casts, "weights are cast once per step, not per micro-batch");
    assert_eq!(
        three.activation_casts,
        3 * one.activation_casts,
        "activations are cast in each micro-batch only (a lower and a widen per product)"
    );
}

#[test]
fn lanes_side_by_side_count_on_the_caller_and_share_one_cast_of_each_weight() {
    let (one, _) = step(4, 4, Reads::PerMicroBatch);
    let (two, _) = step_on(4, 4, Reads::PerMicroBatch, Lanes::new(2));
    eprintln!("one lane: {one:?}; two lanes: {two:?}");
    assert_eq!((one.syncs, two.syncs), (1, 2), "one read per lane's micro-batch, all counted here: {two:?}");
    assert_eq!(two.weight_casts, one.weight_casts, "the lanes share the step's cast weights");
    assert_eq!(two.activation_casts, 2 * one.activation_casts, "each lane casts its own activations");
}

#[test]
fn on_a_gpu_no_micro_batch_waits_for_the_host_and_the_part_is_read_once_when_complete() {
    let (streamed, settled) = step(6, 2, Reads::PerPart);
    let (per_micro_batch, _) = step(6, 2, Reads::PerMicroBatch);
    eprintln!("three micro-batches: {streamed:?}, then settled: {settled:?}");
    assert_eq!((streamed.syncs, streamed.uploads), (0, 0), "no read and no upload while the part streams");
    assert_eq!(settled.syncs, 1, "one read of every micro-batch's norms and losses, once the part is complete");
    assert_eq!(streamed.weight_casts, per_micro_batch.weight_casts, "the same casts either way");
    assert_eq!(streamed.activation_casts, per_micro_batch.activation_casts);
}
