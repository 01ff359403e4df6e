//! Example identities: what an example is, whatever shard, index or store holds it. An
//! example's id is the first 8 bytes (little-endian) of SHA-256 over a domain tag, the image
//! member's bytes and the caption member's bytes with surrounding ASCII white space trimmed,
//! each length-prefixed: the bytes a model trains on, never a key, a path or the metadata.
//! `index/examples.bin` holds a dataset's ids sorted and distinct (8 bytes an example), pinned
//! by the manifest: an index that holds an example twice cannot be written by the indexer and
//! is refused by [`ExamplesCheck`].
//!
//! At N = 233.8M, two distinct examples share an id with probability about N²/2⁶⁵ ≈ 1.5e-3 for
//! the whole dataset: a false duplicate leaves one example out, and a false match between two
//! datasets binds a budget that need not bind (never one released).

use dpcap_proto::digest::Sha256Stream;
use sha2::{Digest, Sha256};

use super::{IndexError, field, malformed};

/// Where the sorted ids lie under the dataset root.
pub const EXAMPLES_PATH: &str = "index/examples.bin";

const MAGIC: &[u8; 4] = b"DPEX";
const VERSION: u8 = 1;
/// Magic, version, and the count as a u64.
const HEADER: usize = 4 + 1 + 8;

/// The identity of an example made of these members' bytes.
pub fn example_id(image: &[u8], caption: &[u8]) -> u64 {
    let caption = caption.trim_ascii();
    let mut hasher = Sha256::new();
    hasher.update(b"dpcap example v1\0");
    hasher.update((image.len() as u64).to_le_bytes());
    hasher.update(image);
    hasher.update((caption.len() as u64).to_le_bytes());
    hasher.update(caption);
    let digest = hasher.finalize();
    u64::from_le_bytes(digest[..8].try_into().expect("a SHA-256 has 32 bytes"))
}

/// The bytes of `index/examples.bin` for `ids`, which must be sorted and distinct.
pub fn encode_examples(ids: &[u64]) -> Vec<u8> {
    debug_assert!(ids.windows(2).all(|w| w[0] < w[1]), "sorted and distinct");
    let mut out = Vec::with_capacity(HEADER + ids.len() * 8);
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.extend_from_slice(&(ids.len() as u64).to_le_bytes());
    ids.iter().for_each(|id| out.extend_from_slice(&id.to_le_bytes()));
    out
}

/// Checks an examples file as it streams in, in O(1) memory whatever its size: its header, its
/// ids strictly ascending (an id twice is an example twice: each would be sampled at about 2q
/// and contribute up to 2C, so the accounting would fail), its count and its SHA-256. Feed it
/// chunks of any size with [`ExamplesCheck::update`], then [`ExamplesCheck::finish`].
#[derive(Debug)]
pub struct ExamplesCheck {
    hasher: Sha256Stream,
    /// Bytes not yet parsed: a header or an id cut across chunks.
    pending: Vec<u8>,
    count: Option<u64>,
    seen: u64,
    last: Option<u64>,
}

impl Default for ExamplesCheck {
    fn default() -> Self {
        Self { hasher: Sha256Stream::default(), pending: Vec::with_capacity(HEADER), count: None, seen: 0, last: None }
    }
}

impl ExamplesCheck {
    /// Takes the next bytes of the file.
    pub fn update(&mut self, mut chunk: &[u8]) -> Result<(), IndexError> {
        self.hasher.update(chunk);
        if self.count.is_none() {
            let take = (HEADER - self.pending.len()).min(chunk.len());
            self.pending.extend_from_slice(&chunk[..take]);
            chunk = &chunk[take..];
            if self.pending.len() < HEADER {
                return Ok(());
            }
            if &self.pending[..4] != MAGIC || self.pending[4] != VERSION {
                return Err(malformed(format!("{EXAMPLES_PATH}: bad magic or version {:?}", &self.pending[..5])));
            }
            self.count = Some(u64::from_le_bytes(self.pending[5..HEADER].try_into().expect("8 bytes")));
            self.pending.clear();
        }
        if !self.pending.is_empty() {
            let take = (8 - self.pending.len()).min(chunk.len());
            self.pending.extend_from_slice(&chunk[..take]);
            chunk = &chunk[take..];
            if self.pending.len() < 8 {
                return Ok(());
            }
            let id = u64::from_le_bytes(self.pending[..8].try_into().expect("8 bytes"));
            self.pending.clear();
            self.next(id)?;
        }
        let mut ids = chunk.chunks_exact(8);
        for id in &mut ids {
            self.next(u64::from_le_bytes(id.try_into().expect("8 bytes")))?;
        }
        self.pending.extend_from_slice(ids.remainder());
        Ok(())
    }

