//! Finding the model in a request body: JSON, multipart, form or anything else, and rewriting a
//! multipart body's model field. The first byte picks the content type, the rest is the body.
#![no_main]

use corral::{classify, model_from_body, query_param, rewrite_multipart_model, BodyKind};
use http::{header, HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;

const CONTENT_TYPES: &[&str] = &[
    "application/json",
    "multipart/form-data; boundary=XyZ",
    "multipart/form-data; boundary=\"a b\"",
    "multipart/form-data; boundary=",
    "application/x-www-form-urlencoded",
    "text/plain",
];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let mut headers = HeaderMap::new();
    let content_type = CONTENT_TYPES[selector as usize % CONTENT_TYPES.len()];
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    let mut kind = classify(&headers, body);
    let _ = model_from_body(&mut kind, body);
    let text = String::from_utf8_lossy(body);
    let _ = query_param(&text, "model");
    if let BodyKind::Multipart(boundary) = kind.clone() {
        if let Some(rewritten) = rewrite_multipart_model(body, &boundary, "fuzzed-model") {
            let (model, _) = model_from_body(&mut kind, &rewritten);
            assert_eq!(
                model.as_deref(),
                Some("fuzzed-model"),
                "the rewritten field reads back"
            );
        }
    }
});
