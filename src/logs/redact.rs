//! Secrets never shown: one redaction used wherever a command line or log text leaves corral
//! (`/running`, `/logs`, `/api/events`, its own log lines, `corral check`).
//!
//! Two rules. A command-line value after a flag whose name looks secret (`--api-key X`,
//! `--api-key=X`, `--hf-token X`) is shown as `***`. And every value known to be secret is replaced
//! wherever it appears: values of secret-named `${env.X}` substitutions, of secret-named `env:`
//! entries, and of secret flags in any model's command, so an engine that echoes its key in its own
//! output is redacted too.

use aho_corasick::{AhoCorasick, MatchKind};

/// What a redacted value is shown as.
pub const MASK: &str = "***";

/// Secret values shorter than this are not searched for in text: a two-character "secret" would mask
/// half of every log line, and is no secret anyway.
const MIN_SECRET_LEN: usize = 4;

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

    /// `argv` with the values of secret flags and every known secret value masked.
    pub fn argv(&self, argv: &[String]) -> Vec<String> {
        mask_secret_flags(argv)
            .into_iter()
            .map(|arg| self.text(&arg).into_owned())
            .collect()
    }

    /// The masked `argv` joined with spaces, as `/running` and the log lines show a command.
    pub fn command_line(&self, argv: &[String]) -> String {
        self.argv(argv).join(" ")
    }
}

/// Where a secret flag's value sits in a command line.
enum SecretValue {
    /// The whole argument after `--api-key`.
    Arg(usize),
    /// The part of `--api-key=X` after this byte offset.
    Inline(usize, usize),
}

fn secret_values_in(argv: &[String]) -> Vec<SecretValue> {
    let mut found = Vec::new();
    for (i, arg) in argv.iter().enumerate() {
        let Some((name, inline)) = flag_name(arg) else {
            continue;
        };
        if !is_secret_name(name) {
            continue;
        }
        match inline {
            Some(_) => found.push(SecretValue::Inline(i, arg.find('=').map_or(0, |e| e + 1))),
            // a flag right after it means this one took no value
            None if argv.get(i + 1).is_some_and(|next| !next.starts_with("--")) => {
                found.push(SecretValue::Arg(i + 1))
            }
            None => {}
        }
    }
    found
}

/// `argv` with the value of every secret-named flag masked: `--api-key X` and `--api-key=X`.
pub fn mask_secret_flags(argv: &[String]) -> Vec<String> {
    let mut out = argv.to_vec();
    for at in secret_values_in(argv) {
        match at {
            SecretValue::Arg(i) => out[i] = MASK.to_string(),
            SecretValue::Inline(i, from) => out[i] = format!("{}{MASK}", &argv[i][..from]),
        }
    }
    out
}

/// The values that secret-named flags take in `argv`.
pub fn secret_flag_values(argv: &[String]) -> Vec<String> {
    secret_values_in(argv)
        .into_iter()
        .map(|at| match at {
            SecretValue::Arg(i) => argv[i].clone(),
            SecretValue::Inline(i, from) => argv[i][from..].to_string(),
        })
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
        let shown = mask_secret_flags(&argv(
            "llama-server --api-key s3cret --hf-token=hf_abc -m /m.gguf --port 9000",
        ));
        assert_eq!(
            shown.join(" "),
            "llama-server --api-key *** --hf-token=*** -m /m.gguf --port 9000"
        );
    }

    #[test]
    fn a_flag_followed_by_a_flag_masks_nothing() {
        let shown = mask_secret_flags(&argv("srv --api-key --verbose"));
        assert_eq!(shown.join(" "), "srv --api-key --verbose");
    }

    #[test]
    fn secret_flag_values_are_collected() {
        let values = secret_flag_values(&argv("srv --api-key s3cret --token=t0ken --port 1"));
        assert_eq!(values, ["s3cret", "t0ken"]);
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
