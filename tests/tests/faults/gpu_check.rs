//! `scripts/gpu-check.sh` on this machine: the one-rank job on a CPU worker, the parts of a
//! run published one by one, the bundle's checks and the device command, so that the GPU's
//! rare call fails on nothing a CPU could have found.

use dpcap_e2e::jobs::tempfile_dir;

/// `scripts/gpu-check.sh` as the GPU machine runs it: copied beside `bin/` (this build's
/// binaries) as the bundle holds it, so that a previous call's cache pieces beside it are found.
struct GpuCheck {
    status: std::process::ExitStatus,
    summary: String,
    results: std::path::PathBuf,
}

impl GpuCheck {
    /// The bundle's layout under `dir`: the script and `bin/`, each binary linked to this build's.
    fn bundle(dir: &std::path::Path) -> std::path::PathBuf {
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        for name in dpcap_e2e::binaries::BINARIES {
            std::os::unix::fs::symlink(dpcap_e2e::binary(name), bin.join(name)).unwrap();
        }
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/gpu-check.sh");
        std::fs::copy(script, dir.join("gpu-check.sh")).unwrap();
        bin
    }

    /// Runs the script's `verb` from `dir` (laid out by [`GpuCheck::bundle`]) with `env`; the
    /// script bounds itself, and `timeout` bounds the script.
    fn run(dir: &std::path::Path, verb: &str, env: &[(&str, &std::ffi::OsStr)]) -> Self {
        let results = dir.join("results");
        let mut command = std::process::Command::new("timeout");
        command.args(["--kill-after=10", "420", "bash"]).arg(dir.join("gpu-check.sh")).arg(verb);
        command.env("GPU_CHECK_BIN", dir.join("bin")).env("GPU_CHECK_RESULTS", &results);
        for (name, value) in env {
            command.env(name, value);
        }
        let output = command.output().expect("bash runs the script");
        let summary = std::fs::read_to_string(results.join("summary.txt")).unwrap_or_default();
        Self { status: output.status, summary, results }
    }

    /// `run` on a CPU device with only `parts`, publishing into `dir/out` (returned), with one
    /// more variable set.
    fn run_parts(dir: &std::path::Path, parts: &str, (name, value): (&str, &str)) -> (Self, std::path::PathBuf) {
        let out = dir.join("out");
        let env: [(&str, &std::ffi::OsStr); 4] = [
            ("GPU_CHECK_DEVICE", "cpu".as_ref()),
            ("GPU_CHECK_OUT", out.as_os_str()),
            ("GPU_CHECK_PARTS", parts.as_ref()),
            (name, value.as_ref()),
        ];
        (Self::run(dir, "run", &env), out)
    }

    /// The one-rank job on `device`.
    fn run_job(dir: &std::path::Path, device: &str) -> Self {
        Self::bundle(dir);
        Self::run(dir, "run-job", &[("GPU_CHECK_DEVICE", device.as_ref())])
    }

