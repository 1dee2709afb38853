//! A YAML tree that remembers where each value came from.
//!
//! llama-swap resolves macros on an untyped tree before decoding it, and corral must name file, line and
//! column in every config error, so the tree keeps a location on every node.

use std::fmt;
use std::sync::Arc;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

use super::ConfigError;

/// Where a node starts: file, 1-based line and column.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Loc {
    pub file: Arc<str>,
    pub line: usize,
    pub col: usize,
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.col)
    }
}

#[derive(Clone, Debug)]
pub struct Node {
    pub value: Value,
    pub loc: Loc,
}

#[derive(Clone, Debug)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(String, Node)>),
}

impl Node {
    pub fn new(value: Value, loc: Loc) -> Self {
        Node { value, loc }
    }

    pub fn null(loc: Loc) -> Self {
        Node::new(Value::Null, loc)
    }

    pub fn is_null(&self) -> bool {
        matches!(self.value, Value::Null)
    }

    /// The value of `key` when this node is a mapping.
    pub fn get(&self, key: &str) -> Option<&Node> {
        match &self.value {
            Value::Map(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut Node> {
        match &mut self.value {
            Value::Map(entries) => entries.iter_mut().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn entries(&self) -> &[(String, Node)] {
        match &self.value {
            Value::Map(entries) => entries,
            _ => &[],
        }
    }

    pub fn kind(&self) -> &'static str {
        match self.value {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Int(_) => "an integer",
            Value::Float(_) => "a number",
            Value::Str(_) => "a string",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }

    /// Converts to JSON, for values passed through as they are (metadata, setParams).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match &self.value {
            Value::Null => J::Null,
            Value::Bool(b) => J::Bool(*b),
            Value::Int(i) => J::from(*i),
            Value::Float(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
            Value::Str(s) => J::String(s.clone()),
            Value::Seq(items) => J::Array(items.iter().map(Node::to_json).collect()),
            Value::Map(entries) => J::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_json()))
                    .collect(),
            ),
        }
    }

    /// The scalar as text, as Go's `%v` would print it.
    pub fn scalar_text(&self) -> Option<String> {
        match &self.value {
            Value::Null => Some(String::new()),
            Value::Bool(b) => Some(b.to_string()),
            Value::Int(i) => Some(i.to_string()),
            Value::Float(f) => Some(f.to_string()),
            Value::Str(s) => Some(s.clone()),
            _ => None,
        }
    }

    /// Visits every string value (not keys) in this subtree.
    pub fn visit_strings_mut(&mut self, f: &mut dyn FnMut(&mut Node)) {
        match &mut self.value {
            Value::Str(_) => f(self),
            Value::Seq(items) => items.iter_mut().for_each(|n| n.visit_strings_mut(f)),
            Value::Map(entries) => entries.iter_mut().for_each(|(_, n)| n.visit_strings_mut(f)),
            _ => {}
        }
    }
}

/// Parses one YAML document. An empty document gives `Null`.
pub fn parse(text: &str, file: &Arc<str>) -> Result<Node, ConfigError> {
    let mut builder = Builder {
        file: file.clone(),
        stack: Vec::new(),
        anchors: Vec::new(),
        root: None,
        error: None,
    };
    let mut parser = Parser::new_from_str(text);
    if let Err(e) = parser.load(&mut builder, false) {
        let m = e.marker();
        let loc = Loc {
            file: file.clone(),
            line: m.line(),
            col: m.col() + 1,
        };
        return Err(ConfigError::at(
            loc,
            None,
            format!("invalid YAML: {}", e.info()),
        ));
    }
    if let Some(err) = builder.error {
        return Err(err);
    }
    Ok(builder.root.unwrap_or_else(|| {
        Node::null(Loc {
            file: file.clone(),
            line: 1,
            col: 1,
        })
    }))
}

enum Frame {
    Seq(Node, Vec<Node>, usize),
    Map(Node, Vec<(String, Node)>, Option<Node>, usize),
}

struct Builder {
    file: Arc<str>,
    stack: Vec<Frame>,
    anchors: Vec<(usize, Node)>,
    root: Option<Node>,
    error: Option<ConfigError>,
}

impl Builder {
    fn loc(&self, m: &Marker) -> Loc {
        Loc {
            file: self.file.clone(),
            line: m.line(),
            col: m.col() + 1,
        }
    }

