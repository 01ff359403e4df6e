//! A step's sampled indices as work units: grouped by shard (locality for range reads) and cut
//! so that each rank's share is proportional to its measured throughput. Every rank gets a
//! list, possibly empty: a rank with no examples still contributes a zero part.

use dpcap_proto::index::Layout;
use dpcap_proto::v1::step_work::Action;
use dpcap_proto::v1::{ExampleRange, StepWork};

/// Examples of one shard for one rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkUnit {
    /// Shard number.
    pub shard: usize,
    /// Positions inside the shard, ascending.
    pub indices: Vec<u64>,
}

/// Splits sorted global `sample` indices across ranks with throughputs `weights` (examples per
/// second, > 0): rank r receives about |sample|·w_r/Σw examples, in shard order. O(|sample| +
/// shards): the sample is sorted, so the shard cursor only moves forward.
pub fn split_work(sample: &[u64], layout: &Layout, weights: &[f64]) -> Vec<Vec<WorkUnit>> {
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
    let (mut start, mut shard) = (0, 0);
    for (rank, &end) in cuts.iter().enumerate() {
        let mut units: Vec<WorkUnit> = Vec::new();
        for &global in &sample[start..end.max(start)] {
            // Sampled indices are < N by construction; the layout holds exactly N.
            while layout.start(shard + 1).is_some_and(|next| next <= global) {
                shard += 1;
            }
            let Some(first) = layout.start(shard) else { continue };
            let local = global - first;
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

/// The message that tells a rank to run `step` on `units`.
pub fn step_work(step: u64, units: Vec<WorkUnit>, checkpoint: bool) -> StepWork {
    let units = units.into_iter().map(|u| ExampleRange { shard: u.shard as u32, indices: u.indices }).collect();
    StepWork { action: Action::Run as i32, step, units, checkpoint }
}
