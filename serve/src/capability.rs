//! Capabilities: what a worker may do at the accountant, scoped to one job.
//!
//! A worker's bearer token proves only that it is some worker. To submit parts and fetch
//! releases of job J it must also present a capability `{job J, rank, generation, parts W,
//! expiry}` that the coordinator signed when it placed the worker in J's group, with a key
//! that only the coordinator and the accountant hold (HMAC-SHA256). A capability for another
//! job, an older generation, or past its expiry is refused; a worker that is compromised can
//! therefore spend or read only its own job's current step.
//!
//! Key files hold `KEY_ID HEX_SECRET` lines (≥ 32 bytes of secret each). The first key signs;
//! every key verifies, so a key is rotated by adding the new one first on both services
//! (accountant first), then removing the old one once capabilities signed with it have expired.
//! Without a key (authentication off: loopback or `--insecure`), capabilities are unsigned:
//! they still carry the group's W, but prove nothing.

use std::fmt;
use std::path::{Path, PathBuf};

use dpcap_proto::{ErrorCode, ServiceError};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Shortest accepted signing secret: 32 bytes (`openssl rand -hex 32`).
pub const MIN_KEY_BYTES: usize = 32;

const VERSION: &str = "v1";
const UNSIGNED: &str = "-";

/// One rank's right to act for one job's generation at the accountant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capability {
    /// The job.
    pub job_id: String,
    /// The rank: the part index it may submit (parts are submitted by ranks 0..W).
    pub rank: u32,
    /// The group generation: parts are submitted as this attempt.
    pub generation: u64,
    /// A random number drawn when the group was formed: two groups that a coordinator restart
    /// gave the same generation number never have their parts summed together.
    #[serde(default)]
    pub group: u64,
    /// Parts W summed per step in this generation (1 on the NCCL path).
    pub parts: u32,
    /// Milliseconds since the Unix epoch after which it is refused.
    pub expires_unix_ms: u64,
    /// For one step only (issued with the step's work): the step, the units the coordinator
    /// sampled for it and the units of this rank's share. A part needs one: the accountant
    /// holds each part to C times its own `units`, counts no worker can state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<StepGrant>,
}

impl Capability {
    /// What a capability's text states, read without verifying its tag: for its holder's
    /// bookkeeping only (which of two capabilities is newer), never for a decision of trust,
    /// which only [`Capabilities::verify`] makes.
    pub fn peek(text: &str) -> Option<Capability> {
        let payload = text.split('.').nth(2)?;
        serde_json::from_slice(&unhex(payload)?).ok()
    }

    /// Whether this capability should replace `held` in a worker's cell: always for another
    /// job, a newer generation or another group of the same generation (a coordinator restart
    /// may reuse the number), never for an older generation's, an older step's, or one without
    /// a step grant while `held` has one of the same group (a heartbeat computed before the
    /// step's work existed and answered after it: taking it would leave the part without its
    /// grant, and the job would fail).
    pub fn supersedes(&self, held: Option<&Capability>) -> bool {
        let Some(held) = held else { return true };
        if self.job_id != held.job_id || self.generation > held.generation {
            return true;
        }
        if self.generation < held.generation {
            return false;
        }
        if self.group != held.group {
            return true;
        }
        match (self.step, held.step) {
            (_, None) => true,
            (None, Some(_)) => false,
            (Some(new), Some(old)) => new.step >= old.step,
        }
    }
}

/// What a step capability states about its step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepGrant {
    /// The step.
    pub step: u64,
    /// Units (examples, or clients) the coordinator's sampler drew for it, over all ranks.
    pub sampled: u64,
    /// Units of the part this capability sends: the rank's own share n_r when each rank sends
    /// a part, all `sampled` when one part carries the group's reduced sum (NCCL). A part's L2
    /// norm may be at most C · `units`: one rank can never spend another's share.
    pub units: u64,
}

