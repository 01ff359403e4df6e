//! A step's sampled indices as work units: grouped by shard (locality for range reads) and cut
//! so that each rank's share is proportional to its measured throughput. Every rank gets a
//! list, possibly empty: a rank with no examples still contributes a zero part.

use dpcap_dataset::index::Layout;
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

/// Examples of one shard of one client, for one rank (user-level objectives).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientUnit {
    /// The client's ordinal within its rank's list.
    pub client: u32,
    /// The client's examples in this shard.
    pub unit: WorkUnit,
}

/// Splits sampled clients (each a list of global examples, ascending) across ranks with
/// throughputs `weights`: whole clients only (a client's local training needs all its
/// examples on one rank), rank r taking clients until its share of the examples reaches
/// about Σ|client|·w_r/Σw. Each client becomes one unit per shard it spans.
pub fn split_clients(clients: &[&[u64]], layout: &Layout, weights: &[f64]) -> Vec<Vec<ClientUnit>> {
    let total_weight: f64 = weights.iter().sum();
    let total: usize = clients.iter().map(|c| c.len()).sum();
    let mut ranks: Vec<Vec<ClientUnit>> = vec![Vec::new(); weights.len()];
    let (mut rank, mut acc_weight, mut taken, mut ordinal) = (0, weights.first().copied().unwrap_or(1.0), 0, 0u32);
    for examples in clients {
        // Move to the next rank once this one holds its cumulative quota.
        while rank + 1 < weights.len() && taken as f64 >= acc_weight / total_weight * total as f64 {
            rank += 1;
            acc_weight += weights[rank];
            ordinal = 0;
        }
        for &global in *examples {
            let Some((shard, local)) = layout.locate(global) else { continue };
            match ranks[rank].last_mut() {
                Some(u) if u.client == ordinal && u.unit.shard == shard => u.unit.indices.push(local),
                _ => ranks[rank].push(ClientUnit { client: ordinal, unit: WorkUnit { shard, indices: vec![local] } }),
            }
        }
        taken += examples.len();
        ordinal += 1;
    }
    ranks
}

/// The message that tells a rank to run `step` on `units`.
pub fn step_work(step: u64, units: Vec<ClientUnit>, checkpoint: bool) -> StepWork {
    let units = units
        .into_iter()
        .map(|u| ExampleRange { shard: u.unit.shard as u32, indices: u.unit.indices, client: u.client })
        .collect();
    StepWork { action: Action::Run as i32, step, units, checkpoint, capability: String::new() }
}

/// Example-level units as client units (every example its own unit; `client` is unused).
pub fn example_units(units: Vec<WorkUnit>) -> Vec<ClientUnit> {
    units.into_iter().map(|unit| ClientUnit { client: 0, unit }).collect()
}
