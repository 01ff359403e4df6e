//! The user table (`index/users.bin`): which examples belong to which user, for user-level DP
//! (DP-FedEmb). Users are listed in order of their id; each has a 64-bit tag (SHA-256 of its
//! id) that groups users into virtual clients without the coordinator reading any id, and the
//! ascending global numbers of its examples. Decoding checks that every example of 0..N
//! belongs to exactly one user: an example listed twice would be sampled twice as often and
//! contribute to two clients, which voids the user-level accounting.

use super::{IndexError, malformed};

const MAGIC: &[u8; 4] = b"DPUS";
const VERSION: u32 = 1;
const HEADER: usize = 4 + 4 + 8 + 8;

/// Where the user table lies under the dataset root.
pub const USERS_PATH: &str = "index/users.bin";

/// Examples grouped by user: `offsets[u]..offsets[u + 1]` index `examples` for user u.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UserTable {
    /// Per user, the first 8 bytes of SHA-256(user id), little-endian: a public, fixed tag.
    pub tags: Vec<u64>,
    /// users + 1 offsets into `examples`, from 0 to the number of examples.
    pub offsets: Vec<u64>,
    /// Global example numbers, ascending within each user.
    pub examples: Vec<u64>,
}

impl UserTable {
    /// Builds the table from (user id, global example) pairs in any order.
    pub fn from_pairs(pairs: impl IntoIterator<Item = (String, u64)>) -> Self {
        let mut by_user: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
        for (user, example) in pairs {
            by_user.entry(user).or_default().push(example);
        }
        let mut table = UserTable { offsets: vec![0], ..Default::default() };
        for (user, mut examples) in by_user {
            examples.sort_unstable();
            table.tags.push(user_tag(&user));
            table.examples.extend(examples);
            table.offsets.push(table.examples.len() as u64);
        }
        table
    }

    /// Number of users.
    pub fn users(&self) -> usize {
        self.tags.len()
    }

    /// The global example numbers of user `user`.
    pub fn examples_of(&self, user: usize) -> &[u64] {
        &self.examples[self.offsets[user] as usize..self.offsets[user + 1] as usize]
    }

    /// Virtual clients of `per_client` users: with 1, client u is user u; otherwise there are
    /// ⌈users / per_client⌉ clients and user u joins client tag_u mod clients. The count
    /// depends on the number of users, so jobs accept only 1 for now (see `docs/fedemb.md`).
    /// Returns each client's examples, ascending.
    pub fn clients(&self, per_client: u32) -> Vec<Vec<u64>> {
        let per_client = per_client.max(1) as usize;
        if per_client == 1 {
            return (0..self.users()).map(|u| self.examples_of(u).to_vec()).collect();
        }
        let n = self.users().div_ceil(per_client).max(1);
        let mut clients = vec![Vec::new(); n];
        for u in 0..self.users() {
            clients[(self.tags[u] % n as u64) as usize].extend_from_slice(self.examples_of(u));
        }
        for c in &mut clients {
            c.sort_unstable();
        }
        clients
    }

