//! What one release costs, measured on the real thing: an accountant server in this process on
//! loopback, one rank that streams its part in and fetches the release while it is stored
//! (noise drawn ahead, as in production), and each phase of the release run alone on the same
//! P for the breakdown. CPU-seconds per GB of gradient released (4·P bytes) is the figure that
//! carries to another machine; wall time here is set by this machine's cores.
//! `dpctl bench scale` and `cargo bench -p dpcap-accountant --features bench --bench release` report it.
//!
//! Benchmark code, not service code: nothing in the service calls it.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use prost::Message;
use serde::Serialize;
use tokio::sync::watch;
use xxhash_rust::xxh3::Xxh3;

use dpcap_proto::client::{AccountantClient, CHUNK_VALUES, CallCredentials, CapabilityCell, LocalChoice, PartKey};
use dpcap_proto::floats;
use dpcap_proto::v1::{AccountantKind, Mechanism, PrivacyContract, RegisterJobRequest, ReleaseChunk};
use dpcap_serve::{Capabilities, Capability, ServerSecurity, StepGrant};

use crate::blocks::{BlockPool, Filler};
use crate::noise::{self, BLOCK_BYTES, NoiseMode};
use crate::release::{Release, Stored};
use crate::server::{ServeError, Setup};
use crate::sum::{Chunks, Sum};
use crate::{LocalSetup, Policy, server};

/// A failed measurement.
pub type BenchError = Box<dyn std::error::Error + Send + Sync>;

/// Resident set size now (not the peak), from /proc.
pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    statm.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()).map_or(0, |pages| pages * 4096)
}

/// CPU seconds this process has used (user + system, every thread, ended ones too), in
/// nanoseconds from the kernel's scheduler: what a release costs the machine, beside how long
/// it takes. (/proc's ticks are 10 ms: 0.05 CPU-s per GB of a 200 MB release.)
pub fn cpu_seconds() -> f64 {
    let clock = nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID;
    nix::time::clock_gettime(clock).map_or(0.0, |t| t.tv_sec() as f64 + t.tv_nsec() as f64 * 1e-9)
}

/// CPU seconds of each live thread of this process named `name`, by thread id (the
/// scheduler's nanoseconds, `/proc/self/task/*/schedstat`'s first field).
fn threads_cpu_seconds(name: &str) -> std::collections::HashMap<String, f64> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Default::default() };
    tasks
        .filter_map(|task| {
            let path = task.ok()?.path();
            let comm = std::fs::read_to_string(path.join("comm")).ok()?;
            (comm.trim_end() == name).then_some(())?;
            let schedstat = std::fs::read_to_string(path.join("schedstat")).ok()?;
            let nanos: u64 = schedstat.split_whitespace().next()?.parse().ok()?;
            Some((path.file_name()?.to_string_lossy().into_owned(), nanos as f64 * 1e-9))
        })
        .collect()
}

/// CPU seconds spent since `before` by threads drawing noise ahead: the next step's noise
/// starts once this one is stored, while the rank still reads the release's last chunks, and
/// is not the release's cost. A draw thread that ended in between is not subtracted.
fn drawing_ahead_since(before: &std::collections::HashMap<String, f64>) -> f64 {
    let now = threads_cpu_seconds(noise::DRAW_THREAD);
    now.iter().map(|(tid, cpu)| cpu - before.get(tid).copied().unwrap_or(0.0)).sum()
}

