//! The one error type of this crate: says what went wrong and where.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Why a GGUF file (or set of split files) could not be read.
#[derive(Debug)]
pub enum Error {
    /// An I/O error other than a short read, with the file if known.
    Io {
        path: Option<PathBuf>,
        offset: u64,
        source: io::Error,
    },
    /// The input ended while reading `what`, which started at `offset`.
    Truncated { offset: u64, what: String },
    /// The first four bytes are not `GGUF`.
    BadMagic { found: [u8; 4] },
    /// Version 1 (or anything but 2 and 3).
    UnsupportedVersion { version: u32 },
    /// A tensor uses a ggml type id this crate does not know.
    UnknownTensorType {
        offset: u64,
        tensor: String,
        type_id: u32,
    },
    /// A structurally invalid field: a bad tag, an impossible count, ...
    Invalid { offset: u64, what: String },
    /// A part of a split model is not on disk.
    MissingSplit {
        path: PathBuf,
        part: u32,
        count: u32,
    },
    /// Split parts that disagree with their names or with each other.
    Split { path: PathBuf, what: String },
    /// An error from a specific file, wrapped with its path.
    InFile { path: PathBuf, source: Box<Error> },
}

impl Error {
    pub(crate) fn invalid(offset: u64, what: impl Into<String>) -> Error {
        Error::Invalid {
            offset,
            what: what.into(),
        }
    }

    pub(crate) fn in_file(self, path: PathBuf) -> Error {
        match self {
            Error::Io {
                path: None,
                offset,
                source,
            } => Error::Io {
                path: Some(path),
                offset,
                source,
            },
            e @ (Error::Io { .. }
            | Error::MissingSplit { .. }
            | Error::Split { .. }
            | Error::InFile { .. }) => e,
            e => Error::InFile {
                path,
                source: Box::new(e),
            },
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io {
                path: Some(p),
                offset,
                source,
            } => write!(f, "{}: I/O error at byte {offset}: {source}", p.display()),
            Error::Io {
                path: None,
                offset,
                source,
            } => write!(f, "I/O error at byte {offset}: {source}"),
            Error::Truncated { offset, what } => {
                write!(f, "file ends inside {what} starting at byte {offset}")
            }
            Error::BadMagic { found } => write!(
                f,
                "not a GGUF file: magic is {:?}, expected \"GGUF\"",
                String::from_utf8_lossy(found)
            ),
            Error::UnsupportedVersion { version: 1 } => f.write_str(
                "GGUF version 1 is not supported (llama.cpp dropped it); reconvert the model",
            ),
            Error::UnsupportedVersion { version } => write!(
                f,
                "GGUF version {version} is not supported (only 2 and 3; a huge number may mean wrong endianness)"
            ),
            Error::UnknownTensorType {
                offset,
                tensor,
                type_id,
            } => write!(
                f,
                "tensor '{tensor}' has unknown ggml type {type_id} at byte {offset}"
            ),
            Error::Invalid { offset, what } => write!(f, "invalid GGUF at byte {offset}: {what}"),
            Error::MissingSplit { path, part, count } => write!(
                f,
                "split part {part} of {count} is missing: {}",
                path.display()
            ),
            Error::Split { path, what } => write!(f, "{}: {what}", path.display()),
            Error::InFile { path, source } => write!(f, "{}: {source}", path.display()),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            Error::InFile { source, .. } => Some(source.as_ref()),
            _ => None,
        }
    }
}
