//! The coordinator's side of the accountant: it registers every job's contract (the only
//! process allowed to), reads each job's spend and position from the ledger (never from a
//! worker's word), closes ended jobs, trims releases that a stored checkpoint covers, and asks
//! for an ended job's audit. It reads the state, never changes it: what it learns goes back
//! to `coordinator.rs`, which applies it. Every call retries what is transient within a bound well below a
//! lease, so a down accountant delays the coordinator but never wedges it.

use std::time::Duration;

use dpcap_proto::client::ClientError;
use dpcap_proto::v1::{AuditReport, CloseJobRequest, Job, JobSpend, RegisterJobRequest};
use dpcap_proto::{RetryPolicy, retry};

use crate::coordinator::Coordinator;
use crate::error::CoordinatorError;
use crate::state::{AUDIT_FAILED, AUDIT_PASSED, AUDIT_VIOLATION, Closing};

/// One attempt of an ended job's audit (scoring is milliseconds; a stalled call is retried).
const AUDIT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(20);

/// The coordinator's bound on one attempt of any other accountant call: each is a small unary
/// call (register, spend, close, trim) that answers in milliseconds.
const ACCOUNTANT_ATTEMPT: Duration = Duration::from_secs(10);

/// The bound on one registration attempt: a registration is the one call whose work grows
/// with what it checks (its dataset's history and plans: milliseconds by the RDP bound, seconds
/// for an exact composition near the budget's boundary at a low σ). An attempt cut short would
/// leave a registration the accountant may have written, which the submission then suspends; a
/// down accountant answers UNAVAILABLE at once, so waiting longer costs nothing there.
const REGISTER_ATTEMPT: Duration = Duration::from_secs(120);

/// An accountant's refusal, with its code kept (a bad contract is the submitter's to fix, a
/// missing budget its privacy admin's), or UNAVAILABLE when it could not be reached.
fn refusal(error: ClientError) -> CoordinatorError {
    match error.code {
        Some(code) if !error.transient => {
            CoordinatorError::Refused { code, message: error.message, budget: error.budget }
        }
        _ => CoordinatorError::accountant("", error),
    }
}

/// What became of a close.
enum Closed {
    /// Done.
    Yes,
    /// The accountant knows no such job (nothing to revoke).
    Unknown,
    /// It could not be told.
    Failed,
}

/// A spend answer held against the job's record: NOT_FOUND means never registered, and a
/// contract other than the record's is refused naming each field with both values.
fn checked_spend(job: &Job, answer: Result<JobSpend, ClientError>) -> Result<JobSpend, CoordinatorError> {
    let spend = match answer {
        Ok(spend) => spend,
        Err(e) if e.status == tonic::Code::NotFound => return Err(CoordinatorError::NotRegistered(job.job_id.clone())),
        Err(e) => return Err(refusal(e)),
    };
    let recorded = job.plan.as_ref().map(dpcap_proto::plan::contract).transpose()?;
    let registered = spend.contract.clone().map(dpcap_proto::contract::contract_from_proto).transpose()?;
    if let (Some(recorded), Some(registered)) = (recorded, registered)
        && recorded != registered
    {
        let differences = recorded.differences(&registered, ("in the record", "in the ledger")).join("; ");
        return Err(CoordinatorError::ContractMismatch { job_id: job.job_id.clone(), differences });
    }
    Ok(spend)
}

impl Coordinator {
    /// Retries of accountant calls: bounded well below a lease.
    pub(crate) fn accountant_retry(&self) -> RetryPolicy {
        // Every call here is a small unary one made inside a transition's effects, and watchers
        // wake only after those: one answer that never comes (seen in the e2e loop: a CloseJob
        // or AuditJob the accountant had carried out) must not hold `dpctl wait` forever.
        let deadline = self.config.lease.max(Duration::from_secs(5));
        RetryPolicy { deadline, attempt: Some(ACCOUNTANT_ATTEMPT), ..RetryPolicy::default() }
    }

    /// Registers the job's contract (idempotent for an identical one).
    pub(crate) async fn register(&self, job: &Job) -> Result<(), CoordinatorError> {
        let plan =
            job.plan.as_ref().ok_or_else(|| CoordinatorError::Invariant(format!("job {} has no plan", job.job_id)))?;
        let request = RegisterJobRequest {
            job_id: job.job_id.clone(),
            contract: plan.contract.clone(),
            gradient_dim: plan.gradient_dim,
            insecure_noise_seed: None,
        };
        let policy = RetryPolicy { attempt: Some(REGISTER_ATTEMPT), ..self.accountant_retry() };
        retry(policy, "register_job", || {
            let (mut client, request) = (self.accountant.clone(), request.clone());
            async move { client.register_job(request).await }
        })
        .await
        .map_err(refusal)?;
        Ok(())
    }

