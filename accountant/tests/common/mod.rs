//! Starts real `dpcap-accountant` processes on 127.0.0.1 ephemeral ports over a real
//! local-directory ledger, and talks to them over gRPC and HTTP.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use dpcap_proto::client::{AccountantClient, CallCredentials, CapabilityCell, ClientError, PartKey, RawClient};
use dpcap_proto::v1::{self as pb, FetchReleaseRequest, JobSpend, Mechanism, RegisterJobRequest, SubmitPartResponse};
use dpcap_serve::capability::{Capabilities, Capability, StepGrant, now_unix_ms};

/// Units a test step's capability says were sampled when the test is not about clipping: C
/// times this bounds any part the tests send.
pub const SAMPLED: u64 = 1 << 40;
use tonic::Status;

/// A running accountant process; killed (SIGKILL) on drop.
pub struct AccountantProcess {
    child: Child,
    pub grpc: String,
    pub metrics: String,
    pub ledger: PathBuf,
}

impl AccountantProcess {
    /// Starts the binary on `ledger`, accepting jobs on unbudgeted datasets, and waits until
    /// health reports SERVING.
    pub async fn start(ledger: &Path, extra: &[&str]) -> Self {
        let extra: Vec<&str> = extra.iter().copied().chain(["--allow-unbudgeted-datasets"]).collect();
        Self::start_strict(ledger, &extra).await
    }

