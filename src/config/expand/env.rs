//! `${env.NAME}` in the raw text, before YAML parsing, as llama-swap substitutes it.

use std::sync::Arc;

use crate::config::yaml::Loc;
use crate::config::ConfigError;

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
        let at = |col| Loc {
            file: file.clone(),
            line: line_no + 1,
            col,
        };
        substitute_code(&mut out, code, &at, env)?;
        out.push_str(comment);
    }
    Ok(out)
}

/// Writes `code` (a line less its comment) to `out`, each `${env.NAME}` with a valid name
/// replaced by its value; `at` locates a column of the line (from 1).
fn substitute_code(
    out: &mut String,
    code: &str,
    at: &dyn Fn(usize) -> Loc,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    let mut rest = code;
    let mut col = 0;
    while let Some(start) = rest.find("${env.") {
        let after = &rest[start + 6..];
        let Some(end) = after.find('}') else { break };
        let name = &after[..end];
        out.push_str(&rest[..start]);
        if !valid_env_name(name) {
            out.push_str(&rest[start..start + 6 + end + 1]);
        } else {
            out.push_str(&env_value(name, at(col + start + 1), env)?);
        }
        col += start + 6 + end + 1;
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(())
}

/// A variable name: letters, digits and `_`, not starting with a digit.
fn valid_env_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .enumerate()
            .all(|(i, c)| c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit()))
}

/// The variable's value, escaped for wherever it lands; an unset variable, or one holding a
/// newline or NUL, is an error at `loc`.
fn env_value(
    name: &str,
    loc: Loc,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, ConfigError> {
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
    // as llama-swap's sanitizeEnvValueForYAML: escaped wherever it lands, so a value
    // stays one string inside double quotes, and a command's split turns `\"` back
    // into `"` (a JSON value in an unquoted `cmd` keeps its quotes)
    Ok(value.replace('\\', "\\\\").replace('"', "\\\""))
}

/// Byte offset of a YAML comment on this line (`#` at the start or after a blank, outside quotes).
/// A quote opens a string only where a scalar can begin (after a blank or `[{,:`), so the
/// apostrophe of `Meta's model  # ${env.UNSET}` leaves the comment a comment.
fn comment_start(line: &str) -> Option<usize> {
    let (mut single, mut double, mut prev) = (false, false, ' ');
    let opens = |prev: char| prev.is_whitespace() || matches!(prev, '[' | '{' | ',' | ':');
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double && (single || opens(prev)) => single = !single,
            '"' if !single && prev != '\\' && (double || opens(prev)) => double = !double,
            '#' if !single && !double && prev.is_whitespace() => return Some(i),
            _ => {}
        }
        prev = c;
    }
    None
}
