//! A TLS port's word about a plaintext client. A client that speaks plaintext HTTP/2 to a TLS
//! port (grpcurl `-plaintext`, an `http://` URL) gets no answer it can read: rustls drops the
//! connection, the client retries until its deadline ("context deadline exceeded"), and the
//! server would log nothing. Each accepted connection is wrapped so that the first byte the TLS
//! layer reads is looked at as it passes (never consumed, never waited for apart from the
//! handshake's own read): anything but a TLS handshake record is logged once per client
//! address, saying what the client must change.

use std::collections::HashSet;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// The first byte of a TLS record carrying a handshake (a ClientHello).
const TLS_HANDSHAKE: u8 = 0x16;

/// Client addresses remembered as warned about before the memory starts over: one line per
/// client, not per retry, and bounded whoever connects.
const WARNED_KEPT: usize = 1024;

/// Client addresses already warned about.
type Warned = Arc<Mutex<HashSet<IpAddr>>>;

/// A connection whose first read is checked for a TLS handshake (when `tls`).
pub struct Sniffed {
    inner: TcpStream,
    /// Set until the first byte was seen (never for a plaintext port).
    watch: Option<Warned>,
}

/// The connections `listener` accepts; with `tls`, each one's first byte is checked as above.
pub fn incoming(listener: TcpListener, tls: bool) -> impl Stream<Item = io::Result<Sniffed>> {
    let warned = Warned::default();
    TcpListenerStream::new(listener)
        .map(move |accepted| accepted.map(|inner| Sniffed { inner, watch: tls.then(|| warned.clone()) }))
}

impl Sniffed {
    fn first_byte(&mut self, first: u8) {
        let Some(warned) = self.watch.take() else { return };
        if first == TLS_HANDSHAKE {
            return;
        }
        let Ok(peer) = self.inner.peer_addr() else { return };
        let mut warned = warned.lock().unwrap_or_else(|p| p.into_inner());
        if warned.len() >= WARNED_KEPT {
            warned.clear();
        }
        if warned.insert(peer.ip()) {
            tracing::warn!(
                %peer,
                first_byte = first,
                "a client spoke plaintext to this TLS port (dropped): it must use TLS: an https:// URL and the CA (dpctl --tls-ca or DPCAP_TLS_CA; grpcurl -cacert CA, not -plaintext)"
            );
        }
    }
}

impl AsyncRead for Sniffed {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if self.watch.is_some()
            && let Poll::Ready(Ok(())) = polled
            && let Some(&first) = buf.filled().get(before)
        {
            self.first_byte(first);
        }
        polled
    }
}

impl AsyncWrite for Sniffed {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl Connected for Sniffed {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A connection accepted through [`incoming`], its client, and the warned set.
    async fn accepted(tls: bool) -> (Sniffed, TcpStream, Warned) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut stream = Box::pin(incoming(listener, tls));
        let client = TcpStream::connect(addr).await.unwrap();
        let server = stream.next().await.unwrap().unwrap();
        let warned = server.watch.clone().unwrap_or_default();
        (server, client, warned)
    }

    #[tokio::test]
    async fn a_plaintext_client_is_named_once_and_its_bytes_reach_the_reader_untouched() {
        let (mut server, mut client, warned) = accepted(true).await;
        client.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
        let mut read = [0u8; 3];
        server.read_exact(&mut read).await.unwrap();
        assert_eq!(&read, b"PRI", "seen as it passed, never consumed");
        assert_eq!(warned.lock().unwrap().len(), 1, "the client's address is named");
        assert!(server.watch.is_none(), "only the first byte is looked at");
    }

    #[tokio::test]
    async fn a_tls_client_hello_and_a_plaintext_port_are_never_warned_about() {
        let (mut server, mut client, warned) = accepted(true).await;
        client.write_all(&[TLS_HANDSHAKE, 3, 1]).await.unwrap();
        let mut read = [0u8; 3];
        server.read_exact(&mut read).await.unwrap();
        assert!(warned.lock().unwrap().is_empty());
        let (plain, _client, _) = accepted(false).await;
        assert!(plain.watch.is_none(), "a plaintext port checks nothing");
    }
}
