//! The accountant's `/metrics`: the process-wide series ([`crate::metrics`]) plus per-job and
//! per-budget series rendered at scrape time from live state, so they come from the ledger
//! after a restart and vanish when a job is closed.

use std::fmt::Write as _;
use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

use crate::core::Accountant;

/// Names kept one release after a rename, as copies of the new series: (old, new).
pub const DEPRECATED: [(&str, &str); 2] = [
    ("dpcap_noise_multiplier", "dpcap_privacy_noise_multiplier"),
    ("dpcap_sampling_rate", "dpcap_privacy_sample_rate"),
];

/// A per-job series: name, Prometheus type, help, and its value for a job.
type Series = (&'static str, &'static str, &'static str, fn(&crate::job::Job) -> f64);

const PER_JOB: [Series; 7] = [
    ("dpcap_privacy_epsilon_spent", "gauge", "Epsilon spent at the job's delta (every charged step).", |j| {
        j.progress().epsilon_spent
    }),
    ("dpcap_privacy_epsilon_target", "gauge", "The job's epsilon target at its delta.", |j| {
        j.registration.contract.epsilon_target.unwrap_or(f64::INFINITY)
    }),
    ("dpcap_privacy_delta", "gauge", "The job's delta.", |j| j.registration.contract.delta),
    ("dpcap_privacy_noise_multiplier", "gauge", "Noise multiplier sigma (noise std sigma*C on the sum).", |j| {
        j.registration.contract.mechanism.noise_multiplier
    }),
    ("dpcap_privacy_sample_rate", "gauge", "Poisson sampling rate q.", |j| {
        j.registration.contract.mechanism.sample_rate
    }),
    ("dpcap_steps_charged_total", "counter", "Steps charged to the ledger, discarded ones included.", |j| {
        j.progress().charged as f64
    }),
    ("dpcap_steps_discarded_total", "counter", "Charged steps whose release never reached the job.", |j| {
        j.progress().discarded as f64
    }),
];

/// The full exposition: process-wide series plus one set of per-job series per open job.
pub fn render(handle: &PrometheusHandle, accountant: &Accountant) -> String {
    let mut out = handle.render();
    let mut jobs = accountant.open_jobs();
    jobs.sort_by(|a, b| a.registration.job_id.cmp(&b.registration.job_id));
    for (name, kind, help, value) in PER_JOB {
        let old = DEPRECATED.iter().find(|(_, new)| *new == name).map(|(old, _)| *old);
        for (family, help) in [(Some(name), help.to_owned()), (old, format!("Deprecated alias of {name}: {help}"))] {
            let Some(family) = family else { continue };
            let _ = writeln!(out, "# HELP {family} {help}\n# TYPE {family} {kind}");
            for job in &jobs {
                let (id, privacy) = (&job.registration.job_id, job.registration.contract.mode.name());
                let sample = dpcap_serve::sample(value(job));
                let _ = writeln!(out, "{family}{{job_id=\"{id}\",privacy=\"{privacy}\"}} {sample}");
            }
        }
    }
    render_datasets(accountant, &mut out);
    render_held(accountant, &jobs, &mut out);
    out
}

/// What the accountant holds for running jobs: bytes of noise drawn ahead and of audit
/// canaries drawn, and the part streams open (each holds up to 4·P bytes). Queued, suspended
/// and closed jobs hold none of these.
fn render_held(accountant: &Accountant, jobs: &[Arc<crate::job::Job>], out: &mut String) {
    let name = "dpcap_accountant_held_bytes";
    let _ = writeln!(
        out,
        "# HELP {name} Bytes held for running jobs, by kind: noise drawn ahead, audit canaries, releases kept for late \
         fetches."
    );
    let _ = writeln!(out, "# TYPE {name} gauge");
    let canaries: usize = jobs.iter().filter_map(|j| j.audit.as_ref()).map(|a| a.held_bytes()).sum();
    let _ = writeln!(out, "{name}{{kind=\"noise_ahead\"}} {}", accountant.ahead.held());
    let _ = writeln!(out, "{name}{{kind=\"audit_canaries\"}} {canaries}");
    let _ = writeln!(out, "{name}{{kind=\"releases\"}} {}", accountant.held_release_bytes());
    let name = "dpcap_accountant_part_streams_open";
    let _ = writeln!(out, "# HELP {name} Part streams open now (at most one per part; each holds up to 4*P bytes).");
    let _ = writeln!(out, "# TYPE {name} gauge");
    let _ = writeln!(out, "{name} {}", jobs.iter().map(|j| j.open_streams()).sum::<usize>());
}

/// A label value as the text format needs it: backslash, quote and newline escaped.
fn label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// A budget's labels: its dataset's digest, readable name and privacy unit.
fn budget_labels(b: &crate::records::DatasetBudget) -> String {
    format!("dataset=\"{}\",name=\"{}\",unit=\"{}\"", b.dataset_id, label(b.display_name()), b.unit)
}

/// Per-budget series by dataset digest, readable name and privacy unit: the budget, and its
/// ε spent, reserved by open plans and free as last composed (from the whole ledger at replay,
/// then after each charge, admission, job end and GetDatasetBudget, composed in the
/// background at most once a second: a scrape may lag the last charge by about a second).
fn render_datasets(accountant: &Accountant, out: &mut String) {
    let mut budgets = accountant.datasets.all();
    budgets.sort_by_key(|b| b.key());
    type Field = fn(&crate::records::DatasetBudget, &crate::datasets::Standing) -> f64;
    let series: [(&str, &str, Field); 4] = [
        ("dpcap_dataset_epsilon_budget", "A dataset's lifetime epsilon budget at its delta.", |b, _| b.epsilon),
        ("dpcap_dataset_epsilon_spent", "Epsilon at the budget's delta spent by every job of its unit.", |_, s| {
            s.spent
        }),
        (
            "dpcap_dataset_epsilon_reserved",
            "Epsilon reserved by open jobs' plans beyond their spend (epsilon composes: not a sum).",
            |_, s| s.reserved,
        ),
        ("dpcap_dataset_epsilon_free", "Epsilon left for new plans on the budget.", |_, s| s.free),
    ];
    for (name, help, value) in series {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for b in &budgets {
            // A budget not yet composed has no standing sample rather than a smaller one.
            let Some(standing) = accountant.datasets.standing(b) else { continue };
            let _ = writeln!(out, "{name}{{{}}} {}", budget_labels(b), dpcap_serve::sample(value(b, &standing)));
        }
    }
    let name = "dpcap_dataset_budget_checks_total";
    let _ = writeln!(
        out,
        "# HELP {name} Budget checks (admissions and steps) by what decided them: a step within its job's reserved \
         plan (reservation), the RDP bound (bound) or the exact composition near the boundary (composition).\n# TYPE \
         {name} counter"
    );
    for b in &budgets {
        let decided = accountant.datasets.decided(&b.key());
        for (how, count) in crate::datasets::Decided::ALL.iter().zip(decided) {
            let _ = writeln!(out, "{name}{{{},decided_by=\"{}\"}} {count}", budget_labels(b), how.name());
        }
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
