//! `dpctl dataset synth` writes real shards and a held-out split; `dpctl dataset index` counts
//! them and writes the compact index (a manifest and one table per shard).

use std::process::Command;

fn dpctl(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dpctl")).args(args).output().expect("dpctl runs");
    (out.status.code().unwrap_or(-1), String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

#[test]
fn synth_then_index_counts_every_example() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let (code, stdout, err) =
        dpctl(&["dataset", "synth", "--out", out, "--examples", "230", "--eval-examples", "40", "--shard-size", "100"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!((v["train_shards"].as_u64(), v["eval_shards"].as_u64()), (Some(3), Some(1)));
    let train = dir.path().join("train");
    let (code, stdout, err) = dpctl(&["dataset", "index", train.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let summary: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!((summary["examples"].as_u64(), summary["tokenizer"].as_str()), (Some(230), Some("none")));
    assert!(!train.join("tokenizer.json").exists(), "captions train a tokenizer only when asked (not DP)");
    assert!(err.contains("--train-tokenizer"), "{err}");
    let (code, stdout, err) = dpctl(&["dataset", "index", "--quiet", "--train-tokenizer", train.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(serde_json::from_str::<serde_json::Value>(&stdout).unwrap()["tokenizer"], "trained");
    assert!(train.join("tokenizer.json").exists());
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(train.join("index/manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["examples"], 230);
    assert_eq!(manifest["shards"][2]["examples"], 30);
    assert!(train.join("index/shards/000002.bin").exists(), "one table per shard");
    let (code, _, err) = dpctl(&["dataset", "index", dir.path().join("missing").to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(err.contains("missing"), "{err}");
}

#[test]
fn synth_refuses_a_non_empty_directory_unless_forced_and_then_replaces_it_whole() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let synth = |extra: &[&str]| {
        let args =
            [&["dataset", "synth", "--out", out, "--eval-examples", "0", "--shard-size", "50"][..], extra].concat();
        dpctl(&args)
    };
    let (code, _, err) = synth(&["--examples", "120"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = dpctl(&["dataset", "index", dir.path().join("train").to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = synth(&["--examples", "60"]);
    assert_eq!(code, 2);
    assert!(err.contains(&format!("invalid --out {out}: not empty")) && err.contains("--force"), "{err}");
    assert!(dir.path().join("train/shard-00002.tar").exists(), "a refusal changes nothing");
    let (code, _, err) = synth(&["--examples", "60", "--force"]);
    assert_eq!(code, 0, "{err}");
    let train = dir.path().join("train");
    assert!(!train.join("shard-00002.tar").exists(), "no stale shard is kept");
    assert!(!train.join("index").exists(), "no stale index is kept");
}
