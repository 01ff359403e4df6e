//! `dpctl dataset synth|index`: write the synthetic captioning dataset as WebDataset shards,
//! and index any shard directory (N for accounting, byte offsets for range reads).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use dpcap_worker::data::tokenizer::CaptionTokenizer;
use dpcap_worker::data::{build_index, read_captions, synth};
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
    /// Index the .tar shards under a directory (or file:// URL) and write DIR/index.json; train
    /// DIR/tokenizer.json on the captions unless one exists.
    Index {
        /// Dataset directory.
        url: String,
        /// Vocabulary size of the trained WordPiece tokenizer (the micro captioner takes 256).
        #[arg(long, default_value_t = 256)]
        vocab_size: usize,
    },
    /// A dataset's lifetime privacy budget (privacy admins).
    #[command(subcommand)]
    Budget(crate::budget::BudgetCommand),
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
pub fn run(command: DatasetCommand, server: &crate::jobs::Server) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    match command {
        DatasetCommand::Synth { out, examples, eval_examples, shard_size, seed } => {
            if examples == 0 {
                bail!("invalid --examples 0: must be at least 1");
            }
            if shard_size == 0 {
                bail!("invalid --shard-size 0: must be at least 1");
            }
            let train =
                synth::write_shards(&out.join("train"), (synth::Scene::Pair, seed), 0..examples, shard_size, 32)
                    .context("writing train shards")?;
            // Held-out examples come from the same generator, indices after the training ones.
            let eval = synth::write_shards(
                &out.join("eval"),
                (synth::Scene::Pair, seed),
                examples..examples + eval_examples,
                shard_size,
                32,
            )
            .context("writing eval shards")?;
            println!(
                "{}",
                json!({"out": out, "train_examples": examples, "train_shards": train.len(), "eval_examples": eval_examples, "eval_shards": eval.len()})
            );
        }
        DatasetCommand::Index { url, vocab_size } => {
            let summary = runtime.block_on(index_dataset(&url, vocab_size))?;
            println!("{summary}");
        }
        DatasetCommand::Budget(command) => runtime.block_on(crate::budget::run(command, server))?,
    }
    Ok(())
}

/// Indexes a local dataset directory and trains its tokenizer if it has none; returns a summary.
pub async fn index_dataset(url: &str, vocab_size: usize) -> Result<serde_json::Value> {
    let store = local_store(url)?;
    let index = build_index(store.as_ref(), &Path::default()).await?;
    let body = serde_json::to_vec_pretty(&index)?;
    let digest = dpcap_proto::digest::sha256(&body);
    store.put(&Path::from("index.json"), PutPayload::from(body)).await?;
    let tokenizer_path = Path::from("tokenizer.json");
    let tokenizer = match store.head(&tokenizer_path).await {
        Ok(_) => "kept",
        Err(object_store::Error::NotFound { .. }) => {
            let captions = read_captions(store.as_ref(), &Path::default(), &index).await?;
            let trained =
                CaptionTokenizer::train(captions.into_iter(), vocab_size).context("training the tokenizer")?;
            store.put(&tokenizer_path, PutPayload::from(trained.to_json()?.into_bytes())).await?;
            "trained"
        }
        Err(e) => return Err(e.into()),
    };
    Ok(
        json!({"url": url, "examples": index.examples, "shards": index.shards.len(), "index": "index.json", "digest": digest, "tokenizer": tokenizer}),
    )
}
