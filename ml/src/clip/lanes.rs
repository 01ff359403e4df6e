//! Examples side by side on a CPU: a batch is cut into contiguous lanes, each lane runs its own
//! forward and backward on its own autodiff graph, and the lanes' sums are added in lane order.
//!
//! Why: burn-flex parallelises one op at a time, and most ops of a small model are below its
//! parallel thresholds, so a second core bought the `bench` captioner's step only 5 %
//! (0.685 s on one thread, 0.653 s on two). Examples are independent by construction (the
//! [`super::Objective`] contract: no batch statistics), so two half batches on one thread each
//! do the same arithmetic with no synchronisation until the sums are added (0.37 s measured as
//! two processes; docs/benchmarks.md has the in-process figures). A GPU runs one queue: its
//! lanes stay at one.
//!
//! The sum's rounding depends on the lane count (the lanes' partial sums are added in a fixed
//! order), never on scheduling: a given lane count gives bit-identical sums run after run.

use std::ops::Range;
use std::sync::Mutex;

use rayon::{ThreadPool, ThreadPoolBuilder};

use super::counters::{self, Counts};

/// How many lanes a step runs; at least one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lanes(usize);

impl Default for Lanes {
    /// One lane: the batch in order on the calling thread.
    fn default() -> Self {
        Self(1)
    }
}

impl Lanes {
    /// `n` lanes (0 is read as 1).
    pub fn new(n: usize) -> Self {
        Self(n.max(1))
    }

    /// The choice for a device string: a CPU runs one lane per thread of the global rayon pool
    /// (its cores, or `RAYON_NUM_THREADS`); a GPU (cuda, wgpu) one.
    pub fn for_device(device: &str) -> Self {
        if device.starts_with("cuda") || device.starts_with("wgpu") {
            Self(1)
        } else {
            Self::new(rayon::current_num_threads())
        }
    }

    /// The lane count.
    pub fn get(&self) -> usize {
        self.0
    }

    /// `n` examples cut into at most this many contiguous, non-empty ranges whose lengths differ
    /// by at most one, in order.
    pub fn ranges(&self, n: usize) -> Vec<Range<usize>> {
        let k = self.0.min(n).max(1);
        let (base, extra) = (n / k, n % k);
        let mut start = 0;
        (0..k)
            .map(|i| {
                let len = base + usize::from(i < extra);
                let range = start..start + len;
                start += len;
                range
            })
            .filter(|r| !r.is_empty())
            .collect()
    }

    /// At most `micro_batch` lanes, so that each has at least one example of the examples in
    /// flight at once ([`Self::micro_batch`] keeps the bound).
    pub fn within(self, micro_batch: usize) -> Self {
        Self::new(self.0.min(micro_batch))
    }

    /// The micro-batch of each of `lanes` lanes when `micro_batch` examples may be in flight at
    /// once in all of them together ([`Self::within`] the bound: `lanes` ≤ `micro_batch`).
    pub fn micro_batch(micro_batch: usize, lanes: usize) -> usize {
        (micro_batch / lanes.max(1)).max(1)
    }
}

/// `lane` over each of `jobs`, side by side when there are several, results in job order.
///
/// The lanes run on a pool of exactly one thread per lane that this call has to itself
/// ([`broadcast`](rayon::ThreadPool::broadcast): lane i on thread i), and burn-flex's parallel
/// ops inside a lane run on that pool too. Not on the global pool: a pool thread waiting inside
/// one of burn-flex's ops may take up queued pool work, and another lane picked up that way
/// inside a backward would run on the same thread while burn-autodiff holds that backward's
/// graph lock; its own backward locks every graph when it cleans up (not reentrant: a hang,
/// likelier where several steps share a pool, as parallel tests do). A broadcast job belongs to
/// its thread and no other call uses the pool, so no lane ever runs inside another. Pools are
/// kept for the next call: threads made afresh each step start with cold allocator arenas and
/// made the `bench` step 1.3-1.6× slower (docs/burn.md).
pub fn run<J: Send, T: Send>(jobs: Vec<J>, lane: impl Fn(J) -> T + Sync) -> Vec<T> {
    let k = jobs.len();
    let pool = if k < 2 { None } else { checkout(k) };
    let Some(pool) = pool else { return jobs.into_iter().map(lane).collect() };
    let slots: Vec<Mutex<Option<J>>> = jobs.into_iter().map(|job| Mutex::new(Some(job))).collect();
    let out = pool.broadcast(|ctx| {
        let job = slots[ctx.index()].lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        job.map(&lane)
    });
    IDLE.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(pool);
    out.into_iter().flatten().collect()
}

