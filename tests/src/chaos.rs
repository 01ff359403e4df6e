//! Fault injection: runs jobs on a real cluster (accountant, coordinator, two workers on
//! 127.0.0.1) and, at random points, SIGKILLs a random component and restarts it. After each
//! job it checks, from the stored ledger, the job store and the final checkpoint:
//! no step charged twice; charged = applied + discarded; ε spent ≤ target; the job SUCCEEDED.

use std::path::Path;
use std::time::{Duration, Instant};

use dpcap_ml::checkpoint::CheckpointStore;
use dpcap_proto::v1::JobState;

use crate::jobs::{ended, get, spec, spend, submit};
use crate::{Process, Services};

/// What a chaos campaign saw.
#[derive(Debug, Default, Clone)]
pub struct ChaosReport {
    /// Jobs run.
    pub runs: usize,
    /// Components killed (and restarted).
    pub kills: usize,
    /// Kills by component: accountant, coordinator, worker.
    pub kills_by_component: [usize; 3],
    /// Charged steps discarded over all runs.
    pub discarded: u64,
    /// Every broken invariant, with its run.
    pub violations: Vec<String>,
}

/// A small xorshift stream: the campaign is reproducible from its seed.
struct Dice(u64);

impl Dice {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Steps per chaos job.
const STEPS: u64 = 20;

/// Runs `runs` jobs with up to `max_kills` kills each over the synthetic `dataset`, every run in
/// its own directory under `base`.
pub async fn campaign(base: &Path, dataset: &Path, runs: usize, max_kills: u64, seed: u64) -> ChaosReport {
    let mut dice = Dice(seed.max(1));
    let mut report = ChaosReport::default();
    for run in 0..runs {
        let dir = base.join(format!("run-{run}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("run directory");
        let kills = 1 + dice.below(max_kills);
        if let Err(violation) = one_run(&dir, dataset, kills, &mut dice, &mut report).await {
            report.violations.push(format!("run {run}: {violation}"));
        }
        report.runs += 1;
        eprintln!("chaos: run {run} done; {} kills so far, {} violations", report.kills, report.violations.len());
    }
    report
}

async fn one_run(
    dir: &Path,
    dataset: &Path,
    kills: u64,
    dice: &mut Dice,
    report: &mut ChaosReport,
) -> Result<(), String> {
    let mut services = Services::start(dir).await;
    let mut workers = [
        Process::worker(&services.coordinator.grpc, "w0", dir),
        Process::worker(&services.coordinator.grpc, "w1", dir),
    ];
    let mut job_spec = spec(dataset, STEPS);
    job_spec.checkpoint_interval = Some(1 + dice.below(5));
    let job = submit(&services, job_spec).await;
    let running = Instant::now() + Duration::from_secs(120);
    while crate::jobs::step(&get(&services, &job.job_id).await) < 1 && Instant::now() < running {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut next_worker = 2;
    for _ in 0..kills {
        // Kills follow the job's progress, not the clock: 1 to 4 steps after the last one (or
        // the start), then a moment into the step, however fast steps are on this machine.
        let target = crate::jobs::step(&get(&services, &job.job_id).await) + 1 + dice.below(4);
        let waited = Instant::now() + Duration::from_secs(120);
        loop {
            let job = get(&services, &job.job_id).await;
            if ended(&job) || crate::jobs::step(&job) >= target || Instant::now() > waited {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(dice.below(400))).await;
        if ended(&get(&services, &job.job_id).await) {
            break;
        }
        let down = Duration::from_millis(dice.below(2000));
        let component = dice.below(3) as usize;
        match component {
            0 => services.restart_accountant(down).await,
            1 => services.restart_coordinator(down).await,
            _ => {
                let victim = dice.below(workers.len() as u64) as usize;
                workers[victim].kill();
                tokio::time::sleep(down).await;
                workers[victim] = Process::worker(&services.coordinator.grpc, &format!("w{next_worker}"), dir);
                next_worker += 1;
            }
        }
        report.kills += 1;
        report.kills_by_component[component] += 1;
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    let job = loop {
        let job = get(&services, &job.job_id).await;
        if ended(&job) {
            break job;
        }
        if Instant::now() > deadline {
            return Err(format!("job {} did not end: {job:?}", job.job_id));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    check(&services, &job, report).await
}

async fn check(services: &Services, job: &dpcap_proto::v1::Job, report: &mut ChaosReport) -> Result<(), String> {
    if job.state != JobState::Succeeded as i32 {
        return Err(format!("job ended {:?}: {:?}", JobState::try_from(job.state), job.conditions.last()));
    }
    let charged = services.charged_steps(&job.job_id);
    if charged != (0..STEPS).collect::<Vec<_>>() {
        return Err(format!("charged steps {charged:?}, expected each of 0..{STEPS} once"));
    }
    let spend = spend(services, &job.job_id).await;
    if spend.steps_charged != STEPS {
        return Err(format!("the accountant counts {} charges", spend.steps_charged));
    }
    if spend.epsilon_spent > spend.epsilon_target + 1e-9 {
        return Err(format!("epsilon {} > target {}", spend.epsilon_spent, spend.epsilon_target));
    }
    let checkpoints = CheckpointStore::open(&job.checkpoint_root).map_err(|e| e.to_string())?;
    let latest = checkpoints.latest().await.map_err(|e| e.to_string())?.ok_or("no final checkpoint")?;
    let manifest = checkpoints.load(latest).await.map_err(|e| e.to_string())?.0;
    let accounted = manifest.applied_steps + manifest.discarded_steps.len() as u64;
    if latest != STEPS || accounted != STEPS {
        return Err(format!(
            "charged {STEPS} != applied {} + discarded {:?}",
            manifest.applied_steps, manifest.discarded_steps
        ));
    }
    if manifest.discarded_steps != services.discarded_steps(&job.job_id) {
        return Err(format!(
            "model skipped {:?}, ledger discarded {:?}",
            manifest.discarded_steps,
            services.discarded_steps(&job.job_id)
        ));
    }
    report.discarded += manifest.discarded_steps.len() as u64;
    Ok(())
}
