//! A real S3-protocol server for the object-store tests: moto's server mode, from PyPI at the
//! versions pinned in `tests/s3-server.txt`, installed into `target/s3-venv` on first use and
//! started on a loopback ephemeral port. It is the bucket, not a dpcap component: the shipped
//! binaries talk to it through object_store's real S3 client.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use object_store::ObjectStore;

/// The pinned requirements; a venv installed from other ones is replaced.
const REQUIREMENTS: &str = include_str!("../s3-server.txt");

/// How long moto may take to print its address.
const START_BOUND: Duration = Duration::from_secs(60);

/// A running moto S3 server; killed on drop.
pub struct S3Server {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
}

/// `target/s3-venv` with the pinned packages, installed once per test process.
fn venv() -> &'static Path {
    static VENV: OnceLock<PathBuf> = OnceLock::new();
    VENV.get_or_init(install)
}

/// `target`, the parent of this test binary's profile directory.
fn target_root() -> PathBuf {
    crate::binaries::target_dir().parent().expect("target directory").to_owned()
}

/// Installs into a staging directory and renames it into place, so an interrupted install
/// never leaves a venv that looks complete.
fn install() -> PathBuf {
    let venv = target_root().join("s3-venv");
    let marker = venv.join("requirements.txt");
    if std::fs::read_to_string(&marker).is_ok_and(|r| r == REQUIREMENTS) {
        return venv;
    }
    let staging = target_root().join(format!("s3-venv.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    run(Command::new("python3").arg("-m").arg("venv").arg(&staging), "python3 -m venv");
    std::fs::write(staging.join("requirements.txt"), REQUIREMENTS).expect("writing the requirements");
    run(
        Command::new(staging.join("bin/pip"))
            .args(["install", "--disable-pip-version-check", "--quiet", "--requirement"])
            .arg(staging.join("requirements.txt")),
        "pip install (from PyPI) of tests/s3-server.txt",
    );
    let _ = std::fs::remove_dir_all(&venv);
    std::fs::rename(&staging, &venv).expect("moving the S3 server's venv into place");
    venv
}

fn run(command: &mut Command, what: &str) {
    let out = command.output().unwrap_or_else(|e| panic!("{what} could not start: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl S3Server {
    /// Starts moto on 127.0.0.1 with an ephemeral port, logging to `dir/moto.log`.
    pub fn start(dir: &Path) -> Self {
        let log = dir.join("moto.log");
        let file = std::fs::File::create(&log).expect("moto's log file");
        let child = Command::new(venv().join("bin/python"))
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", "0"])
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .expect("moto's server starts");
        let mut server = Self { child, endpoint: String::new() };
        let started = Instant::now();
        server.endpoint = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(address) = text.split("Running on ").nth(1).and_then(|t| t.split_whitespace().next()) {
                break address.to_owned();
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("moto's server exited ({status}) before serving; its log:\n{text}");
            }
            assert!(started.elapsed() < START_BOUND, "moto's server printed no address in 60 s; its log:\n{text}");
            std::thread::sleep(Duration::from_millis(50));
        };
        server
    }

    /// What a dpcap process needs in its environment to use this server's buckets.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT", self.endpoint.as_str()),
            ("AWS_ALLOW_HTTP", "true"),
            ("AWS_ACCESS_KEY_ID", "dpcap-test"),
            ("AWS_SECRET_ACCESS_KEY", "dpcap-test-secret"),
            ("AWS_REGION", "us-east-1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    /// Creates `bucket`, keeping every version of its objects when `versioned`.
    pub fn create_bucket(&self, bucket: &str, versioned: bool) {
        self.request("PUT", &format!("/{bucket}"), "");
        if versioned {
            let body = "<VersioningConfiguration><Status>Enabled</Status></VersioningConfiguration>";
            self.request("PUT", &format!("/{bucket}?versioning"), body);
        }
    }

    /// The store at `url` (`s3://bucket/prefix`), opened with this server's settings.
    pub fn store(&self, url: &str) -> (Arc<dyn ObjectStore>, object_store::path::Path) {
        dpcap_serve::open_store_with(url, &self.env()).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Copies every file under `local` to `url`, keeping relative paths.
    pub async fn upload(&self, local: &Path, url: &str) {
        use object_store::ObjectStoreExt;
        let (store, root) = self.store(url);
        let mut pending = vec![local.to_owned()];
        while let Some(dir) = pending.pop() {
            for entry in std::fs::read_dir(&dir).expect("reading the dataset") {
                let path = entry.expect("a directory entry").path();
                if path.is_dir() {
                    pending.push(path);
                    continue;
                }
                let relative = path.strip_prefix(local).expect("under the dataset").to_string_lossy().into_owned();
                let to = object_store::path::Path::from(format!("{root}/{relative}"));
                store.put(&to, std::fs::read(&path).expect("reading a file").into()).await.expect("uploading");
            }
        }
    }

    /// One unsigned request, as the bucket admin (moto does not check signatures); panics
    /// unless it answers 2xx.
    fn request(&self, method: &str, path: &str, body: &str) {
        let host = self.endpoint.trim_start_matches("http://");
        let mut stream = std::net::TcpStream::connect(host).expect("moto's port");
        stream.set_read_timeout(Some(Duration::from_secs(30))).expect("a read timeout");
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body.as_bytes())).expect("request");
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        let status = answer.split_whitespace().nth(1).unwrap_or_default();
        assert!(status.starts_with('2'), "{method} {path} answered {answer}");
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
