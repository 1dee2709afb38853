//! The `Host` a loopback listener answers to. A page on an attacker's site can make its own name
//! resolve to 127.0.0.1 (DNS rebinding) and then read corral's answers as same-origin; its
//! requests still carry the attacker's name in `Host`. While corral listens on a loopback address
//! it answers only loopback names and addresses, the machine's own name, and `allowedHosts`, as
//! Ollama does.

use http::{header, HeaderMap};

use crate::proxy::error::Error;

/// The names a loopback listener accepts besides loopback ones.
#[derive(Debug, Default)]
pub struct HostRule {
    /// `allowedHosts`, lower case.
    allowed: Vec<String>,
    /// This machine's name, lower case: on many systems it resolves to a loopback address.
    hostname: Option<String>,
}

impl HostRule {
    pub fn new(allowed: &[String]) -> HostRule {
        let hostname = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .map(|h| h.to_ascii_lowercase());
        HostRule {
            allowed: allowed.to_vec(),
            hostname,
        }
    }

    /// Ok unless the request names a host that is neither loopback, an address, nor allowed.
    /// Read as bytes: a value that is not visible ASCII is no loopback name, and is refused.
    pub fn admit(&self, headers: &HeaderMap, uri: &http::Uri) -> Result<(), Error> {
        let named = headers
            .get(header::HOST)
            .map(|h| h.as_bytes())
            .or_else(|| uri.authority().map(|a| a.as_str().as_bytes()));
        // no Host (HTTP/1.0): no browser sent it
        let Some(named) = named else { return Ok(()) };
        let host = host_part(named);
        if self.accepts(host) {
            return Ok(());
        }
        let host = String::from_utf8_lossy(host).to_ascii_lowercase();
        Err(Error::Forbidden(format!(
            "forbidden: Host {host:?} is not a loopback name; corral listens on a loopback address \
             and answers only loopback names and addresses (DNS rebinding). Add {host:?} to \
             allowedHosts to reach it by that name"
        )))
    }

    /// Runs for every request on a loopback listener, so it compares without allocating, and
    /// tries the names clients send most before parsing an address.
    fn accepts(&self, host: &[u8]) -> bool {
        let is = |name: &str| host.eq_ignore_ascii_case(name.as_bytes());
        host == b"127.0.0.1"
            || is("localhost")
            || ends_with_ignore_case(host, b".localhost")
            || is_address(host)
            || self.hostname.as_deref().is_some_and(is)
            || self.allowed.iter().any(|a| is(a))
    }
}

/// Whether `host` is an IP address: one cannot be rebound, as the browser sends the name it
/// resolved, not the address.
fn is_address(host: &[u8]) -> bool {
    std::str::from_utf8(host).is_ok_and(|h| h.parse::<std::net::IpAddr>().is_ok())
}

fn ends_with_ignore_case(text: &[u8], suffix: &[u8]) -> bool {
    text.len() >= suffix.len() && text[text.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
}

/// The host of a `Host` value, without port, brackets or a final dot.
fn host_part(value: &[u8]) -> &[u8] {
    let value = value.trim_ascii();
    let host = match value.strip_prefix(b"[") {
        Some(v6) => v6.split(|b| *b == b']').next().unwrap_or(v6),
        None => value
            .iter()
            .rposition(|b| *b == b':')
            .map_or(value, |colon| &value[..colon]),
    };
    let dots = host.iter().rev().take_while(|b| **b == b'.').count();
    &host[..host.len() - dots]
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn with_host(host: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, host.parse().unwrap());
        h
    }

    fn rule(allowed: &[&str]) -> HostRule {
        HostRule {
            allowed: allowed.iter().map(|a| a.to_string()).collect(),
            hostname: Some("box".into()),
        }
    }

    #[test]
    fn loopback_names_and_addresses_pass() {
        let uri = http::Uri::from_static("/");
        for host in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST",
            "app.localhost:1",
            "[::1]:8080",
            "10.1.2.3",
            "box:8080",
            "localhost.",
        ] {
            assert!(rule(&[]).admit(&with_host(host), &uri).is_ok(), "{host}");
        }
        assert!(rule(&[]).admit(&HeaderMap::new(), &uri).is_ok());
    }

    #[test]
    fn other_names_are_refused_unless_allowed() {
        let uri = http::Uri::from_static("/api/captures/1");
        for host in ["evil.example:8080", "localhost.evil.example", "boxx"] {
            let err = rule(&[]).admit(&with_host(host), &uri).unwrap_err();
            assert!(
                matches!(&err, Error::Forbidden(m) if m.contains("allowedHosts")),
                "{host}: {err:?}"
            );
        }
        let allowed = rule(&["corral.lan"]);
        assert!(allowed.admit(&with_host("Corral.LAN:8080"), &uri).is_ok());
        let obs_text = HeaderValue::from_bytes(b"localh\xf6st").unwrap();
        let mut h = HeaderMap::new();
        h.insert(header::HOST, obs_text);
        assert!(
            rule(&[]).admit(&h, &uri).is_err(),
            "a value that is not ASCII is no loopback name"
        );
        let h2 = http::Uri::from_static("http://evil.example/x");
        assert!(rule(&[]).admit(&HeaderMap::new(), &h2).is_err());
    }
}
