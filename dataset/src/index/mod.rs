//! The binary dataset index (`dpctl dataset index` writes it, every component reads it): under
//! the dataset root, `index/manifest.json` lists the tar shards in order with their example
//! counts and the SHA-256 of each shard's table, and `index/shards/{n:06}.bin` says where each
//! example's members lie inside shard n, in 13 to 16 bytes per example. Examples are numbered
//! 0..N across shards ([`Layout`]); N fixes the accounting, and the digest of the manifest pins
//! a job to exactly this dataset, every table included. Decoding never trusts its input.

mod examples;
mod layout;
mod manifest;
mod table;
#[cfg(test)]
mod tests;
mod users;

pub use examples::{EXAMPLES_PATH, ExamplesCheck, encode_examples, example_id};
pub use layout::Layout;
pub use manifest::{ExampleIdsRecord, UsersRecord};
pub use manifest::{Manifest, ShardRecord, Skipped};
pub use table::{ImageKind, ShardTable, Span, TableEntry};
pub use users::{USERS_PATH, UserTable, user_tag};

/// Where the manifest lies under the dataset root; it is the one file a job's digest names.
pub const MANIFEST_PATH: &str = "index/manifest.json";
/// The manifest format this module writes: version 4 pins every shard's bytes (size, content
/// digest, and the store's ETag or version, as version 3 did) and the dataset's example
/// identities ([`EXAMPLES_PATH`]), sorted and distinct. Readers also take versions 2 (shards
/// pinned by their tables only) and 3 (no example identities); DP jobs take version 4 only.
pub const MANIFEST_VERSION: u32 = 4;

/// The oldest manifest format a DP job takes: its examples have identities, none twice.
pub const MANIFEST_VERSION_DP: u32 = 4;

/// The oldest manifest format readers take.
pub const MANIFEST_VERSION_MIN: u32 = 2;

/// Path of shard `shard`'s table under the dataset root, so writer and readers agree on it.
pub fn table_path(shard: usize) -> String {
    format!("index/shards/{shard:06}.bin")
}

/// Why an index could not be read; every message names the offending value.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// A shard table's bytes do not follow the format.
    #[error("malformed shard table: {reason}")]
    Format {
        /// What is wrong and where ("bad magic", "truncated at byte 17", …).
        reason: String,
    },
    /// A manifest field is invalid, so nothing the manifest says can be trusted.
    #[error("manifest field {field}: {reason}")]
    Field {
        /// The field's name as it appears in the JSON.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The manifest is not JSON of a manifest's shape.
    #[error("manifest field manifest: not valid JSON: {0}")]
    Json(#[source] serde_json::Error),
    /// A table's bytes are not the ones the manifest pinned.
    #[error("shard {shard} table digest is {actual}, the manifest pins {expected}")]
    Digest {
        /// Shard number in manifest order.
        shard: usize,
        /// Digest recorded in the manifest.
        expected: String,
        /// Digest of the bytes read.
        actual: String,
    },
    /// A table disagrees with the manifest on its size or example count.
    #[error("shard {shard} {what} is {actual}, the manifest says {expected}")]
    Count {
        /// Shard number in manifest order.
        shard: usize,
        /// Which count ("table bytes", "examples").
        what: &'static str,
        /// Count recorded in the manifest.
        expected: u64,
        /// Count found.
        actual: u64,
    },
}

pub(crate) fn malformed(reason: String) -> IndexError {
    IndexError::Format { reason }
}

pub(crate) fn field(field: &'static str, reason: String) -> IndexError {
    IndexError::Field { field, reason }
}
