//! Macros: `macros` at the top level and in each model, substituted as `${name}` in strings.

use crate::config::yaml::{Loc, Node, Value};
use crate::config::ConfigError;

/// Names corral fills in itself.
const RESERVED_MACROS: &[&str] = &["PID", "PORT", "MODEL_ID"];

/// An ordered macro list (declaration order).
pub(super) type Macros = Vec<(String, Node)>;

/// A `macros` mapping, checked: valid names, none reserved, scalar values, none using itself.
pub(super) fn read_macros(node: Option<&Node>, scope: &str) -> Result<Macros, ConfigError> {
    let Some(node) = node else {
        return Ok(Vec::new());
    };
    if node.is_null() {
        return Ok(Vec::new());
    }
    if !matches!(node.value, Value::Map(_)) {
        return Err(ConfigError::at(
            node.loc.clone(),
            Some(scope.into()),
            format!("must be a mapping, not {}", node.kind()),
        ));
    }
    let mut out = Vec::new();
    for (name, value) in node.entries() {
        check_macro(name, value, &format!("{scope}.{name}"))?;
        out.push((name.clone(), value.clone()));
    }
    Ok(out)
}

/// One macro: a name of `[a-zA-Z0-9_-]` under 64 characters that corral does not reserve, and a
/// scalar value that does not use itself.
fn check_macro(name: &str, value: &Node, key: &str) -> Result<(), ConfigError> {
    let refuse = |msg: String| Err(ConfigError::at(value.loc.clone(), Some(key.into()), msg));
    if !valid_macro_name(name) {
        return refuse("macro names must match ^[a-zA-Z0-9_-]+$ and be under 64 characters".into());
    }
    if RESERVED_MACROS.contains(&name) {
        return refuse(format!("macro name {name:?} is reserved"));
    }
    if matches!(value.value, Value::Seq(_) | Value::Map(_) | Value::Null) {
        return refuse("macro values must be a string, number or boolean".into());
    }
    if let Value::Str(s) = &value.value {
        if s.contains(&format!("${{{name}}}")) {
            return refuse("macro references itself".into());
        }
    }
    Ok(())
}

fn valid_macro_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() < 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// The most bytes macro substitution may add to the config, all substitutions together. A macro
/// may use the ones declared before it, so ten lines that each use the previous macro ten times
/// would otherwise expand to gigabytes; real configs add kilobytes.
pub const MAX_MACRO_GROWTH: usize = 16 << 20;

/// What macro substitution has added so far, and where it first went over [`MAX_MACRO_GROWTH`].
#[derive(Default)]
pub(super) struct Growth {
    added: usize,
    over: Option<Loc>,
}

impl Growth {
    /// `text` with every `pattern` replaced, or `None` once the budget is spent.
    pub(super) fn replace(
        &mut self,
        text: &str,
        pattern: &str,
        with: &str,
        loc: &Loc,
    ) -> Option<String> {
        if self.over.is_some() {
            return None;
        }
        let count = text.matches(pattern).count();
        self.added = self
            .added
            .saturating_add(count.saturating_mul(with.len().saturating_sub(pattern.len())));
        if self.added > MAX_MACRO_GROWTH {
            self.over = Some(loc.clone());
            return None;
        }
        Some(text.replace(pattern, with))
    }

    pub(super) fn check(&self) -> Result<(), ConfigError> {
        match &self.over {
            None => Ok(()),
            Some(loc) => Err(ConfigError::at(
                loc.clone(),
                None,
                format!("macros expand to more than {} MiB", MAX_MACRO_GROWTH >> 20),
            )),
        }
    }
}

