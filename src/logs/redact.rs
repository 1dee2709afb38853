//! Secrets never shown: one redaction used wherever a command line or log text leaves corral
//! (`/running`, `/logs`, `/api/events`, its own log lines, `corral check`).
//!
//! Two rules. A command-line value after a flag whose name looks secret (`--api-key X`,
//! `--api-key=X`, `--hf-token X`), or given to a secret-named variable (`env HF_TOKEN=X vllm
//! serve`, `docker run -e AWS_SECRET_ACCESS_KEY=X`, `sh -c "HF_TOKEN=X exec vllm serve"`), is
//! shown as `***`. And every value known to be secret is replaced wherever it appears: values of
//! secret-named `${env.X}` substitutions, of secret-named `env:` and `engines.<kind>.env` entries,
//! of the well-known credential variables in corral's own environment ([`CREDENTIAL_VARS`]), and
//! the secret values in any model's command, so an engine that echoes its key in its own output is
//! redacted too.
//!
//! A name is secret when one of its words ends in key, token, secret or password: `HF_TOKEN`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_ACCESS_KEY_ID`, `OPENAI_API_KEY`,
//! `DB_PASSWORD`. Other assignments (`CUDA_VISIBLE_DEVICES=0`) stay readable.

use aho_corasick::{AhoCorasick, MatchKind};

/// What a redacted value is shown as.
pub const MASK: &str = "***";

/// Secret values shorter than this are not searched for in text: a two-character "secret" would mask
/// half of every log line, and is no secret anyway.
const MIN_SECRET_LEN: usize = 4;

/// Variables of corral's own environment whose values are credentials an engine inherits (to
/// download weights): known to the redactor, so an engine that prints them shows `***`.
pub const CREDENTIAL_VARS: &[&str] = &[
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
];

/// Word endings that mark a name as secret: `api-key`, `HF_TOKEN`, `db_password`, `apikey`.
/// `tokens` is deliberately absent: `--max-num-batched-tokens 8192` is a count, not a secret.
const SECRET_WORD_ENDINGS: &[&str] = &[
    "key", "keys", "token", "secret", "secrets", "password", "passwd",
];

/// True for a flag or variable name that names a secret: one of its words (split at `-`, `_` and
/// anything not alphanumeric) ends in key, token, secret or password.
pub fn is_secret_name(name: &str) -> bool {
    name.split(|c: char| !c.is_ascii_alphanumeric())
        .map(str::to_ascii_lowercase)
        .any(|word| SECRET_WORD_ENDINGS.iter().any(|end| word.ends_with(end)))
}

/// The known secret values of one config, and the redaction that hides them.
#[derive(Clone, Default)]
pub struct Redactor {
    /// The values, longest first, so a secret that contains another is masked whole.
    values: Vec<String>,
    matcher: Option<AhoCorasick>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redactor({} secret values)", self.values.len())
    }
}

impl Redactor {
    /// A redactor for these secret values; empty and very short ones are ignored.
    pub fn new(values: impl IntoIterator<Item = String>) -> Redactor {
        let mut values: Vec<String> = values
            .into_iter()
            .filter(|v| v.len() >= MIN_SECRET_LEN)
            .collect();
        values.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        values.dedup();
        let matcher = (!values.is_empty()).then(|| {
            AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(&values)
                .expect("plain string patterns always build")
        });
        Redactor { values, matcher }
    }

    /// True when there is no secret value to look for in text.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// `text` with every known secret value replaced by `***`.
    pub fn text<'a>(&self, text: &'a str) -> std::borrow::Cow<'a, str> {
        match &self.matcher {
            Some(m) if m.is_match(text) => {
                m.replace_all(text, &vec![MASK; self.values.len()]).into()
            }
            _ => text.into(),
        }
    }

    /// Like [`Redactor::text`], for log bytes that may not be UTF-8; unchanged bytes are not copied.
    pub fn bytes(&self, data: bytes::Bytes) -> bytes::Bytes {
        match &self.matcher {
            Some(m) if m.is_match(&data[..]) => m
                .replace_all_bytes(&data, &vec![MASK; self.values.len()])
                .into(),
            _ => data,
        }
    }

    /// `argv` with the values of secret flags and assignments, and every known secret value,
    /// masked.
    pub fn argv(&self, argv: &[String]) -> Vec<String> {
        mask_secret_values(argv)
            .into_iter()
            .map(|arg| self.text(&arg).into_owned())
            .collect()
    }

    /// The masked `argv` joined with spaces, as `/running` and the log lines show a command.
    pub fn command_line(&self, argv: &[String]) -> String {
        self.argv(argv).join(" ")
    }
}

