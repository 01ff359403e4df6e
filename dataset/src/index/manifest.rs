//! The manifest: shards in order, their counts and their tables' digests.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use super::{IndexError, Layout, MANIFEST_VERSION, MANIFEST_VERSION_MIN, ShardTable, field};

const DIGEST_PREFIX: &str = "sha256:";

/// One shard as the manifest records it; its table digest and (version 3) its bytes' digest make
/// the manifest digest pin it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRecord {
    /// Tar path relative to the dataset root, e.g. "00000.tar".
    pub path: String,
    /// Examples indexed in this shard (entries in its table).
    pub examples: u64,
    /// Examples left out of this shard because a member was missing or corrupt.
    pub skipped: u64,
    /// Length of the shard's table file.
    pub table_bytes: u64,
    /// [`dpcap_proto::digest::sha256`] of the table file ("sha256:" and 64 lowercase hex digits).
    pub table_sha256: String,
    /// The shard's size in bytes (0 in version-2 manifests: not pinned).
    #[serde(default)]
    pub bytes: u64,
    /// The SHA-256 of the shard's bytes ("" in version-2 manifests): what the data is.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sha256: String,
    /// The store's ETag of the shard when it was indexed: a cheap check that it is unchanged
    /// (range reads ask for it); a shard whose ETag differs is read whole once and accepted
    /// only if its SHA-256 is the pinned one (a copy of the dataset elsewhere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e_tag: Option<String>,
    /// The store's object version, where it keeps versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_version: Option<String>,
}

/// Whether `digest` is `sha256:` and 64 lowercase hex digits.
fn is_digest(digest: &str) -> bool {
    let hex = digest.strip_prefix(DIGEST_PREFIX).unwrap_or_default();
    hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl ShardRecord {
    /// Whether the manifest pins the shard's bytes (version 3), not only its table.
    pub fn pins_bytes(&self) -> bool {
        !self.sha256.is_empty()
    }
}

/// Why examples were left out, dataset-wide, so an operator can tell a bad crawl from a bad index.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    /// No image member.
    pub missing_image: u64,
    /// No caption member.
    pub missing_caption: u64,
    /// Image member unreadable.
    pub corrupt_image: u64,
    /// Caption member unreadable (not UTF-8, say).
    pub corrupt_caption: u64,
    /// The same image and caption bytes as an example indexed before it (one example, held
    /// once: a second copy would be sampled at about 2q and contribute up to 2C).
    #[serde(default)]
    pub duplicate: u64,
}

impl Skipped {
    /// All skipped examples (saturating), to compare with the per-shard counts.
    pub fn total(&self) -> u64 {
        [self.missing_caption, self.corrupt_image, self.corrupt_caption, self.duplicate]
            .iter()
            .fold(self.missing_image, |a, b| a.saturating_add(*b))
    }

    /// Adds another shard's counts (saturating), as the indexer merges shards.
    pub fn add(&mut self, other: &Skipped) {
        self.missing_image = self.missing_image.saturating_add(other.missing_image);
        self.missing_caption = self.missing_caption.saturating_add(other.missing_caption);
        self.corrupt_image = self.corrupt_image.saturating_add(other.corrupt_image);
        self.corrupt_caption = self.corrupt_caption.saturating_add(other.corrupt_caption);
        self.duplicate = self.duplicate.saturating_add(other.duplicate);
    }
}

/// The dataset as a job sees it: shards in order, N examples, and the tables' digests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Format version, [`MANIFEST_VERSION`].
    pub version: u32,
    /// Total examples N, the accounting N: the sum of the shards' counts.
    pub examples: u64,
    /// Shards in index order.
    pub shards: Vec<ShardRecord>,
    /// Why examples were left out, dataset-wide.
    pub skipped: Skipped,
    /// The user table, when examples carry a `user` in their `KEY.json` (user-level DP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub users: Option<UsersRecord>,
    /// The example identities (version 4): `index/examples.bin` as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub example_ids: Option<ExampleIdsRecord>,
}

