//! The README's five-minute tour, run from its own code block in a fresh folder, so that the
//! front page cannot drift from what works. What the harness changes, and only that: the
//! binaries come from the test build (`target/release/X` is a link to it), the fixed ports
//! become free ones (the same substitution in every command, and the servers' listen
//! addresses through their environment), and the last command, `dpctl watch`, is stopped by a
//! `dpctl cancel` once the job has trained a step (its 150 steps would take minutes).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dpcap_e2e::binaries::binary;
use dpcap_e2e::dpctl_with_env;
use dpcap_e2e::jobs::tempfile_dir;

/// The first `sh` block under the README's tour heading.
fn tour_block(readme: &str) -> Vec<String> {
    let tour = readme.split("## A five-minute tour").nth(1).expect("the README has its tour");
    let block = tour.split("```sh\n").nth(1).and_then(|b| b.split("```").next()).expect("the tour has a sh block");
    block
        .lines()
        .map(|line| line.split(" #").next().unwrap_or("").trim().to_owned())
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .collect()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Children started by the tour's `&` lines, killed when the test ends however it ends.
struct Background(Vec<Child>);

impl Drop for Background {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn wait_listening(addr: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {addr}: see the component logs");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `dpctl get ID --json`'s step, once the job has one.
fn trained_step(job_id: &str, env: &[(String, String)]) -> u64 {
    let out = dpctl_with_env(&["get", job_id, "--json"], env);
    let job: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    job["progress"]["step"].as_u64().unwrap_or(0)
}

#[test]
fn the_readme_tour_runs_as_written_in_a_fresh_folder() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let commands = tour_block(&std::fs::read_to_string(repo.join("README.md")).unwrap());
    let dir = tempfile_dir("tour");
    std::fs::create_dir_all(dir.join("deploy/jobs")).unwrap();
    std::fs::copy(repo.join("deploy/jobs/demo.yaml"), dir.join("deploy/jobs/demo.yaml")).unwrap();
    std::fs::create_dir_all(dir.join("target/release")).unwrap();
    for name in ["dpcap-accountant", "dpcap-coordinator", "dpcap-worker", "dpctl"] {
        std::os::unix::fs::symlink(binary(name), dir.join("target/release").join(name)).unwrap();
    }
    let (accountant, coordinator) = (format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port()));
    let env: Vec<(String, String)> = [
        ("DPCAP_ACCOUNTANT_LISTEN", accountant.clone()),
        ("DPCAP_ACCOUNTANT_METRICS_LISTEN", format!("127.0.0.1:{}", free_port())),
        ("DPCAP_COORDINATOR_LISTEN", coordinator.clone()),
        ("DPCAP_COORDINATOR_METRICS_LISTEN", format!("127.0.0.1:{}", free_port())),
        ("DPCAP_ACCOUNTANT", format!("http://{accountant}")),
        ("DPCAP_COORDINATOR", format!("http://{coordinator}")),
        ("RUST_LOG", "info,h2=warn,hyper=warn,tower=warn".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let mut background = Background(Vec::new());
    let mut job_id: Option<String> = None;
    for (n, line) in commands.iter().enumerate() {
        if line.starts_with("cargo build") {
            continue; // the test build made them
        }
        let command = line.replace("127.0.0.1:7070", &accountant).replace("127.0.0.1:7071", &coordinator);
        if let Some(start) = command.strip_suffix('&') {
            let log = std::fs::File::create(dir.join(format!("tour-{n}.log"))).unwrap();
            let child = Command::new("bash")
                .args(["-c", start])
                .current_dir(&dir)
                .envs(env.iter().cloned())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap();
            background.0.push(child);
            continue;
        }
        wait_listening(&accountant);
        wait_listening(&coordinator);
        if command.contains(" watch JOB_ID") {
            let id = job_id.clone().expect("submit printed the job id");
            return watch_then_cancel(&dir, &command.replace("JOB_ID", &id), &id, &env);
        }
        let out =
            Command::new("bash").args(["-c", &command]).current_dir(&dir).envs(env.iter().cloned()).output().unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "the tour's `{line}` failed:\n{stdout}\n{stderr}");
        if command.contains(" submit ") {
            job_id = stdout
                .lines()
                .find_map(|l| l.strip_prefix("job "))
                .and_then(|l| l.split_whitespace().next())
                .map(str::to_owned);
        }
    }
    panic!("the tour ends without `dpctl watch JOB_ID`: {commands:?}");
}

/// Watches the job as the tour does; once it has trained a step, cancels it: the watch must
/// then end with the cancelled outcome's exit code (4).
fn watch_then_cancel(dir: &Path, command: &str, job_id: &str, env: &[(String, String)]) {
    let watch = Command::new("bash")
        .args(["-c", command])
        .current_dir(dir)
        .envs(env.iter().cloned())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    while trained_step(job_id, env) < 1 {
        assert!(Instant::now() < deadline, "the tour's job trained no step in 300 s: see the component logs");
        std::thread::sleep(Duration::from_millis(500));
    }
    let cancelled = dpctl_with_env(&["cancel", job_id], env);
    assert!(cancelled.status.success(), "{}", String::from_utf8_lossy(&cancelled.stderr));
    let out = watch.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(4), "watch exits 4 on a cancel: {}", String::from_utf8_lossy(&out.stderr));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"), "{}", String::from_utf8_lossy(&out.stderr));
}
