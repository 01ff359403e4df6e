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

/// The tour's old mistake: a spec in a subfolder naming ./data/train, data made in the current
/// directory. Refused before any connection, saying where the path was looked for and how to
/// write it.
#[test]
fn a_relative_spec_path_that_names_nothing_is_refused_at_submit_naming_where_it_was_resolved() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("jobs")).unwrap();
    std::fs::create_dir_all(dir.path().join("data/train")).unwrap();
    std::fs::write(dir.path().join("jobs/job.yaml"), "name: t\ndataset: ./data/train\nmodel: micro\nepsilon: 8\n")
        .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_dpctl"))
        .current_dir(dir.path())
        .args(["--coordinator", "http://127.0.0.1:1", "submit", "jobs/job.yaml"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let jobs = std::fs::canonicalize(dir.path().join("jobs")).unwrap();
    assert!(
        stderr
            .contains(&format!("dataset: ./data/train was resolved against the spec file's folder {}", jobs.display())),
        "{stderr}"
    );
    assert!(stderr.contains("exists relative to the current directory"), "{stderr}");
    assert!(!stderr.contains("127.0.0.1:1"), "refused before connecting: {stderr}");
}

fn dpctl_with_config(config: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_dpctl"))
        .env("DPCAP_CONFIG", config)
        .env_remove("DPCAP_COORDINATOR")
        .env_remove("DPCAP_CONTEXT")
        .args(args)
        .output()
        .unwrap()
}

/// A context supplies the cluster flags' defaults; a flag given wins; an unknown context is
/// refused by name. Unreachable ports show which endpoint each command used.
#[test]
fn a_config_context_supplies_the_cluster_flags_and_a_flag_given_wins() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("dpcap/config.yaml");
    let token = dir.path().join("token");
    std::fs::write(&token, "0123456789abcdef0123\n").unwrap();
    let settings = ["coordinator=http://127.0.0.1:9", &format!("token-file={}", token.display())];
    let set = dpctl_with_config(&config, &[&["config", "set-context", "lab"][..], &settings].concat());
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    let contexts = dpctl_with_config(&config, &["config", "get-contexts"]);
    assert!(String::from_utf8_lossy(&contexts.stdout).contains("* lab  coordinator http://127.0.0.1:9"));
    let from_context = dpctl_with_config(&config, &["get", "job-x"]);
    assert!(
        String::from_utf8_lossy(&from_context.stderr).contains("cannot reach http://127.0.0.1:9"),
        "{from_context:?}"
    );
    let flag = dpctl_with_config(&config, &["get", "job-x", "--coordinator", "http://127.0.0.1:7"]);
    assert!(String::from_utf8_lossy(&flag.stderr).contains("cannot reach http://127.0.0.1:7"), "{flag:?}");
    let unknown = dpctl_with_config(&config, &["--context", "prod", "get", "job-x"]);
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("context \"prod\" is not in the dpctl config"));
    let help = dpctl_with_config(&config, &["get", "--help"]);
    assert!(!String::from_utf8_lossy(&help.stdout).contains("0123456789abcdef"), "the token never shows in help");
}

#[test]
fn a_budget_named_by_its_digest_needs_its_population_and_a_negative_epsilon_reaches_the_check() {
    let digest = format!("sha256:{}", "ab".repeat(32));
    let out = Command::new(env!("CARGO_BIN_EXE_dpctl"))
        .args(["dataset", "budget", "set", &digest, "--epsilon", "8", "--delta", "1e-6"])
        .args(["--accountant", "http://127.0.0.1:1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("--population: a budget named by its digest"), "{stderr}");
    // A negative number is a value to check, not a flag clap cannot parse.
    let out = Command::new(env!("CARGO_BIN_EXE_dpctl"))
        .args(["dataset", "budget", "set", &digest, "--epsilon", "-3", "--delta", "1e-6", "--population", "10"])
        .args(["--accountant", "http://127.0.0.1:1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("unexpected argument"), "{stderr}");
}

/// A context whose token file is gone warns only where the token would be used: never on an
/// offline command or on `dpctl config`, which must still work to fix it. With no config file,
/// `get-contexts` says where it looked and how to make one.
#[test]
fn a_missing_token_file_warns_only_the_commands_that_would_send_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("dpcap/config.yaml");
    let none = dpctl_with_config(&config, &["config", "get-contexts"]);
    let said = String::from_utf8_lossy(&none.stderr);
    assert!(none.status.success() && said.contains("no contexts in") && said.contains("set-context"), "{said}");
    let gone = dir.path().join("gone");
    let settings = ["coordinator=http://127.0.0.1:9", &format!("token-file={}", gone.display())];
    let set = dpctl_with_config(&config, &[&["config", "set-context", "lab"][..], &settings].concat());
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    let offline = [
        &["privacy", "epsilon", "--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "10", "--delta", "1e-5"]
            [..],
        &["config", "use-context", "lab"][..],
        &["--context", "lab", "config", "get-contexts"][..],
    ];
    for args in offline {
        let out = dpctl_with_config(&config, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && !stderr.contains("warning"), "{args:?}: {stderr}");
    }
    let online = dpctl_with_config(&config, &["get", "job-x"]);
    assert!(String::from_utf8_lossy(&online.stderr).contains("warning: reading token-file"), "{online:?}");
}
