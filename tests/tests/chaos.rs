//! The fault-injection harness: a short campaign in every test run, a long one on demand
//! (`scripts/chaos.sh RUNS`).

use dpcap_e2e::chaos::campaign;
use dpcap_e2e::synth_dataset;
use dpcap_e2e::testdir::TestDir;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_kills_and_restarts_of_every_component_never_break_the_ledgers_invariants() {
    // Kills land at random moments, and a killed accountant costs retries with backoff: this
    // took 55 to 450 s depending on the machine's load, so it gets a longer watchdog.
    let dir = TestDir::with_deadline("chaos-short", std::time::Duration::from_secs(1500));
    let dataset = synth_dataset(&dir, 240);
    let report = campaign(&dir, &dataset, 1, 3, 0x5eed).await;
    assert!(report.kills >= 1, "{report:?}");
    assert!(report.violations.is_empty(), "{report:#?}");
}

/// `scripts/chaos.sh RUNS`: CHAOS_RUNS jobs (default 50), up to 3 kills each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: run with scripts/chaos.sh"]
async fn chaos_campaign() {
    let runs = std::env::var("CHAOS_RUNS").ok().and_then(|r| r.parse().ok()).unwrap_or(50);
    let seed = std::env::var("CHAOS_SEED").ok().and_then(|r| r.parse().ok()).unwrap_or(0x5eed);
    // A long campaign: about a minute a run, watched for a hang at ten minutes a run.
    let dir = TestDir::with_deadline("chaos", std::time::Duration::from_secs(600 * runs.max(1) as u64));
    let dataset = synth_dataset(&dir, 240);
    let report = campaign(&dir, &dataset, runs, 3, seed).await;
    println!(
        "CHAOS: {} runs, {} kills (accountant {}, coordinator {}, worker {}), {} steps discarded, {} violations",
        report.runs,
        report.kills,
        report.kills_by_component[0],
        report.kills_by_component[1],
        report.kills_by_component[2],
        report.discarded,
        report.violations.len()
    );
    for v in &report.violations {
        println!("VIOLATION: {v}");
    }
    assert!(report.violations.is_empty());
}