    /// The binary form: magic, version, users, examples, then tags, offsets and examples as
    /// little-endian u64.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + 8 * (self.tags.len() * 2 + 1 + self.examples.len()));
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(self.tags.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.examples.len() as u64).to_le_bytes());
        for v in self.tags.iter().chain(&self.offsets).chain(&self.examples) {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out
    }

    /// Decodes and validates a table over a dataset of `examples` examples: offsets from 0 to
    /// the end, ascending; every example of 0..N exactly once; no user without examples.
    pub fn decode(bytes: &[u8], examples: u64) -> Result<Self, IndexError> {
        if bytes.len() < HEADER || &bytes[..4] != MAGIC {
            return Err(malformed("user table: bad magic or shorter than its header".into()));
        }
        let word = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        let version = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(malformed(format!("user table version {version} is not {VERSION}")));
        }
        let (users, listed) = (word(8), word(16));
        if listed != examples {
            return Err(malformed(format!("user table lists {listed} examples, the dataset has {examples}")));
        }
        let words = users.checked_mul(2).and_then(|w| w.checked_add(1)).and_then(|w| w.checked_add(listed));
        let expected = words.and_then(|w| w.checked_mul(8)).and_then(|b| b.checked_add(HEADER as u64));
        if expected != Some(bytes.len() as u64) {
            return Err(malformed(format!(
                "user table is {} bytes, {users} users and {listed} examples need {expected:?}",
                bytes.len()
            )));
        }
        let (users, listed) = (users as usize, listed as usize);
        let read = |start: usize, n: usize| (0..n).map(|i| word(HEADER + 8 * (start + i))).collect::<Vec<u64>>();
        let table =
            UserTable { tags: read(0, users), offsets: read(users, users + 1), examples: read(2 * users + 1, listed) };
        if table.offsets.first() != Some(&0) || table.offsets.last() != Some(&(listed as u64)) {
            return Err(malformed("user table offsets do not run from 0 to the number of examples".into()));
        }
        let mut seen = vec![false; listed];
        for u in 0..users {
            let (start, end) = (table.offsets[u], table.offsets[u + 1]);
            if end > listed as u64 {
                return Err(malformed(format!("user {u}'s offsets {start}..{end} run past the {listed} examples")));
            }
            if end <= start {
                return Err(malformed(format!("user {u} has no examples (offsets {start}..{end})")));
            }
            for &e in table.examples_of(u) {
                match seen.get_mut(e as usize) {
                    Some(s) if !*s => *s = true,
                    Some(_) => return Err(malformed(format!("example {e} belongs to more than one user"))),
                    None => return Err(malformed(format!("example {e} is outside the dataset's {listed}"))),
                }
            }
        }
        Ok(table)
    }
}

/// The public tag of a user id: the first 8 bytes of SHA-256(id), little-endian.
pub fn user_tag(user: &str) -> u64 {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(user.as_bytes());
    u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> UserTable {
        UserTable::from_pairs([("b".to_owned(), 3), ("a".to_owned(), 2), ("b".to_owned(), 0), ("c".to_owned(), 1)])
    }

    #[test]
    fn the_user_table_round_trips_and_lists_users_in_id_order() {
        let t = table();
        assert_eq!(UserTable::decode(&t.encode(), 4).unwrap(), t);
        assert_eq!((t.examples_of(0), t.examples_of(1), t.examples_of(2)), (&[2u64][..], &[0u64, 3][..], &[1u64][..]));
        assert_eq!(t.tags[0], user_tag("a"));
    }

    #[test]
    fn a_table_that_lists_an_example_twice_or_misses_one_is_refused() {
        let mut twice = table();
        twice.examples[3] = 0; // user c now claims user b's example 0; example 1 has no user
        let err = UserTable::decode(&twice.encode(), 4).unwrap_err();
        assert!(err.to_string().contains("example 0 belongs to more than one user"), "{err}");
        let err = UserTable::decode(&table().encode(), 5).unwrap_err();
        assert!(err.to_string().contains("lists 4 examples, the dataset has 5"), "{err}");
        let bytes = table().encode();
        let err = UserTable::decode(&bytes[..bytes.len() - 1], 4).unwrap_err();
        assert!(err.to_string().contains("bytes"), "{err}");
        assert!(UserTable::decode(b"nope", 4).is_err());
    }

    #[test]
    fn offsets_past_the_end_are_refused_not_sliced() {
        let mut wild = table();
        wild.offsets[1] = 100; // user a: 0..100 of 4 examples
        let err = UserTable::decode(&wild.encode(), 4).unwrap_err();
        assert!(err.to_string().contains("run past the 4 examples"), "{err}");
    }

    #[test]
    fn a_user_without_examples_is_refused() {
        let mut empty = table();
        empty.offsets[1] = 0; // user a: 0..0
        let err = UserTable::decode(&empty.encode(), 4).unwrap_err();
        assert!(err.to_string().contains("user 0 has no examples"), "{err}");
    }
}
