//! An engine's event stream as Ollama's NDJSON: one object per line for each piece of text, the
//! tool calls once they are whole, and a last object with `done: true`, the reason and the counts.
//! The engine's stream is read as it comes (the metering below reads the same bytes first).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::Frame;
use serde_json::{json, Map, Value};

use super::answer::{self, Counts};
use super::request::Asked;
use super::Call;
use crate::proxy::body::{Body, BoxError};

/// The translation of one stream, fed the engine's bytes as they arrive.
pub struct Ndjson {
    generate: bool,
    model: String,
    started: Instant,
    /// Bytes of a line not yet ended.
    partial: Vec<u8>,
    /// Tool calls by index, their arguments' text gathered piece by piece.
    calls: Vec<Value>,
    finish: Option<String>,
    counts: Counts,
    /// The last object (or an error) has been sent: nothing more follows.
    done: bool,
}

impl Ndjson {
    pub fn new(asked: &Asked, started: Instant) -> Ndjson {
        Ndjson {
            generate: asked.call == Call::Generate,
            model: asked.model.clone(),
            started,
            partial: Vec::new(),
            calls: Vec::new(),
            finish: None,
            counts: Counts::default(),
            done: false,
        }
    }

    /// Reads the engine's bytes; the objects its complete lines make are appended to `out`.
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        self.partial.extend_from_slice(bytes);
        while let Some(end) = self.partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=end).collect();
            self.line(&line, out);
        }
    }

    /// The stream ended: the last object, unless it was sent.
    pub fn end(&mut self, out: &mut Vec<u8>) {
        let rest = std::mem::take(&mut self.partial);
        self.line(&rest, out);
        self.last(out);
    }

    fn line(&mut self, line: &[u8], out: &mut Vec<u8>) {
        let text = String::from_utf8_lossy(line);
        let Some(data) = text.trim().strip_prefix("data:").map(str::trim) else {
            return;
        };
        if data == "[DONE]" {
            return self.last(out);
        }
        if self.done {
            return;
        }
        match serde_json::from_str::<Value>(data) {
            Ok(chunk) => self.chunk(&chunk, out),
            Err(e) => self.error(
                &format!("the engine sent an event that is not JSON: {e}"),
                out,
            ),
        }
    }

    fn chunk(&mut self, chunk: &Value, out: &mut Vec<u8>) {
        if let Some(e) = chunk.get("error") {
            let status = http::StatusCode::INTERNAL_SERVER_ERROR;
            return self.error(
                &super::errors::upstream_message(&json!({"error": e}).to_string(), status),
                out,
            );
        }
        self.counts.read(chunk);
        let choice = &chunk["choices"][0];
        if let Some(reason) = choice["finish_reason"].as_str() {
            self.finish = Some(reason.to_string());
        }
        let delta = &choice["delta"];
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            self.gather(call);
        }
        let content = delta["content"]
            .as_str()
            .or_else(|| choice["text"].as_str())
            .unwrap_or("");
        let thinking = delta["reasoning_content"].as_str().unwrap_or("");
        if !content.is_empty() || !thinking.is_empty() {
            let piece = self.object(content, thinking, &[]);
            write_line(out, piece);
        }
    }

    /// Adds a piece of a streamed tool call to the one of its index.
    fn gather(&mut self, piece: &Value) {
        let index = piece["index"].as_u64().unwrap_or(self.calls.len() as u64) as usize;
        while self.calls.len() <= index {
            self.calls
                .push(json!({"function": {"name": "", "arguments": ""}}));
        }
        let f = &mut self.calls[index]["function"];
        for field in ["name", "arguments"] {
            if let Some(more) = piece["function"][field].as_str() {
                let so_far = f[field].as_str().unwrap_or("").to_string();
                f[field] = json!(so_far + more);
            }
        }
    }

    /// One object that is not the last: a piece of text, or the tool calls.
    fn object(&self, content: &str, thinking: &str, calls: &[Value]) -> Map<String, Value> {
        let mut o = answer::head(&self.model);
        if self.generate {
            o.insert("response".into(), json!(content));
            if !thinking.is_empty() {
                o.insert("thinking".into(), json!(thinking));
            }
        } else {
            o.insert("message".into(), answer::message(content, thinking, calls));
        }
        o.insert("done".into(), json!(false));
        o
    }

    /// The tool calls, whole, then the last object.
    fn last(&mut self, out: &mut Vec<u8>) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        if !self.calls.is_empty() && !self.generate {
            let calls = std::mem::take(&mut self.calls);
            write_line(out, self.object("", "", &calls));
        }
        let mut o = self.object("", "", &[]);
        o.insert("done".into(), json!(true));
        let reason = answer::done_reason(self.finish.as_deref());
        o.insert("done_reason".into(), json!(reason));
        self.counts.write(&mut o, self.started);
        write_line(out, o);
    }

    /// An error line, as Ollama sends one mid-stream; nothing follows it.
    fn error(&mut self, message: &str, out: &mut Vec<u8>) {
        self.done = true;
        let mut o = Map::new();
        o.insert("error".into(), json!(message));
        write_line(out, o);
    }
}

