//! Captures (`captureBuffer`, in MB): the request and response of recent model requests, kept in
//! memory by activity id and served as llama-swap serves them (`GET /api/captures/<id>`).
//!
//! A capture copies what it keeps into one buffer of its own: holding the frames that passed would
//! pin the connections' whole read buffers (kilobytes each, for a few hundred bytes of answer) and
//! make every next read allocate a new one. A capture larger than the
//! whole budget is cut and marked `*_truncated`; the oldest captures go when new ones need the
//! room (see [`ring`]). Secrets in headers are never kept.

mod ring;

use std::sync::Mutex;

use base64::Engine;
use bytes::Bytes;
use http::{header, HeaderMap, HeaderName};
use serde_json::{json, Map, Value};

/// Headers whose values are replaced, as llama-swap does: names, not text, since a standard
/// name compares by its tag (a name compared with text is spelled out first).
static SENSITIVE: [HeaderName; 5] = [
    header::AUTHORIZATION,
    header::PROXY_AUTHORIZATION,
    header::COOKIE,
    header::SET_COOKIE,
    HeaderName::from_static("x-api-key"),
];

/// One request's capture, filled as the request goes: its path, request headers, request body,
/// response headers and response body one after another in one buffer, so a capture costs one
/// allocation (and a few growths) rather than one per part.
pub struct Capture {
    data: Vec<u8>,
    layout: Layout,
    /// The budget of all captures: no body keeps more.
    limit: usize,
}

/// How a capture's bytes divide into its parts.
#[derive(Clone, Copy, Default)]
struct Layout {
    /// Where each part ends: path, request headers, request body, response headers, response
    /// body.
    ends: [usize; 5],
    req_truncated: bool,
    resp_truncated: bool,
}

impl Layout {
    fn part<'a>(&self, data: &'a [u8], i: usize) -> &'a [u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &data[start..self.ends[i]]
    }

    fn json(&self, data: &[u8], id: u64) -> Value {
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let part = |i| self.part(data, i);
        json!({
            "id": id,
            "req_path": String::from_utf8_lossy(part(PATH)),
            "req_headers": headers_json(part(REQ_HEADERS)),
            "req_body": b64(part(REQ_BODY)),
            "resp_headers": headers_json(part(RESP_HEADERS)),
            "resp_body": b64(part(RESP_BODY)),
            "req_body_truncated": self.req_truncated,
            "resp_body_truncated": self.resp_truncated,
        })
    }
}

const PATH: usize = 0;
const REQ_HEADERS: usize = 1;
const REQ_BODY: usize = 2;
const RESP_HEADERS: usize = 3;
const RESP_BODY: usize = 4;

impl Capture {
    fn part(&self, i: usize) -> &[u8] {
        self.layout.part(&self.data, i)
    }

    /// Marks the end of part `i` (and of the empty parts after it) at the buffer's end.
    fn close(&mut self, i: usize) {
        let len = self.data.len();
        self.layout.ends[i..].fill(len);
    }

    /// The request body as read, copied up to the budget (before the response is recorded).
    pub fn request_body(&mut self, body: &Bytes) {
        self.data.truncate(self.layout.ends[REQ_HEADERS]);
        self.data
            .extend_from_slice(&body[..self.limit.min(body.len())]);
        self.close(REQ_BODY);
        self.layout.req_truncated = body.len() > self.limit;
    }

    fn headers_len(&self) -> usize {
        self.part(PATH).len() + self.part(REQ_HEADERS).len() + self.part(RESP_HEADERS).len()
    }

    /// Cuts the bodies to fit `budget` bytes in all: each keeps at least half of what is left
    /// after the headers when both are large.
    fn fit(&mut self, budget: usize) {
        let room = budget.saturating_sub(self.headers_len());
        let (req, resp) = (self.part(REQ_BODY).len(), self.part(RESP_BODY).len());
        if req + resp <= room {
            return;
        }
        let req_keep = req.min(room - resp.min(room / 2));
        let resp_keep = resp.min(room - req_keep);
        self.layout.req_truncated |= req_keep < req;
        self.layout.resp_truncated |= resp_keep < resp;
        let mut data = Vec::with_capacity(self.headers_len() + req_keep + resp_keep);
        let mut ends = [0; 5];
        for (i, keep) in [usize::MAX, usize::MAX, req_keep, usize::MAX, resp_keep]
            .into_iter()
            .enumerate()
        {
            let part = self.part(i);
            data.extend_from_slice(&part[..keep.min(part.len())]);
            ends[i] = data.len();
        }
        (self.data, self.layout.ends) = (data, ends);
    }

    #[cfg(test)]
    fn json(&self, id: u64) -> Value {
        self.layout.json(&self.data, id)
    }
}

