//! Counts of the clipping path's costly operations, on the calling thread: device→host reads
//! (on a GPU each one drains the queue and stalls the host), host→device uploads, and dtype
//! casts (each a pass over the tensor; a weight cast per micro-batch repeats the same work).
//! A CPU test holds a step to its budget, so a change that adds a sync or casts weights per
//! micro-batch again fails on CPU, long before a GPU run would show it as lost time.

use std::cell::Cell;

/// What the clipping path did on this thread since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Device→host reads.
    pub syncs: u64,
    /// Host→device uploads.
    pub uploads: u64,
    /// Weights cast to the compute dtype.
    pub weight_casts: u64,
    /// Activations cast to or from the compute dtype.
    pub activation_casts: u64,
}

thread_local! {
    static COUNTS: Cell<Counts> = const {
        Cell::new(Counts { syncs: 0, uploads: 0, weight_casts: 0, activation_casts: 0 })
    };
}

/// This thread's counts so far (subtract two readings to count one step).
pub fn counts() -> Counts {
    COUNTS.with(Cell::get)
}

pub(crate) fn count(what: impl FnOnce(&mut Counts)) {
    COUNTS.with(|cell| {
        let mut counts = cell.get();
        what(&mut counts);
        cell.set(counts);
    });
}

impl std::ops::Add for Counts {
    type Output = Counts;

    fn add(self, other: Counts) -> Counts {
        Counts {
            syncs: self.syncs + other.syncs,
            uploads: self.uploads + other.uploads,
            weight_casts: self.weight_casts + other.weight_casts,
            activation_casts: self.activation_casts + other.activation_casts,
        }
    }
}

impl std::ops::Sub for Counts {
    type Output = Counts;

    fn sub(self, earlier: Counts) -> Counts {
        Counts {
            syncs: self.syncs - earlier.syncs,
            uploads: self.uploads - earlier.uploads,
            weight_casts: self.weight_casts - earlier.weight_casts,
            activation_casts: self.activation_casts - earlier.activation_casts,
        }
    }
}
