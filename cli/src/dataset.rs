//! `dpctl dataset synth|index`: write the synthetic captioning dataset as WebDataset shards,
//! and index any shard directory (N for accounting, byte offsets for range reads).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use dpcap_worker::data::{build_index, synth};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde_json::json;

#[derive(Debug, Subcommand)]
pub enum DatasetCommand {
    /// Write a synthetic captioning dataset: OUT/train/*.tar, OUT/eval/*.tar (labelled).
    Synth {
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
        /// Training examples.
        #[arg(long)]
        examples: u64,
        /// Held-out labelled examples for evaluation.
        #[arg(long, default_value_t = 1000)]
        eval_examples: u64,
        /// Examples per shard.
        #[arg(long, default_value_t = 1000)]
        shard_size: u64,
        /// Generator seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Index the .tar shards under a directory (or file:// URL) and write DIR/index.json.
    Index {
        /// Dataset directory.
        url: String,
    },
}

/// A local directory (or file:// URL) as an object store rooted there.
fn local_store(location: &str) -> Result<Arc<dyn ObjectStore>> {
    let dir = location.strip_prefix("file://").unwrap_or(location);
    if location.contains("://") && !location.starts_with("file://") {
        bail!("invalid URL {location}: this build indexes local directories and file:// URLs");
    }
    Ok(Arc::new(LocalFileSystem::new_with_prefix(dir).with_context(|| format!("opening dataset directory {dir}"))?))
}

/// Runs one `dpctl dataset` command.
pub fn run(command: DatasetCommand) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    match command {
        DatasetCommand::Synth { out, examples, eval_examples, shard_size, seed } => {
            if examples == 0 {
                bail!("invalid --examples 0: must be at least 1");
            }
            if shard_size == 0 {
                bail!("invalid --shard-size 0: must be at least 1");
            }
            let train = synth::write_shards(&out.join("train"), seed, 0..examples, shard_size, 32)
                .context("writing train shards")?;
            // Held-out examples come from the same generator, indices after the training ones.
            let eval = synth::write_shards(&out.join("eval"), seed, examples..examples + eval_examples, shard_size, 32)
                .context("writing eval shards")?;
            println!(
                "{}",
                json!({"out": out, "train_examples": examples, "train_shards": train.len(), "eval_examples": eval_examples, "eval_shards": eval.len()})
            );
        }
        DatasetCommand::Index { url } => {
            let store = local_store(&url)?;
            let index = runtime.block_on(build_index(store.as_ref(), &Path::default()))?;
            let body = serde_json::to_vec_pretty(&index)?;
            runtime.block_on(store.put(&Path::from("index.json"), PutPayload::from(body)))?;
            println!(
                "{}",
                json!({"url": url, "examples": index.examples, "shards": index.shards.len(), "index": "index.json"})
            );
        }
    }
    Ok(())
}
