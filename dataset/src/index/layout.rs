//! Global example numbering across shards.

/// Global example numbering across shards: `starts[i]` is shard i's first example and the last
/// element is N, so lookups cost O(log shards) and no per-example memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    starts: Vec<u64>,
}

impl Layout {
    /// The layout of shards holding `counts` examples each (sums saturate; manifests are checked).
    pub fn from_counts(counts: &[u64]) -> Layout {
        let mut starts = Vec::with_capacity(counts.len() + 1);
        starts.push(0u64);
        for (i, c) in counts.iter().enumerate() {
            starts.push(starts[i].saturating_add(*c));
        }
        Layout { starts }
    }

    /// Total examples N.
    pub fn examples(&self) -> u64 {
        self.starts[self.starts.len() - 1]
    }

    /// Number of shards, empty ones included.
    pub fn shards(&self) -> usize {
        self.starts.len() - 1
    }

    /// Examples in `shard`; None when there is no such shard.
    pub fn count(&self, shard: usize) -> Option<u64> {
        Some(self.starts.get(shard.checked_add(1)?)? - self.starts[shard])
    }

    /// Global number of `shard`'s first example; None when there is no such shard.
    pub fn start(&self, shard: usize) -> Option<u64> {
        if shard < self.shards() { self.starts.get(shard).copied() } else { None }
    }

    /// (shard, local index) of global example `global`, never an empty shard; None past N.
    pub fn locate(&self, global: u64) -> Option<(usize, u64)> {
        if global >= self.examples() {
            return None;
        }
        let shard = self.starts.partition_point(|&s| s <= global).checked_sub(1)?;
        Some((shard, global - self.starts[shard]))
    }

    /// Global number of `shard`'s example `local`; None when either is out of range.
    pub fn global(&self, shard: usize, local: u64) -> Option<u64> {
        (local < self.count(shard)?).then(|| self.starts[shard] + local)
    }
}
