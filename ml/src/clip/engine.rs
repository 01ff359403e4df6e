//! Running the clip step and its references over micro-batches.

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor};

use super::Objective;
use super::counters;
use super::finite::{self, Reads};
use super::lanes::{self, Lanes};
use super::records::{Delta, Norms, add_clipped_sums, mask_rows, select_rows, sq_norms};
use super::rounding::{self, MatmulInputs, NORM_EPSILON};
use super::tape::{LoweredWeights, Mode, Precision, Tape};
use crate::params::{ParamId, ParamSet};

type Inner<AB> = <AB as AutodiffBackend>::InnerBackend;

/// The clip factor c = min(1, C / (‖g‖ + 1e-6)) of a gradient of L2 norm `norm` at clipping
/// norm C, so that ‖c·g‖ ≤ C.
pub fn clip_factor(norm: f64, clipping_norm: f64) -> f64 {
    (clipping_norm / (norm + NORM_EPSILON)).min(1.0)
}

/// A running sum of gradients, one flat tensor per parameter.
#[derive(Debug, Clone)]
pub struct GradSum<B: Backend> {
    /// Σ per parameter, aligned with the [`ParamSet`] ids.
    pub grads: Vec<Tensor<B, 1>>,
}

impl<B: Backend> GradSum<B> {
    /// Zeros shaped like `params`.
    pub fn zeros(params: &ParamSet<B>) -> Self {
        let grads = params.ids().map(|id| Tensor::zeros([params.spec(id).numel()], params.device())).collect();
        Self { grads }
    }

    /// Adds `g` to parameter `id`'s sum.
    pub fn add(&mut self, id: ParamId, g: Tensor<B, 1>) {
        self.update(id, |running| running + g);
    }

    /// Adds `other` (a sum over the same parameters) to this one, parameter by parameter.
    pub fn add_sum(&mut self, other: GradSum<B>) {
        for (id, g) in other.grads.into_iter().enumerate() {
            self.add(ParamId(id), g);
        }
    }

    /// Replaces parameter `id`'s sum by `f(sum)`. The sum is taken out of its slot first, so
    /// that `f` holds the only handle to its buffer and the backend updates it in place (a
    /// clone would make every add allocate a fresh tensor of the parameter's size).
    pub fn update(&mut self, id: ParamId, f: impl FnOnce(Tensor<B, 1>) -> Tensor<B, 1>) {
        let device = self.grads[id.0].device();
        let running = std::mem::replace(&mut self.grads[id.0], Tensor::empty([0], &device));
        self.grads[id.0] = f(running);
    }

    /// Every gradient concatenated in parameter order: the P-vector sent to the accountant.
    pub fn flatten(&self) -> Tensor<B, 1> {
        Tensor::cat(self.grads.clone(), 0)
    }
}

/// Non-DP telemetry computed from raw data: per-example losses and gradient norms.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Telemetry {
    /// Per-example losses (finite examples only).
    pub losses: Vec<f32>,
    /// Per-example gradient L2 norms before clipping (finite examples only).
    pub norms: Vec<f32>,
    /// Examples whose loss or gradient was NaN or infinite: left out of the sum by selection
    /// (they add nothing; one NaN would void the whole release) and counted.
    pub nonfinite: u64,
}

impl Telemetry {
    /// Adds one micro-batch's squared norms `sq` and `losses` (read from the device) and
    /// returns the examples that are finite ([`finite::kept`]); the others are counted.
    pub fn record(&mut self, sq: &[f32], losses: &[f32]) -> Vec<usize> {
        let kept = finite::kept(sq, losses);
        self.nonfinite += (sq.len() - kept.len()) as u64;
        self.losses.extend(kept.iter().map(|&i| losses[i]));
        self.norms.extend(kept.iter().map(|&i| sq[i].max(0.0).sqrt()));
        kept
    }

    /// Mean per-example loss over the finite examples; None when there were none (every
    /// example left out as non-finite): an absent loss, never a 0.
    pub fn mean_loss(&self) -> Option<f64> {
        (!self.losses.is_empty()).then(|| mean(&self.losses))
    }

    /// Fraction of examples whose norm exceeded C.
    pub fn clipped_fraction(&self, clipping_norm: f64) -> f64 {
        if self.norms.is_empty() {
            return 0.0;
        }
        self.norms.iter().filter(|&&n| f64::from(n) > clipping_norm).count() as f64 / self.norms.len() as f64
    }

