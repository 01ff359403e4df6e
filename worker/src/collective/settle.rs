//! Waiting on a non-blocking NCCL call until it settles: the watchdog's loop, apart from FFI.
//!
//! A non-blocking communicator (`blocking = 0`) returns from init and from every enqueue at once,
//! possibly with `ncclInProgress`; the caller polls `ncclCommGetAsyncError` (then the stream's
//! event) until the work is done, it failed, the group was aborted from another thread, or the
//! deadline passed. No thread is ever parked inside NCCL, so an abort needs no lock that a
//! blocked call holds, and a timed-out init leaves no thread behind. The loop is pure over its
//! poll closure, so its every exit is tested without a GPU.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::CollectiveError;

/// What one poll of a pending call found.
#[derive(Debug)]
pub enum Progress {
    /// The call completed.
    Done,
    /// Still running: poll again.
    Pending,
    /// It failed: NCCL's error (an init or collective error, a peer's failure) or CUDA's.
    Failed(CollectiveError),
}

/// One wait: what it waits for (for errors), until when, how often it polls, and the flag
/// another thread sets to abort it.
#[derive(Debug)]
pub struct Watch<'a> {
    /// "init", "all-reduce", "broadcast".
    pub op: &'static str,
    /// When the watchdog fires.
    pub deadline: Instant,
    /// The whole timeout the deadline came from (reported in the error).
    pub timeout: Duration,
    /// The pause between polls.
    pub interval: Duration,
    /// Set when the group was aborted elsewhere: the wait stops at its next poll.
    pub aborted: &'a AtomicBool,
}

/// Polls until `poll` says done or failed, `aborted` is set, or the deadline passes. The
/// caller aborts the communicator on any error but [`CollectiveError::Aborted`] (it already
/// was).
pub fn settle(watch: &Watch<'_>, mut poll: impl FnMut() -> Progress) -> Result<(), CollectiveError> {
    loop {
        if watch.aborted.load(Ordering::SeqCst) {
            return Err(CollectiveError::Aborted);
        }
        match poll() {
            Progress::Done => return Ok(()),
            Progress::Failed(e) => return Err(e),
            Progress::Pending => {}
        }
        if Instant::now() >= watch.deadline {
            return Err(CollectiveError::Timeout { op: watch.op, seconds: watch.timeout.as_secs() });
        }
        std::thread::sleep(watch.interval);
    }
}

/// The oldest NCCL with non-blocking communicators in the layouts below (2.22.0).
pub const OLDEST_NCCL: i32 = 22200;

/// The bytes of `ncclConfig_t` that NCCL `version` (`ncclGetVersion`'s code, 22703 for
/// 2.27.3) knows. NCCL caps its copy at its own struct's size, but it then reads fields of the
/// version claimed: giving each library exactly its layout keeps size and version consistent
/// whatever a release does with them. The layout
/// only ever grew by appending fields (on 64-bit targets: 48 bytes through 2.26, 72 in 2.27,
/// 80 in 2.28, 88 in 2.29, 96 from 2.30, cudarc's newest; `nccl.rs` checks these against
/// cudarc's struct at compile time).
pub fn config_bytes(version: i32) -> Result<usize, CollectiveError> {
    match version {
        version if version < OLDEST_NCCL => Err(CollectiveError::TooOld { version }),
        v if v < 22700 => Ok(48),
        v if v < 22800 => Ok(72),
        v if v < 22900 => Ok(80),
        v if v < 23000 => Ok(88),
        _ => Ok(96),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch(aborted: &AtomicBool, timeout: Duration) -> Watch<'_> {
        Watch { op: "init", deadline: Instant::now() + timeout, timeout, interval: Duration::from_millis(1), aborted }
    }

    #[test]
    fn a_call_that_completes_after_some_polls_settles_ok_having_polled_until_then() {
        let aborted = AtomicBool::new(false);
        let mut polls = 0;
        let result = settle(&watch(&aborted, Duration::from_secs(10)), || {
            polls += 1;
            if polls < 4 { Progress::Pending } else { Progress::Done }
        });
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(polls, 4);
    }

    #[test]
    fn a_failed_call_ends_the_wait_with_its_own_error() {
        let aborted = AtomicBool::new(false);
        let mut polls = 0;
        let nccl = settle(&watch(&aborted, Duration::from_secs(10)), || {
            polls += 1;
            if polls < 2 {
                Progress::Pending
            } else {
                Progress::Failed(CollectiveError::Nccl {
                    op: "init",
                    code: 6,
                    result: "ncclRemoteError".into(),
                    last_error: "socket closed by peer 10.0.0.2".into(),
                })
            }
        });
        assert_eq!(
            nccl.unwrap_err().to_string(),
            "nccl init failed: ncclRemoteError (ncclResult_t 6): socket closed by peer 10.0.0.2"
        );
        let cuda = settle(&watch(&aborted, Duration::from_secs(10)), || {
            Progress::Failed(CollectiveError::Cuda("CUDA_ERROR_LAUNCH_FAILED".into()))
        });
        assert!(matches!(cuda, Err(CollectiveError::Cuda(_))), "{cuda:?}");
    }

    #[test]
    fn a_call_that_never_completes_times_out_at_its_deadline_instead_of_hanging() {
        let aborted = AtomicBool::new(false);
        let started = Instant::now();
        let result = settle(&watch(&aborted, Duration::from_millis(50)), || Progress::Pending);
        assert!(matches!(result, Err(CollectiveError::Timeout { op: "init", .. })), "{result:?}");
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(50) && waited < Duration::from_secs(5), "{waited:?}");
    }

    #[test]
    fn an_abort_from_another_thread_ends_a_pending_wait_at_its_next_poll() {
        let aborted = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                aborted.store(true, Ordering::SeqCst);
            });
            let result = settle(&watch(&aborted, Duration::from_secs(30)), || Progress::Pending);
            assert!(matches!(result, Err(CollectiveError::Aborted)), "{result:?}");
        });
    }

    #[test]
    fn the_config_size_is_the_one_each_nccl_release_reads_and_older_releases_are_refused() {
        assert_eq!(config_bytes(22203).unwrap(), 48);
        assert_eq!(config_bytes(22605).unwrap(), 48);
        assert_eq!(config_bytes(22703).unwrap(), 72);
        assert_eq!(config_bytes(22800).unwrap(), 80);
        assert_eq!(config_bytes(22907).unwrap(), 88);
        assert_eq!(config_bytes(23002).unwrap(), 96);
        assert_eq!(config_bytes(23100).unwrap(), 96, "a newer NCCL is given the newest layout cudarc knows");
        let old = config_bytes(21805).unwrap_err().to_string();
        assert!(old.contains("nccl 2.18.5 is older than 2.22"), "{old}");
    }
}