fn write_line(out: &mut Vec<u8>, object: Map<String, Value>) {
    serde_json::to_writer(&mut *out, &Value::Object(object)).expect("a JSON value writes");
    out.push(b'\n');
}

pin_project_lite::pin_project! {
    /// The engine's answer body, translated as it is read.
    pub struct NdjsonBody {
        #[pin]
        inner: Body,
        ndjson: Ndjson,
        ended: bool,
    }
}

impl NdjsonBody {
    pub fn new(inner: Body, ndjson: Ndjson) -> NdjsonBody {
        NdjsonBody {
            inner,
            ndjson,
            ended: false,
        }
    }
}

impl http_body::Body for NdjsonBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        loop {
            if *this.ended {
                return Poll::Ready(None);
            }
            let mut out = Vec::new();
            match std::task::ready!(this.inner.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => this.ndjson.feed(&data, &mut out),
                    Err(_) => continue, // trailers: Ollama sends none
                },
                Some(Err(e)) => {
                    *this.ended = true;
                    return Poll::Ready(Some(Err(e)));
                }
                None => {
                    *this.ended = true;
                    this.ndjson.end(&mut out);
                }
            }
            if !out.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked(call: Call) -> Asked {
        Asked {
            call,
            model: "m".into(),
            stream: true,
            keep_alive: None,
        }
    }

    fn lines(out: &[u8]) -> Vec<Value> {
        String::from_utf8_lossy(out)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    const STREAM: &str = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2},",
        "\"timings\":{\"prompt_ms\":1.0,\"predicted_ms\":2.0}}\n\n",
        "data: [DONE]\n\n",
    );

    #[test]
    fn pieces_then_one_done_object_with_counts_however_the_bytes_are_cut() {
        for cut in [1, 7, STREAM.len()] {
            let mut n = Ndjson::new(&asked(Call::Chat), Instant::now());
            let mut out = Vec::new();
            for piece in STREAM.as_bytes().chunks(cut) {
                n.feed(piece, &mut out);
            }
            n.end(&mut out);
            let got = lines(&out);
            assert_eq!(got.len(), 3, "cut {cut}: {got:?}");
            assert_eq!(
                got[0]["message"],
                json!({"role": "assistant", "content": "Hel"})
            );
            assert_eq!(got[1]["message"]["content"], "lo");
            assert_eq!(got[0]["done"], false);
            let last = &got[2];
            assert_eq!(last["done"], true);
            assert_eq!(last["done_reason"], "length");
            assert_eq!(last["message"]["content"], "");
            assert_eq!(last["prompt_eval_count"], 4);
            assert_eq!(last["eval_count"], 2);
            assert_eq!(last["eval_duration"], 2_000_000);
        }
    }

    #[test]
    fn a_generate_stream_sends_response_pieces() {
        let mut n = Ndjson::new(&asked(Call::Generate), Instant::now());
        let mut out = Vec::new();
        n.feed(b"data: {\"choices\":[{\"text\":\"once\"}]}\n", &mut out);
        n.end(&mut out);
        let got = lines(&out);
        assert_eq!(got[0]["response"], "once");
        assert_eq!(got[1]["response"], "");
        assert_eq!(got[1]["done"], true);
        assert_eq!(
            got[1]["done_reason"], "stop",
            "an end without a reason is a stop"
        );
    }

    #[test]
    fn streamed_tool_calls_are_sent_whole_before_the_end() {
        let mut n = Ndjson::new(&asked(Call::Chat), Instant::now());
        let mut out = Vec::new();
        for piece in [
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"weather","arguments":"{\"ci"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"ty\":\"Oslo\"}"}}]}}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"tool_calls"}]}"#,
        ] {
            n.feed(format!("data: {piece}\n\n").as_bytes(), &mut out);
        }
        n.feed(b"data: [DONE]\n\n", &mut out);
        let got = lines(&out);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(
            got[0]["message"]["tool_calls"],
            json!([{"function": {"name": "weather", "arguments": {"city": "Oslo"}}}])
        );
        assert_eq!(got[1]["done"], true);
        assert_eq!(got[1]["done_reason"], "stop");
    }

    #[test]
    fn an_engines_error_event_ends_the_stream_as_an_error_line() {
        let mut n = Ndjson::new(&asked(Call::Chat), Instant::now());
        let mut out = Vec::new();
        n.feed(
            b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
            &mut out,
        );
        n.feed(
            b"data: {\"error\":{\"code\":500,\"message\":\"slot died\"}}\n\n",
            &mut out,
        );
        n.end(&mut out);
        let got = lines(&out);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[1], json!({"error": "slot died"}));
    }

    #[tokio::test]
    async fn the_body_translates_as_it_reads() {
        use http_body_util::BodyExt;
        let inner = crate::proxy::body::full(STREAM);
        let body = NdjsonBody::new(inner, Ndjson::new(&asked(Call::Chat), Instant::now()));
        let bytes = body.collect().await.unwrap().to_bytes();
        let got = lines(&bytes);
        assert_eq!(got.len(), 3);
        assert_eq!(got[2]["done"], true);
    }
}
