//! The llama-swap loading pipeline on the raw tree: `${env.X}`, merging several files, macros and
//! `${PORT}` allocation, in llama-swap's order (COMPAT.md §1.1).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::yaml::{parse, Loc, Node, Value};
use super::ConfigError;

/// Maps that name things: the same key in two files is an error, never a merge.
const IDENTITY_MAPS: &[&str] = &[
    "models",
    "groups",
    "profiles",
    "selectors",
    "peers",
    "matrix",
    "routing.router.settings.groups",
    "routing.router.settings.matrix",
];

/// Where the expansion leaves each replica's own cmd, proxy and port for the decoder.
pub const REPLICAS_KEY: &str = "__replicas";

const RESERVED_MACROS: &[&str] = &["PID", "PORT", "MODEL_ID"];

/// Reads, substitutes `${env.X}` and parses each source, then merges them in order.
pub fn load_sources(
    sources: &[(Arc<str>, String)],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Node, ConfigError> {
    let mut merged: Option<Node> = None;
    for (file, text) in sources {
        let text = substitute_env(text, file, env)?;
        let node = parse(&text, file)?;
        if node.is_null() {
            continue;
        }
        if !matches!(node.value, Value::Map(_)) {
            return Err(ConfigError::at(
                node.loc.clone(),
                None,
                format!("the config must be a mapping, not {}", node.kind()),
            ));
        }
        merged = Some(match merged {
            None => node,
            Some(base) => merge(base, node, "")?,
        });
    }
    Ok(merged.unwrap_or_else(|| Node::new(Value::Map(Vec::new()), Loc::default())))
}

/// Substitutes `${env.NAME}` in the raw text, ignoring comments when looking for references.
pub fn substitute_env(
    text: &str,
    file: &Arc<str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, ConfigError> {
    let mut out = String::with_capacity(text.len());
    for (line_no, line) in text.split_inclusive('\n').enumerate() {
        let code_end = comment_start(line).unwrap_or(line.len());
        let (code, comment) = line.split_at(code_end);
        let mut rest = code;
        let mut col = 0;
        while let Some(start) = rest.find("${env.") {
            let after = &rest[start + 6..];
            let Some(end) = after.find('}') else { break };
            let name = &after[..end];
            let valid = !name.is_empty()
                && name.chars().enumerate().all(|(i, c)| {
                    c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit())
                });
            out.push_str(&rest[..start]);
            if !valid {
                out.push_str(&rest[start..start + 6 + end + 1]);
            } else {
                let loc = Loc {
                    file: file.clone(),
                    line: line_no + 1,
                    col: col + start + 1,
                };
                let value = env(name).ok_or_else(|| {
                    ConfigError::at(
                        loc.clone(),
                        None,
                        format!("environment variable '{name}' is not set"),
                    )
                })?;
                if value.contains(['\n', '\r', '\0']) {
                    return Err(ConfigError::at(
                        loc,
                        None,
                        format!("environment variable '{name}' contains a newline or NUL, which cannot be substituted"),
                    ));
                }
                if inside_double_quotes(&code[..col + start]) {
                    out.push_str(&value.replace('\\', "\\\\").replace('"', "\\\""));
                } else {
                    out.push_str(&value);
                }
            }
            col += start + 6 + end + 1;
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        out.push_str(comment);
    }
    Ok(out)
}

/// Byte offset of a YAML comment on this line (`#` at the start or after a blank, outside quotes).
fn comment_start(line: &str) -> Option<usize> {
    let (mut single, mut double, mut prev) = (false, false, ' ');
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single && prev != '\\' => double = !double,
            '#' if !single && !double && prev.is_whitespace() => return Some(i),
            _ => {}
        }
        prev = c;
    }
    None
}

fn inside_double_quotes(before: &str) -> bool {
    let mut prev = ' ';
    let mut inside = false;
    for c in before.chars() {
        if c == '"' && prev != '\\' {
            inside = !inside;
        }
        prev = c;
    }
    inside
}