/// `index/examples.bin` as the manifest pins it: N ids, sorted and distinct.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExampleIdsRecord {
    /// Length of the file: 13 + 8·N.
    pub bytes: u64,
    /// [`dpcap_proto::digest::sha256`] of the file: what the examples are, however they are cut
    /// into shards, indexed or stored (the data's identity, [`Manifest::data_digest`]).
    pub sha256: String,
}

/// The user table as the manifest pins it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsersRecord {
    /// Distinct users.
    pub users: u64,
    /// Examples whose metadata names no user: a user-level job refuses the dataset while any
    /// remain (their owner is unknown, so no user-level bound covers them).
    pub without_user: u64,
    /// Length of `index/users.bin`.
    pub table_bytes: u64,
    /// [`dpcap_proto::digest::sha256`] of `index/users.bin`.
    pub table_sha256: String,
}

impl Manifest {
    /// Parses and validates a manifest, so no reader acts on totals that do not add up.
    pub fn parse(bytes: &[u8]) -> Result<Manifest, IndexError> {
        let m: Manifest = serde_json::from_slice(bytes).map_err(IndexError::Json)?;
        if !(MANIFEST_VERSION_MIN..=MANIFEST_VERSION).contains(&m.version) {
            return Err(field(
                "version",
                format!("version {} is not {MANIFEST_VERSION_MIN}..={MANIFEST_VERSION}", m.version),
            ));
        }
        let (mut examples, mut skipped, mut seen, mut contents) = (0u64, 0u64, HashSet::new(), HashSet::new());
        for (n, s) in m.shards.iter().enumerate() {
            // Canonical paths only: `a//x.tar` or `a/x.tar/` would name the same object as
            // `a/x.tar` in an object store, and a shard listed twice puts each of its examples
            // at two positions (sampled at about 2q, contributing up to 2C): the accounting fails.
            let bad_path = s.path.contains('\\') || s.path.split('/').any(|seg| matches!(seg, "" | "." | ".."));
            if bad_path || !seen.insert(s.path.as_str()) {
                return Err(field(
                    "path",
                    format!("shard {n} path {:?} is empty, absolute, not canonical, escaping or repeated", s.path),
                ));
            }
            if !is_digest(&s.table_sha256) {
                return Err(field(
                    "table_sha256",
                    format!("shard {n} digest {:?} is not sha256:<64 hex>", s.table_sha256),
                ));
            }
            // Version 3 pins every shard's bytes: a record without a pin would be read unchecked,
            // and two shards with the same bytes put each example in twice.
            if m.version >= 3 {
                if !is_digest(&s.sha256) || s.bytes == 0 {
                    return Err(field(
                        "sha256",
                        format!("shard {n} ({}) pins no bytes: size {}, digest {:?}", s.path, s.bytes, s.sha256),
                    ));
                }
                if !contents.insert(s.sha256.as_str()) {
                    return Err(field("sha256", format!("shard {n} ({}) has the same bytes as another shard", s.path)));
                }
            }
            let overflow = || field("examples", format!("shard {n} counts overflow u64"));
            examples = examples.checked_add(s.examples).ok_or_else(overflow)?;
            skipped = skipped.checked_add(s.skipped).ok_or_else(overflow)?;
        }
        if m.version >= 4 {
            let pinned = m.example_ids.as_ref().filter(|r| is_digest(&r.sha256));
            let Some(ids) = pinned else {
                return Err(field("example_ids", format!("version {} pins no example identities", m.version)));
            };
            if Some(ids.bytes) != examples.checked_mul(8).and_then(|b| b.checked_add(13)) {
                return Err(field("example_ids", format!("{} bytes cannot hold {examples} ids", ids.bytes)));
            }
        }
        if examples != m.examples {
            return Err(field("examples", format!("total {} is not the shards' sum {examples}", m.examples)));
        }
        if skipped != m.skipped.total() {
            return Err(field("skipped", format!("total {} is not the shards' sum {skipped}", m.skipped.total())));
        }
        Ok(m)
    }

