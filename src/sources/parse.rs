//! The `source:` of a model, as written in the config: parsed once, shown with secrets masked.

use std::fmt;
use std::path::PathBuf;

/// Where a model's weights come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A file or directory already on this machine (a mounted volume, say).
    Path(PathBuf),
    /// An `http(s)://` URL, cached under corral's own cache.
    Url(String),
    /// A Hugging Face Hub repository, cached in the Hub's shared cache layout.
    HuggingFace(HfRef),
    /// An S3 object, cached under corral's own cache.
    S3 { bucket: String, key: String },
    /// A model of the Ollama library or a user's namespace, kept in Ollama's own store.
    Ollama { name: String, tag: String },
}

/// `hf://org/repo[/path/in/repo][:QUANT][@revision]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HfRef {
    pub repo: String,
    pub path: Option<String>,
    pub quant: Option<String>,
    /// A branch, tag or commit; `main` when none is written.
    pub revision: String,
}

const SCHEMES: &str = "use hf://, s3://, ollama://, http(s):// or a path";

impl Source {
    /// Parses a `source:` value; each error says what to write instead.
    pub fn parse(text: &str) -> Result<Source, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err(format!("empty source: {SCHEMES}"));
        }
        let Some((scheme, rest)) = text.split_once("://") else {
            return Ok(Source::Path(PathBuf::from(text)));
        };
        match scheme.to_ascii_lowercase().as_str() {
            "hf" | "huggingface" => parse_hf(rest).map(Source::HuggingFace),
            "s3" => parse_s3(rest),
            "ollama" => parse_ollama(rest),
            "http" | "https" => parse_url(text),
            "file" if rest.starts_with('/') => Ok(Source::Path(PathBuf::from(rest))),
            "file" => Err(format!(
                "file:// source {text:?} needs an absolute path, as in file:///models/m.gguf"
            )),
            other => Err(format!("unknown source scheme {other:?}: {SCHEMES}")),
        }
    }

    /// The kind of source, as metrics and events label it.
    pub fn scheme(&self) -> &'static str {
        match self {
            Source::Path(_) => "path",
            Source::Url(_) => "url",
            Source::HuggingFace(_) => "huggingface",
            Source::S3 { .. } => "s3",
            Source::Ollama { .. } => "ollama",
        }
    }
}

/// How an `hf://` reference is written, for its errors.
const HF_EXAMPLE: &str =
    "as in hf://org/repo, hf://org/repo:Q4_K_M or hf://org/repo/file.gguf@main";

fn parse_hf(rest: &str) -> Result<HfRef, String> {
    let (body, revision) = split_revision(rest)?;
    let mut parts = body.splitn(3, '/');
    let org = parts.next().unwrap_or_default();
    let name = parts.next().unwrap_or_default();
    let path = parts.next().map(|p| p.trim_end_matches('/').to_string());
    let (name, quant) = match name.split_once(':') {
        Some((n, q)) => (n, Some(q.to_string())),
        None => (name, None),
    };
    check_repo(rest, org, name, quant.as_deref())?;
    let path = path.filter(|p| !p.is_empty());
    check_path(rest, quant.as_deref(), path.as_deref())?;
    Ok(HfRef {
        repo: format!("{org}/{name}"),
        path,
        quant,
        revision,
    })
}

/// The reference and its revision (`main` unless `@` names one). A revision names a file under
/// the cache's `refs/` (`refs/pr/1` included): one that would leave it is refused.
fn split_revision(rest: &str) -> Result<(&str, String), String> {
    let example = HF_EXAMPLE;
    let (body, revision) = match rest.rsplit_once('@') {
        Some((b, r)) if !r.is_empty() => (b, r.to_string()),
        Some(_) => return Err(format!("hf://{rest}: empty revision after '@', {example}")),
        None => (rest, "main".to_string()),
    };
    let leaves = |r: &str| r.starts_with('/') || r.split('/').any(|s| s.is_empty() || s == "..");
    if leaves(&revision) {
        return Err(format!(
            "hf://{rest}: the revision {revision:?} is not a branch, tag or commit, {example}"
        ));
    }
    Ok((body, revision))
}

