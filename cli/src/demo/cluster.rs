//! The embedded cluster of `dpctl demo`: the real accountant and coordinator servers and W CPU
//! workers, in this process, on 127.0.0.1 ephemeral ports, over a local directory.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use dpcap_accountant::Setup;
use dpcap_coordinator::Config;
use dpcap_serve::{Capabilities, KeyRing, Listeners, ServerSecurity};
use dpcap_worker::WorkerConfig;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running cluster.
pub struct Cluster {
    /// JobService / WorkerService endpoint.
    pub coordinator: String,
    /// AccountantService endpoint.
    pub accountant: String,
    /// Prometheus scrape URLs (accountant, coordinator).
    pub metrics: [String; 2],
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

async fn bind() -> Result<(TcpListener, String)> {
    let listener = TcpListener::bind("127.0.0.1:0").await.context("binding a loopback port")?;
    let addr = listener.local_addr()?.to_string();
    Ok((listener, addr))
}

fn stopped(stop: &watch::Sender<bool>) -> impl std::future::Future<Output = ()> + Send + 'static {
    let mut rx = stop.subscribe();
    async move {
        let _ = rx.wait_for(|s| *s).await;
    }
}

impl Cluster {
    /// Starts the accountant (ledger under `dir/ledger`), the coordinator (store under
    /// `dir/store`) and `workers` CPU workers.
    pub async fn start(dir: &Path, workers: usize) -> Result<Self> {
        let (stop, _) = watch::channel(false);
        let mut tasks = Vec::new();
        let ((a_grpc, a_addr), (a_metrics, a_metrics_addr)) = (bind().await?, bind().await?);
        let ledger = dpcap_accountant::open_ledger(&dir.join("ledger").to_string_lossy())?;
        let shutdown = stopped(&stop);
        // Loopback, plaintext, no tokens: the local demo (the exposure rule allows exactly this).
        // Capabilities are signed all the same, with a key only this process holds.
        let capabilities = Capabilities::new(Some(KeyRing::generate("demo")));
        let server = ServerSecurity::default().server(a_grpc.local_addr()?)?;
        // Workers on this host send their parts and read their releases over a Unix socket.
        let local = dpcap_accountant::LocalSetup { path: dir.join("accountant.sock"), credentials: Default::default() };
        let setup =
            Setup { ledger, policy: Default::default(), capabilities: capabilities.clone(), local: Some(local) };
        tasks.push(tokio::spawn(async move {
            if let Err(e) = dpcap_accountant::serve(
                Listeners { grpc: a_grpc, metrics: a_metrics, tls: false },
                server,
                setup,
                shutdown,
            )
            .await
            {
                tracing::error!(error = %e, "accountant failed");
            }
        }));
        let accountant = format!("http://{a_addr}");
        let ((c_grpc, c_addr), (c_metrics, c_metrics_addr)) = (bind().await?, bind().await?);
        let config = Config {
            store_url: dir.join("store").to_string_lossy().into_owned(),
            secrets_url: dir.join("secrets").to_string_lossy().into_owned(),
            accountant_endpoint: accountant.clone(),
            accountant_tls: Default::default(),
            accountant_token: None,
            lease: Duration::from_secs(30),
            capabilities,
            capability_ttl: Duration::from_secs(600),
            new_record_key: false,
        };
        let shutdown = stopped(&stop);
        let server = ServerSecurity::default().server(c_grpc.local_addr()?)?;
        tasks.push(tokio::spawn(async move {
            if let Err(e) = dpcap_coordinator::serve(
                Listeners { grpc: c_grpc, metrics: c_metrics, tls: false },
                server,
                config,
                shutdown,
            )
            .await
            {
                tracing::error!(error = %e, "coordinator failed");
            }
        }));
        let coordinator = format!("http://{c_addr}");
        for rank in 0..workers {
            let config = WorkerConfig {
                coordinator: coordinator.clone(),
                name: format!("demo-cpu-{rank}"),
                device: "cpu".into(),
                cluster_token: None,
                tls: Default::default(),
                collective_timeout: dpcap_worker::DEFAULT_COLLECTIVE_TIMEOUT,
                precision: Default::default(),
            };
            let shutdown = stopped(&stop);
            tasks.push(tokio::spawn(async move {
                if let Err(e) = dpcap_worker::run::<dpcap_ml::CpuBackend>(config, Default::default(), shutdown).await {
                    tracing::error!(error = %e, "worker failed");
                }
            }));
        }
        let metrics = [format!("http://{a_metrics_addr}/metrics"), format!("http://{c_metrics_addr}/metrics")];
        Ok(Self { coordinator, accountant, metrics, stop, tasks })
    }

    /// Stops every component and waits (a bounded time) for them to drain.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
    }
}
