//! A job's lifecycle as every client reads it: which states are final, and the reasons a
//! client acts on. The coordinator sets them; dpctl and the suite read them from here, so
//! neither links the coordinator to tell whether a job has ended.

use crate::v1::JobState;

/// Whether a `Job.state` is final: anything but PENDING and RUNNING (an unknown value too, so
/// a client waiting on a newer server's state stops rather than waits forever).
pub fn is_terminal(state: i32) -> bool {
    !matches!(JobState::try_from(state), Ok(JobState::Pending | JobState::Running))
}

/// The reason of a job FAILED because its dataset's budget could not cover its remaining plan
/// (at a resume): a budget end, which `dpctl wait` reports as one (exit 5); still resumable
/// once its privacy admin raises the budget.
pub const BUDGET_REFUSED: &str = "BudgetRefused";