/// The response body of a capture, copied frame by frame up to a limit.
pub struct Recording {
    capture: Capture,
}

impl Recording {
    pub fn push(&mut self, data: &Bytes) {
        let c = &mut self.capture;
        let room = c.limit.saturating_sub(c.part(RESP_BODY).len());
        if data.len() > room {
            c.layout.resp_truncated = true;
        }
        c.data.extend_from_slice(&data[..data.len().min(room)]);
        c.close(RESP_BODY);
    }

    /// The capture with its response body.
    pub fn finish(self) -> Capture {
        self.capture
    }
}

/// The room a header map takes as text: every value counted, repeated names too (at most a little
/// more than is kept).
fn headers_size(map: &HeaderMap) -> usize {
    map.iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 2)
        .sum()
}

/// Appends a header map as it came, `name\nvalue\n` per name (HTTP allows no line break in
/// either): the first value of each name, secrets masked. Capitals and the text of values that are
/// not UTF-8 are left for when a capture is read, which is rare.
fn write_headers(out: &mut Vec<u8>, map: &HeaderMap) {
    let mut last: Option<&http::HeaderName> = None;
    for (name, value) in map {
        // a name's values come one after another: only the first is kept
        if last == Some(name) {
            continue;
        }
        last = Some(name);
        out.extend_from_slice(name.as_str().as_bytes());
        out.push(b'\n');
        if SENSITIVE.contains(name) {
            out.extend_from_slice(b"[REDACTED]");
        } else {
            out.extend_from_slice(value.as_bytes());
        }
        out.push(b'\n');
    }
}

/// `content-type` as `Content-Type`: each word's first letter in capitals.
fn capitalized(name: &str) -> String {
    let mut upper = true;
    name.chars()
        .map(|c| {
            let c = if upper { c.to_ascii_uppercase() } else { c };
            upper = c == '-';
            c
        })
        .collect()
}

/// The headers written by [`write_headers`] as a JSON object: names in the usual capitals, values
/// as text.
fn headers_json(text: &[u8]) -> Value {
    let mut lines = text.split(|&b| b == b'\n');
    let mut map = Map::new();
    while let (Some(name), Some(value)) = (lines.next(), lines.next()) {
        let name = capitalized(&String::from_utf8_lossy(name));
        map.insert(
            name,
            Value::String(String::from_utf8_lossy(value).into_owned()),
        );
    }
    Value::Object(map)
}

/// The captures of recent requests, oldest first, within a byte budget.
pub struct Captures {
    budget: usize,
    ring: Mutex<ring::Ring<Layout>>,
}

