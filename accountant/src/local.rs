//! The same-host path: a rank on the accountant's host sends its part and reads its release
//! over a Unix socket ([`dpcap_proto::local`] frames, then raw bytes), read from the socket
//! straight into the pooled blocks and written to it straight from the release's blocks. It
//! saves HTTP/2's framing and tonic's buffer copies, about half a release's CPU (docs/benchmarks.md).
//!
//! What this must never do: keep a byte of a part before the token, the capability and the
//! part's header pass the same checks as SubmitPart's; skip a check a gRPC part gets (finite,
//! dimension, the per-rank norm bound, the hash, one stream per part, the idle limit); or say
//! `stored` before the release is durable. The socket file is the accountant's user's and group's
//! (mode 0660: workers run as their own user in the accountant's group, never as its user), and
//! ranks check that its other end is this process (SO_PEERCRED against GetLocalEndpoint's pid),
//! so a rank never sends its credentials to a socket some other process left or took.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use dpcap_proto::local::{FrameError, read_frame, write_frame};
use dpcap_proto::to_status;
use dpcap_proto::v1::local_call::Call;
use dpcap_proto::v1::local_reply::Reply;
use dpcap_proto::v1::{FetchReleaseRequest, GradientChunk, LocalCall, LocalEndpoint, LocalReply, ReleaseChunk};
use dpcap_serve::Credentials;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

use crate::error::AccountantError;
use crate::metrics;
use crate::service::{AccountantGrpc, OpenPart, idle_cut, release_lost, release_spend, superseded};

/// The gRPC methods whose role policy the socket's calls are held to.
const SUBMIT_PART: &str = "/dpcap.v1.AccountantService/SubmitPart";
const FETCH_RELEASE: &str = "/dpcap.v1.AccountantService/FetchRelease";

/// How long a connection may take to send its call frame.
const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Connections served at once; more are closed unanswered (each holds a task and at most a
/// 1 MiB call frame until its call is read, or a part's blocks until it ends).
const MAX_CONNECTIONS: usize = 256;

/// How long a shutdown waits for calls on the socket to end (a part's charge and release).
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The same-host socket an accountant serves: where, and the tokens its calls must carry (the
/// gRPC server's, so that the socket grants no role the port would not).
#[derive(Debug, Clone)]
pub struct LocalSetup {
    /// The socket's path (its directory must exist; a socket left there by an earlier process
    /// is replaced, anything else is refused).
    pub path: PathBuf,
    /// The roles' tokens, as the gRPC server checks them.
    pub credentials: Arc<Credentials>,
}

/// Why the socket could not be served.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// The path holds something other than a socket, or a socket a live process serves.
    #[error("invalid --local-socket {path}: {reason}")]
    Path {
        /// The path.
        path: PathBuf,
        /// Why it cannot be used.
        reason: String,
    },
    /// Binding or securing the socket failed.
    #[error("local socket {path}: {source}")]
    Bind {
        /// The path.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
}

/// Binds `path` for the same-host path, replacing a socket an earlier accountant left (never
/// one a live process serves). The socket is bound under a temporary name, given mode 0660,
/// and renamed into place, so it is never reachable with the umask's mode.
pub fn bind(path: &Path) -> Result<UnixListener, LocalError> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let bind_error = |source| LocalError::Bind { path: path.to_owned(), source };
    let refused = |reason: &str| LocalError::Path { path: path.to_owned(), reason: reason.to_owned() };
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(refused("a running process serves it (another accountant?); give a free path"));
            }
            std::fs::remove_file(path).map_err(bind_error)?;
        }
        Ok(_) => return Err(refused("it exists and is not a socket; give a free path")),
        Err(_) => {}
    }
    let staging = path.with_extension(format!("{}.binding", std::process::id()));
    let _ = std::fs::remove_file(&staging);
    let listener = UnixListener::bind(&staging).map_err(bind_error)?;
    std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o660)).map_err(bind_error)?;
    std::fs::rename(&staging, path).map_err(bind_error)?;
    Ok(listener)
}