    /// The q-quantile (0 ≤ q ≤ 1) of the per-example norms.
    pub fn norm_quantile(&self, q: f64) -> f64 {
        let mut sorted = self.norms.clone();
        sorted.sort_by(f32::total_cmp);
        sorted.get(((sorted.len().saturating_sub(1)) as f64 * q).round() as usize).map_or(0.0, |&v| f64::from(v))
    }
}

fn mean(xs: &[f32]) -> f64 {
    if xs.is_empty() { 0.0 } else { xs.iter().map(|&x| f64::from(x)).sum::<f64>() / xs.len() as f64 }
}

/// The result of a clipped step over a logical batch.
#[derive(Debug, Clone)]
pub struct ClippedSum<B: Backend> {
    /// Σ_i clip_C(g_i).
    pub sum: GradSum<B>,
    /// Non-DP telemetry.
    pub telemetry: Telemetry,
    /// The step's weights in half precision (bf16 or f16), cast on first use and shared by every micro-batch the part
    /// streams through (a rank calls [`ClipEngine::accumulate`] once per chunk of its share).
    lowered: LoweredWeights<B>,
    /// Under [`Reads::PerPart`]: each micro-batch's example count and its squared norms and
    /// losses, concatenated, still on the device until [`ClippedSum::settle`].
    pending: Vec<(usize, Tensor<B, 1>)>,
}

impl<B: Backend> ClippedSum<B> {
    /// An empty part shaped like `params` (the parameters must not change until it is done).
    pub fn zeros(params: &ParamSet<B>) -> Self {
        Self::of(GradSum::zeros(params), Telemetry::default())
    }

    /// A part holding `sum` and `telemetry`.
    pub fn of(sum: GradSum<B>, telemetry: Telemetry) -> Self {
        Self { sum, telemetry, lowered: LoweredWeights::default(), pending: Vec::new() }
    }

    /// Reads what [`Reads::PerPart`] left on the device into [`Self::telemetry`]: one
    /// device→host read for the whole part. Call it once the part is complete, before reading
    /// the telemetry; without pending micro-batches it reads nothing.
    pub fn settle(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let (lens, pending): (Vec<usize>, Vec<_>) = std::mem::take(&mut self.pending).into_iter().unzip();
        let read = to_vec(Tensor::cat(pending, 0));
        let mut at = 0;
        for b in lens {
            let (sq, losses) = read[at..at + 2 * b].split_at(b);
            self.telemetry.record(sq, losses);
            at += 2 * b;
        }
    }
}

/// Per-example clipping by book-keeping with ghost norms.
#[derive(Debug, Clone, Copy)]
pub struct ClipEngine {
    /// L2 clipping norm C.
    pub clipping_norm: f64,
    /// Examples per physical micro-batch (memory bound).
    pub micro_batch: usize,
    /// Dtype of the matrix products; norms, factors and sums are f32 either way.
    pub precision: Precision,
    /// What the backend's f32 matmuls do to their inputs: with TF32 the clip factors come from
    /// a certified upper bound on each norm ([`super::rounding`]), so ‖c_i g_i‖ ≤ C still holds.
    pub matmul_inputs: MatmulInputs,
    /// When the host learns which examples were not finite ([`finite`]): after each
    /// micro-batch (selection, for a CPU), or once per part (masking, so that a GPU never waits).
    pub reads: Reads,
    /// How many examples' passes run side by side ([`Lanes`]: one per core on a CPU, one on a
    /// GPU); `micro_batch` bounds the examples in flight across all of them.
    pub lanes: Lanes,
}

impl ClipEngine {
    /// Σ_i clip_C(g_i) over `batch`, in micro-batches.
    pub fn clipped_sum<AB: AutodiffBackend, M: Objective<AB>>(
        &self,
        model: &M,
        params: &ParamSet<Inner<AB>>,
        batch: &M::Batch,
    ) -> ClippedSum<Inner<AB>> {
        let mut out = ClippedSum::zeros(params);
        self.accumulate(model, params, batch, &mut out);
        out.settle();
        out
    }

