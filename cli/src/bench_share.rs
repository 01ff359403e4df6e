//! `dpctl bench share`: one rank's share of a step streamed through the real worker path
//! (range reads, decode, one micro-batch at a time, the ClipEngine), reporting the process's
//! peak RSS. Run it for two share sizes: the peak must not grow with the share.

use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use dpcap_dataset::reader::{Dataset, View};
use dpcap_dataset::stream::{DEFAULT_PREFETCH, ExampleStream};
use dpcap_dataset::synth;
use dpcap_ml::clip::{ClipEngine, Precision};
use dpcap_ml::optim::Schedule;
use dpcap_ml::trainer::{ReplicaConfig, Trainer};
use serde_json::json;

/// Options of `dpctl bench share`.
#[derive(Debug, Args)]
pub struct ShareBench {
    /// Examples in the rank's share.
    #[arg(long, default_value_t = 1000)]
    examples: u64,
    /// Captioner configuration.
    #[arg(long, default_value = "micro")]
    model: String,
    /// Examples per micro-batch.
    #[arg(long, default_value_t = 64)]
    micro_batch: usize,
    /// Where the synthetic shards go (default: a temporary directory).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    /// For comparison: read and tensorise the whole share at once (what ranks did before
    /// they streamed).
    #[arg(long)]
    materialise: bool,
}

/// Streams the share and prints one JSON line.
pub fn run(opts: ShareBench) -> Result<()> {
    let temp = tempfile::tempdir()?;
    let dir = opts.dir.clone().unwrap_or_else(|| temp.path().to_owned()).join("share");
    synth::write_shards(&dir, (synth::Scene::Pair, 7), 0..opts.examples, 1000, 32).context("writing shards")?;
    let url = dir.to_string_lossy().into_owned();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        crate::dataset::index_dataset(&url, &crate::dataset::IndexOptions::synthetic(512)).await?;
        let rss_before = crate::bench_clip::peak_rss_bytes();
        let dataset = Dataset::open(&url).await?;
        let tokenizer = dataset.tokenizer("").await?;
        let engine = ClipEngine {
            clipping_norm: 1.0,
            micro_batch: opts.micro_batch,
            precision: Precision::F32,
            matmul_inputs: Default::default(),
            reads: Default::default(),
            lanes: Default::default(),
        };
        let schedule = Schedule { peak: 1e-3, warmup_steps: 0, total_steps: 1, floor: 0.0 };
        let device = Default::default();
        let replica = ReplicaConfig {
            model_name: &opts.model,
            objective: dpcap_registry::Family::Captioner,
            fedemb: Default::default(),
            tokenizer: Some(tokenizer),
            seed: 1,
            engine,
            expected_batch_size: opts.examples as f64,
            schedule,
        };
        let trainer = Trainer::<dpcap_ml::CpuBackend>::new(replica, &device)?;
        let view = View::eval(trainer.model.encoder().config().image)?;
        let started = Instant::now();
        let values = if opts.materialise {
            let examples = dataset.read((0..opts.examples).collect(), &view).await?;
            trainer.clipped_part(&examples)?.0
        } else {
            let mut stream =
                ExampleStream::start(dataset, ((0..opts.examples).collect(), view), opts.micro_batch, DEFAULT_PREFETCH);
            let mut part = trainer.begin_part();
            while let Some(chunk) = stream.next().await {
                trainer.accumulate(&mut part, &chunk?)?;
            }
            trainer.finish_part(part)?.0
        };
        outln!(
            "{}",
            json!({"examples": opts.examples, "model": opts.model, "micro_batch": opts.micro_batch, "params": values.len(),
                   "mode": if opts.materialise { "materialised" } else { "streamed" },
                   "seconds": started.elapsed().as_secs_f64(), "peak_rss_bytes": crate::bench_clip::peak_rss_bytes(),
                   "peak_rss_before_share_bytes": rss_before})
        );
        Ok(())
    })
}