/// Replaces `${name}` in every string of `node`; a string that is exactly `${name}` takes the macro's type.
pub(super) fn substitute(
    node: &mut Node,
    name: &str,
    value: &Node,
    growth: &mut Growth,
) -> Result<(), ConfigError> {
    let pattern = format!("${{{name}}}");
    let text = value.scalar_text().unwrap_or_default();
    node.visit_strings_mut(&mut |n| {
        if let Value::Str(s) = &n.value {
            if *s == pattern {
                if growth.replace(s, &pattern, &text, &n.loc).is_some() {
                    n.value = value.value.clone();
                }
            } else if s.contains(&pattern) {
                if let Some(replaced) = growth.replace(s, &pattern, &text, &n.loc) {
                    n.value = Value::Str(replaced);
                }
            }
        }
    });
    growth.check()
}

/// Substitutes every macro of `macros`, the last declared first, so a macro may use earlier ones.
pub(super) fn apply_macros(
    node: &mut Node,
    macros: &Macros,
    growth: &mut Growth,
) -> Result<(), ConfigError> {
    for (name, value) in macros.iter().rev() {
        substitute(node, name, value, growth)?;
    }
    Ok(())
}

/// Any macro reference left after expansion is an unknown macro, except `${PID}` in cmdStop.
///
/// As llama-swap's validateConfigMacroUses: only the top-level keys in `known` are looked at (one
/// it does not know, such as a mapping that only holds anchors, keeps its text), and only
/// `${name}` with a macro name's characters, or `${env.NAME}`, is a reference, so shell text such
/// as `${MODELS:-/models}` in a cmd passes through to the command.
pub(super) fn check_leftovers(root: &Node, known: &[&str]) -> Result<(), ConfigError> {
    root.entries()
        .iter()
        .filter(|(k, _)| known.contains(&k.as_str()))
        .try_for_each(|(k, n)| check_node(n, k))
}

fn check_node(node: &Node, path: &str) -> Result<(), ConfigError> {
    match &node.value {
        Value::Str(s) => match leftover_macro(s, path.ends_with(".cmdStop")) {
            None => Ok(()),
            Some(name) => Err(ConfigError::at(
                node.loc.clone(),
                Some(path.to_string()),
                format!("unknown macro '${{{name}}}'"),
            )),
        },
        Value::Seq(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, n)| check_node(n, &format!("{path}[{i}]"))),
        Value::Map(entries) => {
            if is_set_params_by_id(path) {
                check_keys(entries, path)?;
            }
            entries
                .iter()
                .try_for_each(|(k, n)| check_node(n, &format!("{path}.{k}")))
        }
        _ => Ok(()),
    }
}

/// `models.<id>.filters.setParamsByID`, the one mapping whose keys take macros.
fn is_set_params_by_id(path: &str) -> bool {
    path.starts_with("models.") && path.ends_with(".filters.setParamsByID")
}

/// The keys of a mapping whose keys take macros: one still holding a reference would become a
/// literal alias. A key has no location of its own, so the error points at its value.
fn check_keys(entries: &[(String, Node)], path: &str) -> Result<(), ConfigError> {
    for (key, value) in entries {
        if let Some(name) = leftover_macro(key, false) {
            return Err(ConfigError::at(
                value.loc.clone(),
                Some(path.to_string()),
                format!("unknown macro '${{{name}}}' in the key {key:?}"),
            ));
        }
    }
    Ok(())
}

/// The name of the first macro reference in `text`; `${PID}` is left alone where `pid_allowed`.
fn leftover_macro(text: &str, pid_allowed: bool) -> Option<&str> {
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        rest = &rest[start + 2..];
        let end = rest.find('}')?;
        let name = &rest[..end];
        if is_reference(name) && !(pid_allowed && name == "PID") {
            return Some(name);
        }
    }
    None
}

/// What llama-swap counts as a macro reference: `[a-zA-Z0-9_-]+`, or `env.` and a variable name.
fn is_reference(name: &str) -> bool {
    let macro_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    let env_var = |v: &str| {
        v.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    (!name.is_empty() && name.chars().all(macro_char))
        || name.strip_prefix("env.").is_some_and(env_var)
}
