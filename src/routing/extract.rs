//! Finding the requested model in a request, and rewriting it on the way upstream.

use bytes::{Bytes, BytesMut};
use http::{header, HeaderMap};
use http_body_util::{BodyExt, Limited};

use crate::observe::scan;
use crate::proxy::error::Error;
use crate::routing::budget::{BodyBudget, Charge};

/// Reads a whole request body, refusing more than `limit` bytes (413) and more than the shared
/// budget has room for (503). Bytes are charged as they arrive, so a client that declares a large
/// body and sends nothing holds nothing; one whose declared length does not fit in what is left is
/// refused before a byte is read. The charge goes back when the returned [`Charge`] is dropped.
/// `declared` is the body's [`declared_length`].
pub async fn read_body<B>(
    declared: Option<u64>,
    body: B,
    limit: u64,
    budget: &BodyBudget,
) -> Result<(Bytes, Charge), Error>
where
    B: http_body::Body<Data = Bytes> + Send,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    if declared.is_some_and(|n| n > limit) {
        return Err(Error::BodyTooLarge(limit));
    }
    budget.has_room_for(declared.unwrap_or(0))?;
    let mut charge = Charge::none();
    let mut body = std::pin::pin!(Limited::new(body, limit as usize));
    const FIRST_ALLOCATION: u64 = 1 << 20;
    let mut buf = BytesMut::with_capacity(declared.unwrap_or(0).min(FIRST_ALLOCATION) as usize);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| match e.is::<http_body_util::LengthLimitError>() {
            true => Error::BodyTooLarge(limit),
            false => Error::BadRequest(format!("could not read the request body: {e}")),
        })?;
        if let Ok(data) = frame.into_data() {
            let uncharged = ((buf.len() + data.len()) as u64).saturating_sub(charge.bytes());
            budget.charge(&mut charge, uncharged)?;
            buf.extend_from_slice(&data);
        }
    }
    Ok((buf.freeze(), charge))
}

/// The body's length as `content-length` declares it.
pub fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}

/// How the body carries the model id.
#[derive(Debug, Clone, PartialEq)]
pub enum BodyKind {
    /// A JSON body; only `model` and `stream` are read here, the rest stays bytes until a rule
    /// needs to rewrite it.
    Json {
        model: Option<String>,
        stream: bool,
    },
    Multipart(String),
    Form,
    Other,
}

pub fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// Parses the body as llama-swap does: JSON only when the content type says so, else multipart or form.
pub fn classify(headers: &HeaderMap, body: &[u8]) -> BodyKind {
    let ct = content_type(headers);
    if ct.contains("application/json") {
        return match peek_json(body) {
            Some((model, stream)) => BodyKind::Json { model, stream },
            None => BodyKind::Other,
        };
    }
    if ct.starts_with("multipart/form-data") {
        if let Some(boundary) = boundary(ct) {
            return BodyKind::Multipart(boundary);
        }
    }
    if ct.starts_with("application/x-www-form-urlencoded") {
        return BodyKind::Form;
    }
    BodyKind::Other
}

/// The `model` (when a string) and `stream` (when `true`) members of a body that is one JSON
/// object; `None` for anything else, or an object that names either twice. Only these two values
/// are read: like llama-swap, corral leaves the rest of the body to the engine, which answers for
/// it.
fn peek_json(body: &[u8]) -> Option<(Option<String>, bool)> {
    fn once<'a>(slot: &mut Option<&'a [u8]>, value: &'a [u8]) -> Option<()> {
        slot.replace(value).is_none().then_some(())
    }
    let (mut model, mut stream) = (None, None);
    let end = scan::members(body, |key, value| match key {
        b"model" => once(&mut model, value),
        b"stream" => once(&mut stream, value),
        _ => Some(()),
    })?;
    if scan::skip_space(body, end) != body.len() {
        return None;
    }
    Some((model.and_then(scan::string), stream == Some(b"true")))
}

/// The `model` named in the body, and whether the client asked for a stream. A JSON body's model
/// is moved out of its kind, which has no more use for it.
pub fn model_from_body(kind: &mut BodyKind, body: &[u8]) -> (Option<String>, bool) {
    match kind {
        BodyKind::Json { model, stream } => (model.take(), *stream),
        BodyKind::Multipart(b) => {
            let text = |name: &str| {
                text_field(body, b, name)
                    .map(|p| String::from_utf8_lossy(&body[p.data]).into_owned())
            };
            (text("model"), text("stream").as_deref() == Some("true"))
        }
        BodyKind::Form | BodyKind::Other => {
            let text = String::from_utf8_lossy(body);
            (
                query_param(&text, "model"),
                query_param(&text, "stream").as_deref() == Some("true"),
            )
        }
    }
}

/// A query-string parameter, percent- and `+`-decoded.
pub fn query_param(query: &str, name: &str) -> Option<String> {
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

fn boundary(content_type: &str) -> Option<String> {
    content_type.split(';').find_map(|p| {
        let p = p.trim();
        p.strip_prefix("boundary=")
            .map(|b| b.trim_matches('"').to_string())
    })
}

/// One part of a multipart body, as byte ranges into it.
#[derive(Debug, Clone)]
pub struct Part {
    pub name: String,
    pub filename: Option<String>,
    pub data: std::ops::Range<usize>,
}

/// A multipart body's parts, one at a time, as byte ranges into it: nothing is copied and nothing
/// is kept, so a body of a million tiny parts costs no more memory than one of a single part.
pub fn multipart_parts<'a>(body: &'a [u8], boundary: &str) -> Parts<'a> {
    let delim = format!("--{boundary}").into_bytes();
    let next_delim = [b"\r\n".as_slice(), &delim].concat();
    let pos = find(body, &delim, 0).map(|p| p + delim.len());
    Parts {
        body,
        next_delim,
        pos,
    }
}