/// Why a capability was refused, or a key could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CapabilityError {
    /// No capability on a call that needs one.
    #[error(
        "this call needs a capability for the job (x-dpcap-capability), issued by the coordinator with the worker's assignment"
    )]
    Missing,
    /// Not a capability at all.
    #[error("invalid capability: {0}")]
    Malformed(String),
    /// Signed, but its payload is not a capability's JSON.
    #[error("invalid capability: {0}")]
    Payload(#[source] serde_json::Error),
    /// Signed with a key this service does not hold, or not signed while keys are configured.
    #[error("capability signed with key {0:?}, which this service does not hold")]
    UnknownKey(String),
    /// The signature does not match (forged or altered).
    #[error("capability signature does not verify")]
    BadSignature,
    /// Past its expiry.
    #[error("capability for job {job_id} expired {ago_ms} ms ago; the worker renews it with its heartbeat")]
    Expired {
        /// Its job.
        job_id: String,
        /// How long ago.
        ago_ms: u64,
    },
    /// Valid, but for something else than the call asks.
    #[error("capability for job {job_id} (rank {rank}, generation {generation}) does not cover this call: {reason}")]
    OutOfScope {
        /// Its job.
        job_id: String,
        /// Its rank.
        rank: u32,
        /// Its generation.
        generation: u64,
        /// What the call asked for.
        reason: String,
    },
    /// A key file that could not be read.
    #[error("cannot read capability key file {path}: {source}")]
    KeyFileRead {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A key file could not be parsed.
    #[error("invalid capability key file {path}: {reason}")]
    KeyFile {
        /// The file.
        path: String,
        /// Why (never the secret).
        reason: String,
    },
}

impl ServiceError for CapabilityError {
    fn error_code(&self) -> ErrorCode {
        match self {
            CapabilityError::KeyFile { .. } | CapabilityError::KeyFileRead { .. } => ErrorCode::InvalidArgument,
            _ => ErrorCode::PermissionDenied,
        }
    }
}

/// Signing keys shared by the coordinator and the accountant; the first one signs.
#[derive(Clone)]
pub struct KeyRing {
    keys: Vec<(String, Vec<u8>)>,
}

impl fmt::Debug for KeyRing {
    /// Key ids only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.keys.iter().map(|(id, _)| id)).finish()
    }
}

impl KeyRing {
    /// A ring with one fresh random key (an embedded cluster shares it in memory).
    pub fn generate(id: &str) -> Self {
        let mut secret = vec![0u8; MIN_KEY_BYTES];
        getrandom::fill(&mut secret).expect("OS entropy is available");
        Self { keys: vec![(id.to_owned(), secret)] }
    }

    /// The ring as a key file's text (for `dpctl` to write one, and for tests).
    pub fn to_file_text(&self) -> String {
        self.keys.iter().map(|(id, secret)| format!("{id} {}\n", hex(secret))).collect()
    }

    /// Reads `KEY_ID HEX_SECRET` lines (blank lines and `#` comments skipped).
    pub fn from_file(path: &Path) -> Result<Self, CapabilityError> {
        let error = |reason: String| CapabilityError::KeyFile { path: path.display().to_string(), reason };
        let text = std::fs::read_to_string(path)
            .map_err(|source| CapabilityError::KeyFileRead { path: path.display().to_string(), source })?;
        let mut keys = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (id, secret) = line
                .split_once(char::is_whitespace)
                .ok_or_else(|| error(format!("line {}: expected `KEY_ID HEX`", n + 1)))?;
            let id_ok =
                !id.is_empty() && id.len() <= 32 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-".contains(&b));
            if !id_ok || id == UNSIGNED {
                return Err(error(format!("line {}: key id {id:?} must be 1-32 characters of [A-Za-z0-9_-]", n + 1)));
            }
            let secret = unhex(secret.trim()).ok_or_else(|| error(format!("line {}: the secret is not hex", n + 1)))?;
            if secret.len() < MIN_KEY_BYTES {
                return Err(error(format!(
                    "line {}: key {id} has {} bytes; a key needs at least {MIN_KEY_BYTES} (openssl rand -hex 32)",
                    n + 1,
                    secret.len()
                )));
            }
            keys.push((id.to_owned(), secret));
        }
        if keys.is_empty() {
            return Err(error("no key in the file".into()));
        }
        Ok(Self { keys })
    }

    fn mac(secret: &[u8], id: &str, payload: &[u8]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes keys of any length");
        mac.update(format!("{VERSION}.{id}.").as_bytes());
        mac.update(payload);
        mac
    }
}

/// Issues and checks capabilities: signed with a key ring, or unsigned when there is none.
#[derive(Debug, Clone, Default)]
pub struct Capabilities {
    ring: Option<KeyRing>,
}

