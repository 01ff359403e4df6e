//! The accountant's `/metrics`: the process-wide series ([`crate::metrics`]) plus per-job and
//! per-budget series rendered at scrape time from live state, so they come from the ledger
//! after a restart and vanish when a job is closed.

use std::fmt::Write as _;
use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

use crate::core::Accountant;

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
            j.registration.contract.epsilon_target.unwrap_or(f64::INFINITY)
        }),
        ("dpcap_privacy_delta", "gauge", "The job's delta.", |j| j.registration.contract.delta),
        ("dpcap_noise_multiplier", "gauge", "Noise multiplier sigma (noise std sigma*C).", |j| {
            j.registration.contract.mechanism.noise_multiplier
        }),
        ("dpcap_sampling_rate", "gauge", "Poisson sampling rate q.", |j| j.registration.contract.mechanism.sample_rate),
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
            let (id, privacy) = (&job.registration.job_id, job.registration.contract.mode.name());
            let _ =
                writeln!(out, "{name}{{job_id=\"{id}\",privacy=\"{privacy}\"}} {}", dpcap_serve::sample(value(job)));
        }
    }
    render_datasets(accountant, &mut out);
    out
}

/// Per-budget series: the budgets, and the spend as of each budget's latest charge, by dataset
/// and privacy unit.
fn render_datasets(accountant: &Accountant, out: &mut String) {
    let mut budgets = accountant.datasets.all();
    budgets.sort_by_key(|b| b.key());
    let _ = writeln!(
        out,
        "# HELP dpcap_dataset_epsilon_budget A dataset's lifetime epsilon budget at its delta, by privacy unit.\n# TYPE dpcap_dataset_epsilon_budget gauge"
    );
    for b in &budgets {
        let _ = writeln!(
            out,
            "dpcap_dataset_epsilon_budget{{dataset=\"{}\",unit=\"{}\"}} {}",
            b.dataset_id, b.unit, b.epsilon
        );
    }
    let _ = writeln!(
        out,
        "# HELP dpcap_dataset_epsilon_spent Epsilon at the dataset's delta spent by every job of the unit on it.\n# TYPE dpcap_dataset_epsilon_spent gauge"
    );
    for b in &budgets {
        let spent = accountant.datasets.spent(&b.key());
        let _ =
            writeln!(out, "dpcap_dataset_epsilon_spent{{dataset=\"{}\",unit=\"{}\"}} {spent}", b.dataset_id, b.unit);
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
