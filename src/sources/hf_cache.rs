//! The Hugging Face Hub's cache layout, shared with huggingface-cli, transformers, vLLM and
//! llama.cpp so each reuses what the others downloaded:
//!
//! ```text
//! <root>/models--org--name/blobs/<etag>                 the content (etag: LFS sha256 or git blob id)
//! <root>/models--org--name/snapshots/<commit>/<path>    relative symlink to ../../blobs/<etag>
//! <root>/models--org--name/refs/<revision>              the commit the revision pointed at
//! ```

use std::io;
use std::path::{Component, Path, PathBuf};

use super::cache_fs;
use super::gguf_pick::{self, Pick};
use super::verify::Verify;
use super::{Form, HfRef};

/// How deep a snapshot's folders go at most: a repository's paths are a few folders deep.
const DEEPEST: usize = 32;

/// One repository's folder in the cache.
pub(crate) struct RepoCache {
    /// The cache as configured, whose folders below are never links.
    pub root: PathBuf,
    pub dir: PathBuf,
}

/// The files of a snapshot.
pub(crate) struct Snapshot {
    pub files: Vec<SnapshotFile>,
    /// Whether a link names a blob that is not there (deleted since).
    pub dangling: bool,
}

/// One file of a snapshot.
pub(crate) struct SnapshotFile {
    /// Its path in the snapshot (and the repository).
    pub rel: String,
    /// What holds its bytes: the blob its link names, or the file itself when it is a plain file
    /// (as a tool that copies rather than links leaves it).
    pub real: PathBuf,
    /// The blob's name, for a link.
    pub blob: Option<String>,
}

impl SnapshotFile {
    /// What its blob's name says of its content: an LFS blob is named by its sha256, a git blob
    /// by its git id.
    pub(crate) fn verify(&self) -> Option<Verify> {
        let name = self.blob.as_deref()?;
        if !name.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        match name.len() {
            64 => Some(Verify::Sha256(name.to_string())),
            40 => Some(Verify::GitBlob(name.to_string())),
            _ => None,
        }
    }
}

impl Snapshot {
    fn names(&self) -> Vec<&str> {
        self.files.iter().map(|f| f.rel.as_str()).collect()
    }

    pub(crate) fn file(&self, rel: &str) -> Option<&SnapshotFile> {
        self.files.iter().find(|f| f.rel == rel)
    }
}

impl RepoCache {
    pub(crate) fn new(root: &Path, repo: &str) -> RepoCache {
        RepoCache {
            root: root.to_path_buf(),
            dir: root.join(format!("models--{}", repo.replace('/', "--"))),
        }
    }

    pub(crate) fn blob(&self, etag: &str) -> PathBuf {
        self.dir.join("blobs").join(etag)
    }

    pub(crate) fn snapshot(&self, commit: &str) -> PathBuf {
        self.dir.join("snapshots").join(commit)
    }

    fn ref_file(&self, revision: &str) -> PathBuf {
        self.dir.join("refs").join(revision)
    }

    /// The commit a revision points at, from `refs/` (or the revision itself when it is a commit
    /// already in the cache).
    pub(crate) fn commit_of(&self, revision: &str) -> Option<String> {
        let is_dir = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir());
        if is_commit(revision) && is_dir(&self.snapshot(revision)) {
            return Some(revision.to_string());
        }
        let text = cache_fs::read_at_most(&self.ref_file(revision), 256).ok()?;
        let text = String::from_utf8(text).ok()?;
        Some(text.trim().to_string()).filter(|c| is_commit(c))
    }

    /// Records where `revision` points; a commit needs no ref.
    pub(crate) fn write_ref(&self, revision: &str, commit: &str) -> io::Result<()> {
        if revision == commit {
            return Ok(());
        }
        let path = self.ref_file(revision);
        cache_fs::make_dirs(&self.root, path.parent().expect("refs has a parent"))?;
        cache_fs::write_atomic(&path, commit.as_bytes())
    }

    /// Points `snapshots/<commit>/<path>` at its blob with a relative link, as the Hub's client
    /// does, so the cache can be moved or mounted elsewhere.
    pub(crate) fn link(&self, commit: &str, path: &str, etag: &str) -> io::Result<()> {
        let link = self.snapshot(commit).join(path);
        let folder = link.parent().expect("a snapshot path has a parent");
        cache_fs::make_dirs(&self.root, folder)?;
        let ups = path.split('/').count() + 1;
        let target = format!("{}blobs/{etag}", "../".repeat(ups));
        match std::fs::read_link(&link) {
            Ok(t) if t == Path::new(&target) => return Ok(()),
            Err(_) if std::fs::symlink_metadata(&link).is_ok() => return Ok(()),
            _ => {}
        }
        // an old link, or one another caller makes at once, is replaced whole, never half made
        cache_fs::symlink_atomic(Path::new(&target), &link)
    }

    /// The files of the snapshot at `snapshot`: an error when a folder on the way is a link, when
    /// a link in it points anywhere but this repository's blobs, or when it is missing
    /// (`NotFound`).
    pub(crate) fn files(&self, snapshot: &Path) -> io::Result<Snapshot> {
        cache_fs::check_dirs(&self.root, snapshot)?;
        let blobs = self.dir.join("blobs");
        match cache_fs::check_dirs(&self.root, &blobs) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => walk(snapshot, &blobs),
        }
    }
}

