//! The same-host socket end to end: a real `dpcap-accountant` process serving `--local-socket`
//! beside its gRPC port, and ranks that choose it only when both ends agree.

mod common;

use std::path::Path;

use common::{AccountantProcess, Client, charged_steps, job, key};
use dpcap_proto::ErrorCode;
use dpcap_proto::client::{AccountantClient, CallCredentials, CapabilityCell, LocalChoice};
use dpcap_serve::capability::Capability;
use tonic::Code;

const WORKER_TOKEN: &str = "worker-token-0123456789";
const VIEWER_TOKEN: &str = "viewer-token-0123456789";

fn part(seed: u32, dim: usize) -> Vec<f32> {
    (0..dim).map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 1000.0 - 0.5).collect()
}

/// An accountant with tokens and a capability key, serving its socket at `socket`, and a
/// client that signs capabilities with its key (as the coordinator does).
async fn start(dir: &Path, socket: &Path) -> (AccountantProcess, Client) {
    let ring = dpcap_serve::capability::KeyRing::generate("k1");
    let keys = dir.join("capability.keys");
    std::fs::write(&keys, ring.to_file_text()).unwrap();
    let (socket, keys) = (socket.to_str().unwrap(), keys.to_str().unwrap());
    let args = [
        ["--local-socket", socket],
        ["--capability-key-file", keys],
        ["--worker-token", WORKER_TOKEN],
        ["--viewer-token", VIEWER_TOKEN],
        ["--coordinator-token", "coord-token-0123456789"],
    ];
    let server = AccountantProcess::start(&dir.join("ledger"), &args.concat()).await;
    let signer = server.client_signed(dpcap_serve::capability::Capabilities::new(Some(ring)));
    (server, signer)
}

/// A rank's client carrying `token` and `capability`, as a worker's does.
fn rank(server: &AccountantProcess, token: &str, capability: &Capability, signer: &Client) -> AccountantClient {
    let credentials = CallCredentials::token(Some(token.to_owned().into()))
        .with_capability(CapabilityCell::new(signer.issue(capability)));
    let endpoint = tonic::transport::Endpoint::from_shared(server.grpc.clone()).unwrap();
    AccountantClient::lazy(endpoint, credentials)
}

/// The coordinator's client (its token), to register jobs.
fn coordinator(server: &AccountantProcess) -> AccountantClient {
    let credentials = CallCredentials::token(Some("coord-token-0123456789".to_owned().into()));
    AccountantClient::lazy(tonic::transport::Endpoint::from_shared(server.grpc.clone()).unwrap(), credentials)
}

