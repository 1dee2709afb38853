//! What changes in a request's and an answer's headers on their way through: hop-by-hop
//! headers go (and those `Connection` names), and a request says whom it came from in
//! `X-Forwarded-For`.

use std::cell::RefCell;
use std::net::IpAddr;

use http::{header, HeaderMap, HeaderName, HeaderValue};

/// The header llama-swap reads an API key from, besides `Authorization`; corral strips its own
/// keys from it and sends a peer's key in it.
pub static X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// Names compared as header names, not as text: most are standard ones, which compare by tag
/// (a name compared with a `&str` is spelled out first, for every header of every request).
static HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Whether `Host` goes too: an answer loses it, while a request going upstream keeps its own
/// until the origin's replaces it (an insert, which removes it too).
#[derive(Clone, Copy)]
pub(super) enum Host {
    Strip,
    Keep,
}

/// Header names corral adds, made once (a name inserted as text is copied on every insert).
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub(super) static X_ACCEL_BUFFERING: HeaderName = HeaderName::from_static("x-accel-buffering");

fn is_hop_by_hop(name: &HeaderName, host: Host) -> bool {
    HOP_BY_HOP.iter().any(|h| name == h) || (matches!(host, Host::Strip) && name == header::HOST)
}

/// Removes the hop-by-hop headers, and those its `Connection` names; true when a
/// `Transfer-Encoding` was among them.
pub(super) fn strip_hop_by_hop(headers: &mut HeaderMap, host: Host) -> bool {
    let listed: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|s| s.trim().to_ascii_lowercase()))
        .filter(|name| !name.is_empty())
        .collect();
    for name in &listed {
        headers.remove(name.as_str());
    }
    // one pass over the few headers present, rather than a lookup for every hop-by-hop name
    let mut encoded = false;
    while let Some(name) = headers.keys().find(|k| is_hop_by_hop(k, host)).cloned() {
        encoded |= name == header::TRANSFER_ENCODING;
        headers.remove(name);
    }
    encoded
}

/// The longest text of an IP address (IPv6 with an IPv4 tail).
const IP_TEXT_MAX: usize = 45;

/// `ip` as text, written into `buf` without the formatting machinery in the usual IPv4 case (it
/// runs for every request).
fn write_ip(buf: &mut [u8; IP_TEXT_MAX], ip: IpAddr) -> &[u8] {
    let IpAddr::V4(v4) = ip else {
        use std::io::Write;
        let mut out = std::io::Cursor::new(&mut buf[..]);
        let _ = write!(out, "{ip}");
        let len = out.position() as usize;
        return &buf[..len];
    };
    let mut len = 0;
    let mut push = |b: u8| {
        buf[len] = b;
        len += 1;
    };
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            push(b'.');
        }
        if octet >= 100 {
            push(b'0' + octet / 100);
        }
        if octet >= 10 {
            push(b'0' + octet / 10 % 10);
        }
        push(b'0' + octet % 10);
    }
    &buf[..len]
}

/// Adds the client's address to `X-Forwarded-For`, after those the request came with (every
/// line of it, joined as one list, as nginx and Go's proxy join them).
pub(super) fn add_forwarded_for(headers: &mut HeaderMap, ip: IpAddr) {
    let mut prior = headers.get_all(&X_FORWARDED_FOR).iter().peekable();
    let value = match prior.peek() {
        Some(_) => {
            let mut text = Vec::new();
            for value in prior {
                text.extend_from_slice(value.as_bytes());
                text.extend_from_slice(b", ");
            }
            let mut buf = [0; IP_TEXT_MAX];
            text.extend_from_slice(write_ip(&mut buf, ip));
            HeaderValue::from_bytes(&text).ok()
        }
        None => Some(forwarded_for(ip)),
    };
    if let Some(v) = value {
        headers.insert(X_FORWARDED_FOR.clone(), v);
    }
}

/// `ip` as a header value. The last one made on this thread is kept: most requests come from the
/// client before them (a gateway, an app on the same host), and a new value is an allocation.
fn forwarded_for(ip: IpAddr) -> HeaderValue {
    thread_local! {
        static LAST: RefCell<Option<(IpAddr, HeaderValue)>> = const { RefCell::new(None) };
    }
    LAST.with_borrow_mut(|last| match last {
        Some((known, value)) if *known == ip => value.clone(),
        _ => {
            let mut buf = [0; IP_TEXT_MAX];
            let value = HeaderValue::from_bytes(write_ip(&mut buf, ip))
                .expect("an IP address's text is a header value");
            *last = Some((ip, value.clone()));
            value
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_addresses_are_written_as_display_writes_them() {
        for ip in [
            "0.0.0.0",
            "127.0.0.1",
            "10.20.100.255",
            "9.99.199.1",
            "::1",
            "fe80::1:2",
            "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            let mut buf = [0; IP_TEXT_MAX];
            assert_eq!(write_ip(&mut buf, ip), ip.to_string().as_bytes());
        }
    }

    #[test]
    fn a_client_address_value_is_made_once_for_requests_in_a_row() {
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "::1".parse().unwrap());
        let first = forwarded_for(a);
        let again = forwarded_for(a);
        assert_eq!(again, "10.0.0.1");
        assert_eq!(
            first.as_bytes().as_ptr(),
            again.as_bytes().as_ptr(),
            "the same text, not a copy"
        );
        assert_eq!(forwarded_for(b), "::1");
        assert_eq!(forwarded_for(a), "10.0.0.1");
    }

    #[test]
    fn hop_by_hop_headers_go_named_ones_too() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("host", "a"),
            ("connection", "keep-alive, X-Trace"),
            ("x-trace", "1"),
            ("te", "trailers"),
            ("authorization", "Bearer k"),
        ] {
            h.insert(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        let mut request = h.clone();
        strip_hop_by_hop(&mut h, Host::Strip);
        assert_eq!(
            h.keys().map(|k| k.as_str()).collect::<Vec<_>>(),
            ["authorization"]
        );
        strip_hop_by_hop(&mut request, Host::Keep);
        assert_eq!(
            request.keys().map(|k| k.as_str()).collect::<Vec<_>>(),
            ["host", "authorization"],
            "a request's Host is left for the origin's to replace"
        );
    }

    #[test]
    fn a_transfer_encoding_removed_is_told() {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        assert!(!strip_hop_by_hop(&mut h.clone(), Host::Strip));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        assert!(strip_hop_by_hop(&mut h, Host::Strip));
        assert!(!h.contains_key(header::TRANSFER_ENCODING));
    }

    #[test]
    fn every_forwarded_for_line_is_kept() {
        let client: IpAddr = "10.0.0.1".parse().unwrap();
        let mut h = HeaderMap::new();
        add_forwarded_for(&mut h, client);
        assert_eq!(h[&X_FORWARDED_FOR], "10.0.0.1");
        let mut h = HeaderMap::new();
        h.append(&X_FORWARDED_FOR, HeaderValue::from_static("1.1.1.1"));
        h.append(
            &X_FORWARDED_FOR,
            HeaderValue::from_static("2.2.2.2, 3.3.3.3"),
        );
        add_forwarded_for(&mut h, client);
        let lines: Vec<_> = h.get_all(&X_FORWARDED_FOR).iter().collect();
        assert_eq!(lines, ["1.1.1.1, 2.2.2.2, 3.3.3.3, 10.0.0.1"]);
    }
}