    /// The job's spend at the accountant, whose ledger is the source of truth: a job it does
    /// not know was never registered (a job is registered only at submit, never here), and a
    /// contract other than the job's record is refused naming each field.
    pub(crate) async fn spend(&self, job: &Job) -> Result<JobSpend, CoordinatorError> {
        let spend = retry(self.accountant_retry(), "get_spend", || {
            let (mut client, job_id) = (self.accountant.clone(), job.job_id.clone());
            async move { client.get_spend(&job_id).await }
        })
        .await;
        checked_spend(job, spend)
    }

    /// Fences the job's generations at the accountant: capabilities of generations below
    /// `generation` are refused from now on; with `resume`, a group of `generation` starts
    /// (a suspended job opens to it). Returns the spend, its contract checked as [`Self::spend`].
    pub(crate) async fn fence(&self, job: &Job, generation: u64, resume: bool) -> Result<JobSpend, CoordinatorError> {
        let spend = retry(self.accountant_retry(), "fence_job", || {
            let (mut client, job_id) = (self.accountant.clone(), job.job_id.clone());
            async move { client.fence_job(&job_id, generation, resume).await }
        })
        .await;
        checked_spend(job, spend)
    }

    /// Revokes the generations a transition dissolved, before anything else of it is carried
    /// out: a worker of an old group is refused at once, not when its capability expires.
    pub(crate) async fn revoke(&self, fences: &[(String, u64)]) {
        for (job_id, below) in fences {
            let Some(job) = self.lock().jobs.get(job_id).map(|e| e.job.clone()) else { continue };
            if let Err(e) = self.fence(&job, *below, false).await {
                tracing::warn!(job_id, generation = below, error = %e, "could not revoke the old generation");
            }
        }
    }

    /// Carries out the closes a transition asked for. Returns the closed jobs that were
    /// submitted with an audit, and the jobs the accountant could not be told of.
    pub(crate) async fn close_all(&self, closings: &[Closing]) -> (Vec<String>, Vec<String>) {
        let (mut audits, mut unclosed) = (Vec::new(), Vec::new());
        for closing in closings {
            match self.close(closing).await {
                Closed::Yes if !closing.resumable && self.is_audited(&closing.job_id) => {
                    audits.push(closing.job_id.clone())
                }
                Closed::Yes | Closed::Unknown => {}
                Closed::Failed => unclosed.push(closing.job_id.clone()),
            }
        }
        (audits, unclosed)
    }

    /// Carries out the trims a transition asked for.
    pub(crate) async fn trim_all(&self, trims: &[(String, u64)]) {
        for (job_id, reported) in trims {
            self.trim(job_id, *reported).await;
        }
    }

    /// The ledger's spend of a job the coordinator holds, for its progress; None (logged) when
    /// it could not be read. Only [`Coordinator`] applies it to the state.
    pub(crate) async fn ledger_spend(&self, job_id: &str) -> Option<JobSpend> {
        let job = self.lock().jobs.get(job_id).map(|e| e.job.clone())?;
        self.spend(&job)
            .await
            .inspect_err(|e| tracing::warn!(job_id, error = %e, "could not read the job's spend from the accountant"))
            .ok()
    }

    /// Closes a job (or, resumable, suspends it).
    async fn close(&self, closing: &Closing) -> Closed {
        let request = CloseJobRequest {
            job_id: closing.job_id.clone(),
            reason: closing.reason.clone(),
            resumable: closing.resumable,
            generation: closing.generation,
        };
        let closed = retry(self.accountant_retry(), "close_job", || {
            let (mut client, request) = (self.accountant.clone(), request.clone());
            async move { client.close_job(request).await }
        })
        .await;
        match closed {
            Ok(_) => Closed::Yes,
            Err(e) if e.status == tonic::Code::NotFound => Closed::Unknown,
            Err(e) => {
                tracing::warn!(job_id = closing.job_id, error = %e, "could not close the job at the accountant");
                Closed::Failed
            }
        }
    }

