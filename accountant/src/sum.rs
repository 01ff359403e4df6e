//! The sum of a step's W parts, built as they arrive. One part (the GPU path: rank 0 sends the
//! all-reduced sum) is kept as it came: the pooled blocks it was checked in, never copied again;
//! the release's noise pass writes over them in place ([`Chunks::take_blocks`]). A second part
//! turns the sum into f64, so that adding W parts rounds once, at the release, not W times.

use std::ops::Range;

use bytes::Bytes;
use dpcap_proto::floats::le_values;

use crate::blocks::Block;

/// One chunk of a part's values.
#[derive(Debug)]
enum Piece {
    /// Bytes shared with whoever else views them: read, never written.
    Shared(Bytes),
    /// A pooled block this part alone holds: the release may be written over it.
    Owned(Block),
    /// A block handed to the release ([`Chunks::take_blocks`]): nothing left to read here.
    Taken,
}

impl Piece {
    fn bytes(&self) -> &[u8] {
        match self {
            Piece::Shared(bytes) => bytes,
            Piece::Owned(block) => block.as_ref(),
            Piece::Taken => &[],
        }
    }
}

/// One part's values: little-endian f32 bytes, already checked to be finite, in pooled blocks
/// (as a transport's [`crate::blocks::Filler`] gathers them) or in shared chunks.
#[derive(Debug, Default)]
pub struct Chunks {
    chunks: Vec<Piece>,
    /// The value index each chunk starts at, and the total after the last.
    starts: Vec<usize>,
}

impl Chunks {
    /// Appends a chunk of whole f32 values (the caller checked its length and values). An
    /// empty chunk holds nothing and is not kept, so every kept chunk covers at least one value.
    pub fn push(&mut self, chunk: Bytes) {
        debug_assert!(chunk.len().is_multiple_of(4), "a chunk of whole f32 values");
        self.push_piece(chunk.len() / 4, Piece::Shared(chunk));
    }

    /// Appends a pooled block of values this part alone holds (the caller checked its values):
    /// the release's pass may write over it instead of filling a block of its own.
    pub fn push_block(&mut self, block: Block) {
        self.push_piece(block.len(), Piece::Owned(block));
    }

    fn push_piece(&mut self, values: usize, piece: Piece) {
        if values == 0 {
            return;
        }
        if self.starts.is_empty() {
            self.starts.push(0);
        }
        let end = self.len() + values;
        self.chunks.push(piece);
        self.starts.push(end);
    }

    /// Hands over every owned block that holds exactly the values of release block `i`,
    /// `[i·block, min((i + 1)·block, release))` for a release of `release` values (at least
    /// [`Self::len`]: an audit's reserved coordinates run past the sum), as element `i` of the
    /// result; other blocks and shared chunks stay, and are read by [`Self::slices`]. A
    /// handed-over block is this part's no more: the release is written over it.
    pub fn take_blocks(&mut self, block: usize, release: usize) -> Vec<Option<Block>> {
        let total = self.len();
        let mut taken: Vec<Option<Block>> = std::iter::repeat_with(|| None).take(total.div_ceil(block)).collect();
        for (piece, bounds) in self.chunks.iter_mut().zip(self.starts.windows(2)) {
            let whole = bounds[0].is_multiple_of(block) && bounds[1] == (bounds[0] + block).min(release);
            if whole
                && matches!(piece, Piece::Owned(_))
                && let Piece::Owned(owned) = std::mem::replace(piece, Piece::Taken)
            {
                taken[bounds[0] / block] = Some(owned);
            }
        }
        taken
    }

    /// Values held.
    pub fn len(&self) -> usize {
        self.starts.last().copied().unwrap_or(0)
    }

