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
    let mut builder = Builder::new(file);
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
    Map(MapBody),
}

/// A mapping still being read.
#[derive(Default)]
struct MapBody {
    entries: Vec<(String, Node)>,
    /// A key waiting for its value.
    pending: Option<Node>,
    /// The keys seen, so a duplicate is found in constant time: a mapping of a million keys must
    /// not take a million squared.
    seen: std::collections::HashSet<String>,
    /// The pending key is a merge key (a plain `<<`).
    merge_key: bool,
    /// Where the merge key stood among the entries, and the mappings it brings in, the one that
    /// wins first.
    merge: Option<(usize, Vec<Node>)>,
}

/// The key whose value (a mapping, or a list of them) lends its entries to the mapping it is in,
/// as Go's yaml.v3 (and so llama-swap) reads it.
const MERGE_KEY: &str = "<<";

impl MapBody {
    /// Adds the entry `key: value` (a merge key's value lends its entries); the error for a
    /// duplicate key, else for a value a merge key cannot take.
    fn add(&mut self, key: Node, value: Node) -> Option<ConfigError> {
        let name = key.scalar_text().unwrap_or_default();
        let mut error = None;
        if !self.seen.insert(name.clone()) {
            let duplicate =
                ConfigError::at(key.loc.clone(), Some(name.clone()), "duplicate key".into());
            error = Some(duplicate);
        }
        if std::mem::take(&mut self.merge_key) {
            match merge_sources(&key, value) {
                Ok(sources) => self.merge = Some((self.entries.len(), sources)),
                Err(e) => error = error.or(Some(e)),
            }
        } else {
            self.entries.push((name, value));
        }
        error
    }

    /// The entries with the merged ones in the merge key's place: keys written in the mapping win
    /// over merged ones, and an earlier mapping of a merged list over a later one. Merged values
    /// keep the locations of what they were copied from, so errors point at the anchor.
    fn finish(self) -> Vec<(String, Node)> {
        let Some((at, sources)) = self.merge else {
            return self.entries;
        };
        let mut taken: std::collections::HashSet<String> =
            self.entries.iter().map(|(k, _)| k.clone()).collect();
        let mut entries = self.entries;
        let merged: Vec<(String, Node)> = sources
            .into_iter()
            .flat_map(|source| match source.value {
                Value::Map(entries) => entries,
                _ => Vec::new(),
            })
            .filter(|(k, _)| taken.insert(k.clone()))
            .collect();
        entries.splice(at..at, merged);
        entries
    }
}

