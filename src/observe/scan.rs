//! The members of a JSON object, found without building it: each key as written between its
//! quotes and each value's raw text. Token counts are read this way from every answer, and the
//! model and stream flag from every JSON request, where serde spent more on validating and
//! matching keys than on anything else. Values are skipped by their brackets and quotes alone, so
//! malformed JSON inside a value that is not read goes unnoticed (the engine reads it, and
//! answers for it); the values that are read are parsed strictly by their readers.

/// Calls `member` with each key and value of the object that `text` starts with (after
/// whitespace), in order, and gives where the object ends (past its `}`); `None` when it is not
/// a complete object or `member` says so.
pub fn members<'a>(
    text: &'a [u8],
    mut member: impl FnMut(&'a [u8], &'a [u8]) -> Option<()>,
) -> Option<usize> {
    let mut at = skip_space(text, 0);
    if text.get(at) != Some(&b'{') {
        return None;
    }
    at = skip_space(text, at + 1);
    if text.get(at) == Some(&b'}') {
        return Some(at + 1);
    }
    loop {
        let key_end = string_end(text, at)?;
        let key = &text[at + 1..key_end - 1];
        at = skip_space(text, key_end);
        if text.get(at) != Some(&b':') {
            return None;
        }
        let start = skip_space(text, at + 1);
        let end = value_end(text, start)?;
        member(key, &text[start..end])?;
        at = skip_space(text, end);
        match text.get(at)? {
            b',' => at = skip_space(text, at + 1),
            b'}' => return Some(at + 1),
            _ => return None,
        }
    }
}

pub fn skip_space(text: &[u8], mut at: usize) -> usize {
    // compact JSON has none: one comparison says so (every JSON space is at most b' ')
    while text
        .get(at)
        .is_some_and(|&b| b <= b' ' && b.is_ascii_whitespace())
    {
        at += 1;
    }
    at
}

/// Where the string starting at `at` (its opening quote) ends, past its closing quote.
fn string_end(text: &[u8], at: usize) -> Option<usize> {
    if text.get(at) != Some(&b'"') {
        return None;
    }
    let mut i = at + 1;
    loop {
        i += memchr::memchr2(b'"', b'\\', text.get(i..)?)?;
        if text[i] == b'"' {
            return Some(i + 1);
        }
        i += 2; // an escape and the character it escapes
    }
}

/// Where the value starting at `at` ends: a string, an object or array with everything nested in
/// it, or a scalar up to the next delimiter.
fn value_end(text: &[u8], at: usize) -> Option<usize> {
    match text.get(at)? {
        b'"' => string_end(text, at),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = at;
            loop {
                match text.get(i)? {
                    b'"' => i = string_end(text, i)?,
                    b'{' | b'[' => (depth, i) = (depth + 1, i + 1),
                    b'}' | b']' => {
                        depth -= 1;
                        i += 1;
                        if depth == 0 {
                            return Some(i);
                        }
                    }
                    _ => i += 1,
                }
            }
        }
        _ => {
            // a number, `true`, `false` or `null`
            let rest = &text[at..];
            let len = rest
                .iter()
                .position(|&b| !SCALAR[usize::from(b)])
                .unwrap_or(rest.len());
            (len > 0).then_some(at + len)
        }
    }
}

/// The bytes a number, `true`, `false` or `null` is written with: one lookup per byte.
static SCALAR: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let byte = b as u8;
        table[b] = byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'+' | b'.');
        b += 1;
    }
    table
};

/// A JSON string's text, unescaped; `None` for any other value.
pub fn string(value: &[u8]) -> Option<String> {
    let inner = value.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    if inner.contains(&b'\\') {
        return serde_json::from_slice(value).ok();
    }
    String::from_utf8(inner.to_vec()).ok()
}

