//! Captures (`captureBuffer`, in MB): the request and response of recent model requests, kept in
//! memory by activity id and served as llama-swap serves them (`GET /api/captures/<id>`).
//!
//! A capture copies the answer it keeps into one buffer of its own: holding the frames that passed
//! would pin the connections' whole read buffers (kilobytes each, for a few hundred bytes of
//! answer) and make every next read allocate a new one; that buffer is one its thread reuses
//! ([`spare`]). A request body over 4 KiB, read into a buffer of its own, is shared instead when
//! it is kept whole: a long conversation is copied once, when the capture is kept. A capture
//! larger than the whole budget is cut and marked `*_truncated`; the oldest captures go when new
//! ones need the room (see [`ring`]). Secrets in headers are never kept.
//!
//! Captures being built hold memory too, up to twice the budget each (a request body and a
//! response body), for as long as their requests run: together they are held to one more budget
//! of the same size ([`live`]). A capture that finds it spent is cut and marked, or, when not even
//! its request's head fits, not made; the request goes on either way, never waiting for room.

mod live;
mod ring;
mod spare;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use aho_corasick::AhoCorasick;
use base64::Engine;
use bytes::Bytes;
use http::{HeaderMap, HeaderName};
use serde_json::{json, Map, Value};

/// Words that mark a header as a credential wherever they are in its name: `authorization`,
/// `proxy-authorization`, `www-authenticate`, `cookie`, `set-cookie`, `x-api-key`, `api-key`,
/// `x-auth-token`, `x-amz-security-token`, `x-session-id`, `x-csrf-token` and the like.
const SECRET_WORDS: &[&str] = &[
    "auth",
    "cookie",
    "token",
    "secret",
    "passw",
    "pwd",
    "key",
    "session",
    "credential",
    "signature",
    "csrf",
    "xsrf",
    "jwt",
    "bearer",
];

/// Whether a header's value is replaced, as llama-swap does for a few names and corral for any
/// name with one of [`SECRET_WORDS`] in it, whatever its capitals: a credential under a name no
/// list foresaw is still a credential.
fn is_sensitive(name: &str) -> bool {
    static WORDS: LazyLock<AhoCorasick> = LazyLock::new(|| {
        AhoCorasick::builder()
            .ascii_case_insensitive(true)
            .build(SECRET_WORDS)
            .expect("fixed words build")
    });
    WORDS.is_match(name)
}

/// One request's capture, filled as the request goes: its path, request headers, request body,
/// response headers and response body one after another in one buffer, taken from the thread's
/// spares ([`spare`]), so a capture costs no allocation once its thread has served a few. A
/// request body larger than [`COPY_AT_MOST`] is not copied: it is the buffer the request was read
/// into (never a connection's), shared until the capture is kept.
pub struct Capture {
    data: Vec<u8>,
    /// Where the path, the request headers, the request body (when copied) and the response
    /// headers end in `data`; the response body runs on to its end.
    ends: [usize; 4],
    /// A request body too large to copy: shared, and between the request and response headers
    /// when kept. Empty when the body is in `data`.
    shared_body: Bytes,
    req_truncated: bool,
    resp_truncated: bool,
    /// The budget of all captures: no body keeps more.
    limit: usize,
    /// Its share of the budget of captures being built.
    room: live::Room,
}

/// The largest request body a capture copies rather than shares: a copy of a small body costs
/// less than making the body's buffer shareable (an allocation) and freeing it later.
const COPY_AT_MOST: usize = 4096;