/// The iterator behind [`multipart_parts`].
pub struct Parts<'a> {
    body: &'a [u8],
    /// `\r\n--boundary`: what ends a part's data.
    next_delim: Vec<u8>,
    /// Where the next part's head starts (`None` once the closing delimiter or junk is reached).
    pos: Option<usize>,
}

impl Iterator for Parts<'_> {
    type Item = Part;

    fn next(&mut self) -> Option<Part> {
        let body = self.body;
        let pos = self.pos.take()?;
        if body.get(pos..)?.starts_with(b"--") {
            return None;
        }
        let head_end = find(body, b"\r\n\r\n", pos)?;
        let data_start = head_end + 4;
        let next = find(body, &self.next_delim, data_start)?;
        self.pos = Some(next + self.next_delim.len());
        let head = String::from_utf8_lossy(&body[pos..head_end]);
        let disposition = head
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("content-disposition"))
            .unwrap_or("");
        let param = |key: &str| {
            disposition.split(';').find_map(|p| {
                p.trim()
                    .strip_prefix(&format!("{key}="))
                    .map(|v| v.trim_matches('"').to_string())
            })
        };
        Some(Part {
            name: param("name").unwrap_or_default(),
            filename: param("filename"),
            data: data_start..next,
        })
    }
}

/// The first text field named `name`, if any; scanning stops there.
fn text_field(body: &[u8], boundary: &str, name: &str) -> Option<Part> {
    multipart_parts(body, boundary).find(|p| p.name == name && p.filename.is_none())
}

fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    memchr::memmem::find(haystack.get(from..)?, needle).map(|p| p + from)
}

/// Replaces the value of the text field `model` in a multipart body; other bytes stay as they are.
pub fn rewrite_multipart_model(body: &[u8], boundary: &str, model: &str) -> Option<Bytes> {
    let part = text_field(body, boundary, "model")?;
    let mut out = Vec::with_capacity(body.len() + model.len());
    out.extend_from_slice(&body[..part.data.start]);
    out.extend_from_slice(model.as_bytes());
    out.extend_from_slice(&body[part.data.end..]);
    Some(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn multipart(model_first: bool) -> (String, Vec<u8>) {
        let b = "XyZ";
        let model = "--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper\r\n";
        let file = "--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n\x00\x01--X\r\n\r\n";
        let body = if model_first {
            format!("{model}{file}--XyZ--\r\n")
        } else {
            format!("{file}{model}--XyZ--\r\n")
        };
        (b.to_string(), body.into_bytes())
    }

    #[test]
    fn finds_the_model_field_wherever_it_is() {
        for first in [true, false] {
            let (b, body) = multipart(first);
            let (model, _) = model_from_body(&mut BodyKind::Multipart(b), &body);
            assert_eq!(model.as_deref(), Some("whisper"));
        }
    }

    #[test]
    fn rewriting_the_model_keeps_the_file_exact() {
        let (b, body) = multipart(true);
        let out = rewrite_multipart_model(&body, &b, "large-v3").unwrap();
        let parts: Vec<Part> = multipart_parts(&out, &b).collect();
        let file = parts.iter().find(|p| p.name == "file").unwrap();
        assert_eq!(&out[file.data.clone()], b"\x00\x01--X\r\n");
        let model = parts.iter().find(|p| p.name == "model").unwrap();
        assert_eq!(&out[model.data.clone()], b"large-v3");
    }

    #[test]
    fn json_only_when_the_content_type_says_so() {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, "text/plain".parse().unwrap());
        assert_eq!(classify(&h, br#"{"model":"a"}"#), BodyKind::Other);
        h.insert(
            header::CONTENT_TYPE,
            "application/json; charset=utf-8".parse().unwrap(),
        );
        let mut kind = classify(&h, br#"{"model":"a","stream":true}"#);
        assert_eq!(model_from_body(&mut kind, b""), (Some("a".into()), true));
    }

    #[test]
    fn a_malformed_member_is_left_to_the_engine() {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
        let json = |model: Option<&str>, stream| BodyKind::Json {
            model: model.map(String::from),
            stream,
        };
        let read = |body: &str| classify(&h, body.as_bytes());
        assert_eq!(
            read(r#"{"messages":[tru],"model":"a"}"#),
            json(Some("a"), false)
        );
        assert_eq!(read(r#"{"model":7,"stream":"yes"}"#), json(None, false));
        for refused in [
            r#"{"model":"a","model":"b"}"#,
            r#"{"model":"a"} trailing"#,
            r#"["a"]"#,
            r#"{"model":"a""#,
        ] {
            assert_eq!(read(refused), BodyKind::Other, "{refused}");
        }
    }

    #[test]
    fn query_params_are_decoded() {
        assert_eq!(
            query_param("a=1&model=my%2Fmodel", "model").as_deref(),
            Some("my/model")
        );
        assert_eq!(query_param("a=1", "model"), None);
    }
}

#[cfg(test)]
#[path = "extract_props.rs"]
mod props;
