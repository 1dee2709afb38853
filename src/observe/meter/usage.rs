//! Token counts read from what passes: the `usage` (or llama.cpp `timings`) value of a JSON body
//! or of the SSE event that carries it, found by its key so the rest of the answer is never parsed.

use bytes::Bytes;

pub(crate) use super::tokens::Tokens;
use super::tokens::{TIMINGS_KEY, USAGE_KEY};

/// The most of a non-streaming JSON body kept aside to read its `usage` at the end.
const JSON_COPY_LIMIT: usize = 1 << 20;
/// The longest SSE line kept while waiting for its end.
const LINE_LIMIT: usize = 256 * 1024;
/// The largest buffer for split lines kept between lines; a longer line's buffer is freed.
const KEPT_LINE_CAPACITY: usize = 4096;

/// Watches a response body for its token counts, without holding anything back.
pub(crate) struct UsageTap {
    sse: bool,
    line: Vec<u8>,
    /// A non-streaming JSON body's chunks (shared, not copied), read for `usage` at the end.
    json: Option<Vec<Bytes>>,
    json_len: usize,
    /// The event stream said `[DONE]`: nothing may be added to it.
    pub(crate) done: bool,
    tokens: Option<Tokens>,
}

impl UsageTap {
    pub(crate) fn new(content_type: &str) -> UsageTap {
        UsageTap {
            sse: content_type.starts_with("text/event-stream"),
            line: Vec::new(),
            json: content_type.contains("json").then(Vec::new),
            json_len: 0,
            done: false,
            tokens: None,
        }
    }

    pub(crate) fn is_sse(&self) -> bool {
        self.sse
    }

    pub(crate) fn observe(&mut self, data: &Bytes) {
        if self.sse {
            self.observe_sse(data);
        } else if let Some(chunks) = &mut self.json {
            self.json_len += data.len();
            if self.json_len <= JSON_COPY_LIMIT {
                chunks.push(data.clone());
            } else {
                self.json = None;
            }
        }
    }

    /// Reads each whole line where it lies in the chunk; only a line split across chunks is
    /// copied, and its buffer is kept for the next one.
    fn observe_sse(&mut self, mut data: &[u8]) {
        while let Some(end) = memchr::memchr(b'\n', data) {
            let line = &data[..end];
            if self.line.is_empty() {
                self.sse_line(line);
            } else {
                self.keep(line);
                let mut whole = std::mem::take(&mut self.line);
                self.sse_line(&whole);
                if whole.capacity() <= KEPT_LINE_CAPACITY {
                    whole.clear();
                    self.line = whole;
                }
            }
            data = &data[end + 1..];
        }
        self.keep(data);
    }

    /// Adds the start of a line that goes on in the next chunk, up to the longest line kept.
    fn keep(&mut self, part: &[u8]) {
        let room = LINE_LIMIT.saturating_sub(self.line.len());
        self.line.extend_from_slice(&part[..part.len().min(room)]);
    }

    fn sse_line(&mut self, line: &[u8]) {
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let data = data.trim_ascii();
        if data == b"[DONE]" {
            self.done = true;
            return;
        }
        // only the events that carry counts are parsed (usually the last one)
        let carries = |key: &memchr::memmem::Finder| key.find(data).is_some();
        if data.first() != Some(&b'{') || !(carries(&USAGE_KEY) || carries(&TIMINGS_KEY)) {
            return;
        }
        if let Some(t) = Tokens::from_slice(data) {
            self.tokens = Some(self.tokens.map_or(t, |earlier| earlier.then(t)));
        }
    }

    /// The counts seen, and when `failed`, the message of a JSON error body.
    pub(crate) fn finish(&mut self, failed: bool) -> (Option<Tokens>, Option<String>) {
        let Some(chunks) = self.json.take() else {
            return (self.tokens, None);
        };
        let joined;
        let body: &[u8] = match chunks.as_slice() {
            [one] => one,
            many => {
                joined = many.concat();
                &joined
            }
        };
        let tokens = Tokens::from_slice(body).or(self.tokens);
        (tokens, failed.then(|| error_message(body)).flatten())
    }
}

