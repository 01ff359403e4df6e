//! A released step's bytes, filled block by block. The noise pass writes each block of
//! R_t = (Σ parts + noise) once; fetches stream the blocks already filled and the ledger
//! stores them, so neither waits for the whole pass: at P = 190M the pass is 760 MB of output,
//! and the store (a disk, an object store) is the slowest stage of the release. A rank applies
//! a release only with its last chunk, which waits until the release is durable ([`Stored`]).
//!
//! The rules that keep this safe: blocks are filled only after the step's durable charge (the
//! caller's release procedure), each block is filled at most once (a repeated fetch gets the
//! same bytes), and a pass that fails leaves the release [`Stored::Failed`]: discarded, never
//! applied.

use std::sync::OnceLock;

use bytes::Bytes;
use tokio::sync::watch;

/// Where a release stands in the ledger's store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// Being written.
    Writing,
    /// Durable: a restart serves the same bytes.
    Done,
    /// The write (or the noise pass) failed: the step is discarded and no rank may apply it.
    Failed,
}

/// A released step: the noised sum, identical bytes for every fetch.
#[derive(Debug)]
pub struct Release {
    /// The step.
    pub step: u64,
    /// ε spent after this step.
    pub epsilon_after: f64,
    /// Bytes a rank receives: 4·P (P little-endian f32 values). The blocks may run past it
    /// with an audit's reserved coordinates, which stay in the accountant.
    len: usize,
    /// Bytes per block (the last may be shorter).
    block_bytes: usize,
    blocks: Vec<OnceLock<Bytes>>,
    /// Bumped on every filled block and when the pass fails, to wake the block's waiters.
    filled: watch::Sender<(usize, bool)>,
    /// Whether the release is in the ledger's store yet.
    stored: watch::Receiver<Stored>,
}

impl Release {
    /// An empty release of `total` bytes in blocks of `block_bytes`, of which ranks receive the
    /// first `len`; its noise pass fills it with [`Release::fill`].
    pub fn filling(
        step: u64,
        epsilon_after: f64,
        len: usize,
        total: usize,
        block_bytes: usize,
        stored: watch::Receiver<Stored>,
    ) -> Self {
        assert!(len <= total && block_bytes > 0, "release of {len} of {total} bytes in blocks of {block_bytes}");
        let blocks = (0..total.div_ceil(block_bytes)).map(|_| OnceLock::new()).collect();
        Self { step, epsilon_after, len, block_bytes, blocks, filled: watch::channel((0, false)).0, stored }
    }

    /// A release read back from the store: every block filled, durable already.
    pub fn from_store(step: u64, data: Bytes, epsilon_after: f64, block_bytes: usize) -> Self {
        let len = data.len();
        let release = Self::filling(step, epsilon_after, len, len, block_bytes, watch::channel(Stored::Done).1);
        for (index, block) in release.blocks.iter().enumerate() {
            let start = index * block_bytes;
            block.set(data.slice(start..(start + block_bytes).min(len))).expect("a new release's blocks are empty");
        }
        release
    }

    /// Bytes of memory the release pins, at most: a whole block of the pool per block of
    /// values, however few values the last (or only) block holds.
    pub fn held_bytes(&self) -> usize {
        self.blocks.len() * self.block_bytes
    }

    /// Bytes a rank receives (4·P).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a release of no values.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Blocks that hold bytes a rank receives.
    pub fn visible_blocks(&self) -> usize {
        self.len.div_ceil(self.block_bytes)
    }

    /// Fills block `index` (called once per block by the noise pass).
    pub fn fill(&self, index: usize, bytes: Bytes) {
        if self.blocks[index].set(bytes).is_err() {
            panic!("block {index} of release {} filled twice", self.step);
        }
        self.filled.send_modify(|(count, _)| *count += 1);
    }

    /// The noise pass failed: waiters get nothing, and the release is never applied.
    pub fn fail(&self) {
        self.filled.send_modify(|(_, failed)| *failed = true);
    }

