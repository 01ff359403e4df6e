//! `dpctl bench clip`: one DP-SGD step of a model three ways, side by side in one run —
//! non-private (one ordinary backward), naive per-example (a backward per example) and the
//! ClipEngine — with medians of several runs.

use std::time::Instant;

use anyhow::{Result, bail};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Distribution, Tensor, TensorData};
use dpcap_worker::CpuBackend;
use dpcap_worker::clip::{ClipEngine, naive_clipped_sum, nonprivate_sum};
use dpcap_worker::model::{CaptionBatch, Captioner, CaptionerConfig};
use dpcap_worker::params::ParamSet;
use serde_json::json;

type Inner = <CpuBackend as AutodiffBackend>::InnerBackend;

/// Options of `dpctl bench clip`.
#[derive(Debug, clap::Args)]
pub struct ClipBench {
    /// Model configuration (micro, bench, tiny, small, base, large).
    #[arg(long, default_value = "bench")]
    model: String,
    /// Examples per step.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Training objective.
    #[arg(long, default_value = "caption")]
    objective: String,
    /// Device: cpu (cuda needs a build with the `cuda` feature).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Timed runs per method (after one warm-up).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Skip the naive per-example loop (slow for large models).
    #[arg(long)]
    skip_naive: bool,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

fn median(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut times: Vec<f64> = (0..runs.max(1))
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// Peak resident set size of this process (Linux VmHWM), in bytes.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
}

fn random_batch(config: CaptionerConfig, b: usize) -> CaptionBatch<CpuBackend> {
    let device = Default::default();
    let s = config.seq;
    let tokens: Vec<i64> = (0..b)
        .flat_map(|i| {
            let len = 4 + (i * 7) % (s - 4);
            (0..s).map(move |j| match j {
                0 => 1,
                j if j < len => 3 + ((i * 131 + j * 71) % (config.vocab - 3)) as i64,
                j if j == len => 2,
                _ => 0,
            })
        })
        .collect();
    let image = config.encoder.image;
    CaptionBatch {
        images: Tensor::random([b, 3, image, image], Distribution::Normal(0.0, 1.0), &device),
        tokens: Tensor::from_data(TensorData::new(tokens, [b, s]), &device),
    }
}

/// Runs the benchmark.
pub fn run(opts: ClipBench) -> Result<()> {
    if opts.objective != "caption" {
        bail!("invalid --objective {}: only caption is implemented so far", opts.objective);
    }
    if opts.device != "cpu" {
        bail!("invalid --device {}: this build supports cpu", opts.device);
    }
    let Some(config) = CaptionerConfig::named(&opts.model) else {
        bail!("invalid --model {}: use one of {}", opts.model, CaptionerConfig::NAMES.join(", "));
    };
    if opts.batch == 0 {
        bail!("invalid --batch 0: must be at least 1");
    }
    let device = Default::default();
    let mut params = ParamSet::<Inner>::new(&device);
    let model = Captioner::new(&mut params, config);
    let batch = random_batch(config, opts.batch);
    let engine = ClipEngine { clipping_norm: 1.0, micro_batch: opts.batch };
    let nonprivate_s = median(opts.runs, || {
        nonprivate_sum(&model, &params, &batch, opts.batch).flatten().into_data();
    });
    let clip_s = median(opts.runs, || {
        engine.clipped_sum(&model, &params, &batch).sum.flatten().into_data();
    });
    let naive_s = (!opts.skip_naive).then(|| {
        median(opts.runs.min(2), || {
            naive_clipped_sum(&model, &params, &batch, 1.0).sum.flatten().into_data();
        })
    });
    let ratio = clip_s / nonprivate_s;
    let examples_per_s = opts.batch as f64 / clip_s;
    let peak = peak_rss_bytes();
    if opts.json {
        println!(
            "{}",
            json!({"model": opts.model, "objective": opts.objective, "batch": opts.batch, "device": opts.device,
                   "params": params.numel(), "nonprivate_s": nonprivate_s, "naive_s": naive_s, "clip_s": clip_s,
                   "ratio": ratio, "examples_per_s": examples_per_s, "peak_rss_bytes": peak})
        );
    } else {
        println!(
            "{} captioner ({} params), batch {}, {} ({} runs, medians)",
            opts.model,
            params.numel(),
            opts.batch,
            opts.device,
            opts.runs
        );
        println!("  non-private step : {:.3} s", nonprivate_s);
        if let Some(n) = naive_s {
            println!("  naive per-example: {:.3} s ({:.1}x the ClipEngine)", n, n / clip_s);
        }
        println!("  ClipEngine       : {:.3} s ({:.2}x non-private, {:.0} examples/s)", clip_s, ratio, examples_per_s);
        if let Some(p) = peak {
            println!("  peak RSS         : {:.0} MiB", p as f64 / (1 << 20) as f64);
        }
    }
    Ok(())
}
