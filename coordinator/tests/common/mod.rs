//! Builders shared by the coordinator's state tests.
#![allow(dead_code)]

use std::time::Instant;

use dpcap_coordinator::{JobEntry, Report, State, WorkerEntry};
use dpcap_coordinator::{JobSecret, PoissonSampler};
use dpcap_dataset::index::Layout;
use dpcap_privacy::AccountantKind;
use dpcap_privacy::contract::{Mechanism, Mode, PrivacyContract, PrivacyUnit};
use dpcap_proto::v1::{Job, JobState, Plan, StepOutcome};

/// A DP contract at q = 0.2 over `steps` planned steps.
pub fn contract(steps: u64) -> PrivacyContract {
    PrivacyContract {
        mechanism: Mechanism { sample_rate: 0.2, noise_multiplier: 1.0, clipping_norm: 1.0 },
        accountant: AccountantKind::Pld,
        delta: 1e-5,
        epsilon_target: Some(8.0),
        mode: Mode::Dp,
        unit: PrivacyUnit::Example,
        dataset_id: String::new(),
        data_id: String::new(),
        shards_id: String::new(),
        audit: None,
        init_from_job: None,
        planned_steps: steps,
    }
}

/// A pending job entry with W = `workers` over 100 examples at q = 0.2.
pub fn job(id: &str, workers: u32, steps: u64) -> JobEntry {
    let contract = contract(steps);
    JobEntry {
        job: Job {
            job_id: id.into(),
            state: JobState::Pending as i32,
            plan: Some(Plan {
                workers,
                examples: 100,
                checkpoint_interval: 10,
                contract: Some(dpcap_proto::contract::contract_to_proto(&contract)),
                ..Default::default()
            }),
            ..Default::default()
        },
        contract,
        sampler: PoissonSampler::new(JobSecret([7; 32]), 100, 0.2).unwrap(),
        layout: Layout::from_counts(&[50, 50]),
        clients: None,
        group: None,
        phase_seconds: [0.0; 5],
        phase_reports: 0,
        version: 0,
        held: Default::default(),
        requeued_at: None,
        settling: 0,
    }
}

pub fn worker(state: &mut State, id: &str) {
    worker_on(state, id, "cpu");
}

/// Registers worker `id` with `device` ("cpu", "cuda:0").
pub fn worker_on(state: &mut State, id: &str, device: &str) {
    state.workers.insert(
        id.into(),
        WorkerEntry {
            name: id.into(),
            device: device.into(),
            last_seen: Instant::now(),
            job: None,
            key: format!("key-of-{id}"),
        },
    );
}

pub fn submit(state: &mut State, entry: JobEntry) {
    state.queue.push_back(entry.job.job_id.clone());
    state.jobs.insert(entry.job.job_id.clone(), entry);
}

pub fn running(state: &State, id: &str) -> bool {
    state.jobs[id].job.state == JobState::Running as i32
}

pub fn done() -> Report {
    Report {
        outcome: StepOutcome::Done,
        message: String::new(),
        examples: 3,
        loss: Some(2.0),
        phases: [0.1; 5],
        checkpoint_step: 0,
        nonfinite_examples: 0,
        dropped_examples: 0,
    }
}