    /// Block `index`'s bytes as a rank receives them, once filled; None if the pass failed.
    pub async fn block(&self, index: usize) -> Option<Bytes> {
        let block = self.whole_block(index).await?;
        let end = (self.len - index * self.block_bytes).min(block.len());
        Some(block.slice(..end))
    }

    /// Block `index` whole (reserved coordinates included), once filled.
    async fn whole_block(&self, index: usize) -> Option<Bytes> {
        let mut filled = self.filled.subscribe();
        loop {
            // Seen before the block is checked: a fill that lands after the check bumps a
            // version this receiver has not seen, so `changed` returns (no missed wakeup).
            let failed = filled.borrow_and_update().1;
            if let Some(bytes) = self.blocks[index].get() {
                return Some(bytes.clone());
            }
            if failed {
                return None;
            }
            // The sender lives in `self`: `changed` cannot fail while we borrow it.
            let _ = filled.changed().await;
        }
    }

    /// Waits for the whole pass; None if it failed. Returns every block, reserved included.
    #[cfg(test)]
    async fn all_blocks(&self) -> Option<Vec<Bytes>> {
        let mut blocks = Vec::with_capacity(self.blocks.len());
        for index in 0..self.blocks.len() {
            blocks.push(self.whole_block(index).await?);
        }
        Some(blocks)
    }

    /// The 4 bytes of coordinate `coordinate` (reserved ones included) once the pass is done.
    pub(crate) fn value(&self, coordinate: usize) -> Option<[u8; 4]> {
        let (index, at) = (coordinate * 4 / self.block_bytes, coordinate * 4 % self.block_bytes);
        self.blocks.get(index)?.get()?.get(at..at + 4)?.try_into().ok()
    }

    /// Waits until the release is durable (true) or known lost (false).
    pub async fn durable(&self) -> bool {
        let mut stored = self.stored.clone();
        match stored.wait_for(|s| *s != Stored::Writing).await {
            Ok(state) => *state == Stored::Done,
            Err(_) => false, // the writer went away without saying: treat as lost
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_fetch_waits_for_its_block_and_sees_only_the_ranks_bytes() {
        let (_stored, stored_rx) = watch::channel(Stored::Writing);
        // 10 bytes for ranks, 4 reserved, in blocks of 4: the third block is cut at byte 10.
        let release = std::sync::Arc::new(Release::filling(3, 1.0, 10, 14, 4, stored_rx));
        assert_eq!(release.visible_blocks(), 3);
        let waiter = {
            let release = release.clone();
            tokio::spawn(async move { release.block(2).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "block 2 is not filled yet");
        for (index, bytes) in [(3, &b"wxyz"[..]), (2, b"ijkl"), (0, b"abcd"), (1, b"efgh")] {
            release.fill(index, Bytes::from_static(bytes));
        }
        assert_eq!(waiter.await.unwrap().unwrap(), Bytes::from_static(b"ij"));
        assert_eq!(release.value(3), Some(*b"wxyz"), "a reserved coordinate stays readable here");
        assert_eq!(release.all_blocks().await.unwrap().concat(), b"abcdefghijklwxyz");
    }

    #[tokio::test]
    async fn a_failed_pass_wakes_every_waiter_with_nothing() {
        let (_stored, stored_rx) = watch::channel(Stored::Writing);
        let release = std::sync::Arc::new(Release::filling(0, 1.0, 8, 8, 4, stored_rx));
        release.fill(0, Bytes::from_static(b"abcd"));
        let waiter = {
            let release = release.clone();
            tokio::spawn(async move { release.block(1).await })
        };
        release.fail();
        assert_eq!(waiter.await.unwrap(), None);
        assert_eq!(release.block(0).await, Some(Bytes::from_static(b"abcd")), "what was filled stays");
        assert!(release.all_blocks().await.is_none());
    }

    #[tokio::test]
    async fn a_stored_release_is_whole_and_durable() {
        let release = Release::from_store(5, Bytes::from_static(b"abcdefghij"), 2.0, 4);
        assert_eq!((release.len(), release.visible_blocks()), (10, 3));
        assert_eq!(release.block(2).await, Some(Bytes::from_static(b"ij")));
        assert!(release.durable().await);
    }
}
