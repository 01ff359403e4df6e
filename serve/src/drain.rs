//! The shutdown sequence every dpcap server runs, written once: when the process is told to
//! stop, the service stops taking new work (its own drain), health reports NOT_SERVING for the
//! server and each of its services (so a load balancer moves away first), and only then do
//! the gRPC and metrics listeners stop, letting in-flight requests finish.

use std::future::Future;

use tokio::sync::watch;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

/// Resolves, in every task that holds a copy, once the drain has begun.
#[derive(Debug, Clone)]
pub struct Stopped(watch::Receiver<bool>);

impl Stopped {
    /// A future that resolves when the drain has begun: give one to each listener.
    pub fn wait(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.0.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    }
}

/// Spawns the drain: once `shutdown` resolves, runs `begin_drain`, marks "" and every name in
/// `services` (their `NamedService::NAME`) NOT_SERVING, then resolves every [`Stopped`].
pub fn on_shutdown(
    shutdown: impl Future<Output = ()> + Send + 'static,
    health: HealthReporter,
    services: &'static [&'static str],
    begin_drain: impl FnOnce() + Send + 'static,
) -> Stopped {
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        tracing::info!("shutting down: draining in-flight requests");
        begin_drain();
        health.set_service_status("", ServingStatus::NotServing).await;
        for service in services {
            health.set_service_status(*service, ServingStatus::NotServing).await;
        }
        let _ = stop_tx.send(true);
    });
    Stopped(stop_rx)
}