    /// Adds Σ_i clip_C(g_i) over `batch` (in micro-batches) to `into`: a rank streams its
    /// share through this one micro-batch at a time, so memory never grows with the share.
    /// Under [`Reads::PerPart`], `into`'s telemetry is complete only after
    /// [`ClippedSum::settle`]. With several [`Lanes`], the first lane adds to `into` and each
    /// other lane to a sum of its own, added to `into` in lane order (one extra P-vector a lane).
    pub fn accumulate<AB: AutodiffBackend, M: Objective<AB>>(
        &self,
        model: &M,
        params: &ParamSet<Inner<AB>>,
        batch: &M::Batch,
        into: &mut ClippedSum<Inner<AB>>,
    ) {
        let ranges = self.lanes.within(self.micro_batch).ranges(model.batch_len(batch));
        let micro_batch = Lanes::micro_batch(self.micro_batch, ranges.len());
        let lowered = &into.lowered;
        let mut others: Vec<Partial<Inner<AB>>> = (1..ranges.len()).map(|_| Partial::zeros(params)).collect();
        let first = Sink { sum: &mut into.sum, telemetry: &mut into.telemetry, pending: &mut into.pending };
        let sinks = std::iter::once(first).chain(others.iter_mut().map(Partial::sink));
        let run = |(range, sink): (std::ops::Range<usize>, Sink<'_, Inner<AB>>)| {
            lanes::counted(|| {
                let lane = model.slice(batch, range);
                self.micro_batches_into(model, params, &lane, micro_batch, lowered, sink)
            })
            .1
        };
        lanes::add_counts(lanes::run(ranges.into_iter().zip(sinks).collect(), run));
        for other in others {
            other.add_to(into);
        }
    }

    /// One lane: `batch` in micro-batches of `micro_batch`, in order, into `sink`.
    fn micro_batches_into<AB: AutodiffBackend, M: Objective<AB>>(
        &self,
        model: &M,
        params: &ParamSet<Inner<AB>>,
        batch: &M::Batch,
        micro_batch: usize,
        lowered: &LoweredWeights<Inner<AB>>,
        sink: Sink<'_, Inner<AB>>,
    ) {
        let n = model.batch_len(batch);
        for start in (0..n).step_by(micro_batch.max(1)) {
            let micro = model.slice(batch, start..(start + micro_batch.max(1)).min(n));
            // Weights are constants for the whole part: cast once, not per micro-batch.
            let tape = Tape::new(Mode::Ghost, params).with_precision(self.precision).with_lowered(lowered);
            let sink = Sink { sum: &mut *sink.sum, telemetry: &mut *sink.telemetry, pending: &mut *sink.pending };
            self.micro_batch_into(model, tape, &micro, sink);
        }
    }

    fn micro_batch_into<AB: AutodiffBackend, M: Objective<AB>>(
        &self,
        model: &M,
        mut tape: Tape<'_, AB>,
        batch: &M::Batch,
        sink: Sink<'_, Inner<AB>>,
    ) {
        let params = tape.params();
        let losses = model.losses(&mut tape, batch);
        let grads = losses.clone().sum().backward();
        let mut records: Vec<Delta<AB>> = tape.into_records().into_iter().map(|r| Delta::read(r, &grads)).collect();
        let norms = sq_norms(&mut records, model.batch_len(batch), params, self.matmul_inputs);
        assert_eq!(norms.sq.dims(), losses.dims(), "one squared norm and one loss per example");
        match self.reads {
            Reads::PerMicroBatch => self.select_and_add(records, (norms, losses.inner()), sink),
            Reads::PerPart => self.mask_and_add(records, (norms, losses.inner()), sink),
        }
    }

    /// Reads the squared norms and losses (one device→host read for both: each read drains
    /// the device's queue), then sums the finite examples only, selected by index.
    fn select_and_add<AB: AutodiffBackend>(
        &self,
        records: Vec<Delta<AB>>,
        (norms, losses): (Norms<Inner<AB>>, Tensor<Inner<AB>, 1>),
        sink: Sink<'_, Inner<AB>>,
    ) {
        // Decided on the raw squared norms, before any clamp: a clamp may map NaN to its bound
        // (max(NaN, 0) is 0 on some backends), which would keep the example unclipped.
        let read = to_vec(Tensor::cat(vec![norms.sq.clone(), losses], 0));
        let (sq, losses) = read.split_at(read.len() / 2);
        let kept = sink.telemetry.record(sq, losses);
        if kept.is_empty() {
            return;
        }
        let norms_t = self.denominators(norms);
        let (records, norms_t) = if kept.len() == sq.len() {
            (records, norms_t)
        } else {
            counters::count(|c| c.uploads += 1);
            let device = norms_t.device();
            let rows = Tensor::<Inner<AB>, 1, Int>::from_data(
                burn::tensor::TensorData::new(kept.iter().map(|&i| i as i64).collect::<Vec<_>>(), [kept.len()]),
                &device,
            );
            let records = records.into_iter().map(|d| select_rows(d, &rows)).collect();
            (records, norms_t.select(0, rows))
        };
        add_clipped_sums(&records, &self.factors(norms_t), sink.sum, self.matmul_inputs);
    }

