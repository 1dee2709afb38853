//! What a reload may not do to a running corral.
//!
//! A reload applies whatever the files hold at that moment. An editor that truncates a file before
//! writing it, or a half-finished edit, can leave a config with no models, without `apiKeys` or
//! without `security.cors`; applied, it would stop every engine, open `/logs`, `/metrics` and the
//! API to anyone, or let every site's pages read answers again. Each is legitimate as a start, so a
//! restart does them on purpose, and a reload refuses them.

use super::Config;

/// The new config, or why it may not replace the running one.
pub fn check(running: &Config, next: Config) -> Result<Config, String> {
    if next.models.is_empty() && !running.models.is_empty() {
        return Err(
            "the new config has no models and would stop every running one; restart corral to do that on purpose"
                .into(),
        );
    }
    if next.api_keys.is_empty() && !running.api_keys.is_empty() {
        return Err(
            "the new config has no apiKeys and would turn API key checks off; restart corral to do that on purpose"
                .into(),
        );
    }
    if next.cors.is_none() && running.cors.is_some() {
        return Err(
            "the new config has no security.cors and would let every origin read answers again; restart corral to do that on purpose"
                .into(),
        );
    }
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml: &str) -> Config {
        crate::config::load_str("t.yaml", yaml, &|_| None)
            .unwrap()
            .config
    }

    const MODEL: &str = "models:\n  m: {cmd: srv, proxy: 'http://127.0.0.1:9'}\n";

    #[test]
    fn a_reload_may_not_drop_every_model() {
        let err = check(&config(MODEL), config("")).unwrap_err();
        assert!(
            err.contains("no models") && err.contains("restart"),
            "{err}"
        );
        assert!(check(&config(""), config("")).is_ok(), "nothing to stop");
    }

    #[test]
    fn a_reload_may_not_turn_api_keys_off() {
        let keyed = config(&format!("apiKeys: [k1]\n{MODEL}"));
        let err = check(&keyed, config(MODEL)).unwrap_err();
        assert!(err.contains("apiKeys") && err.contains("restart"), "{err}");
        let other_key = config(&format!("apiKeys: [k2]\n{MODEL}"));
        assert!(check(&keyed, other_key).is_ok(), "changing keys is fine");
        assert!(
            check(&config(MODEL), keyed).is_ok(),
            "turning keys on is fine"
        );
    }

    #[test]
    fn a_reload_may_not_drop_the_cors_policy() {
        let with = "security:\n  cors:\n    allowedOrigins: ['https://app.example']\n";
        let err = check(&config(&format!("{with}{MODEL}")), config(MODEL)).unwrap_err();
        assert!(
            err.contains("security.cors") && err.contains("restart"),
            "{err}"
        );
        let changed = "security:\n  cors:\n    allowedOrigins: ['https://b.example']\n";
        assert!(check(
            &config(&format!("{with}{MODEL}")),
            config(&format!("{changed}{MODEL}"))
        )
        .is_ok());
        assert!(check(&config(MODEL), config(&format!("{with}{MODEL}"))).is_ok());
    }
}
