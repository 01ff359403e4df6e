//! How a group sums its ranks' clipped sums before the accountant adds noise
//! ([`Reducer`]), and the NCCL communicator behind the GPU path (feature `cuda`).
//!
//! On the accountant path every rank sends its part (parts = W). On the NCCL path the ranks
//! all-reduce their parts, rank 0 alone sends the sum (parts = 1), and the release comes back to
//! the other ranks by broadcast. Either way the accountant sees Σ_r S_r and adds noise once.
//! Every blocking collective runs under a watchdog: a peer that stops answering aborts the
//! communicator instead of hanging the group.

#[cfg(feature = "cuda")]
pub mod nccl;
pub mod settle;
pub mod staging;

use std::time::Duration;

/// Why a collective failed.
#[derive(Debug, thiserror::Error)]
pub enum CollectiveError {
    /// The watchdog fired: a peer did not take part within the timeout.
    #[error("{op} did not complete within {seconds} s; communicator aborted")]
    Timeout {
        /// The operation ("all-reduce", "broadcast", "init").
        op: &'static str,
        /// The watchdog's timeout.
        seconds: u64,
    },
    /// The communicator was aborted (group re-formed, session dropped, or an earlier failure).
    #[error("communicator aborted")]
    Aborted,
    /// NCCL returned an error: its result code, and `ncclGetLastError`'s text, which names
    /// the failing system call, peer or setting (empty when NCCL kept none).
    #[error("nccl {op} failed: {result} (ncclResult_t {code}){}", last_error_text(last_error))]
    Nccl {
        /// The call ("init", "all-reduce", "get-unique-id", …).
        op: &'static str,
        /// `ncclResult_t` as a number (2: system error, 3: internal, 4: invalid argument, 5:
        /// invalid usage, 6: remote error).
        code: u32,
        /// `ncclResult_t`'s name ("ncclSystemError").
        result: String,
        /// What `ncclGetLastError` said.
        last_error: String,
    },
    /// The NCCL that loaded cannot run a non-blocking communicator.
    #[error(
        "nccl {}.{}.{} is older than 2.22, which non-blocking communicators need: install a newer \
         nvidia-nccl wheel or NCCL package", version / 10000, version / 100 % 100, version % 100
    )]
    TooOld {
        /// `ncclGetVersion`'s code (22703 for 2.27.3).
        version: i32,
    },
    /// `NCCL_COMM_BLOCKING` forces blocking communicators, out of the watchdog's reach.
    #[error("NCCL_COMM_BLOCKING is set: unset it, the watchdog needs non-blocking communicators")]
    BlockingForced,
    /// A unique id of the wrong length reached this rank.
    #[error("nccl id of {len} bytes, expected 128")]
    IdLength {
        /// Its length.
        len: usize,
    },
    /// The blocking thread that ran an NCCL call failed (panicked or was cancelled).
    #[error("the nccl {op} thread failed")]
    Thread {
        /// The call it ran.
        op: &'static str,
        /// Why.
        #[source]
        source: tokio::task::JoinError,
    },
    /// A CUDA resource the collective needs is missing (the reason, with its figures).
    #[error("cuda: {0}")]
    Cuda(String),
    /// The CUDA driver refused a call.
    #[cfg(feature = "cuda")]
    #[error("cuda: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
}

fn last_error_text(text: &str) -> String {
    if text.is_empty() { String::new() } else { format!(": {text}") }
}

/// Watchdog timeout for one collective. A rank that finishes its compute early waits in the
/// all-reduce for the slowest rank, so this must exceed the compute skew of a step.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// What rank 0 broadcasts before a release on the NCCL path: whether one follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ReleaseStatus {
    /// The release follows.
    Released = 1,
    /// The accountant refused the step: the budget is spent.
    BudgetExhausted = 2,
    /// Rank 0 could not obtain the release.
    Failed = 3,
    /// The step was charged but its release was lost: every rank skips it.
    Discarded = 4,
}

impl ReleaseStatus {
    /// The status for a broadcast code; unknown codes are failures.
    pub fn from_code(code: u32) -> Self {
        match code {
            1 => Self::Released,
            2 => Self::BudgetExhausted,
            4 => Self::Discarded,
            _ => Self::Failed,
        }
    }
}

/// How this rank's part reaches the accountant.
pub enum Reducer {
    /// Every rank submits its own part.
    Accountant,
    /// NCCL among CUDA ranks; rank 0 submits the sum.
    #[cfg(feature = "cuda")]
    Nccl(std::sync::Arc<nccl::NcclGroup>),
}

impl Reducer {
    /// Parts the accountant waits for per step with `world_size` ranks.
    pub fn parts(&self, world_size: u32) -> u32 {
        match self {
            Reducer::Accountant => world_size,
            #[cfg(feature = "cuda")]
            Reducer::Nccl(_) => 1,
        }
    }
}

impl std::fmt::Debug for Reducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reducer::Accountant => f.write_str("Accountant"),
            #[cfg(feature = "cuda")]
            Reducer::Nccl(g) => write!(f, "Nccl(rank {} of {})", g.rank(), g.world_size()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_status_round_trips_and_unknown_codes_fail() {
        for s in
            [ReleaseStatus::Released, ReleaseStatus::BudgetExhausted, ReleaseStatus::Failed, ReleaseStatus::Discarded]
        {
            assert_eq!(ReleaseStatus::from_code(s as u32), s);
        }
        assert_eq!(ReleaseStatus::from_code(0), ReleaseStatus::Failed);
        assert_eq!(Reducer::Accountant.parts(4), 4);
    }
}
