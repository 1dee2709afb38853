//! Parsing a GGUF header from bytes, defensively.
//!
//! Input is untrusted (files half downloaded, corrupted, or hostile), so
//! every length is checked against hard caps and, when the total size is
//! known, against the bytes that are left; vectors grow only as data
//! actually arrives, so a lying count cannot cause a huge allocation.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use crate::error::Error;
use crate::header::{Header, TensorInfo, DEFAULT_ALIGNMENT};
use crate::limits::MAX_DIMS;
use crate::parse::{Parser, PREALLOC};
use crate::types::GgmlType;
use crate::value::Value;

/// Fewest bytes one key/value pair and one tensor info take.
const MIN_KV_BYTES: u64 = 8 + 1 + 4 + 1;
const MIN_TENSOR_BYTES: u64 = 8 + 4 + 4 + 8;

/// Reads a header from a stream of unknown length positioned at the start of
/// the file. Stops after the tensor infos; tensor data is never read.
pub fn read_header<R: Read>(r: R) -> Result<Header, Error> {
    Parser::new(r, None).header()
}

/// Like [`read_header`] for input of known total `size`: counts that cannot
/// fit in the remaining bytes are refused before reading, and tensor data
/// that would extend past `size` is an error.
pub fn read_header_sized<R: Read>(r: R, size: u64) -> Result<Header, Error> {
    Parser::new(r, Some(size)).header()
}

/// Reads the header of the file at `path` (checking it against the file size).
pub fn read_file(path: impl AsRef<Path>) -> Result<Header, Error> {
    let path = path.as_ref();
    let io_err = |source| Error::Io {
        path: Some(path.to_owned()),
        offset: 0,
        source,
    };
    let file = File::open(path).map_err(io_err)?;
    let size = file.metadata().map_err(io_err)?.len();
    read_header_sized(BufReader::with_capacity(1 << 16, file), size)
        .map_err(|e| e.in_file(path.to_owned()))
}

/// Adds which key or tensor was being read to an error, only when it fails.
fn context(e: Error, ctx: impl FnOnce() -> String) -> Error {
    match e {
        Error::Truncated { offset, what } => Error::Truncated {
            offset,
            what: format!("{what} of {}", ctx()),
        },
        Error::Invalid { offset, what } => Error::Invalid {
            offset,
            what: format!("{what} (in {})", ctx()),
        },
        e => e,
    }
}

impl<R: Read> Parser<R> {
    fn header(mut self) -> Result<Header, Error> {
        let magic: [u8; 4] = self.bytes("magic")?;
        if &magic != b"GGUF" {
            return Err(Error::BadMagic { found: magic });
        }
        let version = self.u32("version")?;
        if version != 2 && version != 3 {
            return Err(Error::UnsupportedVersion { version });
        }
        let counts_at = self.pos;
        let n_tensors = self.count("tensor count")?;
        let n_kv = self.count("metadata key/value count")?;
        if let Some(rem) = self.remaining() {
            let need = n_kv
                .saturating_mul(MIN_KV_BYTES)
                .saturating_add(n_tensors.saturating_mul(MIN_TENSOR_BYTES));
            if need > rem {
                return Err(Error::invalid(
                    counts_at,
                    format!("{n_tensors} tensors and {n_kv} keys cannot fit in the {rem} bytes left in the file"),
                ));
            }
        }

        let mut metadata = Vec::with_capacity(n_kv.min(PREALLOC) as usize);
        let mut seen = HashSet::new();
        for i in 0..n_kv {
            let start = self.pos;
            let key = self
                .string("key")
                .map_err(|e| context(e, || format!("key/value pair {i}")))?;
            if key.is_empty() {
                return Err(Error::invalid(
                    start,
                    format!("key/value pair {i} has an empty key"),
                ));
            }
            if !seen.insert(key.clone()) {
                return Err(Error::invalid(start, format!("duplicate key '{key}'")));
            }
            let value = self
                .value_type("value type")
                .and_then(|ty| self.value(ty, 0))
                .map_err(|e| context(e, || format!("key '{key}'")))?;
            metadata.push((key, value));
        }

        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some((_, Value::U32(a))) if a.is_power_of_two() => u64::from(*a),
            Some((_, v)) => {
                return Err(Error::invalid(
                    counts_at,
                    format!("general.alignment must be a u32 power of two, got {v:?}"),
                ))
            }
        };

