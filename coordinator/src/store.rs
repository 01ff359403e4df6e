//! Durable job state on an object store (a local directory by default): one protobuf object
//! per job (spec, plan, state, conditions, progress), and idempotency keys claimed with
//! create-if-absent puts. The job's private part (sampler secret and shard layout) lives in a
//! *separate* secrets store that workers are never given: checkpoints and exports sit under
//! the job store, which workers write to, so a secret there would be one path away from them.
//!
//! Layout: job store `jobs/{id}/job.binpb`, `idempotency/{hex(key)}`; secrets store
//! `jobs/{id}/private.json`. One coordinator replica writes both (Deployment, Recreate).

use std::sync::Arc;

use dpcap_proto::v1::Job;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use prost::Message;
use serde::{Deserialize, Serialize};

use crate::error::CoordinatorError;
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
        let key: [u8; 32] = bytes
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| CoordinatorError::Store("a job's sampler secret is not 64 hex digits".into()))?;
        Ok(JobSecret(key))
    }
}

/// Lowercase hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The job store and the secrets store.
#[derive(Debug, Clone)]
pub struct JobStore {
    store: Arc<dyn ObjectStore>,
    root: Path,
    secrets: Arc<dyn ObjectStore>,
    secrets_root: Path,
}

fn under(root: &Path, rest: &str) -> Path {
    Path::from(format!("{root}/{rest}").trim_start_matches('/'))
}

impl JobStore {
    /// Jobs under `root` of `store`; secrets under `secrets_root` of `secrets`.
    pub fn new(
        (store, root): (Arc<dyn ObjectStore>, Path),
        (secrets, secrets_root): (Arc<dyn ObjectStore>, Path),
    ) -> Self {
        Self { store, root, secrets, secrets_root }
    }

    fn path(&self, rest: &str) -> Path {
        under(&self.root, rest)
    }

    /// Overwrites the job's record.
    pub async fn put_job(&self, job: &Job) -> Result<(), CoordinatorError> {
        let path = self.path(&format!("jobs/{}/job.binpb", job.job_id));
        self.store.put(&path, PutPayload::from(job.encode_to_vec())).await?;
        Ok(())
    }

    /// Writes the job's private part once.
    pub async fn put_private(&self, job_id: &str, private: &Private) -> Result<(), CoordinatorError> {
        let body = serde_json::to_vec(private).map_err(|e| CoordinatorError::Store(e.to_string()))?;
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

    /// Claims `key` for `job_id`; returns the job that already holds it, if any.
    pub async fn claim_key(&self, key: &str, job_id: &str) -> Result<Option<String>, CoordinatorError> {
        let path = self.path(&format!("idempotency/{}", hex(key.as_bytes())));
        let options = PutOptions { mode: PutMode::Create, ..Default::default() };
        match self.store.put_opts(&path, PutPayload::from(job_id.as_bytes().to_vec()), options).await {
            Ok(_) => Ok(None),
            Err(object_store::Error::AlreadyExists { .. }) => {
                let bytes = self.store.get(&path).await?.bytes().await?;
                Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Every stored job with its private part, in no particular order. Jobs without a private
    /// part (a crash between the two writes of a submission) are skipped.
    pub async fn load_all(&self) -> Result<Vec<(Job, Private)>, CoordinatorError> {
        let listed: Vec<_> = self.store.list(Some(&self.path("jobs"))).try_collect().await?;
        let mut out = Vec::new();
        for meta in listed.iter().filter(|m| m.location.as_ref().ends_with("/job.binpb")) {
            let bytes = self.store.get(&meta.location).await?.bytes().await?;
            let job = Job::decode(bytes).map_err(|e| CoordinatorError::Store(format!("{}: {e}", meta.location)))?;
            let Some(private) = self.load_private(&job.job_id).await? else { continue };
            out.push((job, private));
        }
        Ok(out)
    }

    /// The job's private part from the secrets store. A store written before secrets had a
    /// store of their own keeps it beside the job: it is moved, then deleted there.
    async fn load_private(&self, job_id: &str) -> Result<Option<Private>, CoordinatorError> {
        let path = under(&self.secrets_root, &format!("jobs/{job_id}/private.json"));
        let bytes = match self.secrets.get(&path).await {
            Ok(r) => r.bytes().await?,
            Err(object_store::Error::NotFound { .. }) => {
                let legacy = self.path(&format!("jobs/{job_id}/private.json"));
                match self.store.get(&legacy).await {
                    Ok(r) => {
                        let bytes = r.bytes().await?;
                        self.secrets.put(&path, PutPayload::from(bytes.clone())).await?;
                        self.store.delete(&legacy).await?;
                        tracing::warn!(job_id, "moved the job's secret out of the job store");
                        bytes
                    }
                    Err(object_store::Error::NotFound { .. }) => return Ok(None),
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        };
        let private = serde_json::from_slice(&bytes).map_err(|e| CoordinatorError::Store(format!("{path}: {e}")))?;
        Ok(Some(private))
    }
}
