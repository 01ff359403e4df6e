//! `dpctl dataset budget set|show`: a dataset's lifetime privacy budget, owned by its privacy
//! admins and enforced by the accountant over every job that trains on the dataset. The dataset
//! is named by the digest of its index (or by its directory/URL, whose index is digested here).

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use dpcap_proto::client::{AccountantClient, CallCredentials};
use dpcap_proto::v1::{DatasetBudget, GetDatasetBudgetRequest, PrivacyUnit, SetDatasetBudgetRequest};
use object_store::ObjectStoreExt;
use object_store::path::Path;
use serde_json::json;

use crate::jobs::{Server, status};

/// Where the accountant is.
#[derive(Debug, Clone, Args)]
pub struct Accountant {
    /// The accountant's gRPC endpoint (the token is --token: the privacy-admin role to set).
    #[arg(long, default_value = "http://127.0.0.1:7070", env = "DPCAP_ACCOUNTANT")]
    pub accountant: String,
}

#[derive(Debug, Subcommand)]
pub enum BudgetCommand {
    /// Set (or change) a dataset's lifetime (epsilon, delta); recorded in the audit log.
    Set {
        /// The dataset: its index digest ("sha256:…"), or its directory or URL.
        dataset: String,
        /// Lifetime epsilon at --delta, over every job on the dataset.
        #[arg(long, allow_negative_numbers = true)]
        epsilon: f64,
        /// The delta of the lifetime budget: at most 1/N (N: the dataset's examples, or users
        /// for --unit user).
        #[arg(long, allow_negative_numbers = true)]
        delta: f64,
        /// N of the budget's unit (examples, or users for --unit user). Read from the index
        /// when DATASET is a directory or URL; needed when it is a digest.
        #[arg(long)]
        population: Option<u64>,
        /// Lower epsilon below what open jobs have planned (they end BUDGET_EXHAUSTED before
        /// their plans), or change delta (every charge's epsilon reads anew). Refused without it.
        #[arg(long)]
        force: bool,
        /// Why, for the audit log.
        #[arg(long, default_value = "")]
        reason: String,
        /// Let NOT PRIVATE jobs (non-private baselines, TAN simulations) train on the data.
        /// Their outputs carry no guarantee: only for data whose owners accept that.
        #[arg(long)]
        allow_not_private: bool,
        /// The privacy unit the budget is for: example (the default), or user (user-level
        /// jobs such as DP-FedEmb). Budgets of different units never compose.
        #[arg(long, value_enum, default_value_t = Unit::Example)]
        unit: Unit,
        /// A readable name for dashboards (the metrics' `name` label); default: DATASET as
        /// given when it is a path or URL, else the name already set.
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        to: Accountant,
    },
    /// Show a dataset's budget, its spend so far and its jobs.
    Show {
        /// The dataset: its index digest, or its directory or URL.
        dataset: String,
        /// The privacy unit whose budget to show.
        #[arg(long, value_enum, default_value_t = Unit::Example)]
        unit: Unit,
        #[command(flatten)]
        to: Accountant,
    },
}

/// Whose privacy a budget protects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Unit {
    /// One example (image-text pair).
    Example,
    /// One user and all their examples.
    User,
}

impl Unit {
    fn to_proto(self) -> i32 {
        match self {
            Unit::Example => PrivacyUnit::Example as i32,
            Unit::User => PrivacyUnit::User as i32,
        }
    }
}

/// What the index of `dataset` says of it: the digest its budget is keyed by (the data's, from
/// its shards' content digests: every index and copy of the same shards names the same budget;
/// for an index that pins no shard bytes, the index's own), and its examples and users.
#[derive(Debug, Clone, PartialEq)]
pub struct Indexed {
    /// The budget's digest.
    pub budget_id: String,
    /// Examples N.
    pub examples: u64,
    /// Distinct users, when the index has a users table.
    pub users: Option<u64>,
    /// The manifest's format version: a budget binds examples of version 4 only.
    pub version: u32,
    /// The shards' digest ([`dpcap_dataset::index::Manifest::shards_digest`]), which the budget
    /// records: jobs on the same shards' bytes spend it whatever identities their index states.
    pub shards_id: Option<String>,
}

