//! Writing GGUF files (v3 or v2), mainly so tests can make any file they need.

use std::fs::File;
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::header::DEFAULT_ALIGNMENT;
use crate::types::GgmlType;
use crate::value::{Array, Value};

/// A tensor's payload: given bytes, or zeros that [`Writer::write_file`]
/// leaves as a hole so a fake 70B model costs no disk.
#[derive(Debug, Clone, PartialEq)]
enum TensorData {
    Bytes(Vec<u8>),
    Zeros,
}

#[derive(Debug, Clone, PartialEq)]
struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    data: TensorData,
}

/// Collects metadata and tensors, then writes them as one file or as
/// `<prefix>-0000i-of-0000N.gguf` split parts.
#[derive(Debug, Clone, PartialEq)]
pub struct Writer {
    version: u32,
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
}

impl Default for Writer {
    fn default() -> Self {
        Writer::new()
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

impl Writer {
    /// An empty GGUF v3 file.
    pub fn new() -> Writer {
        Writer::with_version(3)
    }

    /// An empty file of the given version (2 and 3 share one layout; other
    /// numbers are written as asked, for negative tests).
    pub fn with_version(version: u32) -> Writer {
        Writer {
            version,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Sets `key`, replacing an earlier value in place (keeps file order).
    pub fn set(&mut self, key: impl Into<String>, value: impl Into<Value>) -> &mut Self {
        let (key, value) = (key.into(), value.into());
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key, value)),
        }
        self
    }

    /// Sets `general.alignment` (must be a power of two to be valid).
    pub fn set_alignment(&mut self, alignment: u32) -> &mut Self {
        self.set("general.alignment", alignment)
    }

    /// The alignment the data section will use.
    pub fn alignment(&self) -> u64 {
        match self.metadata.iter().find(|(k, _)| k == "general.alignment") {
            Some((_, Value::U32(a))) => u64::from(*a),
            _ => DEFAULT_ALIGNMENT,
        }
    }

    /// The metadata so far, in order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// Adds a tensor whose `data` must be exactly its size for `ty` and
    /// `dims` (checked when writing).
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
        data: Vec<u8>,
    ) -> &mut Self {
        self.push(name.into(), dims, ty, TensorData::Bytes(data))
    }

