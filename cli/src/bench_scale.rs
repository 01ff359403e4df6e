//! `dpctl bench scale`: the orchestration of one step at the paper's size, without GPU compute.
//! A compact index for N = 233,804,767 examples in 23,381 shards (tables encoded from a
//! synthetic tar layout; no images), the coordinator's view of it (manifest → layout), a
//! Poisson sample of L = 1,310,720, its split into work units for 128 ranks as encoded
//! `StepWork` messages, and one release of P = 190,042,170 gradient coordinates through a real
//! accountant on loopback, with noise drawn ahead as in production.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use dpcap_accountant::Policy;
use dpcap_accountant::noise::{self, NoiseMode};
use dpcap_accountant::server::ServeError;
use dpcap_coordinator::work::example_units;
use dpcap_coordinator::{JobSecret, PoissonSampler, split_work, step_work};
use dpcap_dataset::index::ImageKind;
use dpcap_dataset::index::{Layout, MANIFEST_VERSION, Manifest, ShardRecord, ShardTable, Skipped, Span, TableEntry};
use dpcap_proto::client::{AccountantClient, CallCredentials, CapabilityCell};
use dpcap_proto::v1::{AccountantKind, FetchReleaseRequest, Mechanism, PrivacyContract, RegisterJobRequest};
use dpcap_serve::ServerSecurity;
use dpcap_serve::{Capabilities, Capability};
use prost::Message;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use serde_json::json;

/// DP-Cap's dataset: image–caption pairs.
pub const PAPER_EXAMPLES: u64 = 233_804_767;
/// LAION-style shards of ~10k examples.
pub const PAPER_SHARDS: u64 = 23_381;
/// DP-Cap's expected batch.
pub const PAPER_BATCH: u64 = 1_310_720;
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
    /// Released steps timed (the median is reported).
    #[arg(long, default_value_t = 3)]
    release_steps: u64,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// CPU seconds this process has used (user + system, every thread), from /proc: what a
/// release costs the machine, beside how long it takes.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces): utime and stime are the 12th and
    // 13th, in clock ticks (100 per second on Linux).
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: u64 = after.split_whitespace().skip(11).take(2).filter_map(|t| t.parse::<u64>().ok()).sum();
    ticks as f64 / 100.0
}

/// Resident set size now (not the peak), from /proc.
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    statm.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()).map_or(0, |pages| pages * 4096)
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
                        ..Default::default()
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
    }
}

/// What one release at size P costs through a real accountant on loopback (medians).
struct ReleaseTiming {
    /// First byte of the part in → last byte of the release out.
    seconds: f64,
    /// First byte of the part in → first byte of the release out (the part's transfer, the
    /// charge and the first noised block).
    first_chunk_s: f64,
    /// First byte of the part in → the part's answer, which comes once the release is stored.
    stored_s: f64,
    /// CPU seconds the accountant and its client used together during the release.
    cpu_s: f64,
    noise_coords_per_s_per_core: f64,
    /// Bytes per second the ledger's disk takes with an fsync (256 MiB written, then synced).
    disk_fsync_bytes_per_s: f64,
}

/// The ledger disk's fsync'd write rate: what a durable release is bounded by.
fn disk_fsync_rate(dir: &std::path::Path) -> Result<f64> {
    use std::io::Write;
    let path = dir.join("disk-probe");
    let block = vec![0x5au8; 16 << 20];
    let started = Instant::now();
    let mut file = std::fs::File::create(&path)?;
    for _ in 0..16 {
        file.write_all(&block)?;
    }
    file.sync_all()?;
    let rate = (16 * block.len()) as f64 / started.elapsed().as_secs_f64();
    std::fs::remove_file(path)?;
    Ok(rate)
}

/// Fetches `step`'s release whole, returning its values and when its first chunk came.
async fn fetch_timed(client: &mut AccountantClient, step: u64) -> Result<(usize, Instant)> {
    let request = FetchReleaseRequest { job_id: "scale".into(), step, chunk_values: 0 };
    let mut stream = client.raw().fetch_release(request).await?.into_inner();
    let (mut bytes, mut first) = (0, None);
    while let Some(chunk) = stream.message().await? {
        first.get_or_insert_with(Instant::now);
        bytes += chunk.data.len();
        if chunk.last {
            return Ok((bytes / 4, first.expect("a chunk came")));
        }
    }
    anyhow::bail!("the release of step {step} ended without its last chunk")
}