    /// The digest that pins a job to this dataset: the manifest holds every table's digest.
    pub fn digest(bytes: &[u8]) -> String {
        dpcap_proto::digest::sha256(bytes)
    }

    /// What the data is, whatever indexed it: the digest of its example identities (version 4),
    /// so neither the manifest's bytes, the cut into shards, their order, their paths, the
    /// store nor a tokenizer change it; a version-3 index's [`Manifest::shards_digest`]; None
    /// when the index does not pin every shard's bytes (version 2). A dataset's budget is keyed
    /// by it, so a copy, a re-cut or a re-index of the same examples spends the same budget.
    pub fn data_digest(&self) -> Option<String> {
        match &self.example_ids {
            // Parsed (and so checked) only from version 4 on.
            Some(ids) if self.version >= 4 => Some(ids.sha256.clone()),
            _ => self.shards_digest(),
        }
    }

    /// The digest of the shards' content digests, sorted: what version 3 named the data by, so
    /// a budget set then still binds the same shards indexed again.
    pub fn shards_digest(&self) -> Option<String> {
        if self.shards.is_empty() || !self.shards.iter().all(ShardRecord::pins_bytes) {
            return None;
        }
        let mut digests: Vec<&str> = self.shards.iter().map(|s| s.sha256.as_str()).collect();
        digests.sort_unstable();
        Some(dpcap_proto::digest::sha256(format!("dpcap data v1\n{}", digests.join("\n")).as_bytes()))
    }

    /// Where global example numbers fall, in O(shards) memory.
    pub fn layout(&self) -> Layout {
        Layout::from_counts(&self.shards.iter().map(|s| s.examples).collect::<Vec<_>>())
    }

    /// Decodes the user table after checking it is exactly the one this manifest pinned.
    pub fn check_users(&self, bytes: &[u8]) -> Result<super::UserTable, IndexError> {
        let record = self
            .users
            .as_ref()
            .ok_or_else(|| field("users", "the index has no user table (no example names a `user`)".into()))?;
        let actual = dpcap_proto::digest::sha256(bytes);
        if bytes.len() as u64 != record.table_bytes || actual != record.table_sha256 {
            return Err(field(
                "users",
                format!(
                    "users.bin is {} bytes with digest {actual}, the manifest pins {}",
                    bytes.len(),
                    record.table_sha256
                ),
            ));
        }
        if record.without_user > 0 {
            return Err(field(
                "users",
                format!(
                    "{} examples name no user in their KEY.json: no user-level bound covers them",
                    record.without_user
                ),
            ));
        }
        let table = super::UserTable::decode(bytes, self.examples)?;
        if table.users() as u64 != record.users {
            return Err(field(
                "users",
                format!("users.bin has {} users, the manifest says {}", table.users(), record.users),
            ));
        }
        Ok(table)
    }

    /// Decodes shard `shard`'s table after checking it is exactly the one this manifest pinned.
    pub fn check_table(&self, shard: usize, bytes: &[u8]) -> Result<ShardTable, IndexError> {
        let record = self
            .shards
            .get(shard)
            .ok_or_else(|| field("shards", format!("no shard {shard} of {}", self.shards.len())))?;
        let count = |what, expected, actual| IndexError::Count { shard, what, expected, actual };
        if bytes.len() as u64 != record.table_bytes {
            return Err(count("table bytes", record.table_bytes, bytes.len() as u64));
        }
        let actual = dpcap_proto::digest::sha256(bytes);
        if actual != record.table_sha256 {
            return Err(IndexError::Digest { shard, expected: record.table_sha256.clone(), actual });
        }
        let table = ShardTable::decode(bytes)?;
        if table.entries.len() as u64 != record.examples {
            return Err(count("examples", record.examples, table.entries.len() as u64));
        }
        Ok(table)
    }
}