/// A JSON number as a count: `None` for `null`, `Err` for anything else that is not one. Read
/// digit by digit, as JSON writes an integer: no sign, no leading zero (which `str::parse`
/// takes), and no text made first.
pub fn count(value: &[u8]) -> Result<Option<u64>, ()> {
    match value {
        b"null" => Ok(None),
        b"0" => Ok(Some(0)),
        [b'1'..=b'9', ..] => value
            .iter()
            .try_fold(0u64, |n, &b| {
                let digit = b.checked_sub(b'0').filter(|d| *d < 10)?;
                n.checked_mul(10)?.checked_add(u64::from(digit))
            })
            .map(Some)
            .ok_or(()),
        _ => Err(()),
    }
}

/// A JSON number as a float: `None` for `null`, `Err` for anything else that is not one, or that
/// no float holds (as serde reads it: `str::parse` also takes `+1`, `.5`, `1.` and `01`, and
/// makes infinity of `1e400`).
pub fn float(value: &[u8]) -> Result<Option<f64>, ()> {
    if value == b"null" {
        return Ok(None);
    }
    if let Some(short) = short_decimal(value) {
        return Ok(Some(short));
    }
    if !is_json_number(value) {
        return Err(());
    }
    let text = std::str::from_utf8(value).map_err(|_| ())?;
    match text.parse::<f64>() {
        Ok(f) if f.is_finite() => Ok(Some(f)),
        _ => Err(()),
    }
}

/// A JSON number with no exponent and at most 15 digits (the speeds llama.cpp reports), read
/// without making text of it: its digits are an integer a double holds exactly, and one division
/// by a power of ten that a double also holds exactly rounds once, correctly, to what `str::parse`
/// gives (Clinger's fast path, the one `str::parse` takes for such numbers too). `None` for any
/// other text, numbers included, so it is checked as JSON writes a number as it is read.
fn short_decimal(text: &[u8]) -> Option<f64> {
    const POWERS: [f64; 16] = [
        1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
    ];
    let (negative, number) = match text {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, text),
    };
    // one pass: the digits, and how many came before the point
    let (mut mantissa, mut digits, mut point) = (0u64, 0usize, None);
    for &b in number {
        match b {
            b'0'..=b'9' => {
                mantissa = mantissa.wrapping_mul(10).wrapping_add(u64::from(b - b'0'));
                digits += 1;
            }
            b'.' if point.is_none() && digits > 0 => point = Some(digits),
            _ => return None, // not a number as JSON writes one, or one with an exponent
        }
    }
    let whole = point.unwrap_or(digits);
    let leading_zero = whole > 1 && number[0] == b'0';
    if digits == 0 || point == Some(digits) || leading_zero || digits > 15 {
        return None; // no digits after the point, or more than a double holds exactly
    }
    let value = mantissa as f64 / POWERS[digits - whole];
    Some(if negative { -value } else { value })
}

