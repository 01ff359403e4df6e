//! `dpctl privacy …` as scripts use it: plain numbers, --json objects, and flag-naming errors.

use std::process::Command;

fn dpctl(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dpctl")).args(args).output().expect("dpctl runs");
    (out.status.code().unwrap_or(-1), String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

#[test]
fn epsilon_prints_a_plain_number_and_json() {
    let args = [
        "privacy",
        "epsilon",
        "--sample-rate",
        "0.04",
        "--noise-multiplier",
        "1.5",
        "--steps",
        "2250",
        "--delta",
        "1e-5",
        "--accountant",
        "rdp",
    ];
    let (code, out, err) = dpctl(&args);
    assert_eq!(code, 0, "{err}");
    let eps: f64 = out.trim().parse().expect("a plain number");
    assert!((eps - 7.32911117143).abs() < 1e-3, "{eps}");
    let (code, out, _) = dpctl(&[&args[..], &["--json"]].concat());
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["steps"], 2250);
    assert_eq!(v["accountant"], "rdp");
    assert!((v["epsilon"].as_f64().unwrap() - eps).abs() < 1e-12);
}

#[test]
fn noise_and_steps_invert_epsilon() {
    let (code, out, err) = dpctl(&[
        "privacy",
        "noise",
        "--sample-rate",
        "0.1",
        "--steps",
        "512",
        "--epsilon",
        "1",
        "--delta",
        "1e-6",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let sigma = serde_json::from_str::<serde_json::Value>(&out).unwrap()["noise_multiplier"].as_f64().unwrap();
    assert!((sigma - 9.66).abs() < 0.01, "{sigma}");
    let (code, out, err) = dpctl(&[
        "privacy",
        "steps",
        "--sample-rate",
        "0.1",
        "--noise-multiplier",
        "3",
        "--epsilon",
        "2",
        "--delta",
        "1e-6",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "155");
}

#[test]
fn dataset_size_batch_size_and_epochs_replace_rate_and_steps() {
    // q = 256/60000, 10 epochs = ceil(10 / q) steps, delta defaults to 1/N.
    let (code, out, err) = dpctl(&[
        "privacy",
        "epsilon",
        "--dataset-size",
        "60000",
        "--batch-size",
        "256",
        "--noise-multiplier",
        "1.1",
        "--epochs",
        "10",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["steps"], 2344);
    assert!((v["delta"].as_f64().unwrap() - 1.0 / 60000.0).abs() < 1e-15);
    assert!((v["sample_rate"].as_f64().unwrap() - 256.0 / 60000.0).abs() < 1e-15);
}

#[test]
fn bad_values_exit_non_zero_naming_the_flag() {
    let cases: [(&[&str], &str); 8] = [
        (
            &["--sample-rate", "0.1", "--noise-multiplier", "-1", "--steps", "10", "--delta", "1e-5"],
            "--noise-multiplier -1",
        ),
        (
            &["--sample-rate", "-0.5", "--noise-multiplier", "1", "--steps", "10", "--delta", "1e-5"],
            "--sample-rate -0.5",
        ),
        (&["--sample-rate", "1.5", "--noise-multiplier", "1", "--steps", "10", "--delta", "1e-5"], "--sample-rate"),
        (&["--sample-rate", "0", "--noise-multiplier", "1", "--steps", "10", "--delta", "1e-5"], "--sample-rate"),
        (
            &["--sample-rate", "0.1", "--noise-multiplier", "0", "--steps", "10", "--delta", "1e-5"],
            "--noise-multiplier",
        ),
        (&["--sample-rate", "0.1", "--noise-multiplier", "1", "--steps", "10", "--delta", "1"], "--delta"),
        (&["--sample-rate", "abc", "--noise-multiplier", "1", "--steps", "10", "--delta", "1e-5"], "--sample-rate"),
        (&["--sample-rate", "0.1", "--noise-multiplier", "1", "--steps", "10"], "--delta"),
    ];
    for (args, flag) in cases {
        let (code, out, err) = dpctl(&[&["privacy", "epsilon"][..], args].concat());
        assert_ne!(code, 0, "{args:?} succeeded with {out}");
        assert!(out.is_empty(), "nothing on stdout for {args:?}");
        assert!(err.contains(flag), "{args:?}: {err:?} does not name {flag}");
    }
}

#[test]
fn a_target_no_step_fits_under_is_an_error_that_says_what_to_raise() {
    let args = [
        "privacy",
        "steps",
        "--sample-rate",
        "0.1",
        "--noise-multiplier",
        "1",
        "--epsilon",
        "0.001",
        "--delta",
        "1e-5",
    ];
    let (code, out, err) = dpctl(&args);
    assert_ne!(code, 0, "printed {out:?}");
    assert!(out.is_empty(), "{out:?}");
    assert!(err.contains("no step fits") && err.contains("--epsilon 0.001") && err.contains("raise"), "{err}");
}
