//! Server-sent event streams read straight off the socket.
//!
//! hyper's client hands out body frames after its own buffering, which hides how the bytes arrived;
//! to see whether a proxy coalesced chunks we need every `read()` and its time. So this module
//! speaks the little HTTP/1.1 it needs itself (status line, headers, chunked or length-delimited
//! body) and timestamps each SSE event with the read that completed it.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One SSE event as it arrived.
#[derive(Debug, Clone)]
pub struct Event {
    /// When the read that completed this event returned.
    pub at: Instant,
    /// Which read (1-based) completed it.
    pub read: u32,
    /// `N` for the content chunk `tokN`; `None` for the final chunk and `[DONE]`.
    pub index: Option<u32>,
    pub done: bool,
}

#[derive(Debug)]
pub struct Stream {
    /// Just before the request was written.
    pub sent: Instant,
    /// The same moment on the wall clock (ms since the epoch), to compare with the engine's events.
    pub sent_unix_ms: f64,
    pub status: u16,
    pub reads: u32,
    pub events: Vec<Event>,
}

/// The request bytes for a POST with a JSON body.
pub fn post(addr: SocketAddr, path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: corral-load\r\nAccept: text/event-stream\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[derive(Debug)]
enum Framing {
    Chunked(Chunk),
    Length(u64),
    Close,
}

#[derive(Debug)]
enum Chunk {
    Size(Vec<u8>),
    Data(u64),
    DataEnd(Vec<u8>),
    Trailer(Vec<u8>),
    Done,
}

/// Incremental HTTP/1.1 response reader: head, then the body de-framed into `body`.
#[derive(Debug)]
pub struct Reader {
    head: Vec<u8>,
    pub status: Option<u16>,
    framing: Option<Framing>,
    pub complete: bool,
}

impl Default for Reader {
    fn default() -> Self {
        Self::new()
    }
}

impl Reader {
    pub fn new() -> Reader {
        Reader {
            head: Vec::new(),
            status: None,
            framing: None,
            complete: false,
        }
    }

    /// Feeds received bytes; appends body bytes to `body`.
    pub fn feed(&mut self, data: &[u8], body: &mut Vec<u8>) -> Result<(), String> {
        if self.framing.is_none() {
            self.head.extend_from_slice(data);
            let Some(end) = find(&self.head, b"\r\n\r\n") else {
                return Ok(());
            };
            let head = String::from_utf8_lossy(&self.head[..end]).into_owned();
            let rest = self.head[end + 4..].to_vec();
            let mut lines = head.split("\r\n");
            let status_line = lines.next().unwrap_or("");
            self.status = status_line
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok());
            let mut framing = Framing::Close;
            for l in lines {
                let Some((k, v)) = l.split_once(':') else {
                    continue;
                };
                let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_ascii_lowercase());
                if k == "transfer-encoding" && v.contains("chunked") {
                    framing = Framing::Chunked(Chunk::Size(Vec::new()));
                } else if k == "content-length" && !matches!(framing, Framing::Chunked(_)) {
                    framing =
                        Framing::Length(v.parse().map_err(|_| format!("bad content-length {v}"))?);
                }
            }
            self.framing = Some(framing);
            self.head.clear();
            if let Some(Framing::Length(0)) = self.framing {
                self.complete = true;
            }
            return self.feed_body(&rest, body);
        }
        self.feed_body(data, body)
    }

    fn feed_body(&mut self, mut data: &[u8], body: &mut Vec<u8>) -> Result<(), String> {
        match self.framing.as_mut().expect("head read") {
            Framing::Close => body.extend_from_slice(data),
            Framing::Length(left) => {
                let n = (*left as usize).min(data.len());
                body.extend_from_slice(&data[..n]);
                *left -= n as u64;
                if *left == 0 {
                    self.complete = true;
                }
            }
            Framing::Chunked(state) => {
                while !data.is_empty() {
                    match state {
                        Chunk::Size(line) => {
                            let b = data[0];
                            data = &data[1..];
                            line.push(b);
                            if line.ends_with(b"\r\n") {
                                let text =
                                    String::from_utf8_lossy(&line[..line.len() - 2]).into_owned();
                                let hex = text.split(';').next().unwrap_or("").trim();
                                let size = u64::from_str_radix(hex, 16)
                                    .map_err(|_| format!("bad chunk size {text:?}"))?;
                                *state = if size == 0 {
                                    Chunk::Trailer(Vec::new())
                                } else {
                                    Chunk::Data(size)
                                };
                            }
                        }
                        Chunk::Data(left) => {
                            let n = (*left as usize).min(data.len());
                            body.extend_from_slice(&data[..n]);
                            data = &data[n..];
                            *left -= n as u64;
                            if *left == 0 {
                                *state = Chunk::DataEnd(Vec::new());
                            }
                        }
                        Chunk::DataEnd(crlf) => {
                            crlf.push(data[0]);
                            data = &data[1..];
                            if crlf.len() == 2 {
                                *state = Chunk::Size(Vec::new());
                            }
                        }
                        Chunk::Trailer(t) => {
                            t.push(data[0]);
                            data = &data[1..];
                            if t.as_slice() == b"\r\n" || t.ends_with(b"\r\n\r\n") {
                                *state = Chunk::Done;
                                self.complete = true;
                            }
                        }
                        Chunk::Done => break,
                    }
                }
            }
        }
        Ok(())
    }
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Parses one SSE event's text: the content chunk's number, or `[DONE]`.
fn classify(event: &[u8]) -> (Option<u32>, bool) {
    if find(event, b"[DONE]").is_some() {
        return (None, true);
    }
    const MARK: &[u8] = b"\"content\":\"tok";
    let Some(p) = find(event, MARK) else {
        return (None, false);
    };
    let digits: String = event[p + MARK.len()..]
        .iter()
        .take_while(|c| c.is_ascii_digit())
        .map(|c| *c as char)
        .collect();
    (digits.parse().ok(), false)
}

