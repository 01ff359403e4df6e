//! A TLS port's word about a plaintext client. A client that speaks plaintext HTTP/2 to a TLS
//! port (grpcurl `-plaintext`, an `http://` URL) gets no answer it can read: rustls drops the
//! connection, the client retries until its deadline ("context deadline exceeded"), and the
//! server would log nothing. Each accepted connection's first byte is peeked, from a duplicate
//! of the socket and without delaying the handshake: anything but a TLS handshake record is
//! logged once per peer address, saying what the client must change.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::wrappers::TcpListenerStream;

/// The first byte of a TLS record carrying a handshake (a ClientHello).
const TLS_HANDSHAKE: u8 = 0x16;

/// How long a connection may stay silent before its first byte is no longer awaited.
const FIRST_BYTE: Duration = Duration::from_secs(10);

/// Peers already warned about: one line per client address, not per retry.
type Warned = Arc<Mutex<HashSet<std::net::IpAddr>>>;

/// The connections `listener` accepts; with `tls`, each one's first byte is checked as above.
pub fn incoming(listener: TcpListener, tls: bool) -> impl Stream<Item = std::io::Result<TcpStream>> {
    let warned = Warned::default();
    TcpListenerStream::new(listener).map(move |accepted| {
        if tls && let Ok(stream) = &accepted {
            watch_first_byte(stream, warned.clone());
        }
        accepted
    })
}

fn watch_first_byte(stream: &TcpStream, warned: Warned) {
    let Ok(peer) = stream.peer_addr() else { return };
    let Ok(copy) = stream.as_fd().try_clone_to_owned() else { return };
    let copy = std::net::TcpStream::from(copy);
    if copy.set_nonblocking(true).is_err() {
        return;
    }
    let Ok(copy) = TcpStream::from_std(copy) else { return };
    tokio::spawn(async move {
        let mut first = [0u8; 1];
        if let Ok(Ok(1)) = tokio::time::timeout(FIRST_BYTE, copy.peek(&mut first)).await
            && first[0] != TLS_HANDSHAKE
        {
            warn_once(peer, first[0], &warned);
        }
    });
}

fn warn_once(peer: SocketAddr, first: u8, warned: &Warned) {
    let new = warned.lock().unwrap_or_else(|p| p.into_inner()).insert(peer.ip());
    if new {
        tracing::warn!(
            %peer,
            first_byte = first,
            "a client spoke plaintext to this TLS port (dropped): it must use TLS: an https:// URL and the CA (dpctl --tls-ca or DPCAP_TLS_CA; grpcurl -cacert CA, not -plaintext)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn a_plaintext_client_is_seen_and_the_connection_still_reaches_the_server_untouched() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let warned = Warned::default();
        let (mut client, server) = tokio::join!(async { TcpStream::connect(addr).await.unwrap() }, async {
            listener.accept().await.unwrap().0
        });
        watch_first_byte(&server, warned.clone());
        client.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while warned.lock().unwrap().is_empty() {
            assert!(tokio::time::Instant::now() < deadline, "the plaintext preface was not seen");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut first = [0u8; 3];
        let read = server.peek(&mut first).await.unwrap();
        assert_eq!(&first[..read], b"PRI", "peeked, never consumed");
    }

    #[tokio::test]
    async fn a_tls_client_hello_is_not_warned_about() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let warned = Warned::default();
        let (mut client, server) = tokio::join!(async { TcpStream::connect(addr).await.unwrap() }, async {
            listener.accept().await.unwrap().0
        });
        watch_first_byte(&server, warned.clone());
        client.write_all(&[TLS_HANDSHAKE, 3, 1]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(warned.lock().unwrap().is_empty());
    }
}
