use super::*;

fn capture(c: &Captures, req: &'static [u8], resp: &'static [u8]) -> Capture {
    let mut h = HeaderMap::new();
    h.insert("authorization", "Bearer secret".parse().unwrap());
    h.insert("content-type", "application/json".parse().unwrap());
    let mut cap = c.begin("/p", &h).unwrap();
    cap.request_body(&Bytes::from_static(req));
    let mut rec = c.record(cap, &HeaderMap::new(), None);
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

/// A capture keeps copies of the frames that passed (slices of a connection's read buffer),
/// not the frames, and a header map's first value per name. A large request body, read into a
/// buffer of corral's own, is shared until the capture is kept, not copied.
#[test]
fn a_capture_holds_no_frame_it_saw_and_shares_a_large_request_body() {
    let c = Captures::new(1 << 20);
    let mut h = HeaderMap::new();
    h.append("x-a", "1".parse().unwrap());
    h.append("x-a", "2".parse().unwrap());
    let mut cap = c.begin("/p", &h).unwrap();
    let request = Bytes::from(vec![b'q'; COPY_AT_MOST + 1]);
    cap.request_body(&request);
    assert!(!request.is_unique(), "the request body is shared");
    let mut rec = c.record(cap, &HeaderMap::new(), None);
    let frame = Bytes::from(b"answer".to_vec());
    rec.push(&frame);
    assert!(frame.is_unique(), "the frame is copied");
    let kept = rec.finish();
    assert!(c.put(1, kept));
    assert!(
        request.is_unique(),
        "kept, the capture lets the request body go"
    );
    let json = c.get(1).unwrap();
    assert_eq!(json["req_headers"], json!({"X-A": "1"}));
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    assert_eq!(json["req_body"], b64(&request));
    assert_eq!(json["resp_body"], "YW5zd2Vy");
}

/// A small request body is copied into the capture's own buffer (sharing it would allocate),
/// and that buffer, once the capture is kept, is the next capture's on the same thread.
#[test]
fn a_small_body_is_copied_and_the_buffer_reused() {
    let c = Captures::new(1 << 20);
    let mut cap = c.begin("/p", &HeaderMap::new()).unwrap();
    let request = Bytes::from(b"question".to_vec());
    cap.request_body(&request);
    assert!(request.is_unique(), "copied, not shared");
    let mut rec = c.record(cap, &HeaderMap::new(), None);
    rec.push(&Bytes::from_static(b"answer"));
    let kept = rec.finish();
    let buffer = kept.data.as_ptr();
    assert!(c.put(1, kept));
    assert_eq!(c.get(1).unwrap()["req_body"], "cXVlc3Rpb24=");
    let next = c.begin("/q", &HeaderMap::new()).unwrap();
    assert_eq!(next.data.as_ptr(), buffer);
}

/// A request that failed before its answer keeps its path, head and body, and no response.
#[test]
fn a_capture_without_a_response_is_kept() {
    let c = Captures::new(1 << 20);
    let mut h = HeaderMap::new();
    h.insert("content-type", "application/json".parse().unwrap());
    let mut cap = c.begin("/v1/chat/completions", &h).unwrap();
    cap.request_body(&Bytes::from_static(b"{}"));
    assert!(c.put(3, cap));
    let json = c.get(3).unwrap();
    assert_eq!(json["req_path"], "/v1/chat/completions");
    assert_eq!(
        json["req_headers"],
        json!({"Content-Type": "application/json"})
    );
    assert_eq!(json["req_body"], "e30=");
    assert_eq!(json["resp_headers"], json!({}));
    assert_eq!(json["resp_body"], "");
}

/// A request body larger than the budget is cut to half of it and its kept part copied: the
/// capture does not hold the rest, and leaves room for the response.
#[test]
fn a_request_body_over_the_budget_is_not_held() {
    let c = Captures::new(64);
    let mut cap = c.begin("/p", &HeaderMap::new()).unwrap();
    let request = Bytes::from(vec![b'q'; 1000]);
    cap.request_body(&request);
    assert!(request.is_unique(), "only the kept part is held, as a copy");
    assert_eq!(cap.part(REQ_BODY), &[b'q'; 32][..]);
    assert!(cap.req_truncated);
}

/// When both bodies are too large, each keeps half of the room the headers leave, and the
/// headers and path stay whole: a request body copied into the capture (cut out of its middle)
/// as well as a shared one.
#[test]
fn both_bodies_are_cut_to_share_the_room() {
    let c = Captures::new(1 << 20);
    for len in [300, COPY_AT_MOST + 300] {
        let request: &'static [u8] = vec![b'q'; len].leak();
        let response: &'static [u8] = vec![b'a'; len].leak();
        let mut cap = capture(&c, request, response);
        let headers = cap.headers_len();
        cap.fit(headers + 100);
        assert_eq!(cap.parts().concat().len(), headers + 100);
        assert_eq!(cap.part(REQ_BODY), &[b'q'; 50][..]);
        assert_eq!(cap.part(RESP_BODY), &[b'a'; 50][..]);
        assert!(cap.req_truncated && cap.resp_truncated);
        let json = cap.json(7);
        assert_eq!(json["req_path"], "/p");
        assert_eq!(json["req_headers"]["Content-Type"], "application/json");
        assert_eq!(json["resp_headers"], json!({}));
    }
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
    let cap = c.begin("/p", &h).unwrap();
    assert!(c.put(1, c.record(cap, &HeaderMap::new(), None).finish()));
    let json = c.get(1).unwrap();
    assert_eq!(
        json["req_headers"],
        json!({"X-Custom-Name": "caf\u{FFFD}", "Cookie": "[REDACTED]"})
    );
}

/// Every credential header is masked, by name and by any name with a secret word in it, whatever
/// its capitals; other headers show.
#[test]
fn credential_headers_are_masked() {
    let c = Captures::new(1 << 20);
    let secret = [
        "authorization",
        "proxy-authorization",
        "cookie",
        "set-cookie",
        "x-api-key",
        "api-key",
        "x-auth-token",
        "x-amz-security-token",
        "x-session-id",
        "x-client-secret",
        "x-db-password",
        "X-Goog-Api-Key",
        "X-Csrf-Token",
    ];
    let mut h = HeaderMap::new();
    for name in secret {
        h.insert(
            HeaderName::try_from(name).unwrap(),
            "hunter2".parse().unwrap(),
        );
    }
    h.insert("x-request-id", "r-1".parse().unwrap());
    h.insert("content-type", "application/json".parse().unwrap());
    let cap = c.begin("/p", &h).unwrap();
    let mut answer = HeaderMap::new();
    answer.insert("set-cookie", "sid=hunter2".parse().unwrap());
    assert!(c.put(1, c.record(cap, &answer, None).finish()));
    let json = c.get(1).unwrap();
    let shown = json.to_string();
    assert!(!shown.contains("hunter2"), "{shown}");
    assert_eq!(json["req_headers"]["X-Request-Id"], "r-1");
    assert_eq!(json["req_headers"]["Content-Type"], "application/json");
    assert_eq!(json["req_headers"]["Proxy-Authorization"], "[REDACTED]");
    assert_eq!(json["resp_headers"]["Set-Cookie"], "[REDACTED]");
    assert!(is_sensitive("COOKIE") && is_sensitive("X-Auth-Token"));
}

/// Captures in flight share one budget: a capture past it is cut and marked, one whose head
/// does not fit is not made, and the room comes back when a capture is kept or dropped.
#[test]
fn captures_in_flight_share_one_budget() {
    let c = Captures::new(1000);
    let mut a = c.begin("/a", &HeaderMap::new()).unwrap();
    a.request_body(&Bytes::from(vec![b'a'; 600]));
    assert!(!a.req_truncated);
    let mut b = c.begin("/b", &HeaderMap::new()).unwrap();
    b.request_body(&Bytes::from(vec![b'b'; 600]));
    assert!(b.req_truncated, "only what a left");
    assert_eq!(c.live.used(), 1000);
    assert_eq!(a.held() + b.held(), 1000);
    assert!(c.begin("/c", &HeaderMap::new()).is_none(), "no room left");

    drop(a);
    let mut d = c.begin("/d", &HeaderMap::new()).unwrap();
    d.request_body(&Bytes::from(vec![b'd'; 500]));
    assert!(!d.req_truncated, "a gave its room back");
    assert!(c.put(2, b));
    assert_eq!(c.get(2).unwrap()["req_body_truncated"], true);
    assert_eq!(c.live.used(), d.held(), "b, kept, gave its room back");

    // a response cut for want of room stays cut: room freed later leaves no gap in it
    let e = c.begin("/e", &HeaderMap::new()).unwrap();
    let mut rec = c.record(e, &HeaderMap::new(), None);
    rec.push(&Bytes::from(vec![b'x'; 1000]));
    drop(d);
    rec.push(&Bytes::from_static(b"y"));
    let e = rec.finish();
    assert!(e.resp_truncated);
    assert!(!e.part(RESP_BODY).contains(&b'y'));
    drop(e);
    assert_eq!(c.live.used(), 0);
}