    /// Lets the accountant delete releases below the checkpoint rank 0 reported, once the
    /// stored `latest` pointer shows that checkpoint (never past it).
    async fn trim(&self, job_id: &str, reported: u64) {
        let Some(root) = self.lock().jobs.get(job_id).map(|e| e.job.checkpoint_root.clone()) else { return };
        let latest = match dpcap_serve::store::read_object(&format!("{root}/latest")).await {
            Ok(bytes) => String::from_utf8_lossy(&bytes).trim().parse::<u64>().unwrap_or(0),
            Err(e) => {
                tracing::warn!(job_id, error = %e, "no stored checkpoint to trim against");
                return;
            }
        };
        let before_step = reported.min(latest);
        if before_step == 0 {
            return;
        }
        let trimmed = retry(self.accountant_retry(), "trim_releases", || {
            let (mut client, job_id) = (self.accountant.clone(), job_id.to_owned());
            async move { client.trim_releases(&job_id, before_step).await }
        })
        .await;
        if let Err(e) = trimmed {
            // Untrimmed releases only cost storage; the next checkpoint trims them.
            tracing::warn!(job_id, before_step, error = %e, "could not trim releases at the accountant");
        }
    }

    /// The one-run audit of an ended job, asked of the accountant for `dpctl audit` (operators
    /// and viewers of the coordinator): a job unknown here, or submitted without canaries, is
    /// refused before the accountant is asked.
    pub async fn audit(&self, job_id: &str) -> Result<AuditReport, CoordinatorError> {
        self.get(job_id)?;
        if !self.is_audited(job_id) {
            return Err(CoordinatorError::Precondition {
                job_id: job_id.to_owned(),
                state: "not audited".into(),
                reason: "it was submitted without `audit: {canaries: M}`, so there is nothing to score".into(),
            });
        }
        if let Some(report) = self.audits.lock().expect("audits lock").get(job_id) {
            return Ok(report.clone());
        }
        self.ask_audit(job_id).await.map_err(refusal)
    }

    /// Asks the accountant to score the job's audit; a score is kept (an ended job's releases
    /// never change), so viewers asking again cost nothing.
    async fn ask_audit(&self, job_id: &str) -> Result<AuditReport, ClientError> {
        // The accountant ends an attempt at AUDIT_ATTEMPT_TIMEOUT; the client's own bound, a
        // little later, covers an answer that never leaves it.
        let policy =
            RetryPolicy { attempt: Some(AUDIT_ATTEMPT_TIMEOUT + ACCOUNTANT_ATTEMPT), ..self.accountant_retry() };
        let report = retry(policy, "audit_job", || {
            // A stalled attempt ends DEADLINE_EXCEEDED and is retried: the job's watchers wake
            // only after its audit, so one stuck call must never hold them.
            let (mut client, job_id) = (self.accountant.clone(), job_id.to_owned());
            async move { client.audit_job(&job_id, AUDIT_ATTEMPT_TIMEOUT).await }
        })
        .await?;
        self.audits.lock().expect("audits lock").insert(job_id.to_owned(), report.clone());
        Ok(report)
    }

    fn is_audited(&self, job_id: &str) -> bool {
        self.lock().jobs.get(job_id).and_then(|e| e.job.spec.as_ref()).is_some_and(|spec| spec.audit.is_some())
    }

    /// The condition an ended job's audit adds (type, reason, message): `Audited`/`AuditPassed`,
    /// or `Warning`/`AuditViolation` when the lower bound passes the claimed ε (the accountant
    /// also counts it in `dpcap_audit_violations_total`), or `Warning`/`AuditFailed`. The
    /// message says what the audit covers. Only [`Coordinator`] applies it to the job.
    pub(crate) async fn audit_condition(&self, job_id: &str) -> (&'static str, &'static str, String) {
        match self.ask_audit(job_id).await {
            Ok(r) => {
                let (kind, reason) = if r.violation { ("Warning", AUDIT_VIOLATION) } else { ("Audited", AUDIT_PASSED) };
                let message = format!(
                    "epsilon lower bound {:.4} vs claimed {:.4} at delta {:.2e} (95 % confidence): {} of {} guesses \
                     right on {} canaries over {} releases; {}",
                    r.epsilon_lower_bound,
                    r.epsilon_claimed,
                    r.delta,
                    r.correct,
                    r.guesses,
                    r.canaries,
                    r.steps_scored,
                    r.covers
                );
                (kind, reason, message)
            }
            Err(e) => ("Warning", AUDIT_FAILED, format!("the accountant could not audit the job: {}", e.message)),
        }
    }
}
