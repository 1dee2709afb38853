//! Typed reads from the tree, each error naming file, line, column and key.

use super::yaml::{Node, Value};
use super::ConfigError;

/// Reads one mapping, remembering its path and warning about keys it does not know.
pub struct MapReader<'n> {
    pub node: &'n Node,
    pub path: String,
}

impl<'n> MapReader<'n> {
    /// `known` lists the keys this mapping understands; others produce a warning, as llama-swap ignores them.
    pub fn new(
        node: &'n Node,
        path: &str,
        known: &[&str],
        warnings: &mut Vec<String>,
    ) -> Result<Self, ConfigError> {
        match &node.value {
            Value::Map(entries) => warn_unknown(entries, path, known, warnings),
            Value::Null => {}
            _ => {
                return Err(ConfigError::at(
                    node.loc.clone(),
                    Some(path.into()),
                    format!("must be a mapping, not {}", node.kind()),
                ))
            }
        }
        Ok(MapReader {
            node,
            path: path.into(),
        })
    }

    pub fn key(&self, key: &str) -> String {
        join(&self.path, key)
    }

    pub fn get(&self, key: &str) -> Option<&'n Node> {
        self.node.get(key).filter(|n| !n.is_null())
    }

    pub fn err(&self, key: &str, msg: impl Into<String>) -> ConfigError {
        let loc = self
            .node
            .get(key)
            .map_or_else(|| self.node.loc.clone(), |n| n.loc.clone());
        ConfigError::at(loc, Some(self.key(key)), msg.into())
    }

    /// An error at `key` whose message names the key itself (llama-swap's wording), so it is
    /// not named twice.
    pub fn err_named(&self, key: &str, msg: impl Into<String>) -> ConfigError {
        ConfigError {
            key: None,
            ..self.err(key, msg)
        }
    }

    pub fn int(&self, key: &str) -> Result<Option<i64>, ConfigError> {
        match self.get(key).map(|n| &n.value) {
            None => Ok(None),
            Some(Value::Int(i)) => Ok(Some(*i)),
            Some(Value::Float(f)) if f.fract() == 0.0 => Ok(Some(*f as i64)),
            Some(Value::Str(s)) if s.trim().parse::<i64>().is_ok() => Ok(s.trim().parse().ok()),
            Some(_) => Err(self.err(
                key,
                format!(
                    "must be an integer, not {}",
                    self.get(key).map_or("", Node::kind)
                ),
            )),
        }
    }

    pub fn boolean(&self, key: &str) -> Result<Option<bool>, ConfigError> {
        match self.get(key).map(|n| &n.value) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.err(key, "must be true or false")),
        }
    }

    pub fn string(&self, key: &str) -> Result<Option<String>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(n) => match n.scalar_text() {
                Some(s) => Ok(Some(s)),
                None => Err(self.err(key, format!("must be a string, not {}", n.kind()))),
            },
        }
    }

    pub fn strings(&self, key: &str) -> Result<Vec<String>, ConfigError> {
        match self.get(key).map(|n| &n.value) {
            None => Ok(Vec::new()),
            Some(Value::Seq(items)) => items
                .iter()
                .map(|n| n.scalar_text().filter(|_| !matches!(n.value, Value::Null)))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| self.err(key, "must be a list of strings")),
            Some(_) => Err(self.err(key, "must be a list of strings")),
        }
    }

    /// A nested mapping; absent reads as empty.
    pub fn child(
        &self,
        key: &str,
        known: &[&str],
        warnings: &mut Vec<String>,
    ) -> Result<MapReader<'n>, ConfigError> {
        static EMPTY: std::sync::OnceLock<Node> = std::sync::OnceLock::new();
        let empty = EMPTY.get_or_init(|| Node::new(Value::Map(Vec::new()), Default::default()));
        match self.node.get(key) {
            Some(n) => MapReader::new(n, &self.key(key), known, warnings),
            None => Ok(MapReader {
                node: empty,
                path: self.key(key),
            }),
        }
    }

    pub fn entries(&self) -> &'n [(String, Node)] {
        self.node.entries()
    }
}

/// Warns about each key of a mapping at `path` that is not `known` (llama-swap ignores them).
fn warn_unknown(
    entries: &[(String, Node)],
    path: &str,
    known: &[&str],
    warnings: &mut Vec<String>,
) {
    for (key, value) in entries {
        if !known.contains(&key.as_str()) {
            warnings.push(format!(
                "{}: unknown key {} (ignored)",
                value.loc,
                join(path, key)
            ));
        }
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}
