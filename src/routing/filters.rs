//! Request body rewriting for JSON bodies: `useModelName`, `filters.stripParams`, `setParams` and
//! `setParamsByID`, in llama-swap's order. The body is re-encoded only when a rule applies, and
//! then only its top-level keys are parsed: a rewrite never expands the rest of the body (a 30 MiB
//! `messages` array stays one slice of text), so it costs about twice the body, never more.

use bytes::Bytes;
use indexmap::IndexMap;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::config::{Filters, ModelConfig, SetParam};

/// A JSON object whose top-level values stay slices of the request's bytes until a rule replaces
/// one: parsing copies nothing but the keys, so a rewrite holds the body and its new encoding.
pub struct JsonBody<'a>(IndexMap<String, Slot<'a>>);

/// A top-level value: as the client sent it, or set by a rule.
enum Slot<'a> {
    Sent(&'a RawValue),
    Set(Box<RawValue>),
}

impl Slot<'_> {
    fn raw(&self) -> &RawValue {
        match self {
            Slot::Sent(r) => r,
            Slot::Set(r) => r,
        }
    }
}

impl serde::Serialize for Slot<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.raw().serialize(s)
    }
}

impl<'a> JsonBody<'a> {
    /// Parses the top level of a JSON object.
    pub fn parse(bytes: &'a [u8]) -> Result<JsonBody<'a>, String> {
        let map: IndexMap<String, &'a RawValue> =
            serde_json::from_slice(bytes).map_err(|e| format!("invalid JSON body: {e}"))?;
        Ok(JsonBody(
            map.into_iter().map(|(k, v)| (k, Slot::Sent(v))).collect(),
        ))
    }

    pub fn to_bytes(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(&self.0).expect("raw values and string keys encode"))
    }

    /// A top-level value, parsed.
    pub fn get(&self, key: &str) -> Option<Value> {
        serde_json::from_str(self.0.get(key)?.raw().get()).ok()
    }

    /// A top-level value's JSON text as the client sent it (or as a rule set it), unparsed.
    pub fn raw(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(|slot| slot.raw().get())
    }

    /// Sets a top-level key; true when that changed the body.
    pub fn set(&mut self, key: &str, value: &Value) -> bool {
        if self.get(key).as_ref() == Some(value) {
            return false;
        }
        self.0.insert(key.to_string(), raw(value));
        true
    }

    pub fn remove(&mut self, key: &str) -> bool {
        self.0.shift_remove(key).is_some()
    }

    /// Sets `a.b.c`: only the top-level value `a` is parsed.
    fn set_path(&mut self, path: &str, value: Value) -> bool {
        let Some((head, rest)) = path.split_once('.') else {
            return self.set(path, &value);
        };
        let mut inner = match self.get(head) {
            Some(Value::Object(m)) => m,
            _ => Map::new(),
        };
        let changed = set_path(&mut inner, rest, value);
        self.0.insert(head.to_string(), raw(&Value::Object(inner)));
        changed
    }

    /// True when the body holds a value (any, `null` included) at `a.b.c`, the place
    /// [`Self::set_path`] would write: only the top-level value `a` is parsed.
    fn has_path(&self, path: &str) -> bool {
        let Some((head, rest)) = path.split_once('.') else {
            return self.0.contains_key(path);
        };
        match self.get(head) {
            Some(Value::Object(inner)) => has_path(&inner, rest),
            _ => false,
        }
    }

    fn remove_path(&mut self, path: &str) -> bool {
        let Some((head, rest)) = path.split_once('.') else {
            return self.remove(path);
        };
        let Some(Value::Object(mut inner)) = self.get(head) else {
            return false;
        };
        let changed = remove_path(&mut inner, rest);
        if changed {
            self.0.insert(head.to_string(), raw(&Value::Object(inner)));
        }
        changed
    }
}

fn raw<'a>(value: &Value) -> Slot<'a> {
    Slot::Set(serde_json::value::to_raw_value(value).expect("a JSON value encodes"))
}

/// True when the model has a rule that could change a request sent as `requested`: only then is
/// the body parsed.
pub fn may_apply(model: &ModelConfig, requested: &str) -> bool {
    let f = &model.filters;
    model.use_model_name.is_some()
        || !f.strip_params.is_empty()
        || !f.set_params.is_empty()
        || f.set_params_by_id.contains_key(requested)
}

