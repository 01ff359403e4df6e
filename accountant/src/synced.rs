//! A stored release on a local disk, synced part by part. object_store's `LocalFileSystem`
//! syncs a multipart upload once, when it completes: at P = 190M the whole 760 MB then reaches
//! the disk after the noise pass's last block, and the disk's full write time lands on the
//! release's critical path. Syncing each part as it is written lets the disk work while the
//! noise pass and the fetches run, and the final sync has one part left.
//!
//! Page-aligned bytes (the release's pooled blocks, [`crate::blocks`]) are written with
//! `O_DIRECT` where the filesystem takes it: from where they lie to the disk, with no copy into
//! the page cache, which cost more CPU per GB than the rest of the release. What is not aligned
//! (the last block's tail), and everything on a filesystem that refuses `O_DIRECT`, is written
//! through the page cache. Both reach the disk before a part's sync returns.
//!
//! The file is published whole, as `LocalFileSystem` publishes its own: written to a staging
//! file beside the destination (`NAME#DIGITS`, a name its listings skip), fsynced, renamed into
//! place, and the directory fsynced. A write that fails removes the staging file.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::blocks::ALIGN;
use crate::error::AccountantError;

fn storage(path: &Path, e: std::io::Error) -> AccountantError {
    let source = format!("{}: {e}", path.display()).into();
    AccountantError::Storage(object_store::Error::Generic { store: "LocalFileSystem", source })
}

/// The staging file's two handles and how far it is written.
#[derive(Debug)]
struct Handles {
    /// Through the page cache: unaligned bytes, the syncs.
    buffered: File,
    /// `O_DIRECT` on the same file, while the filesystem takes it.
    direct: Option<File>,
    /// Bytes written so far: where the next part goes.
    written: u64,
    /// Of those, bytes written with `O_DIRECT`.
    direct_bytes: u64,
}

impl Handles {
    /// Writes `bytes` at the end: its page-aligned prefix directly when it can, the rest (all
    /// of it, if direct writes are refused) through the page cache.
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let starts_aligned = bytes.as_ptr().align_offset(ALIGN) == 0 && self.written.is_multiple_of(ALIGN as u64);
        let aligned = if starts_aligned { bytes.len() / ALIGN * ALIGN } else { 0 };
        let mut done = 0;
        if aligned > 0
            && let Some(direct) = &self.direct
        {
            match direct.write_all_at(&bytes[..aligned], self.written) {
                Ok(()) => (done, self.direct_bytes) = (aligned, self.direct_bytes + aligned as u64),
                // The filesystem takes the flag at open but not the write (EINVAL on some, other
                // errors on FUSE and network filesystems): the page cache from now on, the same
                // range written again. A real disk error fails that write or the sync below.
                Err(e) => {
                    tracing::warn!(error = %e, "O_DIRECT write refused; writing through the page cache");
                    self.direct = None;
                }
            }
        }
        self.buffered.write_all_at(&bytes[done..], self.written + done as u64)?;
        self.written += bytes.len() as u64;
        Ok(())
    }
}

/// Opens `path` for `O_DIRECT` writes; None where the platform or filesystem refuses it.
fn open_direct(path: &Path) -> Option<File> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        File::options().write(true).custom_flags(libc::O_DIRECT).open(path).ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = path;
        None
    }
}

/// A file being written to `dest`, durable part by part, visible only once published.
#[derive(Debug)]
pub struct SyncedFile {
    handles: Option<Handles>,
    staging: PathBuf,
    dest: PathBuf,
}

