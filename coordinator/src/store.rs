//! Durable job state on object stores (local directories by default): one sealed protobuf
//! object per job (spec, plan with its contract, state, conditions, progress), and idempotency
//! keys claimed with create-if-absent puts. The records restore reads, the job's private part
//! (sampler secret and shard layout), the idempotency keys and the record key live in a
//! *separate* secrets store that workers are never given; the job store, which workers write
//! to (checkpoints, exports), holds only a copy of each record for readers.
//!
//! **Records are sealed.** Whoever can write the job store (a worker, through its checkpoints)
//! must not be able to change what a job samples or clips, create a job or stop one. Each record is
//! written with an HMAC-SHA256 tag under a key only the coordinator holds (`record.key` in the
//! secrets store, created once), bound to the job's id and to the record's version; every read
//! checks it. The secrets store keeps each job's last version (written after the record), so an
//! older sealed record put back in place (a cancelled job's, say, from when it ran) is refused
//! too. A refused record (changed, copied under another id, replayed, or written by hand) is
//! never restored: it is logged and counted (`dpcap_coordinator_records_refused_total`), its job
//! is neither registered nor run, and it is suspended at the accountant (so that it reserves
//! nothing). A record from before sealing (`job.binpb`) is refused alike.
//!
//! Layout: job store `jobs/{id}/job.sealed` (a copy for readers); secrets store `record.key`,
//! `idempotency/{hex(key)}`, `jobs/{id}/job.sealed` (the copy restore reads),
//! `jobs/{id}/private.json`, `jobs/{id}/record.version`. Records are read only at these exact
//! paths. One coordinator replica
//! writes both (Deployment, Recreate).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dpcap_proto::v1::Job;
use futures::TryStreamExt;
use hmac::{Hmac, Mac};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use prost::Message;
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::error::{CoordinatorError, JobStoreError, RecordError};
use crate::sampler::JobSecret;

/// What a job needs that the operator never sees.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Private {
    /// The sampler key, hex.
    pub secret: String,
    /// Examples per shard, in shard order.
    pub shard_counts: Vec<u64>,
}

impl Private {
    /// The sampler key.
    pub fn job_secret(&self) -> Result<JobSecret, CoordinatorError> {
        let bytes = (0..self.secret.len())
            .step_by(2)
            .map(|i| self.secret.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
            .collect::<Option<Vec<u8>>>();
        let key: [u8; 32] = bytes.and_then(|b| b.try_into().ok()).ok_or(JobStoreError::SamplerSecret)?;
        Ok(JobSecret(key))
    }
}

/// N random bytes from the OS (keys, secrets, ids).
pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).expect("OS entropy is available");
    bytes
}

/// Lowercase hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A sealed record starts with these bytes (format version 2), then the 32-byte tag, then the
/// record's version (8 bytes, little-endian), then the record.
const SEAL_MAGIC: &[u8; 8] = b"dpcapJR2";

/// The HMAC key that seals job records, held in the secrets store only.
#[derive(Clone)]
pub struct RecordKey([u8; 32]);

impl std::fmt::Debug for RecordKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecordKey(<redacted>)")
    }
}

impl RecordKey {
    /// The tag of version `version` of `job_id`'s record `bytes`: binding the id and the
    /// version, a record copied under another job's path, or given another version, does not
    /// verify.
    fn tag(&self, job_id: &str, version: u64, bytes: &[u8]) -> [u8; 32] {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes any key length");
        let version = version.to_le_bytes();
        for part in [b"dpcap job record v2".as_slice(), job_id.as_bytes(), &version, bytes] {
            mac.update(&(part.len() as u64).to_le_bytes());
            mac.update(part);
        }
        mac.finalize().into_bytes().into()
    }