        let mut tensors = Vec::with_capacity(n_tensors.min(PREALLOC) as usize);
        let mut names = HashSet::new();
        let mut offsets_at = Vec::with_capacity(n_tensors.min(PREALLOC) as usize);
        for i in 0..n_tensors {
            let start = self.pos;
            let name = self
                .string("tensor name")
                .map_err(|e| context(e, || format!("tensor info {i}")))?;
            if !names.insert(name.clone()) {
                return Err(Error::invalid(
                    start,
                    format!("duplicate tensor name '{name}'"),
                ));
            }
            let t = self
                .tensor_info(name.clone())
                .map_err(|e| context(e, || format!("tensor '{name}'")))?;
            tensors.push(t.0);
            offsets_at.push(t.1);
        }

        let end = self.pos;
        let data_offset = if n_tensors == 0 {
            end
        } else {
            end.checked_next_multiple_of(alignment)
                .ok_or_else(|| Error::invalid(end, "data offset overflows"))?
        };
        for (t, &at) in tensors.iter().zip(&offsets_at) {
            if t.offset % alignment != 0 {
                return Err(Error::invalid(
                    at,
                    format!(
                        "tensor '{}' offset {} is not a multiple of the alignment {alignment}",
                        t.name, t.offset
                    ),
                ));
            }
            let t_end = data_offset
                .checked_add(t.offset)
                .and_then(|o| o.checked_add(t.n_bytes))
                .ok_or_else(|| {
                    Error::invalid(at, format!("tensor '{}' data end overflows", t.name))
                })?;
            if let Some(size) = self.size {
                if t_end > size {
                    return Err(Error::Truncated {
                        offset: data_offset + t.offset,
                        what: format!(
                            "data of tensor '{}' (ends at byte {t_end}, file has {size})",
                            t.name
                        ),
                    });
                }
            }
        }
        if let Some(size) = self.size {
            if data_offset > size {
                return Err(Error::Truncated {
                    offset: end,
                    what: format!("padding before the data section (file has {size} bytes)"),
                });
            }
        }
        Ok(Header {
            version,
            metadata,
            tensors,
            alignment,
            data_offset,
        })
    }

    /// Reads dims, type and offset; returns the info and where its offset was.
    fn tensor_info(&mut self, name: String) -> Result<(TensorInfo, u64), Error> {
        let start = self.pos;
        let n_dims = self.u32("dimension count")?;
        if n_dims > MAX_DIMS {
            return Err(Error::invalid(
                start,
                format!("{n_dims} dimensions (ggml allows {MAX_DIMS})"),
            ));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        let mut n_elements: u64 = 1;
        for _ in 0..n_dims {
            let d = self.count("dimension")?;
            dims.push(d);
            // Like ggml: refuse any prefix product past int64, even if a later 0 would cancel it.
            n_elements = n_elements
                .checked_mul(d)
                .filter(|&n| n <= i64::MAX as u64)
                .ok_or_else(|| {
                    Error::invalid(start, format!("shape {dims:?} overflows int64 elements"))
                })?;
        }
        let type_at = self.pos;
        let type_id = self.u32("ggml type")?;
        let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| Error::UnknownTensorType {
            offset: type_at,
            tensor: name.clone(),
            type_id,
        })?;
        let n_bytes = ggml_type.bytes_for(&dims).ok_or_else(|| {
            Error::invalid(
                type_at,
                format!(
                    "shape {dims:?} is not whole {} blocks of {} or overflows",
                    ggml_type,
                    ggml_type.block_size()
                ),
            )
        })?;
        let offset_at = self.pos;
        let offset = self.u64("data offset")?;
        let info = TensorInfo {
            name,
            dims,
            ggml_type,
            offset,
            n_bytes,
        };
        Ok((info, offset_at))
    }
}
