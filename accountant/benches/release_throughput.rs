//! Release throughput on loopback: a real `dpcap-accountant` process, P = 10M f32, W = 2
//! ranks that each stream their part in and the release out, as on the CPU path.
//! Run: `cargo bench -p dpcap-accountant --bench release_throughput`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let dim: usize = std::env::var("DIM").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000_000);
    let steps: u64 = std::env::var("STEPS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let dir = tempfile::tempdir().unwrap();
    let server = common::AccountantProcess::start(dir.path(), &[]).await;
    let mut client = server.client().await;
    client.raw().register_job(common::job("bench", 0.01, 1.0, 1.0, 1e3, dim as u64, 2, None)).await.unwrap();
    let parts: Vec<Vec<f32>> = (0..2).map(|p| (0..dim).map(|i| ((i + p) % 97) as f32 * 1e-3).collect()).collect();
    let mut times = Vec::new();
    for step in 0..steps {
        let start = Instant::now();
        let ranks = parts.iter().enumerate().map(|(rank, values)| {
            let mut c = client.clone();
            async move {
                c.submit_part("bench", step, rank as u32, values).await.unwrap();
                c.fetch_release("bench", step).await.unwrap().0.len()
            }
        });
        let lens = futures::future::join_all(ranks).await;
        assert!(lens.iter().all(|&n| n == dim));
        times.push(start.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let mb = (dim * 4) as f64 / 1e6;
    println!("release throughput: P = {dim} f32 ({mb:.0} MB per vector), W = 2, median of {steps} steps");
    println!("  step (2 parts in, 2 releases out): {median:.3} s");
    println!(
        "  gradient bytes through the accountant: {:.0} MB/s (in {:.0} MB/s, out {:.0} MB/s)",
        4.0 * mb / median,
        2.0 * mb / median,
        2.0 * mb / median
    );
}
