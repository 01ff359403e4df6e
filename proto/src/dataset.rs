//! The dataset index as every component reads it (`index.json`, written by
//! `dpctl dataset index`): shards in name order, examples numbered 0..N across them, and where
//! each example's members lie inside its shard for range reads. N fixes the accounting, and the
//! digest of the index file pins a job to exactly this dataset. Defined once, here.

use serde::{Deserialize, Serialize};

/// Where one member of an example lies inside its shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// File extension (png, jpg, txt, json).
    pub ext: String,
    /// Byte offset of the member's data in the tar.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// One example: its key and members.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExampleEntry {
    /// WebDataset key.
    pub key: String,
    /// The image member.
    pub image: Member,
    /// The caption member.
    pub caption: Member,
    /// Optional JSON metadata (class label).
    pub meta: Option<Member>,
}

/// One shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardIndex {
    /// Path relative to the dataset root.
    pub path: String,
    /// Examples in tar order.
    pub examples: Vec<ExampleEntry>,
}

/// The dataset index: shards in name order, examples numbered 0..N across them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetIndex {
    /// Format version.
    pub version: u32,
    /// Total examples N (the accounting N).
    pub examples: u64,
    /// Shards.
    pub shards: Vec<ShardIndex>,
}

impl DatasetIndex {
    /// (shard, example) of global example `index`; None past N.
    pub fn locate(&self, index: u64) -> Option<(&ShardIndex, &ExampleEntry)> {
        let mut rest = index;
        for shard in &self.shards {
            let n = shard.examples.len() as u64;
            if rest < n {
                return Some((shard, &shard.examples[rest as usize]));
            }
            rest -= n;
        }
        None
    }

    /// Examples per shard, in shard order.
    pub fn counts(&self) -> Vec<u64> {
        self.shards.iter().map(|s| s.examples.len() as u64).collect()
    }
}
