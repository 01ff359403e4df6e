//! docs/metrics.md and the Grafana dashboard held to what the two services serve: after a job
//! on a budgeted dataset, the metric families of both `/metrics` are exactly the names the doc
//! lists (its tables, deprecated names included), every sample line parses as the text format
//! wants it, and every series the dashboard queries is served under a current name.

use std::collections::BTreeSet;
use std::path::Path;

use dpcap_e2e::jobs::{is, spec, submit, tempfile_dir, wait_until, within};
use dpcap_e2e::{Cluster, Process, Services, dpctl_with_env, synth_dataset};
use dpcap_proto::v1::JobState;

/// Metric family names a `# TYPE` line declares.
fn families(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// A sample line as the text format wants it: a name, optional `{k="v",…}`, one value.
fn check_samples(exposition: &str) {
    for line in exposition.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no value: {line}"));
        let parsed = matches!(value, "+Inf" | "-Inf" | "NaN") || value.parse::<f64>().is_ok();
        assert!(parsed, "value {value:?} does not parse: {line}");
        let name = series.split('{').next().unwrap();
        assert!(
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name in {line}"
        );
        if let Some(labels) = series.strip_prefix(name) {
            assert!(labels.is_empty() || (labels.starts_with('{') && labels.ends_with('}')), "bad labels: {line}");
        }
    }
}

/// The `dpcap_*` names in the first cell of docs/metrics.md's table rows.
fn documented(doc: &str) -> BTreeSet<String> {
    doc.lines().filter(|l| l.starts_with("| `dpcap_")).filter_map(|l| l.split('`').nth(1)).map(str::to_owned).collect()
}

/// The base names of every `dpcap_*` series in the dashboard's queries.
fn queried(dashboard: &str) -> BTreeSet<String> {
    let json: serde_json::Value = serde_json::from_str(dashboard).unwrap();
    let mut exprs: Vec<String> = Vec::new();
    for panel in json["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(target["expr"].as_str().unwrap_or_default().to_owned());
        }
    }
    for var in json["templating"]["list"].as_array().unwrap() {
        exprs.push(var["query"].as_str().unwrap_or_default().to_owned());
    }
    let mut names = BTreeSet::new();
    for expr in exprs {
        for (start, _) in expr.match_indices("dpcap_") {
            let name: String = expr[start..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            let base = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(&name);
            names.insert(base.to_owned());
        }
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_md_lists_exactly_what_both_services_serve_and_the_dashboard_queries_only_served_names() {
    let dir = tempfile_dir("metrics-doc");
    let dataset = synth_dataset(&dir, 60);
    let services = Services::with_cluster(&dir, Cluster { accountant_extra: vec![], ..Cluster::default() }).await;
    // The accountant's endpoint from a dpctl config context, not a flag.
    let config = dir.join("dpctl.yaml");
    let env = [("DPCAP_CONFIG".to_owned(), config.to_string_lossy().into_owned())];
    let context = format!("accountant={}", services.accountant.grpc);
    let made = dpctl_with_env(&["config", "set-context", "e2e", &context], &env);
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let budget = ["dataset", "budget", "set", dataset.to_str().unwrap(), "--epsilon", "50", "--delta", "0.01"];
    let set = dpctl_with_env(&budget, &env);
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    let _worker = Process::worker(&services.coordinator.grpc, "w0", &dir);
    let job = submit(&services, dpcap_proto::spec::SpecFile { workers: Some(1), ..spec(&dataset, 2) }).await;
    wait_until(&services, &job.job_id, within(2), is(JobState::Succeeded)).await;

    let (coordinator, accountant) = (services.coordinator.scrape().await, services.accountant.scrape().await);
    check_samples(&coordinator);
    check_samples(&accountant);
    let served: BTreeSet<String> = families(&coordinator).union(&families(&accountant)).cloned().collect();
    let dpcap: BTreeSet<String> = served.iter().filter(|n| n.starts_with("dpcap_")).cloned().collect();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let doc = documented(&std::fs::read_to_string(repo.join("docs/metrics.md")).unwrap());
    let undocumented: Vec<_> = dpcap.difference(&doc).collect();
    // Per-job and set only once a job is audited: the one family with no series before.
    let after_an_audit = ["dpcap_audit_epsilon_lower_bound".to_owned()];
    let unserved: Vec<_> = doc.difference(&dpcap).filter(|n| !after_an_audit.contains(n)).collect();
    assert!(undocumented.is_empty(), "served but not in docs/metrics.md: {undocumented:?}");
    assert!(unserved.is_empty(), "in docs/metrics.md but not served: {unserved:?}");
    let deprecated: BTreeSet<&str> = dpcap_accountant::DEPRECATED_SERIES
        .iter()
        .chain(dpcap_coordinator::DEPRECATED_SERIES.iter())
        .map(|(old, _)| *old)
        .collect();
    let dashboard = queried(&std::fs::read_to_string(repo.join("deploy/grafana/dpcap-privacy.json")).unwrap());
    for name in &dashboard {
        assert!(dpcap.contains(name), "the dashboard queries {name}, which no service serves");
        assert!(!deprecated.contains(name.as_str()), "the dashboard queries the deprecated {name}");
    }
    let name = dataset.to_str().unwrap();
    assert!(accountant.contains(&format!("name=\"{name}\"")), "the dataset's readable name labels its series");
    // The worker shares the accountant's host and socket: its parts and releases went over it.
    let transfers = |call: &str, transport: &str| {
        let series = format!("dpcap_transfers_total{{call=\"{call}\",transport=\"{transport}\"}} ");
        let line = accountant.lines().find(|l| l.starts_with(&series)).unwrap_or_else(|| panic!("no {series}"));
        line[series.len()..].trim().parse::<u64>().unwrap()
    };
    assert!(transfers("part", "local") >= 2 && transfers("release", "local") >= 2, "{accountant}");
    assert_eq!((transfers("part", "grpc"), transfers("release", "grpc")), (0, 0), "{accountant}");
}