/// The digest a budget of `dataset` is keyed by: given as is, or read from its index.
pub async fn budget_id(dataset: &str) -> Result<String> {
    if dataset.starts_with("sha256:") {
        return Ok(dataset.to_owned());
    }
    Ok(indexed(dataset).await?.budget_id)
}

/// Reads `dataset`'s index (a directory or URL).
pub async fn indexed(dataset: &str) -> Result<Indexed> {
    let (store, root) = dpcap_serve::open_existing_store(dataset)?;
    let manifest = dpcap_dataset::index::MANIFEST_PATH;
    let path = Path::from(format!("{root}/{manifest}").trim_start_matches('/'));
    let read = async { store.get(&path).await?.bytes().await };
    let bytes = read.await.map_err(|e| unreadable_index(dataset, manifest, e))?;
    let parsed = dpcap_dataset::index::Manifest::parse(&bytes).with_context(|| format!("{dataset}/{manifest}"))?;
    Ok(Indexed {
        budget_id: parsed.data_digest().unwrap_or_else(|| dpcap_dataset::index::Manifest::digest(&bytes)),
        examples: parsed.examples,
        users: parsed.users.as_ref().map(|u| u.users),
        version: parsed.version,
        shards_id: parsed.shards_digest(),
    })
}

/// Refuses a budget on an index whose examples have no identities (versions 2 and 3): DP jobs
/// never train on one, and a budget it named would bind nothing of its examples.
/// Returns the shards' digest the budget records ("" for a budget named by its digest).
async fn check_budgetable(dataset: &str) -> Result<String> {
    if dataset.starts_with("sha256:") {
        return Ok(String::new());
    }
    let index = indexed(dataset).await?;
    let version = index.version;
    let needed = dpcap_dataset::index::MANIFEST_VERSION_DP;
    anyhow::ensure!(
        version >= needed,
        "{dataset}: its index is version {version}, which pins no example identities: no budget can bind its \
         examples and no DP job trains on it; index it again with `dpctl dataset index {dataset}`, then set the budget"
    );
    Ok(index.shards_id.unwrap_or_default())
}

/// The name a budget of `dataset` gets when none is given; it becomes a metric label, so one
/// dataset has one name however it was typed: a local path made absolute and normalised, a URL
/// without its trailing slash and any credential it carries; none for a digest (the metrics
/// show the digest anyway).
fn default_name(dataset: &str) -> String {
    if dataset.starts_with("sha256:") {
        return String::new();
    }
    let local = !dataset.contains("://");
    let named = match std::env::current_dir() {
        Ok(here) if local => crate::jobs::normalized(&here.join(dataset)).to_string_lossy().into_owned(),
        _ => dataset.trim_end_matches('/').to_owned(),
    };
    dpcap_serve::store::shown(&named)
}

/// Why `dataset`'s index could not be read, and what to do: a missing index is indexed; any
/// other failure (a 403, credentials that could not be found or fetched) is this machine's
/// access to the store, whose words are kept.
fn unreadable_index(dataset: &str, manifest: &str, error: object_store::Error) -> anyhow::Error {
    match error {
        object_store::Error::NotFound { .. } => anyhow::anyhow!(
            "{dataset}/{manifest} was not found ({error}): if the dataset is not indexed, run `dpctl dataset index {dataset}`; if it is, check the URL and that this machine may read it"
        ),
        _ => anyhow::anyhow!(
            "could not read {dataset}/{manifest}: {error}: this machine needs read access to the dataset's store (credentials from the AWS_*, GOOGLE_* or AZURE_* variables object_store reads, or an instance role that allows it)"
        ),
    }
}

/// N of `unit` for a budget of `dataset`: `given`, else from its index.
async fn population(dataset: &str, unit: Unit, given: Option<u64>) -> Result<u64> {
    if let Some(n) = given {
        return Ok(n);
    }
    if dataset.starts_with("sha256:") {
        anyhow::bail!(
            "--population: a budget named by its digest needs N of its unit (the dataset's examples, or users for --unit user), so that delta is held to at most 1/N; or name the dataset by its directory or URL"
        );
    }
    let index = indexed(dataset).await?;
    match unit {
        Unit::Example => Ok(index.examples),
        Unit::User => index.users.ok_or_else(|| {
            anyhow::anyhow!(
                "--unit user: {dataset}'s index has no users table (index it with users), or give --population"
            )
        }),
    }
}

