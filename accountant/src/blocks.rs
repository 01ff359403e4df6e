//! Release blocks, page-aligned and reused from one release to the next. At P = 190M a release
//! is 760 MB of blocks; allocated fresh each step, every page is faulted in and cleared by the
//! kernel again (on a VM whose memory is ballooned, a host-side fill too), which cost more than
//! the noise pass that writes them. A block whose release is dropped returns here instead, and
//! the next part is checked into it (a single part's release is then written over the part's
//! own blocks; a sum of several parts' release takes blocks of its own here).
//!
//! Blocks start on a page boundary ([`ALIGN`] bytes) so that the ledger can write them to disk
//! with `O_DIRECT`, from where they lie, without a copy into the page cache.
//!
//! What this must never do: hand out a block that a release still holds (a block returns only
//! when the last `Bytes` that views it is dropped), or let bytes nobody wrote for this step
//! reach a rank: a [`Filler`] hands a block on only once a part's values fill it, and the noise
//! pass writes every value of a block ([`Block::values_mut`] gives it the whole block).

use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// Alignment of every block's first byte: a page, and a multiple of any disk's logical block,
/// as `O_DIRECT` requires of a buffer.
pub const ALIGN: usize = 4096;

/// f32 values of slack allocated before a block, so that an aligned start always exists.
const SLACK: usize = ALIGN / 4;

#[derive(Debug, Default)]
struct Idle {
    buffers: Vec<Vec<f32>>,
    /// Most buffers kept idle: what the largest step announced so far needs
    /// ([`BlockPool::expect_step`]).
    keep: usize,
}

/// Blocks of `values` f32 each, handed out and taken back. Cloning shares the pool.
#[derive(Debug, Clone)]
pub struct BlockPool {
    values: usize,
    idle: Arc<Mutex<Idle>>,
}

impl BlockPool {
    /// A pool of blocks of `values` f32 (a release's block size, `noise::BLOCK_BYTES / 4`).
    pub fn new(values: usize) -> Self {
        Self { values, idle: Arc::default() }
    }

    /// A step of `dim` coordinates is under way. A step of one part needs ⌈dim / block⌉
    /// blocks (its release is written over the part's own); a step of several holds a part's
    /// blocks while its release fills as many again. The release each step pushes out of
    /// memory returns its own, so keeping two steps' worth idle means no step allocates. Idle
    /// memory is then at most 8·`dim` bytes for the largest job, what a step would otherwise
    /// allocate afresh.
    pub fn expect_step(&self, dim: usize) {
        let mut idle = self.idle.lock().expect("block pool lock");
        idle.keep = idle.keep.max(2 * dim.div_ceil(self.values));
    }

    /// A block of `len` values (at most the pool's block size), reused when one is idle. Its
    /// values are whatever it last held: the caller writes all of them.
    pub fn block(&self, len: usize) -> Block {
        assert!(len <= self.values, "a block of {len} values from a pool of {}-value blocks", self.values);
        let reused = self.idle.lock().expect("block pool lock").buffers.pop();
        let buffer = reused.unwrap_or_else(|| vec![0f32; self.values + SLACK]);
        // In values, not bytes: a value's address is 4-aligned, so an aligned one is ≤ SLACK on.
        let start = buffer.as_ptr().align_offset(ALIGN);
        assert!(start < SLACK, "an aligned start within the slack");
        Block { buffer, start, len, pool: self.clone() }
    }

    /// Blocks idle now (tests).
    #[cfg(test)]
    fn idle(&self) -> usize {
        self.idle.lock().expect("block pool lock").buffers.len()
    }

    fn give_back(&self, buffer: Vec<f32>) {
        let mut idle = self.idle.lock().expect("block pool lock");
        if idle.buffers.len() < idle.keep {
            idle.buffers.push(buffer);
        }
    }
}

/// `total` values that arrive in chunks of any size, gathered into whole blocks of the pool: a
/// block is handed on once full (the last, shorter one once all `total` values are in), so the
/// sender's chunking never decides how many blocks are held (a part sent in 4-byte chunks takes
/// the same ⌈total / block⌉ blocks as one sent in 4 MiB chunks).
#[derive(Debug)]
pub struct Filler {
    pool: BlockPool,
    total: usize,
    /// Values in blocks already handed on.
    sealed: usize,
    /// The block being filled and the bytes written into it (a read from a socket may end
    /// inside a value).
    open: Option<(Block, usize)>,
}