/// How the bench's accountant writes its stored releases.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Writer {
    /// The production path for a local ledger: a file synced part by part while it is written.
    Synced,
    /// object_store's multipart upload over the same directory, synced once when it completes
    /// (what the ledger does on any other object store): the side-by-side reference.
    Multipart,
}

/// An accountant in this process over a ledger in `dir`, written by `writer`; a client acting
/// as the one rank of the bench job (its unsigned capability, as a coordinator without keys
/// would issue it); and the accountant's stop switch and task.
async fn start_accountant(
    dir: &std::path::Path,
    writer: Writer,
) -> Result<(AccountantClient, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<Result<(), ServeError>>)> {
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let metrics = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = grpc.local_addr()?;
    let location = dir.to_string_lossy().into_owned();
    let ledger = match writer {
        Writer::Synced => dpcap_accountant::server::open_ledger(&location)?,
        Writer::Multipart => {
            let (store, root) = dpcap_serve::open_durable_store(&location)?;
            dpcap_accountant::ledger::Ledger::new(store, root)
        }
    };
    let server = ServerSecurity::default().server(addr)?;
    let policy = Policy { allow_unbudgeted_datasets: true, ..Default::default() };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let accountant = tokio::spawn(async move {
        let shutdown = async move {
            let _ = stopped.await;
        };
        let setup = dpcap_accountant::server::Setup { ledger, policy, capabilities: Capabilities::new(None) };
        dpcap_accountant::server::serve((grpc, metrics), server, setup, shutdown).await
    });
    let rank =
        Capability { job_id: "scale".into(), rank: 0, generation: 0, group: 0, parts: 1, expires_unix_ms: u64::MAX };
    let credentials =
        CallCredentials::default().with_capability(CapabilityCell::new(Capabilities::new(None).issue(&rank)));
    let client =
        AccountantClient::lazy(tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?, credentials);
    Ok((client, stop, accountant))
}

/// Registers the bench job: DP-Cap's mechanism at the bench's N and L.
async fn register(client: &AccountantClient, opts: &ScaleBench) -> Result<()> {
    let q = opts.batch as f64 / opts.examples as f64;
    let register = RegisterJobRequest {
        job_id: "scale".into(),
        contract: Some(PrivacyContract {
            mechanism: Some(Mechanism { sample_rate: q, noise_multiplier: 0.728, clipping_norm: 1.0 }),
            delta: 1.0 / opts.examples as f64,
            epsilon_target: 8.0,
            accountant: AccountantKind::Rdp as i32,
            ..Default::default()
        }),
        gradient_dim: opts.params,
        ..Default::default()
    };
    // The accountant answers UNAVAILABLE until it has replayed its (empty) ledger.
    let policy = dpcap_proto::RetryPolicy { deadline: Duration::from_secs(30), ..Default::default() };
    dpcap_proto::retry(policy, "register", || {
        let (mut client, register) = (client.clone(), register.clone());
        async move { client.raw().register_job(register).await }
    })
    .await
    .context("registering the bench job")?;
    Ok(())
}

