//! The scanner against serde: for generated `usage` and `timings` values (members known and
//! unknown, of every JSON type, repeated, in any order and spacing), the counts read are the ones
//! serde's derived structs read. One difference is meant and left out: serde reads an array where
//! a struct belongs by position, the scanner does not read it.

use proptest::prelude::*;

use super::*;

/// The counts as serde reads them: the structs `Tokens::from_slice` deserialized before.
fn by_serde(bytes: &[u8]) -> Option<Tokens> {
    #[derive(serde::Deserialize)]
    struct Details {
        cached_tokens: Option<u64>,
    }
    #[derive(serde::Deserialize)]
    struct Usage {
        prompt_tokens: Option<u64>,
        input_tokens: Option<u64>,
        completion_tokens: Option<u64>,
        output_tokens: Option<u64>,
        cache_read_input_tokens: Option<u64>,
        prompt_tokens_details: Option<Details>,
        input_tokens_details: Option<Details>,
    }
    #[derive(serde::Deserialize)]
    struct Timings {
        prompt_n: Option<u64>,
        predicted_n: Option<u64>,
        cache_n: Option<u64>,
        draft_n: Option<u64>,
        draft_n_accepted: Option<u64>,
        prompt_per_second: Option<f64>,
        predicted_per_second: Option<f64>,
    }
    fn parse<'a, T: serde::Deserialize<'a>>(text: Option<&'a [u8]>) -> Option<T> {
        T::deserialize(&mut serde_json::Deserializer::from_slice(text?)).ok()
    }
    let mut t = Tokens::default();
    let mut found = false;
    if let Some(u) = parse::<Option<Usage>>(value_of(bytes, &USAGE_KEY)).flatten() {
        let prompt = u.prompt_tokens.or(u.input_tokens);
        let completion = u.completion_tokens.or(u.output_tokens);
        if prompt.is_some() || completion.is_some() {
            (t.prompt, t.completion) = (prompt.unwrap_or(0), completion.unwrap_or(0));
            found = true;
        }
        let cached = |d: Option<Details>| d.and_then(|d| d.cached_tokens);
        t.cache = u
            .cache_read_input_tokens
            .or(cached(u.prompt_tokens_details))
            .or(cached(u.input_tokens_details));
    }
    if let Some(tm) = parse::<Option<Timings>>(value_of(bytes, &TIMINGS_KEY)).flatten() {
        if !found {
            (t.prompt, t.completion) = (tm.prompt_n.unwrap_or(0), tm.predicted_n.unwrap_or(0));
            found = true;
        }
        t.cache = t.cache.or(tm.cache_n);
        (t.draft, t.draft_accepted) = (tm.draft_n, tm.draft_n_accepted);
        t.prompt_per_second = tm.prompt_per_second;
        t.tokens_per_second = tm.predicted_per_second;
    }
    found.then_some(t)
}

/// The text from the value after the last `quoted_key:` in `bytes` on: every match looked at, from
/// the start.
fn value_of<'a>(bytes: &'a [u8], quoted_key: &Finder) -> Option<&'a [u8]> {
    let mut value = None;
    for at in quoted_key.find_iter(bytes) {
        let rest = &bytes[at + quoted_key.needle().len()..];
        if let Some(after) = rest.trim_ascii_start().strip_prefix(b":") {
            value = Some(after);
        }
    }
    value
}

/// A JSON value of any type; objects may hold `cached_tokens`.
fn value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        4 => (0u64..100_000).prop_map(|n| n.to_string()),
        1 => Just(u64::MAX.to_string()),
        1 => (1u32..100_000, 0u32..4).prop_map(|(n, d)| format!("{}.{}", n, d * 25)),
        1 => Just("-3".to_string()),
        1 => Just("2e3".to_string()),
        2 => Just("null".to_string()),
        1 => Just("true".to_string()),
        1 => "[a-z{}\\[\\],:\"]{0,6}".prop_map(|s| serde_json::to_string(&s).unwrap()),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(|v| format!("[{}]", v.join(","))),
            prop::collection::vec(
                (
                    prop_oneof![Just("cached_tokens"), Just("audio_tokens")],
                    inner
                ),
                0..3
            )
            .prop_map(|m| object(&m)),
        ]
    })
}

fn object(members: &[(&str, String)]) -> String {
    let inner: Vec<String> = members
        .iter()
        .map(|(k, v)| format!("\"{k}\" : {v}"))
        .collect();
    format!("{{ {} }}", inner.join(", "))
}

/// A `usage` or `timings` value: usually an object of known and unknown members.
fn counts_value(keys: &'static [&'static str]) -> impl Strategy<Value = String> {
    let member = (prop::sample::select(keys), value()).prop_map(|(key, value)| {
        let array_for_struct = key.ends_with("_details") && value.starts_with('[');
        (
            key,
            if array_for_struct {
                "null".into()
            } else {
                value
            },
        )
    });
    prop_oneof![
        6 => prop::collection::vec(member, 0..8).prop_map(|m| object(&m)),
        1 => value().prop_filter("an array is read by position by serde", |v| !v.starts_with('[')),
    ]
}

const USAGE_KEYS: &[&str] = &[
    "prompt_tokens",
    "input_tokens",
    "completion_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "prompt_tokens_details",
    "input_tokens_details",
    "total_tokens",
    "service_tier",
];
const TIMINGS_KEYS: &[&str] = &[
    "prompt_n",
    "predicted_n",
    "cache_n",
    "draft_n",
    "draft_n_accepted",
    "prompt_per_second",
    "predicted_per_second",
    "prompt_ms",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn the_scanner_reads_what_serde_reads(
        usage in proptest::option::of(counts_value(USAGE_KEYS)),
        timings in proptest::option::of(counts_value(TIMINGS_KEYS)),
        timings_first in any::<bool>(),
    ) {
        let mut members = vec![("id", "\"chatcmpl-1\"".to_string())];
        let parts = [usage.map(|u| ("usage", u)), timings.map(|t| ("timings", t))];
        let parts = if timings_first { [parts[1].clone(), parts[0].clone()] } else { parts };
        members.extend(parts.into_iter().flatten());
        let doc = object(&members);
        prop_assert_eq!(Tokens::from_slice(doc.as_bytes()), by_serde(doc.as_bytes()), "{}", doc);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// Several `usage` and `timings` keys, at the top or nested, in any order: the last of each
    /// is read, whether it comes before or after the other's.
    #[test]
    fn the_last_key_of_each_is_read_wherever_it_is(
        keys in prop::collection::vec(
            (any::<bool>(), any::<bool>(), 0u64..1000),
            0..6,
        ),
    ) {
        let members: Vec<(&str, String)> = keys
            .iter()
            .enumerate()
            .map(|(i, &(timings, nested, n))| {
                let (key, count) = match timings {
                    true => ("timings", "cache_n"),
                    false => ("usage", "completion_tokens"),
                };
                let value = format!("{{\"{count}\": {n}}}");
                let member = if nested { object(&[(key, value)]) } else { value };
                (if nested { ["a", "b", "c", "d", "e", "f"][i] } else { key }, member)
            })
            .collect();
        let doc = object(&members);
        prop_assert_eq!(Tokens::from_slice(doc.as_bytes()), by_serde(doc.as_bytes()), "{}", doc);
    }
}