impl Filler {
    /// A filler of `total` values from `pool`.
    pub fn new(pool: &BlockPool, total: usize) -> Self {
        Self { pool: pool.clone(), total, sealed: 0, open: None }
    }

    /// Values received so far.
    pub fn received(&self) -> usize {
        self.sealed + self.open.as_ref().map_or(0, |(_, n)| *n / 4)
    }

    /// The open block's bytes not yet written (a new block's, when none is open); empty once
    /// all `total` values are in. A reader writes a prefix of them, then [`Self::advance`]s.
    pub fn spare(&mut self) -> &mut [u8] {
        if self.open.is_none() && self.sealed < self.total {
            let left = self.total - self.sealed;
            self.open = Some((self.pool.block(left.min(self.pool.values)), 0));
        }
        match &mut self.open {
            Some((block, written)) => &mut bytemuck::cast_slice_mut::<f32, u8>(block.values_mut())[*written..],
            None => &mut [],
        }
    }

    /// `bytes` more of [`Self::spare`] were written; hands the block to `full` if it filled.
    pub fn advance<E>(&mut self, bytes: usize, full: impl FnOnce(Block) -> Result<(), E>) -> Result<(), E> {
        let Some((block, written)) = &mut self.open else { return Ok(()) };
        *written = (*written + bytes).min(4 * block.len);
        if *written == 4 * block.len
            && let Some((block, written)) = self.open.take()
        {
            self.sealed += written / 4;
            full(block)?;
        }
        Ok(())
    }

    /// Copies `data` (little-endian f32, whole values; the caller has checked that they fit in
    /// `total`) and hands each block that fills to `full`, in order; stops at `full`'s error.
    pub fn fill<E>(&mut self, mut data: &[u8], mut full: impl FnMut(Block) -> Result<(), E>) -> Result<(), E> {
        debug_assert!(self.received() + data.len() / 4 <= self.total, "checked by the caller");
        while data.len() >= 4 && self.received() < self.total {
            let spare = self.spare();
            let take = spare.len().min(data.len()) / 4 * 4;
            spare[..take].copy_from_slice(&data[..take]);
            data = &data[take..];
            self.advance(take, &mut full)?;
        }
        Ok(())
    }
}

/// One block's values, page-aligned; back to its pool when the last view of it is dropped.
#[derive(Debug)]
pub struct Block {
    buffer: Vec<f32>,
    start: usize,
    len: usize,
    pool: BlockPool,
}

impl Block {
    /// The block's values, for the pass to write.
    pub fn values_mut(&mut self) -> &mut [f32] {
        &mut self.buffer[self.start..self.start + self.len]
    }

    /// Values in the block.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a block of no values.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The block as little-endian bytes, without a copy, for a block written as f32 values
    /// through [`Self::values_mut`] (a [`Filler`]'s block already holds little-endian bytes:
    /// view it with `as_ref`); its buffer returns to the pool when the last slice of them is
    /// dropped.
    pub fn into_bytes(self) -> Bytes {
        if cfg!(target_endian = "little") {
            Bytes::from_owner(self)
        } else {
            dpcap_proto::floats::to_bytes(&self.buffer[self.start..self.start + self.len])
        }
    }
}

