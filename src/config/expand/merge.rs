//! Merging several config sources into one tree.

use crate::config::yaml::{Loc, Node, Value};
use crate::config::ConfigError;

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

/// Merges `b` into `a` with llama-swap's rules: maps merge key-wise, lists concatenate, equal scalars
/// agree, anything else is a conflict.
pub(super) fn merge(a: Node, b: Node, path: &str) -> Result<Node, ConfigError> {
    match (a.value, b.value) {
        (Value::Null, v) => Ok(Node::new(v, b.loc)),
        (v, Value::Null) => Ok(Node::new(v, a.loc)),
        (Value::Map(left), Value::Map(right)) => {
            Ok(Node::new(Value::Map(merge_maps(left, right, path)?), a.loc))
        }
        (Value::Seq(mut left), Value::Seq(right)) => {
            left.extend(right);
            Ok(Node::new(Value::Seq(left), a.loc))
        }
        (va, vb) => merge_scalars(Node::new(va, a.loc), Node::new(vb, b.loc), path),
    }
}

/// The entries of `right` merged into `left` key by key; a key of a map that names things
/// (see [`IDENTITY_MAPS`]) may not be in both.
fn merge_maps(
    mut left: Vec<(String, Node)>,
    right: Vec<(String, Node)>,
    path: &str,
) -> Result<Vec<(String, Node)>, ConfigError> {
    let identity = IDENTITY_MAPS.contains(&path);
    for (key, value) in right {
        let child_path = if path.is_empty() {
            key.clone()
        } else {
            format!("{path}.{key}")
        };
        match left.iter().position(|(k, _)| *k == key) {
            Some(i) if identity => {
                return Err(duplicate(path, &key, &left[i].1, &value, child_path))
            }
            Some(i) => {
                let existing = std::mem::replace(&mut left[i].1, Node::null(Loc::default()));
                left[i].1 = merge(existing, value, &child_path)?;
            }
            None => left.push((key, value)),
        }
    }
    Ok(left)
}

/// The error for `key` of `path`, a map that names things, given again in `value`'s file.
fn duplicate(path: &str, key: &str, first: &Node, value: &Node, child_path: String) -> ConfigError {
    ConfigError::at(
        value.loc.clone(),
        Some(child_path),
        format!(
            "duplicate {path} {key:?} found in {} and {}",
            first.loc.file, value.loc.file
        ),
    )
}

/// Two values that are not both maps nor both lists agree only as the same scalar.
fn merge_scalars(na: Node, nb: Node, path: &str) -> Result<Node, ConfigError> {
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