    /// Version `version` of `job`'s record, sealed.
    pub fn seal(&self, job: &Job, version: u64) -> Vec<u8> {
        let bytes = job.encode_to_vec();
        let mut out = Vec::with_capacity(SEAL_MAGIC.len() + 40 + bytes.len());
        out.extend_from_slice(SEAL_MAGIC);
        out.extend_from_slice(&self.tag(&job.job_id, version, &bytes));
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&bytes);
        out
    }

    /// The job in `sealed` and its version, stored under `job_id`'s path, if its tag verifies.
    pub fn open(&self, job_id: &str, sealed: &[u8]) -> Result<(Job, u64), RecordError> {
        let rest = sealed.strip_prefix(SEAL_MAGIC.as_slice()).ok_or(RecordError::NotSealed)?;
        let (tag, rest) = rest.split_at_checked(32).ok_or(RecordError::Truncated)?;
        let (version, bytes) = rest.split_at_checked(8).ok_or(RecordError::Truncated)?;
        let version = u64::from_le_bytes(version.try_into().map_err(|_| RecordError::Truncated)?);
        let expected = self.tag(job_id, version, bytes);
        // Constant time: a forger learns nothing from how long a comparison took.
        if tag.iter().zip(expected).fold(0u8, |acc, (a, b)| acc | (a ^ b)) != 0 {
            return Err(RecordError::Tag);
        }
        let job = Job::decode(bytes)?;
        if job.job_id != job_id {
            return Err(RecordError::OtherJob(job.job_id));
        }
        Ok((job, version))
    }
}

/// The job store and the secrets store.
#[derive(Debug, Clone)]
pub struct JobStore {
    store: Arc<dyn ObjectStore>,
    root: Path,
    secrets: Arc<dyn ObjectStore>,
    secrets_root: Path,
    key: RecordKey,
    /// Each job's last record version written or read.
    versions: Arc<std::sync::Mutex<std::collections::HashMap<String, u64>>>,
    /// Records refused at restore (tampered, unsealed, copied or replayed): a metric.
    refused: Arc<AtomicU64>,
}

fn under(root: &Path, rest: &str) -> Path {
    Path::from(format!("{root}/{rest}").trim_start_matches('/'))
}

impl JobStore {
    /// Jobs under `root` of `store`; secrets (and the record key) under `secrets_root` of
    /// `secrets`. The record key is created only while neither store holds a job, or with
    /// `new_key` (an operator's explicit choice: every existing record is then refused).
    pub async fn open(
        (store, root): (Arc<dyn ObjectStore>, Path),
        (secrets, secrets_root): (Arc<dyn ObjectStore>, Path),
        new_key: bool,
    ) -> Result<Self, CoordinatorError> {
        let held = held_jobs((store.as_ref(), &root), (secrets.as_ref(), &secrets_root)).await?;
        let key = record_key(secrets.as_ref(), &secrets_root, KeyCreation { held, new_key }).await?;
        Ok(Self { store, root, secrets, secrets_root, key, versions: Arc::default(), refused: Arc::default() })
    }

