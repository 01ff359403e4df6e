//! The ledger: the durable record of every job's contract and every charged step, kept in an
//! object store (a local directory by default; S3, GCS or Azure by URL).
//!
//! Layout under the ledger root:
//! - `jobs/{job}/registration.json`: the job's contract, written once;
//! - `jobs/{job}/charges/{step:020}.json`: one object per charged step, written with a
//!   conditional create, so a step can be charged at most once even by two accountant
//!   processes sharing the store;
//! - `jobs/{job}/releases/{step:020}.f32`: the released vector (little-endian f32), stored
//!   after the charge while it streams to the ranks, and before any rank may apply it (the
//!   last chunk of a fetch waits for it), so that every rank (a restarted one, a replacement,
//!   a survivor of an accountant crash) fetches the same bytes until a checkpoint covers it;
//! - `jobs/{job}/generation.json`: `{"generation": G, "suspended": S}`: the lowest group
//!   generation still admitted (the newest a rank attached with, or the coordinator fenced)
//!   and whether the coordinator suspended the job (cancelled, failed); capabilities of older
//!   generations, and any of a suspended job, stay refused after a restart;
//! - `jobs/{job}/trimmed.json`: `{"before": S}`: releases of steps < S are covered by a
//!   checkpoint and may have been deleted; it only ever grows;
//! - `jobs/{job}/discarded/{step:020}`: a charged step whose release was lost (a crash between
//!   the charge and the stored release): spent, never released, recorded at replay;
//! - `jobs/{job}/closed.json`: the job ended; no further parts are accepted;
//! - `jobs/{job}/audit/secret` (an audited job's 256-bit canary secret, created once) and
//!   `jobs/{job}/audit/readings/{step:020}.f32` (the release at the canaries' coordinates);
//! - `datasets/{dataset}/budget.json`: a dataset's current example-level lifetime budget, and
//!   `datasets/{dataset}/audit/{version:020}.json`: every setting of it, created once and never
//!   rewritten (the audit log of budgets; charges are audited by their own create-once objects);
//!   `datasets/{dataset}~user/...` the same for its user-level budget.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::error::AccountantError;
use crate::records::{BudgetKey, Charge, ClosedSpend, DatasetBudget, JobRecord, Registration};
use crate::release::Release;
use crate::synced::SyncedFile;
use futures::stream::FuturesUnordered;
use futures::{StreamExt, TryStreamExt};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

/// Bytes per part of a stored release: above S3's 5 MiB minimum, small enough that the first
/// part is written while the noise pass is still filling the release.
const RELEASE_PART_BYTES: usize = 16 << 20;

/// Parts of a release written at once: one being written while the next is handed over.
const RELEASE_PARTS_IN_FLIGHT: usize = 2;

/// The ledger over an object store.
#[derive(Debug, Clone)]
pub struct Ledger {
    store: Arc<dyn ObjectStore>,
    root: Path,
    /// The same store when it is a local directory: releases are then written and synced
    /// part by part ([`SyncedFile`]).
    local: Option<Arc<LocalFileSystem>>,
}

/// A release's visible blocks in store parts of at least [`RELEASE_PART_BYTES`], each
/// returned as soon as the noise pass has filled its blocks.
struct ReleaseParts<'a> {
    release: &'a Release,
    step: u64,
    next: usize,
}

impl ReleaseParts<'_> {
    async fn next(&mut self) -> Result<Option<Vec<bytes::Bytes>>, AccountantError> {
        let (mut part, mut bytes) = (Vec::new(), 0);
        while self.next < self.release.visible_blocks() && bytes < RELEASE_PART_BYTES {
            let block = self
                .release
                .block(self.next)
                .await
                .ok_or_else(|| AccountantError::Internal(format!("the noise pass of step {} failed", self.step)))?;
            bytes += block.len();
            part.push(block);
            self.next += 1;
        }
        Ok((!part.is_empty()).then_some(part))
    }
}

/// The objects the ledger holds of one job, found by listing.
#[derive(Default)]
struct Found {
    registration: bool,
    charged: BTreeSet<u64>,
    released: BTreeSet<u64>,
    discarded: BTreeSet<u64>,
    trimmed: bool,
    generation: bool,
    closed: bool,
}

