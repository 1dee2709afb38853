//! Command lines as llama-swap reads them: what a model's `cmd` and an engine's `command` share.

/// Splits a command like a POSIX shell (no expansion, no shell), after llama-swap's
/// SanitizeCommand: comment lines dropped, and `\` continuations joined.
pub(super) fn split_command(cmd: &str) -> Result<Vec<String>, String> {
    let argv = shlex::split(&join_lines(cmd))
        .ok_or_else(|| "cannot split the command: unbalanced quotes".to_string())?;
    if argv.is_empty() {
        return Err("empty command".into());
    }
    Ok(argv)
}

/// The command's lines without comment lines, each line whose trimmed text ends with `\` cut
/// before it. Trimming first means a space after the `\` (which a YAML `|` block keeps) still
/// continues the line instead of escaping a space into an argument of its own, and a `\` at
/// the very end leaves nothing for the split to read as an unfinished escape.
fn join_lines(cmd: &str) -> String {
    cmd.split('\n')
        .filter(|line| !line.trim().starts_with('#'))
        .map(|line| match line.trim().strip_suffix('\\') {
            Some(head) => format!("{head} "),
            None => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}
