//! A rank's half of the accountant's same-host socket ([`crate::local`]): a part goes in and a
//! release comes out as raw bytes, with the same token and capability the gRPC call carries.
//! The link is used only when both ends agree: the accountant offers a socket, the rank shares
//! its kernel (boot id), the kernel says the socket's other end is the accountant's process
//! (SO_PEERCRED, the pid it named over gRPC), and the socket's first frame is the instance it
//! named. A rank never sends its credentials to a socket before those checks.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tonic::Status;

use super::{CallCredentials, ClientError};
use crate::local::{FrameError, boot_id, read_frame, write_frame};
use crate::v1::local_call::Call;
use crate::v1::local_reply::Reply;
use crate::v1::{
    FetchReleaseRequest, GradientChunk, JobSpend, LocalCall, LocalEndpoint, LocalReply, SubmitPartResponse,
};

/// How long a connection and its hello may take: a socket nobody serves is set aside quickly.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Largest release a rank reads over the socket (64 GiB: 16G f32 coordinates, far above any
/// model here): the length is the accountant's word, and memory is reserved before reading.
const MAX_RELEASE_BYTES: u64 = 1 << 36;

/// The accountant's socket, agreed on by both ends.
#[derive(Debug)]
pub struct LocalLink {
    path: PathBuf,
    instance: Bytes,
    /// The accountant's process id, which must hold the socket's other end.
    pid: u32,
    /// Cleared when the socket stops answering (an accountant restarted elsewhere): calls then
    /// go over gRPC until the rank asks again.
    working: AtomicBool,
}

/// Whether a rank talks to its accountant over the same-host socket, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalChoice {
    /// Parts and releases go over this socket.
    Chosen(PathBuf),
    /// The accountant offers no socket (`--local-socket` unset).
    NotOffered,
    /// The accountant runs under another kernel: another host.
    OtherHost,
    /// The socket is not reachable from here, or another process answers it.
    Unreachable(String),
}

/// What a fetch read besides the values.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The spend after the released step.
    pub spend: Option<JobSpend>,
    /// When the release's first bytes arrived.
    pub first_data: Instant,
}

impl LocalLink {
    /// The link `endpoint` offers, if this rank may use it.
    pub async fn agree(endpoint: LocalEndpoint) -> Result<Self, LocalChoice> {
        if endpoint.socket_path.is_empty() {
            return Err(LocalChoice::NotOffered);
        }
        let own = boot_id();
        if own.is_empty() || own != endpoint.boot_id {
            return Err(LocalChoice::OtherHost);
        }
        let link = Self {
            path: endpoint.socket_path.into(),
            instance: endpoint.instance,
            pid: endpoint.pid,
            working: true.into(),
        };
        link.connect().await.map_err(|e| LocalChoice::Unreachable(e.to_string()))?;
        Ok(link)
    }

    /// The socket's path.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Whether calls should use the link.
    pub fn working(&self) -> bool {
        self.working.load(Ordering::Relaxed)
    }

    /// Stops calls from using the link (they go over gRPC until the rank asks again).
    pub(super) fn set_aside(&self) {
        self.working.store(false, Ordering::Relaxed);
    }

    /// A connection held by the accountant's process whose hello is the agreed instance.
    /// Failing, the link is set aside: nothing was sent on it, and the call goes over gRPC.
    pub(super) async fn connect(&self) -> Result<UnixStream, FrameError> {
        let foreign = || FrameError::Io(std::io::Error::other("another process answers the socket"));
        let connected = async {
            let mut stream = UnixStream::connect(&self.path).await?;
            let peer = stream.peer_cred()?.pid().and_then(|pid| u32::try_from(pid).ok());
            if peer != Some(self.pid) {
                return Err(foreign());
            }
            crate::local::widen_send_buffer(&stream);
            match read_frame::<LocalReply, _>(&mut stream).await?.reply {
                Some(Reply::Hello(instance)) if instance == self.instance => Ok(stream),
                _ => Err(foreign()),
            }
        };
        let connected = match tokio::time::timeout(CONNECT_TIMEOUT, connected).await {
            Ok(connected) => connected,
            Err(_) => Err(FrameError::Io(std::io::ErrorKind::TimedOut.into())),
        };
        if connected.is_err() {
            self.set_aside();
        }
        connected
    }
}

