//! Runs the accountant: gRPC (AccountantService, grpc.health.v1, server reflection) and the
//! metrics port. Health reports NOT_SERVING until the ledger is replayed; on shutdown it turns
//! NOT_SERVING again, new connections stop, and in-flight requests drain.

use std::future::Future;
use std::sync::Arc;

use dpcap_proto::v1::accountant_service_server::AccountantServiceServer;
use dpcap_serve::Listeners;
use tonic_health::ServingStatus;

use crate::core::{Accountant, Policy};
use crate::error::AccountantError;
use crate::ledger::Ledger;
use crate::local::{self, LocalError, LocalSetup};
use crate::service::AccountantGrpc;
use crate::{exposition, metrics};

/// Largest inbound gRPC message (a part chunk): 8 MiB.
use dpcap_proto::client::MAX_MESSAGE_BYTES;

/// What the accountant serves with: its ledger, what it accepts beyond the safe defaults, and
/// the keys that check workers' capabilities.
#[derive(Debug)]
pub struct Setup {
    /// The ledger.
    pub ledger: Ledger,
    /// The explicit unsafe choices.
    pub policy: Policy,
    /// Capability verification (signed whenever tokens are set).
    pub capabilities: dpcap_serve::Capabilities,
    /// The same-host socket, when one is served (`--local-socket`).
    pub local: Option<LocalSetup>,
}

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The ledger store could not be opened.
    #[error("ledger: {0}")]
    Store(#[from] dpcap_serve::StoreError),
    /// The ledger could not be replayed.
    #[error("ledger replay failed: {0}")]
    Replay(#[from] AccountantError),
    /// The gRPC transport failed.
    #[error("grpc server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// Reflection could not be built from the descriptor sets.
    #[error("reflection setup failed: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The same-host socket could not be served.
    #[error(transparent)]
    Local(#[from] LocalError),
}

/// Opens the ledger at a directory or URL (see [`dpcap_serve::open_store`]).
/// A local ledger is its owner's alone (0700/0600): it holds audit canaries' secrets and
/// every job's charges.
pub fn open_ledger(location: &str) -> Result<Ledger, ServeError> {
    if let Some(local) = dpcap_serve::store::open_durable_local(location)? {
        dpcap_serve::store::restrict_local(location, "ledger");
        return Ok(Ledger::local(local));
    }
    let (store, root) = dpcap_serve::open_durable_store(location)?;
    Ok(Ledger::new(store, root))
}

/// Serves until `shutdown` resolves, then drains. Replays the ledger after the listeners are
/// up so that health can report NOT_SERVING meanwhile. `server` carries TLS and the auth layer
/// ([`dpcap_serve::ServerSecurity::server`]).
pub async fn serve(
    Listeners { grpc, metrics: metrics_listener, tls }: Listeners,
    server: dpcap_serve::SecuredServer,
    setup: Setup,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let Setup { ledger, policy, capabilities, local: same_host } = setup;
    let accountant = Arc::new(Accountant::new(ledger, policy));
    let handle = metrics::install();
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_service_status("", ServingStatus::NotServing).await;
    health.set_not_serving::<AccountantServiceServer<AccountantGrpc>>().await;
    let (reflection_v1, reflection_v1alpha) = dpcap_proto::reflection::services(&["dpcap.v1.AccountantService"])?;
    let mut grpc_service = AccountantGrpc::new(accountant.clone(), capabilities);
    // The socket is bound before the port serves, so that no rank is told of it before it exists.
    let same_host = match same_host {
        Some(LocalSetup { path, credentials }) => {
            let endpoint = local::endpoint(&path);
            grpc_service = grpc_service.with_local(endpoint.clone());
            tracing::info!(socket = %path.display(), "same-host socket for parts and releases");
            Some((local::bind(&path)?, credentials, endpoint.instance))
        }
        None => None,
    };
    let service = AccountantServiceServer::new(grpc_service.clone())
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);

    let draining = accountant.clone();
    let services = &[<AccountantServiceServer<AccountantGrpc> as tonic::server::NamedService>::NAME];
    let stopped = dpcap_serve::drain::on_shutdown(shutdown, health.clone(), services, move || draining.begin_drain());
    let same_host = same_host.map(|(listener, credentials, instance)| {
        tokio::spawn(local::serve(listener, grpc_service, credentials, instance, stopped.wait()))
    });
    tokio::spawn(exposition::serve(metrics_listener, handle, accountant.clone(), stopped.wait()));
    // Budgets' standings for the metrics, composed as charges touch them; ends with the server.
    let standings = tokio::spawn(accountant.clone().keep_standings());
    let _standings = scopeguard(move || standings.abort());

    let replay = {
        let (accountant, health) = (accountant.clone(), health.clone());
        tokio::spawn(async move {
            let jobs = accountant.replay().await?;
            tracing::info!(jobs, "ledger replayed; serving");
            health.set_service_status("", ServingStatus::Serving).await;
            health.set_serving::<AccountantServiceServer<AccountantGrpc>>().await;
            Ok::<(), AccountantError>(())
        })
    };
    // HTTP/2's default 64 KiB flow-control windows cap a bulk stream at tens of MB/s even on
    // loopback; adaptive windows grow them to the bandwidth-delay product (docs/grpc.md).
    let mut server = server;
    let server = server
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(service)
        .serve_with_incoming_shutdown(dpcap_serve::plaintext::incoming(grpc, tls), stopped.wait());
    tokio::pin!(server);
    tokio::pin!(replay);
    let mut replay_done = false;
    loop {
        tokio::select! {
            result = &mut server => {
                // The socket's calls drain too (a part's charge and release run to their end).
                if let Some(same_host) = same_host {
                    let _ = same_host.await;
                }
                return Ok(result?);
            }
            result = &mut replay, if !replay_done => {
                replay_done = true;
                match result {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(ServeError::Replay(e)),
                    Err(source) => return Err(ServeError::Replay(AccountantError::Task { what: "replay", source })),
                }
            }
        }
    }
}

/// Runs `f` when dropped (on every return of [`serve`]).
fn scopeguard(f: impl FnOnce()) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_local_ledger_opened_wide_is_restricted_to_its_owner() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = dir.path().join("ledger");
        let secret = ledger.join("jobs/job-1/audit");
        std::fs::create_dir_all(&secret).unwrap();
        std::fs::write(secret.join("secret"), [7u8; 32]).unwrap();
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let wide = |p: &std::path::Path, m| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
        wide(&ledger, 0o755);
        wide(&secret.join("secret"), 0o644);
        assert!(dpcap_serve::store::restrict_local(ledger.to_str().unwrap(), "ledger"), "a wide ledger warns");
        wide(&ledger, 0o755);
        super::open_ledger(ledger.to_str().unwrap()).unwrap();
        assert_eq!(mode(&ledger), 0o700, "nobody else traverses the ledger");
        assert_eq!(mode(&secret), 0o700);
        assert_eq!(mode(&secret.join("secret")), 0o600, "an audit's canary secret is the owner's alone");
        let fresh = dir.path().join("fresh");
        super::open_ledger(fresh.to_str().unwrap()).unwrap();
        assert_eq!(mode(&fresh), 0o700, "a new ledger starts restricted");
        wide(&fresh, 0o755);
        assert!(
            !dpcap_serve::store::restrict_local(fresh.to_str().unwrap(), "ledger"),
            "an empty one: nothing to warn"
        );
    }
}