/// Merges `b` into `a` with llama-swap's rules: maps merge key-wise, lists concatenate, equal scalars
/// agree, anything else is a conflict.
fn merge(a: Node, b: Node, path: &str) -> Result<Node, ConfigError> {
    match (a.value, b.value) {
        (Value::Null, v) => Ok(Node::new(v, b.loc)),
        (v, Value::Null) => Ok(Node::new(v, a.loc)),
        (Value::Map(mut left), Value::Map(right)) => {
            let identity = IDENTITY_MAPS.contains(&path);
            for (key, value) in right {
                let child_path = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match left.iter().position(|(k, _)| *k == key) {
                    Some(i) if identity => {
                        return Err(ConfigError::at(
                            value.loc.clone(),
                            Some(child_path),
                            format!(
                                "duplicate {path} {key:?} found in {} and {}",
                                left[i].1.loc.file, value.loc.file
                            ),
                        ));
                    }
                    Some(i) => {
                        let existing =
                            std::mem::replace(&mut left[i].1, Node::null(Loc::default()));
                        left[i].1 = merge(existing, value, &child_path)?;
                    }
                    None => left.push((key, value)),
                }
            }
            Ok(Node::new(Value::Map(left), a.loc))
        }
        (Value::Seq(mut left), Value::Seq(right)) => {
            left.extend(right);
            Ok(Node::new(Value::Seq(left), a.loc))
        }
        (va, vb) => {
            let (na, nb) = (Node::new(va, a.loc), Node::new(vb, b.loc));
            if let (Some(x), Some(y)) = (na.scalar_text(), nb.scalar_text()) {
                if x == y && na.kind() == nb.kind() {
                    return Ok(na);
                }
            }
            Err(ConfigError::at(
                nb.loc.clone(),
                Some(path.to_string()),
                format!("conflict at {path:?}: {} defines it differently", na.loc),
            ))
        }
    }
}

/// An ordered macro list (declaration order).
type Macros = Vec<(String, Node)>;

fn read_macros(node: Option<&Node>, scope: &str) -> Result<Macros, ConfigError> {
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
        let key = format!("{scope}.{name}");
        let valid_name = !name.is_empty()
            && name.len() < 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid_name {
            return Err(ConfigError::at(
                value.loc.clone(),
                Some(key),
                "macro names must match ^[a-zA-Z0-9_-]+$ and be under 64 characters".into(),
            ));
        }
        if RESERVED_MACROS.contains(&name.as_str()) {
            return Err(ConfigError::at(
                value.loc.clone(),
                Some(key),
                format!("macro name {name:?} is reserved"),
            ));
        }
        if matches!(value.value, Value::Seq(_) | Value::Map(_) | Value::Null) {
            return Err(ConfigError::at(
                value.loc.clone(),
                Some(key),
                "macro values must be a string, number or boolean".into(),
            ));
        }
        if let Value::Str(s) = &value.value {
            if s.contains(&format!("${{{name}}}")) {
                return Err(ConfigError::at(
                    value.loc.clone(),
                    Some(key),
                    "macro references itself".into(),
                ));
            }
        }
        out.push((name.clone(), value.clone()));
    }
    Ok(out)
}

/// The most bytes macro substitution may add to the config, all substitutions together. A macro
/// may use the ones declared before it, so ten lines that each use the previous macro ten times
/// would otherwise expand to gigabytes; real configs add kilobytes.
pub const MAX_MACRO_GROWTH: usize = 16 << 20;

/// What macro substitution has added so far, and where it first went over [`MAX_MACRO_GROWTH`].
#[derive(Default)]
struct Growth {
    added: usize,
    over: Option<Loc>,
}