/// The repository must be `org/name` in the Hub's characters, and a `:` must name a quantization.
fn check_repo(rest: &str, org: &str, name: &str, quant: Option<&str>) -> Result<(), String> {
    let example = HF_EXAMPLE;
    if org.is_empty() || name.is_empty() || !valid_repo_part(org) || !valid_repo_part(name) {
        return Err(format!(
            "hf://{rest}: the repository must be org/name, {example}"
        ));
    }
    if quant == Some("") {
        return Err(format!(
            "hf://{rest}: empty quantization after ':', {example}"
        ));
    }
    Ok(())
}

/// A path in the repository goes without a quantization, and stays within the repository.
fn check_path(rest: &str, quant: Option<&str>, path: Option<&str>) -> Result<(), String> {
    if quant.is_some() && path.is_some() {
        return Err(format!(
            "hf://{rest}: give a quantization (org/repo:Q4_K_M) or a file path, not both"
        ));
    }
    if path.is_some_and(|p| p.split('/').any(|s| s == ".." || s == ".")) {
        return Err(format!(
            "hf://{rest}: the path in the repository must not contain . or .."
        ));
    }
    Ok(())
}

fn valid_repo_part(s: &str) -> bool {
    s != "."
        && s != ".."
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

fn parse_s3(rest: &str) -> Result<Source, String> {
    match rest.split_once('/') {
        Some((bucket, key)) if !bucket.is_empty() && !key.is_empty() && !key.ends_with('/') => {
            Ok(Source::S3 {
                bucket: bucket.to_string(),
                key: key.to_string(),
            })
        }
        _ => Err(format!(
            "s3://{rest}: name a bucket and an object key, as in s3://bucket/models/m.gguf"
        )),
    }
}

fn parse_ollama(rest: &str) -> Result<Source, String> {
    let (name, tag) = match rest.rsplit_once(':') {
        Some((n, t)) if !t.contains('/') => (n, t),
        _ => (rest, "latest"),
    };
    // a name or tag becomes a path in Ollama's store: `.` and `..` would leave it
    let ok = |s: &str| {
        !s.is_empty()
            && s != "."
            && s != ".."
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    let segments: Vec<&str> = name.split('/').collect();
    if segments.len() > 3 || !segments.iter().all(|s| ok(s)) || !ok(tag) {
        return Err(format!(
            "ollama://{rest}: write a model as ollama://name[:tag] or ollama://user/name:tag"
        ));
    }
    Ok(Source::Ollama {
        name: name.to_string(),
        tag: tag.to_string(),
    })
}

fn parse_url(text: &str) -> Result<Source, String> {
    match reqwest::Url::parse(text) {
        Ok(u) if u.host_str().is_some_and(|h| !h.is_empty()) => Ok(Source::Url(text.to_string())),
        Ok(_) => Err(format!("{}: the URL has no host", mask_url(text))),
        Err(e) => Err(format!("{}: not a valid URL ({e})", mask_url(text))),
    }
}

/// The URL with its user information and query values replaced by `***`: either may hold a
/// token (a presigned URL's signature, a `?token=`), and sources are shown in logs and events.
pub fn mask_url(text: &str) -> String {
    let Ok(mut url) = reqwest::Url::parse(text) else {
        return text
            .split(['?', '@'])
            .next()
            .unwrap_or_default()
            .to_string();
    };
    if !url.username().is_empty() || url.password().is_some() {
        let _ = url.set_username("***");
        let _ = url.set_password(None);
    }
    if url.query().is_some() {
        let masked: Vec<String> = url.query_pairs().map(|(k, _)| format!("{k}=***")).collect();
        url.set_query(Some(&masked.join("&")));
    }
    url.to_string()
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Path(p) => write!(f, "{}", p.display()),
            Source::Url(u) => f.write_str(&mask_url(u)),
            Source::HuggingFace(h) => write!(f, "{h}"),
            Source::S3 { bucket, key } => write!(f, "s3://{bucket}/{key}"),
            Source::Ollama { name, tag } => write!(f, "ollama://{name}:{tag}"),
        }
    }
}

impl fmt::Display for HfRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "hf://{}", self.repo)?;
        if let Some(q) = &self.quant {
            write!(f, ":{q}")?;
        }
        if let Some(p) = &self.path {
            write!(f, "/{p}")?;
        }
        if self.revision != "main" {
            write!(f, "@{}", self.revision)?;
        }
        Ok(())
    }
}
