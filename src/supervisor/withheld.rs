//! What an engine does not inherit from corral's environment: the variables that hold corral's
//! own keys, found by value.

use super::ProcessSpec;

/// The names among `vars` (corral's environment) whose value is one of `secrets` (its API keys
/// and peer keys), a trailing newline aside. Values are compared, not names: `apiKeys:
/// ["${env.KEY}"]` keeps `KEY` from the engines, and so does any other variable that holds the
/// same key. An engine that inherited them could read the keys that guard corral.
pub fn holding_secrets(
    vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
    secrets: &[&str],
) -> Vec<std::ffi::OsString> {
    let secret = |value: &std::ffi::OsStr| {
        let value = value.as_encoded_bytes();
        let trimmed = value.trim_ascii();
        secrets
            .iter()
            .any(|s| !s.is_empty() && (value == s.as_bytes() || trimmed == s.as_bytes()))
    };
    vars.into_iter()
        .filter(|(_, value)| secret(value))
        .map(|(name, _)| name)
        .collect()
}

/// Keeps the variables `spec` withholds out of what `cmd` inherits (before its own `env` is set,
/// which wins).
pub(super) fn withhold(cmd: &mut tokio::process::Command, spec: &ProcessSpec) {
    for name in &spec.withheld {
        cmd.env_remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_holding_a_secret_are_found_by_value() {
        let vars = [
            ("KEY", "k-secret"),
            ("COPY_OF_KEY", "k-secret\n"),
            ("PEER", "p-secret"),
            ("OTHER", "k-secret-not"),
            ("EMPTY", ""),
        ]
        .map(|(k, v)| (k.into(), v.into()));
        let names = holding_secrets(vars, &["k-secret", "p-secret", ""]);
        assert_eq!(names, ["KEY", "COPY_OF_KEY", "PEER"]);
    }
}