/// Sends one streaming request on a fresh connection and reads the whole stream.
pub async fn run_stream(
    addr: SocketAddr,
    request: &[u8],
    timeout: Duration,
) -> Result<Stream, String> {
    let mut sock = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    sock.set_nodelay(true).map_err(|e| e.to_string())?;
    let sent = Instant::now();
    let sent_unix_ms = crate::procfs::unix_ms();
    sock.write_all(request).await.map_err(|e| e.to_string())?;
    let deadline = sent + timeout;
    let mut reader = Reader::new();
    let mut body = Vec::new();
    let mut pending: Vec<u8> = Vec::new();
    let mut out = Stream {
        sent,
        sent_unix_ms,
        status: 0,
        reads: 0,
        events: Vec::new(),
    };
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match tokio::time::timeout_at(deadline.into(), sock.read(&mut buf)).await {
            Err(_) => {
                return Err(format!(
                    "stream timed out after {timeout:?} ({} events)",
                    out.events.len()
                ))
            }
            Ok(Err(e)) => return Err(e.to_string()),
            Ok(Ok(n)) => n,
        };
        let at = Instant::now();
        if n == 0 {
            break;
        }
        out.reads += 1;
        body.clear();
        reader.feed(&buf[..n], &mut body)?;
        pending.extend_from_slice(&body);
        while let Some(end) = find(&pending, b"\n\n") {
            let event: Vec<u8> = pending.drain(..end + 2).collect();
            let (index, done) = classify(&event);
            out.events.push(Event {
                at,
                read: out.reads,
                index,
                done,
            });
        }
        if reader.complete {
            break;
        }
    }
    out.status = reader.status.unwrap_or(0);
    Ok(out)
}

/// Opens a stream and reads until its first event, then hands the socket back unread from there.
pub async fn open_stream(addr: SocketAddr, request: &[u8]) -> Result<TcpStream, String> {
    let mut sock = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    sock.set_nodelay(true).map_err(|e| e.to_string())?;
    sock.write_all(request).await.map_err(|e| e.to_string())?;
    let mut reader = Reader::new();
    let mut body = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = sock.read(&mut buf).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("closed before the first event".into());
        }
        reader.feed(&buf[..n], &mut body)?;
        if let Some(s) = reader.status {
            if s != 200 {
                return Err(format!("status {s}: {}", String::from_utf8_lossy(&body)));
            }
        }
        if find(&body, b"\n\n").is_some() {
            return Ok(sock);
        }
    }
}

/// Reads whatever is buffered without waiting, so that closing sends FIN rather than RST.
pub fn drain_now(sock: &TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    while let Ok(n) = sock.try_read(&mut buf) {
        if n == 0 {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_body_split_anywhere() {
        let resp = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;x=1\r\n world\r\n0\r\n\r\n";
        for split in 0..resp.len() {
            let mut r = Reader::new();
            let mut body = Vec::new();
            r.feed(&resp[..split], &mut body).unwrap();
            r.feed(&resp[split..], &mut body).unwrap();
            assert_eq!(body, b"hello world", "split at {split}");
            assert!(r.complete);
            assert_eq!(r.status, Some(200));
        }
    }

    #[test]
    fn length_body() {
        let mut r = Reader::new();
        let mut body = Vec::new();
        r.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nab", &mut body)
            .unwrap();
        assert!(!r.complete);
        r.feed(b"c", &mut body).unwrap();
        assert!(r.complete);
        assert_eq!(body, b"abc");
    }

    #[test]
    fn events() {
        assert_eq!(
            classify(br#"data: {"delta":{"content":"tok17 "}}"#),
            (Some(17), false)
        );
        assert_eq!(classify(b"data: [DONE]"), (None, true));
        assert_eq!(classify(br#"data: {"delta":{}}"#), (None, false));
    }
}
