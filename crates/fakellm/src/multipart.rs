//! A small multipart/form-data parser (RFC 7578), enough for the OpenAI
//! audio/image upload endpoints.

/// One part of a multipart body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part<'a> {
    pub name: String,
    pub filename: Option<String>,
    pub content_type: Option<String>,
    pub data: &'a [u8],
}

/// Extracts the boundary from a `Content-Type: multipart/form-data; boundary=...` value.
pub fn boundary_from_content_type(ct: &str) -> Option<String> {
    let mut it = ct.split(';');
    let mime = it.next()?.trim();
    if !mime.to_ascii_lowercase().starts_with("multipart/") {
        return None;
    }
    for param in it {
        let (k, v) = match param.split_once('=') {
            Some(kv) => kv,
            None => continue,
        };
        if k.trim().eq_ignore_ascii_case("boundary") {
            let v = unquote(v.trim());
            if v.is_empty() || v.len() > 200 {
                return None;
            }
            return Some(v);
        }
    }
    None
}

fn unquote(v: &str) -> String {
    if v.len() >= 2 && v.starts_with('"') && v.ends_with('"') {
        let inner = &v[1..v.len() - 1];
        let mut out = String::with_capacity(inner.len());
        let mut esc = false;
        for c in inner.chars() {
            if esc {
                out.push(c);
                esc = false;
            } else if c == '\\' {
                esc = true;
            } else {
                out.push(c);
            }
        }
        out
    } else {
        v.to_string()
    }
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if needle.is_empty() || from > hay.len() || hay.len() - from < needle.len() {
        return None;
    }
    let first = needle[0];
    let last_start = hay.len() - needle.len();
    let mut i = from;
    while i <= last_start {
        match hay[i..=last_start].iter().position(|&b| b == first) {
            None => return None,
            Some(off) => {
                let s = i + off;
                if &hay[s..s + needle.len()] == needle {
                    return Some(s);
                }
                i = s + 1;
            }
        }
    }
    None
}

/// Splits `name="a"; filename="b"` style header parameters.
fn split_params(v: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let bytes: Vec<char> = v.chars().collect();
    let mut i = 0;
    let mut first = true;
    while i < bytes.len() {
        // read up to ';' honoring quotes
        let mut seg = String::new();
        let mut inq = false;
        let mut esc = false;
        while i < bytes.len() {
            let c = bytes[i];
            i += 1;
            if inq {
                seg.push(c);
                if esc {
                    esc = false;
                } else if c == '\\' {
                    esc = true;
                } else if c == '"' {
                    inq = false;
                }
            } else if c == ';' {
                break;
            } else {
                if c == '"' {
                    inq = true;
                }
                seg.push(c);
            }
        }
        let seg = seg.trim();
        if first {
            first = false;
            out.push((String::new(), seg.to_string()));
            continue;
        }
        if let Some((k, val)) = seg.split_once('=') {
            out.push((k.trim().to_ascii_lowercase(), unquote(val.trim())));
        }
    }
    out
}

