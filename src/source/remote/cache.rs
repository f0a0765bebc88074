//! The local cache: whole objects (shards, images) and shard indexes kept in a folder, so a later
//! epoch, a later run or another process on the machine reads them from disk.
//!
//! An entry's name holds a hash of its URL, a hash of its ETag and its size, so an object that
//! changes in the store is a different entry, and an entry is used only if its size is that
//! size. Entries are written to a temporary file of the writer's own and renamed into place, so
//! no reader ever sees one half-written, and two processes writing the same entry both leave a
//! whole one. Objects without an ETag are not cached (nothing would tell a changed one). The
//! cache only grows, up to its limit (counted from the folder when it is opened and again when
//! the count says it is full, so other processes' entries are counted too); what no longer fits
//! is read from the store each time.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// Temporary files start so; any left by a process that died are removed after a day.
const TEMPORARY: &str = ".partial-";

/// What an entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// The object's bytes.
    Object,
    /// The index of a tar shard's samples.
    Index,
}

/// A cache folder and its limit.
#[derive(Debug)]
pub(super) struct Cache {
    dir: PathBuf,
    limit: u64,
    /// Bytes the folder's entries hold, as last counted plus what this process added since.
    used: Mutex<u64>,
    /// Numbers this process's temporary files.
    written: AtomicU64,
}

impl Cache {
    /// Opens (creating it if needed) the cache folder `dir`, holding at most `limit` bytes.
    pub fn open(dir: &Path, limit: u64) -> std::io::Result<Cache> {
        fs::create_dir_all(dir)?;
        let cache = Cache {
            dir: dir.to_path_buf(),
            limit,
            used: Mutex::new(0),
            written: AtomicU64::new(0),
        };
        let used = cache.count()?;
        *cache.used.lock().unwrap_or_else(|p| p.into_inner()) = used;
        Ok(cache)
    }

    /// The entry of the object at `url` with this ETag and size; `None` for objects without an
    /// ETag.
    fn entry(&self, url: &str, etag: Option<&str>, size: u64, kind: Kind) -> Option<PathBuf> {
        let etag = etag?;
        let suffix = match kind {
            Kind::Object => "",
            Kind::Index => ".index",
        };
        Some(self.dir.join(format!(
            "{:016x}-{:016x}-{size}{suffix}",
            fnv1a(url.as_bytes()),
            fnv1a(etag.as_bytes())
        )))
    }

    /// The cached copy of an object, if there is a whole one: a file of exactly `size` bytes.
    pub fn object(&self, url: &str, etag: Option<&str>, size: u64) -> Option<PathBuf> {
        let path = self.entry(url, etag, size, Kind::Object)?;
        let meta = fs::metadata(&path).ok()?;
        (meta.is_file() && meta.len() == size).then_some(path)
    }

    /// The cached index of a shard, if there is one.
    pub fn index(&self, url: &str, etag: Option<&str>, size: u64) -> Option<Vec<u8>> {
        fs::read(self.entry(url, etag, size, Kind::Index)?).ok()
    }

    /// Keeps `bytes` as the entry of this kind for the object, if it has an ETag and the cache
    /// has room; returns the entry's path when it is there. A failure to write leaves no entry.
    pub fn store(
        &self,
        url: &str,
        etag: Option<&str>,
        size: u64,
        kind: Kind,
        bytes: &[u8],
    ) -> std::io::Result<Option<PathBuf>> {
        let Some(path) = self.entry(url, etag, size, kind) else {
            return Ok(None);
        };
        if fs::metadata(&path).is_ok_and(|m| m.len() == bytes.len() as u64) {
            return Ok(Some(path));
        }
        if !self.reserve(bytes.len() as u64)? {
            return Ok(None);
        }
        let temporary = self.dir.join(format!(
            "{TEMPORARY}{}-{}",
            std::process::id(),
            self.written.fetch_add(1, Ordering::Relaxed)
        ));
        let written = (|| {
            let mut file = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&temporary)?;
            file.write_all(bytes)?;
            file.sync_data()?;
            fs::rename(&temporary, &path)
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&temporary);
            self.release(bytes.len() as u64);
            return Err(e);
        }
        Ok(Some(path))
    }

    /// Counts `bytes` in if they fit under the limit (recounting the folder before refusing).
    fn reserve(&self, bytes: u64) -> std::io::Result<bool> {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        if used.saturating_add(bytes) > self.limit {
            *used = self.count()?;
            if used.saturating_add(bytes) > self.limit {
                return Ok(false);
            }
        }
        *used += bytes;
        Ok(true)
    }

    fn release(&self, bytes: u64) {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        *used = used.saturating_sub(bytes);
    }

    /// Bytes the folder's entries and temporary files hold; temporary files older than a day
    /// (left by a process that died while writing) are removed.
    fn count(&self) -> std::io::Result<u64> {
        let mut total = 0;
        for entry in fs::read_dir(&self.dir)? {
            let entry = entry?;
            let Ok(meta) = entry.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            let stale = entry.file_name().to_string_lossy().starts_with(TEMPORARY)
                && meta
                    .modified()
                    .ok()
                    .and_then(|m| SystemTime::now().duration_since(m).ok())
                    .is_some_and(|age| age > Duration::from_secs(24 * 3600));
            if stale {
                let _ = fs::remove_file(entry.path());
                continue;
            }
            total += meta.len();
        }
        Ok(total)
    }
}

/// FNV-1a, 64 bits: a stable hash for entry names.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("gpufeed-cache-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn entries_are_kept_by_url_etag_and_size_up_to_the_limit() {
        let dir = folder("limit");
        let cache = Cache::open(&dir, 10).unwrap();
        let url = "s3://b/k.tar";
        assert!(cache.object(url, Some("e1"), 4).is_none());
        let path = cache
            .store(url, Some("e1"), 4, Kind::Object, b"abcd")
            .unwrap()
            .expect("room");
        assert_eq!(fs::read(&path).unwrap(), b"abcd");
        assert_eq!(cache.object(url, Some("e1"), 4), Some(path.clone()));
        // Another ETag or size is another entry; no ETag, no entry.
        assert!(cache.object(url, Some("e2"), 4).is_none());
        assert!(cache.object(url, Some("e1"), 5).is_none());
        assert!(cache
            .store(url, None, 4, Kind::Object, b"abcd")
            .unwrap()
            .is_none());
        // An entry cut short is not used.
        fs::write(&path, b"ab").unwrap();
        assert!(cache.object(url, Some("e1"), 4).is_none());
        fs::write(&path, b"abcd").unwrap();
        // 4 of 10 bytes used: 7 more do not fit, counted again from the folder.
        assert!(cache
            .store("s3://b/other", Some("e"), 7, Kind::Object, &[0; 7])
            .unwrap()
            .is_none());
        assert!(cache
            .store("s3://b/small", Some("e"), 6, Kind::Object, &[0; 6])
            .unwrap()
            .is_some());
        // A second process's view counts both.
        let again = Cache::open(&dir, 10).unwrap();
        assert!(again
            .store("s3://b/third", Some("e"), 1, Kind::Object, &[0; 1])
            .unwrap()
            .is_none());
        // No temporary file is left.
        let names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.starts_with(TEMPORARY)), "{names:?}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