/// A full 40-hex git commit id.
pub(crate) fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// What a complete snapshot holds for this reference: the model path and its projector, and in
/// `parts` every file it takes, all relative to the snapshot. `None` when something is missing.
pub(crate) fn cached_pick(snapshot: &Snapshot, hf: &HfRef, form: Form) -> Option<Pick> {
    let names = snapshot.names();
    let pick = referenced(snapshot, &names, hf, form)?;
    let whole = pick.parts.len() >= gguf_pick::part_count(&pick.model);
    let present = |f: &String| names.contains(&f.as_str());
    (whole && !pick.parts.is_empty() && pick.parts.iter().all(present)).then_some(pick)
}

/// The files the reference takes out of the snapshot's `names`: the path it names, a whole
/// model folder, or the GGUF of its quantization; `None` when a folder lacks its weights.
fn referenced(snapshot: &Snapshot, names: &[&str], hf: &HfRef, form: Form) -> Option<Pick> {
    Some(match (&hf.path, &hf.quant, form) {
        (Some(path), _, _) if gguf_pick::part_count(path) > 1 => Pick {
            model: path.clone(),
            parts: gguf_pick::parts_of(path, names),
            mmproj: None,
        },
        (Some(path), _, _) => {
            let under = names
                .iter()
                .filter(|f| within(f, path))
                .map(|f| f.to_string());
            Pick {
                model: path.clone(),
                parts: under.collect(),
                mmproj: None,
            }
        }
        (None, None, Form::Directory) if !snapshot.dangling && holds_weights(snapshot) => Pick {
            model: String::new(),
            parts: names.iter().map(|n| n.to_string()).collect(),
            mmproj: None,
        },
        (None, None, Form::Directory) => return None,
        (None, quant, _) => gguf_pick::pick(names, quant.as_deref()).ok()?,
    })
}

/// True when a model folder holds its weights: some weights file, and every shard that an index
/// (`*.index.json`) names. A tokenizer or config lookup by another tool (transformers, vLLM's
/// config check) leaves a snapshot with those files alone, which is not a model yet.
fn holds_weights(snapshot: &Snapshot) -> bool {
    let names = snapshot.names();
    let weights = |f: &&str| {
        let name = f.rsplit('/').next().unwrap_or(f);
        [".safetensors", ".pt", ".pth", ".gguf"]
            .iter()
            .any(|e| name.ends_with(e))
            || (name.starts_with("pytorch_model") && name.ends_with(".bin"))
    };
    let indexes = names.iter().filter(|f| f.ends_with(".index.json"));
    names.iter().any(weights)
        && indexes
            .into_iter()
            .all(|i| shards_present(snapshot, i, &names))
}

/// Every shard the index `index` names is in the snapshot (beside the index).
fn shards_present(snapshot: &Snapshot, index: &str, names: &[&str]) -> bool {
    let Some(file) = snapshot.file(index) else {
        return false;
    };
    let Ok(text) = cache_fs::read_at_most(&file.real, cache_fs::JSON_AT_MOST) else {
        return false;
    };
    let Ok(index_json) = serde_json::from_slice::<serde_json::Value>(&text) else {
        return false;
    };
    let Some(map) = index_json.get("weight_map").and_then(|m| m.as_object()) else {
        return true; // not a shard index
    };
    let dir = index.rsplit_once('/').map_or("", |(d, _)| d);
    map.values().filter_map(|v| v.as_str()).all(|shard| {
        let path = if dir.is_empty() {
            shard.to_string()
        } else {
            format!("{dir}/{shard}")
        };
        names.contains(&path.as_str())
    })
}

