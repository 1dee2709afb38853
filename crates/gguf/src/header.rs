//! The parsed header of one GGUF file and lookups on it.

use crate::types::GgmlType;
use crate::value::{Array, Value};

/// Alignment of the tensor data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// One tensor's description from the header (its data is never read).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions, innermost (ggml `ne[0]`, the row length) first.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
    /// Size of the data in bytes, from the type's block traits.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of elements (1 for a 0-dim tensor, as in ggml).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |n, d| n.saturating_mul(*d))
    }
}

/// Everything in a GGUF file before the tensor data.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    pub version: u32,
    /// Key/value pairs in file order.
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
    /// From `general.alignment`, else [`DEFAULT_ALIGNMENT`].
    pub alignment: u64,
    /// Absolute file offset of the tensor data section (padded to the
    /// alignment when there is at least one tensor, as gguf.cpp does).
    pub data_offset: u64,
}

impl Header {
    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// `key` as an unsigned integer (any non-negative integer type).
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    /// `key` as a signed integer (any integer type that fits).
    pub fn get_i64(&self, key: &str) -> Option<i64> {
        self.get(key)?.as_i64()
    }

    /// `key` as a float (any numeric type).
    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key)?.as_f64()
    }

    /// `key` as a bool.
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key)?.as_bool()
    }

    /// `key` as a string.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    /// `key` as an array.
    pub fn get_array(&self, key: &str) -> Option<&Array> {
        self.get(key)?.as_array()
    }

    /// `general.architecture` (e.g. `"llama"`).
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    /// `general.name`.
    pub fn name(&self) -> Option<&str> {
        self.get_str("general.name")
    }

    /// The value of `<arch>.<suffix>`, e.g. `arch_get("block_count")`.
    pub fn arch_get(&self, suffix: &str) -> Option<&Value> {
        let arch = self.architecture()?;
        self.metadata
            .iter()
            .find(|(k, _)| {
                k.len() == arch.len() + 1 + suffix.len()
                    && k.starts_with(arch)
                    && k.as_bytes()[arch.len()] == b'.'
                    && k.ends_with(suffix)
            })
            .map(|(_, v)| v)
    }

    /// `<arch>.<suffix>` as an unsigned integer.
    pub fn arch_u64(&self, suffix: &str) -> Option<u64> {
        self.arch_get(suffix)?.as_u64()
    }

    /// `<arch>.<suffix>` as a float.
    pub fn arch_f64(&self, suffix: &str) -> Option<f64> {
        self.arch_get(suffix)?.as_f64()
    }

    /// `<arch>.<suffix>` as a string.
    pub fn arch_str(&self, suffix: &str) -> Option<&str> {
        self.arch_get(suffix)?.as_str()
    }

    /// The tensor called `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Sum of the tensors' data sizes, without alignment padding.
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors
            .iter()
            .fold(0u64, |sum, t| sum.saturating_add(t.n_bytes))
    }

    /// Sum of the tensors' element counts (the parameter count).
    pub fn n_elements(&self) -> u64 {
        self.tensors
            .iter()
            .fold(0u64, |sum, t| sum.saturating_add(t.n_elements()))
    }

    /// Offset just past the end of the furthest tensor's data: the size a
    /// complete file must have at least.
    pub fn data_end(&self) -> u64 {
        self.tensors
            .iter()
            .map(|t| {
                self.data_offset
                    .saturating_add(t.offset)
                    .saturating_add(t.n_bytes)
            })
            .max()
            .unwrap_or(self.data_offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn huge(name: &str) -> TensorInfo {
        TensorInfo {
            name: name.into(),
            dims: vec![u64::MAX / 2, 4],
            ggml_type: GgmlType::from_id(0).unwrap(),
            offset: 0,
            n_bytes: u64::MAX / 2 + 1,
        }
    }

    /// Found by fuzzing: sizes that a corrupt header declares must not overflow the sums.
    #[test]
    fn sums_saturate_instead_of_overflowing() {
        let h = Header {
            version: 3,
            metadata: Vec::new(),
            tensors: vec![huge("a"), huge("b")],
            alignment: 32,
            data_offset: 0,
        };
        assert_eq!(h.tensor_bytes(), u64::MAX);
        assert_eq!(h.n_elements(), u64::MAX);
        assert_eq!(huge("c").n_elements(), u64::MAX);
    }
}
