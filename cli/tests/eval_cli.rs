//! `dpctl eval` and `dpctl export` on a checkpoint written with the job's checkpoint store:
//! every metric in the table and in --json, the checkpoint's weights (not a fresh init) unless
//! --random-init, both export formats with their provenance, and errors that name the flag.

use std::path::Path;
use std::process::Command;

use dpcap_ml::checkpoint::save_weights;
use dpcap_ml::checkpoint::{CheckpointStore, Manifest};
use dpcap_ml::model::{Captioner, CaptionerConfig};
use dpcap_ml::params::ParamSet;

type Inner = <dpcap_ml::CpuBackend as burn::tensor::backend::AutodiffBackend>::InnerBackend;

fn dpctl(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dpctl")).args(args).output().expect("dpctl runs");
    (out.status.code().unwrap_or(-1), String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

/// An indexed synthetic dataset (with its trained tokenizer) under `dir`; returns its path.
fn dataset(dir: &Path) -> String {
    let out = dir.join("data");
    let (code, _, err) = dpctl(&[
        "dataset",
        "synth",
        "--out",
        out.to_str().unwrap(),
        "--examples",
        "300",
        "--eval-examples",
        "0",
        "--shard-size",
        "100",
    ]);
    assert_eq!(code, 0, "{err}");
    let train = out.join("train");
    let (code, _, err) = dpctl(&["dataset", "index", "--quiet", "--train-tokenizer", train.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    train.to_str().unwrap().to_owned()
}

/// A micro captioner's weights from `seed`, saved as checkpoint `step` of a job under `root`.
fn checkpoint(root: &Path, step: u64, seed: u64) {
    let mut params = ParamSet::<Inner>::seeded(&Default::default(), seed);
    Captioner::new(&mut params, CaptionerConfig::named("micro").unwrap());
    let manifest: Manifest = serde_json::from_value(serde_json::json!({
        "job_id": "eval-test",
        "step": step,
        "ledger_position": step,
        "model": "micro",
        "objective": "caption",
        "parameters": params.numel(),
        "generation": 1,
        "created_unix_ms": 0,
    }))
    .unwrap();
    let store = CheckpointStore::open(root.to_str().unwrap()).unwrap();
    let weights = save_weights(&params).unwrap();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(store.save(&manifest, weights, Vec::new()))
        .unwrap();
}

/// The suite's metrics, as `dpctl eval` and the report keys name them.
pub(crate) const METRICS: [&str; 8] = [
    "zero_shot",
    "aro_relation",
    "aro_attribution",
    "layout",
    "probe_accuracy",
    "few_shot_1",
    "few_shot_5",
    "few_shot_10",
];

#[test]
fn eval_prints_every_metric_of_the_checkpoint_and_of_a_random_init() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path());
    let root = dir.path().join("ckpt");
    checkpoint(&root, 20, 42);
    let root = root.to_str().unwrap();
    let base = ["eval", "--checkpoint", root, "--dataset", &data, "--images", "24", "--probe-images", "360"];

    let (code, out, err) = dpctl(&[&base[..], &["--json"]].concat());
    assert_eq!(code, 0, "{err}");
    let trained: serde_json::Value = serde_json::from_str(&out).unwrap();
    for key in METRICS {
        let v = trained[key].as_f64().unwrap_or_else(|| panic!("{key} in {trained}"));
        assert!((0.0..=1.0).contains(&v), "{key} = {v}");
    }
    assert!(trained["caption_slot_accuracy"]["mean"].is_number(), "{trained}");
    assert_eq!((trained["step"].as_u64(), trained["random_init"].as_bool()), (Some(20), Some(false)));
    assert_eq!(trained["model"], "micro");

    let (code, out, err) = dpctl(&[&base[..], &["--json", "--random-init", "--step", "20"]].concat());
    assert_eq!(code, 0, "{err}");
    let random: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(random["random_init"], true);
    assert!(
        METRICS.iter().any(|k| random[k] != trained[k])
            || random["caption_slot_accuracy"] != trained["caption_slot_accuracy"],
        "the checkpoint's weights were not loaded: {trained} vs {random}"
    );

    let (code, out, err) = dpctl(&base);
    assert_eq!(code, 0, "{err}");
    for label in [
        "zero-shot",
        "ARO relation",
        "ARO attribution",
        "layout",
        "linear probe",
        "1-shot",
        "5-shot",
        "10-shot",
        "caption slots",
        "step 20",
    ] {
        assert!(out.contains(label), "{label} missing from\n{out}");
    }
}

#[test]
fn eval_errors_name_the_flag_and_the_value() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path());
    let root = dir.path().join("ckpt");
    checkpoint(&root, 5, 1);
    let root = root.to_str().unwrap();
    let missing = dir.path().join("nowhere");
    let missing = missing.to_str().unwrap();
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let empty = empty.to_str().unwrap();
    for (args, needle) in [
        (vec!["--checkpoint", missing, "--dataset", &data], format!("checkpoint {missing}")),
        (
            vec!["--checkpoint", empty, "--dataset", &data],
            format!("checkpoint {empty}: no `latest` pointer; it holds no"),
        ),
        (vec!["--checkpoint", root, "--dataset", &data, "--step", "99"], "--step 99".to_owned()),
        (
            vec!["--checkpoint", root, "--dataset", &data, "--step", "99"],
            "its steps are 5: pass one with --step".to_owned(),
        ),
        (vec!["--checkpoint", root, "--dataset", missing], format!("--dataset {missing}")),
        (vec!["--checkpoint", root, "--dataset", &data, "--images", "5"], "--images 5".to_owned()),
    ] {
        let (code, _, err) = dpctl(&[&["eval"][..], &args].concat());
        assert_ne!(code, 0, "{args:?}");
        assert!(err.contains(&needle), "{needle:?} not in {err}");
    }
    assert!(!Path::new(missing).exists(), "a mistyped --checkpoint must not be created");
}

