//! A step's sampled indices as work units: grouped by shard (locality for range reads) and cut
//! into even shares, one per rank. A share is the coordinator's decision, never a number a
//! worker states: each rank's part is held to C times its own share (`units`), so a worker
//! that could enlarge its share could spend the other ranks' sensitivity. Every rank gets a
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

/// Splits sorted global `sample` indices evenly across `ranks` ranks (each takes ⌊n/W⌋ or
/// ⌈n/W⌉ of the n), in shard order. O(|sample| + shards): the sample is sorted, so the
/// shard cursor only moves forward.
pub fn split_work(sample: &[u64], layout: &Layout, ranks: usize) -> Vec<Vec<WorkUnit>> {
    let n = sample.len();
    let ranks = ranks.max(1);
    let cuts: Vec<usize> = (1..=ranks).map(|r| n * r / ranks).collect();
    let mut out = vec![Vec::new(); ranks];
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
        out[rank] = units;
        start = end.max(start);
    }
    out
}

/// Examples of one shard of one client, for one rank (user-level objectives).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientUnit {
    /// The client's ordinal within its rank's list.
    pub client: u32,
    /// The client's examples in this shard.
    pub unit: WorkUnit,
}

/// Splits sampled clients (each a list of global examples, ascending) evenly across `ranks`
/// ranks by examples: whole clients only (a client's local training needs all its examples on
/// one rank), rank r taking clients until it holds about (r+1)/W of the examples. Each client
/// becomes one unit per shard it spans.
pub fn split_clients(clients: &[&[u64]], layout: &Layout, ranks: usize) -> Vec<Vec<ClientUnit>> {
    let world = ranks.max(1);
    let total: usize = clients.iter().map(|c| c.len()).sum();
    let mut ranks: Vec<Vec<ClientUnit>> = vec![Vec::new(); world];
    let (mut rank, mut taken, mut ordinal) = (0, 0, 0u32);
    for examples in clients {
        // Move to the next rank once this one holds its cumulative quota.
        while rank + 1 < world && taken * world >= total * (rank + 1) {
            rank += 1;
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

/// Units of one rank's share: its examples, or for a user-level job the clients it holds
/// examples of (what one rank's part is held to C times). A client's units are adjacent, so
/// its clients are counted where the ordinal changes: never more than the clients given.
pub fn share_units(units: &[ClientUnit], user_level: bool) -> u64 {
    if user_level {
        let changes = units.windows(2).filter(|pair| pair[0].client != pair[1].client).count();
        if units.is_empty() { 0 } else { changes as u64 + 1 }
    } else {
        units.iter().map(|u| u.unit.indices.len() as u64).sum()
    }
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