    /// Adds an all-zero tensor, written sparsely by [`Writer::write_file`].
    pub fn add_zero_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
    ) -> &mut Self {
        self.push(name.into(), dims, ty, TensorData::Zeros)
    }

    fn push(&mut self, name: String, dims: &[u64], ty: GgmlType, data: TensorData) -> &mut Self {
        self.tensors.push(PendingTensor {
            name,
            dims: dims.to_vec(),
            ty,
            data,
        });
        self
    }

    /// Writes the whole file to `w`; zero tensors are written as zeros.
    pub fn write_to<W: Write>(&self, w: W) -> io::Result<()> {
        let mut sink = Plain(w);
        self.write_part(&mut sink, &self.metadata, &self.tensors)?;
        sink.0.flush()
    }

    /// Writes the whole file to `path`, leaving zero tensors as holes.
    pub fn write_file(&self, path: impl AsRef<Path>) -> io::Result<()> {
        write_sparse(path.as_ref(), |sink| {
            self.write_part(sink, &self.metadata, &self.tensors)
        })
    }

    /// Writes `n_parts` files named like llama.cpp's gguf-split output
    /// (`<prefix>-00001-of-00003.gguf`, ...), tensors spread in order, all
    /// metadata in the first part, `split.no`/`split.count`/
    /// `split.tensors.count` in every part. Returns the paths in order.
    pub fn write_split(&self, prefix: impl AsRef<Path>, n_parts: u16) -> io::Result<Vec<PathBuf>> {
        if n_parts == 0 {
            return Err(invalid("a split needs at least one part".into()));
        }
        let n_tensors =
            i32::try_from(self.tensors.len()).map_err(|_| invalid("too many tensors".into()))?;
        let prefix = prefix.as_ref().as_os_str().to_string_lossy().into_owned();
        let per = self.tensors.len().div_ceil(n_parts as usize).max(1);
        let mut paths = Vec::new();
        for i in 0..n_parts {
            let lo = (i as usize * per).min(self.tensors.len());
            let hi = (lo + per).min(self.tensors.len());
            let mut meta: Vec<(String, Value)> = if i == 0 {
                self.metadata
                    .iter()
                    .filter(|(k, _)| !k.starts_with("split."))
                    .cloned()
                    .collect()
            } else {
                self.metadata
                    .iter()
                    .filter(|(k, _)| k == "general.alignment")
                    .cloned()
                    .collect()
            };
            meta.push(("split.no".into(), Value::U16(i)));
            meta.push(("split.count".into(), Value::U16(n_parts)));
            meta.push(("split.tensors.count".into(), Value::I32(n_tensors)));
            let path = PathBuf::from(format!("{prefix}-{:05}-of-{:05}.gguf", i + 1, n_parts));
            write_sparse(&path, |sink| {
                self.write_part(sink, &meta, &self.tensors[lo..hi])
            })?;
            paths.push(path);
        }
        Ok(paths)
    }

    fn write_part<S: Sink>(
        &self,
        w: &mut S,
        meta: &[(String, Value)],
        tensors: &[PendingTensor],
    ) -> io::Result<()> {
        let align = self.alignment();
        // Without tensors alignment is unused: allow writing bad values for tests.
        if !align.is_power_of_two() && !tensors.is_empty() {
            return Err(invalid(format!("alignment {align} is not a power of two")));
        }
        let mut sizes = Vec::with_capacity(tensors.len());
        for t in tensors {
            let n = t.ty.bytes_for(&t.dims).ok_or_else(|| {
                invalid(format!(
                    "tensor '{}': bad shape {:?} for {}",
                    t.name, t.dims, t.ty
                ))
            })?;
            if let TensorData::Bytes(b) = &t.data {
                if b.len() as u64 != n {
                    return Err(invalid(format!(
                        "tensor '{}': {} data bytes, shape needs {n}",
                        t.name,
                        b.len()
                    )));
                }
            }
            sizes.push(n);
        }
        w.write_all(b"GGUF")?;
        w.write_all(&self.version.to_le_bytes())?;
        w.write_all(&(tensors.len() as u64).to_le_bytes())?;
        w.write_all(&(meta.len() as u64).to_le_bytes())?;
        let mut pos: u64 = 24;
        for (k, v) in meta {
            pos += write_str(w, k)?;
            w.write_all(&v.value_type().id().to_le_bytes())?;
            pos += 4 + write_value(w, v)?;
        }
        let mut offset = 0u64;
        for (t, &n) in tensors.iter().zip(&sizes) {
            pos += write_str(w, &t.name)?;
            w.write_all(&(t.dims.len() as u32).to_le_bytes())?;
            for d in &t.dims {
                w.write_all(&d.to_le_bytes())?;
            }
            w.write_all(&t.ty.id().to_le_bytes())?;
            w.write_all(&offset.to_le_bytes())?;
            pos += 4 + 8 * t.dims.len() as u64 + 4 + 8;
            offset += n.next_multiple_of(align);
        }
        if tensors.is_empty() {
            return Ok(());
        }
        w.zeros(pos.next_multiple_of(align) - pos)?;
        for (t, &n) in tensors.iter().zip(&sizes) {
            match &t.data {
                TensorData::Bytes(b) => w.write_all(b)?,
                TensorData::Zeros => w.zeros(n)?,
            }
            w.zeros(n.next_multiple_of(align) - n)?;
        }
        Ok(())
    }
}

