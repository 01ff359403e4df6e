//! The scheduler's pure transitions: FIFO gang allocation, lease expiry re-forming a group,
//! the step barrier, and outcomes.

use super::common;

use std::time::{Duration, Instant};

use common::{done, job, running, submit, worker};
use dpcap_coordinator::{JobSecret, PoissonSampler};
use dpcap_coordinator::{REPLACEMENT_GRACE, Report, State};
use dpcap_dataset::index::Layout;
use dpcap_proto::v1::{JobState, StepOutcome};

#[test]
fn a_job_waiting_for_workers_to_arrive_says_so_and_lets_a_job_that_fits_run_beside_it() {
    let mut state = State::default();
    submit(&mut state, job("a", 2, 5));
    submit(&mut state, job("b", 1, 5));
    worker(&mut state, "w1");
    state.schedule();
    assert!(!running(&state, "a"), "a needs 2 workers and 1 is registered");
    let waiting = state.jobs["a"].job.conditions.iter().find(|c| c.reason == "WaitingForWorkers").unwrap();
    assert_eq!(waiting.message, "waiting for 2 workers (1 registered, 1 free)");
    assert!(running(&state, "b"), "b fits, and takes no worker a could have had");
    worker(&mut state, "w2");
    state.schedule();
    let waiting = state.jobs["a"].job.conditions.iter().rfind(|c| c.reason == "WaitingForWorkers").unwrap();
    assert_eq!(waiting.message, "waiting for 2 workers (2 registered, 1 free)", "b holds w1");
    state.schedule();
    worker(&mut state, "w3");
    state.schedule();
    assert!(running(&state, "a"));
    let group = state.jobs["a"].group.as_ref().unwrap();
    assert_eq!((group.members.len(), group.generation), (2, 1));
    assert!(
        state.jobs["b"].group.as_ref().unwrap().members.iter().all(|m| !group.members.contains(m)),
        "no worker in two groups"
    );
    let said = state.jobs["a"].job.conditions.iter().filter(|c| c.reason == "WaitingForWorkers").count();
    assert_eq!(said, 1, "one condition, updated as the reason changes: conditions never grow while waiting");
}