    /// Sums every example with the non-finite ones' rows zeroed on the device, and leaves the
    /// squared norms and losses there for [`ClippedSum::settle`]: no read, no upload.
    fn mask_and_add<AB: AutodiffBackend>(
        &self,
        records: Vec<Delta<AB>>,
        (norms, losses): (Norms<Inner<AB>>, Tensor<Inner<AB>, 1>),
        sink: Sink<'_, Inner<AB>>,
    ) {
        // Decided on the raw squared norms, before any clamp (as above).
        let bad = finite::bad_rows(&norms.sq, &losses);
        sink.pending.push((norms.sq.dims()[0], Tensor::cat(vec![norms.sq.clone(), losses], 0)));
        let factors = finite::zero_entries(self.factors(self.denominators(norms)), &bad);
        let records: Vec<Delta<AB>> = records.into_iter().map(|d| mask_rows(d, &bad)).collect();
        add_clipped_sums(&records, &factors, sink.sum, self.matmul_inputs);
    }

    /// What each clip factor divides C by: ‖g_i‖ with exact inputs; with rounded ones, the
    /// bound N_i on it plus e·R_i for the clipped sum's own rounding ([`rounding`]).
    fn denominators<B: Backend>(&self, norms: Norms<B>) -> Tensor<B, 1> {
        let n = norms.sq.clamp_min(0.0).sqrt();
        match (self.matmul_inputs.unit(), norms.r_sq) {
            (Some(u), Some(r_sq)) => n + r_sq.sqrt().mul_scalar(rounding::sum_input_error(u)),
            _ => n,
        }
    }

    /// c_i = min(1, C / (d_i + 1e-6)) from the [`Self::denominators`] d_i; with rounded inputs
    /// C is lowered by the fast-math margin m ([`rounding::bounded_factor`] is the same in f64).
    fn factors<B: Backend>(&self, denominators: Tensor<B, 1>) -> Tensor<B, 1> {
        let c = match self.matmul_inputs.unit() {
            Some(_) => self.clipping_norm * (1.0 - rounding::FAST_MATH_MARGIN),
            None => self.clipping_norm,
        };
        (denominators + NORM_EPSILON).recip().mul_scalar(c).clamp_max(1.0)
    }
}

/// Where a micro-batch's results go: the part's running sum, its telemetry, and what
/// [`Reads::PerPart`] leaves on the device.
struct Sink<'a, B: Backend> {
    sum: &'a mut GradSum<B>,
    telemetry: &'a mut Telemetry,
    pending: &'a mut Vec<(usize, Tensor<B, 1>)>,
}

/// What a lane other than the first adds up before it joins the part.
struct Partial<B: Backend> {
    sum: GradSum<B>,
    telemetry: Telemetry,
    pending: Vec<(usize, Tensor<B, 1>)>,
}

impl<B: Backend> Partial<B> {
    fn zeros(params: &ParamSet<B>) -> Self {
        Self { sum: GradSum::zeros(params), telemetry: Telemetry::default(), pending: Vec::new() }
    }

    fn sink(&mut self) -> Sink<'_, B> {
        Sink { sum: &mut self.sum, telemetry: &mut self.telemetry, pending: &mut self.pending }
    }

    /// Adds the lane's sum to `into`'s and appends its telemetry and pending reads after
    /// `into`'s (the lanes' examples stay in batch order).
    fn add_to(self, into: &mut ClippedSum<B>) {
        into.sum.add_sum(self.sum);
        let t = self.telemetry;
        into.telemetry.losses.extend(t.losses);
        into.telemetry.norms.extend(t.norms);
        into.telemetry.nonfinite += t.nonfinite;
        into.pending.extend(self.pending);
    }
}

fn to_vec<B: Backend>(t: Tensor<B, 1>) -> Vec<f32> {
    counters::count(|c| c.syncs += 1);
    t.into_data().convert::<f32>().to_vec().expect("f32 data")
}

