//! The local cache: whole objects (shards, images) and shard indexes kept in a folder, so a later
//! epoch, a later run or another process on the machine reads them from disk.
//!
//! An entry's name holds a hash of its URL, a hash of its ETag and its size, so an object that
//! changes in the store is a different entry, and an entry is used only if its size is that
//! size. An object's entry ends with a CRC-32 of its bytes, checked the first time a process
//! uses the entry: a copy damaged on the disk is removed and read from the store again, never
//! decoded. Entries are written to a temporary file of the writer's own and renamed into place, so
//! no reader ever sees one half-written, and two processes writing the same entry both leave a
//! whole one. Objects without an ETag are not cached (nothing would tell a changed one). The
//! cache only grows, up to its limit (counted from the folder when it is opened and again when
//! the count says it is full, so other processes' entries are counted too); what no longer fits
//! is read from the store each time.

use std::collections::HashSet;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// Temporary files start so; any left by a process that died are removed after a day.
const TEMPORARY: &str = ".partial-";

/// What ends an object's entry after its bytes: their CRC-32 (little-endian), then this.
const TRAILER_MAGIC: &[u8; 4] = b"gfc1";

/// Bytes of an object entry's trailer.
const TRAILER: u64 = 8;

/// An entry found damaged (cut short, or its bytes not those it was written with): removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Damaged;

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
    /// Object entries this process has checked (or written) whole.
    checked: Mutex<HashSet<PathBuf>>,
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
            checked: Mutex::new(HashSet::new()),
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

    /// The cached copy of an object, if there is one: a file whose first `size` bytes are the
    /// object's (its trailer's CRC-32 checked the first time this process uses it), or
    /// [`Damaged`] when the entry is there but not whole (then removed). Blocks while it reads.
    pub fn object(
        &self,
        url: &str,
        etag: Option<&str>,
        size: u64,
    ) -> Option<Result<PathBuf, Damaged>> {
        let path = self.entry(url, etag, size, Kind::Object)?;
        let meta = fs::metadata(&path).ok()?;
        if !meta.is_file() {
            return None;
        }
        let checked = |c: &Mutex<HashSet<PathBuf>>| {
            c.lock().unwrap_or_else(|p| p.into_inner()).contains(&path)
        };
        if meta.len() == size + TRAILER && (checked(&self.checked) || whole(&path, size)) {
            self.checked
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(path.clone());
            return Some(Ok(path));
        }
        let _ = fs::remove_file(&path);
        self.release(meta.len());
        Some(Err(Damaged))
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
        let trailer = match kind {
            Kind::Object => {
                let mut t = crc32fast::hash(bytes).to_le_bytes().to_vec();
                t.extend_from_slice(TRAILER_MAGIC);
                t
            }
            Kind::Index => Vec::new(),
        };
        let length = (bytes.len() + trailer.len()) as u64;
        if !self.reserve(length)? {
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
            file.write_all(&trailer)?;
            file.sync_data()?;
            // Over an entry there already (another process's, or a damaged index).
            fs::rename(&temporary, &path)
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&temporary);
            self.release(length);
            return Err(e);
        }
        if kind == Kind::Object {
            self.checked
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(path.clone());
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

/// Whether the entry at `path` holds `size` bytes followed by their CRC-32 and the magic.
fn whole(path: &Path, size: u64) -> bool {
    let check = || -> std::io::Result<bool> {
        let mut file = fs::File::open(path)?;
        let mut hasher = crc32fast::Hasher::new();
        let mut buffer = vec![0u8; 1 << 20];
        let mut left = size;
        while left > 0 {
            let want = left.min(buffer.len() as u64) as usize;
            file.read_exact(&mut buffer[..want])?;
            hasher.update(&buffer[..want]);
            left -= want as u64;
        }
        let mut trailer = [0u8; TRAILER as usize];
        file.read_exact(&mut trailer)?;
        Ok(trailer[..4] == hasher.finalize().to_le_bytes() && &trailer[4..] == TRAILER_MAGIC)
    };
    check().unwrap_or(false)
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
        let cache = Cache::open(&dir, 20).unwrap();
        let url = "s3://b/k.tar";
        assert!(cache.object(url, Some("e1"), 4).is_none());
        let path = cache
            .store(url, Some("e1"), 4, Kind::Object, b"abcd")
            .unwrap()
            .expect("room");
        assert_eq!(&fs::read(&path).unwrap()[..4], b"abcd");
        assert_eq!(cache.object(url, Some("e1"), 4), Some(Ok(path.clone())));
        // Another ETag or size is another entry; no ETag, no entry.
        assert!(cache.object(url, Some("e2"), 4).is_none());
        assert!(cache.object(url, Some("e1"), 5).is_none());
        assert!(cache
            .store(url, None, 4, Kind::Object, b"abcd")
            .unwrap()
            .is_none());
        // 12 of 20 bytes used (4 and the trailer): 7 more (15 with theirs) do not fit, counted
        // again from the folder.
        assert!(cache
            .store("s3://b/other", Some("e"), 7, Kind::Object, &[0; 7])
            .unwrap()
            .is_none());
        assert!(cache
            .store("s3://b/small", Some("e"), 0, Kind::Object, &[])
            .unwrap()
            .is_some());
        // A second process's view counts both.
        let again = Cache::open(&dir, 20).unwrap();
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

    #[test]
    fn a_damaged_entry_is_removed_never_used() {
        let dir = folder("damaged");
        let url = "s3://b/k.tar";
        let write = || {
            let cache = Cache::open(&dir, u64::MAX).unwrap();
            let path = cache
                .store(url, Some("e"), 6, Kind::Object, b"abcdef")
                .unwrap()
                .expect("room");
            (cache, path)
        };
        // A flipped byte, seen by a process that did not write the entry.
        let (_, path) = write();
        let mut bytes = fs::read(&path).unwrap();
        bytes[2] ^= 0x20;
        fs::write(&path, &bytes).unwrap();
        let reader = Cache::open(&dir, u64::MAX).unwrap();
        assert_eq!(reader.object(url, Some("e"), 6), Some(Err(Damaged)));
        assert!(!path.exists(), "removed");
        assert!(reader.object(url, Some("e"), 6).is_none());
        // Cut short, or with no trailer (an entry of an older build): damaged too.
        for cut in [10, 6] {
            let (_, path) = write();
            let bytes = fs::read(&path).unwrap();
            fs::write(&path, &bytes[..cut]).unwrap();
            let reader = Cache::open(&dir, u64::MAX).unwrap();
            assert_eq!(
                reader.object(url, Some("e"), 6),
                Some(Err(Damaged)),
                "{cut}"
            );
        }
        // Whole: used, and checked once.
        let (_, path) = write();
        let reader = Cache::open(&dir, u64::MAX).unwrap();
        assert_eq!(reader.object(url, Some("e"), 6), Some(Ok(path.clone())));
        assert!(reader.checked.lock().unwrap().contains(&path));
        fs::remove_dir_all(&dir).unwrap();
    }
}
