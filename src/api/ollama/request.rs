//! An Ollama request as the engine's OpenAI request: `/api/chat` and a templated `/api/generate`
//! become a chat completion, a raw `/api/generate` a text completion, `/api/embed` and
//! `/api/embeddings` an embedding request. Sampling options keep their llama.cpp names where
//! llama-server reads them; options that shape a loaded model (`num_ctx`, `num_gpu`, ...) are
//! fixed by the model's command line and are not sent.

use serde_json::{json, Map, Value};

use super::keep_alive::{self, Ttl};
use super::Call;

/// What the answer needs of the request.
#[derive(Debug, Clone, PartialEq)]
pub struct Asked {
    pub call: Call,
    /// The model as the client named it, which its answers name too.
    pub model: String,
    pub stream: bool,
    pub keep_alive: Option<Ttl>,
}

/// The request the engine gets: the route it is metered under, the engine's path, the body.
#[derive(Debug, Clone, PartialEq)]
pub struct Upstream {
    pub route: &'static str,
    pub path: &'static str,
    pub body: Value,
}

/// An Ollama request, translated.
#[derive(Debug, Clone, PartialEq)]
pub enum Translated {
    Forward(Asked, Upstream),
    /// A generate without a prompt or a chat without messages: Ollama's way to load a model (or,
    /// with `keep_alive: 0`, to unload it).
    LoadOnly(Asked),
}

const CHAT: &str = "/v1/chat/completions";

/// Options llama-server reads under the same name.
const SAME_NAME: &[&str] = &[
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "typical_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repeat_penalty",
    "repeat_last_n",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
];

/// Translates the body of an Ollama `call`; a request that cannot be served is refused with why.
pub fn translate(call: Call, v: &Value) -> Result<Translated, String> {
    if !v.is_object() {
        return Err("the request body must be a JSON object".into());
    }
    let asked = Asked {
        call,
        model: model_of(v)?,
        // embeddings answer whole, as Ollama's do
        stream: matches!(call, Call::Chat | Call::Generate) && v["stream"].as_bool() != Some(false),
        keep_alive: keep_alive::parse(v.get("keep_alive"))?,
    };
    match call {
        Call::Chat => chat(v, asked),
        Call::Generate => generate(v, asked),
        Call::Embed => Ok(embed(v, asked, "input", "/api/embed")),
        _ => Ok(embed(v, asked, "prompt", "/api/embeddings")),
    }
}

/// `model`, or the older `name`.
fn model_of(v: &Value) -> Result<String, String> {
    let named = v["model"].as_str().or_else(|| v["name"].as_str());
    match named.map(str::trim).filter(|m| !m.is_empty()) {
        Some(m) => Ok(m.to_string()),
        None => Err("model is required".into()),
    }
}

fn chat(v: &Value, asked: Asked) -> Result<Translated, String> {
    let list = match &v["messages"] {
        Value::Null => Vec::new(),
        Value::Array(list) => list.clone(),
        _ => return Err("messages must be a list".into()),
    };
    if list.is_empty() {
        return Ok(Translated::LoadOnly(asked));
    }
    let mut body = base(&asked, v);
    body.insert("messages".into(), Value::Array(messages(&list)?));
    if let Some(tools) = v.get("tools").filter(|t| !t.is_null()) {
        body.insert("tools".into(), tools.clone());
    }
    think(v, &mut body);
    Ok(forward(asked, "/api/chat", CHAT, body))
}

/// A templated generate is a chat of the system prompt and one user message; a raw one goes to
/// the text completion as it is.
fn generate(v: &Value, asked: Asked) -> Result<Translated, String> {
    let prompt = v["prompt"].as_str().unwrap_or("");
    let images = v["images"].as_array().filter(|i| !i.is_empty());
    if prompt.is_empty() && images.is_none() {
        return Ok(Translated::LoadOnly(asked));
    }
    let mut body = base(&asked, v);
    if v["raw"].as_bool() == Some(true) {
        body.insert("prompt".into(), json!(prompt));
        return Ok(forward(asked, "/api/generate", "/v1/completions", body));
    }
    let mut list = Vec::new();
    if let Some(system) = v["system"].as_str().filter(|s| !s.is_empty()) {
        list.push(json!({"role": "system", "content": system}));
    }
    let mut user = json!({"role": "user", "content": prompt});
    if let Some(images) = images {
        user["images"] = Value::Array(images.clone());
    }
    list.push(user);
    body.insert("messages".into(), Value::Array(messages(&list)?));
    think(v, &mut body);
    Ok(forward(asked, "/api/generate", CHAT, body))
}

/// `/api/embed` (`input`: a text or a list) and `/api/embeddings` (`prompt`: one text).
fn embed(v: &Value, asked: Asked, field: &str, route: &'static str) -> Translated {
    let mut body = Map::new();
    body.insert("model".into(), json!(asked.model));
    let input = v.get(field).cloned().unwrap_or(Value::Null);
    body.insert("input".into(), input);
    if let Some(d) = v.get("dimensions").filter(|d| d.is_number()) {
        body.insert("dimensions".into(), d.clone());
    }
    forward(asked, route, "/v1/embeddings", body)
}

fn forward(
    asked: Asked,
    route: &'static str,
    path: &'static str,
    body: Map<String, Value>,
) -> Translated {
    let upstream = Upstream {
        route,
        path,
        body: Value::Object(body),
    };
    Translated::Forward(asked, upstream)
}