    fn push_value(&mut self, node: Node, anchor: usize) {
        if anchor > 0 {
            self.anchors.push((anchor, node.clone()));
        }
        match self.stack.last_mut() {
            None => self.root = Some(node),
            Some(Frame::Seq(_, items, _)) => items.push(node),
            Some(Frame::Map(_, entries, pending, _)) => match pending.take() {
                None => *pending = Some(node),
                Some(key) => {
                    let name = key.scalar_text().unwrap_or_default();
                    if entries.iter().any(|(k, _)| *k == name) && self.error.is_none() {
                        self.error = Some(ConfigError::at(
                            key.loc,
                            Some(name.clone()),
                            "duplicate key".into(),
                        ));
                    }
                    entries.push((name, node));
                }
            },
        }
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        let loc = self.loc(&mark);
        match ev {
            Event::Scalar(text, style, anchor, _tag) => {
                let value = if style == TScalarStyle::Plain {
                    plain_scalar(text)
                } else {
                    Value::Str(text)
                };
                self.push_value(Node::new(value, loc), anchor);
            }
            Event::SequenceStart(anchor, _) => {
                self.stack
                    .push(Frame::Seq(Node::null(loc), Vec::new(), anchor))
            }
            Event::MappingStart(anchor, _) => {
                self.stack
                    .push(Frame::Map(Node::null(loc), Vec::new(), None, anchor))
            }
            Event::SequenceEnd => {
                if let Some(Frame::Seq(start, items, anchor)) = self.stack.pop() {
                    self.push_value(Node::new(Value::Seq(items), start.loc), anchor);
                }
            }
            Event::MappingEnd => {
                if let Some(Frame::Map(start, entries, _, anchor)) = self.stack.pop() {
                    self.push_value(Node::new(Value::Map(entries), start.loc), anchor);
                }
            }
            Event::Alias(id) => {
                let node = self
                    .anchors
                    .iter()
                    .rev()
                    .find(|(a, _)| *a == id)
                    .map(|(_, n)| n.clone());
                self.push_value(node.unwrap_or_else(|| Node::null(loc)), 0);
            }
            _ => {}
        }
    }
}

/// Resolves a plain scalar with YAML 1.2 core schema rules (what Go's yaml.v3 does).
fn plain_scalar(text: String) -> Value {
    match text.as_str() {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "true" | "True" | "TRUE" => return Value::Bool(true),
        "false" | "False" | "FALSE" => return Value::Bool(false),
        _ => {}
    }
    let looks_numeric =
        text.starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '+' || c == '.');
    if looks_numeric {
        if let Ok(i) = text.parse::<i64>() {
            return Value::Int(i);
        }
        if let Some(hex) = text.strip_prefix("0x") {
            if let Ok(i) = i64::from_str_radix(hex, 16) {
                return Value::Int(i);
            }
        }
        if text.chars().any(|c| c.is_ascii_digit()) && !text.contains(':') {
            if let Ok(f) = text.parse::<f64>() {
                return Value::Float(f);
            }
        }
    }
    Value::Str(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Node {
        parse(text, &Arc::from("t.yaml")).unwrap()
    }

    #[test]
    fn scalars_are_typed_and_located() {
        let n = p("a: 1\nb: \"1\"\nc: true\nd: 1.5\ne:\nf: text\n");
        assert!(matches!(n.get("a").unwrap().value, Value::Int(1)));
        assert!(matches!(n.get("b").unwrap().value, Value::Str(_)));
        assert!(matches!(n.get("c").unwrap().value, Value::Bool(true)));
        assert!(matches!(n.get("d").unwrap().value, Value::Float(_)));
        assert!(n.get("e").unwrap().is_null());
        assert_eq!(n.get("f").unwrap().loc.line, 6);
        assert_eq!(n.get("f").unwrap().loc.col, 4);
    }

    #[test]
    fn syntax_error_names_line_and_column() {
        let err = parse("a: 1\nb:\n  - x\n - y\n", &Arc::from("bad.yaml"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("bad.yaml:4:"), "{err}");
    }

    #[test]
    fn duplicate_keys_are_errors() {
        let err = parse("a: 1\na: 2\n", &Arc::from("d.yaml"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("d.yaml:2:1") && err.contains("duplicate key"),
            "{err}"
        );
    }

    #[test]
    fn anchors_and_aliases_copy_values() {
        let n = p("x: &v [1, 2]\ny: *v\n");
        assert!(matches!(&n.get("y").unwrap().value, Value::Seq(items) if items.len() == 2));
    }
}
