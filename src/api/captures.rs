//! Captures (`captureBuffer`, in MB): the request and response of recent model requests, kept in
//! memory by activity id and served as llama-swap serves them (`GET /api/captures/<id>`).
//!
//! A capture copies what it keeps into buffers of its own, one per header map and body: holding the
//! frames that passed would pin the connections' whole read buffers (kilobytes each, for a few
//! hundred bytes of answer) and make every next read allocate a new one. A capture larger than the
//! whole budget is cut and marked `*_truncated`; the oldest captures go when new ones need the
//! room. Secrets in headers are never kept.

use std::collections::VecDeque;
use std::sync::Mutex;

use base64::Engine;
use bytes::Bytes;
use http::HeaderMap;
use serde_json::{json, Map, Value};

/// Headers whose values are replaced, as llama-swap does.
const SENSITIVE: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "x-api-key",
];

/// One request's capture, filled as the request goes.
pub struct Capture {
    req_path: String,
    req_headers: HeaderText,
    req_body: Bytes,
    resp_headers: HeaderText,
    resp_body: Bytes,
    req_truncated: bool,
    resp_truncated: bool,
    /// The budget of all captures: no body keeps more.
    limit: usize,
}

/// The first `keep` bytes of a body, copied, so the rest of its buffer is not held.
fn cut(body: &Bytes, keep: usize) -> Bytes {
    Bytes::copy_from_slice(&body[..keep.min(body.len())])
}

impl Capture {
    /// The request body as read, copied up to the budget.
    pub fn request_body(&mut self, body: &Bytes) {
        self.req_body = cut(body, self.limit);
        self.req_truncated = body.len() > self.limit;
    }

    fn headers_len(&self) -> usize {
        self.req_path.len() + self.req_headers.0.len() + self.resp_headers.0.len()
    }

    /// Cuts the bodies to fit `budget` bytes in all: each keeps at least half of what is left
    /// after the headers when both are large.
    fn fit(&mut self, budget: usize) {
        let room = budget.saturating_sub(self.headers_len());
        let (req, resp) = (self.req_body.len(), self.resp_body.len());
        if req + resp <= room {
            return;
        }
        let req_keep = req.min(room - resp.min(room / 2));
        let resp_keep = resp.min(room - req_keep);
        self.req_truncated |= req_keep < req;
        self.resp_truncated |= resp_keep < resp;
        if req_keep < req {
            self.req_body = cut(&self.req_body, req_keep);
        }
        if resp_keep < resp {
            self.resp_body = cut(&self.resp_body, resp_keep);
        }
    }

    fn size(&self) -> usize {
        self.headers_len() + self.req_body.len() + self.resp_body.len()
    }

    fn json(&self, id: u64) -> Value {
        let b64 = |b: &Bytes| base64::engine::general_purpose::STANDARD.encode(b);
        json!({
            "id": id,
            "req_path": self.req_path,
            "req_headers": self.req_headers.json(),
            "req_body": b64(&self.req_body),
            "resp_headers": self.resp_headers.json(),
            "resp_body": b64(&self.resp_body),
            "req_body_truncated": self.req_truncated,
            "resp_body_truncated": self.resp_truncated,
        })
    }
}

/// The response body of a capture, copied frame by frame up to a limit.
pub struct Recording {
    capture: Capture,
    body: Vec<u8>,
    limit: usize,
}

impl Recording {
    pub fn push(&mut self, data: &Bytes) {
        let room = self.limit.saturating_sub(self.body.len());
        if data.len() > room {
            self.capture.resp_truncated = true;
        }
        self.body.extend_from_slice(&data[..data.len().min(room)]);
    }

    /// The capture with its response body.
    pub fn finish(mut self) -> Capture {
        self.capture.resp_body = Bytes::from(self.body);
        self.capture
    }
}

/// A header map as one string, `Name\nvalue\n` per name (HTTP allows no line break in either):
/// names in the usual capitals, the first value of each, secrets masked.
#[derive(Default)]
struct HeaderText(String);

impl HeaderText {
    fn of(map: &HeaderMap) -> HeaderText {
        // every value counted, repeated names too: at most a little more than is kept
        let size = map
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 2)
            .sum();
        let mut text = String::with_capacity(size);
        for name in map.keys() {
            let mut upper = true;
            for c in name.as_str().chars() {
                text.push(if upper { c.to_ascii_uppercase() } else { c });
                upper = c == '-';
            }
            text.push('\n');
            match map.get(name) {
                _ if SENSITIVE.contains(&name.as_str()) => text.push_str("[REDACTED]"),
                Some(v) => text.push_str(&String::from_utf8_lossy(v.as_bytes())),
                None => {}
            }
            text.push('\n');
        }
        HeaderText(text)
    }

    fn json(&self) -> Value {
        let mut lines = self.0.lines();
        let mut map = Map::new();
        while let (Some(name), Some(value)) = (lines.next(), lines.next()) {
            map.insert(name.to_string(), Value::String(value.to_string()));
        }
        Value::Object(map)
    }
}

/// The captures of recent requests, oldest first, within a byte budget.
pub struct Captures {
    budget: usize,
    ring: Mutex<Ring>,
}

#[derive(Default)]
struct Ring {
    items: VecDeque<(u64, Capture)>,
    bytes: usize,
}

impl Captures {
    pub fn new(budget_bytes: u64) -> Captures {
        Captures {
            budget: budget_bytes.min(usize::MAX as u64) as usize,
            ring: Default::default(),
        }
    }

    /// Starts the capture of a request from its head.
    pub fn begin(&self, path: &str, request_headers: &HeaderMap) -> Capture {
        Capture {
            req_path: path.to_string(),
            req_headers: HeaderText::of(request_headers),
            req_body: Bytes::new(),
            resp_headers: HeaderText::default(),
            resp_body: Bytes::new(),
            req_truncated: false,
            resp_truncated: false,
            limit: self.budget,
        }
    }

    /// Follows the response: its headers now, its body as it passes (at most the whole budget).
    pub fn record(&self, mut capture: Capture, response_headers: &HeaderMap) -> Recording {
        capture.resp_headers = HeaderText::of(response_headers);
        Recording {
            capture,
            body: Vec::new(),
            limit: self.budget,
        }
    }

    /// Keeps a finished capture under the activity id, dropping the oldest to make room; false
    /// when even a cut capture cannot fit (its headers alone exceed the budget).
    pub fn put(&self, id: u64, mut capture: Capture) -> bool {
        capture.fit(self.budget);
        let size = capture.size();
        if size > self.budget {
            return false;
        }
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        while ring.bytes + size > self.budget {
            let Some((_, old)) = ring.items.pop_front() else {
                break;
            };
            ring.bytes -= old.size();
        }
        ring.bytes += size;
        ring.items.push_back((id, capture));
        true
    }

    /// `GET /api/captures/<id>`'s answer, when that capture is still kept.
    pub fn get(&self, id: u64) -> Option<Value> {
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let (_, c) = ring.items.iter().rev().find(|(i, _)| *i == id)?;
        Some(c.json(id))
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
        let ring = c.ring.lock().unwrap();
        assert!(
            ring.bytes <= 200
                && ring.bytes == ring.items.iter().map(|(_, c)| c.size()).sum::<usize>()
        );
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
}
