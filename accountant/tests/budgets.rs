//! A sweep on one budgeted dataset, on a real `dpcap-accountant` process: admissions decided by
//! the RDP bound, steps by their job's reserved plan, and the standing after a restart the same
//! as before it (composed from every replayed charge).

mod common;

use common::{AccountantProcess, contract, job};
use dpcap_proto::ErrorCode;
use dpcap_proto::v1::{CloseJobRequest, DatasetBudget, GetDatasetBudgetRequest, SetDatasetBudgetRequest};

fn part(seed: u32, dim: usize) -> Vec<f32> {
    (0..dim).map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 2000.0 - 0.25).collect()
}

/// The `dpcap_dataset_budget_checks_total` sample of `decided_by` in a scrape.
fn checks(metrics: &str, decided_by: &str) -> u64 {
    let line = metrics
        .lines()
        .find(|l| {
            l.starts_with("dpcap_dataset_budget_checks_total{") && l.contains(&format!("decided_by=\"{decided_by}\""))
        })
        .unwrap_or_else(|| panic!("no {decided_by} checks in\n{metrics}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// Bytes of releases held in memory, from a scrape.
fn held_releases(metrics: &str) -> u64 {
    let line = metrics.lines().find(|l| l.starts_with("dpcap_accountant_held_bytes{kind=\"releases\"}")).expect("held");
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_is_admitted_by_the_bound_its_steps_by_their_reservation_and_a_restart_shows_the_same_standing() {
    let dir = tempfile::tempdir().unwrap();
    let server = AccountantProcess::start_strict(dir.path(), &[]).await;
    let mut client = server.client().await;
    let dataset = format!("sha256:{}", "5e".repeat(32));
    let set = |epsilon: f64| SetDatasetBudgetRequest {
        dataset_id: dataset.clone(),
        epsilon,
        delta: 1e-5,
        reason: "a sweep".into(),
        name: "sweep".into(),
        population: 100_000,
        force: true,
        ..Default::default()
    };
    client.raw().set_dataset_budget(set(20.0)).await.unwrap();
    // Thirty jobs of one setting, five steps planned each: one mechanism, one segment.
    for i in 0..30 {
        let mut r = job(&format!("sweep-{i}"), 0.05, 2.0, 1.0, 100.0, 4, 1, None);
        (contract(&mut r).dataset_id, contract(&mut r).planned_steps) = (dataset.clone(), 5);
        client.raw().register_job(r).await.unwrap_or_else(|e| panic!("job {i} admitted: {e}"));
    }
    for i in 0..3 {
        for step in 0..2 {
            let r = client.submit_part(&format!("sweep-{i}"), step, 0, &part(i, 4)).await.unwrap();
            assert!(r.released, "{r:?}");
        }
    }
    let metrics = server.scrape().await;
    assert_eq!(checks(&metrics, "bound"), 30, "every admission by the bound");
    assert_eq!(checks(&metrics, "reservation"), 6, "every step within its plan by the reservation");
    assert_eq!(checks(&metrics, "composition"), 0, "nothing near the boundary");
    // Running jobs keep their last releases in memory for late fetches; closed ones keep none.
    assert!(held_releases(&metrics) > 0, "{metrics}");
    for i in 0..3 {
        let close = CloseJobRequest { job_id: format!("sweep-{i}"), reason: "succeeded".into(), ..Default::default() };
        client.raw().close_job(close).await.unwrap();
    }
    assert_eq!(held_releases(&server.scrape().await), 0, "closed jobs hold no release");
    let closed = client.fetch_release("sweep-0", 1).await.unwrap_err();
    assert_eq!(closed.code, Some(ErrorCode::JobClosed), "{closed}");
    assert_eq!(held_releases(&server.scrape().await), 0, "a late fetch of a closed job reads nothing back");

    let show = |mut client: common::Client| {
        let dataset = dataset.clone();
        async move {
            let get = GetDatasetBudgetRequest { dataset_id: dataset, ..Default::default() };
            client.raw().get_dataset_budget(get).await.unwrap().into_inner()
        }
    };
    let standing = |b: &DatasetBudget| (b.epsilon_spent, b.epsilon_reserved, b.epsilon_free);
    let before = show(client.clone()).await;
    assert!(before.epsilon_spent > 0.0 && before.epsilon_reserved > before.epsilon_spent, "{before:?}");
    server.kill();

    let server = AccountantProcess::start_strict(dir.path(), &[]).await;
    let mut client = server.client().await;
    let after = show(client.clone()).await;
    assert_eq!(standing(&after), standing(&before), "the same history, the same standing");
    let metrics = server.scrape().await;
    let spent = format!(
        "dpcap_dataset_epsilon_spent{{dataset=\"{dataset}\",name=\"sweep\",unit=\"example\"}} {}",
        after.epsilon_spent
    );
    assert!(metrics.contains(&spent), "{spent} in\n{metrics}");
    // The replay found every open plan within the budget: steps within them are reserved again.
    client.submit_part("sweep-3", 0, 0, &part(3, 4)).await.unwrap();
    assert_eq!(checks(&server.scrape().await, "reservation"), 1);
    // A budget lowered (still above what is spent) no longer vouches for the plans: each step
    // is checked against it again.
    client.raw().set_dataset_budget(set(before.epsilon_spent + 1.0)).await.unwrap();
    client.submit_part("sweep-3", 1, 0, &part(3, 4)).await.unwrap();
    let metrics = server.scrape().await;
    assert_eq!(checks(&metrics, "reservation"), 1);
    // The replay's own check of everything reserved, and this step's.
    assert_eq!(checks(&metrics, "bound") + checks(&metrics, "composition"), 2, "{metrics}");
}