/// Lane pools not in use, kept warm for the next step.
static IDLE: Mutex<Vec<ThreadPool>> = Mutex::new(Vec::new());

/// An idle pool of `k` threads, or a new one; None when no thread can be started (the lanes
/// then run one after another on the caller).
fn checkout(k: usize) -> Option<ThreadPool> {
    let mut idle = IDLE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    match idle.iter().position(|pool| pool.current_num_threads() == k) {
        Some(i) => Some(idle.swap_remove(i)),
        None => {
            drop(idle);
            let name = |i| format!("dpcap-lane-{i}");
            ThreadPoolBuilder::new().num_threads(k).thread_name(name).build().ok()
        }
    }
}

/// Runs `work` and returns what it counted ([`counters`]) instead of leaving it on the thread
/// it ran on: a lane may run on the caller's thread or a pool thread, and the caller adds every
/// lane's counts once with [`add_counts`].
pub fn counted<T>(work: impl FnOnce() -> T) -> (T, Counts) {
    let before = counters::counts();
    let out = work();
    let counted = counters::counts() - before;
    counters::count(|c| *c = before);
    (out, counted)
}

/// Adds lanes' counts to the calling thread's.
pub fn add_counts(lanes: impl IntoIterator<Item = Counts>) {
    for lane in lanes {
        counters::count(|c| *c = *c + lane);
    }
}

#[cfg(test)]
mod tests {
    use super::Lanes;

    #[test]
    fn ranges_cover_every_example_once_in_order() {
        for lanes in 1..6 {
            for n in 0..20 {
                let ranges = Lanes::new(lanes).ranges(n);
                let flat: Vec<usize> = ranges.iter().cloned().flatten().collect();
                assert_eq!(flat, (0..n).collect::<Vec<_>>(), "{lanes} lanes over {n}");
                assert!(ranges.len() <= lanes && ranges.iter().all(|r| !r.is_empty()));
                let lens: Vec<usize> = ranges.iter().map(|r| r.len()).collect();
                assert!(lens.iter().max().unwrap_or(&0) - lens.iter().min().unwrap_or(&0) <= 1);
            }
        }
    }

    #[test]
    fn lanes_run_side_by_side_and_return_in_job_order() {
        let lanes =
            super::run((0..4).collect(), |i: usize| (i, std::thread::current().id(), rayon::current_num_threads()));
        assert_eq!(lanes.iter().map(|l| l.0).collect::<Vec<_>>(), [0, 1, 2, 3]);
        let threads: std::collections::HashSet<_> = lanes.iter().map(|l| l.1).collect();
        assert_eq!(threads.len(), 4, "each lane on a thread of its own");
        assert!(lanes.iter().all(|l| l.2 == 4), "each lane's parallel ops stay on the lanes' pool: {lanes:?}");
        assert!(!threads.contains(&std::thread::current().id()), "the caller only waits");
        assert!(super::run(Vec::<usize>::new(), |i| i).is_empty());
        assert_eq!(
            super::run(vec![7], |i: usize| (i, std::thread::current().id())),
            [(7, std::thread::current().id())]
        );
    }

    #[test]
    fn lanes_share_the_micro_batch_bound() {
        assert_eq!(Lanes::micro_batch(64, 2), 32);
        assert_eq!(Lanes::micro_batch(5, 2), 2);
        assert_eq!(Lanes::micro_batch(1, 4), 1);
        assert_eq!(Lanes::new(0).get(), 1);
        assert_eq!(Lanes::new(4).within(2).get(), 2, "never more lanes than examples in flight");
        assert_eq!(Lanes::new(4).within(0).get(), 1);
        assert_eq!(Lanes::for_device("cuda:0").get(), 1);
        assert_eq!(Lanes::for_device("wgpu").get(), 1);
    }
}
