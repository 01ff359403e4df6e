//! The accountant service end to end: real `dpcap-accountant` processes on 127.0.0.1
//! ephemeral ports over a real local-directory ledger.

mod common;

use common::{AccountantProcess, charged_steps, contract, job, key};
use dpcap_accountant::privacy::{AccountantKind, EpsilonCurve, max_steps, noise_multiplier};
use dpcap_proto::ErrorCode;
use dpcap_proto::client::ClientError;
use dpcap_proto::floats::to_bytes;
use dpcap_proto::v1::{
    AuditCoordinates, CloseJobRequest, GetDatasetBudgetRequest, GetSpendRequest, GradientChunk, Mechanism, Privacy,
    RegisterJobRequest, SetDatasetBudgetRequest, TrimReleasesRequest,
};
use tonic::Code;

fn part(seed: u32, dim: usize) -> Vec<f32> {
    (0..dim).map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 1000.0 - 0.5).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicate_parts_and_fetches_charge_once_and_return_identical_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let server = AccountantProcess::start(dir.path(), &["--allow-seeded-noise"]).await;
    let mut client = server.client().await;
    let dim = 5000;
    client.raw().register_job(job("dup", 0.01, 1.0, 1.0, 10.0, dim as u64, 2, None)).await.unwrap();
    let (a, b) = (part(1, dim), part(2, dim));
    let mut tasks = Vec::new();
    for (p, values) in [(0u32, &a), (1, &b), (0, &a), (1, &b), (1, &b)] {
        let (mut c, values) = (client.clone(), values.clone());
        tasks.push(tokio::spawn(async move { c.submit_part("dup", 0, p, &values).await }));
    }
    let mut fetches = Vec::new();
    for _ in 0..3 {
        let mut c = client.clone();
        fetches.push(tokio::spawn(async move { c.fetch_release("dup", 0).await }));
    }
    // Concurrent streams of one part: one is taken at a time (the newer cuts the older off,
    // ABORTED, so that a stalled stream cannot hold a part's memory); whichever ends, each part
    // counts once.
    let mut submitted = Vec::new();
    for result in futures::future::join_all(tasks).await.into_iter().map(|r| r.unwrap()) {
        match result {
            Ok(response) => submitted.push(response),
            Err(s) => assert_eq!(s.code, Some(ErrorCode::Aborted), "only a superseded stream: {s:?}"),
        }
    }
    assert_eq!(submitted.iter().filter(|r| r.accepted_new).count(), 2, "each part counted once: {submitted:?}");
    assert!(submitted.iter().any(|r| r.released));
    let releases: Vec<Vec<f32>> =
        futures::future::join_all(fetches).await.into_iter().map(|r| r.unwrap().unwrap().0).collect();
    assert_eq!(releases[0].len(), dim);
    assert!(releases.iter().all(|r| r == &releases[0]), "every fetch returns identical bytes");
    let again = client.fetch_release("dup", 0).await.unwrap().0;
    assert_eq!(again, releases[0], "a later fetch never draws fresh noise");
    // In small chunks: contiguous offsets, only the final chunk marked last, the same bytes.
    let mut stream = client.fetch_stream("dup", 0, 1234).await.unwrap();
    let (mut chunked, mut lasts) = (Vec::new(), Vec::new());
    while let Some(chunk) = stream.message().await.unwrap() {
        assert_eq!(chunk.offset, chunked.len() as u64);
        chunked.extend(dpcap_proto::floats::to_vec(&chunk.data).unwrap());
        lasts.push(chunk.last);
    }
    assert_eq!(lasts, [false, false, false, false, true], "5000 values in chunks of 1234");
    assert_eq!(chunked, releases[0]);
    assert_eq!(charged_steps(dir.path(), "dup"), vec![0]);
    let spend = client.raw().get_spend(GetSpendRequest { job_id: "dup".into() }).await.unwrap().into_inner();
    assert_eq!((spend.steps_charged, spend.next_step), (1, 1));
    // A retried identical part of the released step is idempotent; other bytes are refused.
    let retry = client.submit_part("dup", 0, 0, &a).await.unwrap();
    assert!(retry.released && !retry.accepted_new, "{retry:?}");
    let late = client.submit_part("dup", 0, 0, &b).await.unwrap_err();
    assert_eq!(late.status, Code::FailedPrecondition, "{late}");
    client.submit_part("dup", 1, 0, &a).await.unwrap();
    let conflict = client.submit_part("dup", 1, 0, &b).await.unwrap_err();
    assert_eq!(conflict.status, Code::Aborted, "{conflict}");
}

