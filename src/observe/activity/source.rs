//! Where a request came from, as llama-swap's activity rows name it (`src`): `ip:` and the
//! caller's address and port (`ip:127.0.0.1:51234`, `ip:[::1]:51234`), or nothing for a row
//! kept from before corral recorded it. `GET /api/metrics/activity?src_prefix=` keeps the rows
//! whose source starts with the prefix, taken literally.
//!
//! A row keeps the address itself, not its text, so that logging a request makes no string.

use std::net::SocketAddr;

/// What starts the source of a request that came over the network.
const IP: &str = "ip:";

/// The source as the rows' JSON and the store write it; empty when unknown.
pub fn text(src: Option<SocketAddr>) -> String {
    src.map_or_else(String::new, |addr| format!("{IP}{addr}"))
}

/// The address a stored source names, when it names one.
pub fn parse(text: &str) -> Option<SocketAddr> {
    text.strip_prefix(IP)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_written_as_llama_swap_writes_them_and_read_back() {
        let v4: SocketAddr = "127.0.0.1:10".parse().unwrap();
        let v6: SocketAddr = "[::1]:8080".parse().unwrap();
        assert_eq!(text(Some(v4)), "ip:127.0.0.1:10");
        assert_eq!(text(Some(v6)), "ip:[::1]:8080");
        assert_eq!(text(None), "");
        assert_eq!(parse("ip:[::1]:8080"), Some(v6));
        assert_eq!(parse(&text(Some(v4))), Some(v4));
        assert_eq!(parse(""), None);
        assert_eq!(parse("tc:nodekey:abcd"), None);
    }
}