    /// True when no value is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes of values `range`, in order, as slices of the chunks that hold them.
    pub fn slices(&self, range: Range<usize>) -> impl Iterator<Item = &[u8]> {
        let first = self.starts.partition_point(|&start| start <= range.start).saturating_sub(1);
        self.chunks
            .iter()
            .zip(self.starts.windows(2))
            .skip(first)
            .take_while(move |(_, bounds)| bounds[0] < range.end)
            .map(move |(chunk, bounds)| {
                let (start, end) = (bounds[0].max(range.start), bounds[1].min(range.end));
                // A handed-over block has no bytes left: reading into it panics here.
                &chunk.bytes()[4 * (start - bounds[0])..4 * (end - bounds[0])]
            })
    }

    /// Every value, widened to f64.
    fn to_f64(&self) -> Vec<f64> {
        let mut out = Vec::with_capacity(self.len());
        for chunk in &self.chunks {
            out.extend(le_values(chunk.bytes()).map(f64::from));
        }
        out
    }

    /// Adds every value to `sum` (of the same length).
    fn add_to(&self, sum: &mut [f64]) {
        for (chunk, bounds) in self.chunks.iter().zip(self.starts.windows(2)) {
            for (s, v) in sum[bounds[0]..bounds[1]].iter_mut().zip(le_values(chunk.bytes())) {
                *s += f64::from(v);
            }
        }
    }
}

impl From<Vec<f32>> for Chunks {
    fn from(values: Vec<f32>) -> Self {
        let mut chunks = Chunks::default();
        chunks.push(dpcap_proto::floats::into_bytes(values));
        chunks
    }
}

/// Σ of the parts received so far.
#[derive(Debug, Default)]
pub enum Sum {
    /// No part yet.
    #[default]
    Empty,
    /// Exactly one part, in the blocks it was checked in.
    One(Chunks),
    /// Two or more parts, in f64.
    Many(Vec<f64>),
}

impl Sum {
    /// Adds a part (all parts of a step have the job's dimension).
    pub fn add(&mut self, part: Chunks) {
        *self = match std::mem::take(self) {
            Sum::Empty => Sum::One(part),
            Sum::One(first) => {
                let mut sum = first.to_f64();
                part.add_to(&mut sum);
                Sum::Many(sum)
            }
            Sum::Many(mut sum) => {
                part.add_to(&mut sum);
                Sum::Many(sum)
            }
        };
    }

    /// Coordinates.
    pub fn len(&self) -> usize {
        match self {
            Sum::Empty => 0,
            Sum::One(v) => v.len(),
            Sum::Many(v) => v.len(),
        }
    }