/// What every completion carries: the model, streaming (with the usage at its end, which the
/// last NDJSON object reports), the sampling options and the output format.
fn base(asked: &Asked, v: &Value) -> Map<String, Value> {
    let mut body = Map::new();
    body.insert("model".into(), json!(asked.model));
    body.insert("stream".into(), json!(asked.stream));
    if asked.stream {
        body.insert("stream_options".into(), json!({"include_usage": true}));
    }
    if let Some(options) = v["options"].as_object() {
        sampling(options, &mut body);
    }
    if let Some(format) = response_format(&v["format"]) {
        body.insert("response_format".into(), format);
    }
    for same in ["logprobs", "top_logprobs"] {
        if let Some(x) = v.get(same).filter(|x| !x.is_null()) {
            body.insert(same.into(), x.clone());
        }
    }
    body
}

/// Ollama's sampling options under the names llama-server reads.
fn sampling(options: &Map<String, Value>, body: &mut Map<String, Value>) {
    for (name, value) in options.iter().filter(|(_, v)| !v.is_null()) {
        if SAME_NAME.contains(&name.as_str()) {
            body.insert(name.clone(), value.clone());
        }
    }
    // -1 (no limit) and -2 (fill the context) leave the engine's own limit
    if let Some(n) = options.get("num_predict").and_then(Value::as_i64) {
        if n >= 0 {
            body.insert("max_tokens".into(), json!(n));
        }
    }
    if let Some(keep) = options.get("num_keep").filter(|k| k.is_number()) {
        body.insert("n_keep".into(), keep.clone());
    }
}

/// `format: "json"` asks for any JSON object; a JSON schema for JSON of that schema.
fn response_format(format: &Value) -> Option<Value> {
    match format {
        Value::String(s) if s == "json" => Some(json!({"type": "json_object"})),
        Value::Object(schema) => Some(json!({
            "type": "json_schema",
            "json_schema": {"name": "response", "schema": schema},
        })),
        _ => None,
    }
}

/// `think`: true or false turns the template's thinking on or off; a level (`"high"`, ...) turns
/// it on at that effort.
fn think(v: &Value, body: &mut Map<String, Value>) {
    match &v["think"] {
        Value::Bool(on) => {
            body.insert(
                "chat_template_kwargs".into(),
                json!({"enable_thinking": on}),
            );
        }
        Value::String(level) => {
            body.insert(
                "chat_template_kwargs".into(),
                json!({"enable_thinking": true}),
            );
            body.insert("reasoning_effort".into(), json!(level));
        }
        _ => {}
    }
}

/// Ollama's messages as OpenAI's: images become image parts, tool calls get ids, and a tool's
/// answer names the id of the latest call of that tool.
fn messages(list: &[Value]) -> Result<Vec<Value>, String> {
    let mut calls: Vec<(String, String)> = Vec::new();
    list.iter()
        .enumerate()
        .map(|(i, m)| message(m, &mut calls).map_err(|e| format!("messages[{i}]: {e}")))
        .collect()
}

fn message(m: &Value, calls: &mut Vec<(String, String)>) -> Result<Value, String> {
    let role = m["role"].as_str().ok_or("role is required")?;
    let text = m["content"].as_str().unwrap_or("");
    let mut out = json!({"role": role, "content": text});
    if let Some(images) = m["images"].as_array().filter(|i| !i.is_empty()) {
        let mut parts = vec![json!({"type": "text", "text": text})];
        for image in images {
            let data = image.as_str().ok_or("images must be base64 text")?;
            parts.push(image_part(data));
        }
        out["content"] = Value::Array(parts);
    }
    if let Some(thinking) = m["thinking"].as_str().filter(|t| !t.is_empty()) {
        out["reasoning_content"] = json!(thinking);
    }
    if let Some(list) = m["tool_calls"].as_array().filter(|l| !l.is_empty()) {
        out["tool_calls"] = Value::Array(list.iter().map(|c| tool_call(c, calls)).collect());
    }
    if role == "tool" {
        let name = m["tool_name"].as_str();
        let call = calls
            .iter()
            .rev()
            .find(|(_, n)| name.is_none_or(|name| name == n));
        if let Some((id, _)) = call {
            out["tool_call_id"] = json!(id);
        }
    }
    Ok(out)
}

/// One of Ollama's tool calls (arguments as an object) as OpenAI's (arguments as JSON text).
fn tool_call(c: &Value, calls: &mut Vec<(String, String)>) -> Value {
    let name = c["function"]["name"].as_str().unwrap_or("").to_string();
    let arguments = match &c["function"]["arguments"] {
        Value::String(s) => s.clone(),
        Value::Null => "{}".into(),
        other => other.to_string(),
    };
    let id = c["id"]
        .as_str()
        .map(String::from)
        .unwrap_or_else(|| format!("call_{}", calls.len()));
    calls.push((id.clone(), name.clone()));
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
}

/// A base64 image as a data URL, its type told by its first bytes (JPEG when none matches).
fn image_part(data: &str) -> Value {
    let data = data.trim();
    let url = if data.starts_with("data:") {
        data.to_string()
    } else {
        let mime = [
            ("iVBORw0KGgo", "image/png"),
            ("R0lGOD", "image/gif"),
            ("UklGR", "image/webp"),
        ]
        .iter()
        .find(|(magic, _)| data.starts_with(magic))
        .map_or("image/jpeg", |(_, mime)| mime);
        format!("data:{mime};base64,{data}")
    };
    json!({"type": "image_url", "image_url": {"url": url}})
}

#[cfg(test)]
mod tests;