impl Capabilities {
    /// Signed with (and checked against) `ring`; unsigned without one.
    pub fn new(ring: Option<KeyRing>) -> Self {
        Self { ring }
    }

    /// Whether capabilities are signed (and so prove anything).
    pub fn is_signed(&self) -> bool {
        self.ring.is_some()
    }

    /// The capability as the text a worker carries.
    pub fn issue(&self, capability: &Capability) -> String {
        let payload = serde_json::to_vec(capability).expect("a capability serialises");
        match &self.ring {
            Some(ring) => {
                let (id, secret) = &ring.keys[0];
                let tag = KeyRing::mac(secret, id, &payload).finalize().into_bytes();
                format!("{VERSION}.{id}.{}.{}", hex(&payload), hex(&tag))
            }
            None => format!("{VERSION}.{UNSIGNED}.{}.", hex(&payload)),
        }
    }

    /// The capability `text` proves, if its signature verifies and it has not expired at
    /// `now_unix_ms`. Scope (job, generation, part) is the caller's to check.
    pub fn verify(&self, text: &str, now_unix_ms: u64) -> Result<Capability, CapabilityError> {
        if text.is_empty() {
            return Err(CapabilityError::Missing);
        }
        let malformed = |why: &str| CapabilityError::Malformed(why.to_owned());
        let mut fields = text.split('.');
        let (Some(version), Some(id), Some(payload), Some(tag), None) =
            (fields.next(), fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(malformed("expected four dot-separated fields"));
        };
        if version != VERSION {
            return Err(malformed("unknown version"));
        }
        let payload = unhex(payload).ok_or_else(|| malformed("payload is not hex"))?;
        match &self.ring {
            None if id == UNSIGNED => {}
            None => return Err(CapabilityError::UnknownKey(id.to_owned())),
            Some(ring) => {
                let (_, secret) = ring
                    .keys
                    .iter()
                    .find(|(k, _)| k == id)
                    .ok_or_else(|| CapabilityError::UnknownKey(id.to_owned()))?;
                let tag = unhex(tag).ok_or(CapabilityError::BadSignature)?;
                KeyRing::mac(secret, id, &payload).verify_slice(&tag).map_err(|_| CapabilityError::BadSignature)?;
            }
        }
        let capability: Capability = serde_json::from_slice(&payload).map_err(CapabilityError::Payload)?;
        if now_unix_ms > capability.expires_unix_ms {
            return Err(CapabilityError::Expired {
                ago_ms: now_unix_ms - capability.expires_unix_ms,
                job_id: capability.job_id,
            });
        }
        Ok(capability)
    }
}

/// The capability key flag of the coordinator and the accountant.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct CapabilityArgs {
    /// Keys that sign workers' capabilities (`KEY_ID HEX_SECRET` lines; the first signs). The
    /// coordinator and the accountant need the same file; required whenever tokens are set.
    #[arg(long, env = "DPCAP_CAPABILITY_KEY_FILE")]
    pub capability_key_file: Option<PathBuf>,
}

