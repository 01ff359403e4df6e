//! A test's working directory, with what a failure needs: on a panic the tail of every
//! component log in it is printed (libtest shows it under the failed test) and the directory is
//! kept; on success it is removed. A watchdog turns a hang into a failure: past its deadline it
//! prints the logs and ends the test process, so CI reports the stuck test instead of timing
//! out.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long one test may take before its watchdog ends the test process.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(600);

/// Lines of each log printed after a failure.
const TAIL_LINES: usize = 60;

/// Set (to anything) to keep every test's directory, passed or not: `scripts/loop-e2e.sh`
/// keeps the component logs of the runs that were slow.
pub const KEEP_ENV: &str = "DPCAP_E2E_KEEP_DIRS";

/// A fresh directory for one test (see the module docs).
#[derive(Debug)]
pub struct TestDir {
    path: PathBuf,
    done: Arc<AtomicBool>,
}

impl TestDir {
    /// `$TMPDIR/dpcap-e2e-NAME-PID`, emptied, watched for [`DEFAULT_DEADLINE`].
    pub fn new(name: &str) -> Self {
        Self::with_deadline(name, DEFAULT_DEADLINE)
    }

    /// As [`TestDir::new`], with a deadline of its own (long campaigns).
    pub fn with_deadline(name: &str, deadline: Duration) -> Self {
        let path = std::env::temp_dir().join(format!("dpcap-e2e-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("creating the test directory");
        let done = Arc::new(AtomicBool::new(false));
        let (watched, flag, name) = (path.clone(), done.clone(), name.to_owned());
        std::thread::spawn(move || {
            let started = Instant::now();
            while started.elapsed() < deadline {
                if flag.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            eprintln!("test {name} still running after {} s: treated as a hang", deadline.as_secs());
            print_logs(&watched);
            std::process::exit(101);
        });
        Self { path, done }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl std::ops::Deref for TestDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for TestDir {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
        if std::thread::panicking() {
            print_logs(&self.path);
            eprintln!("kept for inspection: {}", self.path.display());
        } else if std::env::var_os(KEEP_ENV).is_none() {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Prints the last lines of every `*.log` directly in `dir`.
pub fn print_logs(dir: &Path) {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    logs.sort();
    for log in logs {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        eprintln!("---- {} (last {} of {} lines)", log.display(), TAIL_LINES.min(lines.len()), lines.len());
        for line in &lines[lines.len().saturating_sub(TAIL_LINES)..] {
            eprintln!("{line}");
        }
    }
}