    /// Starts the binary with the safe default: jobs need a dataset budget.
    pub async fn start_strict(ledger: &Path, extra: &[&str]) -> Self {
        let addr_file = ledger.with_extension(format!("addr-{}", std::process::id() as u64 * 1000 + rand_suffix()));
        let _ = std::fs::remove_file(&addr_file);
        let child = Command::new(env!("CARGO_BIN_EXE_dpcap-accountant"))
            .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--ledger"])
            .arg(ledger)
            .arg("--addr-file")
            .arg(&addr_file)
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("dpcap-accountant starts");
        let deadline = Instant::now() + Duration::from_secs(30);
        let addrs: serde_json::Value = loop {
            if let Ok(text) = std::fs::read_to_string(&addr_file) {
                break serde_json::from_str(&text).expect("addr file is json");
            }
            assert!(Instant::now() < deadline, "accountant did not write its addr file");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let process = Self {
            child,
            grpc: format!("http://{}", addrs["grpc"].as_str().unwrap()),
            metrics: format!("http://{}/metrics", addrs["metrics"].as_str().unwrap()),
            ledger: ledger.to_owned(),
        };
        process.wait_serving().await;
        process
    }

    async fn wait_serving(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(channel) = tonic::transport::Endpoint::new(self.grpc.clone()).unwrap().connect().await {
                let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
                let request = tonic_health::pb::HealthCheckRequest { service: "dpcap.v1.AccountantService".into() };
                if let Ok(r) = health.check(request).await
                    && r.into_inner().status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
                {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "accountant never reported SERVING");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn client(&self) -> Client {
        self.client_signed(Capabilities::new(None))
    }

    /// A client whose capabilities `issuer` signs (a coordinator's key, or a forger's).
    pub fn client_signed(&self, issuer: Capabilities) -> Client {
        Client { endpoint: self.grpc.clone(), generations: Arc::default(), issuer }
    }

    /// SIGKILL: no drain, no cleanup — a crash.
    pub fn kill(mut self) {
        self.child.kill().expect("kill");
        self.child.wait().expect("reap");
    }

    /// SIGTERM, then waits up to `timeout` for the process to exit; returns its exit status.
    pub fn terminate(mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().expect("kill -TERM runs");
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// The /metrics text.
    pub async fn scrape(&self) -> String {
        let url = self.metrics.trim_start_matches("http://");
        let (host, path) = url.split_once('/').unwrap();
        let mut stream = tokio::net::TcpStream::connect(host).await.expect("metrics port");
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        stream
            .write_all(format!("GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut body = String::new();
        stream.read_to_string(&mut body).await.unwrap();
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        body
    }
}

impl Drop for AccountantProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::SeqCst)
}

/// Parts W of each job registered through [`job`]: the capabilities a coordinator would issue
/// to its ranks state it.
static PARTS: LazyLock<Mutex<HashMap<String, u32>>> = LazyLock::new(Mutex::default);

#[allow(clippy::too_many_arguments)]
/// A registration with PLD accounting and no dataset, whose steps sum `parts` parts.
pub fn job(
    job_id: &str,
    q: f64,
    sigma: f64,
    clip: f64,
    target: f64,
    dim: u64,
    parts: u32,
    seed: Option<u64>,
) -> RegisterJobRequest {
    PARTS.lock().unwrap().insert(job_id.to_owned(), parts);
    RegisterJobRequest {
        job_id: job_id.into(),
        contract: Some(pb::PrivacyContract {
            mechanism: Some(Mechanism { sample_rate: q, noise_multiplier: sigma, clipping_norm: clip }),
            delta: 1e-5,
            epsilon_target: target,
            accountant: pb::AccountantKind::Pld as i32,
            privacy: if sigma == 0.0 { pb::Privacy::NotPrivate } else { pb::Privacy::Dp } as i32,
            planned_steps: PLANNED_STEPS,
            ..Default::default()
        }),
        gradient_dim: dim,
        insecure_noise_seed: seed,
    }
}

/// Steps a test job plans unless its test changes them: more than any test runs.
pub const PLANNED_STEPS: u64 = 1000;

/// The contract of a registration, to change a field.
pub fn contract(request: &mut RegisterJobRequest) -> &mut pb::PrivacyContract {
    request.contract.as_mut().expect("job() sets a contract")
}

/// A client of the accountant acting as the ranks of its jobs: each call carries an (unsigned)
/// capability for the rank, generation and W it is made as, as a coordinator would issue it.
#[derive(Clone)]
pub struct Client {
    endpoint: String,
    /// The newest generation each job's calls were made as.
    generations: Arc<Mutex<HashMap<String, u64>>>,
    /// Who signs the capabilities (unsigned: an accountant without keys).
    issuer: Capabilities,
}

impl Client {
    /// A client presenting exactly `capability` (None: no capability).
    pub fn with(&self, capability: Option<Capability>) -> AccountantClient {
        let endpoint = tonic::transport::Endpoint::from_shared(self.endpoint.clone()).expect("endpoint");
        let credentials = match capability {
            Some(c) => CallCredentials::default().with_capability(CapabilityCell::new(self.issuer.issue(&c))),
            None => CallCredentials::default(),
        };
        AccountantClient::lazy(endpoint, credentials)
    }

    /// `capability` as text, signed as this client's capabilities are.
    pub fn issue(&self, capability: &Capability) -> String {
        self.issuer.issue(capability)
    }

    /// The capability of `rank` of `job_id` in `generation` (or the newest seen).
    pub fn capability(&self, job_id: &str, rank: u32, generation: Option<u64>) -> Capability {
        let mut generations = self.generations.lock().unwrap();
        let newest = generations.entry(job_id.to_owned()).or_default();
        let generation = generation.unwrap_or(*newest);
        *newest = generation.max(*newest);
        let parts = PARTS.lock().unwrap().get(job_id).copied().unwrap_or(1);
        Capability {
            job_id: job_id.into(),
            rank,
            generation,
            group: 0,
            parts,
            expires_unix_ms: now_unix_ms() + 3_600_000,
            step: Some(StepGrant { step: 0, sampled: SAMPLED, units: SAMPLED }),
        }
    }

    /// The capability of part `key` for its step, which states `sampled` units, all of them
    /// this part's share.
    pub fn step_capability(&self, job_id: &str, key: PartKey, sampled: u64) -> Capability {
        self.share_capability(job_id, key, sampled, sampled)
    }

    /// The capability of part `key` for its step: `sampled` units, `units` of them its share.
    pub fn share_capability(&self, job_id: &str, key: PartKey, sampled: u64, units: u64) -> Capability {
        let step = Some(StepGrant { step: key.step, sampled, units });
        Capability { step, ..self.capability(job_id, key.part, Some(key.attempt)) }
    }

    /// The generated client without a capability (the coordinator's and operators' calls).
    pub fn raw(&mut self) -> RawClient {
        self.with(None).raw().clone()
    }

    /// The generated client with rank `rank`'s capability for `job_id`.
    pub fn raw_for(&mut self, job_id: &str, rank: u32) -> RawClient {
        let capability = self.capability(job_id, rank, None);
        self.with(Some(capability)).raw().clone()
    }

    /// Part `part` of `step` as attempt 0.
    pub async fn submit_part(
        &mut self,
        job_id: &str,
        step: u64,
        part: u32,
        values: &[f32],
    ) -> Result<SubmitPartResponse, ClientError> {
        self.submit_attempt(job_id, PartKey { step, part, attempt: 0 }, values).await
    }

    /// Part `part` of `step` as generation `attempt`.
    pub async fn submit_attempt(
        &mut self,
        job_id: &str,
        key: PartKey,
        values: &[f32],
    ) -> Result<SubmitPartResponse, ClientError> {
        let capability = self.step_capability(job_id, key, SAMPLED);
        self.with(Some(capability)).submit_attempt(job_id, key, values).await
    }

    /// Part `key` as a member of the group with nonce `group`.
    pub async fn submit_as(
        &mut self,
        job_id: &str,
        key: PartKey,
        group: u64,
        values: &[f32],
    ) -> Result<SubmitPartResponse, ClientError> {
        let capability = Capability { group, ..self.step_capability(job_id, key, SAMPLED) };
        self.with(Some(capability)).submit_attempt(job_id, key, values).await
    }

    /// The release of `step`, as rank 0 of the newest generation.
    pub async fn fetch_release(
        &mut self,
        job_id: &str,
        step: u64,
    ) -> Result<(Vec<f32>, Option<JobSpend>), ClientError> {
        let capability = self.capability(job_id, 0, None);
        self.with(Some(capability)).fetch_release(job_id, step).await
    }

    /// A streaming fetch in chunks of `chunk_values`, as rank 0.
    pub async fn fetch_stream(
        &mut self,
        job_id: &str,
        step: u64,
        chunk_values: u32,
    ) -> Result<tonic::Streaming<pb::ReleaseChunk>, Status> {
        let request = FetchReleaseRequest { job_id: job_id.into(), step, chunk_values };
        Ok(self.raw_for(job_id, 0).fetch_release(request).await?.into_inner())
    }
}

/// Step charge objects present in the ledger for a job.
pub fn charged_steps(ledger: &Path, job_id: &str) -> Vec<u64> {
    let dir = ledger.join("jobs").join(job_id).join("charges");
    let mut steps: Vec<u64> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.trim_end_matches(".json").parse().ok()).collect())
        .unwrap_or_default();
    steps.sort();
    steps
}

/// Part `part` of `step`, computed by generation `attempt`.
pub fn key(step: u64, part: u32, attempt: u64) -> PartKey {
    PartKey { step, part, attempt }
}