impl SyncedFile {
    /// Starts the staging file for `dest` (creating its directory if needed).
    pub async fn create(dest: PathBuf) -> Result<Self, AccountantError> {
        blocking(move || {
            let dir = dest.parent().ok_or_else(|| storage(&dest, std::io::ErrorKind::InvalidInput.into()))?;
            create_dirs_synced(dir).map_err(|e| storage(dir, e))?;
            for attempt in 0u32.. {
                let mut name = dest.clone().into_os_string();
                name.push(format!("#{}{attempt}", std::process::id()));
                let staging = PathBuf::from(name);
                match owner_only(File::options().write(true).create_new(true)).open(&staging) {
                    Ok(buffered) => {
                        let direct = open_direct(&staging);
                        let handles = Handles { buffered, direct, written: 0, direct_bytes: 0 };
                        return Ok(Self { handles: Some(handles), staging, dest });
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 1000 => {}
                    Err(e) => return Err(storage(&staging, e)),
                }
            }
            unreachable!("the loop returns")
        })
        .await
    }

    /// Appends `part` and syncs it to the disk before returning.
    pub async fn append(&mut self, part: Vec<Bytes>) -> Result<(), AccountantError> {
        let mut handles = self.handles.take().expect("a file that was not published");
        let staging = self.staging.clone();
        let handles = blocking(move || {
            part.iter().try_for_each(|bytes| handles.write(bytes)).map_err(|e| storage(&staging, e))?;
            handles.buffered.sync_data().map_err(|e| storage(&staging, e))?;
            Ok(handles)
        })
        .await?;
        self.handles = Some(handles);
        Ok(())
    }

    /// Bytes written so far without a copy into the page cache (what the tests check).
    #[cfg(test)]
    pub fn direct_bytes(&self) -> u64 {
        self.handles.as_ref().map_or(0, |h| h.direct_bytes)
    }

    /// Makes the file durable under its name: synced, renamed into place, directory synced.
    pub async fn publish(mut self) -> Result<(), AccountantError> {
        let handles = self.handles.take().expect("a file that was not published");
        let (staging, dest) = (self.staging.clone(), self.dest.clone());
        blocking(move || {
            handles.buffered.sync_all().map_err(|e| storage(&staging, e))?;
            drop(handles);
            std::fs::rename(&staging, &dest).map_err(|e| storage(&dest, e))?;
            let dir = dest.parent().expect("created with a parent");
            File::open(dir).and_then(|d| d.sync_all()).map_err(|e| storage(dir, e))
        })
        .await?;
        self.staging = PathBuf::new(); // published: nothing to remove
        Ok(())
    }
}

/// Opens new files for their owner alone (0600 on Unix), as the ledger's root is (0700): what
/// the ledger holds is the accountant's, and reaches ranks only through it.
fn owner_only(options: &mut std::fs::OpenOptions) -> &mut std::fs::OpenOptions {
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(options, 0o600);
    options
}

/// Creates `dir` and any missing parents (0700), fsyncing the parent of each one created: a new
/// directory's entry is durable only once its parent is synced.
fn create_dirs_synced(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let parent = dir.parent().ok_or(std::io::ErrorKind::NotFound)?;
    create_dirs_synced(parent)?;
    let mut builder = std::fs::DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    match builder.create(dir) {
        Ok(()) => File::open(parent)?.sync_all(),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Staging files (`NAME#DIGITS`) in `dir` older than `age`: what a crash mid-write left (this
/// module's and object_store's own). Younger ones may belong to a write in progress.
pub fn stale_staging(dir: &Path, age: std::time::Duration) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let name = entry.file_name().into_string().ok()?;
            let (_, suffix) = name.split_once('#')?;
            let old = entry.metadata().ok()?.modified().ok()?.elapsed().ok()? >= age;
            (!suffix.is_empty() && suffix.bytes().all(|b| b.is_ascii_digit()) && old).then(|| entry.path())
        })
        .collect()
}

impl Drop for SyncedFile {
    fn drop(&mut self) {
        if !self.staging.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.staging); // best effort: an unpublished write
        }
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, AccountantError> + Send + 'static,
) -> Result<T, AccountantError> {
    AccountantError::blocking(f).await?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_file_is_visible_only_once_published_and_a_dropped_one_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("releases/00000000000000000001.f32");
        let mut file = SyncedFile::create(dest.clone()).await.unwrap();
        file.append(vec![Bytes::from_static(b"abcd"), Bytes::from_static(b"ef")]).await.unwrap();
        file.append(vec![Bytes::from_static(b"gh")]).await.unwrap();
        assert!(!dest.exists(), "not visible before it is published");
        file.publish().await.unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"abcdefgh");
        let entries = || std::fs::read_dir(dest.parent().unwrap()).unwrap().count();
        assert_eq!(entries(), 1, "the staging file became the release");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!((mode(&dest), mode(dest.parent().unwrap())), (0o600, 0o700), "the owner's alone");
        }

        let mut dropped = SyncedFile::create(dir.path().join("releases/00000000000000000002.f32")).await.unwrap();
        dropped.append(vec![Bytes::from_static(b"xy")]).await.unwrap();
        drop(dropped);
        assert_eq!(entries(), 1, "an unpublished write leaves no file behind");
    }

    /// Whether `dir`'s filesystem takes an aligned `O_DIRECT` write (ext4 and xfs do, tmpfs not).
    fn takes_direct_writes(dir: &Path) -> bool {
        let path = dir.join("probe");
        File::create(&path).unwrap();
        let pool = crate::blocks::BlockPool::new(ALIGN / 4);
        let block = pool.block(ALIGN / 4).into_bytes();
        let taken = open_direct(&path).is_some_and(|f| f.write_all_at(&block, 0).is_ok());
        std::fs::remove_file(path).unwrap();
        taken
    }

    #[tokio::test]
    async fn aligned_blocks_go_to_the_disk_directly_and_an_unaligned_tail_through_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let pool = crate::blocks::BlockPool::new(3 * ALIGN / 4);
        let blocks: Vec<Bytes> = (0..3u8)
            .map(|b| {
                let mut block = pool.block(3 * ALIGN / 4);
                block.values_mut().iter_mut().enumerate().for_each(|(i, v)| *v = f32::from(b) * 1e4 + i as f32);
                block.into_bytes()
            })
            .collect();
        // Two whole blocks, then the third cut mid-page, as a release's last block is.
        let tail = blocks[2].slice(..ALIGN + 12);
        let dest = dir.path().join("releases/00000000000000000004.f32");
        let mut file = SyncedFile::create(dest.clone()).await.unwrap();
        file.append(vec![blocks[0].clone(), blocks[1].clone()]).await.unwrap();
        file.append(vec![tail.clone()]).await.unwrap();
        let direct = file.direct_bytes();
        file.publish().await.unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), [&blocks[0][..], &blocks[1][..], &tail[..]].concat());
        if takes_direct_writes(dir.path()) {
            assert_eq!(direct, 2 * 3 * ALIGN as u64 + ALIGN as u64, "every whole aligned page, directly");
        } else {
            assert_eq!(direct, 0);
        }
    }

    #[tokio::test]
    async fn bytes_that_are_not_page_aligned_are_written_through_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("releases/00000000000000000005.f32");
        let unaligned = Bytes::from(vec![7u8; 3 * ALIGN + 1]).slice(1..);
        let mut file = SyncedFile::create(dest.clone()).await.unwrap();
        file.append(vec![unaligned.clone()]).await.unwrap();
        assert_eq!(file.direct_bytes(), 0);
        file.publish().await.unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), unaligned);
    }

    #[tokio::test]
    async fn only_staging_files_older_than_the_age_are_stale() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["00000000000000000003.f32#12", "00000000000000000003.f32", "notes#draft"] {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        assert!(stale_staging(dir.path(), std::time::Duration::from_secs(600)).is_empty(), "too young");
        let stale = stale_staging(dir.path(), std::time::Duration::ZERO);
        assert_eq!(stale, vec![dir.path().join("00000000000000000003.f32#12")]);
    }
}
