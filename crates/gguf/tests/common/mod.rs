//! Shared test helpers (std only, so no tempfile dependency).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use gguf::{Array, GgmlType, Value, Writer};

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let p = std::env::temp_dir().join(format!("gguf-test-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One value of every scalar type, plus strings and arrays (nested too).
pub fn every_value() -> Vec<(String, Value)> {
    let v: Vec<(&str, Value)> = vec![
        ("t.u8", Value::U8(200)),
        ("t.i8", Value::I8(-100)),
        ("t.u16", Value::U16(60000)),
        ("t.i16", Value::I16(-30000)),
        ("t.u32", Value::U32(4_000_000_000)),
        ("t.i32", Value::I32(-2_000_000_000)),
        ("t.f32", Value::F32(1.5e-3)),
        ("t.bool.true", Value::Bool(true)),
        ("t.bool.false", Value::Bool(false)),
        ("t.str", Value::String("héllo ✓".into())),
        ("t.str.empty", Value::String(String::new())),
        ("t.u64", Value::U64(u64::MAX)),
        ("t.i64", Value::I64(i64::MIN)),
        ("t.f64", Value::F64(-2.25e300)),
        ("a.u8", Array::U8(vec![0, 1, 255]).into()),
        ("a.i8", Array::I8(vec![-128, 0, 127]).into()),
        ("a.u16", Array::U16(vec![1, 65535]).into()),
        ("a.i16", Array::I16(vec![-1, 32767]).into()),
        ("a.u32", Array::U32(vec![7; 5]).into()),
        ("a.i32", Array::I32(vec![-7, 7]).into()),
        ("a.f32", Array::F32(vec![0.5, -0.25]).into()),
        ("a.bool", Array::Bool(vec![true, false, true]).into()),
        (
            "a.str",
            Array::String(vec!["a".into(), String::new(), "ü".into()]).into(),
        ),
        ("a.u64", Array::U64(vec![u64::MAX, 0]).into()),
        ("a.i64", Array::I64(vec![i64::MIN, i64::MAX]).into()),
        ("a.f64", Array::F64(vec![1e-300, 3.0]).into()),
        ("a.empty", Array::empty(gguf::ValueType::F32).into()),
        (
            "a.nested",
            Array::Array(vec![
                Array::I32(vec![1, 2, 3]),
                Array::String(vec!["x".into()]),
                Array::Array(vec![
                    Array::U8(vec![9]),
                    Array::empty(gguf::ValueType::Bool),
                ]),
                Array::empty(gguf::ValueType::U64),
            ])
            .into(),
        ),
    ];
    v.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// A small valid file with metadata of every type and three tensors.
pub fn small_writer(version: u32) -> Writer {
    let mut w = Writer::with_version(version);
    w.set("general.architecture", "llama")
        .set("llama.block_count", 2u32);
    for (k, v) in every_value() {
        w.set(k, v);
    }
    w.add_tensor("a", &[4, 2], GgmlType::F32, vec![1; 32])
        .add_tensor("b", &[3], GgmlType::F16, vec![2; 6])
        .add_tensor("c", &[32, 2], GgmlType::Q4_0, vec![3; 36]);
    w
}

pub fn bytes_of(w: &Writer) -> Vec<u8> {
    let mut out = Vec::new();
    w.write_to(&mut out).unwrap();
    out
}