/// Where a secret value sits in a command line: the bytes `range` of argument `arg`.
struct SecretValue {
    arg: usize,
    range: std::ops::Range<usize>,
}

/// Every secret value in `argv`, in order: after secret flags, in `NAME=value` words.
fn secret_values_in(argv: &[String]) -> Vec<SecretValue> {
    let mut found = Vec::new();
    let mut taken = None; // the argument a secret flag took as its value
    for (i, arg) in argv.iter().enumerate() {
        if taken == Some(i) {
            continue;
        }
        if let Some((name, inline)) = flag_name(arg) {
            if is_secret_name(name) {
                let value = flag_value(argv, i, inline);
                if value.as_ref().is_some_and(|v| v.arg != i) {
                    taken = Some(i + 1);
                }
                found.extend(value);
            }
            continue;
        }
        let ranges = secret_assignments(arg);
        found.extend(
            ranges
                .into_iter()
                .map(|range| SecretValue { arg: i, range }),
        );
    }
    found
}

/// The value of the secret flag `argv[i]`: inline (`--token=x`), else the next argument, unless
/// that is a flag (this one then took no value).
fn flag_value(argv: &[String], i: usize, inline: Option<&str>) -> Option<SecretValue> {
    let arg = &argv[i];
    match inline {
        Some(value) => Some(SecretValue {
            arg: i,
            range: arg.len() - value.len()..arg.len(),
        }),
        None if argv.get(i + 1).is_some_and(|next| !next.starts_with("--")) => Some(SecretValue {
            arg: i + 1,
            range: 0..argv[i + 1].len(),
        }),
        None => None,
    }
}

/// The values of secret-named assignments in one argument: the whole word `HF_TOKEN=hf_x` (as
/// `env`, `docker run -e` and the like take them), or, in a script given to a shell (`sh -c
/// "HF_TOKEN=hf_x vllm serve ..."`), each `NAME=value` word of it, quotes included. Only
/// secret names count (see [`is_secret_name`]): `CUDA_VISIBLE_DEVICES=0` stays readable.
fn secret_assignments(arg: &str) -> Vec<std::ops::Range<usize>> {
    if let Some((name, value)) = arg.split_once('=') {
        if is_variable_name(name) && !value.chars().any(char::is_whitespace) {
            let secret = is_secret_name(name) && is_literal(value);
            return secret
                .then(|| name.len() + 1..arg.len())
                .into_iter()
                .collect();
        }
    }
    if !arg.chars().any(char::is_whitespace) {
        return Vec::new();
    }
    script_assignments(arg)
}

/// `NAME=value` words of a shell script with a secret NAME: the byte ranges of their values.
fn script_assignments(script: &str) -> Vec<std::ops::Range<usize>> {
    static ASSIGNMENT: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r#"(?:^|\s)([A-Za-z_][A-Za-z0-9_]*)=("[^"]*"?|'[^']*'?|\S+)"#)
            .expect("a valid pattern")
    });
    ASSIGNMENT
        .captures_iter(script)
        .filter(|c| is_secret_name(&c[1]) && is_literal(&c[2]))
        .filter_map(|c| c.get(2).map(|v| v.range()))
        .collect()
}

/// True for a value that is written out, not empty nor a shell reference (`$HF_TOKEN`, which
/// shows no secret and stays readable).
fn is_literal(value: &str) -> bool {
    !value.is_empty() && !value.trim_start_matches(['"', '\'']).starts_with('$')
}

/// True for a shell variable name: a letter or `_`, then letters, digits and `_`.
fn is_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `argv` with every secret value masked: `--api-key X`, `--api-key=X`, and the value of a
/// secret-named `NAME=value` word (`env HF_TOKEN=X vllm serve`), also inside a shell script.
pub fn mask_secret_values(argv: &[String]) -> Vec<String> {
    let mut out = argv.to_vec();
    // from the last, so an earlier range of the same argument keeps its offsets
    for at in secret_values_in(argv).into_iter().rev() {
        out[at.arg].replace_range(at.range, MASK);
    }
    out
}

/// The secret values in `argv`: what secret-named flags and assignments take.
pub fn secret_values(argv: &[String]) -> Vec<String> {
    secret_values_in(argv)
        .into_iter()
        // a quoted value is printed without its quotes
        .map(|at| argv[at.arg][at.range].trim_matches(['"', '\'']).to_string())
        .collect()
}

