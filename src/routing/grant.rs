//! What a request's key lets it do, known once the key is checked. The auth layer puts a
//! [`Caller`] in the request's extensions (only when keys are configured); the handlers that decide
//! by model or by engine path read it there, since the layer cannot know a body's model.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::config::{ApiKey, Scope};
use crate::proxy::error::Error;

/// One configured key, as the requests it admits see it.
#[derive(Debug)]
pub struct Grant {
    /// What usage records and metrics call the key: its `name`, or `key-` and the first eight hex
    /// digits of its SHA-256 (never the key).
    pub label: Arc<str>,
    pub scope: Scope,
    /// The models it may use; `None` for every model.
    models: Option<regex::Regex>,
}

/// The grant of the key a request presented, in its extensions.
#[derive(Clone, Debug)]
pub struct Caller(pub Arc<Grant>);

impl Grant {
    pub fn new(key: &ApiKey) -> Grant {
        let label = match &key.name {
            Some(name) => name.as_str().into(),
            None => fingerprint(&key.key).into(),
        };
        Grant {
            label,
            scope: key.scope,
            models: model_patterns(&key.models),
        }
    }

    /// Whether the key may use `model`: a local model's id, or `peer/model` for a peer's.
    pub fn may_use(&self, model: &str) -> bool {
        self.models.as_ref().is_none_or(|m| m.is_match(model))
    }
}

/// `key-` and the first eight hex digits of the key's SHA-256: enough to tell keys apart in a
/// dashboard, far too little to guess one from.
pub fn fingerprint(key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    let hex: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("key-{hex}")
}

/// One anchored regex for a key's model list: each entry matched whole, `*` standing for any run
/// of characters (`gpu2/*` is every model of peer gpu2).
fn model_patterns(models: &[String]) -> Option<regex::Regex> {
    if models.is_empty() {
        return None;
    }
    let alternatives: Vec<String> = models
        .iter()
        .map(|m| {
            m.split('*')
                .map(regex::escape)
                .collect::<Vec<_>>()
                .join(".*")
        })
        .collect();
    let pattern = format!("^(?:{})$", alternatives.join("|"));
    Some(regex::Regex::new(&pattern).expect("escaped literals joined by .* always compile"))
}

/// Ok for a request with no key checked (no keys configured) or a key that may use `model`.
pub fn may_use(caller: Option<&Grant>, model: &str) -> Result<(), Error> {
    match caller {
        Some(grant) if !grant.may_use(model) => Err(Error::Forbidden(format!(
            "forbidden: this API key may not use model {model}"
        ))),
        _ => Ok(()),
    }
}

/// Ok for a request with no key checked or an admin key; `what` names what needs it.
pub fn needs_admin(caller: Option<&Grant>, what: &str) -> Result<(), Error> {
    match caller {
        Some(grant) if grant.scope != Scope::Admin => Err(Error::Forbidden(format!(
            "forbidden: {what} needs a key of the admin scope"
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: Option<&str>, models: &[&str]) -> ApiKey {
        ApiKey {
            key: "k".into(),
            scope: Scope::Inference,
            name: name.map(String::from),
            models: models.iter().map(|m| m.to_string()).collect(),
        }
    }

    #[test]
    fn a_model_list_admits_its_names_and_patterns_only() {
        let g = Grant::new(&key(None, &["chat", "gpu2/*", "embed-*"]));
        for ok in ["chat", "gpu2/llama", "gpu2/a/b", "embed-0", "embed-"] {
            assert!(g.may_use(ok), "{ok}");
        }
        for no in ["chat2", "xchat", "gpu3/llama", "gpu2", "embed", "c.at"] {
            assert!(!g.may_use(no), "{no}");
        }
        let dots = Grant::new(&key(None, &["a.b"]));
        assert!(!dots.may_use("axb"), "a dot is a dot, not any character");
        assert!(Grant::new(&key(None, &[])).may_use("anything"));
    }

    #[test]
    fn a_key_is_labelled_by_its_name_or_a_fingerprint() {
        assert_eq!(&*Grant::new(&key(Some("apps"), &[])).label, "apps");
        let unnamed = Grant::new(&ApiKey {
            key: "sekrit-value".into(),
            ..key(None, &[])
        });
        assert!(unnamed.label.starts_with("key-") && unnamed.label.len() == 12);
        assert!(!unnamed.label.contains("sekrit"));
        assert_ne!(fingerprint("a"), fingerprint("b"));
    }

    #[test]
    fn keyless_requests_pass_and_scoped_keys_are_held_to_their_grant() {
        assert!(may_use(None, "m").is_ok());
        assert!(needs_admin(None, "x").is_ok());
        let g = Grant::new(&key(None, &["m"]));
        assert!(may_use(Some(&g), "m").is_ok());
        assert!(
            matches!(may_use(Some(&g), "n"), Err(Error::Forbidden(m)) if m.contains("model n"))
        );
        assert!(
            matches!(needs_admin(Some(&g), "/slots"), Err(Error::Forbidden(m)) if m.contains("/slots"))
        );
    }
}
