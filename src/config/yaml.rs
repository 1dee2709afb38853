//! A YAML tree that remembers where each value came from.
//!
//! llama-swap resolves macros on an untyped tree before decoding it, and corral must name file, line and
//! column in every config error, so the tree keeps a location on every node.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::{Marker, ScanError, TScalarStyle};

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

/// The deepest nesting of lists and mappings a config may have. Real configs stay under ten levels;
/// the bound keeps every recursive walk of the tree (merging, macros, decoding, dropping) far from
/// the end of a thread's stack, whatever the input.
pub const MAX_DEPTH: usize = 128;

/// The most nodes aliases may add to the tree, all aliases together. An alias copies its anchor's
/// subtree, so a few hundred bytes of aliases of aliases ("billion laughs") would otherwise
/// expand to gigabytes; real configs that share a template between models stay far below this.
pub const MAX_ALIAS_NODES: usize = 100_000;

/// Parses one YAML document. An empty document gives `Null`.
///
/// The parser is driven event by event (yaml-rust2's own loader recurses once per level of
/// nesting), and the nesting and alias limits are checked as the tree grows, so no input can
/// exhaust the stack or the memory.
pub fn parse(text: &str, file: &Arc<str>) -> Result<Node, ConfigError> {
    let mut builder = Builder {
        file: file.clone(),
        stack: Vec::new(),
        anchors: HashMap::new(),
        alias_nodes: 0,
        root: None,
        error: None,
    };
    let mut parser = Parser::new_from_str(text);
    loop {
        let (event, mark) = parser.next_token().map_err(|e| syntax_error(&e, file))?;
        match event {
            // Only the first document counts, as with llama-swap.
            Event::DocumentEnd | Event::StreamEnd => break,
            event => builder.on_event(event, mark)?,
        }
    }
    if let Some(err) = builder.error {
        return Err(err);
    }
    Ok(builder.root.map(|b| b.node).unwrap_or_else(|| {
        Node::null(Loc {
            file: file.clone(),
            line: 1,
            col: 1,
        })
    }))
}

fn syntax_error(e: &ScanError, file: &Arc<str>) -> ConfigError {
    let m = e.marker();
    let loc = Loc {
        file: file.clone(),
        line: m.line(),
        col: m.col() + 1,
    };
    ConfigError::at(loc, None, format!("invalid YAML: {}", e.info()))
}

/// A finished node with what the limits need: its node count and its height (0 for a scalar).
#[derive(Clone)]
struct Built {
    node: Node,
    size: usize,
    height: usize,
}

impl Built {
    fn leaf(node: Node) -> Self {
        Built {
            node,
            size: 1,
            height: 0,
        }
    }
}

/// A list or mapping still being read.
struct Frame {
    loc: Loc,
    anchor: usize,
    body: Body,
    size: usize,
    height: usize,
}

enum Body {
    Seq(Vec<Node>),
    /// The entries so far, a key waiting for its value, and the keys seen (so a duplicate is
    /// found in constant time: a mapping of a million keys must not take a million squared).
    Map(
        Vec<(String, Node)>,
        Option<Node>,
        std::collections::HashSet<String>,
    ),
}

impl Frame {
    fn open(loc: Loc, anchor: usize, body: Body) -> Self {
        Frame {
            loc,
            anchor,
            body,
            size: 1,
            height: 1,
        }
    }

    fn close(self) -> (Built, usize) {
        let value = match self.body {
            Body::Seq(items) => Value::Seq(items),
            Body::Map(entries, _, _) => Value::Map(entries),
        };
        let built = Built {
            node: Node::new(value, self.loc),
            size: self.size,
            height: self.height,
        };
        (built, self.anchor)
    }
}

struct Builder {
    file: Arc<str>,
    stack: Vec<Frame>,
    /// Anchored nodes by the parser's anchor id (a new id for each definition).
    anchors: HashMap<usize, Built>,
    /// Nodes added by aliases so far.
    alias_nodes: usize,
    root: Option<Built>,
    /// The first duplicate key, reported once the document has parsed (a syntax error wins).
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

    fn on_event(&mut self, ev: Event, mark: Marker) -> Result<(), ConfigError> {
        let loc = self.loc(&mark);
        match ev {
            Event::Scalar(text, style, anchor, _tag) => {
                let value = if style == TScalarStyle::Plain {
                    plain_scalar(text)
                } else {
                    Value::Str(text)
                };
                self.push_value(Built::leaf(Node::new(value, loc)), anchor);
            }
            Event::SequenceStart(anchor, _) => {
                self.open(Frame::open(loc, anchor, Body::Seq(Vec::new())))?
            }
            Event::MappingStart(anchor, _) => self.open(Frame::open(
                loc,
                anchor,
                Body::Map(Vec::new(), None, Default::default()),
            ))?,
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some(frame) = self.stack.pop() {
                    let (built, anchor) = frame.close();
                    self.push_value(built, anchor);
                }
            }
            Event::Alias(id) => self.alias(id, loc)?,
            _ => {}
        }
        Ok(())
    }

    fn open(&mut self, frame: Frame) -> Result<(), ConfigError> {
        if self.stack.len() >= MAX_DEPTH {
            return Err(too_deep(frame.loc));
        }
        self.stack.push(frame);
        Ok(())
    }

    /// Copies the anchored node, within the depth and alias limits.
    fn alias(&mut self, id: usize, loc: Loc) -> Result<(), ConfigError> {
        let Some(built) = self.anchors.get(&id) else {
            self.push_value(Built::leaf(Node::null(loc)), 0);
            return Ok(());
        };
        if self.stack.len() + built.height > MAX_DEPTH {
            return Err(too_deep(loc));
        }
        self.alias_nodes += built.size;
        if self.alias_nodes > MAX_ALIAS_NODES {
            return Err(ConfigError::at(
                loc,
                None,
                format!("aliases expand to more than {MAX_ALIAS_NODES} values"),
            ));
        }
        let built = built.clone();
        self.push_value(built, 0);
        Ok(())
    }

    fn push_value(&mut self, built: Built, anchor: usize) {
        if anchor > 0 {
            self.anchors.insert(anchor, built.clone());
        }
        let Some(frame) = self.stack.last_mut() else {
            self.root = Some(built);
            return;
        };
        frame.size += built.size;
        frame.height = frame.height.max(built.height + 1);
        match &mut frame.body {
            Body::Seq(items) => items.push(built.node),
            Body::Map(_, pending @ None, _) => *pending = Some(built.node),
            Body::Map(entries, pending @ Some(_), seen) => {
                let key = pending.take().expect("a pending key");
                let name = key.scalar_text().unwrap_or_default();
                if !seen.insert(name.clone()) && self.error.is_none() {
                    self.error = Some(ConfigError::at(
                        key.loc,
                        Some(name.clone()),
                        "duplicate key".into(),
                    ));
                }
                entries.push((name, built.node));
            }
        }
    }
}

fn too_deep(loc: Loc) -> ConfigError {
    ConfigError::at(
        loc,
        None,
        format!("lists and mappings nest deeper than {MAX_DEPTH} levels"),
    )
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
