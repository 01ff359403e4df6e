//! `dpctl dataset synth|index`: write the synthetic captioning dataset as WebDataset shards,
//! and index any shard directory or bucket (N for accounting, byte offsets for range reads).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use dpcap_dataset::indexer::{REPORT_PATH, join};
use dpcap_dataset::tokenizer::CaptionTokenizer;
use dpcap_dataset::{BuildOptions, ShardReader, build_index, identities, synth};
use futures::{StreamExt, TryStreamExt};
use indicatif::{ProgressBar, ProgressStyle};
use object_store::{ObjectStoreExt, PutPayload};
use serde_json::json;

#[derive(Debug, Subcommand)]
pub enum DatasetCommand {
    /// Write a synthetic dataset: OUT/train/*.tar, and for captions OUT/eval/*.tar (labelled).
    Synth {
        /// captions (scenes of two shapes, described), procedural (textures with no private
        /// content and a placeholder caption, for a non-private warm start) or identities
        /// (user-partitioned identity images for DP-FedEmb; sized by --users).
        #[arg(long, default_value = "captions")]
        kind: String,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
        /// Training examples (captions, procedural).
        #[arg(long)]
        examples: Option<u64>,
        /// identities: how many users, and what each owns.
        #[command(flatten)]
        identities: IdentityArgs,
        /// Held-out labelled examples for evaluation.
        #[arg(long, default_value_t = 1000)]
        eval_examples: u64,
        /// Examples per shard.
        #[arg(long, default_value_t = 1000)]
        shard_size: u64,
        /// Generator seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Empty a non-empty OUT first (without it such an OUT is refused: old shards or an old
        /// index beside new ones would make another dataset than the one just written).
        #[arg(long)]
        force: bool,
    },
    /// Index the .tar shards under a directory or object-store URL (file://, s3://, gs://,
    /// az:// with the matching build feature): writes index/manifest.json, one table per shard
    /// and index/report.json (examples skipped for a missing or corrupt member). With
    /// --train-tokenizer, also trains tokenizer.json on the captions unless one exists.
    Index {
        /// Dataset directory or URL.
        url: String,
        /// Vocabulary size of the trained WordPiece tokenizer (the micro captioner takes 256).
        #[arg(long, default_value_t = 256)]
        vocab_size: usize,
        /// Shards indexed at once (each is held in memory while it is read).
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
        /// Captions read to train a tokenizer (the first ones in index order).
        #[arg(long, default_value_t = 200_000)]
        tokenizer_captions: u64,
        /// No progress bar.
        #[arg(long)]
        quiet: bool,
        /// Train tokenizer.json on the captions (when the dataset has none). Its vocabulary is a
        /// function of the captions, learned without DP: only for public or synthetic captions.
        /// Private data takes a public tokenizer instead (the job's `tokenizer`, e.g.
        /// bert-base-uncased's vocab.txt, as DP-Cap does).
        #[arg(long)]
        train_tokenizer: bool,
        /// Refuse the dataset when a shard is not a readable tar archive (or an empty file);
        /// without it such a shard is left out and listed in the report.
        #[arg(long)]
        strict: bool,
    },
    /// A dataset's lifetime privacy budget (privacy admins).
    #[command(subcommand)]
    Budget(crate::budget::BudgetCommand),
}

/// Refuses a non-empty `out` unless `force`, which empties it.
fn prepare_out(out: &std::path::Path, force: bool) -> Result<()> {
    let entries = match std::fs::read_dir(out) {
        Ok(entries) => entries.count(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("invalid --out {}", out.display())),
    };
    if entries == 0 {
        return Ok(());
    }
    if !force {
        bail!(
            "invalid --out {}: not empty ({entries} entries); choose an empty directory, or pass --force to replace \
             what is there",
            out.display()
        );
    }
    std::fs::remove_dir_all(out).with_context(|| format!("emptying --out {}", out.display()))?;
    Ok(())
}

