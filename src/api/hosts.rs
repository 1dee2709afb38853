//! The `Host` a loopback listener answers to. A page on an attacker's site can make its own name
//! resolve to 127.0.0.1 (DNS rebinding) and then read corral's answers as same-origin; its
//! requests still carry the attacker's name in `Host`. While corral listens on a loopback address
//! it answers only loopback names and addresses, the machine's own name, and `allowedHosts`, as
//! Ollama does.

use http::{header, HeaderMap};

use crate::error::Error;

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
    pub fn admit(&self, headers: &HeaderMap, uri: &http::Uri) -> Result<(), Error> {
        let named = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| uri.authority().map(|a| a.as_str()));
        // no Host (HTTP/1.0): no browser sent it
        let Some(named) = named else { return Ok(()) };
        let host = host_part(named);
        if self.accepts(host) {
            return Ok(());
        }
        let host = host.to_ascii_lowercase();
        Err(Error::Forbidden(format!(
            "forbidden: Host {host:?} is not a loopback name; corral listens on a loopback address \
             and answers only loopback names and addresses (DNS rebinding). Add {host:?} to \
             allowedHosts to reach it by that name"
        )))
    }

    /// Runs for every request on a loopback listener, so it compares without allocating.
    fn accepts(&self, host: &str) -> bool {
        let is = |name: &str| host.eq_ignore_ascii_case(name);
        // an address cannot be rebound: the browser sends the name it resolved, not the address
        host.parse::<std::net::IpAddr>().is_ok()
            || is("localhost")
            || ends_with_ignore_case(host, ".localhost")
            || self.hostname.as_deref().is_some_and(is)
            || self.allowed.iter().any(|a| is(a))
    }
}

fn ends_with_ignore_case(text: &str, suffix: &str) -> bool {
    text.len() >= suffix.len()
        && text.as_bytes()[text.len() - suffix.len()..].eq_ignore_ascii_case(suffix.as_bytes())
}

/// The host of a `Host` value, without port, brackets or a final dot.
fn host_part(value: &str) -> &str {
    let value = value.trim();
    let host = match value.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(v6),
        None => value.rsplit_once(':').map_or(value, |(h, _)| h),
    };
    host.trim_end_matches('.')
}

#[cfg(test)]
mod tests {
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
        let h2 = http::Uri::from_static("http://evil.example/x");
        assert!(rule(&[]).admit(&HeaderMap::new(), &h2).is_err());
    }
}
