//! ggml tensor types and their storage traits (block size, bytes per block).
//!
//! The table mirrors `type_traits` in llama.cpp's `ggml/src/ggml.c` (and
//! `GGML_QUANT_SIZES` in gguf-py). Removed or repacked-only ids (4, 5, 31..33,
//! 36..38) are not valid in GGUF files, so they are unknown here too.

use std::fmt;

macro_rules! ggml_types {
    ($($variant:ident = $id:literal, $name:literal, $blck:expr, $size:expr;)*) => {
        /// A tensor element type as stored in a GGUF tensor info.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[allow(non_camel_case_types)]
        pub enum GgmlType {
            $($variant = $id,)*
        }

        impl GgmlType {
            /// Every type this crate knows, in id order.
            pub const ALL: &'static [GgmlType] = &[$(GgmlType::$variant,)*];

            /// The type for a raw id from a file, if known.
            pub fn from_id(id: u32) -> Option<GgmlType> {
                match id {
                    $($id => Some(GgmlType::$variant),)*
                    _ => None,
                }
            }

            /// ggml's lower-case name (`"f32"`, `"q4_K"`, ...).
            pub fn name(self) -> &'static str {
                match self {
                    $(GgmlType::$variant => $name,)*
                }
            }

            /// Elements per block (1 for plain types).
            pub fn block_size(self) -> u64 {
                match self {
                    $(GgmlType::$variant => $blck,)*
                }
            }

            /// Bytes per block.
            pub fn type_size(self) -> u64 {
                match self {
                    $(GgmlType::$variant => $size,)*
                }
            }
        }
    };
}

const QK_K: u64 = 256;

ggml_types! {
    F32 = 0, "f32", 1, 4;
    F16 = 1, "f16", 1, 2;
    Q4_0 = 2, "q4_0", 32, 2 + 16;
    Q4_1 = 3, "q4_1", 32, 2 + 2 + 16;
    Q5_0 = 6, "q5_0", 32, 2 + 4 + 16;
    Q5_1 = 7, "q5_1", 32, 2 + 2 + 4 + 16;
    Q8_0 = 8, "q8_0", 32, 2 + 32;
    Q8_1 = 9, "q8_1", 32, 2 + 2 + 32;
    Q2_K = 10, "q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4;
    Q3_K = 11, "q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12;
    Q4_K = 12, "q4_K", QK_K, 2 + 2 + QK_K / 2 + 12;
    Q5_K = 13, "q5_K", QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12;
    Q6_K = 14, "q6_K", QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16;
    Q8_K = 15, "q8_K", QK_K, 4 + QK_K + QK_K / 8;
    IQ2_XXS = 16, "iq2_xxs", QK_K, 2 + QK_K / 4;
    IQ2_XS = 17, "iq2_xs", QK_K, 2 + QK_K / 4 + QK_K / 32;
    IQ3_XXS = 18, "iq3_xxs", QK_K, 2 + QK_K / 4 + QK_K / 8;
    IQ1_S = 19, "iq1_s", QK_K, 2 + QK_K / 8 + QK_K / 16;
    IQ4_NL = 20, "iq4_nl", 32, 2 + 16;
    IQ3_S = 21, "iq3_s", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4;
    IQ2_S = 22, "iq2_s", QK_K, 2 + QK_K / 4 + QK_K / 16;
    IQ4_XS = 23, "iq4_xs", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64;
    I8 = 24, "i8", 1, 1;
    I16 = 25, "i16", 1, 2;
    I32 = 26, "i32", 1, 4;
    I64 = 27, "i64", 1, 8;
    F64 = 28, "f64", 1, 8;
    IQ1_M = 29, "iq1_m", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32;
    BF16 = 30, "bf16", 1, 2;
    TQ1_0 = 34, "tq1_0", QK_K, 2 + 4 * 13;
    TQ2_0 = 35, "tq2_0", QK_K, 2 + 64;
    MXFP4 = 39, "mxfp4", 32, 1 + 16;
    NVFP4 = 40, "nvfp4", 64, 4 + 32;
    Q1_0 = 41, "q1_0", 128, 2 + 16;
    Q2_0 = 42, "q2_0", 64, 2 + 16;
}

impl GgmlType {
    /// The raw id written to files.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Bytes of a contiguous tensor with these dims (ne0 first), or `None`
    /// when ne0 is not a whole number of blocks or the size overflows u64.
    pub fn bytes_for(self, dims: &[u64]) -> Option<u64> {
        let ne0 = dims.first().copied().unwrap_or(1);
        if ne0 % self.block_size() != 0 {
            return None;
        }
        let mut n = (ne0 / self.block_size()).checked_mul(self.type_size())?;
        for &d in dims.iter().skip(1) {
            n = n.checked_mul(d)?;
        }
        Some(n)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
