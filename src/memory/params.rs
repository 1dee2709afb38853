//! Sizes for engines whose weights corral cannot read (vLLM, SGLang, ...):
//! the user states a parameter count and a quantization, and the weights are
//! priced per parameter. Also parsers for the human sizes used in config.

/// Known quantizations and their bytes per parameter, in thousandths. The
/// 4-bit formats carry scales and unquantized embeddings/norms (~0.55 B);
/// `gguf` is a typical Q4_K_M/Q5 mix.
pub const QUANTS: &[(&str, u64)] = &[
    ("fp32", 4000),
    ("fp16", 2000),
    ("bf16", 2000),
    ("fp8", 1000),
    ("int8", 1000),
    ("int4", 550),
    ("awq", 550),
    ("gptq", 550),
    ("mxfp4", 550),
    ("gguf", 600),
];

/// Weights of `params` parameters in `quant` (case-insensitive) plus
/// `kv_bytes` of cache, in bytes.
pub fn estimate_params(params: u64, quant: &str, kv_bytes: u64) -> Result<u64, String> {
    let milli = QUANTS
        .iter()
        .find(|(q, _)| q.eq_ignore_ascii_case(quant.trim()))
        .map(|&(_, m)| m)
        .ok_or_else(|| {
            let known: Vec<&str> = QUANTS.iter().map(|(q, _)| *q).collect();
            format!(
                "unknown quantization '{quant}' (known: {})",
                known.join(", ")
            )
        })?;
    let weights = u128::from(params) * u128::from(milli) / 1000;
    u64::try_from(weights + u128::from(kv_bytes))
        .map_err(|_| format!("{params} parameters in {quant} overflow a byte count"))
}

/// `num * scale` for a decimal `num` like `1.5`, exactly, rounded to the
/// nearest integer.
fn scaled(num: &str, scale: u64) -> Option<u64> {
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if (int.is_empty() && frac.is_empty()) || !digits(int) || !digits(frac) || frac.len() > 18 {
        return None;
    }
    let den = 10u128.pow(frac.len() as u32);
    let int: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let frac: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().ok()?
    };
    let n = (int.checked_mul(den)?.checked_add(frac)?).checked_mul(u128::from(scale))?;
    u64::try_from(n.checked_add(den / 2)? / den).ok()
}

/// Splits `"24 GiB"` into (`"24"`, `"GiB"`).
fn split_unit(s: &str) -> (&str, &str) {
    let s = s.trim();
    let at = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    (&s[..at], s[at..].trim())
}

/// A byte size: a plain number, or with a unit: `KB`/`MB`/`GB`/`TB`
/// (powers of 1000), `KiB`/`MiB`/`GiB`/`TiB` or the bare `K`/`M`/`G`/`T`
/// (powers of 1024, as Docker reads them), case-insensitive; `1.5GiB` works.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let (num, unit) = split_unit(s);
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        _ => {
            return Err(format!(
                "'{s}': unknown size unit '{unit}' (use e.g. 24GiB, 24GB, 512MiB or a byte count)"
            ))
        }
    };
    scaled(num, scale).ok_or_else(|| {
        format!("'{s}' is not a size (use e.g. 24GiB, 24GB, 512MiB or a byte count)")
    })
}

/// A parameter count: a plain number or with `K`, `M`, `B` (billion) or `T`
/// suffix, case-insensitive: `7B`, `70b`, `1.5B`, `350M`.
pub fn parse_params(s: &str) -> Result<u64, String> {
    let (num, unit) = split_unit(s);
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" => 1,
        "k" => 1_000,
        "m" => 1_000_000,
        "b" => 1_000_000_000,
        "t" => 1_000_000_000_000,
        _ => {
            return Err(format!(
                "'{s}': unknown suffix '{unit}' (use e.g. 7B, 1.5B or 350M)"
            ))
        }
    };
    scaled(num, scale)
        .ok_or_else(|| format!("'{s}' is not a parameter count (use e.g. 7B, 1.5B or 350M)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1_000_000_000;

    #[test]
    fn estimate_params_table() {
        assert_eq!(estimate_params(7 * GB, "fp16", 0), Ok(14 * GB));
        assert_eq!(estimate_params(7 * GB, "BF16", 5), Ok(14 * GB + 5));
        assert_eq!(estimate_params(7 * GB, "fp32", 0), Ok(28 * GB));
        assert_eq!(estimate_params(7 * GB, "Fp8", 0), Ok(7 * GB));
        assert_eq!(estimate_params(7 * GB, "int8", 0), Ok(7 * GB));
        for q in ["int4", "AWQ", "gptq", "mxfp4"] {
            assert_eq!(estimate_params(10 * GB, q, 0), Ok(5_500_000_000), "{q}");
        }
        assert_eq!(estimate_params(10 * GB, "gguf", 1), Ok(6 * GB + 1));
        let err = estimate_params(GB, "q3", 0).unwrap_err();
        assert!(
            err.contains("'q3'") && err.contains("fp16") && err.contains("gguf"),
            "{err}"
        );
        assert!(estimate_params(u64::MAX, "fp32", 0).is_err());
    }

    #[test]
    fn bytes() {
        assert_eq!(parse_bytes("24GiB"), Ok(24 << 30));
        assert_eq!(parse_bytes("24GB"), Ok(24 * GB));
        assert_eq!(parse_bytes("24000000000"), Ok(24 * GB));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes(" 1.5 gib "), Ok(3 << 29));
        assert_eq!(parse_bytes("80G"), Ok(80 << 30));
        assert_eq!(parse_bytes("0.5KB"), Ok(500));
        for bad in [
            "",
            "GiB",
            "1.2.3GB",
            "-1GB",
            "12 parsecs",
            "1e9",
            "99999999999TiB",
            // the largest u128 over 10, and a fraction: its sum with the fraction overflows
            "34028236692093846346337460743176821145.9",
        ] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn params() {
        assert_eq!(parse_params("7B"), Ok(7 * GB));
        assert_eq!(parse_params("70b"), Ok(70 * GB));
        assert_eq!(parse_params("1.5B"), Ok(1_500_000_000));
        assert_eq!(parse_params("350M"), Ok(350_000_000));
        assert_eq!(parse_params("0.6b"), Ok(600_000_000));
        assert_eq!(parse_params("1T"), Ok(1_000_000_000_000));
        assert_eq!(parse_params("123"), Ok(123));
        for bad in ["", "B", "7GB", "x7B", "7 billion"] {
            assert!(parse_params(bad).is_err(), "{bad}");
        }
    }
}