#[test]
fn export_writes_the_encoder_in_either_format_with_its_check_vectors() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ckpt");
    checkpoint(&root, 4, 9);
    let (root, out, check) =
        (root.to_str().unwrap(), dir.path().join("vit.safetensors"), dir.path().join("check.safetensors"));
    let args = [
        "export",
        root,
        "--format",
        "timm",
        "--out",
        out.to_str().unwrap(),
        "--check-vectors",
        check.to_str().unwrap(),
    ];
    let (code, stdout, err) = dpctl(&args);
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("VisionTransformer(") && stdout.contains("class_token=False"), "{stdout}");
    let bytes = std::fs::read(&out).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(file.tensor("blocks.1.attn.qkv.weight").unwrap().shape(), [192, 64]);
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let metadata = header.metadata().clone().unwrap_or_default();
    assert_eq!((metadata["dpcap.step"].as_str(), metadata["dpcap.privacy"].as_str()), ("4", "dp"));
    let vectors = std::fs::read(&check).unwrap();
    let vectors = safetensors::SafeTensors::deserialize(&vectors).unwrap();
    assert_eq!(vectors.tensor("features").unwrap().shape(), [4, 64]);
    assert_eq!(vectors.tensor("tokens").unwrap().shape(), [4, 16, 64]);

    let ours = dir.path().join("ours.safetensors");
    let (code, _, err) = dpctl(&["export", root, "--out", ours.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let bytes = std::fs::read(&ours).unwrap();
    let names = safetensors::SafeTensors::deserialize(&bytes)
        .unwrap()
        .names()
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
    assert!(names.iter().all(|n| n.starts_with("encoder.")) && names.len() == 37, "{names:?}");

    let missing = dir.path().join("nothing");
    let (code, _, err) = dpctl(&["export", missing.to_str().unwrap(), "--out", ours.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains(&format!("checkpoint {}:", missing.display())) && !err.contains("--checkpoint"), "{err}");
    let (code, _, err) = dpctl(&["export", root, "--step", "3", "--out", ours.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("--step 3: no readable checkpoint 3") && err.contains("its steps are 4"), "{err}");
    assert!(!missing.exists(), "reading must not create the directory");
}
