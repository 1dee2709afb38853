//! An engine's whole OpenAI answer as Ollama's, and what the streamed and whole answers share:
//! the message, the reason it ended, and the counts and durations of the last object.

use std::time::{Instant, SystemTime};

use serde_json::{json, Map, Value};

use super::request::Asked;
use super::Call;

/// Token counts and durations for the last object of an answer, from OpenAI's `usage` and
/// llama.cpp's `timings`; what the engine did not report is left out, as Ollama leaves out zeros.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Counts {
    prompt: Option<u64>,
    eval: Option<u64>,
    prompt_ns: Option<u64>,
    eval_ns: Option<u64>,
}

impl Counts {
    /// Takes what an answer (or a chunk of one) reports; `usage` before `timings`.
    pub fn read(&mut self, v: &Value) {
        let usage = &v["usage"];
        let timings = &v["timings"];
        let count = |a: &Value, b: &Value| a.as_u64().or_else(|| b.as_u64());
        let ns = |ms: &Value| ms.as_f64().map(|ms| (ms * 1e6) as u64);
        self.prompt = count(&usage["prompt_tokens"], &timings["prompt_n"]).or(self.prompt);
        self.eval = count(&usage["completion_tokens"], &timings["predicted_n"]).or(self.eval);
        self.prompt_ns = ns(&timings["prompt_ms"]).or(self.prompt_ns);
        self.eval_ns = ns(&timings["predicted_ms"]).or(self.eval_ns);
    }

    /// Adds the counts, and the time since `started`, to a last object.
    pub fn write(&self, out: &mut Map<String, Value>, started: Instant) {
        out.insert(
            "total_duration".into(),
            json!(started.elapsed().as_nanos() as u64),
        );
        let fields = [
            ("prompt_eval_count", self.prompt),
            ("prompt_eval_duration", self.prompt_ns),
            ("eval_count", self.eval),
            ("eval_duration", self.eval_ns),
        ];
        for (name, value) in fields {
            if let Some(v) = value.filter(|v| *v > 0) {
                out.insert(name.into(), json!(v));
            }
        }
    }
}

/// Now, as Ollama's `created_at`.
pub fn created_at() -> String {
    crate::clock::rfc3339::format(SystemTime::now())
}

/// Ollama's `done_reason` for OpenAI's `finish_reason`: a tool call ends as a stop.
pub fn done_reason(finish: Option<&str>) -> &str {
    match finish {
        None | Some("tool_calls" | "function_call") => "stop",
        Some(other) => other,
    }
}

/// OpenAI's tool calls as Ollama's: the arguments as an object (kept as text when they are not
/// JSON, which a client can still read).
pub fn tool_calls(list: &[Value]) -> Vec<Value> {
    list.iter()
        .map(|c| {
            let f = &c["function"];
            let arguments = match &f["arguments"] {
                Value::String(s) => serde_json::from_str(s).unwrap_or_else(|_| json!(s)),
                Value::Null => json!({}),
                other => other.clone(),
            };
            json!({"function": {"name": f["name"], "arguments": arguments}})
        })
        .collect()
}

/// An assistant message: its text, its reasoning as `thinking`, its tool calls.
pub fn message(content: &str, thinking: &str, calls: &[Value]) -> Value {
    let mut m = json!({"role": "assistant", "content": content});
    if !thinking.is_empty() {
        m["thinking"] = json!(thinking);
    }
    if !calls.is_empty() {
        m["tool_calls"] = Value::Array(tool_calls(calls));
    }
    m
}

/// The head every streamed or whole object of a chat or generate starts with.
pub fn head(model: &str) -> Map<String, Value> {
    let mut out = Map::new();
    out.insert("model".into(), json!(model));
    out.insert("created_at".into(), json!(created_at()));
    out
}

/// The text of a choice: a chat message's, or a text completion's.
fn choice_text<'a>(choice: &'a Value, field: &str) -> &'a str {
    choice["message"][field]
        .as_str()
        .or_else(|| choice["text"].as_str().filter(|_| field == "content"))
        .unwrap_or("")
}

/// A whole answer, as the one object Ollama sends with `"stream": false`.
pub fn whole(asked: &Asked, openai: &Value, started: Instant) -> Value {
    match asked.call {
        Call::Embed => embed(&asked.model, openai, started),
        Call::Embeddings => {
            json!({"embedding": vectors(openai).into_iter().next().unwrap_or_default()})
        }
        _ => completion(asked, openai, started),
    }
}

