//! Process-wide Prometheus series (budget rejections, release duration, audits, build info),
//! recorded through the `metrics` facade. The per-job and per-budget series are rendered at
//! scrape time from live state ([`crate::exposition`]).

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

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
                "Refusals for an epsilon budget, by reason: a step past the job's target (job_target) or its \
                 dataset's budget (dataset_budget), or a job whose plan its dataset's free budget cannot cover \
                 (dataset_admission)."
            );
            // Every reason exists at 0 from the start, so that a dashboard's rate has a series.
            for reason in REJECTION_REASONS {
                metrics::counter!("dpcap_budget_rejections_total", "reason" => reason).increment(0);
            }
            metrics::describe_histogram!(
                "dpcap_release_duration_seconds",
                metrics::Unit::Seconds,
                "Seconds from a step's first part to its release."
            );
            metrics::describe_counter!(
                "dpcap_transfers_total",
                "Parts taken in and releases served in full, by call (part, release) and transport (grpc, or \
                 local: the same-host socket)."
            );
            for (call, transport) in TRANSFERS {
                metrics::counter!("dpcap_transfers_total", "call" => call, "transport" => transport).increment(0);
            }
            metrics::describe_gauge!("dpcap_build_info", "Build information; always 1.");
            metrics::describe_gauge!(
                "dpcap_audit_epsilon_lower_bound",
                "A one-run audit's epsilon lower bound at the job's delta (95 % confidence), by job."
            );
            metrics::describe_counter!(
                "dpcap_audit_violations_total",
                "Audits whose epsilon lower bound passed the job's claimed epsilon: a mechanism bug."
            );
            // At 0 from the start: an alert on its increase needs the series before the first.
            metrics::counter!("dpcap_audit_violations_total").increment(0);
            metrics::gauge!("dpcap_build_info", "version" => env!("CARGO_PKG_VERSION"), "component" => "accountant")
                .set(1.0);
            handle
        })
        .clone()
}

/// The reasons of `dpcap_budget_rejections_total`.
pub const REJECTION_REASONS: [&str; 3] = ["job_target", "dataset_budget", "dataset_admission"];

/// Counts one refusal; `reason` is one of [`REJECTION_REASONS`].
pub fn record_budget_rejection(reason: &'static str) {
    metrics::counter!("dpcap_budget_rejections_total", "reason" => reason).increment(1);
}

/// Records a job's audit: its ε lower bound, and a violation (passing the claimed ε) the
/// first time it is seen, so that asking again never inflates the alert counter.
pub fn record_audit(job_id: &str, bound: f64, new_violation: bool) {
    metrics::gauge!("dpcap_audit_epsilon_lower_bound", "job_id" => job_id.to_owned()).set(bound);
    if new_violation {
        metrics::counter!("dpcap_audit_violations_total").increment(1);
    }
}

/// The series of `dpcap_transfers_total`, each present from the start.
const TRANSFERS: [(&str, &str); 4] = [("part", "grpc"), ("part", "local"), ("release", "grpc"), ("release", "local")];

/// Counts a part taken in or a release served in full (`call`) over `transport`.
pub fn record_transfer(call: &'static str, transport: &'static str) {
    metrics::counter!("dpcap_transfers_total", "call" => call, "transport" => transport).increment(1);
}

/// Observes one release's duration.
pub fn record_release(elapsed: Duration) {
    metrics::histogram!("dpcap_release_duration_seconds").record(elapsed.as_secs_f64());
}
