//! YAML text into corral's config loader: any input gives a config or a config error, never a
//! panic, a stack overflow or unbounded memory (nesting and aliases are limited).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // Every `${env.X}` resolves, so the fuzzer gets past substitution into the tree.
    let env = |name: &str| Some(format!("env-{name}"));
    match corral::config::load_str("fuzz.yaml", text, &env) {
        Ok(loaded) => {
            let _ = loaded.config.models.len();
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