/// How a kept capture's bytes divide into its parts.
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
    /// The parts in the order they are kept: path, request headers, request body, response
    /// headers, response body.
    fn parts(&self) -> [&[u8]; 5] {
        let [path, req_headers, req_body, resp_headers] = self.ends;
        let body = if self.shared_body.is_empty() {
            &self.data[req_headers..req_body]
        } else {
            &self.shared_body
        };
        [
            &self.data[..path],
            &self.data[path..req_headers],
            body,
            &self.data[req_body..resp_headers],
            &self.data[resp_headers..],
        ]
    }

    /// The same bytes in as few pieces as they lie in: the path and request head, a shared
    /// request body, and the rest.
    fn pieces(&self) -> [&[u8]; 3] {
        let head = self.ends[1];
        [&self.data[..head], &self.shared_body, &self.data[head..]]
    }

    #[cfg(test)]
    fn part(&self, i: usize) -> &[u8] {
        self.parts()[i]
    }

    /// Where the parts end, once one after another.
    fn layout(&self) -> Layout {
        let mut ends = [0; 5];
        let mut end = 0;
        for (i, part) in self.parts().iter().enumerate() {
            end += part.len();
            ends[i] = end;
        }
        Layout {
            ends,
            req_truncated: self.req_truncated,
            resp_truncated: self.resp_truncated,
        }
    }

    /// The request body as read, up to the budget (before the response is recorded). A small
    /// body is copied; a larger one shared when it is kept whole. A body larger than the budget
    /// is cut to half of it and its kept part copied, so the capture never holds more than that
    /// of it (a slice would hold it all), and the response has room too. All of it within the
    /// room the captures in flight leave.
    #[inline(always)]
    pub fn request_body(&mut self, body: &Bytes) {
        debug_assert_eq!(
            self.data.len(),
            self.ends[1],
            "the body follows the request head"
        );
        // a body that is cut anyway keeps half the budget, the other half left for the response
        let most = if body.len() > self.limit {
            self.limit / 2
        } else {
            body.len()
        };
        let keep = self.room.allow(self.held(), most);
        self.req_truncated = keep < body.len();
        if body.len() <= COPY_AT_MOST || self.req_truncated {
            self.data.extend_from_slice(&body[..keep]);
        } else {
            self.shared_body = body.clone();
        }
        self.ends[2] = self.data.len();
        self.ends[3] = self.data.len();
    }

    /// The bytes this capture holds, each charged to the budget of captures being built.
    fn held(&self) -> usize {
        self.data.len() + self.shared_body.len()
    }

    fn request_body_len(&self) -> usize {
        self.ends[2] - self.ends[1] + self.shared_body.len()
    }

    /// The path's and both heads' bytes.
    fn headers_len(&self) -> usize {
        self.ends[1] + (self.ends[3] - self.ends[2])
    }

    fn response_body_len(&self) -> usize {
        self.data.len() - self.ends[3]
    }

    /// Cuts the bodies to fit `budget` bytes in all: each keeps at least half of what is left
    /// after the headers when both are large.
    fn fit(&mut self, budget: usize) {
        let room = budget.saturating_sub(self.headers_len());
        let (req, resp) = (self.request_body_len(), self.response_body_len());
        if req + resp <= room {
            return;
        }
        let req_keep = req.min(room - resp.min(room / 2));
        let resp_keep = resp.min(room - req_keep);
        self.req_truncated |= req_keep < req;
        self.resp_truncated |= resp_keep < resp;
        self.data.truncate(self.ends[3] + resp_keep);
        if self.shared_body.is_empty() {
            let cut = req - req_keep;
            self.data.drain(self.ends[1] + req_keep..self.ends[2]);
            self.ends[2] -= cut;
            self.ends[3] -= cut;
        } else {
            self.shared_body.truncate(req_keep);
        }
    }

    #[cfg(test)]
    fn json(&self, id: u64) -> Value {
        self.layout().json(&self.parts().concat(), id)
    }
}

/// The response body of a capture, copied frame by frame up to a limit.
pub struct Recording {
    capture: Capture,
}

impl Recording {
    /// Copies a frame of the response body, as much of it as the budgets leave room for; once
    /// one is cut, the rest of the body is not kept (room freed later would leave a gap).
    pub fn push(&mut self, data: &Bytes) {
        let c = &mut self.capture;
        if c.resp_truncated {
            return;
        }
        let room = c.limit.saturating_sub(c.response_body_len());
        let keep = c.room.allow(c.held(), data.len().min(room));
        c.resp_truncated = keep < data.len();
        c.data.extend_from_slice(&data[..keep]);
    }

    /// The capture with its response body.
    pub fn finish(self) -> Capture {
        self.capture
    }
}

