//! `dpctl` as a shell user meets it: help that lists only the flags a command uses, and a pipe
//! closed early (`| head`) that ends the command quietly.

use std::io::Read;
use std::process::{Command, Stdio};

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_dpctl")).args(args).arg("--help").output().expect("dpctl runs");
    assert!(out.status.success(), "{args:?} --help: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn offline_commands_leave_the_cluster_flags_out_of_their_help_and_cluster_commands_list_them() {
    for offline in [&["eval"][..], &["export"], &["privacy", "epsilon"], &["dataset", "synth"], &["model", "list"]] {
        let text = help(offline);
        for flag in ["--coordinator", "--token", "--tls-ca"] {
            assert!(!text.contains(flag), "{offline:?} lists {flag}:\n{text}");
        }
    }
    for cluster in [&["get"][..], &["submit"], &["dataset", "budget", "set"], &["audit"]] {
        let text = help(cluster);
        for flag in ["--token", "--tls-ca"] {
            assert!(text.contains(flag), "{cluster:?} does not list {flag}:\n{text}");
        }
    }
    // Hidden, not removed: a flag given anyway is still accepted.
    let out = Command::new(env!("CARGO_BIN_EXE_dpctl"))
        .args(["model", "list", "--coordinator", "http://127.0.0.1:1", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_pipe_closed_early_ends_the_command_without_a_panic() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dpctl"))
        .args(["model", "list"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // the reader is gone before dpctl writes
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    let status = child.wait().unwrap();
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(status.code(), Some(0), "a reader that has gone is not an error: {stderr}");
    // The command's own exit code survives a closed pipe: a refusal is still exit 2.
    let mut child = Command::new(env!("CARGO_BIN_EXE_dpctl"))
        .args(["privacy", "steps", "--sample-rate", "0.1", "--noise-multiplier", "1", "--epsilon", "0.001"])
        .args(["--delta", "1e-5"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    assert_eq!(child.wait().unwrap().code(), Some(2));
}
