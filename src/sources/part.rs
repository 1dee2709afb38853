//! The partial file beside a download's destination (`<dest>.incomplete`, the suffix the Hub's
//! own client uses) and the version of the file it holds (`<dest>.incomplete.version`), so that
//! a later run resumes it only while the source still serves that version.

use std::path::{Path, PathBuf};

use super::cache_fs;

/// The partial file beside `dest`.
pub(crate) fn partial(dest: &Path) -> PathBuf {
    let mut name = dest.file_name().unwrap_or_default().to_os_string();
    name.push(".incomplete");
    dest.with_file_name(name)
}

/// Bytes of `dest` already held in its partial file (none when that is not a plain file).
pub(crate) fn held(dest: &Path) -> u64 {
    std::fs::symlink_metadata(partial(dest))
        .ok()
        .filter(|m| m.is_file())
        .map_or(0, |m| m.len())
}

/// The bytes of `part` already held: none when there is no part, an error naming it when it is a
/// link (whose target a resume would write to) or not a plain file.
pub(crate) fn held_part(part: &Path) -> std::io::Result<u64> {
    match std::fs::symlink_metadata(part) {
        Ok(m) if m.file_type().is_symlink() => Err(cache_fs::linked(part)),
        Ok(m) if !m.is_file() => Err(std::io::Error::other("not a plain file; remove it")),
        Ok(m) => Ok(m.len()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

/// Removes a partial file and the version it was recorded to hold.
pub(crate) fn remove_partial(part: &Path) {
    let _ = std::fs::remove_file(part);
    let _ = std::fs::remove_file(version_file(part));
}

/// Where the version of the file a partial file holds is kept (`<dest>.incomplete.version`), so
/// that a later run resumes it only while the source still serves that version.
pub(crate) fn version_file(part: &Path) -> PathBuf {
    let mut name = part.as_os_str().to_os_string();
    name.push(".version");
    name.into()
}

/// The version a partial file was recorded to hold: a short line, never read through a link
/// (it goes to the server with the resume).
pub(crate) fn read_version(part: &Path) -> Option<String> {
    let data = cache_fs::read_at_most(&version_file(part), 1024).ok()?;
    String::from_utf8(data).ok()
}

/// Records (or, when the source names none, forgets) the version a partial file holds.
pub(crate) fn record_version(part: &Path, version: Option<&str>) {
    let file = version_file(part);
    let _ = match version {
        Some(v) => cache_fs::write_atomic(&file, v.as_bytes()),
        None => std::fs::remove_file(&file),
    };
}
