//! The member scanner against serde: for generated JSON objects (the members `classify` reads and
//! others, of every JSON type, strings escaped every way JSON allows, repeated, in any order and
//! spacing, with or without trailing text), the model and stream flag read are the ones the serde
//! struct read. Two differences are meant and left out: serde unescapes keys, so `"mod\u0065l"`
//! names the model for serde and not for the scanner, which reads keys as written (no client
//! escapes a plain key); and serde refused a body with malformed JSON in a member it did not
//! read, where the scanner reads the model and lets the engine answer for the rest, as
//! llama-swap does (`tests::a_malformed_member_is_left_to_the_engine`).

use proptest::prelude::*;

use super::*;

/// The kind as serde read it: the struct `classify` deserialized before.
fn by_serde(body: &[u8]) -> BodyKind {
    #[derive(serde::Deserialize)]
    struct Peek {
        model: Option<serde_json::Value>,
        stream: Option<serde_json::Value>,
    }
    match serde_json::from_slice::<Peek>(body) {
        Ok(p) => BodyKind::Json {
            model: p.model.and_then(|m| m.as_str().map(String::from)),
            stream: p.stream.and_then(|s| s.as_bool()).unwrap_or(false),
        },
        Err(_) => BodyKind::Other,
    }
}

/// A string's JSON text, every character written as a `\u` escape (pairs beyond the BMP).
fn all_escaped(text: &str) -> String {
    let mut out = String::from("\"");
    for unit in text.encode_utf16() {
        out.push_str(&format!("\\u{unit:04x}"));
    }
    out + "\""
}

/// A JSON string: as serde writes it, with every character escaped, or with `\/`.
fn string() -> impl Strategy<Value = String> {
    let text = prop_oneof![
        3 => "[a-z0-9:/._-]{0,12}",
        2 => any::<String>(),
        1 => "[\"\\\\/{}\\[\\],]{0,6}",
    ];
    (text, 0u8..4).prop_map(|(text, how)| match how {
        0 => all_escaped(&text),
        1 => serde_json::to_string(&text).unwrap().replace('/', "\\/"),
        _ => serde_json::to_string(&text).unwrap(),
    })
}

/// A JSON value of any type.
fn value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        3 => string(),
        2 => (0u64..100_000).prop_map(|n| n.to_string()),
        1 => Just("-2.5e3".to_string()),
        1 => Just("null".to_string()),
        1 => Just("true".to_string()),
        1 => Just("false".to_string()),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(|v| format!("[{}]", v.join(","))),
            prop::collection::vec((string(), inner), 0..3).prop_map(|m| {
                let m: Vec<String> = m.into_iter().map(|(k, v)| format!("{k}:{v}")).collect();
                format!("{{{}}}", m.join(","))
            }),
        ]
    })
}

const KEYS: &[&str] = &[
    "model",
    "stream",
    "messages",
    "max_tokens",
    "Model",
    "modelx",
];

/// A request body: an object of those members, spaced one of three ways, maybe with text after it.
fn body() -> impl Strategy<Value = String> {
    let member = (prop::sample::select(KEYS), value());
    let space = prop::sample::select(&["", " ", "\n\t "][..]);
    let after = prop::sample::select(&["", " \n", " x", "{}", ","][..]);
    (prop::collection::vec(member, 0..5), space, after).prop_map(|(members, s, after)| {
        let members: Vec<String> = members
            .iter()
            .map(|(k, v)| format!("{s}\"{k}\"{s}:{s}{v}{s}"))
            .collect();
        format!("{s}{{{}}}{after}", members.join(","))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn the_scanner_reads_the_model_and_stream_serde_reads(body in body()) {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
        prop_assert_eq!(classify(&headers, body.as_bytes()), by_serde(body.as_bytes()), "{}", body);
    }
}
