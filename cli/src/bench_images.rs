//! `dpctl bench images DIR`: the image pipeline's throughput on a directory of images (files
//! read into memory first, so the disk is not timed), on a pool of `--threads` threads as the
//! worker decodes: `--threads 1` gives images per second per core, comparable with
//! `reference/pillow_pipeline.py` on the same files. `scripts/bench-images.sh` runs them side by
//! side.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use dpcap_dataset::pipeline::{Crop, Pipeline};
use rayon::prelude::*;
use serde_json::json;

/// Options of `dpctl bench images`.
#[derive(Debug, Args)]
pub struct ImagesBench {
    /// Directory of .jpg/.jpeg/.png/.webp files.
    dir: PathBuf,
    /// Output side, px.
    #[arg(long, default_value_t = 224)]
    side: u32,
    /// Timed passes over the files (the median is reported).
    #[arg(long, default_value_t = 3)]
    passes: usize,
    /// Decoding threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Training crops (RandomResizedCrop) instead of the evaluation centre crop.
    #[arg(long)]
    train: bool,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// Median of `passes` timed runs after at least two seconds of warm-up (the first second of
/// decoding on these VMs runs up to 1.5x slower).
fn median_pass(passes: usize, mut pass: impl FnMut() -> Result<()>) -> Result<f64> {
    let warm = Instant::now();
    while warm.elapsed().as_secs_f64() < 2.0 {
        pass()?;
    }
    let mut times = Vec::new();
    for _ in 0..passes.max(1) {
        let started = Instant::now();
        pass()?;
        times.push(started.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Runs the benchmark.
pub fn run(opts: ImagesBench) -> Result<()> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(&opts.dir)
        .with_context(|| format!("reading {}", opts.dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
            ["jpg", "jpeg", "png", "webp"].contains(&ext.as_str())
        })
        .collect();
    files.sort();
    anyhow::ensure!(!files.is_empty(), "invalid dir {}: no .jpg, .jpeg, .png or .webp files", opts.dir.display());
    let images: Vec<Vec<u8>> = files.iter().map(std::fs::read).collect::<std::io::Result<_>>()?;
    let pipeline = Pipeline::clip(opts.side)?;
    let crop = |i: usize| {
        if opts.train { Crop::Train { key: [7; 32], step: 0, example: i as u64 } } else { Crop::Eval }
    };
    let one = |i: usize, bytes: &Vec<u8>| -> Result<()> {
        std::hint::black_box(pipeline.process(bytes, &crop(i))?);
        Ok(())
    };
    // On pool threads, as the worker decodes; one variant per process (`--threads 1` is the
    // per-core figure): a pool that has just worked keeps its threads spinning for a while, which
    // would slow a single-thread pass measured right after it.
    if opts.threads > 0 {
        rayon::ThreadPoolBuilder::new().num_threads(opts.threads).build_global()?;
    }
    let seconds = median_pass(opts.passes, || images.par_iter().enumerate().try_for_each(|(i, b)| one(i, b)))?;
    let n = images.len() as f64;
    let threads = rayon::current_num_threads();
    let report = json!({"images": images.len(), "side": opts.side, "crop": if opts.train { "train" } else { "eval" },
        "threads": threads, "images_per_s": n / seconds, "images_per_s_per_core": n / seconds / threads as f64});
    if opts.json {
        outln!("{report}");
    } else {
        outln!("{} images → {} px: {:.0} images/s on {threads} threads", images.len(), opts.side, n / seconds);
    }
    Ok(())
}