/// Appends a header map as it came, `name\nvalue\n` per name (HTTP allows no line break in
/// either): the first value of each name. Capitals, masking and the text of values that are
/// not UTF-8 are left for when a capture is read, which is rare. The buffer grows as it must: a
/// spare one has room already, and measuring the map first took as long as writing it.
fn write_headers(out: &mut Vec<u8>, map: &HeaderMap) {
    // a name's values come one after another, each with the same name: only the first is kept
    let mut last: *const HeaderName = std::ptr::null();
    for (name, value) in map {
        if std::ptr::eq(last, name) {
            continue;
        }
        last = name;
        let (name, value) = (name.as_str(), value.as_bytes());
        out.reserve(name.len() + value.len() + 2);
        out.extend_from_slice(name.as_bytes());
        out.push(b'\n');
        out.extend_from_slice(value);
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
/// as text, credentials masked. They are masked here, when a capture is read (rarely, by an
/// admin), not when it is written, which happens for every header of every request: the
/// credential-word search cost more than the rest of the capture's headers.
fn headers_json(text: &[u8]) -> Value {
    let mut lines = text.split(|&b| b == b'\n');
    let mut map = Map::new();
    while let (Some(name), Some(value)) = (lines.next(), lines.next()) {
        let name = String::from_utf8_lossy(name);
        let value = match is_sensitive(&name) {
            true => "[REDACTED]".to_string(),
            false => String::from_utf8_lossy(value).into_owned(),
        };
        map.insert(capitalized(&name), Value::String(value));
    }
    Value::Object(map)
}

/// The captures of recent requests, oldest first, within a byte budget, and the captures being
/// built, within another of the same size.
pub struct Captures {
    budget: usize,
    ring: Mutex<ring::Ring<Layout>>,
    live: Arc<live::Live>,
    /// Set once a capture was not made for want of room, so the warning is logged once.
    refused: AtomicBool,
}

impl Captures {
    pub fn new(budget_bytes: u64) -> Captures {
        let budget = budget_bytes.min(usize::MAX as u64) as usize;
        Captures {
            budget,
            ring: Mutex::new(ring::Ring::new(budget)),
            live: Arc::new(live::Live::new(budget)),
            refused: AtomicBool::new(false),
        }
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, ring::Ring<Layout>> {
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the capture of a request from its head; `None` when the captures being built
    /// leave no room for the head (the request is then not captured, and the log says so once).
    pub fn begin(&self, path: &str, request_headers: &HeaderMap) -> Option<Capture> {
        let mut data = spare::take();
        data.extend_from_slice(path.as_bytes());
        let path_end = data.len();
        write_headers(&mut data, request_headers);
        let end = data.len();
        let mut room = live::Room::new(self.live.clone());
        if room.allow(0, end) < end {
            spare::give(data);
            if !self.refused.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "captures: the captures of requests in flight hold the whole capture budget \
                     ({} bytes); some requests are not captured, and others are cut and marked",
                    self.budget
                );
            }
            return None;
        }
        Some(Capture {
            data,
            ends: [path_end, end, end, end],
            shared_body: Bytes::new(),
            req_truncated: false,
            resp_truncated: false,
            limit: self.budget,
            room,
        })
    }

    /// Follows the response: its headers now, its body as it passes (at most the whole budget).
    /// `declared` is the body's length as its `content-length` says, read once by the caller.
    pub fn record(
        &self,
        mut capture: Capture,
        response_headers: &HeaderMap,
        declared: Option<usize>,
    ) -> Recording {
        let before = capture.held();
        write_headers(&mut capture.data, response_headers);
        let head = capture.held() - before;
        if capture.room.allow(before, head) < head {
            // no room for the response: the capture keeps the request alone, marked
            capture.data.truncate(capture.ends[2]);
            capture.resp_truncated = true;
        }
        capture.ends[3] = capture.data.len();
        // room for the body too when its length is declared, so it is copied without regrowing
        let declared = declared.map_or(0, |n| n.min(self.budget));
        let reserve = capture.room.allow(capture.held(), declared);
        capture.data.reserve(reserve);
        Recording { capture }
    }

    /// Keeps a copy of a finished capture under the activity id, dropping the oldest to make
    /// room; false when even a cut capture cannot fit (its headers alone exceed the budget). The
    /// capture's buffer goes back to the spares of the thread that made it.
    pub fn put(&self, id: u64, mut capture: Capture) -> bool {
        capture.fit(self.budget);
        let kept = self.ring().put(id, &capture.pieces(), capture.layout());
        spare::give(capture.data);
        kept
    }

    /// `GET /api/captures/<id>`'s answer, when that capture is still kept.
    pub fn get(&self, id: u64) -> Option<Value> {
        let ring = self.ring();
        let (data, layout) = ring.get(id)?;
        Some(layout.json(&data, id))
    }
}

#[cfg(test)]
mod tests;
