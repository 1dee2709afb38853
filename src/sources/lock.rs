//! One download of a file at a time across processes (another corral, `corral pull`, the Hub's
//! own client): an exclusive lock on a file under `.locks/`, where the Hub's client takes its own.

use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use super::{cache_fs, FetchError};

/// Where the lock on downloading `dest` lies: for a Hub blob the lock file the Hub's own client
/// takes (`<cache>/.locks/models--org--name/<blob>.lock`), so that the two never write one part
/// file at once; for an Ollama blob `<store>/.locks/<blob>.lock`; for any other,
/// `.locks/<name>.lock` beside it.
fn lock_path(dest: &Path) -> PathBuf {
    let name = dest.file_name().unwrap_or_default().to_string_lossy();
    let dir = dest.parent().unwrap_or(Path::new("."));
    let repo = dir.parent().filter(|_| dir.ends_with("blobs"));
    let hub_repo = repo.and_then(|r| Some((r, r.file_name()?.to_str()?)));
    match hub_repo {
        Some((repo, repo_name)) if repo_name.starts_with("models--") => {
            let root = repo.parent().unwrap_or(Path::new("."));
            root.join(".locks")
                .join(repo_name)
                .join(format!("{name}.lock"))
        }
        // an Ollama store's blobs hold blobs alone
        _ if dir.ends_with("blobs") => {
            let store = dir.parent().unwrap_or(Path::new("."));
            store.join(".locks").join(format!("{name}.lock"))
        }
        _ => dir.join(".locks").join(format!("{name}.lock")),
    }
}

/// Takes the lock on downloading `dest` (in the cache `root`, for the source `src`), waiting (off
/// the runtime) while another process holds it; it is let go when the file is dropped, and by the
/// kernel if the process dies.
pub(crate) async fn lock(
    root: &Path,
    dest: &Path,
    src: &str,
) -> Result<Flock<std::fs::File>, FetchError> {
    let path = lock_path(dest);
    let (root, at) = (root.to_path_buf(), path.clone());
    let taken = tokio::task::spawn_blocking(move || {
        cache_fs::make_dirs(&root, at.parent().unwrap_or(Path::new(".")))?;
        let file = cache_fs::open_lock(&at)?;
        Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| std::io::Error::from(e))
    });
    match taken.await {
        Ok(taken) => taken.map_err(|e| FetchError::io(src, &path, e)),
        Err(e) => Err(FetchError::invalid(src, e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hub_blob_is_locked_where_the_hubs_client_locks_it() {
        assert_eq!(
            lock_path(Path::new("/hub/models--org--m/blobs/abc")),
            Path::new("/hub/.locks/models--org--m/abc.lock")
        );
        assert_eq!(
            lock_path(Path::new("/ollama/blobs/sha256-ab")),
            Path::new("/ollama/.locks/sha256-ab.lock")
        );
        assert_eq!(
            lock_path(Path::new("/cache/url/host/0123/m.gguf")),
            Path::new("/cache/url/host/0123/.locks/m.gguf.lock")
        );
    }
}