/// What ranks are told about the socket (GetLocalEndpoint): its path, this host's boot id, and
/// a random identity of this process that the socket sends first.
pub fn endpoint(path: &Path) -> LocalEndpoint {
    let mut instance = vec![0u8; 16];
    // Without the OS's randomness the identity is the process id and the time: still distinct.
    if getrandom::fill(&mut instance).is_err() {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        instance = ((u128::from(std::process::id()) << 96) ^ now).to_le_bytes().to_vec();
    }
    LocalEndpoint {
        socket_path: path.to_string_lossy().into_owned(),
        boot_id: dpcap_proto::local::boot_id(),
        instance: instance.into(),
        pid: std::process::id(),
    }
}

/// Accepts same-host calls until `stopped` resolves, then waits (a bounded time) for the calls
/// under way to end; each connection carries one call.
pub async fn serve(
    listener: UnixListener,
    grpc: AccountantGrpc,
    credentials: Arc<Credentials>,
    instance: bytes::Bytes,
    stopped: impl std::future::Future<Output = ()>,
) {
    let server = Arc::new(Server { grpc, credentials, instance });
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    tokio::pin!(stopped);
    loop {
        tokio::select! {
            accepted = listener.accept() => match (accepted, slots.clone().try_acquire_owned()) {
                (Ok((stream, _)), Ok(slot)) => {
                    let server = server.clone();
                    tokio::spawn(async move {
                        if let Err(e) = server.connection(stream).await {
                            tracing::debug!(error = %e, "same-host connection ended");
                        }
                        drop(slot);
                    });
                }
                (Ok(_), Err(_)) => tracing::warn!(limit = MAX_CONNECTIONS, "same-host connection refused: too many"),
                (Err(e), _) => {
                    tracing::warn!(error = %e, "same-host accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            },
            () = &mut stopped => break,
        }
    }
    drop(listener);
    let all = MAX_CONNECTIONS as u32;
    if tokio::time::timeout(DRAIN_TIMEOUT, slots.acquire_many(all)).await.is_err() {
        tracing::warn!("same-host calls still under way at shutdown");
    }
}

/// Resolves when the rank closes its end (or sends what it should not): a rank waiting for a
/// release sends nothing after its call.
async fn closed(stream: &UnixStream) {
    loop {
        if stream.readable().await.is_err() {
            return;
        }
        match stream.try_read(&mut [0u8; 1]) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            _ => return,
        }
    }
}

struct Server {
    grpc: AccountantGrpc,
    credentials: Arc<Credentials>,
    instance: bytes::Bytes,
}

/// Sends `error` as the call's status.
async fn refuse(stream: &mut UnixStream, error: AccountantError) -> Result<(), FrameError> {
    let status = to_status(error);
    write_frame(stream, &LocalReply { reply: Some(Reply::Status((&status).into())), data_bytes: 0 }).await
}

fn reply(reply: Reply, data_bytes: u64) -> LocalReply {
    LocalReply { reply: Some(reply), data_bytes }
}

impl Server {
    async fn connection(&self, mut stream: UnixStream) -> Result<(), FrameError> {
        dpcap_proto::local::widen_send_buffer(&stream);
        write_frame(&mut stream, &reply(Reply::Hello(self.instance.clone()), 0)).await?;
        let call = match tokio::time::timeout(CALL_TIMEOUT, read_frame::<LocalCall, _>(&mut stream)).await {
            Ok(Ok(call)) => call,
            Ok(Err(e @ (FrameError::TooLarge { .. } | FrameError::Decode(_)))) => {
                return refuse(&mut stream, AccountantError::invalid("call", e.to_string())).await;
            }
            Ok(Err(e)) => return Err(e),
            Err(_) => return refuse(&mut stream, AccountantError::invalid("call", "none within 30 s")).await,
        };
        let method = match &call.call {
            Some(Call::Part(_)) => SUBMIT_PART,
            Some(Call::Fetch(_)) => FETCH_RELEASE,
            None => return refuse(&mut stream, AccountantError::invalid("call", "is required")).await,
        };
        let authorization = Some(call.authorization.as_bytes()).filter(|a| !a.is_empty());
        if let Err(refused) = self.credentials.check(method, authorization, None) {
            tracing::warn!(path = method, reason = %refused, "same-host call refused");
            let status = dpcap_proto::to_status(refused);
            return write_frame(&mut stream, &reply(Reply::Status((&status).into()), 0)).await;
        }
        match call.call {
            Some(Call::Part(header)) => self.submit(stream, &call.capability, header).await,
            Some(Call::Fetch(request)) => self.fetch(stream, &call.capability, request).await,
            None => Ok(()),
        }
    }

    /// A part: its header checked as SubmitPart's first chunk, then its 4·P bytes read into
    /// the pooled blocks, each block checked as it fills.
    async fn submit(&self, mut stream: UnixStream, capability: &str, header: GradientChunk) -> Result<(), FrameError> {
        if !header.data.is_empty() || header.offset != 0 {
            let error = AccountantError::invalid("data", "a same-host part's header carries no values");
            return refuse(&mut stream, error).await;
        }
        let OpenPart { job, mut assembler, slot } = match self.grpc.open_part(capability, &header).await {
            Ok(open) => open,
            Err(e) => return refuse(&mut stream, e).await,
        };
        write_frame(&mut stream, &reply(Reply::Ready(true), 0)).await?;
        let idle = self.grpc.part_idle();
        // The rank sends the part's bytes and then shuts its side: the end of the stream ends
        // the part, and finish() refuses one of fewer than P values.
        let mut more = [0u8; 1];
        loop {
            let (spare, full) = match assembler.spare() {
                [] => (&mut more[..], true),
                spare => (spare, false),
            };
            let read = tokio::select! {
                read = tokio::time::timeout(idle, stream.read(spare)) => match read {
                    Ok(read) => read?,
                    Err(_) => return refuse(&mut stream, idle_cut(&job, header.part, idle)).await,
                },
                () = slot.superseded() => return refuse(&mut stream, superseded(&job, header.part)).await,
            };
            match (read, full) {
                (0, _) => break,
                (_, true) => {
                    let error = AccountantError::invalid(
                        "data",
                        format!("part has more than gradient_dim {} values", job.registration.gradient_dim),
                    );
                    return refuse(&mut stream, error).await;
                }
                (read, false) => {
                    if let Err(e) = assembler.advance(read) {
                        return refuse(&mut stream, e).await;
                    }
                }
            }
        }
        drop(slot);
        let released = match assembler.finish() {
            Ok(part) => self.grpc.release_part(&job, part).await,
            Err(e) => Err(e),
        };
        match released {
            Ok(response) => {
                metrics::record_transfer("part", "local");
                write_frame(&mut stream, &reply(Reply::Submitted(response), 0)).await
            }
            Err(e) => refuse(&mut stream, e).await,
        }
    }

    /// A release: its header (the spend), its bytes as the noise pass fills its blocks, then
    /// `stored` once the ledger holds it.
    async fn fetch(
        &self,
        mut stream: UnixStream,
        capability: &str,
        request: FetchReleaseRequest,
    ) -> Result<(), FrameError> {
        // A rank that leaves while the step is still computing lets go of its wait.
        let found = tokio::select! {
            found = self.grpc.release_of(&request.job_id, capability, request.step) => found,
            () = closed(&stream) => return Err(FrameError::Closed),
        };
        let (job, release) = match found {
            Ok(found) => found,
            Err(e) => return refuse(&mut stream, e).await,
        };
        let header = ReleaseChunk {
            job_id: job.registration.job_id.clone(),
            step: release.step,
            spend: Some(release_spend(&job, &release)),
            ..Default::default()
        };
        write_frame(&mut stream, &reply(Reply::Release(header), release.len() as u64)).await?;
        let idle = self.grpc.part_idle();
        for index in 0..release.visible_blocks() {
            // A lost block ends the connection mid-release: the rank's retry asks again and
            // is told the step was discarded.
            let Some(block) = release.block(index).await else { return Err(FrameError::Closed) };
            // A rank that stops reading is let go after the part idle limit, per block.
            tokio::time::timeout(idle, stream.write_all(&block))
                .await
                .map_err(|_| FrameError::Io(std::io::ErrorKind::TimedOut.into()))??;
        }
        if !release.durable().await {
            return refuse(&mut stream, release_lost(&job, release.step)).await;
        }
        metrics::record_transfer("release", "local");
        write_frame(&mut stream, &reply(Reply::Stored(true), 0)).await
    }
}
