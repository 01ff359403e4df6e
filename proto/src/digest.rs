//! Content digests the protocol names: `Plan.dataset_digest` pins the exact dataset index a
//! job was planned (and accounted) on, and every worker checks the index it reads against it.

use sha2::{Digest, Sha256};

/// "sha256:" and the lowercase hex SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> String {
    let mut hasher = Sha256Stream::default();
    hasher.update(bytes);
    hasher.finish()
}

/// [`sha256`] over bytes that arrive in pieces (a shard streamed from its store), so that
/// hashing never holds the whole object.
#[derive(Debug, Clone, Default)]
pub struct Sha256Stream(Sha256);

impl Sha256Stream {
    /// Adds the next bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// "sha256:" and the lowercase hex digest of everything added.
    pub fn finish(self) -> String {
        let mut out = String::with_capacity(7 + 64);
        out.push_str("sha256:");
        for b in self.0.finalize() {
            out.push_str(&format!("{b:02x}"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_digest_in_pieces_is_the_digest_of_the_whole() {
        let mut stream = super::Sha256Stream::default();
        stream.update(b"dp");
        stream.update(b"cap");
        assert_eq!(stream.finish(), super::sha256(b"dpcap"));
    }

    #[test]
    fn the_digest_of_nothing_is_the_well_known_one() {
        assert_eq!(super::sha256(b""), "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }
}