fn transfers(metrics: &str, call: &str, transport: &str) -> u64 {
    let series = format!("dpcap_transfers_total{{call=\"{call}\",transport=\"{transport}\"}} ");
    let line = metrics.lines().find(|l| l.starts_with(&series)).unwrap_or_else(|| panic!("no {series}in {metrics}"));
    line[series.len()..].trim().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_and_its_release_cross_the_socket_byte_for_byte_as_over_grpc_and_are_counted_apart() {
    let dir = tempfile::tempdir().unwrap();
    let (server, signer) = start(dir.path(), &dir.path().join("a.sock")).await;
    let dim = 3 * (1 << 20) + 5; // several release blocks and a short last one
    coordinator(&server).register_job(job("j", 0.01, 1.0, 1.0, 10.0, dim as u64, 1, None)).await.unwrap();
    let capability = signer.step_capability("j", key(0, 0, 0), common::SAMPLED);
    let mut local = rank(&server, WORKER_TOKEN, &capability, &signer);
    let chosen = local.use_local().await.unwrap();
    assert_eq!(chosen, LocalChoice::Chosen(dir.path().join("a.sock")));
    let values = part(1, dim);
    let submitted = local.submit_part("j", 0, 0, &values).await.unwrap();
    assert!(submitted.released && submitted.accepted_new, "{submitted:?}");
    let (over_socket, spend) = local.fetch_release("j", 0).await.unwrap();
    let (over_grpc, _) = rank(&server, WORKER_TOKEN, &capability, &signer).fetch_release("j", 0).await.unwrap();
    assert_eq!(over_socket.len(), dim);
    assert!(over_socket.iter().zip(&over_grpc).all(|(a, b)| a.to_bits() == b.to_bits()), "the same release");
    assert!(over_socket.iter().zip(&values).any(|(r, v)| r != v), "noise was added");
    assert!(spend.is_some_and(|s| s.epsilon_spent > 0.0), "the spend comes with the release");
    // The same part again is recognised (identical bytes): nothing new, nothing charged again.
    let again = local.submit_part("j", 0, 0, &values).await.unwrap();
    assert!(again.released && !again.accepted_new, "{again:?}");
    assert_eq!(charged_steps(&server.ledger, "j"), vec![0]);
    let metrics = server.scrape().await;
    assert_eq!(transfers(&metrics, "part", "local"), 2, "the part and its repeat: {metrics}");
    assert_eq!(transfers(&metrics, "part", "grpc"), 0);
    assert_eq!(transfers(&metrics, "release", "local"), 1);
    assert_eq!(transfers(&metrics, "release", "grpc"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_socket_refuses_what_the_port_refuses_before_keeping_a_byte() {
    let dir = tempfile::tempdir().unwrap();
    let (server, signer) = start(dir.path(), &dir.path().join("b.sock")).await;
    let dim = 1000;
    let mut coord = coordinator(&server);
    coord.register_job(job("j", 0.01, 1.0, 1.0, 10.0, dim as u64, 1, None)).await.unwrap();
    coord.register_job(job("other", 0.01, 1.0, 1.0, 10.0, dim as u64, 1, None)).await.unwrap();
    let capability = signer.step_capability("j", key(0, 0, 0), common::SAMPLED);
    let over_socket = async |token: &str, capability: &Capability, values: &[f32]| {
        let mut client = rank(&server, token, capability, &signer);
        assert!(matches!(client.use_local().await.unwrap(), LocalChoice::Chosen(_)));
        client.submit_part("j", 0, 0, values).await.unwrap_err()
    };
    let values = part(2, dim);
    // A viewer is not told of the socket, and the socket refuses its token all the same.
    let viewer = rank(&server, VIEWER_TOKEN, &capability, &signer).use_local().await.unwrap_err();
    assert_eq!(viewer.status, Code::PermissionDenied, "{viewer}");
    let socket = dir.path().join("b.sock");
    let text = signer.issue(&capability);
    let refused = |token: &str| raw_part(&socket, format!("Bearer {token}"), text.clone(), dim);
    assert_eq!(refused(VIEWER_TOKEN).await, Code::PermissionDenied, "a viewer's token");
    assert_eq!(refused("not-a-token-0123456789").await, Code::Unauthenticated, "an unknown token");
    let for_other = signer.step_capability("other", key(0, 0, 0), common::SAMPLED);
    let scoped = over_socket(WORKER_TOKEN, &for_other, &values).await;
    assert_eq!(scoped.code, Some(ErrorCode::PermissionDenied), "another job's capability: {scoped}");
    let short = over_socket(WORKER_TOKEN, &capability, &values[..dim - 1]).await;
    assert!(short.message.contains("gradient_dim"), "one value short: {short}");
    let long = over_socket(WORKER_TOKEN, &capability, &part(3, dim + 1)).await;
    assert!(long.message.contains("gradient_dim"), "one value too many: {long}");
    let mut nan = values.clone();
    nan[dim / 2] = f32::NAN;
    let not_finite = over_socket(WORKER_TOKEN, &capability, &nan).await;
    assert_eq!(not_finite.status, Code::InvalidArgument, "a NaN: {not_finite}");
    let tight = signer.share_capability("j", key(0, 0, 0), 1, 1); // C · 1 unit bounds the part's norm
    let unclipped = over_socket(WORKER_TOKEN, &tight, &vec![1.0; dim]).await;
    assert_eq!(unclipped.code, Some(ErrorCode::Unclipped), "{unclipped}");
    assert!(charged_steps(&server.ledger, "j").is_empty(), "nothing refused was charged");
    // The port and the socket then take the same part.
    let mut client = rank(&server, WORKER_TOKEN, &capability, &signer);
    client.use_local().await.unwrap();
    assert!(client.submit_part("j", 0, 0, &values).await.unwrap().released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_keeps_to_grpc_when_the_socket_is_gone_or_another_process_answers_it() {
    use tokio::io::AsyncReadExt;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("c.sock");
    let (server, signer) = start(dir.path(), &socket).await;
    coordinator(&server).register_job(job("j", 0.01, 1.0, 1.0, 10.0, 16, 1, None)).await.unwrap();
    let capability = signer.step_capability("j", key(0, 0, 0), common::SAMPLED);
    let mut chosen = rank(&server, WORKER_TOKEN, &capability, &signer);
    assert!(matches!(chosen.use_local().await.unwrap(), LocalChoice::Chosen(_)));

    // Another process takes the path: it says hello with the wrong instance and is never sent
    // a credential; a rank already using the socket sets it aside and sends over gRPC.
    std::fs::remove_file(&socket).unwrap();
    let impostor = tokio::net::UnixListener::bind(&socket).unwrap();
    let heard = tokio::spawn(async move {
        let mut heard = Vec::new();
        for _ in 0..2 {
            let (mut stream, _) = impostor.accept().await.unwrap();
            // The rank may hang up before the hello is written (it refuses the instance either
            // way): a broken pipe here is the behaviour under test, not a failure.
            let _ = dpcap_proto::local::write_frame(&mut stream, &hello(b"someone else")).await;
            let mut sent = Vec::new();
            let _ = stream.read_to_end(&mut sent).await;
            heard.extend(sent);
        }
        heard
    });
    let mut fresh = rank(&server, WORKER_TOKEN, &capability, &signer);
    let refused = fresh.use_local().await.unwrap();
    assert!(matches!(refused, LocalChoice::Unreachable(_)), "{refused:?}");
    assert!(chosen.submit_part("j", 0, 0, &part(4, 16)).await.unwrap().released, "over gRPC instead");
    assert_eq!(heard.await.unwrap(), Vec::<u8>::new(), "the impostor heard nothing");
    let metrics = server.scrape().await;
    assert_eq!((transfers(&metrics, "part", "grpc"), transfers(&metrics, "part", "local")), (1, 0));

    // No socket at all: not reachable, and the part still goes through.
    std::fs::remove_file(&socket).unwrap();
    assert!(matches!(fresh.use_local().await.unwrap(), LocalChoice::Unreachable(_)));
}

/// A part's header sent raw with `authorization` and `capability`: the code of the status the
/// socket answers before asking for the part's bytes.
async fn raw_part(socket: &Path, authorization: String, capability: String, dim: usize) -> Code {
    use dpcap_proto::v1::local_reply::Reply;
    use dpcap_proto::v1::{GradientChunk, LocalCall, LocalReply, local_call::Call};
    let mut stream = tokio::net::UnixStream::connect(socket).await.unwrap();
    let _hello: LocalReply = dpcap_proto::local::read_frame(&mut stream).await.unwrap();
    let header = GradientChunk { job_id: "j".into(), ..Default::default() };
    let call = LocalCall { authorization, capability, call: Some(Call::Part(header)) };
    dpcap_proto::local::write_frame(&mut stream, &call).await.unwrap();
    match dpcap_proto::local::read_frame::<LocalReply, _>(&mut stream).await.unwrap().reply {
        Some(Reply::Status(status)) => tonic::Status::from(status).code(),
        other => panic!("a {dim}-value part's header was answered {other:?}"),
    }
}

fn hello(instance: &[u8]) -> dpcap_proto::v1::LocalReply {
    use dpcap_proto::v1::local_reply::Reply;
    dpcap_proto::v1::LocalReply { reply: Some(Reply::Hello(instance.to_vec().into())), data_bytes: 0 }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accountant_without_a_socket_offers_none_and_refuses_a_path_that_is_not_one() {
    let dir = tempfile::tempdir().unwrap();
    let server = AccountantProcess::start(&dir.path().join("ledger"), &[]).await;
    let signer = server.client().await;
    let mut client = signer.with(Some(signer.capability("j", 0, None)));
    assert_eq!(client.use_local().await.unwrap(), LocalChoice::NotOffered);
    drop(server);

    let file = dir.path().join("a-file");
    std::fs::write(&file, "not a socket").unwrap();
    let (refused, stderr) = start_refused(&dir.path().join("ledger2"), &file);
    assert!(refused, "{stderr}");
    assert!(stderr.contains("invalid --local-socket") && stderr.contains("not a socket"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "not a socket", "the file is left as it was");

    // A socket another process serves is not taken over either.
    let live = dir.path().join("live.sock");
    let _serving = std::os::unix::net::UnixListener::bind(&live).unwrap();
    let (refused, stderr) = start_refused(&dir.path().join("ledger3"), &live);
    assert!(refused && stderr.contains("a running process serves it"), "{stderr}");
}

/// Runs the accountant on `ledger` with `--local-socket socket` to its exit: whether it failed,
/// and what it wrote to stderr.
fn start_refused(ledger: &Path, socket: &Path) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dpcap-accountant"))
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--ledger"])
        .arg(ledger)
        .arg("--local-socket")
        .arg(socket)
        .output()
        .unwrap();
    (!out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_bytes_on_the_socket_get_an_answer_or_a_closed_socket_and_the_accountant_stays_up() {
    use rand_chacha::ChaCha8Rng;
    use rand_chacha::rand_core::{Rng, SeedableRng};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("d.sock");
    let (server, signer) = start(dir.path(), &socket).await;
    coordinator(&server).register_job(job("j", 0.01, 1.0, 1.0, 10.0, 64, 1, None)).await.unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(57);
    for case in 0..64u32 {
        let mut stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
        let _hello: dpcap_proto::v1::LocalReply = dpcap_proto::local::read_frame(&mut stream).await.unwrap();
        let mut bytes = vec![0u8; (rng.next_u32() % 200) as usize];
        rng.fill_bytes(&mut bytes);
        match case % 4 {
            0 => bytes.splice(0..0, u32::MAX.to_le_bytes()).for_each(drop), // a huge length
            1 => bytes.splice(0..0, (bytes.len() as u32).to_le_bytes()).for_each(drop), // junk protobuf
            _ => {}
        }
        let _ = stream.write_all(&bytes).await;
        let _ = stream.shutdown().await;
        let mut answer = Vec::new();
        let read = tokio::time::timeout(std::time::Duration::from_secs(40), stream.read_to_end(&mut answer)).await;
        assert!(read.is_ok(), "case {case}: the socket neither answered nor closed");
    }
    // Still serving: a real part goes through the socket.
    let capability = signer.step_capability("j", key(0, 0, 0), common::SAMPLED);
    let mut client = rank(&server, WORKER_TOKEN, &capability, &signer);
    assert!(matches!(client.use_local().await.unwrap(), LocalChoice::Chosen(_)));
    assert!(client.submit_part("j", 0, 0, &part(5, 64)).await.unwrap().released);
}
