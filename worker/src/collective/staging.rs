//! What one NCCL collective copies between host and device, decided apart from CUDA so that it
//! is tested on CPU.
//!
//! The NCCL path stages values through one page-locked host buffer and one device buffer that
//! live as long as the communicator: grown to the largest collective, never freed between steps
//! (at P = 190M a fresh 760 MB device allocation and a pageable copy, which the driver chunks
//! through its own small pinned buffer, cost every collective). Only what a rank needs moves: a
//! broadcast uploads on rank 0 alone, whose buffer already holds the result, and downloads on
//! the others, whose input NCCL overwrites.

/// The collective to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// In-place sum over every rank.
    Sum,
    /// In-place copy of rank 0's buffer to every rank.
    FromRankZero,
}

/// The host↔device copies of one collective on one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfers {
    /// The rank's values go to the device before the collective.
    pub upload: bool,
    /// The result comes back to the host after it.
    pub download: bool,
}

impl Transfers {
    /// What `op` must copy on `rank`.
    pub fn of(op: Op, rank: usize) -> Self {
        match op {
            Op::Sum => Self { upload: true, download: true },
            Op::FromRankZero => Self { upload: rank == 0, download: rank != 0 },
        }
    }
}

/// The staging buffers' size, in bytes, once a collective of `needed` bytes has run: None
/// while `capacity` holds it (the buffers are reused as they are), else `needed` (both are
/// replaced). A job's collectives have two sizes, 4·P bytes and one status word, so the
/// buffers are allocated at most twice per communicator.
pub fn grown(capacity: usize, needed: usize) -> Option<usize> {
    (needed > capacity).then_some(needed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sum_uploads_and_downloads_on_every_rank() {
        for rank in [0, 1, 127] {
            assert_eq!(Transfers::of(Op::Sum, rank), Transfers { upload: true, download: true });
        }
    }

    #[test]
    fn a_broadcast_uploads_on_rank_zero_alone_and_downloads_on_the_others_alone() {
        assert_eq!(Transfers::of(Op::FromRankZero, 0), Transfers { upload: true, download: false });
        for rank in [1, 2, 127] {
            assert_eq!(Transfers::of(Op::FromRankZero, rank), Transfers { upload: false, download: true });
        }
    }

    #[test]
    fn the_buffers_grow_to_the_largest_collective_and_are_then_reused_for_every_step() {
        let (p_bytes, status) = (4 * 190_042_170, 4);
        // A job's collectives per step: rank 0 sums, then broadcasts the status word and the
        // release; the other ranks' first collective of a generation may be the status word.
        for order in [[p_bytes, status, p_bytes], [status, p_bytes, p_bytes]] {
            let (mut capacity, mut allocations) = (0, 0);
            for _ in 0..5_708 {
                for needed in order {
                    if let Some(bytes) = grown(capacity, needed) {
                        (capacity, allocations) = (bytes, allocations + 1);
                    }
                }
            }
            assert_eq!(capacity, p_bytes);
            assert!(allocations <= 2, "{allocations} allocations for {order:?}");
        }
        assert_eq!(grown(16, 4), None);
        assert_eq!(grown(0, 4), Some(4));
    }
}