/// Parses a multipart body.
pub fn parse<'a>(body: &'a [u8], boundary: &str) -> Result<Vec<Part<'a>>, String> {
    let delim = format!("--{boundary}");
    let delim = delim.as_bytes();
    let mut pos = find(body, delim, 0).ok_or("multipart boundary not found")?;
    let mut parts = Vec::new();
    loop {
        pos += delim.len();
        if body[pos..].starts_with(b"--") {
            return Ok(parts); // closing delimiter
        }
        // skip transport padding and the line break after the delimiter
        while pos < body.len() && (body[pos] == b' ' || body[pos] == b'\t') {
            pos += 1;
        }
        if body[pos..].starts_with(b"\r\n") {
            pos += 2;
        } else if body[pos..].starts_with(b"\n") {
            pos += 1;
        } else {
            return Err("malformed multipart delimiter line".into());
        }
        // headers (a part may have none and start directly with the blank line)
        let (hdr_text, body_start) = if body[pos..].starts_with(b"\r\n") {
            ("", pos + 2)
        } else if body[pos..].starts_with(b"\n") {
            ("", pos + 1)
        } else {
            let crlf = find(body, b"\r\n\r\n", pos);
            let lf = find(body, b"\n\n", pos);
            let (hdr_end, body_start) = match (crlf, lf) {
                (Some(c), Some(l)) if l < c => (l, l + 2),
                (Some(c), _) => (c, c + 4),
                (None, Some(l)) => (l, l + 2),
                (None, None) => return Err("multipart part headers not terminated".into()),
            };
            (
                std::str::from_utf8(&body[pos..hdr_end])
                    .map_err(|_| "multipart headers are not UTF-8")?,
                body_start,
            )
        };
        let mut name = None;
        let mut filename = None;
        let mut content_type = None;
        for line in hdr_text.lines() {
            let (k, v) = match line.split_once(':') {
                Some(kv) => kv,
                None => continue,
            };
            let k = k.trim();
            if k.eq_ignore_ascii_case("content-disposition") {
                for (pk, pv) in split_params(v) {
                    match pk.as_str() {
                        "name" => name = Some(pv),
                        "filename" => filename = Some(pv),
                        _ => {}
                    }
                }
            } else if k.eq_ignore_ascii_case("content-type") {
                content_type = Some(v.trim().to_string());
            }
        }
        // data runs up to CRLF + delimiter
        let mut end_marker = Vec::with_capacity(delim.len() + 2);
        end_marker.extend_from_slice(b"\r\n");
        end_marker.extend_from_slice(delim);
        let (data_end, next) = match find(body, &end_marker, body_start) {
            Some(e) => (e, e + 2),
            None => {
                // tolerate bare LF line endings
                end_marker.remove(0);
                match find(body, &end_marker, body_start) {
                    Some(e) => (e, e + 1),
                    None => return Err("multipart closing boundary not found".into()),
                }
            }
        };
        parts.push(Part {
            name: name.ok_or("multipart part without a name")?,
            filename,
            content_type,
            data: &body[body_start..data_end],
        });
        pos = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundary() {
        assert_eq!(
            boundary_from_content_type("multipart/form-data; boundary=abc123").as_deref(),
            Some("abc123")
        );
        assert_eq!(
            boundary_from_content_type("multipart/form-data; charset=utf-8; Boundary=\"a b\"")
                .as_deref(),
            Some("a b")
        );
        assert_eq!(boundary_from_content_type("application/json"), None);
        assert_eq!(boundary_from_content_type("multipart/form-data"), None);
    }

    #[test]
    fn parses_fields_and_file() {
        let body = b"preamble\r\n--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a;b.wav\"\r\nContent-Type: audio/wav\r\n\r\nRIFF\r\n--X\x00\xffdata\r\n--XyZ\r\nContent-Disposition: form-data; name=\"empty\"\r\n\r\n\r\n--XyZ--\r\nepilogue";
        let parts = parse(body, "XyZ").unwrap();
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[0].name, "model");
        assert_eq!(parts[0].filename, None);
        assert_eq!(parts[0].data, b"whisper-1");
        assert_eq!(parts[1].name, "file");
        assert_eq!(parts[1].filename.as_deref(), Some("a;b.wav"));
        assert_eq!(parts[1].content_type.as_deref(), Some("audio/wav"));
        assert_eq!(parts[1].data, b"RIFF\r\n--X\x00\xffdata");
        assert_eq!(parts[2].name, "empty");
        assert_eq!(parts[2].data, b"");
    }

    #[test]
    fn lf_only() {
        let body = b"--b\nContent-Disposition: form-data; name=x\n\nval\n--b--\n";
        let parts = parse(body, "b").unwrap();
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].name, "x");
        assert_eq!(parts[0].data, b"val");
    }

    #[test]
    fn errors() {
        assert!(parse(b"no boundary here", "b").is_err());
        assert!(parse(
            b"--b\r\nContent-Disposition: form-data; name=x\r\n\r\nval",
            "b"
        )
        .is_err());
        assert!(parse(b"--b\r\nContent-Type: text/plain\r\n\r\nv\r\n--b--", "b").is_err());
    }

    #[test]
    fn escaped_quotes_in_filename() {
        let ps = split_params(" form-data; name=\"f\"; filename=\"x\\\"y.txt\"");
        assert_eq!(ps[1], ("name".to_string(), "f".to_string()));
        assert_eq!(ps[2], ("filename".to_string(), "x\"y.txt".to_string()));
    }
}
