//! A step's sampled indices as work units: grouped by shard (locality for range reads) and cut
//! so that each rank's share is proportional to its measured throughput. Every rank gets a
//! list, possibly empty: a rank with no examples still contributes a zero part.

/// Shard boundaries: shard s holds global examples [starts[s], starts[s+1]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardLayout {
    starts: Vec<u64>,
}

impl ShardLayout {
    /// From examples per shard, in shard order.
    pub fn from_counts(counts: &[u64]) -> Self {
        let mut starts = Vec::with_capacity(counts.len() + 1);
        let mut total = 0;
        starts.push(0);
        for c in counts {
            total += c;
            starts.push(total);
        }
        Self { starts }
    }

    /// The shard holding global example `index`, and its position inside the shard.
    pub fn locate(&self, index: u64) -> (usize, u64) {
        let shard = self.starts.partition_point(|&s| s <= index) - 1;
        (shard, index - self.starts[shard])
    }
}

/// Examples of one shard for one rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkUnit {
    /// Shard number.
    pub shard: usize,
    /// Positions inside the shard, ascending.
    pub indices: Vec<u64>,
}

/// Splits sorted global `sample` indices across ranks with throughputs `weights` (examples per
/// second, > 0): rank r receives about |sample|·w_r/Σw examples, in shard order.
pub fn split_work(sample: &[u64], layout: &ShardLayout, weights: &[f64]) -> Vec<Vec<WorkUnit>> {
    let total_weight: f64 = weights.iter().sum();
    let n = sample.len();
    // Cumulative quotas, rounded so they sum to exactly n.
    let mut cuts = Vec::with_capacity(weights.len());
    let mut acc = 0.0;
    for w in weights {
        acc += w;
        cuts.push(((acc / total_weight) * n as f64).round() as usize);
    }
    if let Some(last) = cuts.last_mut() {
        *last = n;
    }
    let mut ranks = vec![Vec::new(); weights.len()];
    let mut start = 0;
    for (rank, &end) in cuts.iter().enumerate() {
        let mut units: Vec<WorkUnit> = Vec::new();
        for &global in &sample[start..end.max(start)] {
            let (shard, local) = layout.locate(global);
            match units.last_mut() {
                Some(unit) if unit.shard == shard => unit.indices.push(local),
                _ => units.push(WorkUnit { shard, indices: vec![local] }),
            }
        }
        ranks[rank] = units;
        start = end.max(start);
    }
    ranks
}
