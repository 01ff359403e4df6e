//! The reduction path and the NCCL rendezvous: all-CUDA groups reduce over NCCL (and keep doing
//! so), rank 0 publishes one id per generation, and a peer-lost report re-forms the group.

use super::common;

use common::{done, job, submit, worker, worker_on};
use dpcap_coordinator::CoordinatorError;
use dpcap_coordinator::{NCCL_ID_BYTES, exchange};
use dpcap_coordinator::{Report, State};
use dpcap_proto::v1::{JobState, Reduction, StepOutcome};

fn members(state: &State, id: &str) -> Vec<String> {
    state.jobs[id].group.as_ref().map(|g| g.members.clone()).unwrap_or_default()
}

fn generation(state: &State, id: &str) -> u64 {
    state.jobs[id].group.as_ref().map_or(0, |g| g.generation)
}

/// A state running job `a` (W = 2) on two CUDA workers, g0 and g1.
fn two_gpu_job() -> State {
    let mut state = State::default();
    submit(&mut state, job("a", 2, 5));
    worker_on(&mut state, "g0", "cuda:0");
    worker_on(&mut state, "g1", "cuda:1");
    state.schedule();
    state
}

fn invalid_field(result: Result<Option<Vec<u8>>, CoordinatorError>) -> &'static str {
    match result {
        Err(CoordinatorError::Invalid { field, .. }) => field,
        other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
    }
}

#[test]
fn an_all_cuda_group_reduces_over_nccl_and_a_mixed_one_through_the_accountant() {
    let mut state = two_gpu_job();
    assert_eq!(state.jobs["a"].job.reduction, Reduction::Nccl as i32);

    submit(&mut state, job("mixed", 2, 5));
    worker_on(&mut state, "g2", "cuda:0");
    worker(&mut state, "c0");
    state.schedule();
    assert_eq!(state.jobs["mixed"].job.reduction, Reduction::Accountant as i32);
}

#[test]
fn an_nccl_job_re_forms_only_on_cuda_workers() {
    let mut state = two_gpu_job();
    // g1 reports its collective timed out: the group dissolves and the job waits at the head.
    state.work_for("a", 0);
    let lost = Report { outcome: StepOutcome::PeerLost, message: "all-reduce timed out".into(), ..done() };
    state.report("a", 1, &lost);
    assert_eq!(state.jobs["a"].job.state, JobState::Running as i32, "re-formed at once on the same workers");
    assert_eq!(generation(&state, "a"), 2);
    assert!(state.jobs["a"].job.conditions.iter().any(|c| c.reason == "CollectiveFailed"));
    // Its ranks' registration at the accountant (parts = 1) must stay valid: once g1 is gone a
    // free CPU worker never joins it; the job waits for another CUDA worker.
    state.workers.remove("g1");
    state.work_for("a", 0);
    state.report("a", 0, &lost);
    worker(&mut state, "c0");
    state.schedule();
    assert_eq!(state.jobs["a"].job.state, JobState::Pending as i32);
    worker_on(&mut state, "g2", "cuda:0");
    state.schedule();
    assert_eq!(members(&state, "a"), ["g0", "g2"]);
    assert!(!members(&state, "a").contains(&"c0".to_string()), "{:?}", members(&state, "a"));
    assert_eq!(state.jobs["a"].job.reduction, Reduction::Nccl as i32);
}

#[test]
fn rank_zero_publishes_one_id_per_generation_and_the_others_read_it() {
    let mut state = two_gpu_job();
    let [rank0, rank1] = [members(&state, "a")[0].clone(), members(&state, "a")[1].clone()];
    let id = vec![7u8; NCCL_ID_BYTES];

    assert_eq!(exchange(&mut state, (&rank1, "a", 1), &[]).unwrap(), None, "not published yet: wait");
    assert_eq!(invalid_field(exchange(&mut state, (&rank0, "a", 1), &[1, 2, 3])), "nccl_id", "wrong length");
    assert_eq!(invalid_field(exchange(&mut state, (&rank0, "a", 1), &[])), "nccl_id", "rank 0 must publish");
    assert_eq!(invalid_field(exchange(&mut state, (&rank1, "a", 1), &id)), "nccl_id", "only rank 0 publishes");
    assert_eq!(exchange(&mut state, (&rank0, "a", 1), &id).unwrap(), Some(id.clone()));
    assert_eq!(exchange(&mut state, (&rank0, "a", 1), &id).unwrap(), Some(id.clone()), "a retry is idempotent");
    assert!(exchange(&mut state, (&rank0, "a", 1), &[9u8; NCCL_ID_BYTES]).is_err(), "no second id");
    assert_eq!(exchange(&mut state, (&rank1, "a", 1), &[]).unwrap(), Some(id));

    // A stale generation is refused; the new generation starts without an id.
    state.work_for("a", 0);
    let lost = Report { outcome: StepOutcome::PeerLost, message: "timeout".into(), ..done() };
    state.report("a", 0, &lost);
    assert!(matches!(exchange(&mut state, (&rank1, "a", 1), &[]), Err(CoordinatorError::StaleGeneration { .. })));
    let rank1 = members(&state, "a")[1].clone();
    assert_eq!(exchange(&mut state, (&rank1, "a", 2), &[]).unwrap(), None);
}

#[test]
fn a_job_reducing_through_the_accountant_has_no_rendezvous() {
    let mut state = State::default();
    submit(&mut state, job("a", 1, 5));
    worker(&mut state, "c0");
    state.schedule();
    let result = exchange(&mut state, ("c0", "a", 1), &[7u8; NCCL_ID_BYTES]);
    assert!(matches!(result, Err(CoordinatorError::Precondition { .. })), "{result:?}");
}