/// `file` is `path` or lies under the folder `path`.
pub(crate) fn within(file: &str, path: &str) -> bool {
    file == path
        || file
            .strip_prefix(path)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Every file under a snapshot, as sorted relative paths, and whether any link dangles (its blob
/// deleted). Folders are entered as themselves, never through a link, so links that loop cannot
/// make the walk endless; a link is followed only into `blobs`, and one that leads anywhere else
/// is an error naming it.
fn walk(snapshot: &Path, blobs: &Path) -> io::Result<Snapshot> {
    let mut found = Snapshot {
        files: Vec::new(),
        dangling: false,
    };
    let mut stack = vec![(snapshot.to_path_buf(), 0)];
    while let Some((dir, depth)) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            if being_made(&entry) {
                continue;
            }
            let (path, kind) = (entry.path(), entry.file_type()?);
            if kind.is_dir() && depth < DEEPEST {
                stack.push((path, depth + 1));
            } else if kind.is_dir() {
                let detail = format!("{} is nested deeper than {DEEPEST} folders", path.display());
                return Err(io::Error::other(detail));
            } else {
                add_file(&mut found, snapshot, blobs, path, kind)?;
            }
        }
    }
    found.files.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(found)
}

/// A link another writer is making at once, to be renamed into place under its own name.
fn being_made(entry: &std::fs::DirEntry) -> bool {
    (entry.file_name().as_encoded_bytes()).starts_with(cache_fs::TMP.as_bytes())
}

/// Adds what lies at `path` in the snapshot: a link as the blob it names (the snapshot dangles
/// when that blob is missing), a plain file as itself; anything else is passed over.
fn add_file(
    found: &mut Snapshot,
    snapshot: &Path,
    blobs: &Path,
    path: PathBuf,
    kind: std::fs::FileType,
) -> io::Result<()> {
    let (real, blob) = if kind.is_symlink() {
        match linked_blob(&path, blobs)? {
            Some((real, name)) => (real, Some(name)),
            None => {
                found.dangling = true;
                return Ok(());
            }
        }
    } else if kind.is_file() {
        (path.clone(), None)
    } else {
        return Ok(());
    };
    let rel = path.strip_prefix(snapshot).ok();
    let rel = rel.map(|r| r.to_string_lossy().into_owned());
    found
        .files
        .extend(rel.map(|rel| SnapshotFile { rel, real, blob }));
    Ok(())
}

/// Where `link` points to by its `target`'s path alone, without following any link on the way
/// (a link in a snapshot is relative, `../../blobs/<etag>`).
fn lexical_target(link: &Path, target: &Path) -> PathBuf {
    let mut at = link.parent().unwrap_or(Path::new("/")).to_path_buf();
    for part in target.components() {
        match part {
            Component::ParentDir => {
                at.pop();
            }
            Component::CurDir => {}
            Component::Normal(name) => at.push(name),
            Component::RootDir | Component::Prefix(_) => at = PathBuf::from("/"),
        }
    }
    at
}

/// The blob a snapshot's link names, and its name: `None` when the blob is missing, an error when
/// the link leads out of `blobs` or the blob is not a plain file.
fn linked_blob(link: &Path, blobs: &Path) -> io::Result<Option<(PathBuf, String)>> {
    let target = match std::fs::read_link(link) {
        Ok(target) => target,
        // replaced since it was listed: another writer's rename, seen as missing
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let at = lexical_target(link, &target);
    let name = at.file_name().and_then(|n| n.to_str()).map(str::to_string);
    let Some(name) = name.filter(|_| at.parent() == Some(blobs)) else {
        return Err(io::Error::other(format!(
            "{} links to {}, not to a blob of its repository (../blobs/); a link elsewhere \
             could hand an engine any file: remove it",
            link.display(),
            target.display()
        )));
    };
    match std::fs::symlink_metadata(&at) {
        Ok(m) if m.is_file() => Ok(Some((at, name))),
        Ok(_) => Err(io::Error::other(format!(
            "{} is not a plain file",
            at.display()
        ))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}