/// A failure on an agreed socket: transient (the retry may find the accountant again).
fn broken(link: &LocalLink, error: FrameError) -> ClientError {
    ClientError::from(Status::unavailable(format!("{} ({})", error, link.path.display())))
}

/// A frame that is not the one the protocol has next.
fn unexpected(link: &LocalLink, what: &str) -> ClientError {
    broken(link, FrameError::Io(std::io::Error::other(format!("expected {what}"))))
}

fn call(credentials: &CallCredentials, call: Call) -> LocalCall {
    LocalCall { authorization: credentials.authorization(), capability: credentials.capability(), call: Some(call) }
}

/// Sends a part (`header` with its data empty, then `data`, little-endian f32) over `stream`.
pub(super) async fn submit(
    link: &LocalLink,
    mut stream: UnixStream,
    credentials: &CallCredentials,
    header: GradientChunk,
    data: &Bytes,
) -> Result<SubmitPartResponse, ClientError> {
    let fail = |e| broken(link, e);
    write_frame(&mut stream, &call(credentials, Call::Part(header))).await.map_err(fail)?;
    match read_frame::<LocalReply, _>(&mut stream).await.map_err(fail)?.reply {
        Some(Reply::Ready(true)) => {}
        Some(Reply::Status(status)) => return Err(Status::from(status).into()),
        _ => return Err(unexpected(link, "ready")),
    }
    // A refusal mid-part (an unclipped part, a newer stream) closes the socket: its reason was
    // sent before, and is read once the write fails.
    let written = match send_part(&mut stream, data).await {
        Ok(()) => stream.shutdown().await, // the part's end
        failed => failed,
    };
    match (read_frame::<LocalReply, _>(&mut stream).await, written) {
        (Ok(LocalReply { reply: Some(Reply::Submitted(response)), .. }), Ok(())) => Ok(response),
        (Ok(LocalReply { reply: Some(Reply::Status(status)), .. }), _) => Err(Status::from(status).into()),
        (Ok(_), _) => Err(unexpected(link, "the part's answer")),
        (Err(_), Err(e)) => Err(fail(e.into())),
        (Err(e), Ok(())) => Err(fail(e)),
    }
}

/// The pipe a part passes through on its way into the socket (the most an unprivileged
/// process may ask, `fs.pipe-max-size`'s default; a refusal leaves the pipe at 64 KiB).
#[cfg(target_os = "linux")]
const PIPE_BYTES: i32 = 1 << 20;

/// Sends a part's bytes without copying them: their pages are spliced into a pipe (vmsplice)
/// and from the pipe into the socket (splice), and the accountant's read is the one copy, into
/// its own blocks. What it checks is what it copied, whatever this process does to its pages.
/// A kernel that refuses either call (or a seccomp profile that forbids it) gets the rest
/// written instead. The socket holds references to `data`'s pages until the accountant has read
/// them, so the caller keeps `data` unchanged until the accountant answers (as `submit` does).
#[cfg(target_os = "linux")]
async fn send_part(stream: &mut UnixStream, data: &[u8]) -> std::io::Result<()> {
    let mut sent = 0;
    match splice_part(stream, data, &mut sent).await {
        Err(e) if e.raw_os_error().is_some_and(unsupported) => stream.write_all(&data[sent..]).await,
        done => done,
    }
}

/// Elsewhere a part is written.
#[cfg(not(target_os = "linux"))]
async fn send_part(stream: &mut UnixStream, data: &[u8]) -> std::io::Result<()> {
    stream.write_all(data).await
}

/// Errors that say this kernel (or this socket, or a seccomp profile) does not splice, not that
/// the socket failed.
#[cfg(target_os = "linux")]
fn unsupported(errno: i32) -> bool {
    use nix::errno::Errno;
    [Errno::EINVAL, Errno::ENOSYS, Errno::EOPNOTSUPP, Errno::EPERM].iter().any(|e| *e as i32 == errno)
}

