//! The accountant's same-host socket: its framing, shared by the accountant and its clients.
//! A frame is a little-endian u32 length and a prost message (`LocalCall` one way,
//! `LocalReply` the other); a part's or a release's raw little-endian f32 bytes follow the frame
//! that announces them, so that 760 MB move with no HTTP/2 framing and no buffer between: a
//! part with one copy (the rank splices its pages in), a release with two (docs/grpc.md,
//! "Same-host parts and releases").
//!
//! This module must never read a frame longer than [`MAX_FRAME_BYTES`] into memory: the
//! length comes from the peer.

use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::v1::LocalStatus;

/// Largest frame either end accepts: a call's token and capability, a release's spend.
pub const MAX_FRAME_BYTES: usize = 1 << 20;

/// Where the kernel states the boot id that [`boot_id`] reads.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The socket failed.
    #[error("local socket: {0}")]
    Io(#[from] std::io::Error),
    /// The peer announced a frame longer than [`MAX_FRAME_BYTES`].
    #[error("local socket: a frame of {len} bytes exceeds {MAX_FRAME_BYTES}")]
    TooLarge {
        /// The announced length.
        len: usize,
    },
    /// The frame is not the message expected.
    #[error("local socket: an undecodable frame: {0}")]
    Decode(#[from] prost::DecodeError),
    /// The peer closed the socket where a frame was due.
    #[error("local socket: the peer closed it before the next frame")]
    Closed,
}

/// Bytes the kernel may queue from one sender on the same-host socket before the sender waits:
/// a part or a release then moves in runs of megabytes, not of the default ~200 kB, each run a
/// wake-up and a read for the other end (7 % of a release's CPU at P = 50M, docs/benchmarks.md).
/// The kernel caps it at `net.core.wmem_max`: under a lower cap the socket is slower, never wrong.
const SEND_BUFFER_BYTES: usize = 4 << 20;

/// Asks for [`SEND_BUFFER_BYTES`] of send buffer on `stream` (best effort: see there).
pub fn widen_send_buffer(stream: &tokio::net::UnixStream) {
    let socket = socket2::SockRef::from(stream);
    match socket.set_send_buffer_size(SEND_BUFFER_BYTES).and_then(|()| socket.send_buffer_size()) {
        // Linux reports twice what it granted (its bookkeeping's share).
        Ok(granted) if granted / 2 < SEND_BUFFER_BYTES => {
            tracing::debug!(
                granted = granted / 2,
                asked = SEND_BUFFER_BYTES,
                "same-host send buffer capped by net.core.wmem_max"
            );
        }
        Ok(_) => {}
        Err(e) => tracing::debug!(error = %e, "same-host socket keeps its default send buffer"),
    }
}

/// Writes `message` as one frame.
pub async fn write_frame<W: AsyncWrite + Unpin>(writer: &mut W, message: &impl Message) -> Result<(), FrameError> {
    let len = message.encoded_len();
    if len > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge { len });
    }
    let mut frame = Vec::with_capacity(4 + len);
    frame.extend_from_slice(&(len as u32).to_le_bytes());
    message.encode(&mut frame).map_err(|e| FrameError::Io(std::io::Error::other(e)))?;
    writer.write_all(&frame).await?;
    Ok(())
}

/// Reads one frame as an `M`.
pub async fn read_frame<M: Message + Default, R: AsyncRead + Unpin>(reader: &mut R) -> Result<M, FrameError> {
    let len = match reader.read_u32_le().await {
        Ok(len) => len as usize,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(e) => return Err(e.into()),
    };
    if len > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge { len });
    }
    let mut body = vec![0; len];
    reader.read_exact(&mut body).await?;
    Ok(M::decode(body.as_slice())?)
}

/// This kernel's boot id: equal on both ends only when they share a host (containers on one
/// node share it). Empty when the kernel does not say, which never matches.
pub fn boot_id() -> String {
    std::fs::read_to_string(BOOT_ID).map(|id| id.trim().to_owned()).unwrap_or_default()
}

impl From<&tonic::Status> for LocalStatus {
    fn from(status: &tonic::Status) -> Self {
        Self {
            code: status.code() as i32,
            message: status.message().to_owned(),
            details: bytes::Bytes::copy_from_slice(status.details()),
        }
    }
}

impl From<LocalStatus> for tonic::Status {
    /// The status as gRPC would have carried it (its typed details decode the same way).
    fn from(status: LocalStatus) -> Self {
        tonic::Status::with_details(tonic::Code::from_i32(status.code), status.message, status.details)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{LocalReply, local_reply::Reply};

    #[tokio::test]
    async fn a_frame_reads_back_as_written_and_an_oversized_length_is_refused_unread() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let sent = LocalReply { reply: Some(Reply::Hello(vec![7; 16].into())), data_bytes: 42 };
        write_frame(&mut a, &sent).await.unwrap();
        assert_eq!(read_frame::<LocalReply, _>(&mut b).await.unwrap(), sent);
        a.write_all(&(u32::MAX).to_le_bytes()).await.unwrap();
        assert!(matches!(read_frame::<LocalReply, _>(&mut b).await, Err(FrameError::TooLarge { .. })));
        drop(a);
        assert!(matches!(read_frame::<LocalReply, _>(&mut b).await, Err(FrameError::Closed)));
    }

    #[derive(Debug, thiserror::Error)]
    #[error("unclipped part")]
    struct Unclipped;

    impl crate::ServiceError for Unclipped {
        fn error_code(&self) -> crate::ErrorCode {
            crate::ErrorCode::Unclipped
        }
    }

    #[test]
    fn a_status_crosses_the_socket_with_its_code_and_typed_details() {
        let status = crate::to_status(Unclipped);
        let back = tonic::Status::from(LocalStatus::from(&status));
        assert_eq!((back.code(), back.message()), (status.code(), status.message()));
        assert_eq!(crate::ErrorCode::of(&back), Some(crate::ErrorCode::Unclipped));
    }
}
