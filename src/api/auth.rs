//! API keys: Basic password, Bearer token or `x-api-key`, compared in constant time.

use base64::Engine;
use http::{header, HeaderMap};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Digests of the configured keys; comparing digests keeps the comparison length-independent.
pub struct Keys(Vec<[u8; 32]>);

impl Keys {
    pub fn new(keys: &[String]) -> Keys {
        Keys(
            keys.iter()
                .map(|k| Sha256::digest(k.as_bytes()).into())
                .collect(),
        )
    }

    pub fn required(&self) -> bool {
        !self.0.is_empty()
    }

    /// True when no key is configured or the request presents one of them.
    pub fn allows(&self, headers: &HeaderMap) -> bool {
        if self.0.is_empty() {
            return true;
        }
        let Some(presented) = presented_key(headers) else {
            return false;
        };
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        self.0
            .iter()
            .fold(0u8, |found, k| found | k.ct_eq(&digest).unwrap_u8())
            == 1
    }
}

/// The key a request presents: Basic password, then Bearer token, then `x-api-key`.
pub fn presented_key(headers: &HeaderMap) -> Option<String> {
    let auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if let Some(encoded) = auth.strip_prefix("Basic ") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .ok()?;
        let text = String::from_utf8(decoded).ok()?;
        if let Some((_, password)) = text.split_once(':') {
            if !password.is_empty() {
                return Some(password.to_string());
            }
        }
    }
    if let Some(token) = auth.strip_prefix("Bearer ") {
        if !token.trim().is_empty() {
            return Some(token.trim().to_string());
        }
    }
    headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .filter(|k| !k.is_empty())
        .map(String::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(name: &str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
        h
    }

    #[test]
    fn accepts_all_three_forms() {
        let keys = Keys::new(&["sekrit".into()]);
        assert!(keys.allows(&headers("authorization", "Bearer sekrit")));
        assert!(keys.allows(&headers("x-api-key", "sekrit")));
        let basic = base64::engine::general_purpose::STANDARD.encode("anyone:sekrit");
        assert!(keys.allows(&headers("authorization", &format!("Basic {basic}"))));
    }

    #[test]
    fn rejects_near_misses() {
        let keys = Keys::new(&["sekrit".into()]);
        for wrong in ["Sekrit", "sekri", "sekrit2", "xekrit", ""] {
            assert!(!keys.allows(&headers("x-api-key", wrong)), "{wrong}");
        }
        assert!(!keys.allows(&HeaderMap::new()));
        assert!(Keys::new(&[]).allows(&HeaderMap::new()));
    }
}
