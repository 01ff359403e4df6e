//! A stored release on a local disk, synced part by part. object_store's `LocalFileSystem`
//! syncs a multipart upload once, when it completes: at P = 190M the whole 760 MB then reaches
//! the disk after the noise pass's last block, and the disk's full write time lands on the
//! release's critical path. Syncing each part as it is written lets the disk work while the
//! noise pass and the fetches run, and the final sync has one part left.
//!
//! The file is published whole, as `LocalFileSystem` publishes its own: written to a staging
//! file beside the destination (`NAME#DIGITS`, a name its listings skip), fsynced, renamed into
//! place, and the directory fsynced. A write that fails removes the staging file.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::error::AccountantError;

fn storage(path: &Path, e: std::io::Error) -> AccountantError {
    let source = format!("{}: {e}", path.display()).into();
    AccountantError::Storage(object_store::Error::Generic { store: "LocalFileSystem", source })
}

/// A file being written to `dest`, durable part by part, visible only once published.
#[derive(Debug)]
pub struct SyncedFile {
    file: Option<File>,
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
                match File::options().write(true).create_new(true).open(&staging) {
                    Ok(file) => return Ok(Self { file: Some(file), staging, dest }),
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
        let mut file = self.file.take().expect("a file that was not published");
        let staging = self.staging.clone();
        let file = blocking(move || {
            part.iter().try_for_each(|bytes| file.write_all(bytes)).map_err(|e| storage(&staging, e))?;
            file.sync_data().map_err(|e| storage(&staging, e))?;
            Ok(file)
        })
        .await?;
        self.file = Some(file);
        Ok(())
    }

    /// Makes the file durable under its name: synced, renamed into place, directory synced.
    pub async fn publish(mut self) -> Result<(), AccountantError> {
        let file = self.file.take().expect("a file that was not published");
        let (staging, dest) = (self.staging.clone(), self.dest.clone());
        blocking(move || {
            file.sync_all().map_err(|e| storage(&staging, e))?;
            drop(file);
            std::fs::rename(&staging, &dest).map_err(|e| storage(&dest, e))?;
            let dir = dest.parent().expect("created with a parent");
            File::open(dir).and_then(|d| d.sync_all()).map_err(|e| storage(dir, e))
        })
        .await?;
        self.staging = PathBuf::new(); // published: nothing to remove
        Ok(())
    }
}

/// Creates `dir` and any missing parents, fsyncing the parent of each one created: a new
/// directory's entry is durable only once its parent is synced.
fn create_dirs_synced(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let parent = dir.parent().ok_or(std::io::ErrorKind::NotFound)?;
    create_dirs_synced(parent)?;
    match std::fs::create_dir(dir) {
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

        let mut dropped = SyncedFile::create(dir.path().join("releases/00000000000000000002.f32")).await.unwrap();
        dropped.append(vec![Bytes::from_static(b"xy")]).await.unwrap();
        drop(dropped);
        assert_eq!(entries(), 1, "an unpublished write leaves no file behind");
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
