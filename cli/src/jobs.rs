//! `dpctl submit|get|list|watch|cancel|wait`: the operator's view of jobs over JobService.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use dpcap_privacy::contract::PrivacyContract;
use dpcap_proto::client::{ClientError, JobsClient};
use dpcap_proto::spec::SpecFile;
use dpcap_proto::v1::{Job, JobState, Reduction};
use dpcap_serve::ClientTlsArgs;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};

/// Where the coordinator is and how to authenticate.
#[derive(Debug, Clone, Args)]
pub struct Server {
    /// The coordinator's gRPC endpoint.
    #[arg(long, global = true, default_value = "http://127.0.0.1:7071", env = "DPCAP_COORDINATOR")]
    pub coordinator: String,
    /// Bearer token of the role the command needs: operator (submit, cancel, resume), viewer
    /// (get, list, watch, wait, audit), privacy-admin (dataset budget set).
    #[arg(long, global = true, env = "DPCAP_TOKEN", hide_env_values = true)]
    pub token: Option<dpcap_proto::Secret>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub tls: ClientTlsArgs,
}

impl Server {
    /// Connects to the coordinator.
    pub async fn connect(&self) -> Result<JobsClient> {
        let endpoint = self
            .tls
            .endpoint(&self.coordinator)
            .with_context(|| format!("invalid --coordinator {}", self.coordinator))?;
        JobsClient::connect(endpoint, self.token.clone())
            .await
            .map_err(|e| anyhow::anyhow!("cannot reach {}: {e}", self.coordinator))
    }
}

/// Exit codes of `dpctl wait` and `dpctl watch` by outcome: every budget end is 5, a job
/// FAILED because its budget could not cover its resumed plan included.
pub fn exit_code(job: &Job) -> i32 {
    let finished = job.conditions.iter().rev().find(|c| c.r#type == "Finished");
    match JobState::try_from(job.state) {
        Ok(JobState::Succeeded) => 0,
        Ok(JobState::Failed) if finished.is_some_and(|c| c.reason == dpcap_proto::job::BUDGET_REFUSED) => 5,
        Ok(JobState::Failed) => 3,
        Ok(JobState::Cancelled) => 4,
        Ok(JobState::BudgetExhausted) => 5,
        _ => 1,
    }
}

/// A state's short name: pending, running, succeeded, …
pub fn state_name(state: i32) -> String {
    JobState::try_from(state)
        .map(|s| s.as_str_name().trim_start_matches("JOB_STATE_").to_owned())
        .unwrap_or_else(|_| format!("UNKNOWN({state})"))
}

/// A job's plan and contract as `dpctl` shows them: the privacy terms come from the contract
/// (the plan keeps none), the rest from the plan. A job without a valid contract shows none.
struct View {
    plan: dpcap_proto::v1::Plan,
    contract: Option<PrivacyContract>,
}

impl View {
    fn of(job: &Job) -> Self {
        let plan = job.plan.clone().unwrap_or_default();
        let contract = dpcap_proto::plan::contract(&plan).ok();
        Self { plan, contract }
    }

    fn privacy(&self) -> &'static str {
        self.contract.as_ref().map_or("unknown", |c| c.mode.name())
    }

    fn steps(&self) -> u64 {
        self.contract.as_ref().map_or(0, |c| c.planned_steps)
    }

    /// ε target at δ; +∞ for a NOT PRIVATE baseline (no target).
    fn epsilon_target(&self) -> f64 {
        self.contract.as_ref().and_then(|c| c.epsilon_target).unwrap_or(f64::INFINITY)
    }

    fn expected_batch_size(&self) -> f64 {
        self.contract.as_ref().map_or(0.0, |c| dpcap_proto::plan::expected_batch_size(&self.plan, c))
    }

    /// The simulated recipe's batch and σ (0 unless a simulation).
    fn simulated(&self) -> (f64, f64) {
        self.contract.as_ref().and_then(|c| c.mode.simulated()).map_or((0.0, 0.0), |target| {
            (target.sample_rate * dpcap_proto::plan::units(&self.plan) as f64, target.noise_multiplier)
        })
    }
}

/// A job's privacy contract (the plan's terms live there alone).
pub fn contract_of(job: &Job) -> Result<PrivacyContract> {
    let plan = job.plan.clone().unwrap_or_default();
    dpcap_proto::plan::contract(&plan).with_context(|| format!("job {} has no valid contract", job.job_id))
}