/// An error body's message: `error.message`, `error`, `message` or `detail`.
fn error_message(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let text = |v: &serde_json::Value| v.as_str().map(str::to_string);
    v.get("error")
        .and_then(|e| e.get("message").and_then(text).or_else(|| text(e)))
        .or_else(|| v.get("message").and_then(text))
        .or_else(|| v.get("detail").and_then(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(doc: &str) -> Option<(u64, u64)> {
        Tokens::from_slice(doc.as_bytes()).map(|t| (t.prompt, t.completion))
    }

    #[test]
    fn tokens_from_usage_or_timings() {
        let usage = r#"{"usage": {"prompt_tokens": 7, "completion_tokens": 3}, "choices": [{"x": [1, 2]}]}"#;
        assert_eq!(counts(usage), Some((7, 3)));
        assert_eq!(
            counts(r#"{"timings": {"prompt_n": 5, "predicted_n": 9, "x": 1.5}}"#),
            Some((5, 9))
        );
        assert_eq!(
            counts(r#"{"usage": {"input_tokens": 2, "output_tokens": 4}}"#),
            Some((2, 4))
        );
        assert_eq!(
            counts(r#"{"response": {"usage": {"input_tokens": 2, "output_tokens": 4}}}"#),
            Some((2, 4))
        );
        assert_eq!(counts(r#"{"choices": []}"#), None);
        assert_eq!(
            counts(r#"{"usage": null, "timings": {"prompt_n": 1}}"#),
            Some((1, 0))
        );
        assert_eq!(
            counts(r#"{"usage" : {"prompt_tokens": 1}, "object": "usage"}"#),
            Some((1, 0))
        );
        // the same words inside strings do not count
        assert_eq!(
            counts(r#"{"choices": [{"content": "say \"usage\": {\"prompt_tokens\": 9}"}]}"#),
            None
        );
        assert_eq!(
            counts(
                r#"{"choices": [{"content": "\"timings\": {}"}], "usage": {"completion_tokens": 2}}"#
            ),
            Some((0, 2))
        );
    }

    #[test]
    fn speeds_cache_and_drafts_come_along() {
        let llama = r#"{"usage": {"prompt_tokens": 10, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 4}},
            "timings": {"prompt_n": 6, "predicted_n": 5, "cache_n": 4, "draft_n": 3, "draft_n_accepted": 2,
                        "prompt_per_second": 120.5, "predicted_per_second": 33.25}}"#;
        let t = Tokens::from_slice(llama.as_bytes()).unwrap();
        assert_eq!((t.prompt, t.completion, t.cache), (10, 5, Some(4)));
        assert_eq!((t.draft, t.draft_accepted), (Some(3), Some(2)));
        assert_eq!(
            (t.prompt_per_second, t.tokens_per_second),
            (Some(120.5), Some(33.25))
        );
        let anthropic =
            r#"{"usage": {"input_tokens": 3, "output_tokens": 1, "cache_read_input_tokens": 2}}"#;
        assert_eq!(
            Tokens::from_slice(anthropic.as_bytes()).unwrap().cache,
            Some(2)
        );
    }

    fn tap(content_type: &str, chunks: &[&str]) -> UsageTap {
        let mut t = UsageTap::new(content_type);
        for c in chunks {
            t.observe(&Bytes::copy_from_slice(c.as_bytes()));
        }
        t
    }

    #[test]
    fn an_sse_event_split_across_chunks_is_read_whole() {
        let mut t = tap(
            "text/event-stream",
            &[
                "data: {\"choices\":[]}\n\ndata: {\"us",
                "age\": {\"prompt_tokens\": 4, \"completion_tokens\": 2}}\n\n",
            ],
        );
        assert!(!t.done);
        assert_eq!(
            t.finish(false).0.map(|t| (t.prompt, t.completion)),
            Some((4, 2))
        );
        let t = tap("text/event-stream", &["data: [DONE]\n\n"]);
        assert!(t.done, "[DONE] closes the stream to added events");
    }

    /// The lines of an event stream as engines write them: comments, empty lines, events that
    /// carry no counts, events that do (one per count, so the last one read shows), `[DONE]`,
    /// with `\n` or `\r\n` endings.
    fn sse_stream() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let line = prop_oneof![
            Just(": keep-alive".to_string()),
            Just(String::new()),
            "[a-z ]{0,40}".prop_map(|t| format!("data: {{\"choices\":[{{\"delta\":\"{t}\"}}]}}")),
            (0u64..1000, 0u64..1000).prop_map(|(p, c)| format!(
                "data: {{\"usage\": {{\"prompt_tokens\": {p}, \"completion_tokens\": {c}}}}}"
            )),
            Just("data: [DONE]".to_string()),
        ];
        let ending = prop_oneof![Just("\n"), Just("\r\n")];
        proptest::collection::vec((line, ending), 0..12)
            .prop_map(|lines| lines.into_iter().map(|(l, e)| l + e).collect())
    }

    proptest::proptest! {
        /// However the stream is cut into chunks (a line split once, twice, or at every byte),
        /// the counts and `[DONE]` read are those of the whole stream in one chunk.
        #[test]
        fn an_event_stream_reads_the_same_however_it_is_cut(
            text in sse_stream(),
            cuts in proptest::collection::vec(proptest::prelude::any::<proptest::sample::Index>(), 0..8),
        ) {
            let mut at: Vec<usize> = cuts.iter().map(|i| i.index(text.len() + 1)).collect();
            at.sort_unstable();
            let mut chunks = Vec::new();
            let mut from = 0;
            for to in at.into_iter().chain([text.len()]) {
                chunks.push(&text[from..to]);
                from = to;
            }
            let mut whole = tap("text/event-stream", &[&text]);
            let mut cut = tap("text/event-stream", &chunks);
            proptest::prop_assert_eq!(cut.done, whole.done);
            proptest::prop_assert_eq!(cut.finish(false), whole.finish(false));
        }
    }

    #[test]
    fn a_line_split_across_many_chunks_is_read_and_its_buffer_reused() {
        let event = "data: {\"usage\": {\"prompt_tokens\": 4, \"completion_tokens\": 2}}\n";
        let bytes: Vec<String> = event.chars().map(String::from).collect();
        let refs: Vec<&str> = bytes.iter().map(String::as_str).collect();
        let mut t = tap("text/event-stream", &refs);
        assert!(
            t.line.is_empty() && t.line.capacity() > 0,
            "kept for the next split line"
        );
        assert_eq!(
            t.finish(false).0.map(|t| (t.prompt, t.completion)),
            Some((4, 2))
        );
        let long = format!("data: {}", "x".repeat(2 * KEPT_LINE_CAPACITY));
        let t = tap("text/event-stream", &[&long[..10], &long[10..], "\n"]);
        assert_eq!(t.line.capacity(), 0, "a long line's buffer is not kept");
    }

    /// Anthropic's stream gives the input's counts when it starts and the output's at its end:
    /// both are kept.
    #[test]
    fn counts_given_apart_in_a_stream_are_kept_together() {
        let start = r#"data: {"type":"message_start","message":{"id":"m","usage":{"input_tokens":12,"cache_read_input_tokens":4,"output_tokens":0}}}"#;
        let delta = r#"data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":5}}"#;
        let stream = format!("event: message_start\n{start}\n\nevent: message_delta\n{delta}\n\n");
        let t = tap("text/event-stream", &[&stream])
            .finish(false)
            .0
            .unwrap();
        assert_eq!((t.prompt, t.completion, t.cache), (12, 5, Some(4)));
    }

    #[test]
    fn a_json_body_is_read_at_the_end_and_a_failed_one_gives_its_message() {
        let body = [
            "{\"error\": {\"message\": \"no such ",
            "model\"}, \"usage\": {\"prompt_tokens\": 1}}",
        ];
        let (tokens, error) = tap("application/json", &body).finish(true);
        assert_eq!(tokens.map(|t| t.prompt), Some(1));
        assert_eq!(error.as_deref(), Some("no such model"));
        assert_eq!(tap("application/json", &body).finish(false).1, None);
    }

    #[test]
    fn a_json_body_past_the_copy_limit_is_not_kept() {
        let big = format!(
            "{{\"usage\": {{\"prompt_tokens\": 1}}, \"pad\": \"{}\"}}",
            "x".repeat(JSON_COPY_LIMIT)
        );
        let mut t = tap("application/json", &[&big]);
        assert_eq!(t.finish(true), (None, None));
    }
}
