//! Prometheus metrics on their own HTTP port. Process-wide series (budget rejections, release
//! duration, build info) go through the `metrics` facade; per-job series are rendered at
//! scrape time from the jobs' live progress, so they come from the ledger after a restart and
//! vanish when a job is closed.

use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;

use crate::accountant::Accountant;

/// Buckets of `dpcap_release_duration_seconds`: from the first part of a step to its release.
pub const RELEASE_BUCKETS: &[f64] = &[0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process-wide recorder once and returns its handle.
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full("dpcap_release_duration_seconds".into()), RELEASE_BUCKETS)
                .expect("buckets are non-empty")
                .build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed; dpcap metrics go to it");
            }
            metrics::describe_counter!(
                "dpcap_budget_rejections_total",
                "Steps refused because they would pass an epsilon budget, by reason."
            );
            metrics::describe_histogram!(
                "dpcap_release_duration_seconds",
                metrics::Unit::Seconds,
                "Seconds from a step's first part to its release."
            );
            metrics::describe_gauge!("dpcap_build_info", "Build information; always 1.");
            metrics::describe_gauge!(
                "dpcap_audit_epsilon_lower_bound",
                "A one-run audit's epsilon lower bound at the job's delta (95 % confidence), by job."
            );
            metrics::describe_counter!(
                "dpcap_audit_violations_total",
                "Audits whose epsilon lower bound passed the job's claimed epsilon: a mechanism bug."
            );
            metrics::gauge!("dpcap_build_info", "version" => env!("CARGO_PKG_VERSION"), "component" => "accountant")
                .set(1.0);
            handle
        })
        .clone()
}

/// Counts one refused step; `reason` is "job_target" or "dataset_budget".
pub fn record_budget_rejection(reason: &'static str) {
    metrics::counter!("dpcap_budget_rejections_total", "reason" => reason).increment(1);
}

/// Records a job's audit: its ε lower bound, and a violation when it passes the claimed ε.
pub fn record_audit(job_id: &str, bound: f64, violation: bool) {
    metrics::gauge!("dpcap_audit_epsilon_lower_bound", "job_id" => job_id.to_owned()).set(bound);
    if violation {
        metrics::counter!("dpcap_audit_violations_total").increment(1);
    }
}

/// Observes one release's duration.
pub fn record_release(elapsed: Duration) {
    metrics::histogram!("dpcap_release_duration_seconds").record(elapsed.as_secs_f64());
}

/// The full exposition: process-wide series plus one set of per-job series per open job.
pub fn render(handle: &PrometheusHandle, accountant: &Accountant) -> String {
    let mut out = handle.render();
    let mut jobs = accountant.open_jobs();
    jobs.sort_by(|a, b| a.registration.job_id.cmp(&b.registration.job_id));
    type Field = fn(&crate::job::Job) -> f64;
    let series: [(&str, &str, &str, Field); 7] = [
        ("dpcap_privacy_epsilon_spent", "gauge", "Epsilon spent at the job's delta (every charged step).", |j| {
            j.progress().epsilon_spent
        }),
        ("dpcap_privacy_epsilon_target", "gauge", "The job's epsilon target at its delta.", |j| {
            j.registration.epsilon_target
        }),
        ("dpcap_privacy_delta", "gauge", "The job's delta.", |j| j.registration.delta),
        ("dpcap_noise_multiplier", "gauge", "Noise multiplier sigma (noise std sigma*C).", |j| {
            j.registration.noise_multiplier
        }),
        ("dpcap_sampling_rate", "gauge", "Poisson sampling rate q.", |j| j.registration.sample_rate),
        ("dpcap_steps_charged_total", "counter", "Steps charged to the ledger, discarded ones included.", |j| {
            j.progress().charged as f64
        }),
        ("dpcap_steps_discarded_total", "counter", "Charged steps whose release never reached the job.", |j| {
            j.progress().discarded as f64
        }),
    ];
    for (name, kind, help, value) in series {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for job in &jobs {
            let (id, privacy) = (&job.registration.job_id, job.spending.mode().name());
            let _ =
                writeln!(out, "{name}{{job_id=\"{id}\",privacy=\"{privacy}\"}} {}", dpcap_serve::sample(value(job)));
        }
    }
    render_datasets(accountant, &mut out);
    out
}

/// Per-dataset series: the budgets, and the spend as of each dataset's latest charge.
fn render_datasets(accountant: &Accountant, out: &mut String) {
    let mut budgets = accountant.budgets();
    budgets.sort_by(|a, b| a.dataset_id.cmp(&b.dataset_id));
    let _ = writeln!(
        out,
        "# HELP dpcap_dataset_epsilon_budget A dataset's lifetime epsilon budget at its delta.\n# TYPE dpcap_dataset_epsilon_budget gauge"
    );
    for b in &budgets {
        let _ = writeln!(out, "dpcap_dataset_epsilon_budget{{dataset=\"{}\"}} {}", b.dataset_id, b.epsilon);
    }
    let _ = writeln!(
        out,
        "# HELP dpcap_dataset_epsilon_spent Epsilon at the dataset's delta spent by every job on it.\n# TYPE dpcap_dataset_epsilon_spent gauge"
    );
    for b in &budgets {
        let spent = accountant.dataset_spent(&b.dataset_id);
        let _ = writeln!(out, "dpcap_dataset_epsilon_spent{{dataset=\"{}\"}} {spent}", b.dataset_id);
    }
}

/// Serves `GET /metrics` (and `/healthz`) until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    handle: PrometheusHandle,
    accountant: Arc<Accountant>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    dpcap_serve::serve_http(listener, Arc::new(move || render(&handle, &accountant)), shutdown).await;
}