/// Plain-mode forward and backward of Σ losses over `batch`: gradients per parameter and the
/// per-example losses.
pub fn plain_grads<AB: AutodiffBackend, M: Objective<AB>>(
    model: &M,
    params: &ParamSet<Inner<AB>>,
    batch: &M::Batch,
) -> (GradSum<Inner<AB>>, Vec<f32>) {
    let mut tape = Tape::new(Mode::Plain, params);
    let losses = model.losses(&mut tape, batch);
    let grads = losses.clone().sum().backward();
    let leaves = tape.into_leaves();
    let mut sum = GradSum::zeros(params);
    for (id, leaf) in leaves {
        if let Some(g) = leaf.grad(&grads) {
            sum.add(id, g);
        }
    }
    (sum, to_vec(losses.inner()))
}

/// The non-private step: Σ_i g_i (no clipping) by one ordinary backward per micro-batch, the
/// examples cut into `lanes` run side by side (each lane's parameters are leaves of its own
/// graph), their sums added in lane order.
pub fn nonprivate_sum<AB: AutodiffBackend, M: Objective<AB>>(
    model: &M,
    params: &ParamSet<Inner<AB>>,
    batch: &M::Batch,
    micro_batch: usize,
    lanes: Lanes,
) -> GradSum<Inner<AB>> {
    let ranges = lanes.within(micro_batch).ranges(model.batch_len(batch));
    let micro_batch = Lanes::micro_batch(micro_batch, ranges.len());
    let lane_sum = |range: std::ops::Range<usize>| {
        let mut total = GradSum::zeros(params);
        let lane = model.slice(batch, range);
        let n = model.batch_len(&lane);
        for start in (0..n).step_by(micro_batch) {
            let (g, _) = plain_grads(model, params, &model.slice(&lane, start..(start + micro_batch).min(n)));
            total.add_sum(g);
        }
        total
    };
    let lane = |range: std::ops::Range<usize>| lanes::counted(|| lane_sum(range));
    let (sums, counts): (Vec<_>, Vec<_>) = lanes::run(ranges, lane).into_iter().unzip();
    lanes::add_counts(counts);
    let mut sums = sums.into_iter();
    let mut total = sums.next().unwrap_or_else(|| GradSum::zeros(params));
    sums.for_each(|other| total.add_sum(other));
    total
}

/// The definition of correctness: one backward per example, clip its whole gradient to C,
/// sum. Slow; used by tests and as the benchmark's "naive" line.
pub fn naive_clipped_sum<AB: AutodiffBackend, M: Objective<AB>>(
    model: &M,
    params: &ParamSet<Inner<AB>>,
    batch: &M::Batch,
    clipping_norm: f64,
) -> ClippedSum<Inner<AB>> {
    let mut sum = GradSum::zeros(params);
    let mut telemetry = Telemetry::default();
    for i in 0..model.batch_len(batch) {
        let (g, losses) = plain_grads(model, params, &model.slice(batch, i..i + 1));
        let sq: f64 = g.grads.iter().map(|t| t.clone().powi_scalar(2).sum().into_scalar().elem::<f64>()).sum();
        let norm = sq.sqrt();
        let factor = clip_factor(norm, clipping_norm);
        for (id, t) in g.grads.into_iter().enumerate() {
            sum.add(ParamId(id), t.mul_scalar(factor));
        }
        telemetry.losses.extend(losses);
        telemetry.norms.push(norm as f32);
    }
    ClippedSum::of(sum, telemetry)
}

#[cfg(test)]
mod tests {
    use super::Telemetry;

    #[test]
    fn telemetry_summarises_losses_and_norms() {
        let t = Telemetry { losses: vec![1.0, 2.0, 3.0, 6.0], norms: vec![0.5, 1.5, 2.0, 4.0], nonfinite: 0 };
        assert_eq!(t.mean_loss(), Some(3.0));
        assert_eq!(Telemetry::default().mean_loss(), None, "no finite example: no loss");
        assert_eq!(t.clipped_fraction(1.0), 0.75);
        assert_eq!(t.clipped_fraction(10.0), 0.0);
        assert_eq!((t.norm_quantile(0.0), t.norm_quantile(1.0)), (0.5, 4.0));
        assert_eq!(t.norm_quantile(0.5), 2.0);
        assert_eq!(Telemetry::default().clipped_fraction(1.0), 0.0);
    }

    #[test]
    fn recorded_telemetry_keeps_the_finite_examples_and_counts_the_others() {
        let mut t = Telemetry::default();
        let kept = t.record(&[4.0, f32::NAN, 9.0, 1.0], &[0.5, 0.1, f32::INFINITY, 0.25]);
        assert_eq!(kept, [0, 3]);
        assert_eq!((t.norms, t.losses, t.nonfinite), (vec![2.0, 1.0], vec![0.5, 0.25], 2));
    }
}