fn print(budget: &DatasetBudget) {
    outln!(
        "{}",
        json!({"dataset_id": budget.dataset_id, "unit": if budget.unit == PrivacyUnit::User as i32 { "user" } else { "example" },
               "epsilon_budget": budget.epsilon_budget, "delta": budget.delta,
               "name": budget.name, "epsilon_spent": budget.epsilon_spent, "epsilon_reserved": budget.epsilon_reserved,
               "epsilon_free": budget.epsilon_free, "jobs": budget.jobs, "version": budget.version,
               "allow_not_private": budget.allow_not_private, "population": budget.population,
               "consequences": budget.consequences})
    );
    for consequence in &budget.consequences {
        eprintln!("note: forced: {consequence}");
    }
}

/// Runs one `dpctl dataset budget` command.
pub async fn run(command: BudgetCommand, server: &Server) -> Result<()> {
    let (dataset, accountant) = match &command {
        BudgetCommand::Set { dataset, to, .. } | BudgetCommand::Show { dataset, to, .. } => {
            (dataset.clone(), to.accountant.clone())
        }
    };
    let dataset_id = budget_id(&dataset).await?;
    let endpoint = server.tls.endpoint(&accountant).with_context(|| format!("invalid --accountant {accountant}"))?;
    let mut client = AccountantClient::lazy(endpoint, CallCredentials::token(server.token.clone()));
    let budget = match command {
        BudgetCommand::Set {
            epsilon, delta, reason, allow_not_private, unit, name, population: given, force, ..
        } => {
            let shards_id = check_budgetable(&dataset).await?;
            let population = population(&dataset, unit, given).await?;
            let unit = unit.to_proto();
            let name = name.unwrap_or_else(|| default_name(&dataset));
            let request = SetDatasetBudgetRequest {
                dataset_id,
                epsilon,
                delta,
                reason,
                allow_not_private,
                unit,
                name,
                population,
                force,
                shards_id,
            };
            client.raw().set_dataset_budget(request).await
        }
        BudgetCommand::Show { unit, .. } => {
            let request = GetDatasetBudgetRequest { dataset_id, unit: unit.to_proto() };
            client.raw().get_dataset_budget(request).await
        }
    };
    print(&budget.map_err(status)?.into_inner());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source() -> Box<dyn std::error::Error + Send + Sync> {
        "HTTP status client error (403 Forbidden) for url (http://169.254.169.254/latest/api/token)".into()
    }

    #[test]
    fn a_refused_index_read_blames_access_with_the_stores_words_not_the_index() {
        let denied = object_store::Error::Generic { store: "S3", source: source() };
        let said = unreadable_index("s3://b/d", "index/manifest.json", denied).to_string();
        assert!(said.contains("403 Forbidden") && said.contains("read access"), "{said}");
        assert!(!said.contains("dataset index"), "{said}");
        let forbidden = object_store::Error::PermissionDenied { path: "d/index".into(), source: source() };
        assert!(unreadable_index("s3://b/d", "index", forbidden).to_string().contains("read access"));
    }

    #[test]
    fn a_dataset_has_one_default_name_however_its_path_was_typed() {
        let here = std::env::current_dir().unwrap();
        let absolute = here.join("data/train").to_string_lossy().into_owned();
        for typed in ["./data/train", "data/train/", "deploy/jobs/../../data/train", absolute.as_str()] {
            assert_eq!(default_name(typed), absolute, "{typed}");
        }
        assert_eq!(default_name("s3://bucket/shards/"), "s3://bucket/shards");
        assert_eq!(default_name(&format!("sha256:{}", "ab".repeat(32))), "");
    }

    #[test]
    fn a_missing_index_says_to_index_it_and_keeps_what_was_not_found() {
        let missing = object_store::Error::NotFound { path: "d/index/manifest.json".into(), source: source() };
        let said = unreadable_index("./d", "index/manifest.json", missing).to_string();
        assert!(said.contains("dpctl dataset index ./d") && said.contains("d/index/manifest.json"), "{said}");
    }
}