async fn time_release(opts: &ScaleBench, writer: Writer) -> Result<ReleaseTiming> {
    let dim = usize::try_from(opts.params)?;
    // Noise throughput first: it says how long a step must compute for noise to be ready.
    let sample = dim.min(1 << 24);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let started = Instant::now();
    std::hint::black_box(noise::draw(sample, 1.0, NoiseMode::OsEntropy, 0)?);
    let noise_rate = sample as f64 / started.elapsed().as_secs_f64();
    let noise_wait = Duration::from_secs_f64(dim as f64 / noise_rate * 1.2 + 0.5);

    let dir = tempfile::tempdir()?;
    let (client, stop, accountant) = start_accountant(dir.path(), writer).await?;
    register(&client, opts).await?;
    let part = dpcap_proto::floats::into_bytes((0..dim).map(|i| (i % 1013) as f32 * 1e-4).collect());
    let (mut times, mut firsts, mut stores, mut cpus) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for step in 0..opts.release_steps.max(1) {
        // Between steps the ranks compute; the accountant draws the next step's noise meanwhile.
        tokio::time::sleep(noise_wait).await;
        let (started, cpu) = (Instant::now(), cpu_seconds());
        let (mut submitter, mut fetcher) = (client.clone(), client.clone());
        // The rank fetches while it submits, as the worker does: the release streams while the
        // accountant stores it, and its last chunk comes once it is stored.
        let submit = async {
            let submitted = submitter.submit_bytes("scale", (step, 0, 0), part.clone()).await;
            (submitted, started.elapsed().as_secs_f64())
        };
        let ((submitted, stored_s), fetched) = tokio::join!(submit, fetch_timed(&mut fetcher, step));
        submitted.context("submitting the part")?;
        let (values, first) = fetched.context("fetching the release")?;
        times.push(started.elapsed().as_secs_f64());
        cpus.push(cpu_seconds() - cpu);
        firsts.push((first - started).as_secs_f64());
        stores.push(stored_s);
        anyhow::ensure!(values == dim, "release of {values} values");
    }
    let _ = stop.send(());
    accountant.await??;
    let disk_fsync_bytes_per_s = disk_fsync_rate(dir.path())?;
    Ok(ReleaseTiming {
        seconds: median(times),
        first_chunk_s: median(firsts),
        stored_s: median(stores),
        cpu_s: median(cpus),
        noise_coords_per_s_per_core: noise_rate / cores as f64,
        disk_fsync_bytes_per_s,
    })
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Runs the benchmark and prints its table (or JSON).
pub fn run(opts: ScaleBench) -> Result<()> {
    anyhow::ensure!(opts.shards > 0 && opts.examples >= opts.shards, "invalid --shards {}: need 1..=N", opts.shards);
    anyhow::ensure!(opts.batch > 0 && opts.batch <= opts.examples, "invalid --batch {}: need 1..=N", opts.batch);
    anyhow::ensure!(opts.ranks > 0, "invalid --ranks 0: need at least 1");
    let started = Instant::now();
    let manifest = build_manifest(&opts);
    let build_s = started.elapsed().as_secs_f64();
    let index_bytes: u64 = manifest.shards.iter().map(|s| s.table_bytes).sum();
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
    let work = split_work(&sample, &layout, &vec![1.0; opts.ranks]);
    let split_s = started.elapsed().as_secs_f64();
    let max_stepwork_bytes =
        work.into_iter().map(|units| step_work(0, example_units(units), false).encoded_len()).max().unwrap_or(0);
    let single_rank_bytes =
        step_work(0, example_units(split_work(&sample, &layout, &[1.0]).remove(0)), false).encoded_len();
    drop((parsed, counts, layout));

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let release = runtime.block_on(time_release(&opts, Writer::Synced))?;
    let multipart = runtime.block_on(time_release(&opts, Writer::Multipart))?;
    let release_bytes_per_s = 2.0 * 4.0 * opts.params as f64 / release.seconds;
    let report = json!({
        "examples": opts.examples, "shards": opts.shards, "expected_batch": opts.batch, "sampled": sample.len(),
        "ranks": opts.ranks, "params": opts.params, "index_bytes": index_bytes,
        "index_bytes_per_example": index_bytes as f64 / opts.examples as f64, "index_build_s": build_s,
        "manifest_bytes": body.len(), "layout_rss_bytes": layout_rss_bytes, "sample_s": sample_s, "split_s": split_s,
        "max_stepwork_bytes": max_stepwork_bytes, "single_rank_stepwork_bytes": single_rank_bytes,
        "stepwork_limit_bytes": dpcap_proto::MAX_WORK_MESSAGE_BYTES, "release_s": release.seconds,
        "release_bytes_per_s": release_bytes_per_s, "release_first_chunk_s": release.first_chunk_s,
        "release_stored_s": release.stored_s, "disk_fsync_bytes_per_s": release.disk_fsync_bytes_per_s,
        "release_cpu_s": release.cpu_s, "release_multipart_s": multipart.seconds, "release_multipart_first_chunk_s": multipart.first_chunk_s,
        "noise_coords_per_s_per_core": release.noise_coords_per_s_per_core,
        "threads": std::thread::available_parallelism().map_or(1, |n| n.get()),
    });
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