/// Waits until no thread of this process draws noise, up to `limit`, and returns how long it
/// waited. A release timed while the draw ahead of it still runs shares the cores with that
/// draw (at nice 10 it gets less of them when the machine is busy, so a pause planned from one
/// sample of its speed can be short), and a draw thread that ends during the release is not
/// subtracted from its CPU; a rank computing a step at the paper's size gives the draw longer.
/// The accountant of a finished measurement may also have started its next step's draw,
/// which would run into the next measurement.
async fn draws_done(limit: Duration) -> Result<f64, BenchError> {
    let started = Instant::now();
    while !threads_cpu_seconds(noise::DRAW_THREAD).is_empty() {
        if started.elapsed() > limit {
            return Err(format!("noise still drawn after {limit:?} of waiting for it").into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// How the measured accountant writes its stored releases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// The production path for a local ledger: a file synced part by part while it is written.
    Synced,
    /// object_store's multipart upload over the same directory, synced once when it completes
    /// (what the ledger does on any other object store): the side-by-side reference.
    Multipart,
}

/// How the measured rank reaches the accountant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    /// gRPC over loopback TCP: what a rank on another host uses.
    Grpc,
    /// The same-host Unix socket (`--local-socket`), which a rank on the accountant's host
    /// chooses when both ends agree.
    Local,
}

/// What to measure.
#[derive(Debug, Clone, Copy)]
pub struct CostOptions {
    /// Gradient coordinates P.
    pub params: u64,
    /// Examples N: with `batch`, the job's sampling rate q = L/N and δ = 1/N.
    pub examples: u64,
    /// Expected batch L.
    pub batch: u64,
    /// Releases timed; medians are reported.
    pub steps: u64,
    /// Releases run first, untimed ([`WARMUP_STEPS`] for a running job's steady state).
    pub warmup: u64,
    /// How the ledger stores releases.
    pub writer: Writer,
    /// How the rank sends its part and reads the release.
    pub transport: Transport,
}

/// One release at size P through the real accountant (medians over the steps).
#[derive(Debug, Clone, Serialize)]
pub struct ReleaseCost {
    /// First byte of the part in → last byte of the release out.
    pub release_s: f64,
    /// First byte of the part in → first byte of the release out (the part's transfer, the
    /// charge and the first noised block).
    pub release_first_chunk_s: f64,
    /// First byte of the part in → the part's answer, which comes once the release is stored.
    pub release_stored_s: f64,
    /// CPU seconds the accountant and its client used together during the release, less what
    /// the next step's noise, drawn ahead once this release is stored, took meanwhile.
    pub release_cpu_s: f64,
    /// The same per GB of gradient released (4·P bytes).
    pub release_cpu_s_per_gb: f64,
    /// Every timed release's CPU-s per GB, in order (the median above is of these).
    pub release_cpu_s_per_gb_each: Vec<f64>,
    /// Noise drawn per second per core (off the critical path: drawn while ranks compute).
    pub noise_coords_per_s_per_core: f64,
    /// The most a timed release was held, past the pause planned from that rate, until the
    /// draw ahead of it had ended ([`draws_done`]): how far the draw lagged the plan.
    pub release_noise_late_s: f64,
    /// Bytes per second the ledger's disk takes with an fsync (256 MiB written, then synced).
    pub disk_fsync_bytes_per_s: f64,
}

/// CPU-seconds per GB of each phase of a release, each run alone on the same P.
#[derive(Debug, Clone, Serialize)]
pub struct Breakdown {
    /// The part's chunks copied out of the transport's buffers into blocks, checked finite
    /// and hashed (per part): the gRPC path.
    pub check_cpu_s_per_gb: f64,
    /// The part checked finite and hashed where it lies: the same-host path, whose socket
    /// reads land in the blocks.
    pub check_in_place_cpu_s_per_gb: f64,
    /// Sum + noise → the release's f32 blocks (a single part's own, written in place), on
    /// half the cores.
    pub noise_add_cpu_s_per_gb: f64,
    /// The release's chunks encoded as gRPC messages (per rank that fetches it).
    pub encode_cpu_s_per_gb: f64,
    /// The release written to the ledger's disk and synced.
    pub store_cpu_s_per_gb: f64,
}

impl Breakdown {
    /// What the measured phases leave of a release's cost over `transport`, per GB: over gRPC,
    /// HTTP/2 framing and flow control, the copies between its buffers and the client's decode;
    /// over the same-host socket, the copies into and out of the kernel; and the tasks around.
    pub fn transport_cpu_s_per_gb(&self, release: &ReleaseCost, transport: Transport) -> f64 {
        let phases = self.noise_add_cpu_s_per_gb
            + self.store_cpu_s_per_gb
            + match transport {
                Transport::Grpc => self.check_cpu_s_per_gb + self.encode_cpu_s_per_gb,
                Transport::Local => self.check_in_place_cpu_s_per_gb,
            };
        (release.release_cpu_s_per_gb - phases).max(0.0)
    }
}

/// One `memcpy` of a release's bytes: the machine's physical limit, against which a release's
/// CPU-s per GB reads (a release moves each byte in, out and to disk at least once).
#[derive(Debug, Clone, Serialize)]
pub struct CopyReference {
    /// Bytes copied per second by one core (median of 5, into memory already touched).
    pub memcpy_bytes_per_s: f64,
    /// The same as CPU-seconds per GB copied.
    pub memcpy_cpu_s_per_gb: f64,
}

/// Copies 4·`params` bytes 6 times into the same destination; the first (which faults the
/// destination's pages in) is left out.
pub fn memcpy_reference(params: usize) -> CopyReference {
    let source = vec![0x5au8; 4 * params];
    let mut target = vec![0u8; 4 * params];
    let mut seconds = Vec::new();
    for _ in 0..6 {
        let started = Instant::now();
        target.copy_from_slice(std::hint::black_box(&source));
        seconds.push(started.elapsed().as_secs_f64());
        std::hint::black_box(&target);
    }
    let median = median(seconds.split_off(1));
    CopyReference { memcpy_bytes_per_s: source.len() as f64 / median, memcpy_cpu_s_per_gb: median / gigabytes(params) }
}

fn gigabytes(params: usize) -> f64 {
    4.0 * params as f64 / 1e9
}

/// CPU seconds `work` takes (the process's, so `work` should be all that runs).
fn cpu_of<T>(work: impl FnOnce() -> T) -> (T, f64) {
    let before = cpu_seconds();
    let out = work();
    (out, cpu_seconds() - before)
}

/// A part of `params` values in the chunks a rank sends.
fn part_chunks(params: usize) -> Vec<Bytes> {
    let data = floats::into_bytes((0..params).map(|i| (i % 1013) as f32 * 1e-4).collect());
    (0..params.div_ceil(CHUNK_VALUES))
        .map(|i| data.slice(4 * i * CHUNK_VALUES..(4 * (i + 1) * CHUNK_VALUES).min(data.len())))
        .collect()
}

/// Each phase of a release alone, on P = `params` values, with the ledger under `dir`.
pub async fn breakdown(params: usize, dir: &Path) -> Result<Breakdown, BenchError> {
    let gb = gigabytes(params);
    let chunks = part_chunks(params);
    let pool = BlockPool::new(BLOCK_BYTES / 4);
    pool.expect_step(params);
    let noise = noise::draw(params, 1.0, NoiseMode::OsEntropy, 0)?;
    // Each phase twice, the second timed: in a running job the blocks are reused, not new.
    let (mut check_s, mut in_place_s, mut add_s, mut blocks) = (0.0, 0.0, 0.0, Vec::new());
    for _ in 0..2 {
        // The last pass's release, back to the pool, as a running job's oldest kept release
        // returns its blocks: a single part's release is written over the part's own blocks,
        // so the next part's blocks are those.
        blocks.clear();
        let checked;
        (checked, check_s) = cpu_of(|| {
            let (mut part, mut hasher, mut filler) = (Chunks::default(), Xxh3::new(), Filler::new(&pool, params));
            for chunk in &chunks {
                filler.fill(chunk, |block| {
                    floats::check_finite(block.as_ref(), part.len() as u64)?;
                    hasher.update(block.as_ref());
                    part.push_block(block);
                    Ok::<_, floats::FloatsError>(())
                })?;
            }
            Ok::<_, floats::FloatsError>((part, hasher.digest()))
        });
        let part = checked?.0;
        (_, in_place_s) = cpu_of(|| {
            let mut hasher = Xxh3::new();
            for (i, block) in part.slices(0..params).enumerate() {
                std::hint::black_box(floats::check_finite(block, (i * BLOCK_BYTES / 4) as u64).is_ok());
                hasher.update(block);
            }
            hasher.digest()
        });
        let sum = Sum::One(part);
        let filled = std::sync::Mutex::new(vec![Bytes::new(); params.div_ceil(BLOCK_BYTES / 4)]);
        let added;
        (added, add_s) = cpu_of(|| noise::apply_each(sum, &noise, &pool, |i, b| filled.lock().expect("blocks")[i] = b));
        added?;
        blocks = filled.into_inner().expect("blocks");
    }
    drop((chunks, noise));

    let (encoded, encode_s) = cpu_of(|| {
        let mut buffer = BytesMut::new();
        let mut total = 0;
        for block in &blocks {
            for (i, data) in block.chunks(4 * CHUNK_VALUES).enumerate() {
                let chunk = ReleaseChunk { offset: i as u64, data: block.slice_ref(data), ..Default::default() };
                buffer.clear();
                chunk.encode(&mut buffer).map_err(|e| e.to_string())?;
                total += buffer.len();
            }
        }
        Ok::<_, String>(total)
    });
    std::hint::black_box(encoded?);

    let release = Release::filling(0, 1.0, 4 * params, 4 * params, BLOCK_BYTES, watch::channel(Stored::Done).1);
    blocks.into_iter().enumerate().for_each(|(index, block)| release.fill(index, block));
    let ledger = server::open_ledger(&dir.to_string_lossy())?;
    let before = cpu_seconds();
    ledger.put_release("breakdown", 0, &release).await?;
    let store_s = cpu_seconds() - before;
    Ok(Breakdown {
        check_cpu_s_per_gb: check_s / gb,
        check_in_place_cpu_s_per_gb: in_place_s / gb,
        noise_add_cpu_s_per_gb: add_s / gb,
        encode_cpu_s_per_gb: encode_s / gb,
        store_cpu_s_per_gb: store_s / gb,
    })
}

/// The ledger disk's fsync'd write rate: what a durable release is bounded by.
fn disk_fsync_rate(dir: &Path) -> Result<f64, BenchError> {
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

/// A running accountant: its client (acting as the one rank of the job, through `capability`),
/// stop switch and task.
pub(crate) struct Running {
    pub(crate) client: AccountantClient,
    pub(crate) capability: CapabilityCell,
    pub(crate) stop: tokio::sync::oneshot::Sender<()>,
    pub(crate) task: tokio::task::JoinHandle<Result<(), ServeError>>,
}

/// An accountant in this process over a ledger in `dir`, written by `writer`, under `policy`,
/// and a client with the unsigned capability of rank 0 (as a coordinator without keys would
/// issue it).
pub(crate) async fn start(dir: &Path, writer: Writer, policy: Policy, local: bool) -> Result<Running, BenchError> {
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let metrics = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = grpc.local_addr()?;
    let location = dir.to_string_lossy().into_owned();
    let ledger = match writer {
        Writer::Synced => server::open_ledger(&location)?,
        Writer::Multipart => {
            let (store, root) = dpcap_serve::open_durable_store(&location)?;
            crate::ledger::Ledger::new(store, root)
        }
    };
    let secured = ServerSecurity::default().server(addr)?;
    let local = local.then(|| LocalSetup { path: dir.with_extension("sock"), credentials: Default::default() });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let shutdown = async move {
            let _ = stopped.await;
        };
        let setup = Setup { ledger, policy, capabilities: Capabilities::new(None), local };
        server::serve(dpcap_serve::Listeners { grpc, metrics, tls: false }, secured, setup, shutdown).await
    });
    let capability = CapabilityCell::new(Capabilities::new(None).issue(&rank_capability()));
    let credentials = CallCredentials::default().with_capability(capability.clone());
    let client =
        AccountantClient::lazy(tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?, credentials);
    Ok(Running { client, capability, stop, task })
}

/// The measured job's one rank (unsigned: the bench's accountant holds no key).
fn rank_capability() -> Capability {
    Capability {
        job_id: "scale".into(),
        rank: 0,
        generation: 0,
        group: 0,
        parts: 1,
        expires_unix_ms: u64::MAX,
        step: None,
    }
}

/// Registers the measured job: DP-Cap's mechanism at the options' N and L.
async fn register(client: &AccountantClient, opts: &CostOptions) -> Result<(), BenchError> {
    let register = RegisterJobRequest {
        job_id: "scale".into(),
        contract: Some(PrivacyContract {
            mechanism: Some(Mechanism {
                sample_rate: opts.batch as f64 / opts.examples as f64,
                noise_multiplier: dpcap_privacy::recipes::DP_CAP.noise_multiplier,
                clipping_norm: 1.0,
            }),
            delta: 1.0 / opts.examples as f64,
            epsilon_target: 8.0,
            accountant: AccountantKind::Rdp as i32,
            planned_steps: opts.warmup + opts.steps.max(1),
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
    .await?;
    Ok(())
}

pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Releases run before the timed ones: a job runs thousands of steps, and its first ones
/// allocate the blocks that later ones reuse (a step's part and release, and the releases kept
/// in memory for late fetches, [`crate::job::RELEASES_KEPT`]).
pub const WARMUP_STEPS: u64 = crate::job::RELEASES_KEPT as u64 + 2;

/// Times `opts.steps` releases of P values (after `opts.warmup` untimed) through a real
/// accountant with its ledger under `dir`. Between steps it waits, as ranks compute, while the
/// next step's noise is drawn.
pub async fn measure(opts: &CostOptions, dir: &Path) -> Result<ReleaseCost, BenchError> {
    let dim = usize::try_from(opts.params)?;
    // Noise throughput first: it says how long a step must compute for noise to be ready.
    let sample = dim.min(1 << 24);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let started = Instant::now();
    std::hint::black_box(noise::draw(sample, 1.0, NoiseMode::OsEntropy, 0)?);
    let noise_rate = sample as f64 / started.elapsed().as_secs_f64();
    let noise_wait = Duration::from_secs_f64(dim as f64 / noise_rate * 1.2 + 0.5);

    let policy = Policy { allow_unbudgeted_datasets: true, ..Default::default() };
    let Running { mut client, stop, task, .. } =
        start(dir, opts.writer, policy, opts.transport == Transport::Local).await?;
    register(&client, opts).await?;
    if opts.transport == Transport::Local {
        match client.use_local().await? {
            LocalChoice::Chosen(_) => {}
            refused => return Err(format!("the same-host socket was not chosen: {refused:?}").into()),
        }
    }
    // The rank's buffer for the release, reused from step to step as a worker's is.
    let mut release = Vec::new();
    let part = floats::into_bytes((0..dim).map(|i| (i % 1013) as f32 * 1e-4).collect());
    let (mut times, mut firsts, mut stores, mut cpus) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (warmup, mut late) = (opts.warmup, 0f64);
    for step in 0..warmup + opts.steps.max(1) {
        tokio::time::sleep(noise_wait).await;
        let waited = draws_done(10 * noise_wait).await?;
        let (started, cpu, drawing) = (Instant::now(), cpu_seconds(), threads_cpu_seconds(noise::DRAW_THREAD));
        let (mut submitter, mut fetcher) = (client.clone(), client.clone());
        // The rank fetches while it submits, as the worker does: the release streams while the
        // accountant stores it, and its last chunk comes once it is stored.
        // The step's capability, as the coordinator issues it: the units it sampled (L).
        let grant =
            Capability { step: Some(StepGrant { step, sampled: opts.batch, units: opts.batch }), ..rank_capability() };
        let grant = Capabilities::new(None).issue(&grant);
        let submit = async {
            let submitted =
                submitter.submit_bytes("scale", PartKey { step, part: 0, attempt: 0 }, &grant, part.clone()).await;
            (submitted, started.elapsed().as_secs_f64())
        };
        let fetch = fetcher.fetch_release_into("scale", step, &mut release);
        let ((submitted, stored_s), fetched) = tokio::join!(submit, fetch);
        submitted?;
        let first = fetched?.first_data;
        if release.len() != dim {
            return Err(format!("release of {} values, expected {dim}", release.len()).into());
        }
        if step < warmup {
            continue;
        }
        late = late.max(waited);
        times.push(started.elapsed().as_secs_f64());
        cpus.push(cpu_seconds() - cpu - drawing_ahead_since(&drawing));
        firsts.push((first - started).as_secs_f64());
        stores.push(stored_s);
    }
    let _ = stop.send(());
    task.await??;
    // The next step's draw, started once the last release was stored: one more pause, as
    // before a step (the draw's threads may not have started yet), then until it has ended.
    tokio::time::sleep(noise_wait).await;
    draws_done(10 * noise_wait).await?;
    let each = cpus.iter().map(|cpu| cpu / gigabytes(dim)).collect();
    let cpu_s = median(cpus);
    Ok(ReleaseCost {
        release_s: median(times),
        release_first_chunk_s: median(firsts),
        release_stored_s: median(stores),
        release_cpu_s: cpu_s,
        release_cpu_s_per_gb: cpu_s / gigabytes(dim),
        release_cpu_s_per_gb_each: each,
        noise_coords_per_s_per_core: noise_rate / cores as f64,
        release_noise_late_s: late,
        disk_fsync_bytes_per_s: disk_fsync_rate(dir)?,
    })
}
