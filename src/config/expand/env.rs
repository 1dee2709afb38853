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
                // as llama-swap's sanitizeEnvValueForYAML: escaped wherever it lands, so a value
                // stays one string inside double quotes, and a command's split turns `\"` back
                // into `"` (a JSON value in an unquoted `cmd` keeps its quotes)
                out.push_str(&value.replace('\\', "\\\\").replace('"', "\\\""));
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
