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