/// What a merge key's value brings in: a mapping, or a list of mappings (the first wins). An
/// error names the merge key, where the mistake is written (an alias's value is elsewhere).
fn merge_sources(key: &Node, node: Node) -> Result<Vec<Node>, ConfigError> {
    let not_mergeable = |what: String| {
        ConfigError::at(
            key.loc.clone(),
            Some(MERGE_KEY.into()),
            format!("a merge key takes a mapping or a list of mappings, not {what}"),
        )
    };
    match node.value {
        Value::Map(_) => Ok(vec![node]),
        Value::Seq(items) => match items.iter().find(|n| !matches!(n.value, Value::Map(_))) {
            Some(bad) => Err(not_mergeable(format!("a list holding {}", bad.kind()))),
            None => Ok(items),
        },
        _ => Err(not_mergeable(node.kind().into())),
    }
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
            Body::Map(map) => Value::Map(map.finish()),
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
    fn new(file: &Arc<str>) -> Self {
        Builder {
            file: file.clone(),
            stack: Vec::new(),
            anchors: HashMap::new(),
            alias_nodes: 0,
            root: None,
            error: None,
        }
    }

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
            Event::Scalar(text, style, anchor, _tag) => self.scalar(text, style, anchor, loc),
            Event::SequenceStart(anchor, _) => {
                self.open(Frame::open(loc, anchor, Body::Seq(Vec::new())))?
            }
            Event::MappingStart(anchor, _) => {
                self.open(Frame::open(loc, anchor, Body::Map(MapBody::default())))?
            }
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

    /// A scalar, typed as YAML types a plain one; a plain `<<` key marks its mapping's next
    /// value as a merge.
    fn scalar(&mut self, text: String, style: TScalarStyle, anchor: usize, loc: Loc) {
        let plain = style == TScalarStyle::Plain;
        let merge_key = plain && text == MERGE_KEY && self.awaits_key();
        let value = if plain {
            plain_scalar(text)
        } else {
            Value::Str(text)
        };
        self.push_value(Built::leaf(Node::new(value, loc)), anchor);
        if let Some(Frame {
            body: Body::Map(map),
            ..
        }) = self.stack.last_mut().filter(|_| merge_key)
        {
            map.merge_key = true;
        }
    }

    /// True when the next scalar is a key of the mapping being read.
    fn awaits_key(&self) -> bool {
        matches!(self.stack.last(), Some(Frame { body: Body::Map(map), .. }) if map.pending.is_none())
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
        let map = match &mut frame.body {
            Body::Seq(items) => return items.push(built.node),
            Body::Map(map) => map,
        };
        let Some(key) = map.pending.take() else {
            map.pending = Some(built.node);
            return;
        };
        let error = map.add(key, built.node);
        if self.error.is_none() {
            self.error = error;
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

    fn text_of<'n>(n: &'n Node, key: &str) -> Option<&'n str> {
        match &n.get(key)?.value {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    #[test]
    fn merge_keys_lend_entries_and_keys_written_in_the_mapping_win() {
        let n = p("base: &b {cmd: a, ttl: 5}\nm:\n  cmd: x\n  <<: *b\n  name: n\n");
        let m = n.get("m").unwrap();
        let keys: Vec<&str> = m.entries().iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            ["cmd", "ttl", "name"],
            "merged keys take the merge key's place"
        );
        assert_eq!(text_of(m, "cmd"), Some("x"));
        let ttl = m.get("ttl").unwrap();
        assert!(matches!(ttl.value, Value::Int(5)));
        assert_eq!(
            (ttl.loc.line, ttl.loc.col),
            (1, 24),
            "a merged value keeps the anchor's place"
        );
        let quoted = p("m: {'<<': {x: 1}}\n");
        assert!(
            quoted.get("m").unwrap().get("<<").is_some(),
            "a quoted << is a plain key"
        );
    }

    #[test]
    fn a_merged_list_prefers_its_earlier_mappings_at_any_depth() {
        let n = p(
            "a: &a {x: a, y: a}\nb: &b {x: b, y: b, z: b}\nm:\n  caps: {<<: [*a, *b], y: own}\n",
        );
        let caps = n.get("m").unwrap().get("caps").unwrap();
        assert_eq!(text_of(caps, "x"), Some("a"));
        assert_eq!(text_of(caps, "y"), Some("own"));
        assert_eq!(text_of(caps, "z"), Some("b"));
        let inline = p("m: {<<: {x: 1}, y: 2}\n");
        assert!(matches!(
            inline.get("m").unwrap().get("x").unwrap().value,
            Value::Int(1)
        ));
    }

    #[test]
    fn a_merge_key_takes_only_mappings() {
        for (text, want) in [
            ("m: {<<: 5}\n", "t.yaml:1:5: <<: a merge key takes a mapping or a list of mappings, not an integer"),
            ("m:\n  <<:\n", "t.yaml:2:3: <<: a merge key takes a mapping or a list of mappings, not null"),
            ("a: &a [1]\nm: {<<: *a}\n", "t.yaml:2:5: <<: a merge key takes a mapping or a list of mappings, not a list holding an integer"),
            ("a: &a {x: 1}\nm: {<<: [*a, x]}\n", "t.yaml:2:5: <<: a merge key takes a mapping or a list of mappings, not a list holding a string"),
        ] {
            let err = parse(text, &Arc::from("t.yaml")).unwrap_err().to_string();
            assert_eq!(err, want);
        }
    }

    #[test]
    fn anchors_and_aliases_copy_values() {
        let n = p("x: &v [1, 2]\ny: *v\n");
        assert!(matches!(&n.get("y").unwrap().value, Value::Seq(items) if items.len() == 2));
    }
}