impl Ledger {
    /// A ledger rooted at `root` inside `store`.
    pub fn new(store: Arc<dyn ObjectStore>, root: Path) -> Self {
        Self { store, root, local: None }
    }

    /// A ledger in a local directory (`LocalFileSystem` with fsync), whose releases are synced
    /// part by part while they are written.
    pub fn local(store: Arc<LocalFileSystem>) -> Self {
        Self { store: store.clone(), root: Path::default(), local: Some(store) }
    }

    fn job_path(&self, job_id: &str, rest: &str) -> Path {
        Path::from(format!("{}/jobs/{job_id}/{rest}", self.root).trim_start_matches('/'))
    }

    /// Records a registration. Ok(true) when new, Ok(false) when an identical one exists.
    pub async fn register(&self, registration: &Registration) -> Result<bool, AccountantError> {
        let path = self.job_path(&registration.job_id, "registration.json");
        match self.create(&path, serde_json::to_vec_pretty(registration).expect("registration serialises")).await {
            Ok(()) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => {
                let existing: Registration = self.read_json(&path).await?;
                if &existing == registration {
                    Ok(false)
                } else {
                    Err(AccountantError::RegistrationConflict { job_id: registration.job_id.clone() })
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Durably charges one step; fails with ChargedElsewhere if the step was already charged.
    pub async fn charge(&self, charge: &Charge) -> Result<(), AccountantError> {
        let path = self.job_path(&charge.job_id, &format!("charges/{:020}.json", charge.step));
        match self.create(&path, serde_json::to_vec_pretty(charge).expect("charge serialises")).await {
            Ok(()) => Ok(()),
            Err(object_store::Error::AlreadyExists { .. }) => {
                Err(AccountantError::ChargedElsewhere { job_id: charge.job_id.clone(), step: charge.step })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Stores the release of a charged step (the bytes ranks receive), part by part as its
    /// noise pass fills the blocks, published only whole: on a local directory a file synced
    /// part by part ([`SyncedFile`]), elsewhere a multipart upload whose parts go out while the
    /// pass and the fetches run. Its chunks may stream while it is written, but no fetch's last
    /// chunk (the one that lets a rank apply it) leaves before this returns. A failed write
    /// leaves no object.
    pub async fn put_release(&self, job_id: &str, step: u64, release: &Release) -> Result<(), AccountantError> {
        let path = self.job_path(job_id, &format!("releases/{step:020}.f32"));
        let mut parts = ReleaseParts { release, step, next: 0 };
        if let Some(local) = &self.local {
            let mut file = SyncedFile::create(local.path_to_filesystem(&path)?).await?;
            while let Some(part) = parts.next().await? {
                file.append(part).await?;
            }
            return file.publish().await;
        }
        let mut upload = self.store.put_multipart(&path).await?;
        let written = async {
            let mut writing = FuturesUnordered::new();
            while let Some(part) = parts.next().await? {
                writing.push(upload.put_part(part.into_iter().collect()));
                while writing.len() >= RELEASE_PARTS_IN_FLIGHT {
                    writing.next().await.expect("a part is in flight")?;
                }
            }
            while let Some(written) = writing.next().await {
                written?;
            }
            upload.complete().await?;
            Ok::<_, AccountantError>(())
        }
        .await;
        if written.is_err() {
            // Best effort: the caller deletes the object and records the discard either way.
            let _ = upload.abort().await;
        }
        written
    }

    /// The stored release of `step`, or None when there is none (trimmed, or never stored).
    /// Returns the release's little-endian f32 bytes, checked to hold `dim` values.
    pub async fn get_release(
        &self,
        job_id: &str,
        step: u64,
        dim: usize,
    ) -> Result<Option<bytes::Bytes>, AccountantError> {
        let path = self.job_path(job_id, &format!("releases/{step:020}.f32"));
        let bytes = match self.store.get(&path).await {
            Ok(r) => r.bytes().await?,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if bytes.len() != dim * 4 {
            return Err(AccountantError::CorruptLedger {
                path: path.to_string(),
                reason: format!("{} bytes, expected {} (gradient_dim {dim} f32)", bytes.len(), dim * 4),
            });
        }
        Ok(Some(bytes))
    }

    /// Discards a charged step whose release could not be stored: deletes any release object a
    /// failed put may have left, then records the discard (retried a few times).
    pub async fn discard(&self, job_id: &str, step: u64) -> Result<(), AccountantError> {
        let release = self.job_path(job_id, &format!("releases/{step:020}.f32"));
        let mut last = None;
        for attempt in 0..5u32 {
            let deleted = match self.store.delete(&release).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(AccountantError::from(e)),
            };
            match deleted.and(self.mark_discarded(job_id, step).await) {
                Ok(()) => return Ok(()),
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(std::time::Duration::from_millis(100 << attempt)).await;
        }
        Err(last.expect("at least one attempt"))
    }

    /// Records that a charged step's release was lost (idempotent).
    pub async fn mark_discarded(&self, job_id: &str, step: u64) -> Result<(), AccountantError> {
        let path = self.job_path(job_id, &format!("discarded/{step:020}"));
        match self.create(&path, Vec::new()).await {
            Ok(()) | Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Records the lowest generation a job admits and whether it is suspended (overwritten).
    pub async fn put_generation(&self, job_id: &str, generation: u64, suspended: bool) -> Result<(), AccountantError> {
        let path = self.job_path(job_id, "generation.json");
        let body = serde_json::to_vec(&serde_json::json!({ "generation": generation, "suspended": suspended }))
            .expect("json serialises");
        self.store.put(&path, PutPayload::from(body)).await?;
        Ok(())
    }

    /// Records that a checkpoint covers every step < `before`, then deletes those releases.
    /// The marker is written first: a crash in between leaves orphaned releases, never a
    /// release-less step that replay would mistake for a discarded one.
    pub async fn trim(&self, job_id: &str, before: u64, stored: &[u64]) -> Result<(), AccountantError> {
        let path = self.job_path(job_id, "trimmed.json");
        let body = serde_json::to_vec(&serde_json::json!({ "before": before })).expect("json serialises");
        self.store.put(&path, PutPayload::from(body)).await?;
        for &step in stored.iter().filter(|&&s| s < before) {
            match self.store.delete(&self.job_path(job_id, &format!("releases/{step:020}.f32"))).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// The job's audit secret: drawn from OS entropy and stored the first time (create-once),
    /// read back ever after, so that a restarted accountant places and samples the same
    /// canaries. It stays in the ledger: no API returns it.
    pub async fn audit_secret(&self, job_id: &str) -> Result<[u8; 32], AccountantError> {
        let path = self.job_path(job_id, "audit/secret");
        let mut fresh = [0u8; 32];
        getrandom::fill(&mut fresh)?;
        match self.create(&path, fresh.to_vec()).await {
            Ok(()) => return Ok(fresh),
            Err(object_store::Error::AlreadyExists { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        let stored = self.store.get(&path).await?.bytes().await?;
        stored.as_ref().try_into().map_err(|_| AccountantError::CorruptLedger {
            path: path.to_string(),
            reason: format!("{} bytes, expected a 32-byte secret", stored.len()),
        })
    }

    /// Stores the canaries' readings of release `step` (one f32 per canary): what the audit
    /// scores, kept when the release itself is trimmed.
    pub async fn put_audit_readings(&self, job_id: &str, step: u64, readings: Vec<u8>) -> Result<(), AccountantError> {
        let path = self.job_path(job_id, &format!("audit/readings/{step:020}.f32"));
        self.store.put(&path, PutPayload::from(readings)).await?;
        Ok(())
    }

    /// The stored readings of `step`, or None (a discarded step, or one whose write failed).
    pub async fn get_audit_readings(&self, job_id: &str, step: u64) -> Result<Option<bytes::Bytes>, AccountantError> {
        let path = self.job_path(job_id, &format!("audit/readings/{step:020}.f32"));
        match self.store.get(&path).await {
            Ok(r) => Ok(Some(r.bytes().await?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Records that a job ended (idempotent; the first reason is kept).
    pub async fn close(&self, job_id: &str, reason: &str, spend: ClosedSpend) -> Result<(), AccountantError> {
        let path = self.job_path(job_id, "closed.json");
        // JSON has no infinity: a baseline's ε (+∞) is recorded as nothing, computed at replay.
        let spend = spend.epsilon_spent.is_finite().then_some(spend);
        let body =
            serde_json::to_vec(&serde_json::json!({ "reason": reason, "spend": spend })).expect("json serialises");
        match self.create(&path, body).await {
            Ok(()) | Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Records a dataset budget: the audit entry first (create-once: a concurrent change of the
    /// same version fails), then the current value.
    pub async fn put_budget(&self, budget: &DatasetBudget) -> Result<(), AccountantError> {
        let dir = format!("{}/datasets/{}", self.root, budget.key().path_component());
        let body = serde_json::to_vec_pretty(budget).expect("budget serialises");
        let audit = Path::from(format!("{dir}/audit/{:020}.json", budget.version).trim_start_matches('/'));
        match self.create(&audit, body.clone()).await {
            Ok(()) => {}
            Err(object_store::Error::AlreadyExists { .. }) => {
                return Err(AccountantError::invalid(
                    "dataset_id",
                    format!(
                        "budget of {} changed concurrently (version {}); retry",
                        budget.key().describe(),
                        budget.version
                    ),
                ));
            }
            Err(e) => return Err(e.into()),
        }
        let current = Path::from(format!("{dir}/budget.json").trim_start_matches('/'));
        self.store.put(&current, PutPayload::from(body)).await?;
        Ok(())
    }

    /// Every dataset budget in the ledger: for each dataset, its newest audit entry (the audit
    /// log is the record; `budget.json` is a copy for people and may lag after a failed write).
    pub async fn budgets(&self) -> Result<Vec<DatasetBudget>, AccountantError> {
        let prefix = Path::from(format!("{}/datasets", self.root).trim_start_matches('/'));
        let objects: Vec<_> = self.store.list(Some(&prefix)).try_collect().await?;
        let mut newest: BTreeMap<String, (u64, Path)> = BTreeMap::new();
        for object in &objects {
            let parts: Vec<String> = object
                .location
                .prefix_match(&prefix)
                .map(|p| p.map(|s| s.as_ref().to_owned()).collect())
                .unwrap_or_default();
            if let [dataset, dir, name] = parts.as_slice()
                && dir == "audit"
                && let Some(version) = name.strip_suffix(".json").and_then(|n| n.parse::<u64>().ok())
            {
                let entry = newest.entry(dataset.clone()).or_insert((0, object.location.clone()));
                if version >= entry.0 {
                    *entry = (version, object.location.clone());
                }
            }
        }
        let mut budgets = Vec::new();
        for (_, path) in newest.into_values() {
            budgets.push(self.read_json(&path).await?);
        }
        Ok(budgets)
    }

    /// The newest audit version of a budget (0 for none): a change is numbered after it, so a
    /// change whose audit entry landed but whose copy did not is never reused.
    pub async fn budget_version(&self, key: &BudgetKey) -> Result<u64, AccountantError> {
        let prefix =
            Path::from(format!("{}/datasets/{}/audit", self.root, key.path_component()).trim_start_matches('/'));
        let objects: Vec<_> = self.store.list(Some(&prefix)).try_collect().await?;
        Ok(objects
            .iter()
            .filter_map(|o| o.location.filename()?.strip_suffix(".json")?.parse::<u64>().ok())
            .max()
            .unwrap_or(0))
    }

    /// What the ledger holds of each job, by the names of its objects (nothing read yet).
    async fn list_jobs(&self) -> Result<BTreeMap<String, Found>, AccountantError> {
        let prefix = Path::from(format!("{}/jobs", self.root).trim_start_matches('/'));
        let objects: Vec<_> = self.store.list(Some(&prefix)).try_collect().await?;
        let mut found: BTreeMap<String, Found> = BTreeMap::new();
        for object in objects {
            let parts: Vec<_> = object
                .location
                .prefix_match(&prefix)
                .map(|p| p.map(|s| s.as_ref().to_owned()).collect())
                .unwrap_or_default();
            let Some(job) = parts.first() else { continue };
            let entry = found.entry(job.clone()).or_default();
            let step_of = |name: &str| name.trim_end_matches(".json").parse::<u64>().ok();
            match parts.get(1..).unwrap_or_default() {
                [name] if name == "registration.json" => entry.registration = true,
                [name] if name == "closed.json" => entry.closed = true,
                [name] if name == "trimmed.json" => entry.trimmed = true,
                [name] if name == "generation.json" => entry.generation = true,
                [dir, name] if dir == "charges" => entry.charged.extend(step_of(name)),
                [dir, name] if dir == "releases" => {
                    entry.released.extend(name.strip_suffix(".f32").and_then(|n| n.parse::<u64>().ok()))
                }
                [dir, name] if dir == "discarded" => entry.discarded.extend(step_of(name)),
                // The audit's secret and readings are read when the job is built or audited.
                [dir, ..] if dir == "audit" => {}
                _ => tracing::warn!(path = %object.location, "ignoring unknown ledger object"),
            }
        }
        Ok(found)
    }

    /// Reads back every job in the ledger.
    pub async fn replay(&self) -> Result<Vec<JobRecord>, AccountantError> {
        let found = self.list_jobs().await?;
        let mut jobs = Vec::with_capacity(found.len());
        for (job_id, f) in found {
            if !f.registration {
                return Err(AccountantError::CorruptLedger {
                    path: format!("jobs/{job_id}"),
                    reason: "charges without a registration".into(),
                });
            }
            let registration: Registration = self.read_json(&self.job_path(&job_id, "registration.json")).await?;
            self.remove_stale_staging(&job_id).await;
            let (closed, closed_spend) = if f.closed {
                let v: serde_json::Value = self.read_json(&self.job_path(&job_id, "closed.json")).await?;
                // A record of the spend that does not parse is ignored: the replay computes it.
                let spend = serde_json::from_value::<ClosedSpend>(v["spend"].clone()).ok();
                (Some(v["reason"].as_str().unwrap_or_default().to_owned()), spend)
            } else {
                (None, None)
            };
            let trimmed_before = if f.trimmed {
                let v: serde_json::Value = self.read_json(&self.job_path(&job_id, "trimmed.json")).await?;
                v["before"].as_u64().ok_or_else(|| AccountantError::CorruptLedger {
                    path: format!("jobs/{job_id}/trimmed.json"),
                    reason: "no unsigned \"before\"".into(),
                })?
            } else {
                0
            };
            let (generation, suspended) = if f.generation {
                let v: serde_json::Value = self.read_json(&self.job_path(&job_id, "generation.json")).await?;
                (v["generation"].as_u64().unwrap_or(0), v["suspended"].as_bool().unwrap_or(false))
            } else {
                (0, false)
            };
            jobs.push(JobRecord {
                registration,
                charged: f.charged,
                released: f.released,
                discarded: f.discarded,
                trimmed_before,
                closed,
                closed_spend,
                generation,
                suspended,
            });
        }
        Ok(jobs)
    }

    /// A local ledger's releases a crash left half written (their staging files, up to 4·P
    /// bytes each), removed at replay. Files younger than 10 minutes are left alone: another
    /// accountant sharing the ledger may be writing them.
    async fn remove_stale_staging(&self, job_id: &str) {
        let Some(dir) = self.local.as_ref().and_then(|l| l.path_to_filesystem(&self.job_path(job_id, "releases")).ok())
        else {
            return;
        };
        let removed = tokio::task::spawn_blocking(move || {
            let stale = crate::synced::stale_staging(&dir, std::time::Duration::from_secs(600));
            stale.into_iter().filter(|path| std::fs::remove_file(path).is_ok()).count()
        })
        .await
        .unwrap_or(0);
        if removed > 0 {
            tracing::info!(job_id, removed, "removed releases left half written by a crash");
        }
    }

    async fn create(&self, path: &Path, body: Vec<u8>) -> Result<(), object_store::Error> {
        let options = PutOptions { mode: PutMode::Create, ..Default::default() };
        self.store.put_opts(path, PutPayload::from(body), options).await.map(|_| ())
    }

    async fn read_json<T: serde::de::DeserializeOwned>(&self, path: &Path) -> Result<T, AccountantError> {
        let bytes = self.store.get(path).await?.bytes().await?;
        serde_json::from_slice(&bytes).map_err(|source| AccountantError::LedgerJson { path: path.to_string(), source })
    }
}