/// A release of several noise blocks (and several parts of its stored upload) streams to a
/// fetch that started before the part arrived, in chunks that straddle the blocks, and reads
/// back byte for byte from the ledger after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_several_blocks_streams_while_stored_and_reads_back_identical_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = AccountantProcess::start(dir.path(), &["--allow-seeded-noise"]).await;
    let mut client = server.client().await;
    // 4.5 noise blocks of 2^20 values: 18 MB, two parts of the stored upload.
    let dim = (9 << 20) / 2;
    client.raw().register_job(job("blocks", 0.01, 1.0, 1.0, 10.0, dim as u64, 1, Some(11))).await.unwrap();
    let mut fetcher = client.clone();
    let early = tokio::spawn(async move {
        let mut stream = fetcher.fetch_stream("blocks", 0, 300_000).await?;
        let (mut values, mut lasts) = (Vec::new(), 0);
        while let Some(chunk) = stream.message().await? {
            assert_eq!(chunk.offset, values.len() as u64, "contiguous offsets across blocks");
            values.extend(dpcap_proto::floats::to_vec(&chunk.data).unwrap());
            lasts += u32::from(chunk.last);
        }
        Ok::<_, tonic::Status>((values, lasts))
    });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let sum: Vec<f32> = (0..dim).map(|i| (i % 7) as f32).collect();
    assert!(client.submit_part("blocks", 0, 0, &sum).await.unwrap().released);
    let (streamed, lasts) = early.await.unwrap().unwrap();
    assert_eq!((streamed.len(), lasts), (dim, 1), "every value once, one last chunk");
    let noise: Vec<f64> = streamed.iter().zip(&sum).map(|(r, s)| f64::from(r - s)).collect();
    let std = (noise.iter().map(|n| n * n).sum::<f64>() / dim as f64).sqrt();
    assert!((std - 1.0).abs() < 0.01, "noise std {std} on every block, sigma*C = 1");
    let stored = dir.path().join("jobs/blocks/releases").join(format!("{:020}.f32", 0));
    assert_eq!(std::fs::metadata(&stored).unwrap().len(), 4 * dim as u64);
    server.kill();
    let server = AccountantProcess::start(dir.path(), &["--allow-seeded-noise"]).await;
    let mut client = server.client().await;
    assert!(client.fetch_release("blocks", 0).await.unwrap().0 == streamed, "the same bytes from the store");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_serves_stored_releases_again_and_discards_a_charge_whose_release_was_never_stored() {
    let dir = tempfile::tempdir().unwrap();
    let server = AccountantProcess::start(dir.path(), &["--allow-seeded-noise"]).await;
    let mut client = server.client().await;
    let dim = 100;
    client.raw().register_job(job("crash", 0.01, 1.0, 1.0, 10.0, dim as u64, 2, Some(5))).await.unwrap();
    let mut released = Vec::new();
    for step in 0..3u64 {
        client.submit_part("crash", step, 0, &part(0, dim)).await.unwrap();
        let r = client.submit_part("crash", step, 1, &part(1, dim)).await.unwrap();
        assert!(r.released);
        released.push(client.fetch_release("crash", step).await.unwrap().0);
    }
    // Crash; and make step 2 look like a crash between its durable charge and its stored
    // release (the only window in which a release can be lost).
    server.kill();
    let release_2 = dir.path().join("jobs/crash/releases").join(format!("{:020}.f32", 2));
    std::fs::remove_file(&release_2).expect("step 2's release was stored before it left");
    let server = AccountantProcess::start(dir.path(), &["--allow-seeded-noise"]).await;
    let mut client = server.client().await;
    let spend = client.raw().get_spend(GetSpendRequest { job_id: "crash".into() }).await.unwrap().into_inner();
    assert_eq!((spend.steps_charged, spend.steps_discarded, spend.next_step), (3, 1, 3), "{spend:?}");
    for step in 0..2u64 {
        let again = client.fetch_release("crash", step).await.unwrap().0;
        assert_eq!(again, released[step as usize], "step {step}: the same bytes after a restart, never fresh noise");
    }
    let lost = client.fetch_release("crash", 2).await.unwrap_err();
    assert_eq!(lost.code, Some(ErrorCode::ReleaseDiscarded), "{lost}");
    assert!(dir.path().join("jobs/crash/discarded").join(format!("{:020}", 2)).exists(), "recorded in the ledger");
    let reuse = client.submit_part("crash", 2, 0, &part(0, dim)).await.unwrap_err();
    assert_eq!(reuse.code, Some(ErrorCode::StepAlreadyCharged), "step numbers are never reused: {reuse}");
    client.submit_part("crash", 3, 0, &part(0, dim)).await.unwrap();
    client.submit_part("crash", 3, 1, &part(1, dim)).await.unwrap();
    client.fetch_release("crash", 3).await.unwrap();
    assert_eq!(charged_steps(dir.path(), "crash"), vec![0, 1, 2, 3]);
    let metrics = server.scrape().await;
    assert!(metrics.contains("dpcap_steps_charged_total{job_id=\"crash\",privacy=\"dp\"} 4"), "{metrics}");
    assert!(metrics.contains("dpcap_steps_discarded_total{job_id=\"crash\",privacy=\"dp\"} 1"), "{metrics}");

    // A checkpoint covering steps < 2 lets their stored releases go; step 3 stays fetchable.
    client.raw().trim_releases(TrimReleasesRequest { job_id: "crash".into(), before_step: 2 }).await.unwrap();
    let trimmed = client.fetch_release("crash", 0).await.unwrap_err();
    assert_eq!(trimmed.code, Some(ErrorCode::ReleaseTrimmed), "{trimmed}");
    assert!(!dir.path().join("jobs/crash/releases").join(format!("{:020}.f32", 0)).exists());
    server.kill();
    let server = AccountantProcess::start(dir.path(), &["--allow-seeded-noise"]).await;
    let mut client = server.client().await;
    let spend = client.raw().get_spend(GetSpendRequest { job_id: "crash".into() }).await.unwrap().into_inner();
    assert_eq!((spend.steps_charged, spend.steps_discarded), (4, 1), "trimmed steps are not discarded: {spend:?}");
    assert_eq!(client.fetch_release("crash", 3).await.unwrap().0.len(), dim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_calibrated_for_epsilon_one_is_refused_exactly_at_the_first_step_past_it() {
    let (q, steps, target, delta) = (0.05, 30u64, 1.0, 1e-5);
    let sigma = noise_multiplier(AccountantKind::Pld, q, steps, target, delta).unwrap();
    let limit = max_steps(&EpsilonCurve::new(AccountantKind::Pld, q, sigma, delta).unwrap(), target).unwrap();
    assert!(limit >= steps, "calibration must allow the planned {steps} steps, allows {limit}");
    let dir = tempfile::tempdir().unwrap();
    let server = AccountantProcess::start(dir.path(), &[]).await;
    let mut client = server.client().await;
    client.raw().register_job(job("budget", q, sigma, 1.0, target, 8, 1, None)).await.unwrap();
    for step in 0..limit {
        let r = client
            .submit_part("budget", step, 0, &part(step as u32, 8))
            .await
            .unwrap_or_else(|e| panic!("step {step}: {e}"));
        assert!(r.released);
    }
    let refused = client.submit_part("budget", limit, 0, &part(0, 8)).await.unwrap_err();
    assert_eq!(refused.status, Code::FailedPrecondition);
    let msg = refused.message;
    assert!(
        msg.contains("budget exhausted") && msg.contains(&format!("step {limit}")) && msg.contains("target 1"),
        "{msg}"
    );
    let spend = client.raw().get_spend(GetSpendRequest { job_id: "budget".into() }).await.unwrap().into_inner();
    assert!(spend.epsilon_spent <= target, "{spend:?}");
    assert!(spend.exhausted_by.contains("> job target 1"), "GetSpend names the budget: {spend:?}");
    let fetched = client.fetch_release("budget", limit).await.unwrap_err();
    assert!(
        fetched.message.contains("> job target 1"),
        "a rank fetching the refused step learns which budget: {fetched}"
    );
    assert_eq!(spend.steps_charged, limit);
    assert_eq!(charged_steps(dir.path(), "budget").len() as u64, limit, "the refused step was never charged");
    assert!(server.scrape().await.contains("dpcap_budget_rejections_total{reason=\"job_target\"} 1"));
}

/// Released minus submitted sum over 2^20 coordinates: mean 0 and std σ·C within 1 %, with
/// W = 1 and W = 3 (noise is added once to the sum, not once per part).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noise_has_std_sigma_c_and_is_added_once_whatever_w() {
    let dir = tempfile::tempdir().unwrap();
    let server = AccountantProcess::start(dir.path(), &["--allow-seeded-noise"]).await;
    let mut client = server.client().await;
    let (dim, sigma, clip) = (1usize << 20, 0.8, 2.5);
    for parts in [1u32, 3] {
        let id = format!("noise-w{parts}");
        client.raw().register_job(job(&id, 0.01, sigma, clip, 50.0, dim as u64, parts, Some(11))).await.unwrap();
        let mut sum = vec![0.0f64; dim];
        for p in 0..parts {
            let values = part(p, dim);
            sum.iter_mut().zip(&values).for_each(|(s, v)| *s += f64::from(*v));
            client.submit_part(&id, 0, p, &values).await.unwrap();
        }
        let (released, spend) = client.fetch_release(&id, 0).await.unwrap();
        assert!(spend.unwrap().seeded_noise);
        let noise: Vec<f64> = released.iter().zip(&sum).map(|(r, s)| f64::from(*r) - s).collect();
        let n = noise.len() as f64;
        let mean = noise.iter().sum::<f64>() / n;
        let std = (noise.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
        let want = sigma * clip;
        assert!(mean.abs() < 5.0 * want / n.sqrt(), "W={parts}: mean {mean}");
        assert!((std / want - 1.0).abs() < 0.01, "W={parts}: std {std}, want {want}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_a_clear_status_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = AccountantProcess::start(dir.path(), &[]).await;
    let mut client = server.client().await;
    let dim = 10;
    client.raw().register_job(job("bad", 0.01, 1.0, 1.0, 10.0, dim as u64, 2, None)).await.unwrap();
    client.raw().register_job(job("other", 0.01, 1.0, 1.0, 10.0, dim as u64, 1, None)).await.unwrap();
    client.submit_part("bad", 0, 0, &part(0, dim)).await.unwrap();

    fn expect<T: std::fmt::Debug, E: Into<ClientError>>(r: Result<T, E>, code: Code, words: &[&str]) {
        let e: ClientError = r.map_err(Into::into).expect_err("refused");
        assert_eq!(e.status, code, "{e}");
        for w in words {
            assert!(e.message.contains(w), "{:?} lacks {w:?}", e.message);
        }
    }
    expect(
        client.submit_part("bad", 0, 1, &part(1, dim + 1)).await,
        Code::InvalidArgument,
        &["data", "gradient_dim 10"],
    );
    expect(client.submit_part("bad", 0, 1, &part(1, dim - 1)).await, Code::InvalidArgument, &["data", "9 values"]);
    let mut nan = part(1, dim);
    nan[3] = f32::NAN;
    expect(client.submit_part("bad", 0, 1, &nan).await, Code::InvalidArgument, &["not finite", "index 3"]);
    let gap = vec![
        GradientChunk {
            job_id: "bad".into(),
            step: 0,
            part: 1,
            offset: 0,
            data: to_bytes(&part(1, 4)),
            attempt: 0,
            ..Default::default()
        },
        GradientChunk {
            job_id: "bad".into(),
            step: 0,
            part: 1,
            offset: 5,
            data: to_bytes(&part(1, 6)),
            attempt: 0,
            ..Default::default()
        },
    ];
    expect(
        client.raw_for("bad", 1).submit_part(futures::stream::iter(gap)).await,
        Code::InvalidArgument,
        &["offset 5", "expected 4"],
    );
    let ragged = GradientChunk {
        job_id: "bad".into(),
        step: 0,
        part: 1,
        offset: 0,
        data: vec![0u8; 7].into(),
        attempt: 0,
        ..Default::default()
    };
    expect(
        client.raw_for("bad", 1).submit_part(futures::stream::iter([ragged])).await,
        Code::InvalidArgument,
        &["data", "7 bytes"],
    );
    expect(client.submit_part("bad", 0, 2, &part(1, dim)).await, Code::InvalidArgument, &["part 2", "2 parts"]);
    expect(client.submit_part("ghost", 0, 0, &part(1, dim)).await, Code::NotFound, &["ghost"]);
    expect(client.submit_part("bad", 5, 1, &part(1, dim)).await, Code::FailedPrecondition, &["expects step 0"]);
    expect(
        client.raw().register_job(job("bad", 0.02, 1.0, 1.0, 10.0, dim as u64, 2, None)).await,
        Code::AlreadyExists,
        &["bad"],
    );
    expect(
        client.raw().register_job(job("x", 1.5, 1.0, 1.0, 10.0, 1, 1, None)).await,
        Code::InvalidArgument,
        &["sample_rate", "1.5"],
    );
    expect(
        client.raw().register_job(job("x", 0.1, 1.0, 1.0, 10.0, 1, 1, Some(1))).await,
        Code::InvalidArgument,
        &["insecure_noise_seed"],
    );
    expect(
        client.raw().register_job(job("bad job", 0.1, 1.0, 1.0, 10.0, 1, 1, None)).await,
        Code::InvalidArgument,
        &["job_id"],
    );

    // Nothing was lost: the good part 0 is still pending, the proper part 1 releases the step,
    // and the other job was never disturbed.
    let r = client.submit_part("bad", 0, 1, &part(1, dim)).await.unwrap();
    assert!(r.released && r.parts_received == 2, "{r:?}");
    assert!(client.submit_part("other", 0, 0, &part(7, dim)).await.unwrap().released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_expose_per_job_spend_until_the_job_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let server = AccountantProcess::start(dir.path(), &[]).await;
    let mut client = server.client().await;
    client.raw().register_job(job("m1", 0.02, 1.1, 1.0, 8.0, 4, 1, None)).await.unwrap();
    client.submit_part("m1", 0, 0, &part(0, 4)).await.unwrap();
    let text = server.scrape().await;
    for series in [
        "dpcap_privacy_epsilon_spent{job_id=\"m1\",privacy=\"dp\"}",
        "dpcap_privacy_epsilon_target{job_id=\"m1\",privacy=\"dp\"} 8",
        "dpcap_privacy_delta{job_id=\"m1\",privacy=\"dp\"} 0.00001",
        "dpcap_privacy_noise_multiplier{job_id=\"m1\",privacy=\"dp\"} 1.1",
        "dpcap_privacy_sample_rate{job_id=\"m1\",privacy=\"dp\"} 0.02",
        "dpcap_noise_multiplier{job_id=\"m1\",privacy=\"dp\"} 1.1",
        "dpcap_sampling_rate{job_id=\"m1\",privacy=\"dp\"} 0.02",
        "dpcap_steps_charged_total{job_id=\"m1\",privacy=\"dp\"} 1",
        "dpcap_steps_discarded_total{job_id=\"m1\",privacy=\"dp\"} 0",
        "dpcap_release_duration_seconds_bucket",
        "dpcap_build_info{",
    ] {
        assert!(text.contains(series), "missing {series} in\n{text}");
    }
    let closed = client
        .raw()
        .close_job(CloseJobRequest { job_id: "m1".into(), reason: "succeeded".into(), ..Default::default() })
        .await
        .unwrap();
    assert_eq!(closed.into_inner().steps_charged, 1);
    assert!(!server.scrape().await.contains("job_id=\"m1\""), "per-job series removed on close");
    let refused = client.submit_part("m1", 1, 0, &part(0, 4)).await.unwrap_err();
    assert_eq!(refused.status, Code::FailedPrecondition);
}

/// Two accountant processes on one ledger: the conditional create lets only one charge a step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_accountants_sharing_a_ledger_never_charge_a_step_twice() {
    let dir = tempfile::tempdir().unwrap();
    let first = AccountantProcess::start(dir.path(), &[]).await;
    let second = AccountantProcess::start(dir.path(), &[]).await;
    let (mut a, mut b) = (first.client().await, second.client().await);
    let registration = job("shared", 0.01, 1.0, 1.0, 10.0, 16, 1, None);
    a.raw().register_job(registration.clone()).await.unwrap();
    let again = b.raw().register_job(registration).await.unwrap().into_inner();
    assert!(!again.created, "the second registration finds the first in the ledger");
    let values = part(0, 16);
    let (ra, rb) = tokio::join!(a.submit_part("shared", 0, 0, &values), b.submit_part("shared", 0, 0, &values));
    let outcomes =
        [ra.as_ref().map(|r| r.released).map_err(|e| e.code), rb.as_ref().map(|r| r.released).map_err(|e| e.code)];
    assert_eq!(outcomes.iter().filter(|o| **o == Ok(true)).count(), 1, "{outcomes:?}");
    // The loser's step is spent elsewhere: for it, a discarded step it must never release.
    let lost = Err(Some(ErrorCode::ReleaseDiscarded));
    assert_eq!(outcomes.iter().filter(|o| **o == lost).count(), 1, "{outcomes:?}");
    assert_eq!(charged_steps(dir.path(), "shared"), vec![0]);
}

/// SIGTERM: health turns NOT_SERVING, the server drains in-flight calls and exits cleanly; the
/// ledger written so far is intact for the next start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_and_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let server = AccountantProcess::start(dir.path(), &[]).await;
    let mut client = server.client().await;
    client.raw().register_job(job("drain", 0.01, 1.0, 1.0, 10.0, 4, 2, None)).await.unwrap();
    client.submit_part("drain", 0, 0, &part(0, 4)).await.unwrap();
    // A fetch waiting for a release that will never come does not hold the shutdown forever.
    let mut waiting = client.clone();
    let fetch = tokio::spawn(async move { waiting.fetch_release("drain", 0).await });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let status =
        tokio::task::spawn_blocking(move || server.terminate(std::time::Duration::from_secs(20))).await.unwrap();
    assert!(status.expect("exited after SIGTERM").success(), "{status:?}");
    assert!(fetch.await.unwrap().is_err(), "the waiting fetch ends with an error, not a release");
    let again = AccountantProcess::start(dir.path(), &[]).await;
    let spend =
        again.client().await.raw().get_spend(GetSpendRequest { job_id: "drain".into() }).await.unwrap().into_inner();
    assert_eq!((spend.steps_charged, spend.next_step), (0, 0));
}

/// The charge is durable before any byte of the release exists: when the ledger cannot write
/// the charge, nothing is released and nothing is charged; the parts stay pending, and a retry
/// once the store recovers releases the step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_release_without_a_durable_charge_and_nothing_lost_on_storage_failure() {
    let dir = tempfile::tempdir().unwrap();
    let server = AccountantProcess::start(dir.path(), &[]).await;
    let mut client = server.client().await;
    client.raw().register_job(job("store", 0.01, 1.0, 1.0, 10.0, 6, 2, None)).await.unwrap();
    client.submit_part("store", 0, 0, &part(0, 6)).await.unwrap();
    // Break the store: a plain file where the charges directory must go.
    let blocker = dir.path().join("jobs/store/charges");
    std::fs::write(&blocker, b"not a directory").unwrap();
    let failed = client.submit_part("store", 0, 1, &part(1, 6)).await.unwrap_err();
    assert_eq!(failed.status, Code::Internal, "{failed}");
    let spend = client.raw().get_spend(GetSpendRequest { job_id: "store".into() }).await.unwrap().into_inner();
    assert_eq!((spend.steps_charged, spend.next_step), (0, 0), "{spend:?}");
    let mut fetcher = client.clone();
    let fetch = tokio::time::timeout(std::time::Duration::from_millis(500), fetcher.fetch_release("store", 0)).await;
    assert!(fetch.is_err(), "no release may exist without its charge: {fetch:?}");
    // The store recovers; the retried last part (identical bytes) releases the step.
    std::fs::remove_file(&blocker).unwrap();
    let r = client.submit_part("store", 0, 1, &part(1, 6)).await.unwrap();
    assert!(r.released && r.parts_received == 2, "{r:?}");
    assert_eq!(client.fetch_release("store", 0).await.unwrap().0.len(), 6);
    assert_eq!(charged_steps(dir.path(), "store"), vec![0]);
}

/// A dataset's lifetime budget composes every job registered on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_privacy_admins_dataset_budget_is_spent_by_jobs_it_never_lets_them_raise() {
    let dir = tempfile::tempdir().unwrap();
    let server = AccountantProcess::start_strict(dir.path(), &[]).await;
    let mut client = server.client().await;
    let dataset = format!("sha256:{}", "5e".repeat(32));
    let on_dataset = |id: &str, steps: u64| {
        let mut r = job(id, 0.05, 2.0, 1.0, 100.0, 4, 1, None);
        (contract(&mut r).dataset_id, contract(&mut r).planned_steps) = (dataset.clone(), steps);
        r
    };
    // Without a budget, the safe default refuses the job; a job can never bring its own.
    let unbudgeted = client.raw().register_job(on_dataset("early", 10)).await.unwrap_err();
    assert_eq!(unbudgeted.code(), Code::FailedPrecondition, "{unbudgeted}");
    assert!(unbudgeted.message().contains("privacy admin"), "{unbudgeted}");
    let by_url = client
        .raw()
        .set_dataset_budget(SetDatasetBudgetRequest {
            dataset_id: "s3://laion".into(),
            epsilon: 1.0,
            delta: 1e-5,
            reason: String::new(),
            allow_not_private: false,
            population: 100_000,
            force: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(by_url.message().starts_with("invalid dataset_id:"), "a URL is no identity: {by_url}");

    let set = |epsilon: f64, reason: &str| SetDatasetBudgetRequest {
        dataset_id: dataset.clone(),
        epsilon,
        delta: 1e-5,
        reason: reason.into(),
        allow_not_private: false,
        population: 100_000,
        force: true,
        ..Default::default()
    };
    let named = SetDatasetBudgetRequest { name: "laion-233m".into(), ..set(2.0, "owner's lifetime budget") };
    let budget = client.raw().set_dataset_budget(named).await.unwrap().into_inner();
    assert_eq!((budget.epsilon_budget, budget.version, budget.name.as_str()), (2.0, 1, "laion-233m"));
    // Two plans that together fit the budget are admitted; a third is not, though nothing is
    // spent yet: the budget is reserved at admission, never promised twice.
    let at_two = max_steps(&EpsilonCurve::new(AccountantKind::Pld, 0.05, 2.0, 1e-5).unwrap(), 2.0).unwrap();
    client.raw().register_job(on_dataset("first", at_two / 2)).await.unwrap();
    client.raw().register_job(on_dataset("second", at_two / 2)).await.unwrap();
    let promised = client.raw().register_job(on_dataset("third", 2)).await.unwrap_err();
    // A full budget, not a bad spec: FAILED_PRECONDITION, typed BUDGET_EXHAUSTED, named first.
    assert_eq!(promised.code(), Code::FailedPrecondition, "{promised}");
    assert_eq!(ErrorCode::of(&promised), Some(ErrorCode::BudgetExhausted), "{promised}");
    assert!(promised.message().contains(&format!("dataset laion-233m ({dataset}, example-level)")), "{promised}");
    assert!(promised.message().contains("reserved by other jobs' plans"), "{promised}");
    let get = GetDatasetBudgetRequest { dataset_id: dataset.clone(), ..Default::default() };
    let standing = client.raw().get_dataset_budget(get.clone()).await.unwrap().into_inner();
    assert_eq!(standing.epsilon_spent, 0.0, "nothing spent yet");
    assert!(standing.epsilon_reserved > 1.8 && standing.epsilon_reserved <= 2.0, "two plans reserve it: {standing:?}");
    assert!((standing.epsilon_free - (2.0 - standing.epsilon_reserved)).abs() < 1e-9, "{standing:?}");
    let metrics = server.scrape().await;
    let labels = format!("{{dataset=\"{dataset}\",name=\"laion-233m\",unit=\"example\"}}");
    let reserved = format!("dpcap_dataset_epsilon_reserved{labels} {}", standing.epsilon_reserved);
    assert!(metrics.contains(&reserved), "{reserved} in\n{metrics}");
    assert!(metrics.contains(&format!("dpcap_dataset_epsilon_free{labels} {}", standing.epsilon_free)), "{metrics}");
    // A delta above 1/N, or no N, is refused naming it; so is lowering the budget under the
    // open jobs' plans without force, naming each job it would end early.
    let loose = client.raw().set_dataset_budget(SetDatasetBudgetRequest { delta: 0.5, ..set(2.0, "typo") }).await;
    let loose = loose.unwrap_err();
    assert!(loose.message().starts_with("invalid delta: 5e-1 is above 1/N = 1e-5 for N = 100000 examples"), "{loose}");
    let unstated = client.raw().set_dataset_budget(SetDatasetBudgetRequest { population: 0, ..set(2.0, "") }).await;
    assert!(unstated.unwrap_err().message().starts_with("invalid population: 0 must be"));
    let unforced = SetDatasetBudgetRequest { force: false, ..set(1.0, "lowered") };
    let unforced = client.raw().set_dataset_budget(unforced).await.unwrap_err();
    assert_eq!(unforced.code(), Code::FailedPrecondition, "{unforced}");
    assert!(unforced.message().contains("2 may end BUDGET_EXHAUSTED"), "{unforced}");
    assert!(unforced.message().contains("first (0 of") && unforced.message().contains("second (0 of"), "{unforced}");
    let redelta = SetDatasetBudgetRequest { delta: 1e-6, force: false, ..set(2.0, "") };
    let redelta = client.raw().set_dataset_budget(redelta).await.unwrap_err();
    assert!(redelta.message().contains("changes what every charge reads as"), "{redelta}");
    // The owner lowers the budget to 1 (forced): the per-step check holds the running jobs to it.
    let budget = client.raw().set_dataset_budget(set(1.0, "owner's lifetime budget")).await.unwrap().into_inner();
    assert_eq!((budget.epsilon_budget, budget.version), (1.0, 2));
    // ...and its answer says what the forced change does, in the words the refusal used.
    assert_eq!(budget.consequences.len(), 1, "{budget:?}");
    assert!(budget.consequences[0].contains("2 may end BUDGET_EXHAUSTED before their plans: first"), "{budget:?}");
    assert!(unforced.message().ends_with("pass force (dpctl: --force) to change it anyway"), "{unforced}");
    // Alternate the two jobs until the dataset budget refuses one of them.
    let (mut steps, mut refused) = ([0u64; 2], None);
    'outer: for _ in 0..500 {
        for (i, id) in ["first", "second"].iter().enumerate() {
            match client.submit_part(id, steps[i], 0, &part(i as u32, 4)).await {
                Ok(r) => {
                    assert!(r.released);
                    steps[i] += 1;
                }
                Err(e) => {
                    refused = Some(e);
                    break 'outer;
                }
            }
        }
    }
    let refused = refused.expect("the dataset budget must run out long before the job targets");
    assert_eq!(refused.code, Some(ErrorCode::BudgetExhausted), "{refused}");
    let named = format!("dataset laion-233m ({dataset}, example-level) target 1");
    assert!(refused.message.contains(&named), "the budget by its name, then its digest: {refused}");
    let one_job = max_steps(&EpsilonCurve::new(AccountantKind::Pld, 0.05, 2.0, 1e-5).unwrap(), 1.0).unwrap();
    assert!(steps[0] + steps[1] <= one_job + 1, "jobs together ran {steps:?}, one job alone may run {one_job}");
    assert!(steps[0] + steps[1] >= one_job - 1, "jobs together ran {steps:?}, one job alone may run {one_job}");
    // A third job on the spent dataset is refused at admission.
    let third = client.raw().register_job(on_dataset("third", 1)).await.unwrap_err();
    assert!(third.message().contains("free"), "{third}");
    let shown = client
        .raw()
        .get_dataset_budget(GetDatasetBudgetRequest { dataset_id: dataset.clone(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert!(shown.epsilon_spent <= 1.0 && shown.epsilon_spent > 0.9, "{shown:?}");
    assert_eq!(shown.jobs, vec!["first", "second"]);
    let metrics = server.scrape().await;
    assert!(metrics.contains("dpcap_budget_rejections_total{reason=\"dataset_budget\"} 1"), "{metrics}");
    assert!(metrics.contains("dpcap_budget_rejections_total{reason=\"dataset_admission\"} 2"), "{metrics}");
    assert!(metrics.contains("dpcap_budget_rejections_total{reason=\"job_target\"} 0"), "at 0 from the start");
    assert!(
        metrics.contains(&format!(
            "dpcap_dataset_epsilon_budget{{dataset=\"{dataset}\",name=\"laion-233m\",unit=\"example\"}} 1"
        )),
        "{metrics}"
    );

    // Every change is in the append-only audit log and survives a restart.
    client.raw().set_dataset_budget(set(2.0, "owner approved a second study")).await.unwrap();
    let audit = dir.path().join("datasets").join(dataset.replace(':', "-")).join("audit");
    assert_eq!(std::fs::read_dir(&audit).unwrap().count(), 3, "one create-once entry per change");
    server.kill();
    // A change whose audit entry landed but whose copy (budget.json) did not: the audit log is
    // the record, and the next change is numbered after it instead of failing forever.
    let last = std::fs::read_to_string(audit.join(format!("{:020}.json", 3))).unwrap();
    let lost = last.replace("\"version\": 3", "\"version\": 4").replace("\"epsilon\": 2.0", "\"epsilon\": 3.0");
    std::fs::write(audit.join(format!("{:020}.json", 4)), lost).unwrap();
    let server = AccountantProcess::start_strict(dir.path(), &[]).await;
    let mut client = server.client().await;
    let shown = client
        .raw()
        .get_dataset_budget(GetDatasetBudgetRequest { dataset_id: dataset.clone(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((shown.epsilon_budget, shown.version), (3.0, 4), "the newest audit entry is in force");
    let next = client.raw().set_dataset_budget(set(2.5, "after a lost copy")).await.unwrap().into_inner();
    assert_eq!(next.version, 5);
    client.raw().register_job(on_dataset("third", 1)).await.expect("the raised budget admits the third job");
    client.submit_part("third", 0, 0, &part(3, 4)).await.expect("the raised budget lets the third job run");
}

/// Jobs without a guarantee: a non-private baseline (σ = 0) and a TAN simulation. They train on
/// a budgeted dataset only if its owners allowed it, and never spend its budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_private_jobs_need_the_owners_consent_never_spend_the_budget_and_say_what_they_are() {
    let dir = tempfile::tempdir().unwrap();
    let server = AccountantProcess::start_strict(dir.path(), &[]).await;
    let mut client = server.client().await;
    let dataset = format!("sha256:{}", "7a".repeat(32));
    let set = |allow_not_private| SetDatasetBudgetRequest {
        dataset_id: dataset.clone(),
        epsilon: 4.0,
        delta: 1e-5,
        reason: "synthetic data".into(),
        allow_not_private,
        population: 100_000,
        force: true,
        ..Default::default()
    };
    let baseline = |id: &str| {
        let mut r = job(id, 0.05, 0.0, 1.0, 0.0, 4, 1, None);
        (contract(&mut r).dataset_id, contract(&mut r).privacy) = (dataset.clone(), Privacy::NotPrivate as i32);
        r
    };
    client.raw().set_dataset_budget(set(false)).await.unwrap();
    let refused = client.raw().register_job(baseline("early")).await.unwrap_err();
    assert!(refused.message().starts_with("invalid privacy:"), "{refused}");
    assert!(refused.message().contains("not allowed NOT PRIVATE"), "{refused}");
    let budget = client.raw().set_dataset_budget(set(true)).await.unwrap().into_inner();
    assert!(budget.allow_not_private);

    let spend = client.raw().register_job(baseline("baseline")).await.unwrap().into_inner().spend.unwrap();
    assert_eq!(spend.privacy(), Privacy::NotPrivate);
    for step in 0..3 {
        client.submit_part("baseline", step, 0, &part(step as u32, 4)).await.unwrap();
        let (release, spend) = client.fetch_release("baseline", step).await.unwrap();
        assert_eq!(release, part(step as u32, 4), "sigma = 0: the release is the sum itself");
        assert_eq!(spend.map(|s| s.epsilon_spent), Some(f64::INFINITY), "no guarantee: epsilon is +inf");
    }

    let mut simulation = job("tan", 0.001, 0.02, 1.0, 8.0, 4, 1, None);
    let c = contract(&mut simulation);
    c.dataset_id = dataset.clone();
    c.privacy = Privacy::Simulation as i32;
    c.simulated = Some(Mechanism { sample_rate: 0.05, noise_multiplier: 1.5, clipping_norm: 1.0 });
    client.raw().register_job(simulation).await.unwrap();
    for step in 0..2 {
        client.submit_part("tan", step, 0, &part(9, 4)).await.unwrap();
    }
    let spend = client.raw().get_spend(GetSpendRequest { job_id: "tan".into() }).await.unwrap().into_inner();
    let target = EpsilonCurve::new(AccountantKind::Rdp, 0.05, 1.5, 1e-5).unwrap().epsilon_after(2);
    assert_eq!((spend.privacy(), spend.epsilon_spent), (Privacy::Simulation, target), "{spend:?}");
    assert_eq!(spend.accountant, dpcap_proto::v1::AccountantKind::Rdp as i32);

    let shown = client
        .raw()
        .get_dataset_budget(GetDatasetBudgetRequest { dataset_id: dataset.clone(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(shown.epsilon_spent, 0.0, "NOT PRIVATE jobs never spend the dataset's budget");
    let ledger = std::fs::read_to_string(dir.path().join("jobs/baseline/registration.json")).unwrap();
    assert!(ledger.contains("\"kind\": \"not_private\""), "the ledger stores the typed mode: {ledger}");
    let text = server.scrape().await;
    for series in [
        "dpcap_privacy_epsilon_spent{job_id=\"baseline\",privacy=\"not_private\"} +Inf",
        "dpcap_privacy_noise_multiplier{job_id=\"baseline\",privacy=\"not_private\"} 0",
        "dpcap_privacy_noise_multiplier{job_id=\"tan\",privacy=\"simulation\"} 0.02",
    ] {
        assert!(text.contains(series), "missing {series} in\n{text}");
    }
    // Consent is checked at every step: once the owners revoke it, the baseline stops.
    client.raw().set_dataset_budget(set(false)).await.unwrap();
    let revoked = client.submit_part("baseline", 3, 0, &part(3, 4)).await.unwrap_err();
    assert!(revoked.message.contains("no longer allows NOT PRIVATE"), "{revoked}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_attempt_replaces_pending_parts_and_an_older_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = AccountantProcess::start(dir.path(), &["--allow-seeded-noise"]).await;
    let mut client = server.client().await;
    let dim = 64;
    client.raw().register_job(job("regroup", 0.01, 1.0, 1.0, 10.0, dim as u64, 2, Some(3))).await.unwrap();
    // Generation 1 sends part 0 and is re-formed before part 1 arrives.
    let old = client.submit_attempt("regroup", key(0, 0, 1), &part(9, dim)).await.unwrap();
    assert!(!old.released);
    // Generation 2 reruns the step with another split: its part 0 differs, and is not a conflict.
    let new0 = client.submit_attempt("regroup", key(0, 0, 2), &part(1, dim)).await.unwrap();
    assert_eq!(new0.parts_received, 1, "older parts dropped: {new0:?}");
    // A rank of the re-formed generation 1 holds a capability the newer one superseded.
    let stale = client.submit_attempt("regroup", key(0, 1, 1), &part(9, dim)).await.unwrap_err();
    assert_eq!(stale.code, Some(ErrorCode::StaleGeneration), "{stale:?}");
    assert!(stale.message.contains("re-formed"), "{stale:?}");
    assert!(client.submit_attempt("regroup", key(0, 1, 2), &part(2, dim)).await.unwrap().released);
    let spend = client.raw().get_spend(GetSpendRequest { job_id: "regroup".into() }).await.unwrap().into_inner();
    assert_eq!(spend.steps_charged, 1);
    // An attempt out of range is refused by name instead of making every later part stale.
    let hostile = client.submit_attempt("regroup", key(1, 0, u64::MAX), &part(0, dim)).await.unwrap_err();
    assert_eq!(hostile.status, Code::InvalidArgument);
    assert!(hostile.message.starts_with("invalid attempt:"), "{hostile}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_is_idempotent_under_concurrency_and_across_restarts_for_any_sigma() {
    use rand_chacha::ChaCha20Rng;
    use rand_chacha::rand_core::{Rng, SeedableRng};
    let dir = tempfile::tempdir().unwrap();
    let mut rng = ChaCha20Rng::seed_from_u64(11);
    let unit = |rng: &mut ChaCha20Rng| (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    // Random f64 mechanisms: 47 % of random doubles did not survive a JSON round trip before
    // the ledger parsed floats exactly; ranks registering at once each built the job.
    let jobs: Vec<RegisterJobRequest> = (0..4)
        .map(|i| {
            let (q, sigma, c) = (0.005 + 0.05 * unit(&mut rng), 0.6 + 3.0 * unit(&mut rng), 0.1 + unit(&mut rng));
            let mut request = job(&format!("reg-{i}"), q, sigma, c, 4.0 + 4.0 * unit(&mut rng), 64, 2, None);
            contract(&mut request).delta = 1e-6 + 1e-4 * unit(&mut rng);
            request
        })
        .collect();
    let server = AccountantProcess::start(dir.path(), &[]).await;
    let client = server.client().await;
    for request in &jobs {
        let ranks: Vec<_> = (0..2)
            .map(|_| {
                let (mut c, r) = (client.clone(), request.clone());
                tokio::spawn(async move { c.raw().register_job(r).await.map(|r| r.into_inner().created) })
            })
            .collect();
        let mut created = Vec::new();
        for rank in ranks {
            created.push(rank.await.unwrap().unwrap_or_else(|e| panic!("{}: {e}", request.job_id)));
        }
        created.sort();
        assert_eq!(created, vec![false, true], "{}: exactly one rank creates the job", request.job_id);
    }
    server.kill();
    let server = AccountantProcess::start(dir.path(), &[]).await;
    let mut client = server.client().await;
    for request in jobs {
        let again =
            client.raw().register_job(request.clone()).await.unwrap_or_else(|e| panic!("{}: {e}", request.job_id));
        assert!(!again.into_inner().created, "{}: identical after the ledger's round trip", request.job_id);
    }
}

/// A release streams out while it is being stored, but its `last` chunk waits for the store:
/// when the store fails after the charge, no fetch ever sees `last` (so no rank applies it),
/// the step is discarded and stays spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_store_fails_never_sends_its_last_chunk_and_is_discarded() {
    let dir = tempfile::tempdir().unwrap();
    let server = AccountantProcess::start(dir.path(), &[]).await;
    let mut client = server.client().await;
    client.raw().register_job(job("unstored", 0.01, 1.0, 1.0, 10.0, 6, 1, None)).await.unwrap();
    // The charge can be written; the release cannot (its directory is a file).
    std::fs::create_dir_all(dir.path().join("jobs/unstored")).unwrap();
    std::fs::write(dir.path().join("jobs/unstored/releases"), b"not a directory").unwrap();
    let mut fetcher = client.clone();
    let fetch = tokio::spawn(async move {
        let mut stream = fetcher.fetch_stream("unstored", 0, 2).await?;
        let mut chunks = Vec::new();
        while let Some(chunk) = stream.message().await? {
            chunks.push(chunk);
        }
        Ok::<_, tonic::Status>(chunks)
    });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(client.submit_part("unstored", 0, 0, &part(0, 6)).await.is_err(), "the store failed");
    let outcome = fetch.await.unwrap();
    let status = outcome.expect_err("the stream ends in an error, never with a last chunk");
    assert_eq!(ErrorCode::of(&status), Some(ErrorCode::ReleaseDiscarded), "{status}");
    let again = client.fetch_release("unstored", 0).await.unwrap_err();
    assert_eq!(again.code, Some(ErrorCode::ReleaseDiscarded), "{again}");
    let spend = client.raw().get_spend(GetSpendRequest { job_id: "unstored".into() }).await.unwrap().into_inner();
    assert_eq!((spend.steps_charged, spend.steps_discarded, spend.next_step), (1, 1, 1));
    assert_eq!(charged_steps(dir.path(), "unstored"), vec![0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_audited_job_audits_below_its_claim_after_it_ends_and_the_same_after_a_restart() {
    use dpcap_proto::v1::AuditJobRequest;
    let dir = tempfile::tempdir().unwrap();
    let server = AccountantProcess::start(dir.path(), &["--allow-seeded-noise"]).await;
    let mut client = server.client().await;
    let (dim, canaries, steps, q) = (20_000usize, 10_000u32, 20u64, 0.25);
    let sigma = noise_multiplier(AccountantKind::Pld, q, steps, 2.0, 1e-5).unwrap();
    let mut request = job("audited", q, sigma, 1.0, 2.0, dim as u64, 1, Some(3));
    contract(&mut request).audit_canaries = canaries;
    client.raw().register_job(request.clone()).await.unwrap();
    let audit =
        |mut c: common::Client| async move { c.raw().audit_job(AuditJobRequest { job_id: "audited".into() }).await };
    let early = audit(client.clone()).await.unwrap_err();
    assert_eq!(early.code(), Code::FailedPrecondition, "{early:?}");
    assert!(early.message().contains("still open"), "{early:?}");
    for step in 0..steps {
        client.submit_part("audited", step, 0, &vec![0.0; dim]).await.unwrap();
    }
    // The canaries sit on reserved coordinates (the default): ranks get the model's P values,
    // and with no examples moving them the releases are noise alone.
    let (release, _) = client.fetch_release("audited", steps - 1).await.unwrap();
    assert_eq!(release.len(), dim, "reserved coordinates never reach a rank");
    client
        .raw()
        .close_job(CloseJobRequest { job_id: "audited".into(), reason: "done".into(), ..Default::default() })
        .await
        .unwrap();
    let report = audit(client.clone()).await.unwrap().into_inner();
    assert_eq!((report.canaries, report.guesses, report.steps_scored), (canaries, 200, steps));
    assert!((report.epsilon_claimed - 2.0).abs() < 1e-3 && report.confidence == 0.95, "{report:?}");
    assert!(report.epsilon_lower_bound <= report.epsilon_claimed && !report.violation, "{report:?}");
    assert!(report.correct > report.guesses / 2, "the canaries leave a trace in the releases: {report:?}");
    let scraped = server.scrape().await;
    assert!(scraped.contains("dpcap_audit_epsilon_lower_bound{job_id=\"audited\"}"), "{scraped}");

    // The coins, places and samples come from the ledger: a restarted accountant agrees.
    server.kill();
    let server = AccountantProcess::start(dir.path(), &["--allow-seeded-noise"]).await;
    let client = server.client().await;
    assert_eq!(audit(client.clone()).await.unwrap().into_inner(), report);

    // Only DP jobs with canaries can be audited; the refusals name the field.
    let mut not_private = job("np", q, 0.0, 1.0, 0.0, dim as u64, 1, None);
    contract(&mut not_private).audit_canaries = 10;
    let refused = client.clone().raw().register_job(not_private).await.unwrap_err();
    assert!(refused.code() == Code::InvalidArgument && refused.message().starts_with("invalid audit:"), "{refused:?}");
    let mut too_many = job("many", q, sigma, 1.0, 2.0, 100, 1, None);
    (contract(&mut too_many).audit_canaries, contract(&mut too_many).audit_coordinates) =
        (101, AuditCoordinates::Model as i32);
    let refused = client.clone().raw().register_job(too_many.clone()).await.unwrap_err();
    assert!(refused.code() == Code::InvalidArgument && refused.message().contains("audit_canaries"), "{refused:?}");
    contract(&mut too_many).audit_coordinates = AuditCoordinates::Reserved as i32; // not the model's
    client.clone().raw().register_job(too_many.clone()).await.unwrap();
    (too_many.job_id, contract(&mut too_many).audit_coordinates) = ("elsewhere".into(), 9);
    let refused = client.clone().raw().register_job(too_many).await.unwrap_err();
    assert!(refused.code() == Code::InvalidArgument && refused.message().contains("audit_coordinates"), "{refused:?}");
    client.clone().raw().register_job(job("plain", q, sigma, 1.0, 2.0, 100, 1, None)).await.unwrap();
    let c = client.clone();
    let plain = async move { c.clone().raw().audit_job(AuditJobRequest { job_id: "plain".into() }).await };
    assert_eq!(plain.await.unwrap_err().code(), Code::FailedPrecondition);
}

/// Whoever holds a worker's token can act at the accountant only with a capability the
/// coordinator signed, and only for its job, its part and its group's generation: a forged,
/// unsigned, expired or foreign capability, and one of a re-formed group, are refused as
/// PERMISSION_DENIED before anything is kept, and nothing is charged for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capability_scopes_a_rank_to_its_job_part_and_generation_and_nothing_else() {
    use dpcap_proto::v1::AttachJobRequest;
    use dpcap_serve::capability::{Capabilities, KeyRing};
    let dir = tempfile::tempdir().unwrap();
    let ring = KeyRing::generate("k1");
    let keys = dir.path().join("capability.keys");
    std::fs::write(&keys, ring.to_file_text()).unwrap();
    let ledger = dir.path().join("ledger");
    let server = AccountantProcess::start(&ledger, &["--capability-key-file", keys.to_str().unwrap()]).await;
    let mut coordinator = server.client_signed(Capabilities::new(Some(ring.clone())));
    for id in ["job-a", "job-b"] {
        coordinator.raw().register_job(job(id, 0.01, 1.0, 1.0, 10.0, 8, 1, None)).await.unwrap();
    }
    let denied = |r: Result<SubmitPartResponseAlias, ClientError>, why: &str| {
        let e = r.expect_err(why);
        assert_eq!(e.status, Code::PermissionDenied, "{why}: {e}");
        assert_eq!(e.code, Some(ErrorCode::PermissionDenied), "{why}: {e}");
    };
    let values = part(0, 8);
    let mut forger = server.client_signed(Capabilities::new(Some(KeyRing::generate("k1"))));
    denied(forger.submit_part("job-a", 0, 0, &values).await, "signed with another key");
    denied(server.client().await.submit_part("job-a", 0, 0, &values).await, "unsigned while keys are set");
    let for_b = coordinator.capability("job-b", 0, Some(0));
    denied(coordinator.with(Some(for_b)).submit_part("job-a", 0, 0, &values).await, "a capability for job-b");
    let mut expired = coordinator.capability("job-a", 0, Some(0));
    expired.expires_unix_ms = 1;
    denied(coordinator.with(Some(expired)).submit_part("job-a", 0, 0, &values).await, "expired");
    denied(coordinator.with(None).submit_part("job-a", 0, 0, &values).await, "no capability at all");
    let rank_1 = coordinator.capability("job-a", 1, Some(0));
    denied(coordinator.with(Some(rank_1)).submit_part("job-a", 0, 0, &values).await, "rank 1 sending part 0");
    assert!(charged_steps(&ledger, "job-a").is_empty(), "nothing was charged for a refused capability");

    // Attaching checks P against the contract and W against the capability.
    let attach = |gradient_dim, parts| AttachJobRequest { job_id: "job-a".into(), gradient_dim, parts };
    let wrong_p = coordinator.raw_for("job-a", 0).attach_job(attach(9, 1)).await.unwrap_err();
    assert!(wrong_p.message().starts_with("invalid gradient_dim:"), "{wrong_p}");
    let wrong_w = coordinator.raw_for("job-a", 0).attach_job(attach(8, 2)).await.unwrap_err();
    assert!(wrong_w.message().starts_with("invalid parts:"), "{wrong_w}");
    coordinator.raw_for("job-a", 0).attach_job(attach(8, 1)).await.unwrap();

    // Generation 2 releases step 0; generation 1 (a group since re-formed) can no longer fetch.
    assert!(coordinator.submit_attempt("job-a", key(0, 0, 2), &values).await.unwrap().released);
    let old = coordinator.capability("job-a", 0, Some(1));
    let stale = coordinator.with(Some(old)).fetch_release("job-a", 0).await.unwrap_err();
    assert_eq!(stale.code, Some(ErrorCode::StaleGeneration), "{stale}");
    assert!(stale.message.contains("re-formed"), "{stale}");
    assert_eq!(coordinator.fetch_release("job-a", 0).await.unwrap().0.len(), 8);
    assert_eq!(charged_steps(&ledger, "job-a"), vec![0]);
}

type SubmitPartResponseAlias = dpcap_proto::v1::SubmitPartResponse;

/// Example-level and user-level budgets of the same data would not bound each other, so a
/// dataset's budget is of one unit: a job of the other unit is refused naming both and what to
/// do, even by an accountant that allows unbudgeted datasets, and so is a budget of a second
/// unit; the NOT PRIVATE allowance is the dataset's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_datasets_budget_is_of_one_unit_and_jobs_or_budgets_of_the_other_unit_are_refused() {
    use dpcap_proto::v1::PrivacyUnit;
    let dir = tempfile::tempdir().unwrap();
    let server = AccountantProcess::start(dir.path(), &[]).await;
    let mut client = server.client().await;
    let dataset = format!("sha256:{}", "9c".repeat(32));
    let on = |id: &str, unit: PrivacyUnit, sigma: f64| {
        let mut r = job(id, 0.05, sigma, 1.0, 100.0, 4, 1, None);
        let c = contract(&mut r);
        (c.dataset_id, c.unit) = (dataset.clone(), unit as i32);
        if unit == PrivacyUnit::User {
            c.users_digest = format!("sha256:{}", "11".repeat(32));
        }
        if sigma == 0.0 {
            c.epsilon_target = 0.0;
        }
        r
    };
    let budget = |unit: PrivacyUnit, allow_not_private: bool| SetDatasetBudgetRequest {
        dataset_id: dataset.clone(),
        epsilon: 20.0,
        delta: 1e-5,
        reason: "owners".into(),
        unit: unit as i32,
        allow_not_private,
        population: 100_000,
        force: true,
        ..Default::default()
    };
    client.raw().set_dataset_budget(budget(PrivacyUnit::User, true)).await.unwrap();
    client.raw().register_job(on("users", PrivacyUnit::User, 2.0)).await.unwrap();
    let refused = client.raw().register_job(on("examples", PrivacyUnit::Example, 2.0)).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused}");
    assert!(refused.message().starts_with("invalid unit:") && refused.message().contains("user level"), "{refused}");
    let second = client.raw().set_dataset_budget(budget(PrivacyUnit::Example, false)).await.unwrap_err();
    assert!(second.message().contains("budgeted at the user level already"), "{second}");
    for step in 0..3 {
        client.submit_part("users", step, 0, &part(1, 4)).await.unwrap();
    }
    let users = client
        .raw()
        .get_dataset_budget(GetDatasetBudgetRequest { dataset_id: dataset.clone(), unit: PrivacyUnit::User as i32 })
        .await
        .unwrap()
        .into_inner();
    assert!(users.epsilon_spent > 0.0 && users.jobs == vec!["users"], "{users:?}");
    // The dataset's allowance: its user-level budget allows NOT PRIVATE baselines, of its unit.
    client.raw().register_job(on("baseline", PrivacyUnit::User, 0.0)).await.unwrap();
    client.raw().set_dataset_budget(budget(PrivacyUnit::User, false)).await.unwrap();
    let forbidden = client.raw().register_job(on("baseline-2", PrivacyUnit::User, 0.0)).await.unwrap_err();
    assert!(forbidden.message().contains("not allowed NOT PRIVATE"), "{forbidden}");
}

/// Two groups that carry the same generation number (a coordinator restarted before recording
/// the one it had formed) are told apart by their nonces: their parts are never summed into one
/// release, and the newest generation a rank showed is remembered across a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parts_of_two_groups_are_never_summed_and_a_restart_remembers_the_newest_generation() {
    let dir = tempfile::tempdir().unwrap();
    let server = AccountantProcess::start(dir.path(), &["--allow-seeded-noise"]).await;
    let mut client = server.client().await;
    let dim = 16;
    client.raw().register_job(job("twins", 0.01, 1.0, 1.0, 10.0, dim as u64, 2, Some(1))).await.unwrap();
    let first = client.submit_as("twins", key(0, 0, 3), 111, &part(1, dim)).await.unwrap();
    assert_eq!((first.parts_received, first.released), (1, false));
    // The other group's part 1 does not complete the first group's step.
    let other = client.submit_as("twins", key(0, 1, 3), 222, &part(2, dim)).await.unwrap();
    assert_eq!((other.parts_received, other.released), (1, false), "a fresh pending step: {other:?}");
    let done = client.submit_as("twins", key(0, 0, 3), 222, &part(3, dim)).await.unwrap();
    assert!(done.released && done.parts_received == 2, "{done:?}");
    server.kill();
    let server = AccountantProcess::start(dir.path(), &["--allow-seeded-noise"]).await;
    let client = server.client().await;
    let older = client.capability("twins", 0, Some(2));
    let refused = client.with(Some(older)).fetch_release("twins", 0).await.unwrap_err();
    assert_eq!(refused.code, Some(ErrorCode::StaleGeneration), "generation 2 < 3, remembered: {refused}");
}

/// C = 1, a step of 10 units split 5 and 5 over two ranks: a part of norm 6 fits the step's
/// C·n = 10 but not its rank's C·n_r = 5, so it is refused (and cut off mid-stream), nothing
/// is charged, and the honest parts of the same step still release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_past_c_times_its_ranks_own_share_is_refused_even_under_the_steps_total() {
    let dir = tempfile::tempdir().unwrap();
    let server = AccountantProcess::start(dir.path(), &["--allow-seeded-noise"]).await;
    let mut client = server.client().await;
    let dim = 1 << 16;
    client.raw().register_job(job("shares", 0.01, 1.0, 1.0, 50.0, dim as u64, 2, Some(5))).await.unwrap();
    let on_one_coordinate = |norm: f32| {
        let mut values = vec![0.0f32; dim];
        values[7] = norm;
        values
    };
    let send = |client: &common::Client, part: u32, values: Vec<f32>| {
        let capability = client.share_capability("shares", key(0, part, 0), 10, 5);
        let mut rank = client.with(Some(capability));
        async move { rank.submit_attempt("shares", key(0, part, 0), &values).await }
    };
    let refused = send(&client, 1, on_one_coordinate(6.0)).await.unwrap_err();
    assert_eq!(refused.status, Code::FailedPrecondition, "{refused}");
    assert_eq!(refused.code, Some(ErrorCode::Unclipped), "{refused}");
    assert!(refused.message.contains("5 units of its rank's share"), "{refused}");
    assert!(charged_steps(dir.path(), "shares").is_empty(), "nothing charged");
    // Honest ranks: each within C·5 (a rank's share spent on one example is still within it).
    assert!(!send(&client, 0, on_one_coordinate(5.0)).await.unwrap().released);
    assert!(send(&client, 1, on_one_coordinate(4.0)).await.unwrap().released);
    assert_eq!(charged_steps(dir.path(), "shares"), vec![0]);
    // A capability whose share is more than its step sampled is refused by name.
    let capability = client.share_capability("shares", key(1, 0, 0), 10, 11);
    let bad = client.with(Some(capability)).submit_attempt("shares", key(1, 0, 0), &on_one_coordinate(0.0)).await;
    assert!(bad.unwrap_err().message.contains("more than the 10 its step sampled"));
}

/// Eight ranks open their part streams, send one chunk and stall: each stream is cut off after
/// `--part-idle-seconds` naming the limit (the rank's retry resends), nothing is held after,
/// and a second stream of one part supersedes the first at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_part_streams_are_cut_off_by_the_idle_limit_and_a_newer_stream_supersedes_an_older() {
    let dir = tempfile::tempdir().unwrap();
    let server = AccountantProcess::start(dir.path(), &["--allow-seeded-noise", "--part-idle-seconds", "2"]).await;
    let mut client = server.client().await;
    let dim = 1 << 16;
    client.raw().register_job(job("stall", 0.01, 1.0, 1.0, 50.0, dim as u64, 8, Some(5))).await.unwrap();
    let open = |client: &mut common::Client, part: u32| {
        let capability = client.step_capability("stall", key(0, part, 0), 10);
        let mut raw = client.with(Some(capability)).raw().clone();
        let (sender, chunks) = tokio::sync::mpsc::channel::<GradientChunk>(4);
        let first =
            GradientChunk { job_id: "stall".into(), part, data: to_bytes(&vec![0.0; 1024]), ..Default::default() };
        sender.try_send(first).unwrap();
        let call =
            tokio::spawn(async move { raw.submit_part(tokio_stream::wrappers::ReceiverStream::new(chunks)).await });
        (sender, call)
    };
    let mut stalled = Vec::new();
    for part in 0..8 {
        stalled.push(open(&mut client, part));
    }
    let open_now = |text: String| {
        let line = text.lines().find(|l| l.starts_with("dpcap_accountant_part_streams_open ")).unwrap().to_owned();
        line.rsplit(' ').next().unwrap().parse::<u64>().unwrap()
    };
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(open_now(server.scrape().await), 8, "eight streams held");
    // A rank's retry of part 0 takes its slot: the older stream ends at once.
    let (_retry, retried) = open(&mut client, 0);
    let (_first_sender, first_call) = stalled.remove(0);
    let superseded = first_call.await.unwrap().unwrap_err();
    assert!(superseded.message().contains("one_stream_per_part"), "{superseded}");
    for (_sender, call) in stalled {
        let cut = call.await.unwrap().unwrap_err();
        assert_eq!(cut.code(), Code::Unavailable, "{cut}");
        assert!(cut.message().contains("part_idle"), "{cut}");
    }
    assert!(retried.await.unwrap().unwrap_err().message().contains("part_idle"));
    assert_eq!(open_now(server.scrape().await), 0, "nothing held after the cut");
    assert!(charged_steps(dir.path(), "stall").is_empty(), "nothing charged");
}

/// A job on one index of some data is registered; a budget on that index's digest, or on its
/// shards' digest, is refused (budgets name data), one on the data's digest binds the job and a job on another index of
/// the same data alike: their spends compose into it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_names_the_data_and_binds_every_index_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = AccountantProcess::start(dir.path(), &[]).await;
    let mut client = server.client().await;
    let data = format!("sha256:{}", "da".repeat(32));
    let shards = format!("sha256:{}", "5a".repeat(32));
    let on_index = |id: &str, index: &str| {
        let mut r = job(id, 0.05, 2.0, 1.0, 100.0, 4, 1, None);
        (contract(&mut r).dataset_id, contract(&mut r).data_id) = (index.to_owned(), data.clone());
        contract(&mut r).shards_id = shards.clone();
        r
    };
    let (first, second) = (format!("sha256:{}", "01".repeat(32)), format!("sha256:{}", "02".repeat(32)));
    client.raw().register_job(on_index("first", &first)).await.unwrap();
    let set = |dataset_id: &str| SetDatasetBudgetRequest {
        dataset_id: dataset_id.to_owned(),
        epsilon: 50.0,
        delta: 1e-5,
        reason: "owner".into(),
        population: 100_000,
        force: true,
        ..Default::default()
    };
    let by_index = client.raw().set_dataset_budget(set(&first)).await.unwrap_err();
    assert_eq!(by_index.code(), Code::InvalidArgument, "{by_index}");
    assert!(by_index.message().contains(&format!("one index of the data {data}")), "{by_index}");
    // Nor under the digest the same shards had before examples had identities.
    let by_shards = client.raw().set_dataset_budget(set(&shards)).await.unwrap_err();
    assert!(by_shards.message().contains(&format!("one index of the data {data}")), "{by_shards}");
    client.raw().set_dataset_budget(set(&data)).await.unwrap();
    client.raw().register_job(on_index("second", &second)).await.unwrap();
    let get = GetDatasetBudgetRequest { dataset_id: data.clone(), ..Default::default() };
    let budget = client.raw().get_dataset_budget(get).await.unwrap().into_inner();
    let mut jobs = budget.jobs.clone();
    jobs.sort();
    assert_eq!(jobs, ["first", "second"], "both indexes' jobs spend the data's budget: {budget:?}");
}
