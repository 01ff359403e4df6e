//! The shipped binaries the end-to-end tests start.
//!
//! They are targets of this package, compiled from the components' own `main.rs`
//! (`tests/Cargo.toml`), so cargo builds them — with the very features and profile of the test
//! run — before any integration test here starts, under `cargo test --workspace` and under
//! `cargo test -p dpcap-e2e` alike. The harness never builds anything itself.
//!
//! It used to: the first test that needed a binary ran `cargo test --workspace --no-run`. Under
//! the README's command that was a no-op, but whenever the test binary came from another build
//! (`-p dpcap-e2e`, `--test e2e`, a binary run again by hand after a change) it compiled and
//! linked the rest of the workspace *inside* that test and every test waiting on it — about
//! 300 s on 2 cores, reported as the tests' own run time (the "first run takes 318 s" stall).

use std::path::{Path, PathBuf};

/// How the binaries are built when a test binary is run outside cargo.
pub const BUILD: &str = "cargo test --workspace --no-run";

/// Names of the binaries the tests start.
pub const BINARIES: [&str; 4] = ["dpcap-accountant", "dpcap-coordinator", "dpcap-worker", "dpctl"];

/// `target/debug` (or wherever this test binary was built): target/debug/deps/this → target/debug.
pub(crate) fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent().and_then(Path::parent).expect("target directory").to_owned()
}

/// The path of the shipped binary `name` (one of [`BINARIES`]), built by cargo for this test
/// run. Panics at once, naming the command, when it is missing (a test binary run by hand
/// from a build that did not include them).
pub fn binary(name: &str) -> PathBuf {
    let path = target_dir().join(format!("e2e-{name}"));
    assert!(path.exists(), "{} is missing: build the test targets with `{BUILD}`", path.display());
    path
}