/// A job as JSON: the wire message's fields, with the plan's privacy terms read from its
/// contract under the names operators' scripts know.
pub fn job_json(job: &Job) -> Value {
    let view = View::of(job);
    let (plan, c) = (&view.plan, view.contract.as_ref());
    let progress = job.progress.clone().unwrap_or_default();
    let spec = job.spec.clone().unwrap_or_default();
    let mechanism = c.map(|c| c.mechanism);
    json!({
        "job_id": job.job_id,
        "name": spec.name,
        "state": state_name(job.state),
        "privacy": view.privacy(),
        "dataset": spec.dataset,
        "model": spec.model,
        "plan": {
            "examples": plan.examples, "sample_rate": mechanism.map(|m| m.sample_rate),
            "expected_batch_size": view.expected_batch_size(), "noise_multiplier": mechanism.map(|m| m.noise_multiplier),
            "calibrated": plan.calibrated, "steps": view.steps(), "delta": c.map(|c| c.delta),
            "epsilon_target": c.and_then(|c| c.epsilon_target), "epsilon_planned": plan.epsilon_planned,
            "clipping_norm": mechanism.map(|m| m.clipping_norm), "learning_rate": plan.learning_rate,
            "micro_batch": plan.micro_batch, "workers": plan.workers, "checkpoint_interval": plan.checkpoint_interval,
            "dataset_digest": c.map(|c| c.dataset_id.clone()), "privacy": view.privacy(),
            "simulated_batch_size": view.simulated().0, "simulated_noise_multiplier": view.simulated().1,
        },
        "progress": {
            "step": progress.step, "steps_total": progress.steps_total, "epsilon_spent": progress.epsilon_spent,
            "epsilon_composed": progress.epsilon_composed, "loss": progress.loss, "loss_first": progress.loss_first,
            "examples_per_second": progress.examples_per_second, "eta_seconds": progress.eta_seconds,
            "checkpoint_step": progress.checkpoint_step, "generation": progress.generation, "workers": progress.workers,
            "steps_discarded": progress.steps_discarded, "nonfinite_examples": progress.nonfinite_examples,
            "queue_position": progress.queue_position,
            "dropped_examples": progress.dropped_examples,
        },
        "conditions": job.conditions.iter().map(|c| json!({"type": c.r#type, "reason": c.reason, "message": c.message, "time_unix_ms": c.time_unix_ms})).collect::<Vec<_>>(),
        "checkpoint_root": job.checkpoint_root,
        "created_unix_ms": job.created_unix_ms,
        "reduction": Reduction::try_from(job.reduction)
            .map_or("unknown".to_owned(), |r| r.as_str_name().trim_start_matches("REDUCTION_").to_lowercase()),
    })
}

fn print_job(job: &Job, as_json: bool) {
    if as_json {
        outln!("{}", serde_json::to_string_pretty(&job_json(job)).unwrap_or_default());
        return;
    }
    let view = View::of(job);
    let p = job.progress.clone().unwrap_or_default();
    outln!("job {}  {}", job.job_id, state_name(job.state));
    if let Some(notice) = view.contract.as_ref().and_then(|c| dpcap_proto::plan::notice(&view.plan, c)) {
        outln!("  {notice}");
    }
    if let Some(c) = &view.contract {
        let m = c.mechanism;
        outln!(
            "  plan: N={} q={:.6} L={:.1} sigma={:.4} ({}) steps={} C={} eps target={:.4} (planned {:.4}) at delta={:.3e}",
            dpcap_proto::plan::units(&view.plan),
            m.sample_rate,
            view.expected_batch_size(),
            m.noise_multiplier,
            if view.plan.calibrated { "calibrated" } else { "fixed" },
            c.planned_steps,
            m.clipping_norm,
            view.epsilon_target(),
            view.plan.epsilon_planned,
            c.delta
        );
    }
    if p.queue_position > 0 {
        outln!("  queued: position {} (why: its last WaitingForWorkers condition)", p.queue_position);
    }
    // A step's loss is absent (not 0) when every example of it was left out as non-finite.
    let loss = p.loss.map_or_else(|| "absent".to_owned(), |l| format!("{l:.4} (non-DP)"));
    outln!(
        "  progress: step {}/{} eps spent {:.4} (composed {:.4}) at delta={:.3e} steps discarded {} checkpoint {} \
         loss {loss} non-finite examples {} dropped examples {} workers {}",
        p.step,
        view.steps(),
        p.epsilon_spent,
        p.epsilon_composed,
        view.contract.as_ref().map_or(0.0, |c| c.delta),
        p.steps_discarded,
        p.checkpoint_step,
        p.nonfinite_examples,
        p.dropped_examples,
        p.workers.join(",")
    );
    for c in &job.conditions {
        outln!("  {} {}: {}", c.r#type, c.reason, c.message);
    }
}

/// `dpctl submit FILE`.
pub async fn submit(server: &Server, file: &PathBuf, key: Option<String>, as_json: bool) -> Result<Job> {
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let base = std::fs::canonicalize(file).ok().and_then(|f| f.parent().map(Path::to_owned)).unwrap_or_default();
    let spec = SpecFile::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let spec = resolve_paths(spec, &base).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let spec = spec.into_proto().map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let job = server.connect().await?.submit(spec, key.unwrap_or_default()).await?;
    print_job(&job, as_json);
    Ok(job)
}

/// A spec's local paths (dataset, tokenizer, init_from) are read by the coordinator and the
/// workers, from their own working directories: a relative one is made absolute against the
/// spec file's directory, so that it names what its author meant. One that then names nothing
/// is refused here, before the coordinator reports "cannot open store", saying where it was
/// looked for and, when the path exists relative to the current directory instead, how to
/// write it.
pub fn resolve_paths(mut spec: SpecFile, base: &Path) -> Result<SpecFile> {
    let resolve = |field: &'static str, location: &mut String| -> Result<()> {
        let local = !location.contains("://") && !location.is_empty() && Path::new(location.as_str()).is_relative();
        if !local {
            return Ok(());
        }
        let resolved = base.join(location.as_str());
        if !resolved.exists() {
            let here = std::env::current_dir().map(|d| d.join(location.as_str())).ok().filter(|p| p.exists());
            let hint = match here.and_then(|p| std::fs::canonicalize(p).ok()) {
                Some(found) => format!(
                    "; {location} exists relative to the current directory: write it as {} (absolute) in the spec",
                    found.display()
                ),
                None => "; write the path relative to the spec file, or absolute".to_owned(),
            };
            anyhow::bail!(
                "{field}: {location} was resolved against the spec file's folder {}, and {} does not exist{hint}",
                base.display(),
                resolved.display()
            );
        }
        *location = normalized(&resolved).to_string_lossy().into_owned();
        Ok(())
    };
    resolve("dataset", &mut spec.dataset)?;
    if let Some(tokenizer) = spec.tokenizer.as_mut() {
        resolve("tokenizer", tokenizer)?;
    }
    if let Some(init) = spec.init_from.as_mut() {
        resolve("init_from", init)?;
    }
    Ok(spec)
}

/// `path` with its `.` and `..` components folded away (lexically: a symlink is kept as named,
/// so that every machine mounting the same path reads the same thing), so that one dataset is
/// named one way in specs, conditions and metrics however it was typed.
pub fn normalized(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => match out.components().next_back() {
                Some(Component::Normal(_)) => {
                    out.pop();
                }
                Some(Component::RootDir | Component::Prefix(_)) => {} // nothing is above the root
                _ => out.push(".."),
            },
            other => out.push(other),
        }
    }
    out
}

/// A gRPC status as an operator-facing error: the typed client error (its code, message and
/// what to do about a misconfiguration).
pub fn status(s: tonic::Status) -> anyhow::Error {
    ClientError::from(s).into()
}

/// `dpctl get ID`.
pub async fn get(server: &Server, job_id: &str, as_json: bool) -> Result<()> {
    let job = server.connect().await?.get(job_id).await?;
    print_job(&job, as_json);
    Ok(())
}

/// `dpctl list`.
pub async fn list(server: &Server, as_json: bool) -> Result<()> {
    let jobs = server.connect().await?.list().await?;
    if as_json {
        outln!("{}", serde_json::to_string_pretty(&jobs.iter().map(job_json).collect::<Vec<_>>())?);
        return Ok(());
    }
    outln!("{:<18} {:<17} {:>11} {:>16} {:<9} NAME", "JOB", "STATE", "STEP", "EPSILON", "DELTA");
    for job in jobs {
        let (view, p) = (View::of(&job), job.progress.clone().unwrap_or_default());
        let mut name = job.spec.as_ref().map(|s| s.name.clone()).unwrap_or_default();
        if view.privacy() != "dp" {
            name = format!("{name} [NOT PRIVATE: {}]", view.privacy());
        }
        outln!(
            "{:<18} {:<17} {:>5}/{:<5} {:>7.3}/{:<8.3} {:<9.2e} {name}",
            job.job_id,
            state_name(job.state),
            p.step,
            view.steps(),
            p.epsilon_spent,
            view.epsilon_target(),
            view.contract.as_ref().map_or(0.0, |c| c.delta)
        );
    }
    Ok(())
}

/// `dpctl cancel ID` (`resume: false`) and `dpctl resume ID` (`resume: true`).
pub async fn cancel_or_resume(server: &Server, job_id: &str, resume: bool) -> Result<()> {
    let mut client = server.connect().await?;
    let job = if resume { client.resume(job_id).await? } else { client.cancel(job_id).await? };
    outln!("job {} {}", job.job_id, state_name(job.state));
    Ok(())
}

/// Follows a job to its end; with `bar`, draws the progress bar. Returns the final job.
pub async fn follow(client: &mut JobsClient, job_id: &str, bar: bool) -> Result<Job> {
    let mut stream = client.watch(job_id).await?;
    // A bar on a terminal; piped or logged, one line per change of step or state instead.
    let lines = bar && !std::io::IsTerminal::is_terminal(&std::io::stderr());
    let progress = if bar && !lines { ProgressBar::new(1) } else { ProgressBar::hidden() };
    progress.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} steps {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    progress.enable_steady_tick(Duration::from_millis(250));
    let (mut last, mut printed) = (None, None);
    while let Some(job) = stream.message().await.map_err(status)? {
        let (view, p) = (View::of(&job), job.progress.clone().unwrap_or_default());
        progress.set_length(view.steps().max(1));
        progress.set_position(p.step);
        let loss = p.loss.map(|l| format!(" loss {l:.3} (non-DP)")).unwrap_or_default();
        let counts = match (p.nonfinite_examples, p.epsilon_composed) {
            (0, composed) if composed == p.epsilon_spent => String::new(),
            (nonfinite, composed) => format!(" composed {composed:.3}, non-finite examples {nonfinite}"),
        };
        let message = format!(
            "eps {:.3}/{:.3} at delta {:.1e}{counts}{loss} {:.0} ex/s eta {:.0}s {}",
            p.epsilon_spent,
            view.epsilon_target(),
            view.contract.as_ref().map_or(0.0, |c| c.delta),
            p.examples_per_second,
            p.eta_seconds,
            state_name(job.state).to_lowercase()
        );
        if lines && printed != Some((p.step, job.state)) {
            outln!("step {}/{} {message}", p.step, view.steps());
            printed = Some((p.step, job.state));
        }
        progress.set_message(message);
        last = Some(job);
    }
    progress.finish();
    let job = last.context("the watch stream ended without a job")?;
    if let Some(c) = job.conditions.last() {
        eprintln!("{} {}: {}", state_name(job.state), c.reason, c.message);
    }
    Ok(job)
}

/// `dpctl watch ID` and `dpctl wait ID`: the exit code tells the outcome.
pub async fn wait(server: &Server, job_id: &str, bar: bool) -> Result<i32> {
    let mut client = server.connect().await?;
    let job = follow(&mut client, job_id, bar).await?;
    if !dpcap_proto::job::is_terminal(job.state) {
        bail!("the watch stream of {job_id} ended while it is {}", state_name(job.state));
    }
    Ok(exit_code(&job))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dpcap_proto::v1::Condition;

    fn finished(state: JobState, reason: &str) -> Job {
        let condition = Condition { r#type: "Finished".into(), reason: reason.into(), ..Default::default() };
        Job { state: state as i32, conditions: vec![condition], ..Default::default() }
    }

    #[test]
    fn every_budget_end_exits_5_and_other_failures_3() {
        assert_eq!(exit_code(&finished(JobState::BudgetExhausted, "BudgetExhausted")), 5);
        assert_eq!(exit_code(&finished(JobState::Failed, dpcap_proto::job::BUDGET_REFUSED)), 5);
        assert_eq!(exit_code(&finished(JobState::Failed, "Refused")), 3);
        assert_eq!(exit_code(&finished(JobState::Succeeded, "Succeeded")), 0);
        assert_eq!(exit_code(&finished(JobState::Cancelled, "Cancelled")), 4);
    }

    #[test]
    fn a_specs_relative_path_is_resolved_without_dot_dot_so_one_dataset_has_one_name() {
        assert_eq!(normalized(Path::new("/r/deploy/jobs/../../data/./train")), Path::new("/r/data/train"));
        assert_eq!(normalized(Path::new("/../a")), Path::new("/a"), "nothing above the root");
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("data/train")).unwrap();
        std::fs::create_dir_all(dir.path().join("deploy/jobs")).unwrap();
        let spec = SpecFile::parse("dataset: ../../data/train\nmodel: micro\nepsilon: 8\n").unwrap();
        let base = std::fs::canonicalize(dir.path().join("deploy/jobs")).unwrap();
        let resolved = resolve_paths(spec, &base).unwrap();
        let expected = std::fs::canonicalize(dir.path().join("data/train")).unwrap();
        assert_eq!(resolved.dataset, expected.to_string_lossy());
    }
}
