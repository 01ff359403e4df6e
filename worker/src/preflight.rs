//! The preflight of a device: everything the GPU path loads, compiles against or writes,
//! checked in one pass before a model is built, each with the fix when it fails.
//!
//! `dpcap-worker preflight --device cuda:0` prints it; a CUDA worker and `dpctl bench clip
//! --device cuda:N` run it at start and refuse to go on when a required check fails, instead of
//! panicking in cudarc or cubecl minutes later. The header and cache checks are file-system
//! reads, so a machine without a GPU (or a build without `cuda`) still reports them.

use dpcap_ml::device::{KernelCache, check_headers};
use serde::Serialize;

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// It works.
    Ok,
    /// It works, slower than it should (a kernel cache that cannot be written).
    Warn,
    /// The device cannot be used until it is fixed.
    Failed,
    /// Not checked: an earlier failure makes it moot.
    Skipped,
}

/// One check: what, how it came out, and the detail (a version, or the fix).
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What was checked: build, driver, nvrtc, nccl, headers, kernel, kernel cache.
    pub name: &'static str,
    /// The outcome.
    pub status: Status,
    /// The version found, or why it failed and what to do.
    pub detail: String,
}

/// Every check for one device.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The device checked ("cpu", "cuda:0").
    pub device: String,
    /// False when any check failed.
    pub ok: bool,
    /// The checks, in the order the device needs them.
    pub checks: Vec<Check>,
}

impl Report {
    fn new(device: &str, checks: Vec<Check>) -> Self {
        let ok = checks.iter().all(|c| c.status != Status::Failed);
        Self { device: device.to_owned(), ok, checks }
    }

    /// One line a check, for a terminal.
    pub fn to_text(&self) -> String {
        let mut text = format!("preflight of {}: {}\n", self.device, if self.ok { "ok" } else { "FAILED" });
        for c in &self.checks {
            text.push_str(&format!("  {:<13} {:<7} {}\n", c.name, format!("{:?}", c.status).to_lowercase(), c.detail));
        }
        text
    }

    /// The failed checks' details, joined, for an error.
    pub fn failures(&self) -> String {
        let failed = self.checks.iter().filter(|c| c.status == Status::Failed);
        failed.map(|c| format!("{}: {}", c.name, c.detail)).collect::<Vec<_>>().join("; ")
    }
}

/// What the preflight checks beyond the device itself.
#[derive(Debug, Clone, Copy)]
pub struct Needs {
    /// NCCL: a worker all-reduces over it; a benchmark does not.
    pub nccl: bool,
}

fn check(name: &'static str, outcome: Result<String, String>) -> Check {
    match outcome {
        Ok(detail) => Check { name, status: Status::Ok, detail },
        Err(detail) => Check { name, status: Status::Failed, detail },
    }
}

/// Checks `device` ("cpu" or "cuda:N"), reading `$CUDA_PATH` and the kernel cache's variables.
pub fn run(device: &str, needs: Needs) -> Report {
    if device == "cpu" {
        let detail = "burn-flex: nothing to load".to_owned();
        return Report::new(device, vec![Check { name: "device", status: Status::Ok, detail }]);
    }
    let Some(ordinal) = device.strip_prefix("cuda:").and_then(|n| n.parse::<usize>().ok()) else {
        let detail = format!("invalid device {device:?}: expected cpu or cuda:N");
        return Report::new(device, vec![Check { name: "device", status: Status::Failed, detail }]);
    };
    let mut checks = libraries(ordinal, needs);
    let cuda_path = std::env::var("CUDA_PATH").ok();
    let headers = check_headers(cuda_path.as_deref());
    checks.push(check(
        "headers",
        headers
            .as_ref()
            .map(|root| format!("{} (from {})", root.path.display(), root.found_by))
            .map_err(|e| e.to_string()),
    ));
    checks.push(kernel(ordinal, &checks, headers.ok().map(|root| root.path)));
    checks.push(match KernelCache::from_process_env() {
        Some(cache) => match cache.check_writable() {
            Ok(()) => Check { name: "kernel cache", status: Status::Ok, detail: cache.dir.display().to_string() },
            Err(e) => Check { name: "kernel cache", status: Status::Warn, detail: e.to_string() },
        },
        None => Check {
            name: "kernel cache",
            status: Status::Warn,
            detail: format!("none: set {} to a writable directory", dpcap_ml::device::KERNEL_CACHE_ENV),
        },
    });
    Report::new(device, checks)
}

/// A preflight with a failed check: the device cannot be used until each named fix is made.
#[derive(Debug, thiserror::Error)]
#[error("invalid --device {device}: the preflight failed: {failures}")]
pub struct PreflightFailed {
    /// The device checked.
    pub device: String,
    /// Each failed check with its fix, joined ([`Report::failures`]).
    pub failures: String,
}

