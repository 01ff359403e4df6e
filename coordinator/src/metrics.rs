//! The coordinator's Prometheus series, rendered at scrape time from its state: job state,
//! steps, ε, examples per second, step duration by phase, workers and queue length.

use std::fmt::Write as _;

use dpcap_proto::v1::JobState;
use dpcap_serve::sample;

use crate::state::{PHASES, State};

const STATES: [JobState; 6] = [
    JobState::Pending,
    JobState::Running,
    JobState::Succeeded,
    JobState::Failed,
    JobState::Cancelled,
    JobState::BudgetExhausted,
];

/// A job's labels: its id and its privacy mode (`dp`, or `not_private` / `simulation` for jobs
/// whose releases carry no guarantee), so that dashboards never show a NOT PRIVATE job's ε as
/// a guarantee.
fn job_labels(id: &str, e: &crate::state::JobEntry) -> String {
    format!("job_id=\"{id}\",privacy=\"{}\"", e.contract.mode.name())
}

/// Names kept one release after a rename, as copies of the new series: (old, new). ε has one
/// name in both services (`dpcap_privacy_*`, labels job_id and privacy): the accountant's
/// series live while a job is open, the coordinator's (the ledger's value as last reported)
/// stay after it ends.
pub const DEPRECATED: [(&str, &str); 3] = [
    ("dpcap_job_epsilon_spent", "dpcap_privacy_epsilon_spent"),
    ("dpcap_job_epsilon_target", "dpcap_privacy_epsilon_target"),
    ("dpcap_job_epsilon_composed", "dpcap_privacy_epsilon_composed"),
];

/// A per-job series: name, Prometheus type, help, and its value for a job.
type Series = (&'static str, &'static str, &'static str, fn(&crate::state::JobEntry) -> f64);

/// Every per-job series but the state.
const PER_JOB: [Series; 9] = [
    ("dpcap_job_steps_completed", "gauge", "Steps completed (charged and reported by every rank).", |e| {
        e.job.progress.as_ref().map_or(0.0, |p| p.step as f64)
    }),
    ("dpcap_job_steps_planned", "gauge", "Steps in the job's plan.", |e| e.contract.planned_steps as f64),
    ("dpcap_privacy_epsilon_spent", "gauge", "Epsilon at delta spent, as last reported by the accountant.", |e| {
        e.job.progress.as_ref().map_or(0.0, |p| p.epsilon_spent)
    }),
    (
        "dpcap_job_steps_discarded_total",
        "counter",
        "Charged steps whose release never reached the model (they stay spent), from the ledger.",
        |e| e.job.progress.as_ref().map_or(0.0, |p| p.steps_discarded as f64),
    ),
    (
        "dpcap_privacy_epsilon_composed",
        "gauge",
        "Epsilon at delta composed with the DP job this one started from (init_from), from the accountant.",
        |e| e.job.progress.as_ref().map_or(0.0, |p| p.epsilon_composed),
    ),
    (
        "dpcap_job_nonfinite_examples_total",
        "counter",
        "Examples left out of the clipped sum for a NaN or infinite loss or gradient (a count only).",
        |e| e.job.progress.as_ref().map_or(0.0, |p| p.nonfinite_examples as f64),
    ),
    (
        "dpcap_job_dropped_examples_total",
        "counter",
        "Sampled examples left out because they could not be read or decoded (a count only).",
        |e| e.job.progress.as_ref().map_or(0.0, |p| p.dropped_examples as f64),
    ),
    ("dpcap_privacy_epsilon_target", "gauge", "The job's epsilon target at delta (+Inf: NOT PRIVATE, none).", |e| {
        e.contract.epsilon_target.unwrap_or(f64::INFINITY)
    }),
    (
        "dpcap_job_examples_per_second",
        "gauge",
        "Expected examples (L, not the realised batch) per second over the last completed step.",
        |e| e.job.progress.as_ref().map_or(0.0, |p| p.examples_per_second),
    ),
];

/// Renders every coordinator series in the Prometheus text format; `refused` is the job
/// records refused at restore (their seal did not verify).
pub fn render(state: &State, refused: u64) -> String {
    let mut out = render_states(state);
    render_per_job(state, &mut out);
    render_phases(state, &mut out);
    render_cluster(state, &mut out);
    let name = "dpcap_coordinator_records_refused_total";
    let help = "Job records refused at restore: their seal did not verify (changed outside the coordinator, copied, or unsealed); never run.";
    let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {refused}\n");
    out
}

/// `dpcap_job_state`: 1 for each job's current state, 0 for the others.
fn render_states(state: &State) -> String {
    let name = "dpcap_job_state";
    let mut out = format!("# HELP {name} 1 for the job's current state, 0 for the others.\n# TYPE {name} gauge\n");
    for (id, e) in &state.jobs {
        for s in STATES {
            let on = u8::from(e.job.state == s as i32);
            let label = s.as_str_name().trim_start_matches("JOB_STATE_").to_lowercase();
            let _ = writeln!(out, "{name}{{{},state=\"{label}\"}} {on}", job_labels(id, e));
        }
    }
    out
}

fn render_per_job(state: &State, text: &mut String) {
    for (name, kind, help, value) in PER_JOB {
        let old = DEPRECATED.iter().find(|(_, new)| *new == name).map(|(old, _)| *old);
        for (family, help) in [(Some(name), help.to_owned()), (old, format!("Deprecated alias of {name}: {help}"))] {
            let Some(family) = family else { continue };
            let _ = writeln!(text, "# HELP {family} {help}\n# TYPE {family} {kind}");
            for (id, e) in &state.jobs {
                let _ = writeln!(text, "{family}{{{}}} {}", job_labels(id, e), sample(value(e)));
            }
        }
    }
}

/// Step time by phase, except for strict jobs (timings grow with the realised batch).
fn render_phases(state: &State, text: &mut String) {
    let _ = writeln!(
        text,
        "# HELP dpcap_step_duration_seconds Seconds per step by phase, summed over ranks' reports.\n# TYPE dpcap_step_duration_seconds summary"
    );
    for (id, e) in state.jobs.iter().filter(|(_, e)| !crate::state::is_strict(&e.job)) {
        for (phase, seconds) in PHASES.iter().zip(e.phase_seconds) {
            let _ = writeln!(text, "dpcap_step_duration_seconds_sum{{job_id=\"{id}\",phase=\"{phase}\"}} {seconds}");
            let _ = writeln!(
                text,
                "dpcap_step_duration_seconds_count{{job_id=\"{id}\",phase=\"{phase}\"}} {}",
                e.phase_reports
            );
        }
    }
}

/// Workers and the queue.
fn render_cluster(state: &State, text: &mut String) {
    let busy = state.workers.values().filter(|w| w.job.is_some()).count();
    let _ = writeln!(
        text,
        "# HELP dpcap_workers_registered Workers holding a lease.\n# TYPE dpcap_workers_registered gauge\ndpcap_workers_registered {}",
        state.workers.len()
    );
    let _ = writeln!(
        text,
        "# HELP dpcap_workers_busy Workers in a running job's group.\n# TYPE dpcap_workers_busy gauge\ndpcap_workers_busy {busy}"
    );
    let _ = writeln!(
        text,
        "# HELP dpcap_jobs_queued Jobs waiting for workers.\n# TYPE dpcap_jobs_queued gauge\ndpcap_jobs_queued {}",
        state.queue.len()
    );
}