    /// True before the first part.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Coordinate `i` (in range; 0 before the first part). The release reads the sum as slices.
    #[cfg(test)]
    fn at(&self, i: usize) -> f64 {
        match self {
            Sum::Empty => 0.0,
            Sum::One(v) => f64::from(v.slices(i..i + 1).flat_map(le_values).next().expect("in range")),
            Sum::Many(v) => v[i],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunked(values: &[f32], sizes: &[usize]) -> Chunks {
        let mut chunks = Chunks::default();
        let mut at = 0;
        for &n in sizes {
            chunks.push(dpcap_proto::floats::to_bytes(&values[at..at + n]));
            at += n;
        }
        chunks
    }

    #[test]
    fn parts_add_up_in_f64_without_rounding_each_time() {
        let mut sum = Sum::default();
        sum.add(Chunks::from(vec![1.0e8, 1.0]));
        assert_eq!(sum.at(0), 1.0e8);
        sum.add(chunked(&[1.0, 2.0], &[1, 1]));
        sum.add(Chunks::from(vec![1.0, 3.0]));
        // 1e8 + 1 + 1 is not representable in f32 (it would round to 1e8 + 0 each time).
        assert_eq!(sum.at(0), 100_000_002.0);
        assert_eq!((sum.len(), sum.at(1)), (2, 6.0));
    }

    /// `values` as shared chunks of `shared` values, then checked into blocks of `block` values.
    fn mixed(values: &[f32], shared: usize, block: usize) -> Chunks {
        let mut chunks = chunked(&values[..shared], &[shared]);
        let mut filler = crate::blocks::Filler::new(&crate::blocks::BlockPool::new(block), values.len() - shared);
        let rest = dpcap_proto::floats::to_bytes(&values[shared..]);
        filler
            .fill(&rest, |b| {
                chunks.push_block(b);
                Ok::<_, ()>(())
            })
            .unwrap();
        chunks
    }

    #[test]
    fn only_owned_blocks_on_the_release_blocks_bounds_are_handed_over_and_the_rest_still_reads() {
        let values: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let read = |chunks: &Chunks, range: Range<usize>| -> Vec<f32> {
            chunks.slices(range).flat_map(|s| dpcap_proto::floats::to_vec(s).unwrap()).collect()
        };
        let lens = |taken: &[Option<Block>]| -> Vec<Option<usize>> {
            taken.iter().map(|b| b.as_ref().map(Block::len)).collect()
        };
        // Blocks of 4 from the start, the last one short: every one is handed over, unless the
        // release runs past the sum (the short block is then not the release's whole block).
        let mut chunks = mixed(&values[..10], 0, 4);
        assert_eq!(lens(&chunks.take_blocks(4, 10)), [Some(4), Some(4), Some(2)]);
        let mut chunks = mixed(&values[..10], 0, 4);
        assert_eq!(lens(&chunks.take_blocks(4, 11)), [Some(4), Some(4), None]);
        assert_eq!(read(&chunks, 8..10), &values[8..10]);
        // Blocks of 4 against release blocks of 8: only the last, short one lines up.
        let mut chunks = mixed(&values, 0, 4);
        assert_eq!(lens(&chunks.take_blocks(8, 12)), [None, Some(4)]);
        assert_eq!(read(&chunks, 0..8), &values[..8]);
        // A shared chunk first (never handed over), then owned blocks on the bounds.
        let mut chunks = mixed(&values, 4, 4);
        assert_eq!(lens(&chunks.take_blocks(4, 12)), [None, Some(4), Some(4)]);
        assert_eq!(read(&chunks, 0..4), &values[..4]);
        // Owned blocks shifted off the bounds by a shared chunk of 2: none is handed over.
        let mut chunks = mixed(&values, 2, 4);
        assert_eq!(lens(&chunks.take_blocks(4, 12)), [None, None, None]);
        assert_eq!(read(&chunks, 0..12), values);
    }

    #[test]
    #[should_panic]
    fn reading_a_handed_over_block_panics_instead_of_reading_short() {
        let values: Vec<f32> = (0..8).map(|v| v as f32).collect();
        let mut chunks = mixed(&values, 0, 4);
        let _taken = chunks.take_blocks(4, 8);
        let _ = chunks.slices(2..3).count();
    }

    #[test]
    fn a_range_is_read_across_the_chunks_that_hold_it() {
        let values: Vec<f32> = (0..10).map(|v| v as f32).collect();
        let chunks = chunked(&values, &[3, 4, 3]);
        let read = |range: Range<usize>| -> Vec<f32> {
            chunks.slices(range).flat_map(|s| dpcap_proto::floats::to_vec(s).unwrap()).collect()
        };
        assert_eq!(read(0..10), values);
        assert_eq!(read(2..8), &values[2..8]);
        assert_eq!(read(3..7), &values[3..7], "exactly the middle chunk");
        assert_eq!(read(5..6), [5.0]);
        assert!(read(4..4).is_empty());
        assert_eq!(chunks.len(), 10);
        // An empty chunk in the middle (a client may send one) changes nothing that is read.
        let mut gapped = chunked(&values, &[3]);
        gapped.push(Bytes::new());
        gapped.push(dpcap_proto::floats::to_bytes(&values[3..]));
        let read: Vec<f32> = gapped.slices(0..10).flat_map(|s| dpcap_proto::floats::to_vec(s).unwrap()).collect();
        assert_eq!(read, values);
    }
}
