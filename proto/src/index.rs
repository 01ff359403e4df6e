//! The binary dataset index (`dpctl dataset index` writes it, every component reads it): under
//! the dataset root, `index/manifest.json` lists the tar shards in order with their example
//! counts and the SHA-256 of each shard's table, and `index/shards/{n:06}.bin` says where each
//! example's members lie inside shard n, in 13 to 16 bytes per example. Examples are numbered
//! 0..N across shards ([`Layout`]); N fixes the accounting, and the digest of the manifest pins
//! a job to exactly this dataset, every table included. Decoding never trusts its input.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

/// Where the manifest lies under the dataset root; it is the one file a job's digest names.
pub const MANIFEST_PATH: &str = "index/manifest.json";
/// The manifest format this module reads and writes; readers reject any other.
pub const MANIFEST_VERSION: u32 = 2;
const MAGIC: &[u8; 4] = b"DPIX";
const TABLE_VERSION: u8 = 1;
/// Fewest bytes an encoded entry can take (flags, then two one-byte varints per span for two spans).
const MIN_ENTRY_BYTES: usize = 5;
const DIGEST_PREFIX: &str = "sha256:";

/// Path of shard `shard`'s table under the dataset root, so writer and readers agree on it.
pub fn table_path(shard: usize) -> String {
    format!("index/shards/{shard:06}.bin")
}

/// Why an index could not be read; every message names the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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

fn malformed(reason: String) -> IndexError {
    IndexError::Format { reason }
}

fn field(field: &'static str, reason: String) -> IndexError {
    IndexError::Field { field, reason }
}

/// Image encodings a shard may hold; the table stores the kind so readers need no tar headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageKind {
    /// `.jpg` / `.jpeg`.
    Jpeg = 0,
    /// `.png`.
    Png = 1,
    /// `.webp`.
    Webp = 2,
}

impl ImageKind {
    /// The kind a tar member's extension names (case-insensitive); None when it is no image.
    pub fn from_ext(ext: &str) -> Option<Self> {
        match ext.to_ascii_lowercase().as_str() {
            "jpg" | "jpeg" => Some(Self::Jpeg),
            "png" => Some(Self::Png),
            "webp" => Some(Self::Webp),
            _ => None,
        }
    }

    /// The canonical extension, for messages and for rebuilding member names.
    pub fn ext(&self) -> &'static str {
        match self {
            Self::Jpeg => "jpg",
            Self::Png => "png",
            Self::Webp => "webp",
        }
    }
}

/// A member's data bytes inside its tar, so a reader can fetch it with one range read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// Offset of the first data byte (past the member's tar header).
    pub offset: u64,
    /// Data length in bytes (padding excluded).
    pub len: u64,
}

impl Span {
    /// One past the last data byte; saturates, though decoded spans never overflow.
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.len)
    }
}

/// Where one example's members lie: all a reader needs to fetch it without parsing the tar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableEntry {
    /// How the image is encoded.
    pub image_kind: ImageKind,
    /// The image member.
    pub image: Span,
    /// The caption member (`.txt`).
    pub caption: Span,
    /// The metadata member (`.json`), when the shard has one for this example.
    pub meta: Option<Span>,
}

/// One shard's examples in tar order; local example i is `entries[i]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardTable {
    /// Entries in tar order.
    pub entries: Vec<TableEntry>,
}