    fn next(&mut self, id: u64) -> Result<(), IndexError> {
        if self.count.is_some_and(|count| self.seen >= count) {
            return Err(field("examples", format!("{EXAMPLES_PATH} holds more ids than its count {:?}", self.count)));
        }
        if self.last.is_some_and(|last| id <= last) {
            let what = if self.last == Some(id) { "twice: the index holds one example twice" } else { "out of order" };
            return Err(field(
                "examples",
                format!("example id {id:#018x} (position {}) is {what}; index the shards again", self.seen),
            ));
        }
        (self.last, self.seen) = (Some(id), self.seen + 1);
        Ok(())
    }

    /// Ends the check: the whole file was read, holds `examples` ids, and its digest is
    /// `sha256` (the manifest's pin).
    pub fn finish(self, examples: u64, sha256: &str) -> Result<(), IndexError> {
        let actual = self.hasher.finish();
        if actual != sha256 {
            return Err(field("examples", format!("{EXAMPLES_PATH} has digest {actual}, the manifest pins {sha256}")));
        }
        if self.count != Some(examples) || self.seen != examples || !self.pending.is_empty() {
            return Err(field(
                "examples",
                format!(
                    "{EXAMPLES_PATH} holds {} ids (header {:?}, {} bytes left over), the manifest counts {examples}",
                    self.seen,
                    self.count,
                    self.pending.len()
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use dpcap_proto::digest::sha256 as digest;

    #[test]
    fn an_examples_identity_is_its_image_and_caption_bytes_and_nothing_else() {
        let id = example_id(b"\xff\xd8jpeg", b"a red square");
        assert_eq!(id, example_id(b"\xff\xd8jpeg", b"  a red square\n"), "a re-saved caption is the same");
        assert_ne!(id, example_id(b"\xff\xd8jpeg!", b"a red square"), "other image bytes: another example");
        assert_ne!(id, example_id(b"\xff\xd8jpeg", b"a blue square"));
        assert_ne!(example_id(b"ab", b"c"), example_id(b"a", b"bc"), "lengths are part of it");
    }

    #[test]
    fn a_file_checks_in_chunks_of_any_size_and_refuses_a_repeat_an_edit_or_a_short_count() {
        let ids = [3u64, 9, 1 << 40, u64::MAX];
        let bytes = encode_examples(&ids);
        for size in [1, 3, 7, 8, 13, 64] {
            let mut check = ExamplesCheck::default();
            bytes.chunks(size).try_for_each(|c| check.update(c)).unwrap();
            check.finish(4, &digest(&bytes)).unwrap();
        }
        let check = |bytes: &[u8], count| {
            let mut check = ExamplesCheck::default();
            check.update(bytes).and_then(|()| check.finish(count, &digest(bytes))).unwrap_err().to_string()
        };
        let mut twice = bytes.clone();
        twice[HEADER + 8..HEADER + 16].copy_from_slice(&3u64.to_le_bytes());
        assert!(check(&twice, 4).contains("is twice: the index holds one example twice"), "{}", check(&twice, 4));
        assert!(check(&bytes, 5).contains("holds 4 ids"), "{}", check(&bytes, 5));
        assert!(check(&bytes[..bytes.len() - 3], 4).contains("bytes left over"));
        assert!(check(b"DPIX\x01\0\0\0\0\0\0\0\0", 0).contains("bad magic"));
        assert!(check(b"DPEX\x01", 0).contains("holds 0 ids (header None"), "a cut header");
        let mut check = ExamplesCheck::default();
        check.update(&bytes).unwrap();
        assert!(check.finish(4, &digest(b"other")).unwrap_err().to_string().contains("the manifest pins"));
    }
}