/// Where bytes go: zeros may be skipped rather than written.
trait Sink: Write {
    fn zeros(&mut self, n: u64) -> io::Result<()>;
}

struct Plain<W>(W);

impl<W: Write> Write for Plain<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl<W: Write> Sink for Plain<W> {
    fn zeros(&mut self, mut n: u64) -> io::Result<()> {
        let buf = [0u8; 4096];
        while n > 0 {
            let k = n.min(buf.len() as u64) as usize;
            self.0.write_all(&buf[..k])?;
            n -= k as u64;
        }
        Ok(())
    }
}

impl Sink for BufWriter<File> {
    fn zeros(&mut self, n: u64) -> io::Result<()> {
        if n < 4096 {
            return Plain(self).zeros(n);
        }
        let n = i64::try_from(n).map_err(|_| invalid("tensor too large".into()))?;
        self.seek(SeekFrom::Current(n)).map(|_| ())
    }
}

/// Creates `path`, runs `body`, then sets the length so trailing holes count.
fn write_sparse(
    path: &Path,
    body: impl FnOnce(&mut BufWriter<File>) -> io::Result<()>,
) -> io::Result<()> {
    let mut w = BufWriter::new(File::create(path)?);
    body(&mut w)?;
    let end = w.stream_position()?;
    let file = w.into_inner().map_err(|e| e.into_error())?;
    file.set_len(end)?;
    file.sync_all()
}

fn write_str<W: Write>(w: &mut W, s: &str) -> io::Result<u64> {
    w.write_all(&(s.len() as u64).to_le_bytes())?;
    w.write_all(s.as_bytes())?;
    Ok(8 + s.len() as u64)
}

/// Writes the value body (no type tag); returns the bytes written.
fn write_value<W: Write>(w: &mut W, v: &Value) -> io::Result<u64> {
    let b: &[u8] = match v {
        Value::U8(x) => &x.to_le_bytes(),
        Value::I8(x) => &x.to_le_bytes(),
        Value::U16(x) => &x.to_le_bytes(),
        Value::I16(x) => &x.to_le_bytes(),
        Value::U32(x) => &x.to_le_bytes(),
        Value::I32(x) => &x.to_le_bytes(),
        Value::F32(x) => &x.to_le_bytes(),
        Value::Bool(x) => &[*x as u8],
        Value::U64(x) => &x.to_le_bytes(),
        Value::I64(x) => &x.to_le_bytes(),
        Value::F64(x) => &x.to_le_bytes(),
        Value::String(s) => return write_str(w, s),
        Value::Array(a) => return write_array(w, a),
    };
    w.write_all(b)?;
    Ok(b.len() as u64)
}

/// Writes element type, count and elements of an array.
fn write_array<W: Write>(w: &mut W, a: &Array) -> io::Result<u64> {
    w.write_all(&a.elem_type().id().to_le_bytes())?;
    w.write_all(&(a.len() as u64).to_le_bytes())?;
    let mut n = 12;
    macro_rules! fixed {
        ($v:expr) => {{
            for x in $v {
                let b = x.to_le_bytes();
                w.write_all(&b)?;
                n += b.len() as u64;
            }
        }};
    }
    match a {
        Array::U8(v) => fixed!(v),
        Array::I8(v) => fixed!(v),
        Array::U16(v) => fixed!(v),
        Array::I16(v) => fixed!(v),
        Array::U32(v) => fixed!(v),
        Array::I32(v) => fixed!(v),
        Array::F32(v) => fixed!(v),
        Array::Bool(v) => fixed!(v.iter().map(|&b| b as u8)),
        Array::U64(v) => fixed!(v),
        Array::I64(v) => fixed!(v),
        Array::F64(v) => fixed!(v),
        Array::String(v) => {
            for s in v {
                n += write_str(w, s)?;
            }
        }
        Array::Array(v) => {
            for inner in v {
                n += write_array(w, inner)?;
            }
        }
    }
    Ok(n)
}