/// Applies the model's rules to a JSON body; returns true when it changed.
pub fn apply(model: &ModelConfig, requested: &str, body: &mut JsonBody) -> bool {
    let mut changed = false;
    if let Some(name) = &model.use_model_name {
        changed |= body.set("model", &Value::String(name.clone()));
    }
    changed | apply_filters(body, &model.filters, Some(requested))
}

/// `stripParams`, then `setParams`, then (for a model) `setParamsByID` of the name it was sent
/// as: a pipe, so a set-if-undefined key sees what the stages before it left.
pub fn apply_filters(body: &mut JsonBody, filters: &Filters, requested: Option<&str>) -> bool {
    let mut changed = false;
    for key in &filters.strip_params {
        changed |= body.remove_path(key);
    }
    changed |= set_all(body, &filters.set_params);
    if let Some(extra) = requested.and_then(|r| filters.set_params_by_id.get(r)) {
        changed |= set_all(body, extra);
    }
    changed
}

/// Sets each parameter in order, with `a.b` meaning a nested key; a set-if-undefined one only
/// where the body has no value yet (`0`, `false`, `""` and `null` are values).
fn set_all(body: &mut JsonBody, params: &[SetParam]) -> bool {
    let mut changed = false;
    for param in params {
        if param.if_undefined && body.has_path(&param.path) {
            continue;
        }
        changed |= body.set_path(&param.path, param.value.clone());
    }
    changed
}

fn has_path(obj: &Map<String, Value>, path: &str) -> bool {
    match path.split_once('.') {
        None => obj.contains_key(path),
        Some((head, rest)) => obj
            .get(head)
            .and_then(Value::as_object)
            .is_some_and(|o| has_path(o, rest)),
    }
}

fn set_path(obj: &mut Map<String, Value>, path: &str, value: Value) -> bool {
    match path.split_once('.') {
        None => {
            if obj.get(path) == Some(&value) {
                return false;
            }
            obj.insert(path.to_string(), value);
            true
        }
        Some((head, rest)) => {
            let entry = obj
                .entry(head.to_string())
                .or_insert_with(|| Value::Object(Map::new()));
            if !entry.is_object() {
                *entry = Value::Object(Map::new());
            }
            set_path(
                entry.as_object_mut().expect("just made an object"),
                rest,
                value,
            )
        }
    }
}