/// [`send_part`]'s spliced path; `sent` counts the bytes already in the socket (bytes still in
/// the pipe when it fails are dropped with it, and written again by the fallback).
#[cfg(target_os = "linux")]
async fn splice_part(stream: &UnixStream, data: &[u8], sent: &mut usize) -> std::io::Result<()> {
    use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags, fcntl, splice, vmsplice};
    let (pipe_out, pipe_in) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
    let _ = fcntl(&pipe_in, FcntlArg::F_SETPIPE_SZ(PIPE_BYTES));
    let moving = SpliceFFlags::SPLICE_F_NONBLOCK;
    let mut piped = 0; // bytes of data in the pipe
    while *sent < data.len() {
        if piped == 0 {
            // The pipe is empty, so this fills it without waiting.
            let pages = [std::io::IoSlice::new(&data[*sent..])];
            piped = vmsplice(&pipe_in, &pages, SpliceFFlags::SPLICE_F_NONBLOCK)?;
        }
        let moved = stream
            .async_io(tokio::io::Interest::WRITABLE, || Ok(splice(&pipe_out, None, stream, None, piped, moving)?))
            .await?;
        if moved == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        piped -= moved;
        *sent += moved;
    }
    Ok(())
}

/// Reads a release into `values` (its buffer reused: a release the size of the last one
/// touches no new memory).
pub(super) async fn fetch_into(
    link: &LocalLink,
    mut stream: UnixStream,
    credentials: &CallCredentials,
    request: FetchReleaseRequest,
    values: &mut Vec<f32>,
) -> Result<Fetched, ClientError> {
    let fail = |e| broken(link, e);
    write_frame(&mut stream, &call(credentials, Call::Fetch(request.clone()))).await.map_err(fail)?;
    let header = read_frame::<LocalReply, _>(&mut stream).await.map_err(fail)?;
    let (spend, bytes) = match header.reply {
        Some(Reply::Release(chunk)) if chunk.job_id == request.job_id && chunk.step == request.step => {
            (chunk.spend, header.data_bytes)
        }
        Some(Reply::Status(status)) => return Err(Status::from(status).into()),
        _ => return Err(unexpected(link, "a release")),
    };
    if bytes % 4 != 0 || bytes > MAX_RELEASE_BYTES {
        return Err(ClientError::from(Status::data_loss(format!("a release of {bytes} bytes"))));
    }
    let len = (bytes / 4) as usize;
    if values.len() != len {
        values.clear();
        values.try_reserve_exact(len).map_err(|e| ClientError::from(Status::resource_exhausted(e.to_string())))?;
        values.resize(len, 0.0);
    }
    let target: &mut [u8] = bytemuck::cast_slice_mut(values.as_mut_slice());
    let (head, rest) = target.split_at_mut(target.len().min(4096));
    stream.read_exact(head).await.map_err(|e| fail(e.into()))?;
    let first_data = Instant::now();
    stream.read_exact(rest).await.map_err(|e| fail(e.into()))?;
    if cfg!(target_endian = "big") {
        values.iter_mut().for_each(|v| *v = f32::from_bits(v.to_bits().swap_bytes()));
    }
    // Only a stored release may be applied: the accountant says so after the last byte.
    match read_frame::<LocalReply, _>(&mut stream).await.map_err(fail)?.reply {
        Some(Reply::Stored(true)) => Ok(Fetched { spend, first_data }),
        Some(Reply::Status(status)) => Err(Status::from(status).into()),
        _ => Err(unexpected(link, "stored")),
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_part_spliced_into_the_socket_arrives_byte_for_byte_from_any_offset() {
        // Past several pipe fills, from an address inside a page, with a tail shorter than one.
        let bytes: Vec<u8> = (0..3 * PIPE_BYTES as usize + 4099).map(|i| (i * 7 % 251) as u8).collect();
        let part = &bytes[13..];
        let (rank, mut accountant) = UnixStream::pair().unwrap();
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            accountant.read_to_end(&mut got).await.map(|_| got)
        });
        // The spliced path itself, not the fallback: Linux splices into Unix sockets.
        let mut sent = 0;
        splice_part(&rank, part, &mut sent).await.unwrap();
        assert_eq!(sent, part.len());
        drop(rank);
        assert!(reader.await.unwrap().unwrap() == part, "the same bytes in the same order");
    }

    #[tokio::test]
    async fn a_part_to_a_closed_socket_fails_instead_of_waiting() {
        let (mut rank, accountant) = UnixStream::pair().unwrap();
        drop(accountant);
        let failed = send_part(&mut rank, &vec![1u8; 2 << 20]).await.unwrap_err();
        assert_eq!(failed.kind(), std::io::ErrorKind::BrokenPipe, "{failed}");
    }
}