impl Captures {
    pub fn new(budget_bytes: u64) -> Captures {
        let budget = budget_bytes.min(usize::MAX as u64) as usize;
        Captures {
            budget,
            ring: Mutex::new(ring::Ring::new(budget)),
        }
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, ring::Ring<Layout>> {
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A body's declared length, as much of it as a capture keeps.
    fn declared(&self, headers: &HeaderMap) -> usize {
        headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
            .map_or(0, |n| n.min(self.budget))
    }

    /// Starts the capture of a request from its head, with room for its body when its length is
    /// declared, so the body is copied without regrowing.
    pub fn begin(&self, path: &str, request_headers: &HeaderMap) -> Capture {
        let room = path.len() + headers_size(request_headers) + self.declared(request_headers);
        let mut c = Capture {
            data: Vec::with_capacity(room),
            layout: Layout::default(),
            limit: self.budget,
        };
        c.data.extend_from_slice(path.as_bytes());
        c.close(PATH);
        write_headers(&mut c.data, request_headers);
        c.close(REQ_HEADERS);
        c
    }

    /// Follows the response: its headers now, its body as it passes (at most the whole budget).
    pub fn record(&self, mut capture: Capture, response_headers: &HeaderMap) -> Recording {
        // room for the body too when its length is declared, so it is copied without regrowing
        let room = headers_size(response_headers) + self.declared(response_headers);
        capture.data.reserve_exact(room);
        write_headers(&mut capture.data, response_headers);
        capture.close(RESP_HEADERS);
        Recording { capture }
    }

    /// Keeps a copy of a finished capture under the activity id, dropping the oldest to make
    /// room; false when even a cut capture cannot fit (its headers alone exceed the budget). The
    /// capture itself is freed here, by the thread that made it.
    pub fn put(&self, id: u64, mut capture: Capture) -> bool {
        capture.fit(self.budget);
        self.ring().put(id, &capture.data, capture.layout)
    }

    /// `GET /api/captures/<id>`'s answer, when that capture is still kept.
    pub fn get(&self, id: u64) -> Option<Value> {
        let ring = self.ring();
        let (data, layout) = ring.get(id)?;
        Some(layout.json(&data, id))
    }
}

/// `GET /api/captures/<id>`: 400 for an id that is not a number, 404 when it is gone (or captures
/// are off).
pub fn route(captures: Option<&Captures>, id: &str) -> http::Response<crate::body::Body> {
    use http::StatusCode;
    let Ok(id) = id.parse::<u64>() else {
        let bad = json!({"error": "invalid capture ID"});
        return super::json(StatusCode::BAD_REQUEST, &bad);
    };
    match captures.and_then(|c| c.get(id)) {
        Some(found) => super::json(StatusCode::OK, &found),
        None => super::json(
            StatusCode::NOT_FOUND,
            &json!({"error": "capture not found"}),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capture(c: &Captures, req: &'static [u8], resp: &'static [u8]) -> Capture {
        let mut h = HeaderMap::new();
        h.insert("authorization", "Bearer secret".parse().unwrap());
        h.insert("content-type", "application/json".parse().unwrap());
        let mut cap = c.begin("/p", &h);
        cap.request_body(&Bytes::from_static(req));
        let mut rec = c.record(cap, &HeaderMap::new());
        rec.push(&Bytes::from_static(resp));
        rec.finish()
    }

    #[test]
    fn captures_mask_secrets_cut_big_bodies_and_drop_the_oldest() {
        let c = Captures::new(200);
        assert!(c.put(1, capture(&c, b"hello", b"world")));
        let one = c.get(1).unwrap();
        assert_eq!(one["req_headers"]["Authorization"], "[REDACTED]");
        assert_eq!(one["req_headers"]["Content-Type"], "application/json");
        assert_eq!(one["req_body"], "aGVsbG8=");
        assert_eq!(one["resp_body"], "d29ybGQ=");
        assert_eq!(one["resp_body_truncated"], false);
        // a response longer than the budget is cut and marked
        assert!(c.put(2, capture(&c, b"q", &[b'x'; 500])));
        let two = c.get(2).unwrap();
        assert_eq!(two["resp_body_truncated"], true);
        assert_eq!(two["req_body_truncated"], false);
        assert!(c.get(1).is_none(), "the oldest made room");
        assert!(c.ring().kept_bytes() <= 200);
    }

    /// A capture keeps copies: the frames that passed (slices of a connection's read buffer) are
    /// not held, and a header map keeps its first value per name.
    #[test]
    fn a_capture_holds_no_frame_it_saw() {
        let c = Captures::new(1 << 20);
        let mut h = HeaderMap::new();
        h.append("x-a", "1".parse().unwrap());
        h.append("x-a", "2".parse().unwrap());
        let mut cap = c.begin("/p", &h);
        let request = Bytes::from(b"question".to_vec());
        cap.request_body(&request);
        let mut rec = c.record(cap, &HeaderMap::new());
        let frame = Bytes::from(b"answer".to_vec());
        rec.push(&frame);
        let kept = rec.finish();
        assert!(request.is_unique() && frame.is_unique());
        assert!(c.put(1, kept));
        let json = c.get(1).unwrap();
        assert_eq!(json["req_headers"], json!({"X-A": "1"}));
        assert_eq!(json["resp_body"], "YW5zd2Vy");
    }

    /// When both bodies are too large, each keeps half of the room the headers leave, and the
    /// headers and path stay whole.
    #[test]
    fn both_bodies_are_cut_to_share_the_room() {
        let c = Captures::new(1 << 20);
        let mut cap = capture(&c, &[b'q'; 300], &[b'a'; 300]);
        let headers = cap.headers_len();
        cap.fit(headers + 100);
        assert_eq!(cap.data.len(), headers + 100);
        assert_eq!(cap.part(REQ_BODY), &[b'q'; 50][..]);
        assert_eq!(cap.part(RESP_BODY), &[b'a'; 50][..]);
        assert!(cap.layout.req_truncated && cap.layout.resp_truncated);
        let json = cap.json(7);
        assert_eq!(json["req_path"], "/p");
        assert_eq!(json["req_headers"]["Content-Type"], "application/json");
    }

    /// Heads are kept as they came and shown as text when read: names in the usual capitals, bytes
    /// that are not UTF-8 replaced.
    #[test]
    fn heads_are_shown_with_capitals_and_as_text() {
        let c = Captures::new(1 << 20);
        let mut h = HeaderMap::new();
        h.insert(
            "x-custom-name",
            http::HeaderValue::from_bytes(b"caf\xe9").unwrap(),
        );
        h.insert("cookie", "secret=1".parse().unwrap());
        let cap = c.begin("/p", &h);
        assert!(c.put(1, c.record(cap, &HeaderMap::new()).finish()));
        let json = c.get(1).unwrap();
        assert_eq!(
            json["req_headers"],
            json!({"X-Custom-Name": "caf\u{FFFD}", "Cookie": "[REDACTED]"})
        );
    }
}
