//! Whoever reaches a port is not trusted: every RPC of every service needs a token of one of its
//! roles, TLS and mTLS admit only clients the server can verify, and a server refuses to listen
//! on a non-loopback address without both TLS and tokens unless told `--insecure`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dpcap_e2e::jobs::{spec, tempfile_dir};
use dpcap_e2e::{Process, Services, binary, synth_dataset};
use dpcap_proto::ErrorCode;
use dpcap_proto::client::{AccountantClient, CallCredentials, CapabilityCell, PartKey};
use dpcap_serve::ClientTlsArgs;
use dpcap_serve::auth::{POLICY, ROLES, Role};
use tonic::Code;
use tonic::codegen::http::uri::PathAndQuery;

#[path = "security/trust.rs"]
mod trust;

fn token(role: Role) -> String {
    format!("{}-token-0123456789abcdef", role.as_str())
}

/// `--ROLE-token TOKEN` for every role: the servers of a secured cluster.
fn role_flags() -> Vec<String> {
    ROLES.iter().flat_map(|r| [format!("--{}-token", r.as_str()), token(*r)]).collect()
}

/// Calls `path` with an empty request (every dpcap request message decodes from no bytes), so
/// the answer tells only what the auth layer decided and what the handler said after it.
async fn call(url: &str, path: &'static str, bearer: Option<&str>) -> Result<(), tonic::Status> {
    let channel = tonic::transport::Endpoint::from_shared(url.to_owned()).unwrap().connect().await.unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let mut request = tonic::Request::new(());
    if let Some(t) = bearer {
        request.metadata_mut().insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    let codec = tonic_prost::ProstCodec::<(), ()>::default();
    let call = grpc.unary(request, PathAndQuery::from_static(path), codec);
    match tokio::time::timeout(Duration::from_secs(10), call).await {
        Ok(result) => result.map(|_| ()),
        Err(_) => Err(tonic::Status::deadline_exceeded("no answer in 10 s")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_refuses_callers_without_credentials_or_with_the_wrong_role_and_serves_the_right_one() {
    let dir = tempfile_dir("roles");
    let roles = role_flags();
    let roles: Vec<&str> = roles.iter().map(String::as_str).collect();
    let flags: Vec<&str> = roles.iter().copied().chain(["--allow-unbudgeted-datasets"]).collect();
    let accountant_token = token(Role::Coordinator);
    let coordinator_flags: Vec<&str> = roles.iter().copied().chain(["--accountant-token", &accountant_token]).collect();
    let services = Services::with_args(&dir, 3, &flags, &coordinator_flags).await;
    for (path, allowed) in POLICY {
        let url = if path.starts_with("/dpcap.v1.AccountantService/") {
            &services.accountant.grpc
        } else {
            &services.coordinator.grpc
        };
        let anonymous = call(url, path, None).await.unwrap_err();
        assert_eq!(anonymous.code(), Code::Unauthenticated, "{path} without a token: {anonymous:?}");
        let forged = call(url, path, Some("not-a-token-0123456789")).await.unwrap_err();
        assert_eq!(forged.code(), Code::Unauthenticated, "{path} with an unknown token");
        for role in ROLES {
            let answer = call(url, path, Some(&token(role))).await;
            let code = answer.as_ref().err().map_or(Code::Ok, tonic::Status::code);
            if allowed.contains(&role) {
                assert!(
                    !matches!(code, Code::Unauthenticated | Code::PermissionDenied),
                    "{path} as {role} is allowed: {answer:?}"
                );
            } else {
                let refused = answer.unwrap_err();
                assert_eq!(refused.code(), Code::PermissionDenied, "{path} as {role}: {refused:?}");
                assert_eq!(ErrorCode::of(&refused), Some(ErrorCode::PermissionDenied));
            }
        }
    }
    // Health stays open to probes; the secured cluster still runs a job end to end.
    let dataset = synth_dataset(&dir, 120);
    let worker_flags = ["--cluster-token", &token(Role::Worker)];
    let _workers = [
        Process::worker_with(&services.coordinator.grpc, "w0", &dir, &worker_flags),
        Process::worker_with(&services.coordinator.grpc, "w1", &dir, &worker_flags),
    ];
    let job = {
        let channel = tonic::transport::Endpoint::from_shared(services.coordinator.grpc.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut jobs = dpcap_proto::v1::job_service_client::JobServiceClient::with_interceptor(
            channel,
            dpcap_serve::AttachToken(Some(token(Role::Operator).into())),
        );
        let request = dpcap_proto::v1::SubmitJobRequest {
            spec: Some(spec(&dataset, 3).into_proto().unwrap()),
            idempotency_key: String::new(),
        };
        jobs.submit_job(request).await.unwrap().into_inner()
    };
    let deadline = Instant::now() + dpcap_e2e::jobs::within(3);
    let out = loop {
        let out = Command::new(binary("dpctl"))
            .args([
                "--coordinator",
                &services.coordinator.grpc,
                "--token",
                &token(Role::Viewer),
                "get",
                "--json",
                &job.job_id,
            ])
            .output()
            .unwrap();
        let state = serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["state"].clone();
        if state != "PENDING" && state != "RUNNING" || Instant::now() > deadline {
            break out;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["state"], "SUCCEEDED", "{shown:#}");
    // Without a token, dpctl says which flag carries one.
    let out = dpcap_e2e::dpctl(&["--coordinator", &services.coordinator.grpc, "get", &job.job_id]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("pass --token (or set DPCAP_TOKEN)"), "{stderr}");
}

/// A CA, a server certificate for localhost and 127.0.0.1, and a client certificate, as PEM files.
fn certificates(
    dir: &Path,
) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, &ca_key);
    let server_key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&server_key, &issuer)
        .unwrap();
    let client_key = KeyPair::generate().unwrap();
    let client =
        CertificateParams::new(vec!["dpcap-worker".to_owned()]).unwrap().signed_by(&client_key, &issuer).unwrap();
    let write = |name: &str, pem: String| {
        let path = dir.join(name);
        std::fs::write(&path, pem).unwrap();
        path
    };
    std::fs::write(dir.join("client.der"), client.der()).unwrap();
    (
        write("ca.pem", ca.pem()),
        write("server.pem", server.pem()),
        write("server.key", server_key.serialize_pem()),
        write("client.pem", client.pem()),
        write("client.key", client_key.serialize_pem()),
    )
}

async fn health_over(tls: &ClientTlsArgs, url: &str) -> Result<(), String> {
    let endpoint = tls.endpoint(url).map_err(|e| e.to_string())?;
    let channel = endpoint.connect().await.map_err(|e| format!("{e:?}"))?;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let request = tonic_health::pb::HealthCheckRequest { service: String::new() };
    health.check(request).await.map(|_| ()).map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_mtls_admit_only_clients_the_server_can_verify() {
    let dir = tempfile_dir("tls");
    let (ca, cert, key, client_cert, client_key) = certificates(&dir);
    // The client certificate itself proves the coordinator role (mTLS identity), by fingerprint.
    let der = std::fs::read(client_cert.with_extension("der")).unwrap();
    let tokens_file = dir.join("tokens");
    std::fs::write(&tokens_file, format!("coordinator cert:{}\n", dpcap_proto::digest::sha256(&der))).unwrap();
    let addr_file = dir.join("accountant.addr");
    let mut accountant = Command::new(binary("dpcap-accountant"))
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--ledger"])
        .arg(dir.join("ledger"))
        .arg("--addr-file")
        .arg(&addr_file)
        .arg("--tls-cert")
        .arg(&cert)
        .arg("--tls-key")
        .arg(&key)
        .arg("--tls-client-ca")
        .arg(&ca)
        .args(["--coordinator-token", &token(Role::Coordinator)])
        .arg("--auth-tokens-file")
        .arg(&tokens_file)
        .arg("--capability-key-file")
        .arg(dpcap_e2e::capability_keys(&dir))
        .stderr(std::fs::File::create(dir.join("accountant.log")).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let addrs: serde_json::Value = loop {
        if let Some(v) = std::fs::read_to_string(&addr_file).ok().and_then(|t| serde_json::from_str(&t).ok()) {
            break v;
        }
        assert!(Instant::now() < deadline, "no addr file");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let port = addrs["grpc"].as_str().unwrap().rsplit(':').next().unwrap().to_owned();
    let url = format!("https://localhost:{port}");
    let trusted = ClientTlsArgs {
        tls_ca: Some(ca.clone()),
        tls_client_cert: Some(client_cert.clone()),
        tls_client_key: Some(client_key.clone()),
        tls_domain: None,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = health_over(&trusted, &url).await {
        assert!(Instant::now() < deadline, "a trusted mTLS client never got through: {e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The role check still applies inside the tunnel.
    let endpoint = trusted.endpoint(&url).unwrap();
    let mut client = AccountantClient::lazy(endpoint, CallCredentials::token(Some(token(Role::Coordinator).into())));
    let spend = client.raw().get_spend(dpcap_proto::v1::GetSpendRequest { job_id: "nope".into() }).await.unwrap_err();
    assert_eq!(ErrorCode::of(&spend), Some(ErrorCode::JobNotRegistered), "{spend:?}");

    let endpoint = trusted.endpoint(&url).unwrap();
    let mut by_certificate = AccountantClient::lazy(endpoint, CallCredentials::default());
    let spend =
        by_certificate.raw().get_spend(dpcap_proto::v1::GetSpendRequest { job_id: "nope".into() }).await.unwrap_err();
    assert_eq!(
        ErrorCode::of(&spend),
        Some(ErrorCode::JobNotRegistered),
        "the certificate alone authenticates: {spend:?}"
    );
    let close = by_certificate.raw().close_job(dpcap_proto::v1::CloseJobRequest::default()).await.unwrap_err();
    assert_ne!(close.code(), Code::Unauthenticated);
    let part = by_certificate.raw().fetch_release(dpcap_proto::v1::FetchReleaseRequest::default()).await.unwrap_err();
    assert_eq!(part.code(), Code::PermissionDenied, "the certificate's role is coordinator, not worker");

    let no_client_cert = ClientTlsArgs { tls_ca: Some(ca.clone()), ..Default::default() };
    assert!(health_over(&no_client_cert, &url).await.is_err(), "mTLS: a client without a certificate is refused");
    let untrusting =
        ClientTlsArgs { tls_client_cert: Some(client_cert), tls_client_key: Some(client_key), ..Default::default() };
    assert!(health_over(&untrusting, &url).await.is_err(), "a client that cannot verify the server fails");
    let before = std::fs::read_to_string(dir.join("accountant.log")).unwrap_or_default();
    assert!(!before.contains("spoke plaintext"), "TLS clients, trusted or not, are never taken for plaintext ones");
    let plaintext = format!("http://127.0.0.1:{port}");
    assert!(health_over(&ClientTlsArgs::default(), &plaintext).await.is_err(), "no plaintext on a TLS port");
    // ...and the server says why, which the plaintext client itself cannot tell (grpcurl
    // -plaintext only times out).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(dir.join("accountant.log")).unwrap_or_default().contains("spoke plaintext") {
        assert!(Instant::now() < deadline, "the accountant logged nothing about a plaintext client");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The usual mistakes end at once (a certificate is not transient), naming what to pass.
    for (endpoint, hint) in [(&url, "pass --tls-ca"), (&plaintext, "use an https:// endpoint and --tls-ca")] {
        let started = Instant::now();
        let out = dpcap_e2e::dpctl(&["dataset", "budget", "show", "sha256:00", "--accountant", endpoint]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(hint), "{endpoint}: {stderr}");
        assert_eq!(stderr.matches(hint).count(), 1, "said once: {stderr}");
        assert!(started.elapsed() < Duration::from_secs(15), "{endpoint}: took {:?}", started.elapsed());
    }
    // A worker that does not trust the server's certificate fails fast instead of retrying.
    let started = Instant::now();
    let worker = Command::new(binary("dpcap-worker"))
        .args(["--coordinator", &url, "--name", "untrusting"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&worker.stderr);
    assert!(!worker.status.success(), "{stderr}");
    assert!(stderr.contains("--tls-ca"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(20), "the worker took {:?}", started.elapsed());
    let _ = accountant.kill();
    let _ = accountant.wait();
}

fn start_exposed(dir: &Path, extra: &[&str]) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(binary("dpcap-accountant"))
        .args(["--listen", "0.0.0.0:0", "--metrics-listen", "127.0.0.1:0", "--ledger"])
        .arg(dir.join("ledger"))
        .args(extra)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            use std::io::Read;
            child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
            return (status, stderr);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return (child.wait().unwrap(), String::from("still running"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_server_on_a_non_loopback_address_without_tls_and_tokens_refuses_to_start_unless_insecure() {
    let dir = tempfile_dir("exposure");
    let (status, stderr) = start_exposed(&dir, &[]);
    assert!(!status.success() && stderr.contains("refusing to listen on 0.0.0.0"), "{status:?}: {stderr}");
    let worker_token = token(Role::Worker);
    let (status, stderr) = start_exposed(&dir, &["--worker-token", &worker_token]);
    assert!(!status.success() && stderr.contains("without TLS"), "tokens alone are not enough: {stderr}");
    let (_, stderr) = start_exposed(&dir, &["--insecure"]);
    assert_eq!(stderr, "still running", "--insecure is the explicit unsafe choice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_secrets_live_apart_from_artifacts_and_a_strict_job_exports_nothing_its_sample_shapes() {
    let dir = tempfile_dir("secrets-strict");
    let dataset = synth_dataset(&dir, 240);
    let services = Services::start(&dir).await;
    let _workers = [
        Process::worker(&services.coordinator.grpc, "w0", &dir),
        Process::worker(&services.coordinator.grpc, "w1", &dir),
    ];
    let mut strict = spec(&dataset, 4);
    strict.telemetry = Some("strict".into());
    let job = dpcap_e2e::jobs::submit(&services, strict).await;
    let job =
        dpcap_e2e::jobs::wait_until(&services, &job.job_id, dpcap_e2e::jobs::within(4), dpcap_e2e::jobs::ended).await;
    assert_eq!(job.state, dpcap_proto::v1::JobState::Succeeded as i32, "{job:#?}");

    // The sampler secret is in the secrets store and nowhere under the store workers write to.
    let secrets = services.store.with_file_name("store-secrets");
    let private = std::fs::read_to_string(secrets.join("jobs").join(&job.job_id).join("private.json")).unwrap();
    let secret = serde_json::from_str::<serde_json::Value>(&private).unwrap()["secret"].as_str().unwrap().to_owned();
    let mut pending = vec![services.store.clone()];
    while let Some(path) = pending.pop() {
        for entry in std::fs::read_dir(&path).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let bytes = std::fs::read(&path).unwrap();
                assert!(
                    !String::from_utf8_lossy(&bytes).contains(&secret),
                    "the secret leaked into {}",
                    path.display()
                );
            }
        }
    }

    // Strict: no loss, no examples/s or ETA, no per-step phase timings.
    let progress = job.progress.clone().unwrap();
    assert_eq!((progress.loss, progress.examples_per_second, progress.eta_seconds), (None, 0.0, 0.0), "{progress:?}");
    let metrics = services.coordinator.scrape().await;
    assert!(
        !metrics.contains(&format!("dpcap_step_duration_seconds_sum{{job_id=\"{}\"", job.job_id)),
        "step timings of a strict job are not exported: {metrics}"
    );
    use dpcap_worker::runtime::RuntimeError;
    use dpcap_worker::runtime::session::reported_error;
    let read = dpcap_dataset::JobDataError::Data("example shard-0003/000012: bad png".into());
    let caption = dpcap_ml::MlError::Example("example shard-0003/000012: caption too long".into());
    for data_error in [RuntimeError::Data(read), RuntimeError::Ml(caption)] {
        let shown = reported_error(&data_error, true);
        assert!(!shown.contains("000012") && shown.contains("withheld"), "{shown}");
        assert!(reported_error(&data_error, false).contains("000012"));
    }
    // A spec error names no example: shown in full under strict telemetry too.
    let spec = RuntimeError::Data(dpcap_dataset::JobDataError::Spec { field: "dataset", reason: "moved".into() });
    assert!(reported_error(&spec, true).contains("moved"));
}

/// The attack that motivated job-scoped capabilities, tried against a secured cluster of real
/// processes: a worker token registers a weak contract (refused: only the coordinator writes
/// contracts), acts as another worker (refused: the worker key), and uses the capability of its
/// own assignment on another job (refused: the capability names its job). Nothing is charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_token_writes_no_contract_and_its_capability_opens_only_its_own_job() {
    use dpcap_proto::v1::worker_service_client::WorkerServiceClient;
    use dpcap_proto::v1::{
        AttachJobRequest, FetchReleaseRequest, GetSpendRequest, GetStepRequest, HeartbeatRequest, Mechanism,
        PrivacyContract, RegisterJobRequest, RegisterWorkerRequest, ReportStepRequest, StepOutcome,
    };
    let dir = tempfile_dir("capability");
    let dataset = synth_dataset(&dir, 120);
    let roles = role_flags();
    let roles: Vec<&str> = roles.iter().map(String::as_str).collect();
    let flags: Vec<&str> = roles.iter().copied().chain(["--allow-unbudgeted-datasets"]).collect();
    let coordinator_token = token(Role::Coordinator);
    let coordinator_flags: Vec<&str> =
        roles.iter().copied().chain(["--accountant-token", &coordinator_token]).collect();
    // A long lease: the hand-driven worker below heartbeats only when the test does.
    let services = Services::with_args(&dir, 60, &flags, &coordinator_flags).await;
    let accountant = |credentials: CallCredentials| {
        let endpoint = tonic::transport::Endpoint::from_shared(services.accountant.grpc.clone()).unwrap();
        AccountantClient::lazy(endpoint, credentials)
    };
    let as_worker = || CallCredentials::token(Some(token(Role::Worker).into()));
    let as_coordinator = || CallCredentials::token(Some(token(Role::Coordinator).into()));

    // A worker token registering σ = 0.01 at a target of 1e9.
    let weak = RegisterJobRequest {
        job_id: "job-weak".into(),
        contract: Some(PrivacyContract {
            mechanism: Some(Mechanism { sample_rate: 0.01, noise_multiplier: 0.01, clipping_norm: 1.0 }),
            delta: 1e-5,
            epsilon_target: 1e9,
            ..Default::default()
        }),
        gradient_dim: 10,
        ..Default::default()
    };
    let refused = accountant(as_worker()).raw().register_job(weak).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused}");
    let missing = accountant(as_coordinator()).raw().get_spend(GetSpendRequest { job_id: "job-weak".into() }).await;
    assert_eq!(missing.unwrap_err().code(), Code::NotFound, "no contract was written");

    // Job A runs on one worker; job B waits for five.
    let submit = |steps: u64, workers: u32| {
        let mut spec = spec(&dataset, steps);
        spec.workers = Some(workers);
        let coordinator = services.coordinator.grpc.clone();
        async move {
            let channel = tonic::transport::Endpoint::from_shared(coordinator).unwrap().connect().await.unwrap();
            let mut jobs = dpcap_proto::v1::job_service_client::JobServiceClient::with_interceptor(
                channel,
                dpcap_serve::AttachToken(Some(token(Role::Operator).into())),
            );
            let request =
                dpcap_proto::v1::SubmitJobRequest { spec: Some(spec.into_proto().unwrap()), ..Default::default() };
            jobs.submit_job(request).await.unwrap().into_inner()
        }
    };
    let (job_a, job_b) = (submit(3, 1).await, submit(3, 5).await);

    // A hand-driven worker takes A. Without its key, nobody can heartbeat as it.
    let channel =
        tonic::transport::Endpoint::from_shared(services.coordinator.grpc.clone()).unwrap().connect().await.unwrap();
    let mut registrar = WorkerServiceClient::with_interceptor(channel.clone(), as_worker());
    let registration = registrar
        .register_worker(RegisterWorkerRequest { name: "hand".into(), device: "cpu".into() })
        .await
        .unwrap()
        .into_inner();
    let beat = HeartbeatRequest { worker_id: registration.worker_id.clone() };
    let impostor = registrar.heartbeat(beat.clone()).await.unwrap_err();
    assert_eq!(impostor.code(), Code::PermissionDenied, "{impostor}");
    let mut worker =
        WorkerServiceClient::with_interceptor(channel, as_worker().with_worker_key(registration.worker_key));
    let assignment = worker.heartbeat(beat).await.unwrap().into_inner().assignment.expect("assigned to job A");
    assert_eq!(assignment.job_id, job_a.job_id);
    assert!(!assignment.capability.is_empty());

    // A's capability opens A, and nothing of B.
    let cell = CapabilityCell::new(assignment.capability.clone());
    let mut rank = accountant(as_worker().with_capability(cell));
    let attach = |job: &dpcap_proto::v1::Job| AttachJobRequest {
        job_id: job.job_id.clone(),
        gradient_dim: job.plan.as_ref().unwrap().gradient_dim,
        parts: 1,
    };
    rank.raw().attach_job(attach(&job_a)).await.expect("the rank attaches to its own job");
    let denied = |r: Result<(), tonic::Status>, what: &str| {
        let e = r.expect_err(what);
        assert_eq!(e.code(), Code::PermissionDenied, "{what}: {e}");
    };
    denied(rank.raw().attach_job(attach(&job_b)).await.map(drop), "attach to B");
    let fetch = FetchReleaseRequest { job_id: job_b.job_id.clone(), step: 0, chunk_values: 0 };
    denied(rank.raw().fetch_release(fetch).await.map(drop), "fetch B's release");
    let part = rank
        .submit_attempt(&job_b.job_id, PartKey { step: 0, part: 0, attempt: assignment.generation }, &[0.0; 8])
        .await;
    assert_eq!(part.unwrap_err().status, Code::PermissionDenied, "a part for B");
    let spend = accountant(as_coordinator()).raw().get_spend(GetSpendRequest { job_id: job_b.job_id.clone() }).await;
    assert_eq!(spend.unwrap().into_inner().steps_charged, 0, "nothing charged to B");

    // A rank's word that the budget is spent does not end its job for good: the accountant's
    // ledger does not say so, so the step failed and the job can be resumed.
    let (worker_id, generation) = (registration.worker_id.clone(), assignment.generation);
    let request = GetStepRequest { worker_id: worker_id.clone(), job_id: job_a.job_id.clone(), generation };
    let work = worker.get_step(request).await.unwrap().into_inner();
    let report = ReportStepRequest {
        worker_id,
        job_id: job_a.job_id.clone(),
        generation,
        step: work.step,
        outcome: StepOutcome::BudgetExhausted as i32,
        message: "budget exhausted (made up)".into(),
        ..Default::default()
    };
    worker.report_step(report).await.unwrap();
    let channel =
        tonic::transport::Endpoint::from_shared(services.coordinator.grpc.clone()).unwrap().connect().await.unwrap();
    let mut jobs = dpcap_proto::v1::job_service_client::JobServiceClient::with_interceptor(
        channel,
        dpcap_serve::AttachToken(Some(token(Role::Viewer).into())),
    );
    let request = dpcap_proto::v1::GetJobRequest { job_id: job_a.job_id.clone() };
    let shown = jobs.get_job(request).await.unwrap().into_inner();
    assert_eq!(shown.state, dpcap_proto::v1::JobState::Failed as i32, "{shown:#?}");
    assert!(shown.conditions.iter().any(|c| c.message.contains("does not confirm")), "{shown:#?}");
}
