//! `dpctl bench clip`: one DP-SGD step of a model three ways, side by side in one run —
//! non-private (one ordinary backward), naive per-example (a backward per example) and the
//! ClipEngine — with medians of several runs (non-private and ClipEngine steps alternate).

use std::time::Instant;

use anyhow::{Result, bail};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Device, Tensor};
use dpcap_ml::CpuBackend;
use dpcap_ml::clip::{ClipEngine, Lanes, MatmulInputs, Objective, Precision, Reads, naive_clipped_sum, nonprivate_sum};
use dpcap_ml::model::{CaptionBatch, Captioner, CaptionerConfig, OnBatch};
use dpcap_ml::params::ParamSet;
use dpcap_registry::Family;
use serde_json::json;

/// Options of `dpctl bench clip`.
#[derive(Debug, clap::Args)]
pub struct ClipBench {
    /// Model configuration (micro, bench, tiny, small, base, large).
    #[arg(long, default_value = "bench")]
    model: String,
    /// Examples per step.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Training objective: caption or mae (fedemb clips per client, not per example).
    #[arg(long, default_value = "caption")]
    objective: Family,
    /// Device: cpu, cuda[:N] in a build with the `cuda` feature, or wgpu (the default Vulkan
    /// adapter, e.g. lavapipe) in a build with the `wgpu` feature.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Matrix products in f32, bf16 or f16 (norms, clip factors and sums stay f32); wgpu has
    /// no bf16: f16 runs the same mixed precision there.
    #[arg(long, default_value = "f32")]
    precision: Precision,
    /// Timed runs per method (after one warm-up).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Skip the naive per-example loop (slow for large models).
    #[arg(long)]
    skip_naive: bool,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Also check the device's clipped sum against the CPU's f32 sum on identical weights and
    /// data (caption objective): fails when the largest difference exceeds 1e-3 of the largest
    /// value (4e-3 on CUDA, whose f32 matmuls read TF32; 3e-2 with --precision bf16 or f16).
    #[arg(long)]
    verify: bool,
    /// The device's peak dense TFLOP/s for this precision (H200: 989 bf16, 494 TF32): with it
    /// the DP step's model FLOP utilisation (MFU) is reported.
    #[arg(long)]
    peak_tflops: Option<f64>,
}

/// Largest |device − CPU| relative to the largest |CPU| value that `--verify` accepts: f32 on
/// different backends sums in different orders; TF32 inputs (f32 matmuls on CUDA tensor
/// cores) keep 10 bits, so a product is off by up to 2·2⁻¹⁰; bf16 products keep 8 bits, f16
/// 11 (the bound is bf16's, which f16 meets with room).
fn verify_tolerance(precision: Precision, inputs: MatmulInputs) -> f64 {
    match (precision, inputs) {
        (Precision::F32, MatmulInputs::F32) => 1e-3,
        (Precision::F32, MatmulInputs::Tf32) => 4e-3,
        (Precision::Bf16 | Precision::F16, _) => 3e-2,
    }
}

/// The median of `runs` timed calls of each of `steps` after one warm-up each, called in turn
/// (one of each per round), so that a slow spell of the machine falls on all of them alike and
/// their ratio holds.
fn interleaved_medians<const N: usize>(runs: usize, mut steps: [&mut dyn FnMut(); N]) -> [f64; N] {
    steps.iter_mut().for_each(|step| step());
    let mut times: [Vec<f64>; N] = std::array::from_fn(|_| Vec::new());
    for _ in 0..runs.max(1) {
        for (step, times) in steps.iter_mut().zip(times.iter_mut()) {
            let start = Instant::now();
            step();
            times.push(start.elapsed().as_secs_f64());
        }
    }
    times.map(|mut t| {
        t.sort_by(f64::total_cmp);
        t[t.len() / 2]
    })
}

/// Peak resident set size of this process (Linux VmHWM), in bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
}