/// Whether `text` is a number as JSON writes one: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
fn is_json_number(text: &[u8]) -> bool {
    let digits = |at: usize| {
        text[at.min(text.len())..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count()
    };
    let mut at = usize::from(text.first() == Some(&b'-'));
    match text.get(at) {
        Some(b'0') => at += 1,
        Some(b'1'..=b'9') => at += digits(at),
        _ => return false,
    }
    if text.get(at) == Some(&b'.') {
        let fraction = digits(at + 1);
        if fraction == 0 {
            return false;
        }
        at += 1 + fraction;
    }
    if let Some(b'e' | b'E') = text.get(at) {
        at += 1;
        if let Some(b'+' | b'-') = text.get(at) {
            at += 1;
        }
        let exponent = digits(at);
        if exponent == 0 {
            return false;
        }
        at += exponent;
    }
    at == text.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(text: &str) -> Option<Vec<(String, String)>> {
        let mut out = Vec::new();
        members(text.as_bytes(), |k, v| {
            let s = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
            out.push((s(k), s(v)));
            Some(())
        })?;
        Some(out)
    }

    #[test]
    fn members_are_found_with_nested_values_and_strings_skipped_whole() {
        let text = r#" { "a" : 1, "b":{"c":[1,{"d":"}"}]}, "e\"f":"x\\\",]}" ,"g":null}trailing"#;
        let pairs = all(text).unwrap();
        let keys: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["a", "b", r#"e\"f"#, "g"]);
        assert_eq!(pairs[1].1, r#"{"c":[1,{"d":"}"}]}"#);
        assert_eq!(pairs[2].1, r#""x\\\",]}""#);
        assert_eq!(all("{}"), Some(vec![]));
    }

    #[test]
    fn incomplete_or_malformed_objects_are_refused() {
        for bad in [
            "",
            "[1]",
            "{",
            r#"{"a":1"#,
            r#"{"a" 1}"#,
            r#"{"a":}"#,
            r#"{"a":1;}"#,
            r#"{"a":"x}"#,
            r#"{"a":{"b":1}"#,
            "{a:1}",
        ] {
            assert_eq!(all(bad), None, "{bad:?}");
        }
    }

    proptest::proptest! {
        /// The short decimals read without text are the doubles `str::parse` reads.
        #[test]
        fn short_decimals_are_read_as_str_parse_reads_them(
            negative in proptest::bool::ANY,
            whole in 0u64..10_000_000_000,
            fraction in proptest::option::of("[0-9]{1,12}"),
        ) {
            let sign = if negative { "-" } else { "" };
            let text = match &fraction {
                Some(f) => format!("{sign}{whole}.{f}"),
                None => format!("{sign}{whole}"),
            };
            let parsed: f64 = text.parse().unwrap();
            let read = float(text.as_bytes()).unwrap().unwrap();
            proptest::prop_assert_eq!(read.to_bits(), parsed.to_bits(), "{}", text);
        }

        /// Any text of number characters reads as the JSON grammar and `str::parse` say: the
        /// short path takes nothing the grammar refuses.
        #[test]
        fn number_like_text_reads_as_the_grammar_says(text in "[-+.eE0-9]{0,20}") {
            let expected = match is_json_number(text.as_bytes()) {
                true => text.parse::<f64>().ok().filter(|f| f.is_finite()).map(f64::to_bits),
                false => None,
            };
            let read = float(text.as_bytes()).ok().flatten().map(f64::to_bits);
            proptest::prop_assert_eq!(read, expected, "{}", text);
        }
    }

    #[test]
    fn numbers_are_read_strictly() {
        assert_eq!(count(b"42"), Ok(Some(42)));
        assert_eq!(count(b"null"), Ok(None));
        assert_eq!(count(b"0"), Ok(Some(0)));
        assert_eq!(count(b"18446744073709551615"), Ok(Some(u64::MAX)));
        for bad in [
            &b"4.2"[..],
            b"-1",
            b"\"4\"",
            b"true",
            b"18446744073709551616",
            b"+4",
            b"042",
            b"00",
            b"",
            b"4a",
        ] {
            assert_eq!(count(bad), Err(()), "{bad:?}");
        }
        assert_eq!(float(b"1.5e2"), Ok(Some(150.0)));
        assert_eq!(float(b"7"), Ok(Some(7.0)));
        assert_eq!(float(b"null"), Ok(None));
        assert_eq!(float(b"-0.5E-3"), Ok(Some(-0.0005)));
        assert_eq!(float(b"0"), Ok(Some(0.0)));
        for bad in [
            &b"inf"[..],
            b"NaN",
            b"\"1\"",
            b"{}",
            b"+1",
            b".5",
            b"1.",
            b"01.5",
            b"1e",
            b"1e+",
            b"--1",
            b"-",
            b"1e400",
            b"1.2.3",
            b"-01",
            b"0.",
            b"-.5",
            b"1-2",
            b"1.5-",
        ] {
            assert_eq!(float(bad), Err(()), "{bad:?}");
        }
    }
}
