//! Files in caches that other users may write too (a shared `HF_HOME` or `OLLAMA_MODELS`): what
//! corral writes there never goes through a symbolic link it did not make, so a link planted in
//! the cache cannot turn a download into a write to a file of someone else's choosing, and what
//! it reads there is read to a bound.

use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path};

/// The most of a JSON document read into memory, from a server (the Hub's listing of a revision,
/// an Ollama manifest) or from a cache (a manifest, a shard index): the listing of a repository
/// of 30,000 files takes some 8 MiB, an Ollama manifest a kilobyte. Past it the answer is refused
/// rather than held whole, however long it is.
pub(crate) const JSON_AT_MOST: usize = 8 << 20;

/// How the names of files being written beside their place begin (the rest is random).
pub(crate) const TMP: &str = ".corral-tmp.";

/// The error for a symbolic link where corral makes or writes a file or folder of its own.
pub(crate) fn linked(path: &Path) -> io::Error {
    io::Error::other(format!(
        "{} is a symbolic link that corral did not make; a link there could send a download \
         into any file, so corral does not follow it: remove it (and find out who made it)",
        path.display()
    ))
}

/// Makes `dir` and each folder between `root` and it, refusing any that is a symbolic link or
/// not a folder. `root` is the cache as configured and is taken as it is (a link to another
/// disk, say); below it every folder is corral's or another cache tool's, never a link.
pub(crate) fn make_dirs(root: &Path, dir: &Path) -> io::Result<()> {
    let rel = dir.strip_prefix(root).map_err(|_| {
        io::Error::other(format!(
            "{} is not in the cache {}",
            dir.display(),
            root.display()
        ))
    })?;
    std::fs::create_dir_all(root)?;
    let mut at = root.to_path_buf();
    for part in rel.components() {
        let Component::Normal(name) = part else {
            let detail = format!("{} is not a plain path in the cache", dir.display());
            return Err(io::Error::other(detail));
        };
        at.push(name);
        match std::fs::create_dir(&at) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => real_dir(&at)?,
        }
    }
    Ok(())
}

/// Checks, without making anything, that each folder between `root` and `dir` (both included
/// but `root`) is a folder and not a link; a missing one is a `NotFound` error.
pub(crate) fn check_dirs(root: &Path, dir: &Path) -> io::Result<()> {
    let rel = dir
        .strip_prefix(root)
        .map_err(|_| io::Error::other(format!("{} is not in the cache", dir.display())))?;
    let mut at = root.to_path_buf();
    for part in rel.components() {
        at.push(part);
        real_dir(&at)?;
    }
    Ok(())
}

/// `Ok` when `path` is a folder itself, not a link to one.
fn real_dir(path: &Path) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    if meta.file_type().is_symlink() {
        return Err(linked(path));
    }
    if !meta.is_dir() {
        return Err(io::Error::other(format!(
            "{} is not a folder",
            path.display()
        )));
    }
    Ok(())
}

/// Opens `path` as it is, failing when it is a symbolic link (with [`linked`]'s error).
fn open(path: &Path, options: &mut std::fs::OpenOptions) -> io::Result<std::fs::File> {
    options
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => linked(path),
            _ => e,
        })
}

/// Creates `path` for writing, failing when anything is there already, a link included: the
/// caller removes what it means to replace first.
pub(crate) fn create_new(path: &Path) -> io::Result<std::fs::File> {
    open(
        path,
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true),
    )
}

/// Opens the file at `path` to read it, or to write it too, never through a link.
pub(crate) fn open_existing(path: &Path, write: bool) -> io::Result<std::fs::File> {
    open(path, std::fs::OpenOptions::new().read(true).write(write))
}

/// Opens (creating when missing) a lock file, never through a link; its content is never
/// written, so another tool's lock file is used as it is.
pub(crate) fn open_lock(path: &Path) -> io::Result<std::fs::File> {
    open(
        path,
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true),
    )
}

/// The whole of a small file, refused past `most` bytes and when it is a link.
pub(crate) fn read_at_most(path: &Path, most: usize) -> io::Result<Vec<u8>> {
    let file = open_existing(path, false)?;
    let mut data = Vec::new();
    file.take(most as u64 + 1).read_to_end(&mut data)?;
    if data.len() > most {
        return Err(io::Error::other(format!(
            "{} is over {most} bytes, more than such a file ever takes",
            path.display()
        )));
    }
    Ok(data)
}

/// Writes a small file whole or not at all (a reader never sees half a manifest or ref): into a
/// new file of a random name beside it, then renamed over it.
pub(crate) fn write_atomic(path: &Path, data: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new().prefix(TMP).tempfile_in(dir)?;
    io::Write::write_all(&mut tmp, data)?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Makes a symbolic link at `path` to `target`, made under a random name beside it and renamed
/// over it: a link another caller makes at once, or an old one, is replaced whole.
pub(crate) fn symlink_atomic(target: &Path, path: &Path) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = tempfile::Builder::new()
        .prefix(TMP)
        .make_in(dir, |at| std::os::unix::fs::symlink(target, at))?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_linked_folder_below_the_root_is_refused() {
        let (root, elsewhere) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        std::fs::create_dir(root.path().join("repo")).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), root.path().join("repo/blobs")).unwrap();
        let e = make_dirs(root.path(), &root.path().join("repo/blobs/x")).unwrap_err();
        assert!(
            e.to_string().contains("repo/blobs is a symbolic link"),
            "{e}"
        );
        assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
        make_dirs(root.path(), &root.path().join("repo/snapshots/c")).unwrap();
        assert!(root.path().join("repo/snapshots/c").is_dir());
    }

    #[test]
    fn a_linked_root_is_the_users_choice() {
        let (top, real) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let root = top.path().join("cache");
        std::os::unix::fs::symlink(real.path(), &root).unwrap();
        make_dirs(&root, &root.join("blobs")).unwrap();
        assert!(real.path().join("blobs").is_dir());
    }

    #[test]
    fn no_file_is_made_or_opened_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let planted = dir.path().join("part");
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        let e = create_new(&planted).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists, "{e}");
        for e in [
            open_existing(&planted, true).unwrap_err(),
            open_lock(&planted).unwrap_err(),
            read_at_most(&planted, 100).unwrap_err(),
        ] {
            assert!(e.to_string().contains("is a symbolic link"), "{e}");
        }
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    }

    #[test]
    fn a_file_past_its_bound_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.json");
        std::fs::write(&path, vec![b' '; 101]).unwrap();
        assert!(read_at_most(&path, 100)
            .unwrap_err()
            .to_string()
            .contains("over 100 bytes"));
        assert_eq!(read_at_most(&path, 101).unwrap().len(), 101);
    }
}
