//! The ClipEngine: Σ_i clip_C(g_i) over a logical batch in one forward and one backward per
//! micro-batch (book-keeping with ghost norms), plus the two references it is measured
//! against: the naive method (one backward per example) and the non-private step.
//!
//! Clip factor c_i = min(1, C / (‖g_i‖ + 1e-6)), with C the L2 clipping norm.

pub mod counters;
mod engine;
pub mod finite;
mod gram;
mod lanes;
pub mod norms;
mod records;
pub mod rounding;
mod tape;

pub use engine::{
    ClipEngine, ClippedSum, GradSum, Telemetry, clip_factor, naive_clipped_sum, nonprivate_sum, plain_grads,
};
pub use finite::Reads;
pub use lanes::Lanes;
pub use rounding::{MatmulInputs, NORM_EPSILON};
pub use tape::{LoweredWeights, Mode, Precision, Record, Shared, Tape};

use std::ops::Range;

use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

/// A model with a per-example loss: what the ClipEngine needs of it.
pub trait Objective<AB: AutodiffBackend>: Sync {
    /// A batch of examples (shared by the [`Lanes`] that run its examples side by side).
    type Batch: Clone + Send + Sync;

    /// Per-example losses [B] of a forward pass recorded on `tape`. Examples must not interact
    /// (no batch statistics): that is what makes one backward of Σ losses give per-example δ.
    fn losses(&self, tape: &mut Tape<'_, AB>, batch: &Self::Batch) -> Tensor<AB, 1>;

    /// Number of examples in `batch`.
    fn batch_len(&self, batch: &Self::Batch) -> usize;

    /// The examples `range` of `batch`.
    fn slice(&self, batch: &Self::Batch, range: Range<usize>) -> Self::Batch;
}
