//! Content digests the protocol names: `Plan.dataset_digest` pins the exact dataset index a
//! job was planned (and accounted) on, and every worker checks the index it reads against it.

use sha2::{Digest, Sha256};

/// "sha256:" and the lowercase hex SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for b in hash {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_digest_of_nothing_is_the_well_known_one() {
        assert_eq!(super::sha256(b""), "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }
}