    /// The summary and every component log, for a failed assertion.
    fn evidence(&self) -> String {
        let mut text = format!("exit {:?}; summary:\n{}", self.status.code(), self.summary);
        for name in ["accountant", "coordinator", "worker"] {
            let log = std::fs::read_to_string(self.results.join("job").join(format!("{name}.log"))).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            text += &format!("\n---- {name}.log\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
        }
        text
    }

    /// Live processes whose command line names the results directory: none may outlive the script.
    fn leftovers(&self) -> Vec<String> {
        let needle = self.results.to_string_lossy().into_owned();
        let procs = std::fs::read_dir("/proc").into_iter().flatten().flatten();
        procs
            .filter_map(|p| std::fs::read(p.path().join("cmdline")).ok())
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .filter(|c| c.contains(&needle))
            .collect()
    }
}

#[test]
fn the_gpu_check_scripts_job_passes_on_a_cpu_worker_and_leaves_no_process_behind() {
    let dir = tempfile_dir("gpu-check-cpu");
    let run = GpuCheck::run_job(&dir, "cpu");
    assert!(run.status.success(), "{}", run.evidence());
    assert!(
        run.summary.starts_with("ok one-rank job on cpu (5 steps, bf16, reduction accountant)"),
        "{}",
        run.evidence()
    );
    assert_eq!(run.leftovers(), Vec::<String>::new(), "every process the script started is stopped");
}

/// On a build without `cuda`, a `cuda:0` worker exits at start: the script must say so in its
/// summary, with the worker's own error, and stop the accountant and coordinator it started.
#[cfg(not(feature = "cuda"))]
#[test]
fn the_gpu_check_script_reports_a_component_that_dies_at_start_and_stops_the_others() {
    let dir = tempfile_dir("gpu-check-dies");
    let run = GpuCheck::run_job(&dir, "cuda:0");
    assert_eq!(run.status.code(), Some(1), "{}", run.evidence());
    let line = run.summary.lines().next().unwrap_or_default();
    assert!(line.starts_with("FAILED one-rank job on cuda:0 (worker exited (exit 1)"), "{}", run.evidence());
    assert!(line.contains("built without the `cuda` feature"), "the worker's own error reaches the summary: {line}");
    assert_eq!(run.leftovers(), Vec::<String>::new(), "the accountant and coordinator are stopped");
}

/// The files a run left in its `GPU_CHECK_OUT`, by name.
fn published(out: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(out).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

/// Each line of parts.jsonl, parsed.
fn parts(out: &std::path::Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(out.join("parts.jsonl")).unwrap_or_default();
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

/// `len` bytes that gzip cannot shrink (xorshift), so that an archive of them has a known size.
fn incompressible(len: usize) -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// A bundle under a fresh `name` folder with a previous call's cache beside its script: `len`
/// incompressible bytes (returned) as `cubecl/ptx`, in pieces of `piece` bytes.
fn seeded_bundle(name: &str, len: usize, piece: usize) -> (dpcap_e2e::testdir::TestDir, Vec<u8>) {
    let dir = tempfile_dir(name);
    GpuCheck::bundle(&dir);
    std::fs::create_dir_all(dir.join("seed/cubecl")).unwrap();
    let blob = incompressible(len);
    std::fs::write(dir.join("seed/cubecl/ptx"), &blob).unwrap();
    shell(&format!("tar -czf - -C seed cubecl | split -b {piece} -d -a 2 - kernel-cache.tgz."), &dir);
    (dir, blob)
}

fn shell(script: &str, dir: &std::path::Path) {
    let status = std::process::Command::new("bash").args(["-euo", "pipefail", "-c", script]).current_dir(dir).status();
    assert!(status.expect("bash runs").success(), "{script}");
}

/// A run puts each part's line and figures in `GPU_CHECK_OUT` as the part ends, and the kernel
/// cache (seeded from the pieces a previous call brought back) comes back in pieces under the
/// size the GPU machine returns, within its 8 files: what the device shows survives a later
/// part's failure or a hard kill.
#[test]
fn a_gpu_check_run_publishes_each_part_as_it_ends_and_brings_the_kernel_cache_back_in_pieces() {
    // A previous call's cache: 3 MB that gzip cannot shrink, in 1 MB pieces beside the script.
    let (dir, blob) = seeded_bundle("gpu-check-parts", 3_000_000, 1_000_000);
    let piece = 1_500_000_u64;
    let (run, out) = GpuCheck::run_parts(&dir, "preflight warm job", ("GPU_CHECK_PIECE_BYTES", "1500000"));
    assert!(run.status.success(), "{}", run.evidence());
    let lines: Vec<&str> = run.summary.lines().collect();
    let expected = ["ok worker preflight on cpu", "ok clip micro bf16 batch 16 on cpu", "ok one-rank job on cpu"];
    assert_eq!(lines.len(), 3, "{}", run.evidence());
    for (line, start) in lines.iter().zip(expected) {
        assert!(line.starts_with(start) && line.contains("; kernels: 0 compiled, 0 from the cache"), "{line}");
    }
    assert_eq!(std::fs::read_to_string(out.join("summary.txt")).unwrap(), run.summary);

    let parts = parts(&out);
    let names: Vec<&str> = parts.iter().map(|p| p["part"].as_str().unwrap()).collect();
    assert_eq!(names, ["preflight", "warm", "job"], "{parts:#?}");
    assert!(parts.iter().all(|p| p["status"] == "ok" && p["kernels_compiled"] == 0), "{parts:#?}");
    assert_eq!(parts[0]["result"]["ok"], true, "the preflight's report: {:#}", parts[0]);
    assert!(parts[1]["result"]["verify_rel_err"].as_f64().is_some_and(|e| e < 3e-2), "{:#}", parts[1]);
    assert_eq!(parts[1]["result"]["kernels"], serde_json::Value::Null, "burn-flex picks no kernels: {:#}", parts[1]);
    assert_eq!(parts[2]["result"]["state"], "SUCCEEDED", "the job as dpctl get shows it: {:#}", parts[2]);

    let files = published(&out);
    assert!(files.len() <= 8, "the GPU machine brings back at most 8 files: {files:?}");
    let pieces: Vec<&String> = files.iter().filter(|f| f.starts_with("kernel-cache.tgz.")).collect();
    assert!(pieces.len() >= 2, "3 MB of cache in 1.5 MB pieces: {files:?}");
    for p in &pieces {
        assert!(std::fs::metadata(out.join(p)).unwrap().len() <= piece, "{p} is over the piece size");
    }
    assert!(files.contains(&"results.tgz".to_owned()) && !files.iter().any(|f| f.starts_with('.')), "{files:?}");
    shell("mkdir back && cat out/kernel-cache.tgz.* | tar -xz -C back", &dir);
    assert!(std::fs::read(dir.join("back/cubecl/ptx")).unwrap() == blob, "the seeded cache came back whole");
    assert_eq!(run.leftovers(), Vec::<String>::new(), "every process the script started is stopped");
}

/// A set of cache pieces cut short (a call killed between two renames) is checked whole before
/// anything is unpacked from it: the run says so and starts cold, with nothing half-written in
/// its cache.
#[test]
fn a_gpu_check_run_starts_cold_from_cache_pieces_that_are_not_one_archive() {
    let (dir, _) = seeded_bundle("gpu-check-torn", 400_000, 100_000);
    shell("rm kernel-cache.tgz.01", &dir);
    let (run, _) = GpuCheck::run_parts(&dir, "preflight", ("GPU_CHECK_PIECE_BYTES", "100000"));
    assert!(run.status.success(), "{}", run.evidence());
    let env = std::fs::read_to_string(run.results.join("env.txt")).unwrap();
    assert!(env.contains("not a whole archive: starting cold"), "{env}");
    assert!(!run.results.join("kcache/cubecl/ptx").exists(), "nothing is unpacked from a torn set");
}

/// A part that hangs is stopped at its bound (here the run's whole budget of a few seconds),
/// recorded FAILED with the time, and the parts before it were already published.
#[test]
fn a_gpu_check_part_that_hangs_is_cut_at_its_bound_and_the_earlier_parts_are_already_out() {
    let dir = tempfile_dir("gpu-check-hang");
    let bin = GpuCheck::bundle(&dir);
    std::fs::remove_file(bin.join("dpctl")).unwrap();
    let hang = "#!/bin/bash\nexec -a \"hung-dpctl $GPU_CHECK_RESULTS\" sleep 1000\n";
    std::fs::write(bin.join("dpctl"), hang).unwrap();
    shell("chmod +x bin/dpctl", &dir);
    let (run, out) = GpuCheck::run_parts(&dir, "preflight warm", ("GPU_CHECK_BUDGET_S", "8"));
    assert_eq!(run.status.code(), Some(1), "{}", run.evidence());
    let lines: Vec<&str> = run.summary.lines().collect();
    assert!(lines[0].starts_with("ok worker preflight on cpu"), "{}", run.summary);
    assert!(lines[1].starts_with("FAILED clip micro bf16") && lines[1].contains("(timed out after"), "{}", run.summary);
    let parts = parts(&out);
    assert_eq!(parts.len(), 2, "{parts:#?}");
    assert_eq!((&parts[0]["status"], &parts[1]["status"]), (&"ok".into(), &"FAILED".into()), "{parts:#?}");
    assert_eq!(parts[1]["result"], serde_json::Value::Null);
    assert_eq!(std::fs::read_to_string(out.join("summary.txt")).unwrap(), run.summary);
    assert_eq!(run.leftovers(), Vec::<String>::new(), "the hung dpctl is killed");
}

fn gpu_check(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/gpu-check.sh");
    let mut command = std::process::Command::new("bash");
    command.arg(&script).args(args);
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("bash runs the script")
}

/// The GPU machine takes one command of at most 2,000 characters and brings back at most 8
/// files from $OUT: the printed command must fit, pack its results there, and name its files.
#[test]
fn the_gpu_check_prints_the_one_command_the_gpu_machine_runs_within_its_limits() {
    let out = gpu_check(&["device-command"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("files to bring (carry): target/gpu-bundle"), "{text}");
    let command = text.lines().skip_while(|l| !l.starts_with("command (")).nth(1).unwrap_or_default();
    assert!(!command.is_empty() && command.len() <= 2000, "{text}");
    assert!(command.contains("gpu-check.sh run") && command.contains("GPU_CHECK_OUT=\"$OUT\""), "{command}");
}

/// `bundle` fails on a bundle the GPU machine cannot take: over 60 MiB, or a binary that needs
/// a newer glibc than the machine's.
#[test]
fn the_bundle_check_refuses_a_bundle_over_60_mib_or_needing_a_newer_glibc() {
    let dir = tempfile_dir("bundle-check");
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    std::fs::copy("/bin/true", dir.join("bin/true")).unwrap();
    let path = dir.to_str().unwrap();
    let ok = gpu_check(&["check-bundle", path], &[]);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    assert!(String::from_utf8_lossy(&ok.stdout).contains("true: glibc 2."), "{ok:?}");
    let old = gpu_check(&["check-bundle", path], &[("GPU_CHECK_GLIBC_MAX", "2.2")]);
    assert!(!old.status.success());
    assert!(String::from_utf8_lossy(&old.stderr).contains("newer than the GPU machine's 2.2"), "{old:?}");
    let big = std::fs::File::create(dir.join("bin/big")).unwrap();
    big.set_len(61 << 20).unwrap();
    let large = gpu_check(&["check-bundle", path], &[]);
    assert!(!large.status.success());
    assert!(String::from_utf8_lossy(&large.stderr).contains("over the 62914560-byte limit (60 MiB)"), "{large:?}");
}

/// `bundle` proves each CUDA binary was built without cubecl's autotune from the statement the
/// binary carries (dpcap_ml::device::KERNEL_SELECTION), gzipped or not, amid other strings.
#[test]
fn the_bundle_check_refuses_a_cuda_binary_built_with_autotune() {
    let dir = tempfile_dir("bundle-autotune");
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    let path = dir.to_str().unwrap();
    let worker = dir.join("bin/dpcap-worker");
    std::fs::write(&worker, "\x7fELF...kernel selection: autotunebuilt with the cuda feature").unwrap();
    let tuned = gpu_check(&["check-bundle", path], &[]);
    assert!(!tuned.status.success(), "{tuned:?}");
    let said = String::from_utf8_lossy(&tuned.stderr);
    assert!(said.contains("states \"kernel selection: autotune\", not \"kernel selection: no autotune\""), "{said}");
    std::fs::write(&worker, "\x7fELF...kernel selection: no autotunebuilt with the cuda feature").unwrap();
    shell("gzip bin/dpcap-worker", &dir);
    let plain = gpu_check(&["check-bundle", path], &[]);
    assert!(plain.status.success(), "{plain:?}");
    assert!(String::from_utf8_lossy(&plain.stdout).contains("dpcap-worker.gz: kernel selection: no autotune"));
    std::fs::write(dir.join("bin/dpctl"), "no statement").unwrap();
    let silent = gpu_check(&["check-bundle", path], &[]);
    assert!(String::from_utf8_lossy(&silent.stderr).contains("dpctl states \"no kernel selection\""), "{silent:?}");
    // This build's own dpctl (the suite builds without autotune) states it.
    std::fs::remove_file(dir.join("bin/dpctl")).unwrap();
    std::os::unix::fs::symlink(dpcap_e2e::binary("dpctl"), dir.join("bin/dpctl")).unwrap();
    let real = gpu_check(&["check-bundle", path], &[]);
    assert!(String::from_utf8_lossy(&real.stdout).contains("dpctl: kernel selection: no autotune"), "{real:?}");
}

/// The worker's preflight names every missing piece of a CUDA machine at once, as JSON an
/// operator's script can read, and exits 1; the file-system checks run even without CUDA.
#[cfg(not(feature = "cuda"))]
#[test]
fn the_worker_preflight_reports_each_missing_cuda_piece_with_its_fix_and_exits_1() {
    let dir = tempfile_dir("preflight");
    let toolkit = dir.join("cuda");
    std::fs::create_dir_all(toolkit.join("include")).unwrap();
    std::fs::write(toolkit.join("include/cuda_runtime.h"), "").unwrap();
    let run = |device: &str| {
        std::process::Command::new(dpcap_e2e::binary("dpcap-worker"))
            .args(["preflight", "--device", device, "--json"])
            .env("CUDA_PATH", &toolkit)
            .env("DPCAP_KERNEL_CACHE", dir.join("kernels"))
            .output()
            .unwrap()
    };
    let out = run("cuda:0");
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the report is JSON");
    let status = |name: &str| {
        let check = report["checks"].as_array().unwrap().iter().find(|c| c["name"] == name).cloned();
        check.unwrap_or_else(|| panic!("no {name} check in {report:#}"))
    };
    assert_eq!(report["ok"], false);
    assert_eq!(status("build")["status"], "failed");
    assert_eq!(status("nccl")["status"], "skipped");
    let headers = status("headers");
    assert_eq!(headers["status"], "failed");
    assert!(headers["detail"].as_str().unwrap().contains("lacks cuda_fp16.h, cuda_bf16.h"), "{headers:#}");
    assert_eq!(status("kernel cache")["status"], "ok", "the cache directory is created: {report:#}");
    assert!(dir.join("kernels").is_dir());
    assert_eq!(run("cpu").status.code(), Some(0), "a CPU worker needs nothing");
}
