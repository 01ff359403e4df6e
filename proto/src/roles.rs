//! Who may call what: every RPC of the protocol with the roles allowed to call it, beside the
//! protocol it describes, so that an RPC and its roles are added together. `dpcap_serve::auth`
//! enforces it; a serve test holds it equal to the protocol's RPCs, and the fuzz suite walks it.

use std::fmt;
use std::str::FromStr;

/// A caller's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Submits, cancels and resumes jobs.
    Operator,
    /// Reads jobs (get, list, watch) and spend.
    Viewer,
    /// A rank: WorkerService, parts in and releases out.
    Worker,
    /// The coordinator: registers, closes and trims jobs at the accountant.
    Coordinator,
    /// Owns datasets' privacy budgets.
    PrivacyAdmin,
}

/// Every role, in a fixed order.
pub const ROLES: [Role; 5] = [Role::Operator, Role::Viewer, Role::Worker, Role::Coordinator, Role::PrivacyAdmin];

impl Role {
    /// The role's name in flags, token files and errors.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Operator => "operator",
            Role::Viewer => "viewer",
            Role::Worker => "worker",
            Role::Coordinator => "coordinator",
            Role::PrivacyAdmin => "privacy-admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A role name that does not exist.
#[derive(Debug, thiserror::Error)]
#[error("invalid role {0:?}: expected one of operator, viewer, worker, coordinator, privacy-admin")]
pub struct UnknownRole(pub String);

impl FromStr for Role {
    type Err = UnknownRole;
    fn from_str(s: &str) -> Result<Self, UnknownRole> {
        ROLES.into_iter().find(|r| r.as_str() == s).ok_or_else(|| UnknownRole(s.to_owned()))
    }
}

use Role::{Coordinator, Operator, PrivacyAdmin, Viewer, Worker};

/// The roles allowed on each RPC (full gRPC paths).
pub const POLICY: &[(&str, &[Role])] = &[
    // Only the coordinator writes a job's privacy contract; workers attach to it, and their
    // parts and releases also need a capability for the job (`dpcap_serve::capability`).
    ("/dpcap.v1.AccountantService/RegisterJob", &[Coordinator]),
    ("/dpcap.v1.AccountantService/AttachJob", &[Worker]),
    ("/dpcap.v1.AccountantService/SubmitPart", &[Worker]),
    ("/dpcap.v1.AccountantService/FetchRelease", &[Worker]),
    // The same-host socket's path and identity: only a rank can use it.
    ("/dpcap.v1.AccountantService/GetLocalEndpoint", &[Worker]),
    ("/dpcap.v1.AccountantService/GetSpend", &[Coordinator, Operator, Viewer, PrivacyAdmin]),
    ("/dpcap.v1.AccountantService/CloseJob", &[Coordinator]),
    // Revocation: only the coordinator, which forms and dissolves groups, fences them.
    ("/dpcap.v1.AccountantService/FenceJob", &[Coordinator]),
    ("/dpcap.v1.AccountantService/TrimReleases", &[Coordinator]),
    ("/dpcap.v1.AccountantService/Estimate", &[Operator, Viewer, Coordinator, PrivacyAdmin]),
    ("/dpcap.v1.AccountantService/SetDatasetBudget", &[PrivacyAdmin]),
    ("/dpcap.v1.AccountantService/GetDatasetBudget", &[PrivacyAdmin, Operator, Viewer, Coordinator]),
    ("/dpcap.v1.AccountantService/AuditJob", &[Operator, Viewer, PrivacyAdmin, Coordinator]),
    ("/dpcap.v1.JobService/SubmitJob", &[Operator]),
    ("/dpcap.v1.JobService/CancelJob", &[Operator]),
    ("/dpcap.v1.JobService/ResumeJob", &[Operator]),
    ("/dpcap.v1.JobService/GetJob", &[Operator, Viewer]),
    ("/dpcap.v1.JobService/ListJobs", &[Operator, Viewer]),
    ("/dpcap.v1.JobService/WatchJob", &[Operator, Viewer]),
    ("/dpcap.v1.JobService/AuditJob", &[Operator, Viewer]),
    ("/dpcap.v1.WorkerService/RegisterWorker", &[Worker]),
    ("/dpcap.v1.WorkerService/Heartbeat", &[Worker]),
    ("/dpcap.v1.WorkerService/GetStep", &[Worker]),
    ("/dpcap.v1.WorkerService/ReportStep", &[Worker]),
    ("/dpcap.v1.WorkerService/Rendezvous", &[Worker]),
    ("/dpcap.v1.WorkerService/Leave", &[Worker]),
];

/// The roles allowed on `path`; None for a path the policy does not name (denied).
pub fn allowed(path: &str) -> Option<&'static [Role]> {
    POLICY.iter().find(|(p, _)| *p == path).map(|(_, roles)| *roles)
}