fn completion(asked: &Asked, openai: &Value, started: Instant) -> Value {
    let choice = &openai["choices"][0];
    let (content, thinking) = (
        choice_text(choice, "content"),
        choice_text(choice, "reasoning_content"),
    );
    let mut out = head(&asked.model);
    if asked.call == Call::Generate {
        out.insert("response".into(), json!(content));
        if !thinking.is_empty() {
            out.insert("thinking".into(), json!(thinking));
        }
    } else {
        let calls = choice["message"]["tool_calls"]
            .as_array()
            .map_or(&[][..], Vec::as_slice);
        out.insert("message".into(), message(content, thinking, calls));
    }
    out.insert("done".into(), json!(true));
    let reason = done_reason(choice["finish_reason"].as_str());
    out.insert("done_reason".into(), json!(reason));
    let mut counts = Counts::default();
    counts.read(openai);
    counts.write(&mut out, started);
    Value::Object(out)
}

fn embed(model: &str, openai: &Value, started: Instant) -> Value {
    let mut out = Map::new();
    out.insert("model".into(), json!(model));
    out.insert("embeddings".into(), json!(vectors(openai)));
    let mut counts = Counts::default();
    counts.read(openai);
    counts.write(&mut out, started);
    Value::Object(out)
}

/// The vectors of an embedding answer, in input order.
fn vectors(openai: &Value) -> Vec<Value> {
    let mut data: Vec<&Value> = openai["data"]
        .as_array()
        .map(|d| d.iter().collect())
        .unwrap_or_default();
    data.sort_by_key(|d| d["index"].as_u64().unwrap_or(0));
    data.iter().map(|d| d["embedding"].clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked(call: Call) -> Asked {
        Asked {
            call,
            model: "qwen".into(),
            stream: false,
            keep_alive: None,
        }
    }

    const CHAT: &str = r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"hi there",
        "reasoning_content":"greet","tool_calls":[{"id":"c1","type":"function",
        "function":{"name":"weather","arguments":"{\"city\":\"Oslo\"}"}}]},"finish_reason":"tool_calls"}],
        "usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8},
        "timings":{"prompt_n":5,"prompt_ms":2.5,"predicted_n":3,"predicted_ms":30.0}}"#;

    #[test]
    fn a_chat_answer_is_one_done_object_with_counts() {
        let openai: Value = serde_json::from_str(CHAT).unwrap();
        let out = whole(&asked(Call::Chat), &openai, Instant::now());
        assert_eq!(out["model"], "qwen");
        assert_eq!(out["done"], true);
        assert_eq!(out["done_reason"], "stop");
        assert_eq!(out["message"]["content"], "hi there");
        assert_eq!(out["message"]["thinking"], "greet");
        assert_eq!(
            out["message"]["tool_calls"],
            json!([{"function": {"name": "weather", "arguments": {"city": "Oslo"}}}])
        );
        assert_eq!(out["prompt_eval_count"], 5);
        assert_eq!(out["eval_count"], 3);
        assert_eq!(out["prompt_eval_duration"], 2_500_000);
        assert_eq!(out["eval_duration"], 30_000_000);
        assert!(out["total_duration"].as_u64().is_some());
        assert!(crate::clock::rfc3339::parse(out["created_at"].as_str().unwrap()).is_some());
    }

    #[test]
    fn a_generate_answer_carries_the_response_text() {
        let chat: Value = serde_json::from_str(CHAT).unwrap();
        let out = whole(&asked(Call::Generate), &chat, Instant::now());
        assert_eq!(out["response"], "hi there");
        assert!(out.get("message").is_none());
        let raw = json!({"choices": [{"text": "and then", "finish_reason": "length"}]});
        let out = whole(&asked(Call::Generate), &raw, Instant::now());
        assert_eq!(out["response"], "and then");
        assert_eq!(out["done_reason"], "length");
        assert!(
            out.get("eval_count").is_none(),
            "unknown counts are left out"
        );
    }

    #[test]
    fn embeddings_come_back_in_input_order() {
        let openai = json!({"data": [
            {"index": 1, "embedding": [0.3]}, {"index": 0, "embedding": [0.1]}],
            "usage": {"prompt_tokens": 4}});
        let out = whole(&asked(Call::Embed), &openai, Instant::now());
        assert_eq!(out["embeddings"], json!([[0.1], [0.3]]));
        assert_eq!(out["prompt_eval_count"], 4);
        let old = whole(&asked(Call::Embeddings), &openai, Instant::now());
        assert_eq!(old, json!({"embedding": [0.1]}));
    }
}
