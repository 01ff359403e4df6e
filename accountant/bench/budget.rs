//! What a dataset's budget checks cost as its history grows, measured on the real thing: an
//! accountant server in this process on loopback, a sweep of jobs submitted one after another
//! to one budgeted dataset, each admitted (timed), run for its steps (timed) and closed; then the
//! ledger replayed by a new accountant (timed, with the memory it took), and the budget check of
//! one more job's step timed three ways: by its reservation, by the RDP bound, and by the exact
//! composition of the whole history.
//! `dpctl bench budget` reports it.
//!
//! Benchmark code, not service code: nothing in the service calls it.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use dpcap_proto::client::PartKey;
use dpcap_proto::floats;
use dpcap_proto::v1::{
    AccountantKind, CloseJobRequest, Mechanism, Privacy, PrivacyContract, RegisterJobRequest, SetDatasetBudgetRequest,
};
use dpcap_serve::{Capabilities, Capability, StepGrant};

use crate::core::Accountant;
use crate::cost::{BenchError, Running, Writer, median, rss_bytes, start};
use crate::privacy::{self, Segment};
use crate::records::{BudgetKey, Registration};
use crate::{Policy, server};

/// The sweep's dataset (its digest; the bench has no data).
const DATASET: &str = "sha256:5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed";
/// Coordinates of each step's part: the check, not the release, is measured.
const PARAMS: u64 = 16;
/// Timed repetitions of each check of the probe job.
const CHECKS: usize = 21;

/// The sweep to measure.
#[derive(Debug, Clone, Copy)]
pub struct SweepOptions {
    /// Jobs submitted one after another.
    pub jobs: u64,
    /// Steps each job plans and runs.
    pub steps: u64,
    /// Sampling rate q of every job.
    pub sample_rate: f64,
    /// σ of every job (a noise multiplier), or of the first when `distinct`.
    pub noise_multiplier: f64,
    /// Each job its own σ (σ · (1 + i/1000)): a history of as many mechanisms as jobs.
    pub distinct: bool,
    /// δ of the budget and of every job.
    pub delta: f64,
    /// The dataset's lifetime ε at δ.
    pub budget: f64,
    /// Each job's own ε target at δ.
    pub target: f64,
}

/// What the sweep cost (seconds; bytes of resident memory).
#[derive(Debug, Clone, Serialize)]
pub struct SweepCost {
    /// Admission (RegisterJob) latency: median, worst, and median of the last ten.
    pub admission_median_s: f64,
    /// The slowest admission.
    pub admission_worst_s: f64,
    /// Median of the last ten admissions.
    pub admission_last10_median_s: f64,
    /// A step's part → its release, median over the first ten jobs' steps.
    pub step_first10_median_s: f64,
    /// The same over the last ten jobs' steps.
    pub step_last10_median_s: f64,
    /// Resident memory grown over the sweep (the server and this client in one process).
    pub sweep_rss_growth_bytes: i64,
    /// Resident memory grown from the tenth job's end to the last's: what the history adds,
    /// past the first jobs' one-time allocations (pools, runtimes, the first curve).
    pub history_rss_growth_bytes: i64,
    /// A new accountant's replay of the sweep's ledger.
    pub replay_s: f64,
    /// Resident memory grown by the replay.
    pub replay_rss_growth_bytes: i64,
    /// The next step's budget check of one more job, within its reserved plan.
    pub check_reservation_s: f64,
    /// The same check with the reservation forgotten: the RDP bound of the whole history.
    pub check_bound_s: f64,
    /// The exact (PLD) composition of the whole history: what a check near the boundary waits for.
    pub check_composition_s: f64,
    /// ε spent of the budget after the sweep (PLD, at its δ).
    pub epsilon_spent: f64,
}

/// Job `i`'s σ.
fn sigma(opts: &SweepOptions, i: u64) -> f64 {
    if opts.distinct { opts.noise_multiplier * (1.0 + i as f64 / 1000.0) } else { opts.noise_multiplier }
}

fn contract(opts: &SweepOptions, i: u64) -> PrivacyContract {
    PrivacyContract {
        mechanism: Some(Mechanism {
            sample_rate: opts.sample_rate,
            noise_multiplier: sigma(opts, i),
            clipping_norm: 1.0,
        }),
        delta: opts.delta,
        epsilon_target: opts.target,
        accountant: AccountantKind::Pld as i32,
        privacy: Privacy::Dp as i32,
        dataset_id: DATASET.into(),
        planned_steps: opts.steps,
        ..Default::default()
    }
}

/// The step capability of job `job_id`'s one rank for `step`.
fn grant(job_id: &str, step: u64) -> String {
    let capability = Capability {
        job_id: job_id.into(),
        rank: 0,
        generation: 0,
        group: 0,
        parts: 1,
        expires_unix_ms: u64::MAX,
        step: Some(StepGrant { step, sampled: 1, units: 1 }),
    };
    Capabilities::new(None).issue(&capability)
}