#[test]
fn a_job_needing_more_workers_than_are_registered_is_warned_at_submit_and_shows_its_queue_position() {
    let mut state = State::default();
    worker(&mut state, "w1");
    worker(&mut state, "w2");
    submit(&mut state, job("a", 5, 5));
    state.warn_short("a");
    submit(&mut state, job("b", 3, 5));
    state.warn_short("b");
    state.schedule();
    let warned = state.jobs["a"].job.conditions.iter().find(|c| c.reason == "NotEnoughWorkers").unwrap();
    assert_eq!(warned.r#type, "Warning");
    assert!(warned.message.contains("needs 5 workers and 2 are registered") && warned.message.contains("backfill"));
    let positions: Vec<u32> =
        ["a", "b"].iter().map(|id| state.view(id).unwrap().progress.unwrap_or_default().queue_position).collect();
    assert_eq!(positions, [1, 2], "queued jobs show their place");
    submit(&mut state, job("c", 2, 5));
    state.warn_short("c");
    state.schedule();
    assert!(running(&state, "c"), "c fits the registered workers: backfilled beside a and b");
    assert!(state.jobs["c"].job.conditions.iter().all(|c| c.reason != "NotEnoughWorkers"), "c was not short");
    assert_eq!(state.view("c").unwrap().progress.unwrap_or_default().queue_position, 0, "running: not queued");
}

/// Job a runs on w1 and w2, job b (one worker) queues behind it, and w2's lease lapses: a is
/// requeued at the head, with w1 free.
fn a_loses_a_worker_with_b_queued() -> State {
    let mut state = State::default();
    submit(&mut state, job("a", 2, 5));
    worker(&mut state, "w1");
    worker(&mut state, "w2");
    state.schedule();
    assert!(running(&state, "a"));
    submit(&mut state, job("b", 1, 5));
    state.workers.get_mut("w2").unwrap().last_seen = Instant::now() - Duration::from_secs(60);
    state.reap(Duration::from_secs(10));
    state
}

#[test]
fn a_job_requeued_after_losing_a_worker_is_not_overtaken_while_it_waits_for_a_replacement() {
    let mut state = a_loses_a_worker_with_b_queued();
    state.schedule();
    assert!(!running(&state, "a") && !running(&state, "b"), "w1 stays free for a's re-formed group");
    worker(&mut state, "w3");
    state.schedule();
    assert!(running(&state, "a") && !running(&state, "b"));
}

#[test]
fn a_worker_gone_for_good_holds_the_queue_only_for_the_replacement_grace() {
    let mut state = a_loses_a_worker_with_b_queued();
    assert!(!running(&state, "b"), "within the grace, b leaves w1 to a's re-formed group");
    let lost = Instant::now() - REPLACEMENT_GRACE - Duration::from_secs(1);
    state.jobs.get_mut("a").unwrap().requeued_at = Some(lost);
    state.reap(Duration::from_secs(10));
    assert!(running(&state, "b") && !running(&state, "a"), "past it, b runs beside the waiting a");
}

#[test]
fn a_head_waiting_for_busy_workers_is_never_overtaken() {
    let mut state = State::default();
    submit(&mut state, job("c", 1, 5));
    worker(&mut state, "w1");
    state.schedule();
    assert!(running(&state, "c"));
    submit(&mut state, job("a", 2, 5));
    submit(&mut state, job("b", 1, 5));
    worker(&mut state, "w2");
    state.schedule();
    assert!(!running(&state, "a") && !running(&state, "b"), "w2 is a's once c frees w1: b must not take it");
    state.finish("c", JobState::Succeeded, "Succeeded", "done".into());
    assert!(running(&state, "a") && !running(&state, "b"));
}

#[test]
fn an_expired_lease_requeues_the_job_at_the_head_and_re_forms_its_group() {
    let mut state = State::default();
    submit(&mut state, job("a", 2, 5));
    worker(&mut state, "w1");
    worker(&mut state, "w2");
    state.schedule();
    state.workers.get_mut("w2").unwrap().last_seen = Instant::now() - Duration::from_secs(60);
    state.reap(Duration::from_secs(10));
    assert_eq!(state.jobs["a"].job.state, JobState::Pending as i32);
    assert!(state.jobs["a"].job.conditions.iter().any(|c| c.reason == "LeaseExpired"));
    assert!(state.workers["w1"].job.is_none(), "the survivor is freed");
    worker(&mut state, "w3");
    state.schedule();
    assert!(running(&state, "a"));
    assert_eq!(state.jobs["a"].group.as_ref().unwrap().generation, 2);
}

#[test]
fn a_retried_report_of_a_completed_step_is_already_counted_and_other_steps_are_refused() {
    let mut state = State::default();
    submit(&mut state, job("a", 2, 3));
    worker(&mut state, "w1");
    worker(&mut state, "w2");
    state.schedule();
    state.jobs.get_mut("a").unwrap().group.as_mut().unwrap().step = Some(0);
    let generation = state.jobs["a"].group.as_ref().unwrap().generation;
    let members = state.jobs["a"].group.as_ref().unwrap().members.clone();
    assert_eq!(state.reporting_rank("a", &members[1], (generation, 0), false).unwrap(), Some(1));
    state.work_for("a", 0);
    state.report("a", 0, &done());
    state.report("a", 1, &done());
    // Rank 1's answer was lost and it retries step 0 after the step completed.
    assert_eq!(
        state.reporting_rank("a", &members[1], (generation, 0), false).unwrap(),
        None,
        "a duplicate, not an error"
    );
    assert_eq!(state.reporting_rank("a", &members[0], (generation, 1), false).unwrap(), Some(0));
    for (worker, generation, step) in [(&members[0], generation, 2), (&members[0], generation + 1, 1)] {
        assert!(
            state.reporting_rank("a", worker, (generation, step), false).is_err(),
            "{worker} g{generation} s{step}"
        );
    }
    assert!(state.reporting_rank("a", "w-stranger", (generation, 1), false).is_err());
}

#[test]
fn a_step_completes_when_every_rank_reports_and_the_job_succeeds_after_its_last_step() {
    let mut state = State::default();
    submit(&mut state, job("a", 2, 2));
    worker(&mut state, "w1");
    worker(&mut state, "w2");
    state.schedule();
    state.jobs.get_mut("a").unwrap().group.as_mut().unwrap().step = Some(0);
    let (step, units0) = state.work_for("a", 0).unwrap();
    let (_, units1) = state.work_for("a", 1).unwrap();
    assert_eq!(step, 0);
    let mut sampled: Vec<(usize, u64)> =
        units0.iter().chain(&units1).flat_map(|u| u.unit.indices.iter().map(move |&i| (u.unit.shard, i))).collect();
    sampled.sort_unstable();
    let expected: Vec<(usize, u64)> =
        state.jobs["a"].sampler.sample(0).iter().map(|&g| Layout::from_counts(&[50, 50]).locate(g).unwrap()).collect();
    assert_eq!(sampled, expected, "the ranks' units are exactly the step's Poisson sample");
    state.report("a", 0, &done());
    assert_eq!(state.jobs["a"].job.progress.as_ref().unwrap().step, 0, "one rank is not enough");
    state.report("a", 1, &done());
    assert_eq!(state.jobs["a"].job.progress.as_ref().unwrap().step, 1);
    state.work_for("a", 0);
    state.report("a", 0, &done());
    let effects = state.report("a", 1, &done());
    assert_eq!(state.jobs["a"].job.state, JobState::Succeeded as i32);
    assert_eq!(effects.close.len(), 1, "the accountant is told");
    assert!(state.workers.values().all(|w| w.job.is_none()));
}

#[test]
fn releases_are_trimmed_only_once_every_rank_has_applied_the_checkpointed_step() {
    let mut state = State::default();
    submit(&mut state, job("a", 2, 5));
    worker(&mut state, "w1");
    worker(&mut state, "w2");
    state.schedule();
    state.jobs.get_mut("a").unwrap().group.as_mut().unwrap().step = Some(0);
    state.work_for("a", 0);
    let checkpointed = Report { checkpoint_step: 1, ..done() };
    let effects = state.report("a", 0, &checkpointed);
    assert!(effects.trim.is_empty(), "rank 1 may not have fetched release 0 yet: {effects:?}");
    let effects = state.report("a", 1, &done());
    assert_eq!(effects.trim, vec![("a".to_owned(), 1)]);
    // A discarded step moves the group on like a released one.
    state.work_for("a", 0);
    let discarded = Report { outcome: StepOutcome::Discarded, ..done() };
    state.report("a", 0, &discarded);
    state.report("a", 1, &discarded);
    assert_eq!(state.jobs["a"].job.progress.as_ref().unwrap().step, 2);
}

#[test]
fn only_rank_zeros_checkpoint_lets_releases_be_trimmed_and_a_completed_step_reads_the_ledgers_spend() {
    let mut state = State::default();
    submit(&mut state, job("a", 2, 5));
    worker(&mut state, "w1");
    worker(&mut state, "w2");
    state.schedule();
    state.jobs.get_mut("a").unwrap().group.as_mut().unwrap().step = Some(0);
    state.work_for("a", 0);
    // Rank 1 writes no checkpoints: its word is no reason to delete releases.
    state.report("a", 0, &done());
    let effects = state.report("a", 1, &Report { checkpoint_step: 1, ..done() });
    assert!(effects.trim.is_empty(), "{effects:?}");
    assert_eq!(effects.spend, vec!["a".to_owned()], "the step's epsilon comes from the accountant");
    assert_eq!(state.jobs["a"].job.progress.as_ref().unwrap().checkpoint_step, 0);
}

#[test]
fn a_failed_or_cancelled_job_is_suspended_at_the_accountant_at_its_generation_and_an_ended_one_closed() {
    use dpcap_coordinator::Closing;
    let mut state = State::default();
    submit(&mut state, job("a", 1, 5));
    submit(&mut state, job("b", 1, 5));
    worker(&mut state, "w1");
    state.schedule();
    let failed = state.finish("a", JobState::Failed, "WorkerFailed", "rank 0: data".into());
    let closing =
        |job: &str, resumable, generation| Closing { job_id: job.into(), reason: "".into(), resumable, generation };
    assert_eq!(failed.close.len(), 1);
    assert_eq!(Closing { reason: String::new(), ..failed.close[0].clone() }, closing("a", true, 1));
    assert_eq!(failed.spend, vec!["a".to_owned()], "the ledger's charged steps are read once nothing more is charged");
    let done = state.finish("b", JobState::Succeeded, "Succeeded", "5 steps done".into());
    assert_eq!(Closing { reason: String::new(), ..done.close[0].clone() }, closing("b", false, 1), "closed for good");
}

#[test]
fn a_group_dissolved_by_a_lost_worker_has_its_generation_revoked_before_the_next_one_forms() {
    let mut state = State::default();
    submit(&mut state, job("a", 1, 5));
    worker(&mut state, "w1");
    state.schedule();
    state.workers.get_mut("w1").unwrap().last_seen = Instant::now() - Duration::from_secs(60);
    worker(&mut state, "w2");
    let effects = state.reap(Duration::from_secs(10));
    assert_eq!(effects.fence, vec![("a".to_owned(), 2)], "generation 1 is refused from now on: {effects:?}");
    assert_eq!(state.jobs["a"].group.as_ref().map(|g| g.generation), Some(2), "the new group is generation 2");
    let left = state.leave("w2");
    assert_eq!(left.fence, vec![("a".to_owned(), 3)], "{left:?}");
}

#[test]
fn a_step_whose_every_example_was_left_out_shows_no_loss_rather_than_zero_or_the_last_one() {
    let mut state = State::default();
    submit(&mut state, job("a", 1, 5));
    worker(&mut state, "w1");
    state.schedule();
    state.jobs.get_mut("a").unwrap().group.as_mut().unwrap().step = Some(0);
    state.work_for("a", 0);
    state.report("a", 0, &done());
    assert_eq!(state.jobs["a"].job.progress.as_ref().unwrap().loss, Some(2.0));
    state.work_for("a", 0);
    state.report("a", 0, &Report { loss: None, nonfinite_examples: 3, ..done() });
    let progress = state.jobs["a"].job.progress.clone().unwrap();
    assert_eq!((progress.loss, progress.loss_first), (None, Some(2.0)), "{progress:?}");
}

#[test]
fn a_rank_may_fail_its_job_before_the_group_has_a_step_but_not_report_one_done() {
    let mut state = State::default();
    submit(&mut state, job("a", 1, 5));
    worker(&mut state, "w1");
    state.schedule();
    assert_eq!(state.reporting_rank("a", "w1", (1, 0), true).unwrap(), Some(0), "a session that could not start");
    assert!(state.reporting_rank("a", "w1", (1, 0), false).is_err(), "no step is done before the group has one");
}

#[test]
fn a_nonfinite_count_adds_up_over_ranks_and_steps() {
    let mut state = State::default();
    submit(&mut state, job("a", 2, 5));
    worker(&mut state, "w1");
    worker(&mut state, "w2");
    state.schedule();
    state.jobs.get_mut("a").unwrap().group.as_mut().unwrap().step = Some(0);
    state.work_for("a", 0);
    state.report("a", 0, &Report { nonfinite_examples: 2, ..done() });
    state.report("a", 1, &Report { nonfinite_examples: 1, ..done() });
    assert_eq!(state.jobs["a"].job.progress.as_ref().unwrap().nonfinite_examples, 3);
}

#[test]
fn a_rank_counts_no_more_than_it_was_assigned_and_a_strict_job_shows_its_counts_only_at_its_end() {
    let mut state = State::default();
    submit(&mut state, job("a", 1, 5));
    worker(&mut state, "w1");
    state.schedule();
    state.jobs.get_mut("a").unwrap().group.as_mut().unwrap().step = Some(0);
    let (_, units) = state.work_for("a", 0).unwrap();
    let assigned: u64 = units.iter().map(|u| u.unit.indices.len() as u64).sum();
    state.report("a", 0, &Report { dropped_examples: u64::MAX, nonfinite_examples: u64::MAX, ..done() });
    let progress = state.jobs["a"].job.progress.clone().unwrap();
    assert_eq!((progress.dropped_examples, progress.nonfinite_examples), (assigned, assigned));
    assert_eq!(state.jobs["a"].job.conditions.iter().filter(|c| c.reason == "ExamplesDropped").count(), 1);

    let mut strict = job("s", 1, 5);
    strict.job.spec = Some(dpcap_proto::v1::JobSpec {
        telemetry: dpcap_proto::v1::TelemetryMode::Strict as i32,
        ..Default::default()
    });
    submit(&mut state, strict);
    state.finish("a", JobState::Succeeded, "Succeeded", "done".into());
    assert!(running(&state, "s"));
    state.jobs.get_mut("s").unwrap().group.as_mut().unwrap().step = Some(0);
    state.work_for("s", 0).unwrap();
    state.report("s", 0, &Report { dropped_examples: 1, ..done() });
    let shown = |state: &State| state.jobs["s"].job.progress.clone().unwrap_or_default().dropped_examples;
    assert_eq!(shown(&state), 0, "not per step: it would say when a damaged example was sampled");
    assert!(!state.jobs["s"].job.conditions.iter().any(|c| c.reason == "ExamplesDropped"));
    state.finish("s", JobState::Cancelled, "Cancelled", "by the operator".into());
    assert_eq!(shown(&state), 1, "the total, at the end");
    assert!(state.jobs["s"].job.conditions.iter().any(|c| c.reason == "ExamplesDropped"));
}

#[test]
fn a_budget_refusal_ends_the_job_budget_exhausted_not_failed() {
    let mut state = State::default();
    submit(&mut state, job("a", 1, 9));
    worker(&mut state, "w1");
    state.schedule();
    state.jobs.get_mut("a").unwrap().group.as_mut().unwrap().step = Some(0);
    let refused = Report { outcome: StepOutcome::BudgetExhausted, message: "budget exhausted".into(), ..done() };
    state.report("a", 0, &refused);
    assert_eq!(state.jobs["a"].job.state, JobState::BudgetExhausted as i32);
}

#[test]
fn the_plan_calibrates_sigma_for_the_target_and_defaults_delta_to_one_over_n() {
    use dpcap_proto::spec::SpecFile;
    let spec = SpecFile {
        dataset: "/d".into(),
        model: "micro".into(),
        epsilon: Some(8.0),
        batch_size: Some(1000),
        epochs: Some(3.0),
        ..Default::default()
    };
    let checked = dpcap_coordinator::check_fields(&spec.into_proto().unwrap()).unwrap();
    let population = dpcap_coordinator::Population::of(20_000);
    let (plan, terms) = dpcap_coordinator::plan(&checked, population).unwrap();
    assert_eq!(terms.steps, 60, "epochs / q");
    assert!((terms.sample_rate - 0.05).abs() < 1e-12 && (terms.sample_rate * 20_000.0 - 1000.0).abs() < 1e-9);
    assert!((terms.delta - 1.0 / 20_000.0).abs() < 1e-15);
    assert!(plan.calibrated && plan.epsilon_planned <= 8.0 && plan.epsilon_planned > 7.9, "{plan:?}");
}

#[test]
fn a_dp_jobs_delta_above_one_over_n_is_refused_naming_delta_n_and_the_largest_allowed() {
    use dpcap_proto::spec::SpecFile;
    let spec = |delta: f64, mode: Option<&str>| SpecFile {
        dataset: "/d".into(),
        model: "micro".into(),
        epsilon: Some(8.0),
        delta: Some(delta),
        batch_size: Some(60),
        steps: Some(10),
        privacy: mode.map(str::to_owned),
        ..Default::default()
    };
    let plan = |spec: SpecFile, population| {
        let checked = dpcap_coordinator::check_fields(&spec.into_proto().unwrap()).unwrap();
        dpcap_coordinator::plan(&checked, population)
    };
    let refused = plan(spec(0.01, None), dpcap_coordinator::Population::of(600)).unwrap_err().to_string();
    assert!(refused.starts_with("invalid delta: 1e-2 is above 1/N = 1.6666666666666668e-3 for N = 600"), "{refused}");
    assert!(refused.contains("the largest delta allowed is 1.6666666666666668e-3"), "{refused}");
    let (_, terms) = plan(spec(1.0 / 600.0, None), dpcap_coordinator::Population::of(600)).unwrap();
    assert_eq!(terms.delta, 1.0 / 600.0, "1/N itself runs");
    // A user-level job is held to 1/N_users, though its clients are fewer.
    let users = dpcap_coordinator::Population { units: 60, default_delta: 1.0 / 6000.0 };
    assert!(plan(spec(1.0 / 600.0, None), users).unwrap_err().to_string().contains("above 1/N = 1.666666666666666"));
    // A baseline makes no claim at delta.
    let baseline = SpecFile { epsilon: None, ..spec(0.01, Some("not_private")) };
    assert!(plan(baseline, dpcap_coordinator::Population::of(600)).is_ok());
}

#[test]
fn every_example_job_spec_in_deploy_parses_and_passes_field_checks() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/jobs");
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let spec = dpcap_proto::spec::SpecFile::parse(&text)
            .and_then(|s| s.into_proto())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        dpcap_coordinator::check_fields(&spec).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        seen += 1;
    }
    assert!(seen >= 4, "demo, DP-Cap base, ViP MAE and TAN simulation specs");
}

