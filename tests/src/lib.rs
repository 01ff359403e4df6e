//! Harness for dpcap's end-to-end tests: builds and starts the real `dpcap-accountant`,
//! `dpcap-coordinator`, `dpcap-worker` and `dpctl` binaries on 127.0.0.1 ephemeral ports over
//! local directories, waits for their health checks, and scrapes their metrics.
//!
//! It must never stand in for a component: every test process is the shipped binary.

pub mod binaries;
pub mod chaos;
pub mod jobs;
pub mod s3;
pub mod testdir;

pub use binaries::binary;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use dpcap_proto::v1::job_service_client::JobServiceClient;
use dpcap_serve::AttachToken;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// The components' log filter: `info` (a stalled job's logs must say where it stopped: at
/// `warn` a slow step leaves nothing), or `DPCAP_E2E_LOG` (`debug`, `warn`). Each component logs
/// to `<name>.log` in its test's directory, a few lines a step.
fn log_filter() -> String {
    std::env::var("DPCAP_E2E_LOG").unwrap_or_else(|_| "info,h2=warn,hyper=warn,tower=warn".into())
}

/// A running component; SIGKILLed on drop.
pub struct Process {
    child: Option<Child>,
    /// "http://127.0.0.1:PORT" of its gRPC server.
    pub grpc: String,
    /// "127.0.0.1:PORT" of its metrics server.
    pub metrics: String,
}

impl Process {
    /// Starts `binary` with `args` plus `--addr-file`, and waits until `service` is SERVING.
    pub async fn server(binary_name: &str, args: &[String], dir: &Path, service: &str) -> Self {
        Self::server_with_env(binary_name, args, dir, service, &[]).await
    }

