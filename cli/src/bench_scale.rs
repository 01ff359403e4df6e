//! `dpctl bench scale`: the orchestration of one step at the paper's size, without GPU compute.
//! A compact index for N = 233,804,767 examples in 23,381 shards (tables encoded from a
//! synthetic tar layout; no images), the coordinator's view of it (manifest → layout), a
//! Poisson sample of L = 1,310,720, its split into work units for 128 ranks as encoded
//! `StepWork` messages, and releases of P = 190,042,170 gradient coordinates through a real
//! accountant, with noise drawn ahead as in production: over the same-host socket (what a rank
//! on the accountant's host uses) and over gRPC on loopback (a rank on another host), each
//! phase alone, and one memcpy of the same bytes for reference.

use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use dpcap_accountant::cost::{self, Breakdown, CopyReference, CostOptions, ReleaseCost, Transport, Writer, rss_bytes};
use dpcap_coordinator::example_units;
use dpcap_coordinator::{JobSecret, PoissonSampler, split_work, step_work};
use dpcap_dataset::index::{ExampleIdsRecord, ImageKind};
use dpcap_dataset::index::{Layout, MANIFEST_VERSION, Manifest, ShardRecord, ShardTable, Skipped, Span, TableEntry};
use prost::Message;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use serde_json::json;

/// DP-Cap's dataset: image–caption pairs.
pub const PAPER_EXAMPLES: u64 = dpcap_privacy::recipes::DP_CAP.examples;
/// LAION-style shards of ~10k examples.
pub const PAPER_SHARDS: u64 = 23_381;
/// DP-Cap's expected batch.
pub const PAPER_BATCH: u64 = dpcap_privacy::recipes::DP_CAP.batch;
/// The base captioner's parameters (DP-Cap, ViT-B encoder + decoder).
pub const PAPER_PARAMS: u64 = 190_042_170;