#[test]
fn shares_stay_even_whatever_a_rank_reports_of_its_speed_and_each_is_counted_for_its_grant() {
    let mut state = State::default();
    let mut entry = job("a", 2, 9);
    entry.sampler = PoissonSampler::new(JobSecret([3; 32]), 100, 0.6).unwrap();
    submit(&mut state, entry);
    worker(&mut state, "w1");
    worker(&mut state, "w2");
    state.schedule();
    state.jobs.get_mut("a").unwrap().group.as_mut().unwrap().step = Some(0);
    let count = |units: Vec<dpcap_coordinator::ClientUnit>| units.iter().map(|u| u.unit.indices.len()).sum::<usize>();
    let shares = |state: &mut State| {
        let counts = (count(state.work_for("a", 0).unwrap().1), count(state.work_for("a", 1).unwrap().1));
        let group = state.jobs["a"].group.as_ref().unwrap();
        assert_eq!(group.shares, [counts.0 as u64, counts.1 as u64], "the grants state what each rank was given");
        assert_eq!(group.sampled, (counts.0 + counts.1) as u64);
        counts
    };
    let (n0, n1) = shares(&mut state);
    assert!(n0.abs_diff(n1) <= 1, "an even split: {n0} vs {n1}");
    // Rank 0 claims to be a thousand times faster than rank 1: its share does not move.
    state.report("a", 0, &Report { phases: [0.001, 0.0, 0.0, 0.0, 0.0], ..done() });
    state.report("a", 1, &Report { phases: [1.0, 0.0, 0.0, 0.0, 0.0], ..done() });
    let (m0, m1) = shares(&mut state);
    assert!(m0.abs_diff(m1) <= 1, "still even at step 1: {m0} vs {m1}");
}

