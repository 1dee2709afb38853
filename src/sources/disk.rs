//! Free space, checked before a download so a full disk is reported up front rather than as a
//! write error half way through a 40 GB file.

use std::path::{Path, PathBuf};

use super::FetchError;

/// Bytes available to this user on the file system that holds `dir` (or its nearest existing
/// ancestor, as a cache directory may not exist yet).
pub(crate) fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    let mut at: PathBuf = dir.to_path_buf();
    while !at.exists() {
        match at.parent() {
            Some(p) => at = p.to_path_buf(),
            None => break,
        }
    }
    let stat = nix::sys::statvfs::statvfs(&at).map_err(std::io::Error::from)?;
    Ok((stat.blocks_available() as u64).saturating_mul(stat.fragment_size() as u64))
}

/// An error when `need` more bytes do not fit in `dir`.
pub(crate) fn ensure_room(src: &str, dir: &Path, need: u64) -> Result<(), FetchError> {
    if need == 0 {
        return Ok(());
    }
    let free = free_bytes(dir).map_err(|e| FetchError::io(src, dir, e))?;
    if need > free {
        return Err(FetchError::DiskFull {
            src: src.to_string(),
            dir: dir.display().to_string(),
            need,
            free,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_than_free_is_refused_with_both_numbers() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("not/yet/made");
        let free = free_bytes(&missing).unwrap();
        assert!(free > 0);
        assert!(ensure_room("hf://a/b", &missing, 1).is_ok());
        let err = ensure_room("hf://a/b", &missing, free + (1 << 40)).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, FetchError::DiskFull { .. }), "{text}");
        assert!(text.contains(&format!("{}", free + (1 << 40))), "{text}");
        assert!(
            text.contains("not/yet/made") && text.contains("hf://a/b"),
            "{text}"
        );
    }
}