impl AsRef<[u8]> for Block {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.buffer[self.start..self.start + self.len])
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.buffer));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_page_aligned_and_its_bytes_are_its_values() {
        let pool = BlockPool::new(3000);
        let mut block = pool.block(1000);
        block.values_mut().iter_mut().enumerate().for_each(|(i, v)| *v = i as f32);
        let bytes = block.into_bytes();
        assert_eq!(bytes.as_ptr().align_offset(ALIGN), 0);
        assert_eq!(bytes.len(), 4000);
        assert_eq!(&bytes[4 * 999..], &999f32.to_le_bytes());
    }

    #[test]
    fn a_block_returns_only_when_its_last_view_is_dropped_and_only_as_many_as_expected() {
        let pool = BlockPool::new(1024);
        pool.expect_step(512); // two blocks: a part's and its release's, for a sum of several
        let bytes = pool.block(1024).into_bytes();
        let slice = bytes.slice(8..16);
        drop(bytes);
        assert_eq!(pool.idle(), 0, "a slice still views the block");
        drop(slice);
        assert_eq!(pool.idle(), 1);
        let blocks: Vec<Block> = (0..3).map(|_| pool.block(1024)).collect();
        drop(blocks);
        assert_eq!(pool.idle(), 2, "no more kept than a step needs");
    }

    #[test]
    fn a_returned_block_is_handed_out_again() {
        let pool = BlockPool::new(1024);
        pool.expect_step(1024);
        let first = pool.block(1024).into_bytes();
        let at = first.as_ptr();
        drop(first);
        let again = pool.block(512).into_bytes();
        assert_eq!((again.as_ptr(), again.len()), (at, 2048), "the same memory, cut to the length asked");
    }

    /// Filled blocks, from `data` sent in chunks of `chunk` bytes.
    fn filled(pool: &BlockPool, data: &[u8], chunk: usize) -> Vec<Block> {
        let mut filler = Filler::new(pool, data.len() / 4);
        let mut blocks = Vec::new();
        for piece in data.chunks(chunk) {
            filler
                .fill(piece, |b| {
                    blocks.push(b);
                    Ok::<_, ()>(())
                })
                .unwrap();
        }
        assert_eq!(filler.received(), data.len() / 4);
        blocks
    }

    /// The blocks' bytes, in order, and each one's length.
    fn contents(blocks: &[Block]) -> (Vec<u8>, Vec<usize>) {
        (blocks.iter().flat_map(|b| b.as_ref().to_vec()).collect(), blocks.iter().map(|b| b.as_ref().len()).collect())
    }

    #[test]
    fn filled_blocks_hold_the_same_bytes_in_whole_aligned_blocks_however_the_data_was_chunked() {
        let pool = BlockPool::new(1000);
        let data: Vec<u8> = (0..2500 * 4).map(|i| (i % 251) as u8).collect();
        for chunk in [4, 12, 4000, 4004, 10_000] {
            let blocks = filled(&pool, &data, chunk);
            assert!(blocks.iter().all(|b| b.as_ref().as_ptr().align_offset(ALIGN) == 0));
            assert_eq!(contents(&blocks), (data.clone(), vec![4000, 4000, 2000]), "chunks of {chunk}");
        }
    }

    #[test]
    fn reads_into_the_spare_bytes_fill_the_same_blocks_even_when_they_end_inside_a_value() {
        let pool = BlockPool::new(1000);
        let data: Vec<u8> = (0..2500 * 4).map(|i| (i % 251) as u8).collect();
        let (mut filler, mut blocks, mut at) = (Filler::new(&pool, 2500), Vec::new(), 0);
        for read in [3, 1, 4097, 6, 9999, 7].iter().cycle() {
            let spare = filler.spare();
            if spare.is_empty() {
                break;
            }
            let n = (*read).min(spare.len());
            spare[..n].copy_from_slice(&data[at..at + n]);
            at += n;
            filler
                .advance(n, |b| {
                    blocks.push(b);
                    Ok::<_, ()>(())
                })
                .unwrap();
        }
        assert_eq!((at, filler.received()), (data.len(), 2500));
        assert_eq!(contents(&blocks), (data, vec![4000, 4000, 2000]));
    }

    #[test]
    fn a_block_is_handed_on_only_once_full_and_the_fill_stops_at_its_error() {
        let pool = BlockPool::new(4);
        let mut filler = Filler::new(&pool, 6);
        let mut seen = 0;
        filler
            .fill(&[0; 12], |_| {
                seen += 1;
                Ok::<_, ()>(())
            })
            .unwrap();
        assert_eq!((seen, filler.received()), (0, 3), "three of four values: still open");
        assert_eq!(filler.fill(&[0; 12], |_| Err("refused")), Err("refused"));
        assert_eq!(filler.received(), 4, "the full block was handed on, then the fill stopped");
    }
}