/// Runs one `dpctl dataset` command.
pub fn run(command: DatasetCommand, server: &crate::jobs::Server) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    match command {
        DatasetCommand::Synth { kind, out, examples, eval_examples, shard_size, seed, identities, force } => {
            prepare_out(&out, force)?;
            let scene = match kind.as_str() {
                "captions" => synth::Scene::Pair,
                "procedural" => synth::Scene::Procedural,
                "identities" => return synth_identities(&out, seed, &identities),
                other => bail!("invalid --kind {other:?}: must be captions, procedural or identities"),
            };
            let Some(examples) = examples else { bail!("--examples is required for --kind {kind}") };
            if examples == 0 {
                bail!("invalid --examples 0: must be at least 1");
            }
            if shard_size == 0 {
                bail!("invalid --shard-size 0: must be at least 1");
            }
            let train = synth::write_shards(&out.join("train"), (scene, seed), 0..examples, shard_size, 32)
                .context("writing train shards")?;
            if scene == synth::Scene::Procedural {
                outln!(
                    "{}",
                    json!({"out": out, "kind": kind, "train_examples": examples, "train_shards": train.len()})
                );
                return Ok(());
            }
            // Held-out examples come from the same generator, indices after the training ones.
            let eval = synth::write_shards(
                &out.join("eval"),
                (synth::Scene::Pair, seed),
                examples..examples + eval_examples,
                shard_size,
                32,
            )
            .context("writing eval shards")?;
            outln!(
                "{}",
                json!({"out": out, "train_examples": examples, "train_shards": train.len(), "eval_examples": eval_examples, "eval_shards": eval.len()})
            );
        }
        DatasetCommand::Index { url, vocab_size, concurrency, tokenizer_captions, quiet, train_tokenizer, strict } => {
            let options =
                IndexOptions { vocab_size, concurrency, tokenizer_captions, progress: !quiet, train_tokenizer, strict };
            let summary = runtime.block_on(index_dataset(&url, &options))?;
            outln!("{summary}");
        }
        DatasetCommand::Budget(command) => runtime.block_on(crate::budget::run(command, server))?,
    }
    Ok(())
}

/// The shape of `--kind identities`.
#[derive(Debug, Clone, clap::Args)]
pub struct IdentityArgs {
    /// identities: users (each its own privacy unit).
    #[arg(long, default_value_t = 1000)]
    pub users: u64,
    /// identities: identities each user owns.
    #[arg(long, default_value_t = 2)]
    pub identities_per_user: u64,
    /// identities: images of each identity.
    #[arg(long, default_value_t = 4)]
    pub images_per_identity: u64,
    /// identities: whole users per shard.
    #[arg(long, default_value_t = 250)]
    pub shard_users: u64,
}

impl IdentityArgs {
    /// The layout, refusing empty sizes.
    pub fn layout(&self) -> Result<identities::IdentityLayout> {
        for (flag, value) in [
            ("--users", self.users),
            ("--identities-per-user", self.identities_per_user),
            ("--images-per-identity", self.images_per_identity),
            ("--shard-users", self.shard_users),
        ] {
            if value == 0 {
                bail!("invalid {flag} 0: must be at least 1");
            }
        }
        Ok(identities::IdentityLayout {
            users: self.users,
            identities_per_user: self.identities_per_user,
            images_per_identity: self.images_per_identity,
        })
    }
}

/// `dataset synth --kind identities`: OUT/train/*.tar, each example's `KEY.json` naming its
/// user and identity. Held-out identities (owned by no user) are rendered by the evaluation.
fn synth_identities(out: &std::path::Path, seed: u64, args: &IdentityArgs) -> Result<()> {
    let layout = args.layout()?;
    let train = identities::write_shards(&out.join("train"), seed, &layout, args.shard_users, 32)
        .context("writing identity shards")?;
    outln!(
        "{}",
        json!({"out": out, "kind": "identities", "users": layout.users, "identities": layout.identities(),
               "train_examples": layout.examples(), "train_shards": train.len()})
    );
    Ok(())
}