/// Step times of one objective on one backend, medians in seconds.
struct Timings {
    params: usize,
    nonprivate_s: f64,
    clip_s: f64,
    naive_s: Option<f64>,
    /// With `--verify`: max |device − CPU| / max |CPU| of the clipped sum.
    verify_rel_err: Option<f64>,
}

/// The ClipEngine's clipped sum as host values, with `engine`'s precision and matmul inputs.
fn clipped_values<AB: AutodiffBackend>(
    model: &Captioner,
    params: &ParamSet<AB::InnerBackend>,
    batch: &CaptionBatch<AB>,
    engine: ClipEngine,
) -> Vec<f32> {
    let engine = ClipEngine { clipping_norm: 1.0, micro_batch: batch.tokens.dims()[0], ..engine };
    engine.clipped_sum(model, params, batch).sum.flatten().into_data().convert::<f32>().into_vec().unwrap_or_default()
}

/// `batch` with a NaN pixel in its first example when it has another to keep (a NaN image is a
/// test-only input: it reaches the same path as a diverged example).
fn with_a_nan_example<AB: AutodiffBackend>(batch: CaptionBatch<AB>) -> CaptionBatch<AB> {
    let dims = batch.images.dims();
    if dims[0] < 2 {
        return batch;
    }
    let device = batch.images.device();
    let mut pixels: Vec<f32> = batch.images.to_data().convert::<f32>().into_vec().unwrap_or_default();
    if let Some(first) = pixels.first_mut() {
        *first = f32::NAN;
    }
    CaptionBatch { images: Tensor::from_data(burn::tensor::TensorData::new(pixels, dims), &device), ..batch }
}

/// The device's clipped sum against the CPU's, on identical weights (seeded init) and data.
/// The CPU applies the device engine's norm bound (`matmul_inputs`) to its own exact norms, so
/// the clip factors differ only by the device's rounding, and runs its lanes, so that on a CPU
/// both sums are added in the same order.
fn verify_against_cpu<AB: AutodiffBackend>(
    config: CaptionerConfig,
    device_values: &[f32],
    batch: &CaptionBatch<AB>,
    device_engine: ClipEngine,
) -> f64 {
    let cpu = Default::default();
    let mut params = ParamSet::<<CpuBackend as AutodiffBackend>::InnerBackend>::new(&cpu);
    let model = Captioner::new(&mut params, config);
    let batch = CaptionBatch::<CpuBackend> {
        images: Tensor::from_data(batch.images.to_data(), &cpu),
        tokens: Tensor::from_data(batch.tokens.to_data(), &cpu),
    };
    let engine = ClipEngine {
        clipping_norm: 1.0,
        micro_batch: 1,
        precision: Precision::F32,
        matmul_inputs: device_engine.matmul_inputs,
        reads: Reads::default(),
        lanes: device_engine.lanes,
    };
    let reference = clipped_values::<CpuBackend>(&model, &params, &batch, engine);
    let scale = reference.iter().fold(0.0f64, |m, v| m.max(f64::from(v.abs()))).max(f64::MIN_POSITIVE);
    let worst = reference.iter().zip(device_values).fold(0.0f64, |m, (a, b)| m.max(f64::from((a - b).abs())));
    // `max` skips a NaN: a sum that is not finite everywhere fails outright.
    let finite = device_values.iter().chain(&reference).all(|v| v.is_finite());
    if reference.len() != device_values.len() || !finite { f64::INFINITY } else { worst / scale }
}

/// The engine under test: C = 1, the whole batch in one micro-batch, the device's matmul inputs.
fn engine(opts: &ClipBench) -> ClipEngine {
    ClipEngine {
        clipping_norm: 1.0,
        micro_batch: opts.batch,
        precision: opts.precision,
        matmul_inputs: MatmulInputs::for_device(&opts.device),
        reads: Reads::for_device(&opts.device),
        lanes: Lanes::for_device(&opts.device),
    }
}