fn remove_path(obj: &mut Map<String, Value>, path: &str) -> bool {
    match path.split_once('.') {
        None => obj.remove(path).is_some(),
        Some((head, rest)) => obj
            .get_mut(head)
            .and_then(Value::as_object_mut)
            .is_some_and(|o| remove_path(o, rest)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: &[u8]) -> JsonBody<'_> {
        JsonBody::parse(v).unwrap()
    }

    fn value(b: &JsonBody) -> Value {
        serde_json::from_slice(&b.to_bytes()).unwrap()
    }

    fn model(yaml_extra: &str) -> ModelConfig {
        let yaml = format!("models:\n  m:\n    cmd: srv\n    proxy: 'http://h:1'\n{yaml_extra}");
        crate::config::load_str("t.yaml", &yaml, &|_| None)
            .unwrap()
            .config
            .models["m"]
            .clone()
    }

    #[test]
    fn strip_then_set_then_set_by_id() {
        let m = model("    filters:\n      stripParams: 'top_k, temperature, model'\n      setParams: {temperature: 0.2, chat_template_kwargs.enable_thinking: false, model: evil}\n      setParamsByID:\n        'm:hot': {temperature: 1.5}\n");
        let text =
            json!({"model": "m", "temperature": 0.9, "top_k": 5, "messages": []}).to_string();
        let mut b = body(text.as_bytes());
        assert!(apply(&m, "m", &mut b));
        assert_eq!(
            value(&b),
            json!({"model": "m", "temperature": 0.2, "messages": [], "chat_template_kwargs": {"enable_thinking": false}})
        );
        let mut hot = body(br#"{"model": "m:hot"}"#);
        apply(&m, "m:hot", &mut hot);
        assert_eq!(value(&hot)["temperature"], 1.5);
        assert_eq!(
            value(&hot)["model"],
            "m:hot",
            "model is never set by params"
        );
    }

    #[test]
    fn nothing_applies_nothing_changes() {
        let m = model("");
        let mut b = body(br#"{"model": "m", "x": 1}"#);
        assert!(!apply(&m, "m", &mut b));
    }

    #[test]
    fn use_model_name_rewrites_the_model() {
        let m = model("    useModelName: real-name\n");
        let mut b = body(br#"{"model": "m"}"#);
        assert!(apply(&m, "m", &mut b));
        assert_eq!(value(&b)["model"], "real-name");
    }

    #[test]
    fn untouched_values_keep_their_exact_text() {
        let m = model("    filters:\n      setParams: {temperature: 0.2, kw.a: 1}\n");
        let text =
            r#"{"model":"m","messages":[{"role":"user","content":"1.0e0 \u00e9"}],"kw":{"b":2}}"#;
        let mut b = JsonBody::parse(text.as_bytes()).unwrap();
        assert!(apply(&m, "m", &mut b));
        let out = String::from_utf8(b.to_bytes().to_vec()).unwrap();
        assert_eq!(
            out,
            r#"{"model":"m","messages":[{"role":"user","content":"1.0e0 \u00e9"}],"kw":{"b":2,"a":1},"temperature":0.2}"#
        );
    }

    /// `key?` fills only what the request (after the stages before it) lacks: any value sent
    /// counts, `0`, `false`, `""` and `null` too.
    #[test]
    fn a_key_ending_in_a_question_mark_is_set_only_when_undefined() {
        let m = model("    filters:\n      setParams: {'max_tokens?': 99, 'temperature?': 0.5, 'top_k?': 3, 'seed?': 1, 'stop?': x}\n");
        let sent = r#"{"model":"m","temperature":0,"top_k":false,"seed":null,"stop":""}"#;
        let mut b = body(sent.as_bytes());
        assert!(apply(&m, "m", &mut b));
        assert_eq!(
            value(&b),
            json!({"model": "m", "temperature": 0, "top_k": false, "seed": null, "stop": "", "max_tokens": 99})
        );
        assert!(
            !String::from_utf8(b.to_bytes().to_vec())
                .unwrap()
                .contains('?'),
            "the marker never goes upstream"
        );
        let mut empty = body(br#"{"model":"m"}"#);
        apply(&m, "m", &mut empty);
        assert_eq!(
            value(&empty),
            json!({"model": "m", "max_tokens": 99, "temperature": 0.5, "top_k": 3, "seed": 1, "stop": "x"})
        );
    }

    /// A stripped key is undefined again; a key `setParams` set is defined for `setParamsByID`;
    /// `k` beats `k?` in one block; `model?` is never set.
    #[test]
    fn set_if_undefined_follows_the_pipe() {
        let m = model("    filters:\n      stripParams: top_p\n      setParams: {'top_p?': 0.9, temperature: 0.2, 'n?': 1, n: 2, 'model?': evil}\n      setParamsByID:\n        'm:x': {'temperature?': 1.5, 'min_p?': 0.1}\n");
        let mut b = body(br#"{"model":"m:x","top_p":0.5}"#);
        assert!(apply(&m, "m:x", &mut b));
        assert_eq!(
            value(&b),
            json!({"model": "m:x", "top_p": 0.9, "temperature": 0.2, "n": 2, "min_p": 0.1})
        );
    }

    /// A dotted `key?` checks the nested place it would write.
    #[test]
    fn a_dotted_key_is_checked_where_it_would_be_written() {
        let m = model("    filters:\n      setParams: {'kw.enable_thinking?': false}\n");
        let mut kept = body(br#"{"model":"m","kw":{"enable_thinking":true}}"#);
        assert!(!apply(&m, "m", &mut kept));
        let mut filled = body(br#"{"model":"m","kw":{"other":1}}"#);
        assert!(apply(&m, "m", &mut filled));
        assert_eq!(
            value(&filled)["kw"],
            json!({"other": 1, "enable_thinking": false})
        );
        let mut absent = body(br#"{"model":"m"}"#);
        apply(&m, "m", &mut absent);
        assert_eq!(value(&absent)["kw"], json!({"enable_thinking": false}));
    }

    #[test]
    fn a_body_that_is_not_an_object_is_refused() {
        assert!(JsonBody::parse(b"[1,2]").is_err());
        assert!(JsonBody::parse(b"{\"a\":").is_err());
    }
}
