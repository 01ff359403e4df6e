//! Object stores by location: a local directory (created if missing) or a URL (`file://`, and
//! `s3://`, `gs://`, `az://` with the matching object_store features). The ledger, job store,
//! secrets, checkpoints and datasets all open theirs here.

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use object_store::path::Path;

/// A store location that could not be opened (or an object in it read).
#[derive(Debug, thiserror::Error)]
#[error("cannot open store {url}: {source}")]
pub struct StoreError {
    /// The location given, as [`shown`] (no credentials, query or fragment: it reaches logs).
    pub url: String,
    /// Why (boxed: an object store's error is large, and this one travels in many others).
    pub source: Box<StoreProblem>,
}

/// Why a store location could not be opened or read.
#[derive(Debug, thiserror::Error)]
pub enum StoreProblem {
    /// No location was given.
    #[error("empty location")]
    Empty,
    /// A local directory to read from that does not exist.
    #[error("no such directory")]
    NoDirectory,
    /// The local file system refused.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Not a URL.
    #[error(transparent)]
    Url(#[from] url::ParseError),
    /// The object store refused (or the object is missing).
    #[error(transparent)]
    Store(#[from] object_store::Error),
}

impl StoreError {
    fn new(url: &str, source: impl Into<StoreProblem>) -> Self {
        Self { url: shown(url), source: Box::new(source.into()) }
    }
}

/// `location` fit to show (a log line, a metric label): a URL without its user, password,
/// query or fragment (a presigned URL's signature); a path as it is.
pub fn shown(location: &str) -> String {
    match url::Url::parse(location) {
        Ok(mut url) => {
            let _ = url.set_username("");
            let _ = url.set_password(None);
            url.set_query(None);
            url.set_fragment(None);
            url.to_string()
        }
        Err(_) => location.to_owned(),
    }
}

/// Opens `location` for writing, returning the store and the root path inside it (a local
/// directory is created if missing).
pub fn open_store(location: &str) -> Result<(Arc<dyn ObjectStore>, Path), StoreError> {
    open(location, false, true, None)
}

/// [`open_store`] configured by `options` (object_store's keys, as the environment
/// names them: `AWS_ENDPOINT`, `AWS_ACCESS_KEY_ID`, ...) instead of the process environment: for a tool that holds several
/// stores' settings at once.
pub fn open_store_with(
    location: &str,
    options: &[(String, String)],
) -> Result<(Arc<dyn ObjectStore>, Path), StoreError> {
    open(location, false, true, Some(options))
}

/// [`open_store`] with cloud settings of its own: object_store's variable names behind
/// `prefix` (`{prefix}AWS_ACCESS_KEY_ID`, ...), when any such variable is set, and nothing of
/// the process's other settings; otherwise the process environment, as [`open_store`]. A store
/// that must not share the credentials of another (the coordinator's secrets, which workers
/// must never reach) opens here.
pub fn open_store_prefixed(location: &str, prefix: &str) -> Result<(Arc<dyn ObjectStore>, Path), StoreError> {
    let own: Vec<(String, String)> =
        std::env::vars().filter_map(|(k, v)| Some((k.strip_prefix(prefix)?.to_owned(), v))).collect();
    if own.is_empty() {
        if local_directory(location).is_none() {
            tracing::warn!(
                store = %shown(location),
                "this store uses the process's cloud settings, shared with the other stores; set {prefix}* for its own"
            );
        }
        return open_store(location);
    }
    open_store_with(location, &own)
}

/// Keeps a local store's directory and files to their owner (0700 and 0600): what it holds
/// (keys, secrets, a ledger's audit canaries) is for this process alone. Warns, naming `what`,
/// when the store already held something while its directory was open to group or others (a
/// store made under a wide umask, or copied in): what was in it may have been read. Entries
/// below a restricted root are restricted too, silently: nobody else can reach them. Returns
/// whether it warned. Nothing for a cloud URL (its bucket's policy decides) or off Unix.
pub fn restrict_local(location: &str, what: &str) -> bool {
    #[cfg(unix)]
    if let Some(dir) = local_directory(location) {
        use std::os::unix::fs::PermissionsExt;
        let root = std::path::Path::new(dir);
        let entries = walk(root);
        let open = std::fs::metadata(root).is_ok_and(|m| m.permissions().mode() & 0o077 != 0);
        let warned = open && !entries.is_empty();
        if warned {
            tracing::warn!(
                store = what,
                path = %root.display(),
                entries = entries.len(),
                "this store was readable by group or others with data in it; restricted it to its owner (0700/0600)"
            );
        }
        for path in std::iter::once(root.to_path_buf()).chain(entries) {
            let mode = if path.is_dir() { 0o700 } else { 0o600 };
            if let Err(e) = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)) {
                tracing::warn!(path = %path.display(), error = %e, "could not restrict a secret's permissions");
            }
        }
        return warned;
    }
    #[cfg(not(unix))]
    let _ = (location, what);
    false
}

