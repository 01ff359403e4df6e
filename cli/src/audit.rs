//! `dpctl audit JOB`: the one-run privacy audit of an ended job that was submitted with
//! `audit: {canaries: m}`. The accountant scores the job's canaries on every stored release and
//! reports the ε lower bound at δ they prove (95 % confidence) beside the ε the job claims. A
//! bound above the claim means the mechanism gives less privacy than it reports: exit code 6.
//! It asks the coordinator (operator or viewer role), or with `--accountant` the accountant.

use anyhow::{Context, Result};
use clap::Args;
use dpcap_proto::client::{AccountantClient, CallCredentials};
use dpcap_proto::v1::{AuditJobRequest, AuditReport};
use serde_json::json;

use crate::jobs::{Server, status};

/// Exit code of an audit whose lower bound passes the claimed ε.
pub const VIOLATION_EXIT: i32 = 6;

/// Options of `dpctl audit`.
#[derive(Debug, Clone, Args)]
pub struct AuditArgs {
    /// The job (ended: succeeded, failed, cancelled or out of budget).
    pub job_id: String,
    /// Ask this accountant directly (its operator, viewer or privacy-admin role) instead of
    /// the coordinator.
    #[arg(long, env = "DPCAP_ACCOUNTANT")]
    pub accountant: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

fn to_json(r: &AuditReport) -> serde_json::Value {
    json!({
        "job_id": r.job_id,
        "epsilon_claimed": r.epsilon_claimed,
        "delta": r.delta,
        "epsilon_lower_bound": r.epsilon_lower_bound,
        "epsilon_lower_bound_fdp": r.epsilon_lower_bound_fdp,
        "canaries": r.canaries,
        "guesses": r.guesses,
        "correct": r.correct,
        "confidence": r.confidence,
        "steps_scored": r.steps_scored,
        "violation": r.violation,
        "covers": r.covers,
    })
}

/// Runs the audit; returns the exit code (0, or [`VIOLATION_EXIT`]).
pub async fn run(args: AuditArgs, server: &Server) -> Result<i32> {
    let request = AuditJobRequest { job_id: args.job_id.clone() };
    let report = match &args.accountant {
        Some(accountant) => {
            let endpoint =
                server.tls.endpoint(accountant).with_context(|| format!("invalid --accountant {accountant}"))?;
            let mut client = AccountantClient::lazy(endpoint, CallCredentials::token(server.token.clone()));
            client.raw().audit_job(request).await
        }
        None => server.connect().await?.raw().audit_job(request).await,
    }
    .map_err(status)?
    .into_inner();
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&to_json(&report))?);
    } else {
        outln!(
            "job {}: epsilon claimed {:.4} at delta {:.2e}; audited lower bound {:.4} ({:.0} % confidence; f-DP variant {:.4})",
            report.job_id,
            report.epsilon_claimed,
            report.delta,
            report.epsilon_lower_bound,
            100.0 * report.confidence,
            report.epsilon_lower_bound_fdp
        );
        outln!(
            "{} canaries, {} guesses, {} right, over {} releases",
            report.canaries,
            report.guesses,
            report.correct,
            report.steps_scored
        );
        outln!("the audit {}", report.covers);
        if report.violation {
            outln!("VIOLATION: the job gives less privacy than it claims (a mechanism bug, or a 5 % chance)");
        }
    }
    Ok(if report.violation { VIOLATION_EXIT } else { 0 })
}