fn measure<AB: AutodiffBackend, M: Objective<AB>>(
    model: &M,
    params: &ParamSet<AB::InnerBackend>,
    batch: &M::Batch,
    opts: &ClipBench,
) -> Timings {
    let engine = engine(opts);
    let [nonprivate_s, clip_s] = interleaved_medians(
        opts.runs,
        [
            &mut || {
                nonprivate_sum(model, params, batch, opts.batch, engine.lanes).flatten().into_data();
            },
            &mut || {
                engine.clipped_sum(model, params, batch).sum.flatten().into_data();
            },
        ],
    );
    let naive_s = (!opts.skip_naive).then(|| {
        let [naive] = interleaved_medians(
            opts.runs.min(2),
            [&mut || {
                naive_clipped_sum(model, params, batch, 1.0).sum.flatten().into_data();
            }],
        );
        naive
    });
    Timings { params: params.numel(), nonprivate_s, clip_s, naive_s, verify_rel_err: None }
}

/// [`measure`] as work on any objective's model.
struct Measure<'a>(&'a ClipBench);

impl<AB: AutodiffBackend> OnBatch<AB> for Measure<'_> {
    type Output = Timings;
    fn run<M: Objective<AB>>(self, model: &M, params: &ParamSet<AB::InnerBackend>, batch: &M::Batch) -> Timings {
        measure::<AB, M>(model, params, batch, self.0)
    }
}

fn run_on<AB: AutodiffBackend>(opts: &ClipBench, device: Device<AB>) -> Result<Timings> {
    if opts.verify {
        return measure_and_verify::<AB>(opts, device);
    }
    dpcap_ml::model::with_random_batch::<AB, _>((opts.objective, &opts.model), opts.batch, &device, Measure(opts))
        .map_err(|e| anyhow::anyhow!("--objective {} --model {}: {e}", opts.objective, opts.model))
}

/// The timings of the caption objective, then its clipped sum on this device against the
/// CPU's on the same weights and data, with one example poisoned: the device leaves it out its
/// own way (masking, on a GPU) and the CPU reference by selection; the sums must agree and be
/// finite. Only captions are verified: MAE masks are random per device.
fn measure_and_verify<AB: AutodiffBackend>(opts: &ClipBench, device: Device<AB>) -> Result<Timings> {
    if !opts.objective.has_captions() {
        bail!("invalid --verify: only the caption objective is verified (MAE masks are random per device)");
    }
    let Some(config) = CaptionerConfig::named(&opts.model) else {
        bail!("invalid --model {}: use one of {}", opts.model, dpcap_registry::NAMES.join(", "))
    };
    let mut params = ParamSet::<AB::InnerBackend>::new(&device);
    let model = Captioner::new(&mut params, config);
    let batch = CaptionBatch::<AB>::random(config, opts.batch, &device);
    let mut timings = measure::<AB, _>(&model, &params, &batch, opts);
    let batch = with_a_nan_example(batch);
    let values = clipped_values::<AB>(&model, &params, &batch, engine(opts));
    timings.verify_rel_err = Some(verify_against_cpu(config, &values, &batch, engine(opts)));
    Ok(timings)
}

#[cfg(feature = "cuda")]
fn run_cuda(opts: &ClipBench, index: usize) -> Result<Timings> {
    let device = format!("cuda:{index}");
    dpcap_worker::preflight::require(&device, dpcap_worker::preflight::Needs { nccl: false })?;
    run_on::<dpcap_worker::CudaBackend>(opts, burn::backend::cuda::CudaDevice::new(index))
}

#[cfg(not(feature = "cuda"))]
fn run_cuda(_: &ClipBench, _: usize) -> Result<Timings> {
    bail!("invalid --device cuda: this dpctl was built without the cuda feature (cargo build --features cuda)")
}

#[cfg(feature = "wgpu")]
fn run_wgpu(opts: &ClipBench) -> Result<Timings> {
    run_on::<dpcap_ml::WgpuBackend>(opts, burn::backend::wgpu::WgpuDevice::DefaultDevice)
}

#[cfg(not(feature = "wgpu"))]
fn run_wgpu(_: &ClipBench) -> Result<Timings> {
    bail!("invalid --device wgpu: this dpctl was built without the wgpu feature (cargo build --features wgpu)")
}