/// For `-x`, `--name` or `--name=value`: the name without dashes, and the inline value if any.
fn flag_name(arg: &str) -> Option<(&str, Option<&str>)> {
    let bare = arg.trim_start_matches('-');
    if bare.len() == arg.len() || bare.is_empty() {
        return None;
    }
    match bare.split_once('=') {
        Some((name, value)) => Some((name, Some(value))),
        None => Some((bare, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split(' ').map(String::from).collect()
    }

    #[test]
    fn secret_names_by_word_ending() {
        for name in [
            "api-key",
            "hf-token",
            "ENGINE_SECRET",
            "OPENAI_API_KEY",
            "apikey",
            "db_password",
            "api-keys",
        ] {
            assert!(is_secret_name(name), "{name}");
        }
        for name in [
            "port",
            "max-num-batched-tokens",
            "n-keep",
            "keyframe",
            "model",
        ] {
            assert!(!is_secret_name(name), "{name}");
        }
    }

    #[test]
    fn flag_values_are_masked_in_both_spellings() {
        let shown = mask_secret_values(&argv(
            "llama-server --api-key s3cret --hf-token=hf_abc -m /m.gguf --port 9000",
        ));
        assert_eq!(
            shown.join(" "),
            "llama-server --api-key *** --hf-token=*** -m /m.gguf --port 9000"
        );
    }

    #[test]
    fn a_flag_followed_by_a_flag_masks_nothing() {
        let shown = mask_secret_values(&argv("srv --api-key --verbose"));
        assert_eq!(shown.join(" "), "srv --api-key --verbose");
    }

    #[test]
    fn secret_flag_values_are_collected() {
        let values = secret_values(&argv("srv --api-key s3cret --token=t0ken --port 1"));
        assert_eq!(values, ["s3cret", "t0ken"]);
    }

    #[test]
    fn secret_assignments_before_the_program_are_masked() {
        let cmd = argv("env HF_TOKEN=hf_abc AWS_SECRET_ACCESS_KEY=aws/s AWS_SESSION_TOKEN=st CUDA_VISIBLE_DEVICES=0 vllm serve m");
        assert_eq!(
            mask_secret_values(&cmd).join(" "),
            "env HF_TOKEN=*** AWS_SECRET_ACCESS_KEY=*** AWS_SESSION_TOKEN=*** CUDA_VISIBLE_DEVICES=0 vllm serve m"
        );
        assert_eq!(secret_values(&cmd), ["hf_abc", "aws/s", "st"]);
        // docker's `-e`, and a reference that shows no secret
        let docker = argv("docker run -e HF_TOKEN=hf_abc -e HF_TOKEN=$HF_TOKEN img");
        assert_eq!(
            mask_secret_values(&docker).join(" "),
            "docker run -e HF_TOKEN=*** -e HF_TOKEN=$HF_TOKEN img"
        );
    }

    #[test]
    fn secret_assignments_in_a_shell_script_are_masked() {
        let cmd = vec![
            "sh".to_string(),
            "-c".into(),
            "HF_TOKEN='hf abc' API_KEY=k3y THREADS=8 exec vllm --url=http://h?x=y".into(),
        ];
        assert_eq!(
            mask_secret_values(&cmd)[2],
            "HF_TOKEN=*** API_KEY=*** THREADS=8 exec vllm --url=http://h?x=y"
        );
        assert_eq!(secret_values(&cmd), ["hf abc", "k3y"]);
    }

    #[test]
    fn a_flag_value_that_looks_like_an_assignment_is_masked_once() {
        let cmd = argv("srv --token HF_TOKEN=abc --port 1");
        assert_eq!(
            mask_secret_values(&cmd).join(" "),
            "srv --token *** --port 1"
        );
    }

    #[test]
    fn known_values_are_masked_anywhere_longest_first() {
        let r = Redactor::new(["abcd".to_string(), "abcdef".into(), "x".into()]);
        assert_eq!(r.text("see abcdef and abcd, x"), "see *** and ***, x");
        assert_eq!(
            r.command_line(&argv("srv --auth=Bearer:abcdef --port 1")),
            "srv --auth=Bearer:*** --port 1"
        );
        assert_eq!(
            r.bytes(bytes::Bytes::from_static(b"\xffabcd\n")),
            &b"\xff***\n"[..]
        );
        assert!(Redactor::default().is_empty());
        assert_eq!(Redactor::default().text("abcd"), "abcd");
    }
}