/// Runs the sweep on a ledger under `dir` and measures it (see the module docs).
pub async fn measure(opts: &SweepOptions, dir: &Path) -> Result<SweepCost, BenchError> {
    let rss_before = rss_bytes();
    let Running { mut client, capability, stop, task } = start(dir, Writer::Synced, Policy::default(), false).await?;
    let budget = SetDatasetBudgetRequest {
        dataset_id: DATASET.into(),
        epsilon: opts.budget,
        delta: opts.delta,
        reason: "bench budget".into(),
        name: "sweep".into(),
        population: (1.0 / opts.delta).round() as u64,
        ..Default::default()
    };
    // The accountant answers UNAVAILABLE until it has replayed its (empty) ledger.
    let policy = dpcap_proto::RetryPolicy { deadline: Duration::from_secs(30), ..Default::default() };
    dpcap_proto::retry(policy, "set budget", || {
        let (mut client, budget) = (client.clone(), budget.clone());
        async move { client.raw().set_dataset_budget(budget).await }
    })
    .await?;
    let part = floats::into_bytes((0..PARAMS).map(|i| (i % 7) as f32 * 1e-2).collect());
    let (mut admissions, mut steps, mut rss_after_10) = (Vec::new(), Vec::new(), 0);
    for i in 0..opts.jobs {
        let job_id = format!("sweep-{i:05}");
        let register = RegisterJobRequest {
            job_id: job_id.clone(),
            contract: Some(contract(opts, i)),
            gradient_dim: PARAMS,
            insecure_noise_seed: None,
        };
        let started = Instant::now();
        client.raw().register_job(register).await?;
        admissions.push(started.elapsed().as_secs_f64());
        for step in 0..opts.steps {
            let grant = grant(&job_id, step);
            capability.set(grant.clone());
            let started = Instant::now();
            let key = PartKey { step, part: 0, attempt: 0 };
            let released = client.submit_bytes(&job_id, key, &grant, part.clone()).await?;
            if !released.released {
                return Err(format!("step {step} of {job_id} was not released: {released:?}").into());
            }
            steps.push((i, started.elapsed().as_secs_f64()));
        }
        let close = CloseJobRequest { job_id: job_id.clone(), reason: "succeeded".into(), ..Default::default() };
        client.raw().close_job(close).await?;
        if i + 1 == opts.jobs.min(10) {
            rss_after_10 = rss_bytes();
        }
    }
    let rss_after = rss_bytes();
    let (sweep_rss_growth_bytes, history_rss_growth_bytes) =
        (rss_after as i64 - rss_before as i64, rss_after as i64 - rss_after_10 as i64);
    let _ = stop.send(());
    task.await??;

    let (replayed, replay_s, replay_rss_growth_bytes) = replay(dir).await?;
    let checks = time_checks(&replayed, opts).await?;
    let last10 = admissions[admissions.len().saturating_sub(10)..].to_vec();
    let step_median =
        |keep: &dyn Fn(u64) -> bool| median(steps.iter().filter(|(i, _)| keep(*i)).map(|s| s.1).collect());
    Ok(SweepCost {
        admission_median_s: median(admissions.clone()),
        admission_worst_s: admissions.iter().copied().fold(0.0, f64::max),
        admission_last10_median_s: median(last10),
        step_first10_median_s: step_median(&|i| i < 10),
        step_last10_median_s: step_median(&|i| i + 10 >= opts.jobs),
        sweep_rss_growth_bytes,
        history_rss_growth_bytes,
        replay_s,
        replay_rss_growth_bytes,
        check_reservation_s: checks.reservation,
        check_bound_s: checks.bound,
        check_composition_s: checks.composition,
        epsilon_spent: checks.spent,
    })
}

/// A new accountant over the sweep's ledger, replayed: it, the seconds and the memory it took.
async fn replay(dir: &Path) -> Result<(Accountant, f64, i64), BenchError> {
    let rss_before = rss_bytes();
    let started = Instant::now();
    let accountant = Accountant::new(server::open_ledger(&dir.to_string_lossy())?, Policy::default());
    accountant.replay().await?;
    Ok((accountant, started.elapsed().as_secs_f64(), rss_bytes() as i64 - rss_before as i64))
}

/// Medians of each way a check is decided, and the ε spent.
struct Checks {
    reservation: f64,
    bound: f64,
    composition: f64,
    spent: f64,
}

/// Times the budget check of one more job's first step (see the module docs).
async fn time_checks(accountant: &Accountant, opts: &SweepOptions) -> Result<Checks, BenchError> {
    let registration = Registration {
        job_id: "probe".into(),
        contract: dpcap_proto::contract::contract_from_proto(contract(opts, opts.jobs))?,
        gradient_dim: PARAMS,
        insecure_noise_seed: None,
        legacy: false,
    };
    let (job, _) = accountant.register(registration).await?;
    let progress = job.progress();
    let timed = || async {
        let started = Instant::now();
        accountant.check_dataset(&job, 0, &progress).await?;
        Ok::<_, BenchError>(started.elapsed().as_secs_f64())
    };
    let mut reservation = Vec::new();
    for _ in 0..CHECKS {
        reservation.push(timed().await?);
    }
    let key = BudgetKey { dataset_id: DATASET.into(), unit: "example".into() };
    accountant.datasets.unreserve(&key);
    let mut bound = Vec::new();
    for _ in 0..CHECKS {
        bound.push(timed().await?);
    }
    let segments: Vec<Segment> = accountant.segments(&key, None);
    let delta = opts.delta;
    let started = Instant::now();
    let spent =
        tokio::task::spawn_blocking(move || privacy::epsilon(privacy::AccountantKind::Pld, &segments, delta)).await??;
    let composition = started.elapsed().as_secs_f64();
    Ok(Checks { reservation: median(reservation), bound: median(bound), composition, spent })
}
