//! The metrics port every dpcap component exposes: `GET /metrics` (Prometheus text rendered at
//! each scrape) and `GET /healthz`, over HTTP/1, until shutdown.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// A sample value as the Prometheus text format writes it (`+Inf`, `-Inf`, `NaN`): ε of a
/// job without a guarantee is +∞.
pub fn sample(v: f64) -> String {
    match v {
        f64::INFINITY => "+Inf".into(),
        f64::NEG_INFINITY => "-Inf".into(),
        v if v.is_nan() => "NaN".into(),
        v => v.to_string(),
    }
}

/// Serves `/metrics` (the text `render` returns at each scrape) and `/healthz` over HTTP/1
/// until `shutdown` resolves. Every dpcap component exposes its metrics through this.
pub async fn serve_http(
    listener: TcpListener,
    render: Arc<dyn Fn() -> String + Send + Sync>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => { tracing::warn!(error = %e, "metrics accept failed"); continue; }
            },
        };
        let render = render.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                let response = match request.uri().path() {
                    "/metrics" => Response::builder()
                        .header("content-type", "text/plain; version=0.0.4")
                        .body(Full::new(Bytes::from(render()))),
                    "/healthz" => Response::builder().body(Full::new(Bytes::from_static(b"ok\n"))),
                    _ => Response::builder()
                        .status(StatusCode::NOT_FOUND)
                        .body(Full::new(Bytes::from_static(b"not found\n"))),
                };
                async move { response }
            });
            if let Err(e) = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await {
                tracing::debug!(error = %e, "metrics connection ended");
            }
        });
    }
}
