//! Low-level decoding of GGUF's little-endian primitives, strings and
//! arrays, with every length checked before anything is allocated for it.

use std::io::{self, Read};

use crate::error::Error;
use crate::limits::{MAX_ARRAY_DEPTH, MAX_ARRAY_LEN, MAX_STRING_LEN};
use crate::value::{Array, Value, ValueType};

/// Capacity reserved up front for any vector, whatever its declared count.
pub(crate) const PREALLOC: u64 = 4096;

/// A reader that tracks its offset (for messages) and, when known, the
/// total size (to refuse counts that cannot fit).
pub(crate) struct Parser<R> {
    r: R,
    pub(crate) pos: u64,
    pub(crate) size: Option<u64>,
}

impl<R: Read> Parser<R> {
    pub(crate) fn new(r: R, size: Option<u64>) -> Self {
        Parser { r, pos: 0, size }
    }

    pub(crate) fn remaining(&self) -> Option<u64> {
        self.size.map(|s| s.saturating_sub(self.pos))
    }

    pub(crate) fn io(&self, source: io::Error, start: u64, what: &str) -> Error {
        if source.kind() == io::ErrorKind::UnexpectedEof {
            Error::Truncated {
                offset: start,
                what: what.to_owned(),
            }
        } else {
            Error::Io {
                path: None,
                offset: start,
                source,
            }
        }
    }

