//! `dpctl bench scale --json` at a small size: every key the issue names and the release keys,
//! releases of several blocks over both transports and through both store writers (the bench
//! fails if a release comes back short, or if the same-host socket is not chosen), StepWork
//! under the gRPC limit.

use std::process::Command;

#[test]
fn a_small_scale_bench_reports_every_key_and_releases_over_both_transports_and_writers() {
    let args = ["bench", "scale", "--examples", "20000", "--shards", "7", "--batch", "500", "--ranks", "4"];
    let more = ["--params", "5000000", "--release-steps", "1", "--multipart", "--json"];
    let out = Command::new(env!("CARGO_BIN_EXE_dpctl")).args(args).args(more).output().expect("dpctl runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    for key in [
        "examples",
        "expected_batch",
        "ranks",
        "params",
        "index_bytes",
        "layout_rss_bytes",
        "sample_s",
        "split_s",
        "max_stepwork_bytes",
        "release_s",
        "release_bytes_per_s",
        "noise_coords_per_s_per_core",
        "release_first_chunk_s",
        "release_stored_s",
        "release_multipart_s",
        "release_cpu_s",
        "disk_fsync_bytes_per_s",
        "release_cpu_s_per_gb",
        "release_noise_late_s",
        "grpc_release_noise_late_s",
        "release_check_cpu_s_per_gb",
        "release_noise_add_cpu_s_per_gb",
        "release_encode_cpu_s_per_gb",
        "release_store_cpu_s_per_gb",
        "release_transport_cpu_s_per_gb",
        "release_check_in_place_cpu_s_per_gb",
        "grpc_release_s",
        "grpc_release_cpu_s_per_gb",
        "grpc_release_transport_cpu_s_per_gb",
        "memcpy_bytes_per_s",
        "memcpy_cpu_s_per_gb",
        "release_memcpy_multiple",
    ] {
        assert!(v.get(key).is_some_and(|x| !x.is_null()), "missing {key}: {v}");
    }
    let num = |key: &str| v[key].as_f64().unwrap();
    assert!(num("max_stepwork_bytes") < num("stepwork_limit_bytes"), "{v}");
    assert_eq!((num("examples"), num("params"), num("ranks")), (20000.0, 5e6, 4.0), "{v}");
    assert_eq!(v["release_transport"], "local", "{v}");
    assert!(num("memcpy_bytes_per_s") > 1e8, "a memcpy slower than 100 MB/s is no reference: {v}");
    // Every phase of the breakdown is measured (at 10 ms ticks a small one can read 0).
    for phase in ["check", "check_in_place", "noise_add", "encode", "store"] {
        let key = format!("release_{phase}_cpu_s_per_gb");
        assert!(num(&key) >= 0.0 && num(&key).is_finite(), "{key}: {v}");
    }
}
