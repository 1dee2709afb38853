//! The `http` log stream (`logToStdout: http` or `both`): one access line per request, written
//! when its answer's body ends, in llama-swap's format:
//!
//! `Request 127.0.0.1 "POST /v1/chat/completions HTTP/1.1" 200 1234 "curl/8.5.0" 1.2s`
//!
//! Off (the default), a request pays one branch. The address is the connection's peer: corral
//! takes no client address from `X-Forwarded-For`, which any client may send.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::{header, Request, Response};
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;

use crate::logs::Logs;
use crate::proxy::body::{Body, BoxError};

/// Paths polled so often that their lines would drown the rest (llama-swap skips the same).
const QUIET: &[&str] = &["/wol-health", "/api/performance", "/metrics"];

/// What the line says of the request, taken before it moves on.
pub struct Access {
    head: String,
    user_agent: String,
    started: Instant,
    logs: Arc<Logs>,
}

impl Access {
    /// The request's line to be, unless its path is a quiet one.
    pub fn begin<B>(req: &Request<B>, remote: SocketAddr, logs: &Arc<Logs>) -> Option<Access> {
        let path = req.uri().path();
        if QUIET.iter().any(|q| {
            path.strip_prefix(q)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        }) {
            return None;
        }
        let user_agent = req
            .headers()
            .get(header::USER_AGENT)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default();
        Some(Access {
            head: format!(
                "{} \"{} {} {:?}\"",
                remote.ip(),
                req.method(),
                path,
                req.version()
            ),
            user_agent,
            started: Instant::now(),
            logs: logs.clone(),
        })
    }

    /// The answer, whose body writes the line when it ends (or is dropped unfinished).
    pub fn answered(self, resp: Response<Body>) -> Response<Body> {
        let status = resp.status().as_u16();
        resp.map(|inner| {
            Counted {
                inner,
                sent: 0,
                line: Some((self, status)),
            }
            .boxed()
        })
    }
}

/// A response body that counts what it sends and logs the request at its end.
struct Counted {
    inner: Body,
    sent: u64,
    line: Option<(Access, u16)>,
}

impl Counted {
    fn log(&mut self) {
        let Some((access, status)) = self.line.take() else {
            return;
        };
        let line = format!(
            "Request {} {status} {} \"{}\" {:?}\n",
            access.head,
            self.sent,
            access.user_agent,
            access.started.elapsed()
        );
        crate::logging::http_line(&access.logs, line.as_bytes());
    }
}

impl http_body::Body for Counted {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                self.sent += frame.data_ref().map_or(0, |d| d.len() as u64);
            }
            Poll::Ready(None | Some(Err(_))) => self.log(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.log();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(path: &str) -> Request<()> {
        Request::post(path)
            .header(header::USER_AGENT, "curl/8.5.0")
            .body(())
            .unwrap()
    }

    /// The line is written when the body ends, with its status, bytes sent and user agent.
    #[tokio::test]
    async fn a_request_gets_one_line_when_its_body_ends() {
        let logs = Arc::new(Logs::default());
        let remote: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let access = Access::begin(&request("/v1/chat/completions"), remote, &logs).unwrap();
        let resp = Response::builder()
            .status(201)
            .body(crate::proxy::body::full("hello"))
            .unwrap();
        let resp = access.answered(resp);
        assert!(logs.http.history().is_empty(), "not before the body ends");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "hello");
        let line = String::from_utf8(logs.http.history()).unwrap();
        assert!(
            line.starts_with(
                "Request 127.0.0.1 \"POST /v1/chat/completions HTTP/1.1\" 201 5 \"curl/8.5.0\" "
            ),
            "{line}"
        );
        assert_eq!(line.lines().count(), 1, "{line}");
        assert_eq!(logs.combined.history(), logs.http.history());
    }

    #[test]
    fn polled_paths_are_not_logged() {
        let logs = Arc::new(Logs::default());
        let remote: SocketAddr = "127.0.0.1:9".parse().unwrap();
        for quiet in ["/metrics", "/wol-health", "/api/performance"] {
            assert!(
                Access::begin(&request(quiet), remote, &logs).is_none(),
                "{quiet}"
            );
        }
        assert!(Access::begin(&request("/metricsfoo"), remote, &logs).is_some());
    }
}