impl Growth {
    /// `text` with every `pattern` replaced, or `None` once the budget is spent.
    fn replace(&mut self, text: &str, pattern: &str, with: &str, loc: &Loc) -> Option<String> {
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

    fn check(&self) -> Result<(), ConfigError> {
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
fn substitute(
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

fn apply_macros(node: &mut Node, macros: &Macros, growth: &mut Growth) -> Result<(), ConfigError> {
    for (name, value) in macros.iter().rev() {
        substitute(node, name, value, growth)?;
    }
    Ok(())
}

/// Resolves macros and `${PORT}` over the merged tree (§1.1 steps 3-5).
pub fn resolve(mut root: Node) -> Result<Node, ConfigError> {
    let globals = read_macros(root.get("macros"), "macros")?;
    let mut growth = Growth::default();
    if let Value::Map(entries) = &mut root.value {
        for (key, value) in entries.iter_mut() {
            if key != "models" && key != "macros" {
                apply_macros(value, &globals, &mut growth)?;
            }
        }
    }
    let start_port = match root.get("startPort") {
        None => 5800,
        Some(n) => match n.value {
            Value::Int(p) if (1..=65535).contains(&p) => p,
            _ => {
                return Err(ConfigError::at(
                    n.loc.clone(),
                    Some("startPort".into()),
                    "must be a port number from 1 to 65535".into(),
                ))
            }
        },
    };
    let mut next_port = start_port;
    if let Some(models) = root.get_mut("models") {
        if let Value::Map(entries) = &mut models.value {
            let mut order: Vec<usize> = (0..entries.len()).collect();
            order.sort_by(|&a, &b| entries[a].0.cmp(&entries[b].0));
            for i in order {
                let (id, model) = &mut entries[i];
                resolve_model(id, model, &globals, &mut next_port, &mut growth)?;
            }
        }
    }
    if let Value::Map(entries) = &mut root.value {
        entries.retain(|(k, _)| k != "macros");
    }
    check_leftovers(&root, "")?;
    Ok(root)
}

fn resolve_model(
    id: &str,
    model: &mut Node,
    globals: &Macros,
    next_port: &mut i64,
    growth: &mut Growth,
) -> Result<(), ConfigError> {
    let scope = format!("models.{id}");
    if !matches!(model.value, Value::Map(_)) {
        if model.is_null() {
            model.value = Value::Map(Vec::new());
        } else {
            return Err(ConfigError::at(
                model.loc.clone(),
                Some(scope),
                format!("a model must be a mapping, not {}", model.kind()),
            ));
        }
    }
    let own = read_macros(model.get("macros"), &format!("{scope}.macros"))?;
    let mut list: Macros = vec![(
        "MODEL_ID".into(),
        Node::new(Value::Str(id.into()), model.loc.clone()),
    )];
    list.extend(globals.iter().cloned());
    for (name, value) in own {
        match list.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => list.push((name, value)),
        }
    }
    for key in ["cmd", "cmdStop"] {
        if let Some(Node {
            value: Value::Str(s),
            ..
        }) = model.get_mut(key)
        {
            *s = strip_comment_lines(s);
        }
    }
    if model.get("proxy").is_none() {
        let loc = model.loc.clone();
        if let Value::Map(e) = &mut model.value {
            e.push((
                "proxy".into(),
                Node::new(Value::Str("http://localhost:${PORT}".into()), loc),
            ));
        }
    }
    if let Value::Map(entries) = &mut model.value {
        entries.retain(|(k, _)| k != "macros");
    }
    apply_macros(model, &list, growth)?;
    substitute_by_id_keys(model, &list, growth)?;

    // a model whose command corral builds from its engine listens on a port of its own
    let cmd_uses_port = matches!(model.get("cmd"), Some(Node { value: Value::Str(s), .. }) if s.contains("${PORT}"))
        || super::engine::builds_command(model);
    let replicas = match model.get("replicas").map(|n| &n.value) {
        None | Some(Value::Null) => 1,
        Some(Value::Int(n)) if (1..=64).contains(n) => *n,
        Some(_) => {
            let loc = model
                .get("replicas")
                .map_or(model.loc.clone(), |n| n.loc.clone());
            return Err(ConfigError::at(
                loc,
                Some(format!("{scope}.replicas")),
                "must be an integer from 1 to 64".into(),
            ));
        }
    };
    if replicas > 1 && !cmd_uses_port {
        return Err(ConfigError::at(
            model.loc.clone(),
            Some(format!("{scope}.replicas")),
            "replicas need ${PORT} in cmd: each replica listens on its own port".into(),
        ));
    }
    if cmd_uses_port {
        if *next_port + replicas - 1 > 65535 {
            return Err(ConfigError::at(
                model.loc.clone(),
                Some(scope),
                "ran out of ports above startPort".into(),
            ));
        }
        if replicas > 1 {
            let instances = (0..replicas)
                .map(|i| -> Result<Node, ConfigError> {
                    let port = Node::new(Value::Int(*next_port + i), model.loc.clone());
                    let mut entries = vec![("port".to_string(), port.clone())];
                    for key in ["cmd", "cmdStop", "proxy", "checkEndpoint"] {
                        if let Some(n) = model.get(key) {
                            let mut n = n.clone();
                            substitute(&mut n, "PORT", &port, growth)?;
                            entries.push((key.to_string(), n));
                        }
                    }
                    Ok(Node::new(Value::Map(entries), model.loc.clone()))
                })
                .collect::<Result<_, _>>()?;
            if let Value::Map(e) = &mut model.value {
                e.push((
                    REPLICAS_KEY.into(),
                    Node::new(Value::Seq(instances), model.loc.clone()),
                ));
            }
        }
        let port = Node::new(Value::Int(*next_port), model.loc.clone());
        *next_port += replicas;
        substitute(model, "PORT", &port, growth)?;
        substitute_by_id_keys(model, &[("PORT".into(), port)], growth)?;
    } else if let Some(proxy) = model.get("proxy") {
        if matches!(&proxy.value, Value::Str(s) if s.contains("${PORT}")) {
            return Err(ConfigError::at(
                proxy.loc.clone(),
                Some(format!("{scope}.proxy")),
                format!("model {id}: proxy uses ${{PORT}} but cmd does not - ${{PORT}} is only available when used in cmd"),
            ));
        }
    }
    Ok(())
}

/// `filters.setParamsByID` is the one map whose keys take macros.
fn substitute_by_id_keys(
    model: &mut Node,
    macros: &[(String, Node)],
    growth: &mut Growth,
) -> Result<(), ConfigError> {
    let Some(by_id) = model
        .get_mut("filters")
        .and_then(|f| f.get_mut("setParamsByID"))
    else {
        return Ok(());
    };
    let Value::Map(entries) = &mut by_id.value else {
        return Ok(());
    };
    let mut seen = BTreeMap::new();
    for (key, value) in entries.iter_mut() {
        for (name, m) in macros.iter().rev() {
            let pattern = format!("${{{name}}}");
            let text = m.scalar_text().unwrap_or_default();
            match growth.replace(key, &pattern, &text, &value.loc) {
                Some(replaced) => *key = replaced,
                None => return growth.check(),
            }
        }
        if let Some(prev) = seen.insert(key.clone(), value.loc.clone()) {
            return Err(ConfigError::at(
                value.loc.clone(),
                Some(format!("filters.setParamsByID.{key}")),
                format!("two keys resolve to {key:?} (the other at {prev})"),
            ));
        }
    }
    Ok(())
}

fn strip_comment_lines(text: &str) -> String {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Any `${...}` left after expansion is an unknown macro, except `${PID}` in cmdStop.
fn check_leftovers(node: &Node, path: &str) -> Result<(), ConfigError> {
    match &node.value {
        Value::Str(s) => {
            let mut rest = s.as_str();
            while let Some(start) = rest.find("${") {
                let Some(end) = rest[start..].find('}') else {
                    break;
                };
                let name = &rest[start + 2..start + end];
                let allowed = name == "PID" && path.ends_with(".cmdStop");
                if !allowed {
                    return Err(ConfigError::at(
                        node.loc.clone(),
                        Some(path.trim_start_matches('.').to_string()),
                        format!("unknown macro '${{{name}}}'"),
                    ));
                }
                rest = &rest[start + end..];
            }
            Ok(())
        }
        Value::Seq(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, n)| check_leftovers(n, &format!("{path}[{i}]"))),
        Value::Map(entries) => entries
            .iter()
            .try_for_each(|(k, n)| check_leftovers(n, &format!("{path}.{k}"))),
        _ => Ok(()),
    }
}
