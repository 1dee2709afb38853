//! The Hugging Face Hub's cache layout, shared with huggingface-cli, transformers, vLLM and
//! llama.cpp so each reuses what the others downloaded:
//!
//! ```text
//! <root>/models--org--name/blobs/<etag>                 the content (etag: LFS sha256 or git blob id)
//! <root>/models--org--name/snapshots/<commit>/<path>    relative symlink to ../../blobs/<etag>
//! <root>/models--org--name/refs/<revision>              the commit the revision pointed at
//! ```

use std::path::{Path, PathBuf};

use super::gguf_pick::{self, Pick};
use super::{Form, HfRef};

/// One repository's folder in the cache.
pub(crate) struct RepoCache {
    pub dir: PathBuf,
}

impl RepoCache {
    pub(crate) fn new(root: &Path, repo: &str) -> RepoCache {
        RepoCache {
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
        if is_commit(revision) && self.snapshot(revision).is_dir() {
            return Some(revision.to_string());
        }
        let text = std::fs::read_to_string(self.ref_file(revision)).ok()?;
        Some(text.trim().to_string()).filter(|c| is_commit(c))
    }

    /// Records where `revision` points; a commit needs no ref.
    pub(crate) fn write_ref(&self, revision: &str, commit: &str) -> std::io::Result<()> {
        if revision == commit {
            return Ok(());
        }
        let path = self.ref_file(revision);
        std::fs::create_dir_all(path.parent().expect("refs has a parent"))?;
        super::download::write_atomic(&path, commit.as_bytes())
    }

    /// Points `snapshots/<commit>/<path>` at its blob with a relative link, as the Hub's client
    /// does, so the cache can be moved or mounted elsewhere.
    pub(crate) fn link(&self, commit: &str, path: &str, etag: &str) -> std::io::Result<()> {
        let link = self.snapshot(commit).join(path);
        std::fs::create_dir_all(link.parent().expect("a snapshot path has a parent"))?;
        let ups = path.split('/').count() + 1;
        let target = format!("{}blobs/{etag}", "../".repeat(ups));
        match std::fs::read_link(&link) {
            Ok(t) if t == Path::new(&target) => return Ok(()),
            Err(_) if link.exists() => return Ok(()),
            _ => {}
        }
        // made aside and renamed over: a link another caller is making at once, or an old one,
        // is replaced whole, never found half made
        let tmp = super::download::unique_beside(&link);
        std::os::unix::fs::symlink(target, &tmp)?;
        std::fs::rename(&tmp, &link).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    }
}

/// A full 40-hex git commit id.
pub(crate) fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// What a complete snapshot holds for this reference: the model path and its projector, and in
/// `parts` every file it takes, all relative to the snapshot. `None` when something is missing.
pub(crate) fn cached_pick(snapshot: &Path, hf: &HfRef, form: Form) -> Option<Pick> {
    let (files, dangling) = walk(snapshot);
    let names: Vec<&str> = files.iter().map(String::as_str).collect();
    let pick = match (&hf.path, &hf.quant, form) {
        (Some(path), _, _) if gguf_pick::part_count(path) > 1 => Pick {
            model: path.clone(),
            parts: gguf_pick::parts_of(path, &names),
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
        (None, None, Form::Directory) if !dangling && holds_weights(snapshot, &names) => Pick {
            model: String::new(),
            parts: files.clone(),
            mmproj: None,
        },
        (None, None, Form::Directory) => return None,
        (None, quant, _) => gguf_pick::pick(&names, quant.as_deref()).ok()?,
    };
    let whole = pick.parts.len() >= gguf_pick::part_count(&pick.model);
    let present = |f: &String| names.contains(&f.as_str());
    (whole && !pick.parts.is_empty() && pick.parts.iter().all(present)).then_some(pick)
}

/// True when a model folder holds its weights: some weights file, and every shard that an index
/// (`*.index.json`) names. A tokenizer or config lookup by another tool (transformers, vLLM's
/// config check) leaves a snapshot with those files alone, which is not a model yet.
fn holds_weights(snapshot: &Path, names: &[&str]) -> bool {
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
            .all(|i| shards_present(snapshot, i, names))
}

/// Every shard the index `index` names is in the snapshot (beside the index).
fn shards_present(snapshot: &Path, index: &str, names: &[&str]) -> bool {
    let Ok(text) = std::fs::read(snapshot.join(index)) else {
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

/// Every file under a snapshot whose link resolves, as sorted relative paths, and whether any
/// link dangles (its blob deleted).
fn walk(snapshot: &Path) -> (Vec<String>, bool) {
    let (mut out, mut dangling) = (Vec::new(), false);
    let mut stack = vec![snapshot.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            match std::fs::metadata(&path) {
                Ok(m) if m.is_dir() => stack.push(path),
                Ok(_) => {
                    if let Ok(rel) = path.strip_prefix(snapshot) {
                        out.push(rel.to_string_lossy().into_owned());
                    }
                }
                Err(_) => dangling = true,
            }
        }
    }
    out.sort();
    (out, dangling)
}
