//! Runs the coordinator: JobService and WorkerService with health and reflection beside them,
//! the metrics port, and the lease reaper. On shutdown health turns NOT_SERVING, new
//! connections stop and in-flight requests drain.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dpcap_proto::v1::job_service_server::JobServiceServer;
use dpcap_proto::v1::worker_service_server::WorkerServiceServer;
use dpcap_serve::{Listeners, SecuredServer, open_store};

use crate::coordinator::{Config, Coordinator};
use crate::error::CoordinatorError;
use crate::service::{JobGrpc, WorkerGrpc};
use crate::store::JobStore;

/// The secrets store's own cloud settings: object_store's variable names behind this prefix
/// (`DPCAP_SECRETS_STORE_AWS_ACCESS_KEY_ID`, ...), so that it can have credentials the job
/// store (which workers write) does not share.
pub const SECRETS_ENV_PREFIX: &str = "DPCAP_SECRETS_STORE_";

/// Serves until `shutdown` resolves, then drains. `server` carries TLS and the auth layer
/// ([`dpcap_serve::ServerSecurity::server`]): JobService needs operator or viewer tokens,
/// WorkerService worker tokens.
pub async fn serve(
    Listeners { grpc, metrics: metrics_listener, tls }: Listeners,
    server: SecuredServer,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), CoordinatorError> {
    let jobs_store =
        open_store(&config.store_url).map_err(|source| CoordinatorError::Location { field: "store", source })?;
    let secrets_url = secrets_location(&config)?;
    let secrets_store = dpcap_serve::store::open_store_prefixed(&secrets_url, SECRETS_ENV_PREFIX)
        .map_err(|source| CoordinatorError::Location { field: "secrets_store", source })?;
    let lease = config.lease;
    let accountant_endpoint = config.accountant_endpoint.clone();
    let job_store = JobStore::open(jobs_store, secrets_store, config.new_record_key).await?;
    // The record key and the sampler secrets: for this process alone (0700 and 0600).
    dpcap_serve::store::restrict_local(&secrets_url, "secrets_store");
    let coordinator = Coordinator::open(config, job_store).await?;
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<JobServiceServer<JobGrpc>>().await;
    health.set_serving::<WorkerServiceServer<WorkerGrpc>>().await;
    let (reflection_v1, reflection_v1alpha) =
        dpcap_proto::reflection::services(&["dpcap.v1.JobService", "dpcap.v1.WorkerService"])?;
    let jobs = JobServiceServer::new(JobGrpc(coordinator.clone()));
    let workers = WorkerServiceServer::new(WorkerGrpc {
        coordinator: coordinator.clone(),
        accountant_endpoint,
        lease_seconds: lease.as_secs().max(1) as u32,
    })
    .max_encoding_message_size(dpcap_proto::MAX_WORK_MESSAGE_BYTES)
    .max_decoding_message_size(dpcap_proto::MAX_WORK_MESSAGE_BYTES);

    use tonic::server::NamedService;
    let services =
        &[<JobServiceServer<JobGrpc> as NamedService>::NAME, <WorkerServiceServer<WorkerGrpc> as NamedService>::NAME];
    let draining = coordinator.clone();
    let stopped = dpcap_serve::drain::on_shutdown(shutdown, health.clone(), services, move || draining.begin_drain());
    let render = coordinator.clone();
    tokio::spawn(dpcap_serve::serve_http(metrics_listener, Arc::new(move || render.render_metrics()), stopped.wait()));
    tokio::spawn(reap(coordinator.clone(), lease, stopped.wait()));
    let mut server = server;
    server
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(jobs)
        .add_service(workers)
        .serve_with_incoming_shutdown(dpcap_serve::plaintext::incoming(grpc, tls), stopped.wait())
        .await
        .map_err(CoordinatorError::from)
}

/// Where job secrets live: `--secrets-store`, or beside a local job store. An object-store job
/// store needs a secrets store of its own: workers hold that store's credentials.
fn secrets_location(config: &Config) -> Result<String, CoordinatorError> {
    match config.secrets_url.as_str() {
        "" if config.store_url.contains("://") && !config.store_url.starts_with("file://") => {
            Err(CoordinatorError::invalid(
                "secrets_store",
                format!(
                    "required when the store is an object store ({}): workers hold that store's credentials, so job secrets need a store of their own",
                    config.store_url
                ),
            ))
        }
        "" => Ok(format!("{}-secrets", config.store_url.trim_end_matches('/'))),
        url => Ok(url.to_owned()),
    }
}

/// Drops workers whose lease expired, every quarter lease, until `stop`.
async fn reap(coordinator: Arc<Coordinator>, lease: Duration, stop: impl Future<Output = ()>) {
    tokio::pin!(stop);
    let mut tick = tokio::time::interval((lease / 4).max(Duration::from_millis(100)));
    loop {
        tokio::select! {
            _ = tick.tick() => if let Err(e) = coordinator.reap().await { tracing::warn!(error = %e, "lease reaper failed") },
            _ = &mut stop => return,
        }
    }
}
