//! Files found in a cache are checked against their digest before corral first uses them: a
//! shared cache may hold a blob someone else wrote or changed. A file checked once (or just
//! downloaded and checked as it streamed) is remembered in corral's own cache,
//! `verified/<16 hex of the sha256 of its path>`, with what tells that version of it apart (its
//! device, inode, size, modification and change times, and the digest): writing to a file
//! changes its change time, which no user can set, so a file changed since is read again, and
//! one unchanged is not read again on every start.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};

use super::cache_fs;
use super::verify::{sha256_hex, Hasher, Verify};
use super::FetchError;

/// Where the files checked are remembered.
pub(crate) struct Ledger {
    dir: PathBuf,
}

/// Why a file is not to be used.
pub(crate) enum Refused {
    Io(std::io::Error),
    /// Its content has another digest: `(expected, got)`.
    Mismatch(String, String),
}

impl Ledger {
    pub(crate) fn new(dir: PathBuf) -> Ledger {
        Ledger { dir }
    }

    fn entry(&self, path: &Path) -> PathBuf {
        let key = sha256_hex(path.as_os_str().as_encoded_bytes());
        self.dir.join(&key[..16])
    }

    /// Whether `path`, as it is now, was found to match `verify`; always so when there is no
    /// digest to check.
    pub(crate) fn holds(&self, path: &Path, verify: &Verify) -> bool {
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            return false;
        };
        match stamp(&meta, verify) {
            None => true,
            Some(stamp) => {
                let held = cache_fs::read_at_most(&self.entry(path), 1024).ok();
                held.is_some_and(|h| h == stamp.as_bytes())
            }
        }
    }

    /// Remembers that `path`, as it is now, matches `verify` (it was just checked); a ledger that
    /// cannot be written only means the file is read again next time.
    pub(crate) fn record(&self, path: &Path, verify: &Verify) {
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            return;
        };
        if let Some(stamp) = stamp(&meta, verify) {
            let _ = std::fs::create_dir_all(&self.dir);
            let _ = cache_fs::write_atomic(&self.entry(path), stamp.as_bytes());
        }
    }

    /// Checks `path` against `verify`, reading it whole unless the ledger holds it already. A
    /// link, or a file that is not a plain file, is refused.
    pub(crate) fn check(&self, path: &Path, verify: &Verify) -> Result<(), Refused> {
        if self.holds(path, verify) {
            return Ok(());
        }
        let file = cache_fs::open_existing(path, false).map_err(Refused::Io)?;
        let before = file.metadata().map_err(Refused::Io)?;
        if !before.is_file() {
            let detail = format!("{} is not a plain file", path.display());
            return Err(Refused::Io(std::io::Error::other(detail)));
        }
        digest_matches(&file, verify, before.len())?;
        let after = file.metadata().map_err(Refused::Io)?;
        // remembered only when nothing wrote to it while it was read
        if stamp(&before, verify) == stamp(&after, verify) {
            self.record(path, verify);
        }
        Ok(())
    }

    /// [`Ledger::check`] on a thread of its own (reading back gigabytes would hold up the
    /// runtime), one check of a file at a time: callers that wait on one find it in the ledger.
    pub(crate) async fn check_async(
        self: &Arc<Self>,
        src: &str,
        file: &str,
        path: &Path,
        verify: &Verify,
    ) -> Result<(), FetchError> {
        if self.holds(path, verify) {
            return Ok(());
        }
        let gate = gate(path);
        let _turn = gate.lock().await;
        let (ledger, at, v) = (self.clone(), path.to_path_buf(), verify.clone());
        let done = tokio::task::spawn_blocking(move || ledger.check(&at, &v))
            .await
            .map_err(|e| FetchError::invalid(src, e.to_string()))?;
        done.map_err(|why| match why {
            Refused::Io(e) => FetchError::io(src, path, e),
            Refused::Mismatch(expected, got) => FetchError::Tampered {
                src: src.to_string(),
                file: file.to_string(),
                path: path.display().to_string(),
                expected,
                got,
            },
        })
    }
}

/// The lock taken while a file is checked, one per path.
fn gate(path: &Path) -> Arc<tokio::sync::Mutex<()>> {
    static GATES: LazyLock<Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>> =
        LazyLock::new(Mutex::default);
    let mut gates = GATES.lock().unwrap_or_else(|e| e.into_inner());
    // a gate no one holds any more goes, so the map stays as small as the checks under way
    gates.retain(|_, g| Arc::strong_count(g) > 1);
    gates.entry(path.to_path_buf()).or_default().clone()
}

/// Reads `file` (of `len` bytes) whole and checks it against `verify`.
fn digest_matches(file: &std::fs::File, verify: &Verify, len: u64) -> Result<(), Refused> {
    let mut hasher = Hasher::new(verify, Some(len));
    let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match reader.read(&mut buf).map_err(Refused::Io)? {
            0 => break,
            n => hasher.update(&buf[..n]),
        }
    }
    hasher
        .check(verify)
        .map_err(|(expected, got)| Refused::Mismatch(expected, got))
}

/// What tells this version of a file apart, with the digest it matched; `None` without one.
fn stamp(meta: &std::fs::Metadata, verify: &Verify) -> Option<String> {
    let digest = match verify {
        Verify::Size => return None,
        Verify::Sha256(h) => format!("sha256:{}", h.to_ascii_lowercase()),
        Verify::GitBlob(h) => format!("git:{}", h.to_ascii_lowercase()),
        Verify::Md5(h) => format!("md5:{}", h.to_ascii_lowercase()),
    };
    Some(format!(
        "{} {} {} {}.{} {}.{} {digest}",
        meta.dev(),
        meta.ino(),
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.ctime(),
        meta.ctime_nsec()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(data: &[u8]) -> Verify {
        Verify::Sha256(sha256_hex(data))
    }

    #[test]
    fn a_file_checked_once_is_not_read_again_until_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::new(dir.path().join("verified"));
        let blob = dir.path().join("blob");
        std::fs::write(&blob, b"weights").unwrap();
        let verify = sha(b"weights");
        assert!(!ledger.holds(&blob, &verify));
        assert!(ledger.check(&blob, &verify).is_ok());
        assert!(ledger.holds(&blob, &verify));
        assert!(!ledger.holds(&blob, &sha(b"other")), "another digest");
        // the same size, another content, written since: its times tell
        std::fs::write(&blob, b"weightz").unwrap();
        let long_ago = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1000);
        let file = std::fs::File::options().write(true).open(&blob).unwrap();
        file.set_modified(long_ago).unwrap();
        assert!(!ledger.holds(&blob, &verify));
        match ledger.check(&blob, &verify) {
            Err(Refused::Mismatch(expected, got)) => {
                assert_eq!(expected, sha256_hex(b"weights"));
                assert_eq!(got, sha256_hex(b"weightz"));
            }
            _ => panic!("a changed file passed"),
        }
        assert_eq!(std::fs::read(&blob).unwrap(), b"weightz", "left as it is");
    }

    #[test]
    fn a_link_is_not_checked_through() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::new(dir.path().join("verified"));
        std::fs::write(dir.path().join("real"), b"weights").unwrap();
        let link = dir.path().join("blob");
        std::os::unix::fs::symlink(dir.path().join("real"), &link).unwrap();
        assert!(matches!(
            ledger.check(&link, &sha(b"weights")),
            Err(Refused::Io(_))
        ));
    }
}