/// What a process that is about to use `device` runs first: the preflight, a warning logged per
/// `Warn` check, refusal on any failure, and (on CUDA) cubecl's kernel caches pointed at
/// `DPCAP_KERNEL_CACHE` before anything reads cubecl's configuration.
pub fn require(device: &str, needs: Needs) -> Result<Report, PreflightFailed> {
    let report = run(device, needs);
    for check in report.checks.iter().filter(|c| c.status == Status::Warn) {
        tracing::warn!(check = check.name, "{}", check.detail);
    }
    if !report.ok {
        return Err(PreflightFailed { device: device.to_owned(), failures: report.failures() });
    }
    #[cfg(feature = "cuda")]
    if device != "cpu" {
        dpcap_ml::device::configure_kernel_cache();
    }
    Ok(report)
}

/// The driver, the device, NVRTC and NCCL, through cudarc.
#[cfg(feature = "cuda")]
fn libraries(ordinal: usize, needs: Needs) -> Vec<Check> {
    let driver = check("driver", crate::cuda::check_device(ordinal));
    let driver_ok = driver.status == Status::Ok;
    let mut checks = vec![
        Check {
            name: "build",
            status: Status::Ok,
            detail: format!("built with the cuda feature; {}", dpcap_ml::device::KERNEL_SELECTION),
        },
        driver,
        check("nvrtc", crate::cuda::check_nvrtc()),
    ];
    if needs.nccl {
        checks.push(match driver_ok {
            true => check("nccl", crate::cuda::check_nccl()),
            false => Check { name: "nccl", status: Status::Skipped, detail: "the driver failed".into() },
        });
    }
    checks
}

/// The probe kernel ([`crate::cuda::check_kernel`]), once the driver, NVRTC and the headers
/// passed: a missing NVRTC builtin or header fails here, with its fix, not at the first
/// cubecl kernel.
#[cfg(feature = "cuda")]
fn kernel(ordinal: usize, earlier: &[Check], root: Option<std::path::PathBuf>) -> Check {
    let ready = ["driver", "nvrtc", "headers"]
        .iter()
        .all(|name| earlier.iter().any(|c| c.name == *name && c.status == Status::Ok));
    match (ready, root) {
        (true, Some(root)) => check("kernel", crate::cuda::check_kernel(ordinal, &root)),
        _ => Check { name: "kernel", status: Status::Skipped, detail: "the driver, nvrtc or headers failed".into() },
    }
}

/// Without the `cuda` feature no kernel can be compiled.
#[cfg(not(feature = "cuda"))]
fn kernel(_ordinal: usize, _earlier: &[Check], _root: Option<std::path::PathBuf>) -> Check {
    Check { name: "kernel", status: Status::Skipped, detail: "this build has no CUDA support".into() }
}

/// Without the `cuda` feature nothing of CUDA can load: the build check says so.
#[cfg(not(feature = "cuda"))]
fn libraries(ordinal: usize, needs: Needs) -> Vec<Check> {
    let skipped = |name| Check { name, status: Status::Skipped, detail: "this build has no CUDA support".into() };
    let mut checks = vec![
        Check {
            name: "build",
            status: Status::Failed,
            detail: format!(
                "cuda:{ordinal}: this binary was built without the `cuda` feature (build with --features cuda, or \
                 use the CUDA image)"
            ),
        },
        skipped("driver"),
        skipped("nvrtc"),
    ];
    if needs.nccl {
        checks.push(skipped("nccl"));
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_device_needs_nothing_and_a_malformed_device_fails_naming_it() {
        assert!(run("cpu", Needs { nccl: true }).ok);
        let bad = run("gpu0", Needs { nccl: true });
        assert!(!bad.ok && bad.failures().contains("\"gpu0\""), "{}", bad.to_text());
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn a_cuda_device_on_a_build_without_cuda_fails_the_build_check_and_skips_the_libraries() {
        let report = run("cuda:0", Needs { nccl: true });
        assert!(!report.ok);
        let names: Vec<_> = report.checks.iter().map(|c| (c.name, c.status)).collect();
        assert_eq!(
            &names[..4],
            &[
                ("build", Status::Failed),
                ("driver", Status::Skipped),
                ("nvrtc", Status::Skipped),
                ("nccl", Status::Skipped)
            ]
        );
        assert!(report.failures().contains("--features cuda"), "{}", report.to_text());
        assert!(!run("cuda:0", Needs { nccl: false }).checks.iter().any(|c| c.name == "nccl"));
        let refused = require("cuda:0", Needs { nccl: false }).unwrap_err().to_string();
        assert!(refused.starts_with("invalid --device cuda:0: the preflight failed: build:"), "{refused}");
    }
}
