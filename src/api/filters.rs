//! Request body rewriting for JSON bodies: `useModelName`, `filters.stripParams`, `setParams` and
//! `setParamsByID`, in llama-swap's order. The body is re-encoded only when a rule applies.

use serde_json::{Map, Value};

use crate::config::ModelConfig;

/// True when the model has a rule that could change a request sent as `requested`: only then is
/// the body parsed in full.
pub fn may_apply(model: &ModelConfig, requested: &str) -> bool {
    let f = &model.filters;
    model.use_model_name.is_some()
        || !f.strip_params.is_empty()
        || !f.set_params.is_empty()
        || f.set_params_by_id.contains_key(requested)
}

/// Applies the model's rules to a parsed JSON body; returns true when it changed.
pub fn apply(model: &ModelConfig, requested: &str, body: &mut Value) -> bool {
    let Some(obj) = body.as_object_mut() else {
        return false;
    };
    let mut changed = false;
    if let Some(name) = &model.use_model_name {
        if obj.get("model").and_then(Value::as_str) != Some(name) {
            obj.insert("model".into(), Value::String(name.clone()));
            changed = true;
        }
    }
    for key in &model.filters.strip_params {
        changed |= remove_path(obj, key);
    }
    changed |= set_all(obj, &model.filters.set_params);
    if let Some(extra) = model.filters.set_params_by_id.get(requested) {
        changed |= set_all(obj, extra);
    }
    changed
}

/// Sets each parameter (keys in sorted order, `model` never), with `a.b` meaning a nested key.
fn set_all(obj: &mut Map<String, Value>, params: &Map<String, Value>) -> bool {
    let mut keys: Vec<&String> = params.keys().filter(|k| *k != "model").collect();
    keys.sort();
    let mut changed = false;
    for key in keys {
        changed |= set_path(obj, key, params[key].clone());
    }
    changed
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
        let mut body = json!({"model": "m", "temperature": 0.9, "top_k": 5, "messages": []});
        assert!(apply(&m, "m", &mut body));
        assert_eq!(
            body,
            json!({"model": "m", "temperature": 0.2, "messages": [], "chat_template_kwargs": {"enable_thinking": false}})
        );
        let mut hot = json!({"model": "m:hot"});
        apply(&m, "m:hot", &mut hot);
        assert_eq!(hot["temperature"], 1.5);
        assert_eq!(hot["model"], "m:hot", "model is never set by params");
    }

    #[test]
    fn nothing_applies_nothing_changes() {
        let m = model("");
        let mut body = json!({"model": "m", "x": 1});
        assert!(!apply(&m, "m", &mut body));
    }

    #[test]
    fn use_model_name_rewrites_the_model() {
        let m = model("    useModelName: real-name\n");
        let mut body = json!({"model": "m"});
        assert!(apply(&m, "m", &mut body));
        assert_eq!(body["model"], "real-name");
    }
}