/// Options of `dpctl bench scale`.
#[derive(Debug, Args)]
pub struct ScaleBench {
    /// Examples N.
    #[arg(long, default_value_t = PAPER_EXAMPLES)]
    examples: u64,
    /// Shards.
    #[arg(long, default_value_t = PAPER_SHARDS)]
    shards: u64,
    /// Expected batch L.
    #[arg(long, default_value_t = PAPER_BATCH)]
    batch: u64,
    /// Ranks W.
    #[arg(long, default_value_t = 128)]
    ranks: usize,
    /// Gradient coordinates P.
    #[arg(long, default_value_t = PAPER_PARAMS)]
    params: u64,
    /// Released steps timed on each transport (the median is reported).
    #[arg(long, default_value_t = 5)]
    release_steps: u64,
    /// Releases run before the timed ones, untimed: a running job reuses its first steps'
    /// memory, and the timed releases should cost what a running job's do.
    #[arg(long, default_value_t = cost::WARMUP_STEPS)]
    release_warmup: u64,
    /// Also time the release stored by object_store's multipart writer (over gRPC).
    #[arg(long)]
    multipart: bool,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// A shard table as img2dataset writes the tar: `.jpg` (5–60 kB), `.json` (300–900 B) and
/// `.txt` (20–200 B) per example, each behind a 512-byte header and padded to 512 bytes.
fn synthetic_table(examples: u64, seed: u64) -> ShardTable {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut size = |lo: u64, hi: u64| lo + rng.next_u64() % (hi - lo);
    let mut cursor = 0u64;
    let mut member = |len: u64| {
        let span = Span { offset: cursor + 512, len };
        cursor += 512 + len.div_ceil(512) * 512;
        span
    };
    let entries = (0..examples)
        .map(|_| {
            let (image, meta, caption) = (size(5_000, 60_000), size(300, 900), size(20, 200));
            let (image, meta, caption) = (member(image), member(meta), member(caption));
            TableEntry { image_kind: ImageKind::Jpeg, image, caption, meta: Some(meta) }
        })
        .collect();
    ShardTable { entries }
}

/// The manifest of the synthetic index (every table encoded and hashed, none kept).
fn build_manifest(opts: &ScaleBench) -> Manifest {
    let counts: Vec<u64> =
        (0..opts.shards).map(|s| opts.examples / opts.shards + u64::from(s < opts.examples % opts.shards)).collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut shards: Vec<Option<ShardRecord>> = vec![None; counts.len()];
    std::thread::scope(|scope| {
        let per = counts.len().div_ceil(threads);
        for (t, slots) in shards.chunks_mut(per).enumerate() {
            let counts = &counts;
            scope.spawn(move || {
                for (i, slot) in slots.iter_mut().enumerate() {
                    let shard = t * per + i;
                    let encoded = synthetic_table(counts[shard], shard as u64).encode();
                    *slot = Some(ShardRecord {
                        path: format!("laion400m/{shard:05}.tar"),
                        examples: counts[shard],
                        skipped: 0,
                        table_bytes: encoded.len() as u64,
                        table_sha256: dpcap_proto::digest::sha256(&encoded),
                        // Pins of the size a LAION shard has (~30 KB an example); no bytes exist.
                        bytes: counts[shard] * 30_000,
                        sha256: dpcap_proto::digest::sha256(format!("shard {shard}").as_bytes()),
                        e_tag: Some(format!("\"{shard:032x}\"")),
                        store_version: None,
                    });
                }
            });
        }
    });
    Manifest {
        version: MANIFEST_VERSION,
        examples: opts.examples,
        shards: shards.into_iter().flatten().collect(),
        skipped: Skipped::default(),
        users: None,
        // A pin of the size N ids take (8 bytes each); no file exists.
        example_ids: Some(ExampleIdsRecord {
            bytes: 13 + 8 * opts.examples,
            sha256: dpcap_proto::digest::sha256(b"synthetic example ids"),
        }),
    }
}

/// What the release costs at size P.
struct ReleaseCosts {
    /// Over the same-host socket, stored by the production writer.
    local: ReleaseCost,
    /// Over gRPC on loopback, the same writer.
    grpc: ReleaseCost,
    /// Over gRPC, stored by object_store's multipart writer (`--multipart`).
    multipart: Option<ReleaseCost>,
    /// Each phase alone.
    parts: Breakdown,
    /// One memcpy of the release's bytes.
    copy: CopyReference,
}

/// The release at size P through a real accountant on each transport (and the multipart
/// writer when asked), each of its phases alone, and the memcpy reference.
async fn release_costs(opts: &ScaleBench) -> Result<ReleaseCosts> {
    let dir = tempfile::tempdir()?;
    let mut cost = CostOptions {
        params: opts.params,
        examples: opts.examples,
        batch: opts.batch,
        steps: opts.release_steps,
        warmup: opts.release_warmup,
        writer: Writer::Synced,
        transport: Transport::Local,
    };
    let measured = |e: cost::BenchError| anyhow::anyhow!(e);
    let local = cost::measure(&cost, &dir.path().join("local")).await.map_err(measured)?;
    cost.transport = Transport::Grpc;
    let grpc = cost::measure(&cost, &dir.path().join("grpc")).await.map_err(measured)?;
    cost.writer = Writer::Multipart;
    let multipart = match opts.multipart {
        true => Some(cost::measure(&cost, &dir.path().join("multipart")).await.map_err(measured)?),
        false => None,
    };
    let params = usize::try_from(opts.params)?;
    let parts = cost::breakdown(params, &dir.path().join("breakdown")).await.map_err(measured)?;
    Ok(ReleaseCosts { local, grpc, multipart, parts, copy: cost::memcpy_reference(params) })
}

/// The release's keys: the same-host path's as `release_*` (a rank on this host takes it),
/// gRPC's as `grpc_release_*`, the phases, the transports' remainders and the memcpy reference.
fn release_report(costs: &ReleaseCosts, params: u64) -> Result<serde_json::Map<String, serde_json::Value>> {
    let ReleaseCosts { local, grpc, multipart, parts, copy } = costs;
    let mut fields = serde_json::Map::new();
    let prefixed = [
        (serde_json::to_value(local)?, ""),
        (serde_json::to_value(grpc)?, "grpc_"),
        (serde_json::to_value(parts)?, "release_"),
        (serde_json::to_value(copy)?, ""),
    ];
    for (value, prefix) in prefixed {
        let serde_json::Value::Object(more) = value else { anyhow::bail!("costs serialise as objects") };
        fields.extend(more.into_iter().map(|(key, value)| (format!("{prefix}{key}"), value)));
    }
    let gradient = 2.0 * 4.0 * params as f64;
    fields.extend([
        ("release_transport".into(), json!(Transport::Local)),
        ("release_bytes_per_s".into(), json!(gradient / local.release_s)),
        ("grpc_release_bytes_per_s".into(), json!(gradient / grpc.release_s)),
        ("release_transport_cpu_s_per_gb".into(), json!(parts.transport_cpu_s_per_gb(local, Transport::Local))),
        ("grpc_release_transport_cpu_s_per_gb".into(), json!(parts.transport_cpu_s_per_gb(grpc, Transport::Grpc))),
        ("release_memcpy_multiple".into(), json!(local.release_cpu_s_per_gb / copy.memcpy_cpu_s_per_gb)),
    ]);
    if let Some(multipart) = multipart {
        fields.insert("release_multipart_s".into(), json!(multipart.release_s));
        fields.insert("release_multipart_first_chunk_s".into(), json!(multipart.release_first_chunk_s));
    }
    Ok(fields)
}

/// Runs the benchmark and prints its table (or JSON).
pub fn run(opts: ScaleBench) -> Result<()> {
    anyhow::ensure!(opts.shards > 0 && opts.examples >= opts.shards, "invalid --shards {}: need 1..=N", opts.shards);
    anyhow::ensure!(opts.batch > 0 && opts.batch <= opts.examples, "invalid --batch {}: need 1..=N", opts.batch);
    anyhow::ensure!(opts.ranks > 0, "invalid --ranks 0: need at least 1");
    let started = Instant::now();
    let manifest = build_manifest(&opts);
    let build_s = started.elapsed().as_secs_f64();
    // The tables and the example identities (8 bytes an example).
    let index_bytes: u64 = manifest.shards.iter().map(|s| s.table_bytes).sum::<u64>()
        + manifest.example_ids.as_ref().map_or(0, |ids| ids.bytes);
    let body = serde_json::to_vec(&manifest)?;
    drop(manifest);

    // The coordinator's view: the manifest parsed and the shard layout, nothing per example.
    let before = rss_bytes();
    let parsed = Manifest::parse(&body)?;
    let counts: Vec<u64> = parsed.shards.iter().map(|s| s.examples).collect();
    let layout = Layout::from_counts(&counts);
    let layout_rss_bytes = rss_bytes().saturating_sub(before);

    let q = opts.batch as f64 / opts.examples as f64;
    let sampler = PoissonSampler::new(JobSecret([7; 32]), opts.examples, q)?;
    let started = Instant::now();
    let sample = sampler.sample(0);
    let sample_s = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let work = split_work(&sample, &layout, opts.ranks);
    let split_s = started.elapsed().as_secs_f64();
    let max_stepwork_bytes =
        work.into_iter().map(|units| step_work(0, example_units(units), false).encoded_len()).max().unwrap_or(0);
    let single_rank_bytes = step_work(0, example_units(split_work(&sample, &layout, 1).remove(0)), false).encoded_len();
    drop((parsed, counts, layout));

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let costs = runtime.block_on(release_costs(&opts))?;
    let mut report = json!({
        "examples": opts.examples, "shards": opts.shards, "expected_batch": opts.batch, "sampled": sample.len(),
        "ranks": opts.ranks, "params": opts.params, "index_bytes": index_bytes,
        "index_bytes_per_example": index_bytes as f64 / opts.examples as f64, "index_build_s": build_s,
        "manifest_bytes": body.len(), "layout_rss_bytes": layout_rss_bytes, "sample_s": sample_s, "split_s": split_s,
        "max_stepwork_bytes": max_stepwork_bytes, "single_rank_stepwork_bytes": single_rank_bytes,
        "stepwork_limit_bytes": dpcap_proto::MAX_WORK_MESSAGE_BYTES,
        "threads": std::thread::available_parallelism().map_or(1, |n| n.get()),
    });
    report.as_object_mut().context("a JSON object")?.extend(release_report(&costs, opts.params)?);
    if opts.json {
        outln!("{report}");
    } else {
        outln!("paper-scale step orchestration (no GPU compute)");
        for (key, value) in report.as_object().into_iter().flatten() {
            outln!("  {key:<30} {value}");
        }
    }
    Ok(())
}