#[test]
fn an_ended_job_is_shown_to_watchers_only_once_the_effects_of_its_end_are_settled() {
    let mut state = State::default();
    submit(&mut state, job("a", 1, 5));
    worker(&mut state, "w1");
    state.schedule();
    let (before, _) = state.jobs["a"].shown().expect("a running job is shown");
    let effects = state.finish("a", JobState::Succeeded, "Succeeded", "5 steps done".into());
    assert_eq!(effects.close.iter().map(|c| c.job_id.as_str()).collect::<Vec<_>>(), ["a"]);
    assert!(state.jobs["a"].shown().is_none(), "not shown ended before it is closed and audited");
    state.settled(&["a".into()]);
    let (after, shown) = state.jobs["a"].shown().expect("shown once settled");
    assert!(after > before, "a new version wakes the watchers: {before} -> {after}");
    assert_eq!(shown.state, JobState::Succeeded as i32);
}

#[test]
fn a_job_that_ends_again_while_its_first_end_settles_is_shown_only_after_both() {
    let mut state = State::default();
    submit(&mut state, job("a", 1, 5));
    worker(&mut state, "w1");
    state.schedule();
    state.finish("a", JobState::Cancelled, "Cancelled", "by the operator".into());
    // Resumed and failed before the cancel's effects were done: two ends in flight.
    state.finish("a", JobState::Failed, "WorkerFailed", "a rank failed".into());
    state.settled(&["a".into()]);
    assert!(state.jobs["a"].shown().is_none(), "the second end's close and audit are still running");
    state.settled(&["a".into()]);
    assert_eq!(state.jobs["a"].shown().map(|(_, job)| job.state), Some(JobState::Failed as i32));
}