impl CapabilityArgs {
    /// The capabilities these flags configure. With authentication on (`auth_on`), a key is
    /// required: unsigned capabilities would let any worker token act for any job.
    pub fn capabilities(&self, auth_on: bool) -> Result<Capabilities, CapabilityError> {
        match &self.capability_key_file {
            Some(path) => Ok(Capabilities::new(Some(KeyRing::from_file(path)?))),
            None if auth_on => Err(CapabilityError::KeyFile {
                path: "(none)".into(),
                reason: "tokens are set, so workers' capabilities must be signed: pass --capability-key-file \
                         (the same file to the coordinator and the accountant; `openssl rand -hex 32` makes a \
                         secret, written as `k1 SECRET`)"
                    .into(),
            }),
            None => Ok(Capabilities::new(None)),
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(generation: u64, group: u64, step: Option<u64>) -> Capability {
        Capability {
            job_id: "j".into(),
            rank: 0,
            generation,
            group,
            parts: 2,
            expires_unix_ms: 0,
            step: step.map(|step| StepGrant { step, sampled: 10, units: 5 }),
        }
    }

    #[test]
    fn a_worker_keeps_its_steps_grant_against_a_late_heartbeat_and_takes_every_newer_capability() {
        let step13 = held(1, 7, Some(13));
        assert!(!held(1, 7, None).supersedes(Some(&step13)), "a grantless renewal never drops the step's grant");
        assert!(!held(1, 7, Some(12)).supersedes(Some(&step13)), "an older step's renewal is stale");
        assert!(!held(0, 7, Some(14)).supersedes(Some(&step13)), "an older generation's is stale");
        assert!(held(1, 7, Some(13)).supersedes(Some(&step13)), "the same step's renewal extends it");
        assert!(held(1, 7, Some(14)).supersedes(Some(&step13)), "the next step's");
        assert!(held(2, 9, None).supersedes(Some(&step13)), "a new generation's, grant or not");
        assert!(held(1, 8, None).supersedes(Some(&step13)), "a re-formed group of the same number");
        assert!(held(1, 7, None).supersedes(None), "anything fills an empty cell");
        assert!(held(1, 7, Some(3)).supersedes(Some(&held(1, 7, None))), "a grant replaces a grantless one");
        let text = Capabilities::new(Some(KeyRing::generate("k1"))).issue(&step13);
        assert_eq!(Capability::peek(&text), Some(step13), "its holder reads what a capability states");
        assert_eq!(Capability::peek("v1.k1.zz.00"), None, "and never panics on a malformed one");
    }

    fn capability(expires_unix_ms: u64) -> Capability {
        Capability { job_id: "job-a".into(), rank: 1, generation: 3, group: 9, parts: 2, expires_unix_ms, step: None }
    }

    #[test]
    fn a_signed_capability_verifies_and_an_altered_or_foreign_one_does_not() {
        let ours = Capabilities::new(Some(KeyRing::generate("k1")));
        let text = ours.issue(&capability(2_000));
        assert_eq!(ours.verify(&text, 1_000).unwrap(), capability(2_000));
        let forged = Capabilities::new(Some(KeyRing::generate("k1"))).issue(&capability(2_000));
        assert!(matches!(ours.verify(&forged, 1_000), Err(CapabilityError::BadSignature)));
        // Another job's payload under this signature.
        let mut fields: Vec<String> = text.split('.').map(str::to_owned).collect();
        let other = Capability { job_id: "job-b".into(), ..capability(2_000) };
        fields[2] = hex(&serde_json::to_vec(&other).unwrap());
        assert!(matches!(ours.verify(&fields.join("."), 1_000), Err(CapabilityError::BadSignature)));
        assert!(matches!(ours.verify(&text, 2_001), Err(CapabilityError::Expired { ago_ms: 1, .. })));
        let unsigned = Capabilities::new(None).issue(&capability(2_000));
        assert!(
            matches!(ours.verify(&unsigned, 1_000), Err(CapabilityError::UnknownKey(_))),
            "keys on: unsigned refused"
        );
        assert!(matches!(ours.verify("", 1_000), Err(CapabilityError::Missing)));
        assert!(matches!(ours.verify("v1.k1.zz.00", 1_000), Err(CapabilityError::Malformed(_))));
    }

    #[test]
    fn a_rotated_ring_verifies_old_capabilities_and_signs_with_its_first_key() {
        let old = KeyRing::generate("old");
        let new = KeyRing::generate("new");
        let rotated = KeyRing { keys: [new.keys.clone(), old.keys.clone()].concat() };
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("keys");
        std::fs::write(&file, format!("# rotated\n{}", rotated.to_file_text())).unwrap();
        let ring = Capabilities::new(Some(KeyRing::from_file(&file).unwrap()));
        let by_old = Capabilities::new(Some(old)).issue(&capability(9));
        assert!(ring.verify(&by_old, 1).is_ok());
        assert!(ring.issue(&capability(9)).starts_with("v1.new."));
        std::fs::write(&file, "k1 abcd\n").unwrap();
        let short = KeyRing::from_file(&file).unwrap_err().to_string();
        assert!(short.contains("at least 32") && !short.contains("abcd"), "{short}");
    }

    #[test]
    fn tokens_without_a_key_are_refused_at_start() {
        assert!(CapabilityArgs::default().capabilities(true).is_err());
        assert!(!CapabilityArgs::default().capabilities(false).unwrap().is_signed());
    }
}