    /// Records refused at restore since this process started.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    fn path(&self, rest: &str) -> Path {
        under(&self.root, rest)
    }

    /// Overwrites the job's record, sealed with the next version; then records that version
    /// in the secrets store (a crash between the two leaves a record newer than the version on
    /// record, which is accepted; an older one never is). Callers serialise writes of a job.
    pub async fn put_job(&self, job: &Job) -> Result<(), CoordinatorError> {
        let version = self.last_version(&job.job_id).await? + 1;
        let sealed = PutPayload::from(self.key.seal(job, version));
        // The coordinator's own copy first: restore reads it, so nothing written to the job
        // store (which workers write) can stop a job.
        self.secrets
            .put(&under(&self.secrets_root, &format!("jobs/{}/job.sealed", job.job_id)), sealed.clone())
            .await?;
        let path = self.path(&format!("jobs/{}/job.sealed", job.job_id));
        self.store.put(&path, sealed).await?;
        let version_path = under(&self.secrets_root, &format!("jobs/{}/record.version", job.job_id));
        self.secrets.put(&version_path, PutPayload::from(version.to_string().into_bytes())).await?;
        self.versions.lock().expect("versions lock").insert(job.job_id.clone(), version);
        Ok(())
    }

    /// The job's last record version: remembered, else the secrets store's (0: none).
    async fn last_version(&self, job_id: &str) -> Result<u64, CoordinatorError> {
        if let Some(&version) = self.versions.lock().expect("versions lock").get(job_id) {
            return Ok(version);
        }
        let path = under(&self.secrets_root, &format!("jobs/{job_id}/record.version"));
        let version = match self.secrets.get(&path).await {
            Ok(r) => String::from_utf8_lossy(&r.bytes().await?).trim().parse().unwrap_or(0),
            Err(object_store::Error::NotFound { .. }) => 0,
            Err(e) => return Err(e.into()),
        };
        self.versions.lock().expect("versions lock").insert(job_id.to_owned(), version);
        Ok(version)
    }

    /// Deletes a job's record and private part (a submission the accountant refused).
    pub async fn delete_job(&self, job_id: &str) {
        self.delete_record(job_id).await;
        let path = under(&self.secrets_root, &format!("jobs/{job_id}/private.json"));
        if let Err(e) = self.secrets.delete(&path).await {
            tracing::warn!(job_id, error = %e, "could not delete a refused submission's secret");
        }
    }

    /// Deletes a submission's record only: its secret stays, marking an orphan that a restore
    /// suspends at the accountant (see `load_all`).
    pub async fn delete_record(&self, job_id: &str) {
        let own = under(&self.secrets_root, &format!("jobs/{job_id}/job.sealed"));
        for (store, path) in [(&self.secrets, own), (&self.store, self.path(&format!("jobs/{job_id}/job.sealed")))] {
            if let Err(e) = store.delete(&path).await
                && !matches!(e, object_store::Error::NotFound { .. })
            {
                tracing::warn!(job_id, error = %e, "could not delete a refused submission's record");
            }
        }
    }

    /// The job's record, its seal checked (None when there is none): the coordinator's own
    /// copy in the secrets store.
    pub async fn get_job(&self, job_id: &str) -> Result<Option<Job>, CoordinatorError> {
        let path = under(&self.secrets_root, &format!("jobs/{job_id}/job.sealed"));
        let bytes = match self.secrets.get(&path).await {
            Ok(r) => r.bytes().await?,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        self.key
            .open(job_id, &bytes)
            .map(|(job, _)| Some(job))
            .map_err(|source| JobStoreError::Record { path: path.to_string(), source }.into())
    }

    /// Writes the job's private part once.
    pub async fn put_private(&self, job_id: &str, private: &Private) -> Result<(), CoordinatorError> {
        let body = serde_json::to_vec(private)
            .map_err(|source| JobStoreError::Json { path: format!("job {job_id}'s private part"), source })?;
        let options = PutOptions { mode: PutMode::Create, ..Default::default() };
        self.secrets
            .put_opts(
                &under(&self.secrets_root, &format!("jobs/{job_id}/private.json")),
                PutPayload::from(body),
                options,
            )
            .await?;
        Ok(())
    }

    /// Claims `key` for `job_id`; returns the job that already holds it, if any. Claims live in
    /// the secrets store, which only the coordinator writes: a claim planted in the job store
    /// (which workers write) could make a submit answer with an unrelated job and create none.
    pub async fn claim_key(&self, key: &str, job_id: &str) -> Result<Option<String>, CoordinatorError> {
        let path = under(&self.secrets_root, &format!("idempotency/{}", hex(key.as_bytes())));
        let options = PutOptions { mode: PutMode::Create, ..Default::default() };
        match self.secrets.put_opts(&path, PutPayload::from(job_id.as_bytes().to_vec()), options).await {
            Ok(_) => Ok(None),
            Err(object_store::Error::AlreadyExists { .. }) => {
                let bytes = self.secrets.get(&path).await?.bytes().await?;
                Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Every stored job whose seal verifies, with its private part, in no particular order,
    /// and the ids of the records refused (see the module docs). A job is restored from the
    /// coordinator's own copy in the secrets store; the job store's copy is read only for a
    /// job that has none (written before the copies), so nothing a worker writes there stops a
    /// job. Jobs without a private part (a crash between the two writes of a submission) are
    /// skipped.
    pub async fn load_all(&self) -> Result<(Vec<(Job, Private)>, Vec<String>), CoordinatorError> {
        let own = self.records(self.secrets.as_ref(), &self.secrets_root).await?;
        let owned: std::collections::HashSet<&str> = own.iter().map(|(id, _)| id.as_str()).collect();
        let shared: Vec<_> = self
            .records(self.store.as_ref(), &self.root)
            .await?
            .into_iter()
            .filter(|(id, _)| !owned.contains(id.as_str()))
            .collect();
        let candidates =
            own.iter().map(|r| (self.secrets.as_ref(), r)).chain(shared.iter().map(|r| (self.store.as_ref(), r)));
        let (mut out, mut refused) = (Vec::new(), Vec::new());
        for (store, (job_id, location)) in candidates {
            let bytes = store.get(location).await?.bytes().await?;
            let last = self.last_version(job_id).await?;
            let job = match self.key.open(job_id, &bytes) {
                Ok((job, version)) if version >= last => {
                    self.versions.lock().expect("versions lock").insert(job_id.to_owned(), version);
                    job
                }
                Ok((_, version)) => {
                    self.refuse(location.as_ref(), &RecordError::Replayed { version, last });
                    refused.push(job_id.to_owned());
                    continue;
                }
                Err(why) => {
                    self.refuse(location.as_ref(), &why);
                    refused.push(job_id.to_owned());
                    continue;
                }
            };
            let Some(private) = self.load_private(&job.job_id).await? else { continue };
            out.push((job, private));
        }
        refused.extend(self.orphans(&out, &refused).await?);
        Ok((out, refused))
    }

    /// The records under `root/jobs/` of `store`, by job id: read only at their exact path,
    /// `jobs/{id}/job.sealed` (or an unsealed `job.binpb` from before seals, where no sealed
    /// record of the id lies beside it). A file of that name anywhere deeper (under a job's
    /// checkpoints, which workers write) names no job.
    async fn records(&self, store: &dyn ObjectStore, root: &Path) -> Result<Vec<(String, Path)>, CoordinatorError> {
        let listed: Vec<_> = store.list(Some(&under(root, "jobs"))).try_collect().await?;
        let jobs_prefix = format!("{}/", under(root, "jobs"));
        let id_of = |location: &str, name: &str| -> Option<String> {
            let rest = location.strip_prefix(jobs_prefix.as_str())?;
            match rest.split('/').collect::<Vec<_>>().as_slice() {
                [id, file] if *file == name && !id.is_empty() => Some((*id).to_owned()),
                _ => None,
            }
        };
        let sealed: std::collections::HashSet<String> =
            listed.iter().filter_map(|m| id_of(m.location.as_ref(), "job.sealed")).collect();
        let records = listed.iter().filter_map(|meta| {
            let location = meta.location.as_ref();
            let id = match (id_of(location, "job.sealed"), id_of(location, "job.binpb")) {
                (Some(id), _) => id,
                (None, Some(id)) if !sealed.contains(&id) => id,
                _ => return None,
            };
            Some((id, meta.location.clone()))
        });
        Ok(records.collect())
    }

    /// Ids the secrets store holds a private part of but whose record is gone (deleted after a
    /// registration whose answer never came, or never written): the accountant may hold their
    /// registration, so they are suspended with the refused ones, to reserve nothing.
    async fn orphans(&self, restored: &[(Job, Private)], refused: &[String]) -> Result<Vec<String>, CoordinatorError> {
        let listed: Vec<_> = self.secrets.list(Some(&under(&self.secrets_root, "jobs"))).try_collect().await?;
        let known = |id: &str| restored.iter().any(|(job, _)| job.job_id == id) || refused.iter().any(|r| r == id);
        let mut orphans: Vec<String> = listed
            .iter()
            .filter_map(|m| m.location.as_ref().strip_suffix("/private.json"))
            .map(|prefix| prefix.rsplit('/').next().unwrap_or_default().to_owned())
            .filter(|id| !id.is_empty() && !known(id))
            .collect();
        orphans.sort();
        orphans.dedup();
        for id in &orphans {
            tracing::warn!(job_id = %id, "a job's secret without its record: suspended at the accountant, never run");
        }
        Ok(orphans)
    }

    fn refuse(&self, location: &str, why: &RecordError) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        tracing::error!(record = %location, %why, "job record refused: it is not restored, registered or run");
    }

    /// The job's private part from the secrets store (never from the job store, which workers
    /// write to).
    async fn load_private(&self, job_id: &str) -> Result<Option<Private>, CoordinatorError> {
        let path = under(&self.secrets_root, &format!("jobs/{job_id}/private.json"));
        let bytes = match self.secrets.get(&path).await {
            Ok(r) => r.bytes().await?,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let private =
            serde_json::from_slice(&bytes).map_err(|source| JobStoreError::Json { path: path.to_string(), source })?;
        Ok(Some(private))
    }
}

/// When a missing record key may be created.
#[derive(Debug, Clone, Copy)]
struct KeyCreation {
    /// Jobs the stores hold (records or private parts): a fresh key would refuse them all.
    held: usize,
    /// The operator asked for a new key (`--new-record-key`).
    new_key: bool,
}

/// Jobs the stores hold: ids under the job store's `jobs/` and the secrets store's `jobs/`.
async fn held_jobs(
    (store, root): (&dyn ObjectStore, &Path),
    (secrets, secrets_root): (&dyn ObjectStore, &Path),
) -> Result<usize, CoordinatorError> {
    let records = store.list_with_delimiter(Some(&under(root, "jobs"))).await?.common_prefixes.len();
    let private = secrets.list_with_delimiter(Some(&under(secrets_root, "jobs"))).await?.common_prefixes.len();
    Ok(records.max(private))
}

/// The record key: read from the secrets store, or created there once (a create-if-absent put,
/// so that two processes starting together agree on one key), but only while no job is held
/// or when the operator asked for a new one: a lost key with jobs present stops the start, so
/// that no job is silently refused and suspended.
async fn record_key(
    secrets: &dyn ObjectStore,
    root: &Path,
    creation: KeyCreation,
) -> Result<RecordKey, CoordinatorError> {
    let path = under(root, "record.key");
    let parse = |bytes: &[u8]| -> Result<RecordKey, CoordinatorError> {
        let text = std::str::from_utf8(bytes).unwrap_or_default().trim();
        let key: Option<Vec<u8>> = (0..text.len())
            .step_by(2)
            .map(|i| text.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
            .collect();
        key.and_then(|k| <[u8; 32]>::try_from(k).ok())
            .map(RecordKey)
            .ok_or_else(|| JobStoreError::Key(path.to_string()).into())
    };
    match secrets.get(&path).await {
        Ok(r) => return parse(&r.bytes().await?),
        Err(object_store::Error::NotFound { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    if creation.held > 0 && !creation.new_key {
        return Err(CoordinatorError::RecordKeyLost { path: path.to_string(), jobs: creation.held });
    }
    if creation.held > 0 {
        tracing::warn!(
            jobs = creation.held,
            "a new record key (--new-record-key): every existing job record is refused"
        );
    }
    let fresh = hex(&random_bytes::<32>());
    let options = PutOptions { mode: PutMode::Create, ..Default::default() };
    match secrets.put_opts(&path, PutPayload::from(fresh.clone().into_bytes()), options).await {
        Ok(_) => parse(fresh.as_bytes()),
        Err(object_store::Error::AlreadyExists { .. }) => parse(&secrets.get(&path).await?.bytes().await?),
        Err(e) => Err(e.into()),
    }
}