/// Every file and directory under `root`.
#[cfg(unix)]
fn walk(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for path in entries.filter_map(|e| Some(e.ok()?.path())) {
            if path.is_dir() {
                pending.push(path.clone());
            }
            out.push(path);
        }
    }
    out
}

/// Opens `location` to read what is already there: a local directory must exist. Locations
/// that come from requests (a job's dataset) open here, so that naming a path never creates it.
pub fn open_existing_store(location: &str) -> Result<(Arc<dyn ObjectStore>, Path), StoreError> {
    open(location, false, false, None)
}

/// The bytes of one existing object named by `location`: a file path or an object URL (its
/// directory opens as a store, its last segment is the object). Tokenizers and other single
/// files that a job names are read here, by the coordinator and the workers alike.
pub async fn read_object(location: &str) -> Result<bytes::Bytes, StoreError> {
    use object_store::ObjectStoreExt;
    let (dir, file) = location.rsplit_once('/').unwrap_or((".", location));
    let (store, root) = open_existing_store(if dir.is_empty() { "/" } else { dir })?;
    let path = Path::from(format!("{root}/{file}").trim_start_matches('/'));
    let read = async { store.get(&path).await?.bytes().await };
    read.await.map_err(|e| StoreError::new(location, e))
}

/// Opens `location` for records that must survive a machine crash, not only a process crash:
/// a local directory fsyncs every written file and its directory before a write returns (cloud
/// object stores are durable once a put succeeds). The ledger's charges are such records: a
/// charge lost with the page cache would leave a released step unaccounted.
pub fn open_durable_store(location: &str) -> Result<(Arc<dyn ObjectStore>, Path), StoreError> {
    open(location, true, true, None)
}

/// [`open_durable_store`] for a local directory, as the concrete store (the ledger writes its
/// largest objects to the file system itself, to sync them while they are written); None for
/// a cloud URL.
pub fn open_durable_local(location: &str) -> Result<Option<Arc<LocalFileSystem>>, StoreError> {
    local_directory(location).map(|dir| open_local(location, dir, true, true).map(Arc::new)).transpose()
}

/// The directory a location names, if it is local (a path or a `file://` URL).
fn local_directory(location: &str) -> Option<&str> {
    (!location.contains("://") || location.starts_with("file://"))
        .then(|| location.strip_prefix("file://").unwrap_or(location))
}

fn open_local(location: &str, dir: &str, fsync: bool, create: bool) -> Result<LocalFileSystem, StoreError> {
    if location.is_empty() {
        return Err(StoreError::new(location, StoreProblem::Empty));
    }
    if create {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::new(location, e))?;
    } else if !std::path::Path::new(dir).is_dir() {
        return Err(StoreError::new(location, StoreProblem::NoDirectory));
    }
    Ok(LocalFileSystem::new_with_prefix(dir).map_err(|e| StoreError::new(location, e))?.with_fsync(fsync))
}

fn open(
    location: &str,
    fsync: bool,
    create: bool,
    options: Option<&[(String, String)]>,
) -> Result<(Arc<dyn ObjectStore>, Path), StoreError> {
    if location.is_empty() {
        return Err(StoreError::new(location, StoreProblem::Empty));
    }
    if let Some(dir) = local_directory(location) {
        return Ok((Arc::new(open_local(location, dir, fsync, create)?), Path::default()));
    }
    let url = url::Url::parse(location).map_err(|e| StoreError::new(location, e))?;
    install_tls_provider();
    // Cloud stores read their configuration from the environment, as object_store names it
    // (AWS_ACCESS_KEY_ID, AWS_REGION, AWS_ENDPOINT, GOOGLE_SERVICE_ACCOUNT,
    // AZURE_STORAGE_ACCOUNT_NAME, ...); without it they fall back to the platform's
    // instance credentials. Unknown variables are ignored.
    let parsed = match options {
        Some(options) => object_store::parse_url_opts(&url, options.iter().map(|(k, v)| (k, v))),
        None => object_store::parse_url_opts(&url, std::env::vars()),
    };
    let (store, root): (Box<dyn ObjectStore>, Path) = parsed.map_err(|e| StoreError::new(location, e))?;
    Ok((Arc::from(store), root))
}

/// object_store's HTTP client takes rustls's process-wide provider (the `cloud` feature builds
/// reqwest without one of its own): ring, as the gRPC TLS uses. Installing it twice is a no-op.
#[cfg(feature = "cloud")]
fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(not(feature = "cloud"))]
fn install_tls_provider() {}

#[cfg(test)]
mod tests {
    #[test]
    fn a_location_shown_keeps_no_credential_of_its_url_and_a_path_as_it_is() {
        assert_eq!(super::shown("s3://key:secret@bucket/laion?X-Amz-Signature=abc#f"), "s3://bucket/laion");
        assert_eq!(super::shown("./data/train"), "./data/train");
        assert_eq!(super::shown("/abs/data"), "/abs/data");
    }
}