    pub(crate) fn bytes<const N: usize>(&mut self, what: &str) -> Result<[u8; N], Error> {
        let mut b = [0u8; N];
        let start = self.pos;
        self.r
            .read_exact(&mut b)
            .map_err(|e| self.io(e, start, what))?;
        self.pos += N as u64;
        Ok(b)
    }

    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, Error> {
        self.bytes::<4>(what).map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, Error> {
        self.bytes::<8>(what).map(u64::from_le_bytes)
    }

    /// Checks that `n` items of at least `each` bytes can still fit.
    pub(crate) fn check_fits(
        &self,
        start: u64,
        n: u64,
        each: u64,
        what: &str,
    ) -> Result<(), Error> {
        if let Some(rem) = self.remaining() {
            if n.saturating_mul(each) > rem {
                return Err(Error::invalid(
                    start,
                    format!("{what} count {n} cannot fit in the {rem} bytes left in the file"),
                ));
            }
        }
        Ok(())
    }

    pub(crate) fn string(&mut self, what: &str) -> Result<String, Error> {
        let start = self.pos;
        let len = self.u64(what)?;
        if len > MAX_STRING_LEN {
            return Err(Error::invalid(
                start,
                format!("{what} length {len} exceeds the {MAX_STRING_LEN}-byte limit"),
            ));
        }
        self.check_fits(start, len, 1, what)?;
        let mut buf = Vec::with_capacity(len.min(PREALLOC * 16) as usize);
        let n = (&mut self.r)
            .take(len)
            .read_to_end(&mut buf)
            .map_err(|e| self.io(e, start, what))?;
        self.pos += n as u64;
        if (n as u64) < len {
            return Err(Error::Truncated {
                offset: start,
                what: what.to_owned(),
            });
        }
        // GGUF says UTF-8, but real token lists are not always; keep going.
        Ok(String::from_utf8(buf)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }

    pub(crate) fn value_type(&mut self, what: &str) -> Result<ValueType, Error> {
        let start = self.pos;
        let id = self.u32(what)?;
        ValueType::from_id(id)
            .ok_or_else(|| Error::invalid(start, format!("{what} {id} is not a GGUF value type")))
    }

    pub(crate) fn value(&mut self, ty: ValueType, depth: u32) -> Result<Value, Error> {
        const W: &str = "value";
        Ok(match ty {
            ValueType::U8 => Value::U8(self.bytes::<1>(W)?[0]),
            ValueType::I8 => Value::I8(self.bytes::<1>(W)?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.bytes(W)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.bytes(W)?)),
            ValueType::U32 => Value::U32(self.u32(W)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.bytes(W)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.bytes(W)?)),
            ValueType::Bool => Value::Bool(self.bytes::<1>(W)?[0] != 0),
            ValueType::String => Value::String(self.string("string value")?),
            ValueType::Array => Value::Array(self.array(depth)?),
            ValueType::U64 => Value::U64(self.u64(W)?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.bytes(W)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.bytes(W)?)),
        })
    }

    /// Reads `n` fixed-size elements in chunks, converting each with `f`.
    pub(crate) fn fixed_vec<T, const N: usize>(
        &mut self,
        n: u64,
        f: fn([u8; N]) -> T,
    ) -> Result<Vec<T>, Error> {
        let start = self.pos;
        let mut out = Vec::with_capacity(n.min(PREALLOC) as usize);
        let mut buf = vec![0u8; N * n.min(4096) as usize];
        let mut left = n;
        while left > 0 {
            let k = left.min(4096) as usize;
            let chunk = &mut buf[..k * N];
            let at = self.pos;
            self.r.read_exact(chunk).map_err(|e| {
                let e = self.io(e, at, "array elements");
                match e {
                    Error::Truncated { what, .. } => Error::Truncated {
                        offset: start,
                        what,
                    },
                    e => e,
                }
            })?;
            self.pos += chunk.len() as u64;
            out.extend(chunk.chunks_exact(N).map(|c| {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                f(a)
            }));
            left -= k as u64;
        }
        Ok(out)
    }

    pub(crate) fn array(&mut self, depth: u32) -> Result<Array, Error> {
        let start = self.pos;
        let elem = self.value_type("array element type")?;
        let n = self.u64("array length")?;
        if n > MAX_ARRAY_LEN {
            return Err(Error::invalid(
                start,
                format!("array length {n} exceeds the {MAX_ARRAY_LEN}-element limit"),
            ));
        }
        self.check_fits(start, n, elem.min_encoded_size(), "array element")?;
        Ok(match elem {
            ValueType::U8 => Array::U8(self.fixed_vec(n, |[b]| b)?),
            ValueType::I8 => Array::I8(self.fixed_vec(n, |[b]| b as i8)?),
            ValueType::U16 => Array::U16(self.fixed_vec(n, u16::from_le_bytes)?),
            ValueType::I16 => Array::I16(self.fixed_vec(n, i16::from_le_bytes)?),
            ValueType::U32 => Array::U32(self.fixed_vec(n, u32::from_le_bytes)?),
            ValueType::I32 => Array::I32(self.fixed_vec(n, i32::from_le_bytes)?),
            ValueType::F32 => Array::F32(self.fixed_vec(n, f32::from_le_bytes)?),
            ValueType::Bool => Array::Bool(self.fixed_vec(n, |[b]| b != 0)?),
            ValueType::U64 => Array::U64(self.fixed_vec(n, u64::from_le_bytes)?),
            ValueType::I64 => Array::I64(self.fixed_vec(n, i64::from_le_bytes)?),
            ValueType::F64 => Array::F64(self.fixed_vec(n, f64::from_le_bytes)?),
            ValueType::String => {
                let mut v = Vec::with_capacity(n.min(PREALLOC) as usize);
                for _ in 0..n {
                    v.push(self.string("array string")?);
                }
                Array::String(v)
            }
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(Error::invalid(
                        start,
                        format!("arrays nested deeper than {MAX_ARRAY_DEPTH} levels"),
                    ));
                }
                let mut v = Vec::with_capacity(n.min(PREALLOC) as usize);
                for _ in 0..n {
                    v.push(self.array(depth + 1)?);
                }
                Array::Array(v)
            }
        })
    }

    pub(crate) fn count(&mut self, what: &str) -> Result<u64, Error> {
        let start = self.pos;
        let n = self.u64(what)?;
        if n > i64::MAX as u64 {
            return Err(Error::invalid(
                start,
                format!("{what} {n} is negative as int64"),
            ));
        }
        Ok(n)
    }
}