impl ShardTable {
    /// The table's bytes: `DPIX`, version 1, a varint count, then per entry a flags byte and,
    /// per member, zigzag(offset − end of the previous member) and len as LEB128 varints.
    /// Spans must end at or below `i64::MAX`; a table holding others fails [`ShardTable::decode`].
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(6 + self.entries.len() * 16);
        out.extend_from_slice(MAGIC);
        out.push(TABLE_VERSION);
        put_varint(&mut out, self.entries.len() as u64);
        let mut cursor = 0u64;
        for entry in &self.entries {
            out.push(entry.image_kind as u8 | if entry.meta.is_some() { 4 } else { 0 });
            for span in [Some(entry.image), Some(entry.caption), entry.meta].into_iter().flatten() {
                put_varint(&mut out, zigzag(span.offset.wrapping_sub(cursor) as i64));
                put_varint(&mut out, span.len);
                cursor = span.offset.wrapping_add(span.len);
            }
        }
        out
    }

    /// Reads a table; any byte string yields a table or an error, never a panic, and memory is
    /// bounded by the input's length whatever count it claims.
    pub fn decode(bytes: &[u8]) -> Result<ShardTable, IndexError> {
        if bytes.get(..4) != Some(MAGIC.as_slice()) {
            return Err(malformed("bad magic".into()));
        }
        let mut r = Reader { bytes, pos: 4 };
        let version = r.byte()?;
        if version != TABLE_VERSION {
            return Err(malformed(format!("unknown version {version}")));
        }
        let count = r.varint()?;
        let room = (bytes.len() - r.pos) / MIN_ENTRY_BYTES;
        if count > room as u64 {
            return Err(malformed(format!("count {count} does not fit in {} bytes", bytes.len() - r.pos)));
        }
        let mut entries = Vec::with_capacity(room.min(count as usize));
        let mut cursor = 0u64;
        for _ in 0..count {
            let at = r.pos;
            let flags = r.byte()?;
            if flags & !7 != 0 {
                return Err(malformed(format!("reserved flag bits in {flags:#04x} at byte {at}")));
            }
            let kinds = [ImageKind::Jpeg, ImageKind::Png, ImageKind::Webp];
            let image_kind = *kinds
                .get(usize::from(flags & 3))
                .ok_or_else(|| malformed(format!("unknown image kind {} at byte {at}", flags & 3)))?;
            let image = r.span(&mut cursor)?;
            let caption = r.span(&mut cursor)?;
            let meta = if flags & 4 != 0 { Some(r.span(&mut cursor)?) } else { None };
            entries.push(TableEntry { image_kind, image, caption, meta });
        }
        if r.pos != bytes.len() {
            return Err(malformed(format!("{} trailing bytes at byte {}", bytes.len() - r.pos, r.pos)));
        }
        Ok(ShardTable { entries })
    }
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn zigzag(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

fn unzigzag(value: u64) -> i64 {
    (value >> 1) as i64 ^ -((value & 1) as i64)
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, IndexError> {
        let byte = *self.bytes.get(self.pos).ok_or_else(|| malformed(format!("truncated at byte {}", self.pos)))?;
        self.pos += 1;
        Ok(byte)
    }

    fn varint(&mut self) -> Result<u64, IndexError> {
        let start = self.pos;
        let mut value = 0u64;
        for i in 0..10 {
            let byte = self.byte()?;
            let low = u64::from(byte & 0x7f);
            if i == 9 && low > 1 {
                break;
            }
            value |= low << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(malformed(format!("varint overflow at byte {start}")))
    }

    fn span(&mut self, cursor: &mut u64) -> Result<Span, IndexError> {
        let at = self.pos;
        let delta = unzigzag(self.varint()?);
        let len = self.varint()?;
        let offset = u64::try_from(i128::from(*cursor) + i128::from(delta))
            .map_err(|_| malformed(format!("offset {cursor}{delta:+} out of range at byte {at}")))?;
        *cursor =
            offset.checked_add(len).ok_or_else(|| malformed(format!("span {offset}+{len} overflows at byte {at}")))?;
        Ok(Span { offset, len })
    }
}

/// One shard as the manifest records it; its table digest makes the manifest digest pin it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRecord {
    /// Tar path relative to the dataset root, e.g. "00000.tar".
    pub path: String,
    /// Examples indexed in this shard (entries in its table).
    pub examples: u64,
    /// Examples left out of this shard because a member was missing or corrupt.
    pub skipped: u64,
    /// Length of the shard's table file.
    pub table_bytes: u64,
    /// [`crate::digest::sha256`] of the table file ("sha256:" and 64 lowercase hex digits).
    pub table_sha256: String,
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
}

impl Skipped {
    /// All skipped examples (saturating), to compare with the per-shard counts.
    pub fn total(&self) -> u64 {
        [self.missing_caption, self.corrupt_image, self.corrupt_caption]
            .iter()
            .fold(self.missing_image, |a, b| a.saturating_add(*b))
    }

    /// Adds another shard's counts (saturating), as the indexer merges shards.
    pub fn add(&mut self, other: &Skipped) {
        self.missing_image = self.missing_image.saturating_add(other.missing_image);
        self.missing_caption = self.missing_caption.saturating_add(other.missing_caption);
        self.corrupt_image = self.corrupt_image.saturating_add(other.corrupt_image);
        self.corrupt_caption = self.corrupt_caption.saturating_add(other.corrupt_caption);
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
}

impl Manifest {
    /// Parses and validates a manifest, so no reader acts on totals that do not add up.
    pub fn parse(bytes: &[u8]) -> Result<Manifest, IndexError> {
        let m: Manifest =
            serde_json::from_slice(bytes).map_err(|e| field("manifest", format!("not valid JSON: {e}")))?;
        if m.version != MANIFEST_VERSION {
            return Err(field("version", format!("version {} is not {MANIFEST_VERSION}", m.version)));
        }
        let (mut examples, mut skipped, mut seen) = (0u64, 0u64, HashSet::new());
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
            let hex = s.table_sha256.strip_prefix(DIGEST_PREFIX).unwrap_or_default();
            if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
                return Err(field(
                    "table_sha256",
                    format!("shard {n} digest {:?} is not sha256:<64 hex>", s.table_sha256),
                ));
            }
            let overflow = || field("examples", format!("shard {n} counts overflow u64"));
            examples = examples.checked_add(s.examples).ok_or_else(overflow)?;
            skipped = skipped.checked_add(s.skipped).ok_or_else(overflow)?;
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
        crate::digest::sha256(bytes)
    }

    /// Where global example numbers fall, in O(shards) memory.
    pub fn layout(&self) -> Layout {
        Layout::from_counts(&self.shards.iter().map(|s| s.examples).collect::<Vec<_>>())
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
        let actual = crate::digest::sha256(bytes);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rng(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    /// Lays out `n` examples as a tar would (512-byte header, data padded to 512), members in `order`.
    fn tar_table(n: usize, order: [usize; 3], seed: u64) -> ShardTable {
        let (mut s, mut pos) = (seed, 0u64);
        let entries = (0..n)
            .map(|_| {
                let lens = [5_000 + rng(&mut s) % 55_000, 20 + rng(&mut s) % 180, 300 + rng(&mut s) % 600];
                let mut spans = [Span { offset: 0, len: 0 }; 3];
                for m in order {
                    spans[m] = Span { offset: pos + 512, len: lens[m] };
                    pos += 512 + lens[m].div_ceil(512) * 512;
                }
                TableEntry { image_kind: ImageKind::Jpeg, image: spans[0], caption: spans[1], meta: Some(spans[2]) }
            })
            .collect();
        ShardTable { entries }
    }

    fn small_table() -> ShardTable {
        let span = |offset, len| Span { offset, len };
        let entries = vec![
            TableEntry { image_kind: ImageKind::Jpeg, image: span(512, 9000), caption: span(10240, 40), meta: None },
            TableEntry {
                image_kind: ImageKind::Png,
                image: span(12800, 7),
                caption: span(11264, 0),
                meta: Some(span(1, 2)),
            },
            TableEntry {
                image_kind: ImageKind::Webp,
                image: span(i64::MAX as u64 - 9, 9),
                caption: span(0, 0),
                meta: None,
            },
        ];
        ShardTable { entries }
    }

    fn format_error(bytes: &[u8]) -> String {
        match ShardTable::decode(bytes) {
            Err(IndexError::Format { reason }) => reason,
            other => panic!("expected a format error, got {other:?}"),
        }
    }

    #[test]
    fn a_table_round_trips_and_stays_under_16_bytes_per_example() {
        for (order, seed) in [([0, 1, 2], 7), ([0, 2, 1], 11), ([1, 0, 2], 13)] {
            let table = tar_table(10_000, order, seed);
            let bytes = table.encode();
            eprintln!("order {order:?}: {:.2} bytes/example", bytes.len() as f64 / 10_000.0);
            assert!(bytes.len() <= 16 * 10_000, "{} bytes for order {order:?}", bytes.len());
            assert_eq!(ShardTable::decode(&bytes).unwrap(), table);
        }
    }

    #[test]
    fn every_kind_with_and_without_meta_and_members_in_any_order_round_trips() {
        let table = small_table();
        assert_eq!(ShardTable::decode(&table.encode()).unwrap(), table);
        assert_eq!(ShardTable::decode(&ShardTable::default().encode()).unwrap(), ShardTable::default());
    }

    #[test]
    fn every_truncation_of_a_valid_table_is_an_error() {
        let bytes = small_table().encode();
        for end in 0..bytes.len() {
            assert!(ShardTable::decode(&bytes[..end]).is_err(), "prefix of {end} bytes decoded");
        }
    }

    #[test]
    fn random_garbage_and_mutated_tables_never_panic() {
        let (mut s, valid) = (0x9e37_79b9_7f4a_7c15u64, tar_table(20, [0, 1, 2], 3).encode());
        for i in 0..6000 {
            let mut bytes: Vec<u8> = match i % 3 {
                0 => Vec::new(),
                1 => b"DPIX\x01".to_vec(),
                _ => valid.clone(),
            };
            if i % 3 == 2 {
                for _ in 0..1 + rng(&mut s) % 3 {
                    let at = (rng(&mut s) % bytes.len() as u64) as usize;
                    bytes[at] = rng(&mut s) as u8;
                }
            } else {
                bytes.extend((0..rng(&mut s) % 80).map(|_| rng(&mut s) as u8));
            }
            let _ = ShardTable::decode(&bytes);
        }
    }

    #[test]
    fn a_huge_claimed_count_in_a_short_input_is_rejected_before_allocating() {
        let mut bytes = b"DPIX\x01".to_vec();
        put_varint(&mut bytes, u64::MAX);
        bytes.extend([0; 20]);
        assert!(format_error(&bytes).contains(&format!("count {}", u64::MAX)));
    }

    #[test]
    fn malformed_tables_are_rejected_with_the_reason() {
        let good = small_table().encode();
        let with = |at: usize, byte: u8| [&good[..at], &[byte], &good[at + 1..]].concat();
        assert_eq!(format_error(b"DPIY\x01\x00"), "bad magic");
        assert_eq!(format_error(&with(4, 2)), "unknown version 2");
        assert!(format_error(&with(6, 0x08)).starts_with("reserved flag bits in 0x08"));
        assert!(format_error(&with(6, 3)).starts_with("unknown image kind 3"));
        assert!(format_error(&[&good[..], &[0]].concat()).starts_with("1 trailing bytes"));
        assert!(format_error(b"DPIX\x01\x01\x00\x01\x00\x00\x00").starts_with("offset 0-1 out of range"));
        assert!(format_error(&[b"DPIX\x01".as_slice(), &[0xff; 10], &[1]].concat()).starts_with("varint overflow"));
        let mut end_overflow = b"DPIX\x01\x01\x00".to_vec();
        put_varint(&mut end_overflow, zigzag(i64::MAX));
        put_varint(&mut end_overflow, u64::MAX);
        assert!(format_error(&[&end_overflow[..], &[0, 0]].concat()).contains("overflows"));
    }

    fn manifest() -> (Manifest, Vec<Vec<u8>>) {
        let tables =
            [tar_table(3, [0, 1, 2], 1), ShardTable::default(), tar_table(2, [0, 1, 2], 2)].map(|t| t.encode());
        let shards = tables
            .iter()
            .enumerate()
            .map(|(i, t)| ShardRecord {
                path: format!("{i:05}.tar"),
                examples: [3, 0, 2][i],
                skipped: 1,
                table_bytes: t.len() as u64,
                table_sha256: crate::digest::sha256(t),
            })
            .collect();
        let skipped = Skipped { missing_image: 1, missing_caption: 1, corrupt_image: 0, corrupt_caption: 1 };
        (Manifest { version: MANIFEST_VERSION, examples: 5, shards, skipped }, tables.to_vec())
    }

    fn rejected_field(m: &Manifest) -> &'static str {
        match Manifest::parse(&serde_json::to_vec(m).unwrap()) {
            Err(IndexError::Field { field, .. }) => field,
            other => panic!("expected a field error, got {other:?}"),
        }
    }

    #[test]
    fn manifest_parse_rejects_wrong_totals_bad_digests_escaping_paths_and_version_1() {
        let (good, _) = manifest();
        assert_eq!(Manifest::parse(&serde_json::to_vec(&good).unwrap()).unwrap(), good);
        let broken = |edit: fn(&mut Manifest)| {
            let mut m = good.clone();
            edit(&mut m);
            rejected_field(&m)
        };
        assert_eq!(broken(|m| m.version = 1), "version");
        assert_eq!(broken(|m| m.examples = 6), "examples");
        assert_eq!(broken(|m| m.shards[1].examples = u64::MAX), "examples");
        assert_eq!(broken(|m| m.skipped.corrupt_image = 1), "skipped");
        assert_eq!(broken(|m| m.shards[0].table_sha256 = format!("sha256:{}", "A".repeat(64))), "table_sha256");
        assert_eq!(broken(|m| m.shards[0].table_sha256 = m.shards[0].table_sha256[7..].to_string()), "table_sha256");
        for path in
            ["", "/data/0.tar", "../0.tar", "a/../../0.tar", "a\\0.tar", "00001.tar", "a//0.tar", "a/0.tar/", "./0.tar"]
        {
            let mut m = good.clone();
            m.shards[0].path = path.into();
            assert_eq!(rejected_field(&m), "path", "{path:?}");
        }
        assert!(matches!(Manifest::parse(b"{"), Err(IndexError::Field { field: "manifest", .. })));
        assert_eq!(Manifest::digest(b""), crate::digest::sha256(b""));
    }

    #[test]
    fn check_table_accepts_the_pinned_table_and_rejects_a_flipped_byte_and_a_wrong_length() {
        let (m, tables) = manifest();
        assert_eq!(m.check_table(0, &tables[0]).unwrap().entries.len(), 3);
        let mut flipped = tables[2].clone();
        flipped[7] ^= 1;
        assert!(matches!(m.check_table(2, &flipped), Err(IndexError::Digest { shard: 2, .. })));
        let err = m.check_table(0, &tables[0][1..]).unwrap_err();
        assert!(matches!(err, IndexError::Count { shard: 0, what: "table bytes", .. }), "{err}");
        assert!(m.check_table(3, &tables[0]).is_err());
        let mut lying = m.clone();
        lying.shards[1].examples = 1;
        assert!(matches!(lying.check_table(1, &tables[1]), Err(IndexError::Count { what: "examples", .. })));
    }

    #[test]
    fn layout_locate_and_global_agree_for_every_example_and_skip_empty_shards() {
        let layout = Layout::from_counts(&[3, 0, 0, 2, 5, 0]);
        assert_eq!((layout.examples(), layout.shards()), (10, 6));
        for g in 0..10 {
            let (shard, local) = layout.locate(g).unwrap();
            assert!(layout.count(shard).unwrap() > 0, "example {g} in empty shard {shard}");
            assert_eq!(layout.global(shard, local), Some(g));
        }
        assert_eq!(layout.locate(3), Some((3, 0)));
        assert_eq!((layout.locate(10), layout.global(1, 0), layout.global(4, 5)), (None, None, None));
        assert_eq!((layout.count(6), layout.start(6), layout.start(4)), (None, None, Some(5)));
        assert_eq!(Layout::from_counts(&[0, 0]).locate(0), None);
        assert_eq!(manifest().0.layout().locate(3), Some((2, 0)));
    }

    #[test]
    fn image_kinds_and_table_paths_are_spelled_as_the_indexer_writes_them() {
        assert_eq!(ImageKind::from_ext("JPEG").map(|k| k.ext()), Some("jpg"));
        assert_eq!(
            (ImageKind::from_ext("Png"), ImageKind::from_ext("webp")),
            (Some(ImageKind::Png), Some(ImageKind::Webp))
        );
        assert_eq!(ImageKind::from_ext("txt"), None);
        assert_eq!(table_path(7), "index/shards/000007.bin");
    }
}