/// Runs the benchmark.
pub fn run(opts: ClipBench) -> Result<()> {
    if opts.batch == 0 {
        bail!("invalid --batch 0: must be at least 1");
    }
    let t = match opts.device.as_str() {
        "cpu" => run_on::<CpuBackend>(&opts, Default::default())?,
        d if d == "cuda" || d.starts_with("cuda:") => {
            let index = d
                .strip_prefix("cuda:")
                .map_or(Ok(0), str::parse)
                .map_err(|e| anyhow::anyhow!("invalid --device {d}: {e}"))?;
            run_cuda(&opts, index)?
        }
        "wgpu" if opts.precision == Precision::Bf16 => {
            bail!(
                "invalid --precision bf16 for --device wgpu: WGSL has no bf16 type; use f16 (the same mixed precision) or f32"
            )
        }
        "wgpu" => run_wgpu(&opts)?,
        other => bail!("invalid --device {other}: use cpu, cuda[:N] or wgpu"),
    };
    let ratio = t.clip_s / t.nonprivate_s;
    let examples_per_s = opts.batch as f64 / t.clip_s;
    let peak = peak_rss_bytes();
    // Model FLOPs (3 forward passes of matrix products per example) per second of the DP step.
    let tflops = opts
        .objective
        .has_captions()
        .then(|| CaptionerConfig::named(&opts.model))
        .flatten()
        .map(|c| c.train_flops() as f64 * examples_per_s / 1e12);
    let mfu = tflops.zip(opts.peak_tflops).map(|(achieved, peak)| achieved / peak);
    // A JIT device's figures depend on how its kernels were picked; burn-flex's do not.
    let kernels = (opts.device != "cpu").then_some(dpcap_ml::device::KERNEL_SELECTION);
    if opts.json {
        outln!(
            "{}",
            json!({"model": opts.model, "objective": opts.objective, "batch": opts.batch, "device": opts.device,
                   "precision": opts.precision.name(),
                   "params": t.params, "nonprivate_s": t.nonprivate_s, "naive_s": t.naive_s, "clip_s": t.clip_s,
                   "ratio": ratio, "examples_per_s": examples_per_s, "model_tflops_per_s": tflops, "mfu": mfu,
                   "peak_rss_bytes": peak, "verify_rel_err": t.verify_rel_err, "kernels": kernels})
        );
    } else {
        outln!(
            "{} {} ({} params), batch {}, {} {} ({} runs, medians)",
            opts.model,
            opts.objective,
            t.params,
            opts.batch,
            opts.device,
            opts.precision.name(),
            opts.runs
        );
        if let Some(k) = kernels {
            outln!("  {k}");
        }
        outln!("  non-private step : {:.3} s", t.nonprivate_s);
        if let Some(n) = t.naive_s {
            outln!("  naive per-example: {:.3} s ({:.1}x the ClipEngine)", n, n / t.clip_s);
        }
        outln!("  ClipEngine       : {:.3} s ({:.2}x non-private, {:.0} examples/s)", t.clip_s, ratio, examples_per_s);
        if let Some(achieved) = tflops {
            let mfu = mfu.map(|m| format!(", MFU {:.1} %", 100.0 * m)).unwrap_or_default();
            outln!("  model FLOP/s     : {achieved:.2} TFLOP/s{mfu}");
        }
        if let Some(p) = peak {
            outln!("  peak RSS         : {:.0} MiB", p as f64 / (1 << 20) as f64);
        }
        if let Some(e) = t.verify_rel_err {
            outln!("  vs CPU           : max relative difference {e:.2e}");
        }
    }
    let tolerance = verify_tolerance(opts.precision, MatmulInputs::for_device(&opts.device));
    if let Some(e) = t.verify_rel_err
        && (e.is_nan() || e > tolerance)
    {
        bail!(
            "verification failed: {} {} clipped sum differs from the CPU's f32 sum by {e:.3e} (tolerance {tolerance:e})",
            opts.device,
            opts.precision.name()
        );
    }
    Ok(())
}