/// How `dpctl dataset index` runs.
#[derive(Debug, Clone)]
pub struct IndexOptions {
    /// Vocabulary size of a trained tokenizer.
    pub vocab_size: usize,
    /// Shards at once.
    pub concurrency: usize,
    /// Captions read to train a tokenizer.
    pub tokenizer_captions: u64,
    /// Show a progress bar.
    pub progress: bool,
    /// Train a tokenizer on the captions when there is none (public or synthetic data only).
    pub train_tokenizer: bool,
    /// Refuse a dataset with an unreadable shard instead of leaving the shard out.
    pub strict: bool,
}

impl IndexOptions {
    /// Quiet indexing of synthetic data, with a tokenizer of `vocab_size` trained on its
    /// captions (the demo, benchmarks: the captions are generated, not anyone's).
    pub fn synthetic(vocab_size: usize) -> Self {
        Self {
            vocab_size,
            concurrency: 4,
            tokenizer_captions: 200_000,
            progress: false,
            train_tokenizer: true,
            strict: true,
        }
    }
}

/// Indexes a dataset on any object store and, if asked, trains its tokenizer if it has none;
/// returns a summary (`tokenizer`: "kept", "trained" or "none").
pub async fn index_dataset(url: &str, options: &IndexOptions) -> Result<serde_json::Value> {
    let (store, root) = dpcap_serve::open_existing_store(url).with_context(|| format!("opening dataset {url}"))?;
    let bar = if options.progress { ProgressBar::new_spinner() } else { ProgressBar::hidden() };
    bar.set_style(ProgressStyle::with_template("{spinner} {pos} shards, {msg} [{elapsed}]")?);
    let examples = std::sync::atomic::AtomicU64::new(0);
    let progress = |record: &dpcap_dataset::index::ShardRecord| {
        let n = examples.fetch_add(record.examples, std::sync::atomic::Ordering::Relaxed) + record.examples;
        bar.inc(1);
        bar.set_message(format!("{n} examples"));
    };
    let run = BuildOptions { concurrency: options.concurrency, strict: options.strict };
    let built = build_index(store.as_ref(), &root, run, &progress).await.with_context(|| format!("indexing {url}"))?;
    bar.finish_and_clear();
    for bad in &built.bad_shards {
        eprintln!(
            "left out shard {}: {} (listed in {REPORT_PATH}; --strict refuses such a dataset)",
            bad.path, bad.reason
        );
    }
    let tokenizer_path = join(&root, "tokenizer.json");
    let tokenizer = match store.head(&tokenizer_path).await {
        Ok(_) => "kept",
        Err(object_store::Error::NotFound { .. }) if !options.train_tokenizer => {
            eprintln!(
                "no tokenizer.json: jobs on {url} need `tokenizer` (a public vocabulary), or index with \
                 --train-tokenizer if the captions are public or synthetic"
            );
            "none"
        }
        Err(object_store::Error::NotFound { .. }) => {
            let reader = ShardReader::open(store.clone(), root.clone()).await?;
            let wanted = built.manifest.examples.min(options.tokenizer_captions);
            let captions: Vec<String> = futures::stream::iter(0..wanted)
                .map(|i| {
                    let reader = reader.clone();
                    async move { reader.read(i).await.map(|e| e.caption) }
                })
                .buffered(32)
                .try_collect()
                .await?;
            let trained =
                CaptionTokenizer::train(captions.into_iter(), options.vocab_size).context("training the tokenizer")?;
            store.put(&tokenizer_path, PutPayload::from(trained.to_json()?.into_bytes())).await?;
            "trained"
        }
        Err(e) => return Err(e.into()),
    };
    let m = &built.manifest;
    Ok(json!({"url": url, "examples": m.examples, "shards": m.shards.len(), "skipped": m.skipped,
              "manifest": dpcap_dataset::index::MANIFEST_PATH, "report": REPORT_PATH, "digest": built.digest,
              "data_id": m.data_digest(), "shards_id": m.shards_digest(),
              "index_bytes": m.shards.iter().map(|s| s.table_bytes).sum::<u64>()
                  + m.example_ids.as_ref().map_or(0, |ids| ids.bytes), "tokenizer": tokenizer,
              "bad_shards": built.bad_shards}))
}