    /// [`Process::server`] with `env` added to the environment (an object store's endpoint and
    /// keys).
    pub async fn server_with_env(
        binary_name: &str,
        args: &[String],
        dir: &Path,
        service: &str,
        env: &[(String, String)],
    ) -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let addr_file =
            dir.join(format!("{binary_name}-{}.addr", NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst)));
        let child = Command::new(binary(binary_name))
            .args(args)
            .arg("--addr-file")
            .arg(&addr_file)
            .env("RUST_LOG", log_filter())
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log_file(dir, binary_name))
            .spawn()
            .unwrap_or_else(|e| panic!("{binary_name} starts: {e}"));
        let deadline = Instant::now() + Duration::from_secs(60);
        let addrs: serde_json::Value = loop {
            if let Some(v) = std::fs::read_to_string(&addr_file).ok().and_then(|t| serde_json::from_str(&t).ok()) {
                break v;
            }
            assert!(Instant::now() < deadline, "{binary_name} wrote no addr file");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let process = Self {
            child: Some(child),
            grpc: format!("http://{}", addrs["grpc"].as_str().expect("grpc address")),
            metrics: addrs["metrics"].as_str().unwrap_or_default().to_owned(),
        };
        process.wait_serving(service).await;
        process
    }

    /// A worker process pointed at `coordinator`.
    pub fn worker(coordinator: &str, name: &str, dir: &Path) -> Self {
        Self::worker_with(coordinator, name, dir, &[])
    }

    /// A worker process with `extra` arguments (a token, TLS flags).
    pub fn worker_with(coordinator: &str, name: &str, dir: &Path, extra: &[&str]) -> Self {
        Self::worker_with_env(coordinator, name, dir, extra, &[])
    }

    /// [`Process::worker_with`] with `env` added to the environment.
    pub fn worker_with_env(
        coordinator: &str,
        name: &str,
        dir: &Path,
        extra: &[&str],
        env: &[(String, String)],
    ) -> Self {
        let child = Command::new(binary("dpcap-worker"))
            .args(["--coordinator", coordinator, "--name", name, "--device", "cpu"])
            .args(extra)
            .env("RUST_LOG", log_filter())
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log_file(dir, name))
            .spawn()
            .expect("dpcap-worker starts");
        Self { child: Some(child), grpc: String::new(), metrics: String::new() }
    }

    async fn wait_serving(&self, service: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(channel) = tonic::transport::Endpoint::new(self.grpc.clone()).expect("endpoint").connect().await {
                let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
                let request = tonic_health::pb::HealthCheckRequest { service: service.into() };
                if let Ok(r) = health.check(request).await
                    && r.into_inner().status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
                {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "{service} never reported SERVING");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGTERM, then waits up to `timeout` for the process to exit; the time it took, or None
    /// if it was still running (it is then SIGKILLed).
    pub fn terminate(&mut self, timeout: Duration) -> Option<Duration> {
        let mut child = self.child.take()?;
        let started = Instant::now();
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        while started.elapsed() < timeout {
            if let Ok(Some(_)) = child.try_wait() {
                return Some(started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGSTOP: the process stops answering while its connections stay open (a stalled
    /// disk, a long pause, a peer partitioned away); [`Process::resume`] lets it go on.
    pub fn pause(&self) {
        self.signal("-STOP");
        // kill(2) returns once the signal is queued; the group stop takes hold only when one
        // of the process's threads handles it, and until then its other threads run on.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.stopped() {
            assert!(Instant::now() < deadline, "the process never stopped after SIGSTOP");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Every thread of the process is stopped (state T in /proc).
    fn stopped(&self) -> bool {
        let Some(pid) = self.pid() else { return false };
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
        tasks.flatten().all(|task| {
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            // The state follows the command name, which is in parentheses and may hold spaces.
            stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next()).is_some_and(|s| s == 'T' || s == 't')
        })
    }

    /// SIGCONT after [`Process::pause`].
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.pid().expect("the process runs").to_string();
        let status = Command::new("kill").args([signal, &pid]).status().expect("kill runs");
        assert!(status.success(), "kill {signal} {pid}: {status}");
    }

    /// SIGKILL: a crash, no drain.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The `/metrics` text.
    pub async fn scrape(&self) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(&self.metrics).await.expect("metrics port");
        let request = format!("GET /metrics HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", self.metrics);
        stream.write_all(request.as_bytes()).await.expect("write");
        let mut response = String::new();
        stream.read_to_string(&mut response).await.expect("read");
        let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
        assert!(!head.to_ascii_lowercase().contains("transfer-encoding: chunked"), "a chunked /metrics: {head}");
        body.to_owned()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// An appending log file `dir/NAME.log` for a child's stderr (kept for failure analysis).
fn log_file(dir: &Path, name: &str) -> Stdio {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{name}.log")))
        .map(Stdio::from)
        .unwrap_or_else(|_| Stdio::inherit())
}

/// How long one `dpctl` call may run: a `wait` on the tests' few-step jobs takes seconds, so
/// a stuck one fails the test (with the component logs) long before CI's own limits.
pub const DPCTL_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs `dpctl` with `args` to completion, or panics after [`DPCTL_TIMEOUT`].
pub fn dpctl(args: &[&str]) -> Output {
    dpctl_with_env(args, &[])
}

/// [`dpctl`] with `env` added to the environment.
pub fn dpctl_with_env(args: &[&str], env: &[(String, String)]) -> Output {
    let mut child = Command::new(binary("dpctl"))
        .args(args)
        .env("RUST_LOG", log_filter())
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("dpctl runs");
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    use std::io::Read;
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for dpctl") {
            break status;
        }
        if started.elapsed() > DPCTL_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            // What it printed so far (`wait` prints a line per progress change) says where the
            // job stood.
            let (out, err) = (stdout.join().unwrap_or_default(), stderr.join().unwrap_or_default());
            panic!(
                "dpctl {} did not finish in {} s; its stdout:\n{}\nits stderr:\n{}",
                args.join(" "),
                DPCTL_TIMEOUT.as_secs(),
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&err)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output { status, stdout: stdout.join().unwrap_or_default(), stderr: stderr.join().unwrap_or_default() }
}

/// Writes a synthetic dataset of `examples` training examples under `dir` and indexes it.
pub fn synth_dataset(dir: &Path, examples: u64) -> PathBuf {
    let train = synth_shards(dir, examples);
    let o = dpctl(&["dataset", "index", "--train-tokenizer", train.to_str().unwrap()]);
    assert!(o.status.success(), "dataset index: {}", String::from_utf8_lossy(&o.stderr));
    train
}

/// Writes the shards of a synthetic dataset of `examples` training examples under `dir`, not
/// indexed (a test that moves them first indexes them where they end up).
pub fn synth_shards(dir: &Path, examples: u64) -> PathBuf {
    let out = dir.join("data");
    let o = dpctl(&[
        "dataset",
        "synth",
        "--out",
        out.to_str().unwrap(),
        "--examples",
        &examples.to_string(),
        "--eval-examples",
        "0",
        "--shard-size",
        "100",
    ]);
    assert!(o.status.success(), "dataset synth: {}", String::from_utf8_lossy(&o.stderr));
    out.join("train")
}

/// Writes a user-partitioned identity dataset of `users` users (two identities, four images
/// each: 8 examples a user) under `dir` and indexes it (its user table included).
pub fn identities_dataset(dir: &Path, users: u64) -> PathBuf {
    let out = dir.join("identities");
    let o = dpctl(&[
        "dataset",
        "synth",
        "--kind",
        "identities",
        "--out",
        out.to_str().unwrap(),
        "--users",
        &users.to_string(),
        "--shard-users",
        "7",
    ]);
    assert!(o.status.success(), "dataset synth --kind identities: {}", String::from_utf8_lossy(&o.stderr));
    let train = out.join("train");
    let o = dpctl(&["dataset", "index", train.to_str().unwrap()]);
    assert!(o.status.success(), "dataset index: {}", String::from_utf8_lossy(&o.stderr));
    train
}

/// The capability key file of a test cluster under `dir` (written once, kept across restarts).
pub fn capability_keys(dir: &Path) -> PathBuf {
    let path = dir.join("capability.keys");
    if !path.exists() {
        std::fs::write(&path, dpcap_serve::KeyRing::generate("e2e").to_file_text()).expect("writing the key file");
    }
    path
}

/// How a test cluster's servers start: their lease, extra flags, where they keep state and
/// what they find in their environment. Restarts keep all of it.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// The coordinator's lease in seconds.
    pub lease_seconds: u64,
    /// Extra accountant flags (tokens, TLS, budgets).
    pub accountant_extra: Vec<String>,
    /// Extra coordinator flags.
    pub coordinator_extra: Vec<String>,
    /// The ledger's location (a directory or an object-store URL); None: `dir/ledger`.
    pub ledger: Option<String>,
    /// The job store's location; None: `dir/store`.
    pub store: Option<String>,
    /// Variables added to both servers' environment (an object store's endpoint and keys).
    pub env: Vec<(String, String)>,
    /// The accountant also serves its same-host socket (`dir/accountant.sock`), which the
    /// workers of the test, on its host, then choose for their parts and releases.
    pub local_socket: bool,
}

impl Default for Cluster {
    /// A 3 s lease; jobs on datasets without a budget are accepted; parts and releases over
    /// the same-host socket.
    fn default() -> Self {
        Self {
            lease_seconds: 3,
            accountant_extra: vec!["--allow-unbudgeted-datasets".into()],
            coordinator_extra: Vec::new(),
            ledger: None,
            store: None,
            env: Vec::new(),
            local_socket: true,
        }
    }
}

/// The accountant and coordinator of a test cluster (workers are started separately).
pub struct Services {
    /// The accountant process.
    pub accountant: Process,
    /// The coordinator process.
    pub coordinator: Process,
    /// The coordinator's job store directory (for a cluster on an object store, its URL as a
    /// path: read such a cluster through its servers).
    pub store: PathBuf,
    /// The accountant's ledger directory (as `store`).
    pub ledger: PathBuf,
    /// The coordinator's lease in seconds.
    pub lease_seconds: u64,
    dir: PathBuf,
    accountant_extra: Vec<String>,
    coordinator_extra: Vec<String>,
    env: Vec<(String, String)>,
}

impl Services {
    /// Starts both over `dir/ledger` and `dir/store`, with a 3 s lease.
    pub async fn start(dir: &Path) -> Self {
        Self::with_lease(dir, 3).await
    }

    /// Starts both with a lease of `lease_seconds`.
    /// The accountant accepts jobs on datasets without a budget (tests of datasets' budgets
    /// start it through [`Services::with_args`] without the flag).
    pub async fn with_lease(dir: &Path, lease_seconds: u64) -> Self {
        Self::with_cluster(dir, Cluster { lease_seconds, ..Cluster::default() }).await
    }

    /// Starts both with `accountant_extra` and `coordinator_extra` arguments (tokens, TLS);
    /// restarts keep them.
    pub async fn with_args(
        dir: &Path,
        lease_seconds: u64,
        accountant_extra: &[&str],
        coordinator_extra: &[&str],
    ) -> Self {
        let owned = |a: &[&str]| a.iter().map(|s| s.to_string()).collect();
        let (accountant_extra, coordinator_extra) = (owned(accountant_extra), owned(coordinator_extra));
        Self::with_cluster(dir, Cluster { lease_seconds, accountant_extra, coordinator_extra, ..Cluster::default() })
            .await
    }

    /// Starts both as `cluster` says.
    pub async fn with_cluster(dir: &Path, cluster: Cluster) -> Self {
        let local = |name: &str| dir.join(name).to_string_lossy().into_owned();
        let ledger = cluster.ledger.unwrap_or_else(|| local("ledger"));
        let store = cluster.store.unwrap_or_else(|| local("store"));
        // Workers' capabilities are signed, as in production: one key file shared by the
        // coordinator and the accountant only.
        let keys = capability_keys(dir);
        let flags = |extra: Vec<String>, state: &str, location: &str| {
            ["--capability-key-file".to_owned(), keys.to_string_lossy().into_owned()]
                .into_iter()
                .chain(extra)
                .chain([state.to_owned(), location.to_owned()])
                .collect::<Vec<_>>()
        };
        let mut accountant_extra = flags(cluster.accountant_extra, "--ledger", &ledger);
        if cluster.local_socket {
            accountant_extra.extend(["--local-socket".to_owned(), local("accountant.sock")]);
        }
        let coordinator_extra = flags(cluster.coordinator_extra, "--store", &store);
        let env = cluster.env;
        let accountant = Self::accountant_on(dir, "127.0.0.1:0", &accountant_extra, &env).await;
        let lease = cluster.lease_seconds;
        let coordinator =
            Self::coordinator_on(dir, &accountant.grpc, lease, "127.0.0.1:0", &coordinator_extra, &env).await;
        Self {
            accountant,
            coordinator,
            store: PathBuf::from(store),
            ledger: PathBuf::from(ledger),
            lease_seconds: lease,
            dir: dir.to_owned(),
            accountant_extra,
            coordinator_extra,
            env,
        }
    }

    async fn accountant_on(dir: &Path, listen: &str, extra: &[String], env: &[(String, String)]) -> Process {
        let args: Vec<String> = ["--listen", listen, "--metrics-listen", "127.0.0.1:0"]
            .iter()
            .map(|s| s.to_string())
            .chain(extra.iter().cloned())
            .collect();
        Process::server_with_env("dpcap-accountant", &args, dir, "dpcap.v1.AccountantService", env).await
    }

    /// SIGKILLs the accountant and starts a new one on the same port and ledger (workers and
    /// the coordinator keep its address), after `down` of downtime.
    pub async fn restart_accountant(&mut self, down: Duration) {
        let listen = self.accountant.grpc.trim_start_matches("http://").to_owned();
        self.accountant.kill();
        tokio::time::sleep(down).await;
        self.accountant = Self::accountant_on(&self.dir, &listen, &self.accountant_extra, &self.env).await;
    }

    /// Adds `flags` to the coordinator's, from its next restart on.
    pub fn add_coordinator_flags(&mut self, flags: &[&str]) {
        self.coordinator_extra.extend(flags.iter().map(|f| f.to_string()));
    }

    /// SIGKILLs the coordinator and starts a new one on the same port and store.
    pub async fn restart_coordinator(&mut self, down: Duration) {
        let listen = self.coordinator.grpc.trim_start_matches("http://").to_owned();
        self.coordinator.kill();
        tokio::time::sleep(down).await;
        self.coordinator = Self::coordinator_on(
            &self.dir,
            &self.accountant.grpc,
            self.lease_seconds,
            &listen,
            &self.coordinator_extra,
            &self.env,
        )
        .await;
    }

    /// Starts a coordinator on `store` with a 3 s lease (also used to restart one).
    pub async fn coordinator(dir: &Path, store: &Path, accountant: &str) -> Process {
        let args = [
            "--capability-key-file".to_owned(),
            capability_keys(dir).to_string_lossy().into_owned(),
            "--store".to_owned(),
            store.to_string_lossy().into_owned(),
        ];
        Self::coordinator_on(dir, accountant, 3, "127.0.0.1:0", &args, &[]).await
    }

    async fn coordinator_on(
        dir: &Path,
        accountant: &str,
        lease_seconds: u64,
        listen: &str,
        extra: &[String],
        env: &[(String, String)],
    ) -> Process {
        let lease = lease_seconds.to_string();
        let args: Vec<String> = [
            "--listen",
            listen,
            "--metrics-listen",
            "127.0.0.1:0",
            "--lease-seconds",
            &lease,
            "--accountant",
            accountant,
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(extra.iter().cloned())
        .collect();
        Process::server_with_env("dpcap-coordinator", &args, dir, "dpcap.v1.JobService", env).await
    }

    /// Steps of `job_id` the ledger records as discarded.
    pub fn discarded_steps(&self, job_id: &str) -> Vec<u64> {
        // Discard markers are bare step numbers (`discarded/{step:020}`), charges `STEP.json`.
        ledger_steps(&self.ledger.join("jobs").join(job_id).join("discarded"), "")
    }

    /// A JobService client.
    pub async fn jobs(&self) -> JobServiceClient<InterceptedService<Channel, AttachToken>> {
        let channel = tonic::transport::Endpoint::new(self.coordinator.grpc.clone())
            .expect("endpoint")
            .connect()
            .await
            .expect("connects");
        JobServiceClient::with_interceptor(channel, AttachToken(None))
    }

    /// Charge records in the ledger for `job_id`, by step number.
    pub fn charged_steps(&self, job_id: &str) -> Vec<u64> {
        ledger_steps(&self.ledger.join("jobs").join(job_id).join("charges"), ".json")
    }

    /// The coordinator's job store with its own record key (from its secrets store beside the
    /// job store): what only the coordinator can do, for a test that plays a coordinator killed
    /// between two writes.
    pub async fn job_store(&self) -> dpcap_coordinator::JobStore {
        let jobs = dpcap_serve::open_store(&self.store.to_string_lossy()).expect("job store");
        let secrets = format!("{}-secrets", self.store.to_string_lossy());
        let secrets = dpcap_serve::open_store(&secrets).expect("secrets store");
        dpcap_coordinator::JobStore::open(jobs, secrets, false).await.expect("record key")
    }

    /// Where `job_id`'s sealed record lies in a local job store: what a worker, which writes
    /// its checkpoints there, could rewrite.
    pub fn record_path(&self, job_id: &str) -> PathBuf {
        self.store.join("jobs").join(job_id).join("job.sealed")
    }

    /// Where the coordinator's own copy of `job_id`'s record lies (its secrets store beside a
    /// local job store): what restore reads.
    pub fn own_record_path(&self, job_id: &str) -> PathBuf {
        PathBuf::from(format!("{}-secrets", self.store.display())).join("jobs").join(job_id).join("job.sealed")
    }
}

/// The steps of a ledger directory's committed records, `STEP.json`, in order. A put the
/// accountant was killed in the middle of leaves object_store's staging file `STEP.json#N`,
/// which was never committed (the ledger's replay ignores it too) and is not a record.
fn ledger_steps(dir: &Path, suffix: &str) -> Vec<u64> {
    let mut steps: Vec<u64> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(suffix)?.parse().ok()).collect())
        .unwrap_or_default();
    steps.sort_unstable();
    steps
}
