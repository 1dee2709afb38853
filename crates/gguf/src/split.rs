//! Models split by llama.cpp's gguf-split into `<prefix>-00001-of-0000N.gguf`.

use std::path::{Path, PathBuf};

use crate::error::Error;
use crate::header::{Header, TensorInfo};
use crate::reader::read_file;

/// One file of a model.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    pub path: PathBuf,
    pub file_size: u64,
    /// Number of tensors stored in this part.
    pub n_tensors: usize,
}

/// A whole model: one file, or every part of a split one.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    /// The first part's header; its metadata describes the whole model (its
    /// `tensors` are only the first part's; see [`Model::tensors`]).
    pub header: Header,
    /// Tensors of all parts, in part order.
    pub tensors: Vec<TensorInfo>,
    pub parts: Vec<Part>,
}

impl Model {
    /// Sum of all tensors' data sizes (the weights), without padding.
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors
            .iter()
            .fold(0u64, |sum, t| sum.saturating_add(t.n_bytes))
    }

    /// Sum of the parts' file sizes.
    pub fn file_size(&self) -> u64 {
        self.parts
            .iter()
            .fold(0u64, |sum, p| sum.saturating_add(p.file_size))
    }

    /// Sum of all tensors' element counts.
    pub fn n_elements(&self) -> u64 {
        self.tensors
            .iter()
            .fold(0u64, |sum, t| sum.saturating_add(t.n_elements()))
    }
}

/// Splits `.../name-00002-of-00005.gguf` into (`.../name`, 2, 5).
pub fn parse_split_name(path: &Path) -> Option<(String, u32, u32)> {
    let s = path.to_str()?;
    let stem = s.strip_suffix(".gguf")?;
    // "-NNNNN-of-NNNNN" is 15 bytes.
    let cut = stem.len().checked_sub(15)?;
    let (prefix, tail) = (stem.get(..cut)?, stem.get(cut..)?);
    let b = tail.as_bytes();
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    if b[0] != b'-' || &b[6..10] != b"-of-" || !digits(1..6) || !digits(10..15) {
        return None;
    }
    let no: u32 = tail[1..6].parse().ok()?;
    let count: u32 = tail[10..15].parse().ok()?;
    (no >= 1 && no <= count && !prefix.is_empty()).then(|| (prefix.to_owned(), no, count))
}

/// The path of part `no` (1-based) of `count` for `prefix`.
pub fn split_path(prefix: &str, no: u32, count: u32) -> PathBuf {
    PathBuf::from(format!("{prefix}-{no:05}-of-{count:05}.gguf"))
}

/// Reads a model from any one of its files. A name like
/// `x-00002-of-00003.gguf` reads parts 1 to 3 (llama-server itself must be
/// given part 1); any other name is a single file.
pub fn read_model(path: impl AsRef<Path>) -> Result<Model, Error> {
    let path = path.as_ref();
    let Some((prefix, _, count)) = parse_split_name(path) else {
        let header = read_file(path)?;
        if let Some(n) = header.get_u64("split.count").filter(|&n| n > 1) {
            return Err(Error::Split {
                path: path.to_owned(),
                what: format!(
                    "split.count is {n} but the name is not <prefix>-00001-of-{n:05}.gguf"
                ),
            });
        }
        return Ok(single(path, header));
    };
    let paths: Vec<PathBuf> = (1..=count).map(|i| split_path(&prefix, i, count)).collect();
    for (i, p) in paths.iter().enumerate() {
        if !p.exists() {
            return Err(Error::MissingSplit {
                path: p.clone(),
                part: i as u32 + 1,
                count,
            });
        }
    }
    let mut model: Option<Model> = None;
    let mut names = std::collections::HashSet::new();
    for (i, p) in paths.iter().enumerate() {
        let header = read_file(p)?;
        let mismatch = |what: String| Error::Split {
            path: p.clone(),
            what,
        };
        if let Some(n) = header.get("split.count") {
            if n.as_u64() != Some(u64::from(count)) {
                return Err(mismatch(format!(
                    "split.count is {n:?} but the name says {count} parts"
                )));
            }
        }
        if let Some(n) = header.get("split.no") {
            if n.as_u64() != Some(i as u64) {
                return Err(mismatch(format!(
                    "split.no is {n:?} but this is part {} (expected {i})",
                    i + 1
                )));
            }
        }
        for t in &header.tensors {
            if !names.insert(t.name.clone()) {
                return Err(mismatch(format!(
                    "tensor '{}' is also in an earlier part",
                    t.name
                )));
            }
        }
        let part = single(p, header);
        match &mut model {
            None => model = Some(part),
            Some(m) => {
                m.tensors.extend(part.tensors);
                m.parts.extend(part.parts);
            }
        }
    }
    let model = model.expect("count >= 1 so at least one part was read");
    if let Some(n) = model.header.get("split.tensors.count") {
        if n.as_u64() != Some(model.tensors.len() as u64) {
            return Err(Error::Split {
                path: paths[0].clone(),
                what: format!(
                    "split.tensors.count is {n:?} but the parts hold {} tensors",
                    model.tensors.len()
                ),
            });
        }
    }
    Ok(model)
}

fn single(path: &Path, header: Header) -> Model {
    Model {
        tensors: header.tensors.clone(),
        parts: vec![Part {
            path: path.to_owned(),
            // The reader checked every tensor ends inside the file, so the
            // padded data end is a floor; the real size comes from the fs.
            file_size: std::fs::metadata(path)
                .map(|m| m.len())
                .unwrap_or(header.data_end()),
            n_tensors: header.tensors.len(),
        }],
        header,
    }
}
