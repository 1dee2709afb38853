//! The loading pipeline against llama-swap's rules (COMPAT.md §1.1-1.4).

use super::*;
use std::collections::HashMap;

fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

fn load(yaml: &str) -> Config {
    load_str("t.yaml", yaml, &|_| None).unwrap().config
}

fn load_err(yaml: &str) -> String {
    load_str("t.yaml", yaml, &|_| None).unwrap_err().to_string()
}

fn key_strings(c: &Config) -> Vec<&str> {
    c.api_keys.iter().map(|k| k.key.as_str()).collect()
}

#[test]
fn ports_go_in_sorted_id_order_only_to_models_whose_cmd_uses_them() {
    let c = load(
        "startPort: 9000\nmodels:\n  zed: {cmd: 'srv --port ${PORT}'}\n  alpha: {cmd: 'srv --port ${PORT}'}\n  fixed: {cmd: 'srv --port 7777', proxy: 'http://127.0.0.1:7777'}\n  mid: {cmd: 'srv -p ${PORT}'}\n",
    );
    assert_eq!(c.models["alpha"].argv, ["srv", "--port", "9000"]);
    assert_eq!(c.models["mid"].argv, ["srv", "-p", "9001"]);
    assert_eq!(c.models["zed"].argv, ["srv", "--port", "9002"]);
    assert_eq!(c.models["zed"].proxy, "http://localhost:9002");
    assert_eq!(c.models["fixed"].port, Some(7777));
}

#[test]
fn proxy_port_without_cmd_port_is_an_error() {
    let err = load_err("models:\n  m:\n    cmd: srv --port 8000\n");
    assert!(err.contains("proxy uses ${PORT} but cmd does not"), "{err}");
}

#[test]
fn macros_resolve_last_declared_first_so_later_ones_see_earlier_ones() {
    let c = load(
        "macros:\n  bin: /opt/llama-server\n  base: '${bin} --host 127.0.0.1'\nmodels:\n  m:\n    cmd: '${base} --port ${PORT} --alias ${MODEL_ID}'\n",
    );
    assert_eq!(
        c.models["m"].argv,
        [
            "/opt/llama-server",
            "--host",
            "127.0.0.1",
            "--port",
            "5800",
            "--alias",
            "m"
        ]
    );
}

#[test]
fn forward_macro_references_are_unknown() {
    let err = load_err(
        "macros:\n  a: '${b}'\n  b: x\nmodels:\n  m: {cmd: '${a}', proxy: 'http://h:1'}\n",
    );
    assert!(
        err.contains("unknown macro '${b}'") && err.contains("t.yaml:5"),
        "{err}"
    );
}

#[test]
fn model_macros_override_globals_and_keep_their_type() {
    let c = load(
        "macros:\n  ctx: 4096\nmodels:\n  m:\n    macros: {ctx: 8192}\n    cmd: 'srv -c ${ctx}'\n    proxy: 'http://h:1'\n    metadata: {ctx: '${ctx}', label: 'ctx=${ctx}', '${ctx}': literal-key}\n",
    );
    let m = &c.models["m"];
    assert_eq!(m.argv, ["srv", "-c", "8192"]);
    assert_eq!(m.metadata["ctx"], serde_json::json!(8192));
    assert_eq!(m.metadata["label"], serde_json::json!("ctx=8192"));
    assert!(m.metadata.contains_key("${ctx}"));
}

#[test]
fn port_macro_is_an_integer_in_metadata() {
    let c = load("models:\n  m:\n    cmd: 'srv --port ${PORT}'\n    metadata: {port: '${PORT}'}\n");
    assert_eq!(c.models["m"].metadata["port"], serde_json::json!(5800));
}

#[test]
fn reserved_and_invalid_macro_names_are_rejected() {
    assert!(load_err("macros: {PORT: 1}\nmodels: {}\n").contains("reserved"));
    assert!(load_err("macros: {'bad name': 1}\nmodels: {}\n").contains("must match"));
    assert!(load_err("macros: {a: '${a}x'}\nmodels: {}\n").contains("references itself"));
}

#[test]
fn comment_lines_and_continuations_in_cmd() {
    let c = load("models:\n  m:\n    proxy: 'http://h:1'\n    cmd: |\n      srv \\\n        # a comment line\n        --flag 'two words' \\\n        --x\n");
    assert_eq!(c.models["m"].argv, ["srv", "--flag", "two words", "--x"]);
}

#[test]
fn env_substitution_happens_first_and_ignores_comments() {
    let env = env_of(&[("KEY", "k1"), ("BIN", "/bin/srv")]);
    let yaml = "# ${env.UNSET} in a comment is fine\napiKeys: [${env.KEY}]\nmodels:\n  m: {cmd: '${env.BIN} --x', proxy: 'http://h:1'} # ${env.ALSO_UNSET}\n";
    let c = load_str("t.yaml", yaml, &env).unwrap().config;
    assert_eq!(key_strings(&c), ["k1"]);
    assert_eq!(c.models["m"].argv[0], "/bin/srv");
    let err = load_str("t.yaml", "apiKeys: [${env.NOPE}]\n", &env)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("t.yaml:1:11") && err.contains("'NOPE' is not set"),
        "{err}"
    );
}

/// A value with quotes or backslashes reaches a command as llama-swap passes it: escaped where
/// it lands, so an unquoted JSON value keeps its quotes and a double-quoted string stays one.
#[test]
fn env_values_with_quotes_reach_the_command_whole() {
    let env = env_of(&[("KW", r#"{"a":1}"#), ("DIR", r"C:\m")]);
    let yaml = "models:\n  m:\n    cmd: srv --kw ${env.KW} --dir ${env.DIR}\n    proxy: 'http://h:1'\n  n:\n    cmd: \"srv --x ${env.KW}\"\n    proxy: 'http://h:1'\n";
    let c = load_str("t.yaml", yaml, &env).unwrap().config;
    assert_eq!(
        c.models["m"].argv,
        ["srv", "--kw", r#"{"a":1}"#, "--dir", r"C:\m"]
    );
    assert_eq!(c.models["n"].argv, ["srv", "--x", "{a:1}"]);
}

/// An apostrophe inside a plain value opens no string: the comment after it is still one, and a
/// reference there is not substituted.
#[test]
fn an_apostrophe_in_a_value_leaves_the_comment_a_comment() {
    let yaml = "models:\n  m:\n    cmd: srv\n    proxy: 'http://h:1'\n    description: Meta's model  # ${env.UNSET}\n";
    let c = load_str("t.yaml", yaml, &env_of(&[])).unwrap().config;
    assert_eq!(c.models["m"].description.as_deref(), Some("Meta's model"));
}

#[test]
fn cmd_stop_keeps_pid_for_stop_time() {
    let c = load("models:\n  m: {cmd: 'srv', proxy: 'http://h:1', cmdStop: 'kill -TERM ${PID}'}\n");
    assert_eq!(
        c.models["m"].cmd_stop.as_deref().unwrap(),
        ["kill", "-TERM", "${PID}"]
    );
    assert!(
        load_err("models:\n  m: {cmd: 'srv ${PID}', proxy: 'http://h:1'}\n")
            .contains("unknown macro '${PID}'")
    );
}

#[test]
fn several_files_merge_with_llama_swap_rules() {
    let a = "apiKeys: [a]\nmacros: {x: 1}\nmodels:\n  m1: {cmd: srv, proxy: 'http://h:1'}\n";
    let b = "apiKeys: [b]\nmacros: {y: 2}\nmodels:\n  m2: {cmd: srv, proxy: 'http://h:2'}\n";
    let texts = vec![
        (Arc::from("a.yaml"), a.to_string()),
        (Arc::from("b.yaml"), b.to_string()),
    ];
    let c = load_texts(&texts, &|_| None).unwrap().config;
    assert_eq!(key_strings(&c), ["a", "b"]);
    assert_eq!(c.models.len(), 2);
    let dup = vec![
        (Arc::from("a.yaml"), a.to_string()),
        (Arc::from("c.yaml"), a.replace("apiKeys: [a]", "")),
    ];
    let err = load_texts(&dup, &|_| None).unwrap_err().to_string();
    assert!(err.contains("duplicate models \"m1\""), "{err}");
    let conflict = vec![
        (Arc::from("a.yaml"), "healthCheckTimeout: 30\n".to_string()),
        (Arc::from("b.yaml"), "healthCheckTimeout: 60\n".to_string()),
    ];
    assert!(load_texts(&conflict, &|_| None)
        .unwrap_err()
        .to_string()
        .contains("conflict at \"healthCheckTimeout\""));
}

#[test]
fn defaults_follow_llama_swap() {
    let c = load("healthCheckTimeout: 5\nglobalTTL: 60\nmodels:\n  a: {cmd: srv, proxy: 'http://h:1'}\n  b: {cmd: srv, proxy: 'http://h:1', ttl: 0, concurrencyLimit: 3}\n");
    assert_eq!(
        c.health_check_timeout,
        Duration::from_secs(15),
        "clamped to 15"
    );
    assert_eq!(c.models["a"].ttl, Some(Duration::from_secs(60)));
    assert_eq!(c.models["b"].ttl, None);
    assert_eq!(c.models["a"].concurrency_limit, 10);
    assert_eq!(c.models["b"].concurrency_limit, 3);
    assert_eq!(c.models["a"].unload_timeout, Duration::from_secs(10));
    assert_eq!(c.models["a"].check_endpoint.as_deref(), Some("/health"));
    assert_eq!(c.groups.len(), 1);
    assert_eq!(c.groups[0].id, DEFAULT_GROUP);
}

#[test]
fn groups_in_both_spellings_and_their_errors() {
    let models =
        "models:\n  a: {cmd: srv, proxy: 'http://h:1'}\n  b: {cmd: srv, proxy: 'http://h:1'}\n";
    let legacy = load(&format!(
        "{models}groups:\n  g: {{swap: false, members: [a]}}\n"
    ));
    let routed = load(&format!("{models}routing:\n  router:\n    settings:\n      groups:\n        g: {{swap: false, members: [a]}}\n"));
    for c in [legacy, routed] {
        assert_eq!(c.group_of("a").id, "g");
        assert!(!c.group_of("a").swap);
        assert_eq!(c.group_of("b").id, DEFAULT_GROUP);
    }
    assert!(
        load_err(&format!("{models}groups:\n  g: {{members: [a, a]}}\n")).contains("listed twice")
    );
    assert!(load_err(&format!(
        "{models}groups:\n  g: {{members: [a]}}\n  h: {{members: [a]}}\n"
    ))
    .contains("already in group"));
    assert!(
        load_err(&format!("{models}groups:\n  g: {{members: [zz]}}\n"))
            .contains("no model config for \"zz\"")
    );
    let both = format!("{models}groups: {{}}\nrouting:\n  router:\n    use: group\n");
    assert!(load_err(&both).contains("cannot be combined"));
}

#[test]
fn aliases_and_set_params_by_id_keys_must_be_unique() {
    let c = load("models:\n  a:\n    cmd: srv\n    proxy: 'http://h:1'\n    aliases: [x]\n    filters:\n      setParamsByID:\n        '${MODEL_ID}:high': {temperature: 1}\n");
    assert_eq!(c.real_model_name("a:high"), Some("a"));
    assert_eq!(c.real_model_name("x"), Some("a"));
    let err = load_err("models:\n  a: {cmd: srv, proxy: 'http://h:1', aliases: [x]}\n  b: {cmd: srv, proxy: 'http://h:1', aliases: [x]}\n");
    assert!(err.contains("alias \"x\" is also used"), "{err}");
}

#[test]
fn type_errors_name_file_line_and_key() {
    let err = load_err("models:\n  m:\n    cmd: srv\n    proxy: 'http://h:1'\n    ttl: soon\n");
    assert_eq!(
        err,
        "t.yaml:5:10: models.m.ttl: must be an integer, not a string"
    );
    let err = load_err("logToStdout: sometimes\n");
    assert_eq!(
        err,
        "t.yaml:1:14: logToStdout must be none, both, or a comma separated list of proxy, \
         upstream, http; got \"sometimes\""
    );
}

#[test]
fn unknown_keys_are_warnings_that_name_them() {
    let loaded = load_str(
        "t.yaml",
        "models:\n  m: {cmd: srv, proxy: 'http://h:1', tll: 5}\nfancy: 1\n",
        &|_| None,
    )
    .unwrap();
    assert!(
        loaded.warnings.iter().any(|w| w.contains("models.m.tll")),
        "{:?}",
        loaded.warnings
    );
    assert!(
        loaded
            .warnings
            .iter()
            .any(|w| w.contains("t.yaml:3:8: unknown key fancy")),
        "{:?}",
        loaded.warnings
    );
}

#[test]
fn validation_of_values() {
    assert!(load_err("apiKeys: ['has space']\n").contains("no spaces"));
    assert!(load_err("performance: {every: 1s}\n").contains("at least 5s"));
    assert!(load_err("upstream: {ignorePaths: ['(']}\n").contains("invalid regex"));
    assert!(load_err(
        "models:\n  m: {cmd: srv, proxy: 'http://h:1', capabilities: {in: [smell]}}\n"
    )
    .contains("\"smell\""));
    assert!(
        load_err("models:\n  m: {cmd: 'srv \"unbalanced', proxy: 'http://h:1'}\n")
            .contains("unbalanced")
    );
    assert!(load_err("models:\n  m: {proxy: 'http://h:1'}\n").contains("empty command"));
    assert!(load_err("peers:\n  p: {models: [x]}\n").contains("needs a proxy"));
    let bad_peer_filter =
        load_err("peers:\n  p: {proxy: 'http://h:1', models: [x], filters: {setParams: 5}}\n");
    assert!(
        bad_peer_filter.contains("must be a mapping"),
        "{bad_peer_filter}"
    );
    assert!(
        load_err("selectors:\n  s: {strategy: random, targets: [a]}\n")
            .contains("warm, pin or spillover")
    );
}

#[test]
fn go_durations() {
    assert_eq!(
        decode::parse_go_duration("1m30s"),
        Some(Duration::from_secs(90))
    );
    assert_eq!(
        decode::parse_go_duration("500ms"),
        Some(Duration::from_millis(500))
    );
    assert_eq!(decode::parse_go_duration("5"), None);
}

#[test]
fn stream_idle_limit_defaults_to_ten_minutes_and_zero_turns_it_off() {
    let c = load(
        "models:\n  a: {cmd: 'srv --port ${PORT}'}\n  b:\n    cmd: 'srv --port ${PORT}'\n    timeouts: {streamIdle: 0}\n  c:\n    cmd: 'srv --port ${PORT}'\n    timeouts: {streamIdle: 5}\n",
    );
    assert_eq!(
        c.models["a"].timeouts.stream_idle,
        Some(Duration::from_secs(600))
    );
    assert_eq!(c.models["b"].timeouts.stream_idle, None);
    assert_eq!(
        c.models["c"].timeouts.stream_idle,
        Some(Duration::from_secs(5))
    );
}

#[test]
fn peer_urls_with_credentials_are_refused() {
    let err = load_err("peers:\n  p:\n    proxy: http://user:pw@host:9000\n    models: [m]\n");
    assert!(err.contains("apiKey"), "{err}");
}

#[test]
fn api_keys_are_plain_admin_keys_or_scoped() {
    let c = load(
        "apiKeys:\n  - plain\n  - {key: inf, scope: inference}\n  - {key: met, scope: metrics}\n  - {key: adm, scope: admin}\n  - {key: dflt}\n",
    );
    let scopes: Vec<(&str, Scope)> = c
        .api_keys
        .iter()
        .map(|k| (k.key.as_str(), k.scope))
        .collect();
    assert_eq!(
        scopes,
        [
            ("plain", Scope::Admin),
            ("inf", Scope::Inference),
            ("met", Scope::Metrics),
            ("adm", Scope::Admin),
            ("dflt", Scope::Admin),
        ]
    );
}

#[test]
fn api_key_errors_name_the_entry() {
    let bad_scope = load_err("apiKeys:\n  - ok\n  - {key: k, scope: root}\n");
    assert_eq!(
        bad_scope,
        "t.yaml:3:21: apiKeys[1].scope: must be admin, inference or metrics, not \"root\""
    );
    let no_key = load_err("apiKeys:\n  - {scope: metrics}\n");
    assert!(
        no_key.starts_with("t.yaml:2:5: apiKeys[0].key:"),
        "{no_key}"
    );
    assert!(no_key.contains("needs `key`"), "{no_key}");
    let spaced = load_err("apiKeys:\n  - {key: 'a b', scope: inference}\n");
    assert!(
        spaced.contains("apiKeys[0].key: keys must be non-empty"),
        "{spaced}"
    );
    let bad_name = load_err("apiKeys:\n  - {key: k, name: 'my app'}\n");
    assert!(
        bad_name.contains("apiKeys[0].name: must be 1 to 64"),
        "{bad_name}"
    );
    let empty_model = load_err("apiKeys:\n  - {key: k, models: [chat, '']}\n");
    assert!(empty_model.contains("apiKeys[0].models"), "{empty_model}");
    let host = load_err("allowedHosts: ['http://corral.lan']\n");
    assert!(
        host.contains("allowedHosts") && host.contains("no scheme"),
        "{host}"
    );
}

#[test]
fn keys_carry_names_and_model_lists_and_access_settings_load() {
    let yaml = "apiKeys:\n  - {key: k1, scope: inference, name: apps, models: [chat, 'gpu2/*']}\n  - k2\nopenMetrics: true\nallowedHosts: [Corral.LAN]\n";
    let c = crate::config::load_str("t.yaml", yaml, &|_| None).unwrap();
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    let c = c.config;
    assert_eq!(c.api_keys[0].name.as_deref(), Some("apps"));
    assert_eq!(c.api_keys[0].models, ["chat", "gpu2/*"]);
    assert_eq!(c.api_keys[1].name, None);
    assert!(c.api_keys[1].models.is_empty());
    assert!(c.open_metrics);
    assert_eq!(c.allowed_hosts, ["corral.lan"]);
}

#[test]
fn secret_env_substitutions_and_flags_are_known_to_the_redactor() {
    let env = env_of(&[("ENGINE_SECRET", "sub-s3cret"), ("MODEL_DIR", "/models")]);
    let yaml = "models:\n  m:\n    cmd: srv --auth ${env.ENGINE_SECRET} --hf-token=hf_literal -m ${env.MODEL_DIR}/x.gguf\n    proxy: 'http://h:1'\n    env: [\"DB_PASSWORD=pw-value\", \"THREADS=8\"]\n";
    let c = load_str("t.yaml", yaml, &env).unwrap().config;
    let shown = c.redactor.command_line(&c.models["m"].argv);
    assert_eq!(shown, "srv --auth *** --hf-token=*** -m /models/x.gguf");
    assert_eq!(
        c.redactor.text("engine says pw-value and hf_literal and 8"),
        "engine says *** and *** and 8"
    );
}

#[test]
fn engine_env_env_prefixes_and_corrals_credentials_are_known_to_the_redactor() {
    let env = env_of(&[
        ("HF_TOKEN", "hf_from_corral"),
        ("AWS_SESSION_TOKEN", "aws-session"),
    ]);
    let yaml = "engines:\n  llama_cpp: {env: {LLAMA_API_KEY: engine-env-key, THREADS: '8'}}\nmodels:\n  e:\n    engine: llama_cpp\n    source: /m.gguf\n  m:\n    cmd: env HF_TOKEN=hf_prefixed CUDA_VISIBLE_DEVICES=1 vllm serve x\n    proxy: 'http://h:1'\n";
    let c = load_str("t.yaml", yaml, &env).unwrap().config;
    assert_eq!(
        c.redactor.command_line(&c.models["m"].argv),
        "env HF_TOKEN=*** CUDA_VISIBLE_DEVICES=1 vllm serve x"
    );
    assert_eq!(
        c.redactor
            .text("hf_prefixed engine-env-key hf_from_corral aws-session 8"),
        "*** *** *** *** 8"
    );
}

fn nested_list(depth: usize) -> String {
    format!("{}x\n", "- ".repeat(depth))
}

#[test]
fn nesting_up_to_the_limit_parses_and_deeper_is_a_located_error() {
    let file: Arc<str> = Arc::from("t.yaml");
    assert!(yaml::parse(&nested_list(yaml::MAX_DEPTH), &file).is_ok());
    let err = yaml::parse(&nested_list(yaml::MAX_DEPTH + 1), &file)
        .unwrap_err()
        .to_string();
    let col = 2 * yaml::MAX_DEPTH + 1;
    assert_eq!(
        err,
        format!("t.yaml:1:{col}: lists and mappings nest deeper than 128 levels")
    );
}

/// 20,000 levels once overflowed the stack; now the first level too many stops the parse.
#[test]
fn very_deep_nesting_is_refused_without_overflowing_the_stack() {
    let block = load_err(&format!(
        "models:\n  m:\n    metadata:\n      {}",
        nested_list(20_000)
    ));
    assert!(
        block.starts_with("t.yaml:4:") && block.contains("deeper than 128"),
        "{block}"
    );
    let flow = format!("a: {}{}\n", "[".repeat(20_000), "]".repeat(20_000));
    let flow = load_err(&flow);
    // yaml-rust2's scanner reads flow brackets ahead of the parser and has its own limit.
    assert!(
        flow.starts_with("t.yaml:1:") && flow.contains("recursion limit exceeded"),
        "{flow}"
    );
    let maps = format!(
        "a:\n{}",
        (1..1_000)
            .map(|i| format!("{}k:\n", " ".repeat(i)))
            .collect::<String>()
    );
    let maps = load_err(&maps);
    assert!(maps.contains("deeper than 128"), "{maps}");
}

/// "Billion laughs": each line nine aliases of the one before, 10^9 values from 400 bytes.
#[test]
fn alias_bombs_stop_at_the_alias_that_passes_the_budget() {
    let mut yaml = String::from("a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for (prev, name) in ["a", "b", "c", "d", "e", "f", "g", "h"]
        .iter()
        .zip(["b", "c", "d", "e", "f", "g", "h", "i"])
    {
        let refs = vec![format!("*{prev}"); 9].join(", ");
        yaml.push_str(&format!("{name}: &{name} [{refs}]\n"));
    }
    let err = load_err(&yaml);
    assert_eq!(
        err, "t.yaml:6:8: aliases expand to more than 100000 values",
        "the first *e on line f takes the copies past the budget"
    );
}

/// An alias may not nest its anchor deeper than the limit either.
#[test]
fn an_alias_cannot_carry_nesting_past_the_limit() {
    let deep = nested_list(100);
    let yaml = format!("a: &deep\n  {deep}b:\n{}*deep\n", "  - ".repeat(40));
    let err = load_err(&yaml);
    assert!(err.contains("deeper than 128 levels"), "{err}");
}

/// Sharing a template between models, the way aliases are meant to be used, stays well inside.
#[test]
fn aliases_of_a_template_still_load() {
    let mut yaml = String::from("models:\n");
    for i in 0..200 {
        yaml.push_str(&format!(
            "  m{i}:\n    cmd: srv --port ${{PORT}}\n    metadata: {}\n",
            if i == 0 {
                "&meta {a: [1, 2, 3], b: {c: d}}"
            } else {
                "*meta"
            }
        ));
    }
    let c = load(&yaml);
    assert_eq!(c.models.len(), 200);
    assert_eq!(
        c.models["m199"].metadata["b"],
        serde_json::json!({"c": "d"})
    );
}

/// Ten macros, each using the one before ten times: 10^10 bytes unless substitution is bounded.
fn macro_bomb(use_in: &str) -> String {
    let mut yaml = String::from("macros:\n  m0: xxxxxxxxxx\n");
    for i in 1..10 {
        let refs = format!("${{m{}}}", i - 1).repeat(10);
        yaml.push_str(&format!("  m{i}: '{refs}'\n"));
    }
    yaml.push_str(&format!("models:\n  m:\n    proxy: 'http://h:1'\n{use_in}"));
    yaml
}

#[test]
fn macro_expansion_is_bounded_and_names_where_it_went_over() {
    let err = load_err(&macro_bomb("    cmd: 'srv ${m9}'\n"));
    assert_eq!(err, "t.yaml:15:10: macros expand to more than 16 MiB");
    let err = load_err(&macro_bomb(
        "    cmd: srv\n    filters:\n      setParamsByID:\n        '${m9}': {a: 1}\n",
    ));
    assert!(
        err.starts_with("t.yaml:18:") && err.contains("more than 16 MiB"),
        "{err}"
    );
}

/// At the nesting limit, the whole pipeline (macros, decoding, metadata to JSON, dropping) fits in a
/// quarter of the 2 MiB stack a reload runs on.
#[test]
fn a_config_at_the_nesting_limit_loads_on_a_small_stack() {
    let depth = yaml::MAX_DEPTH - 4; // root, models, m, metadata
    let (open, close) = ("[".repeat(depth), "]".repeat(depth));
    let yaml = format!(
        "macros:\n  x: y\nmodels:\n  m:\n    cmd: 'srv ${{x}}'\n    proxy: 'http://h:1'\n    metadata:\n      deep: {open}'${{x}}'{close}\n"
    );
    let deepest = std::thread::Builder::new()
        .stack_size(512 * 1024)
        .spawn(move || {
            let config = load(&yaml);
            let mut value = &config.models["m"].metadata["deep"];
            let mut levels = 0;
            while let Some(inner) = value.get(0) {
                value = inner;
                levels += 1;
            }
            (levels, value.clone())
        })
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(deepest, (depth, serde_json::json!("y")));
}

/// `checkEndpoint` means the same for a model and for each of its replicas, as llama-swap reads
/// it: absent or null is `/health`, `none` is no check, an empty value is the proxy's root.
#[test]
fn check_endpoint_means_the_same_for_a_model_and_its_replicas() {
    let cases = [
        (None, Some("/health")),
        (Some("~"), Some("/health")),
        (Some("''"), Some("/")),
        (Some("'  '"), Some("/")),
        (Some("none"), None),
        (Some("' none '"), None),
        (Some("status"), Some("/status")),
        (Some("/v1/models"), Some("/v1/models")),
    ];
    for (value, expected) in cases {
        let key = value.map_or(String::new(), |v| format!("    checkEndpoint: {v}\n"));
        let c = load(&format!(
            "models:\n  one:\n    cmd: srv --port ${{PORT}}\n{key}  pool:\n    cmd: srv --port ${{PORT}}\n    replicas: 2\n{key}"
        ));
        let one = &c.models["one"];
        let pool = &c.models["pool"];
        assert_eq!(one.check_endpoint.as_deref(), expected, "{value:?}");
        assert_eq!(pool.check_endpoint.as_deref(), expected, "{value:?}");
        assert_eq!(pool.instances.len(), 2);
        for spec in one.instances.iter().chain(&pool.instances) {
            assert_eq!(
                spec.check_endpoint.as_deref(),
                expected,
                "{value:?} {}",
                spec.id
            );
        }
    }
}

#[test]
fn devices_say_how_an_engine_is_pinned_to_them() {
    let c = load(
        "devices:\n  - {name: cuda1, capacity: 24GiB}\n  - {name: big, capacity: 8GiB}\n  - {name: r, capacity: 8GiB, vendor: amd, index: 2}\n  - {name: g, capacity: 8GiB, vendor: nvidia, uuid: GPU-x}\n  - {name: cuda3, capacity: 8GiB, uuid: GPU-y}\n  - {name: h, capacity: 8GiB, vendor: nvidia, index: 4, uuid: GPU-z}\n",
    );
    let pins: Vec<(Vendor, Option<&str>, Option<u32>)> = c
        .devices
        .iter()
        .map(|d| (d.vendor, d.select_as.as_deref(), d.index))
        .collect();
    assert_eq!(
        pins,
        [
            (Vendor::Nvidia, Some("1"), Some(1)),
            (Vendor::None, None, None),
            (Vendor::Amd, Some("2"), Some(2)),
            (Vendor::Nvidia, Some("GPU-x"), None),
            // a UUID written alone is not second-guessed by the number the name ends with
            (Vendor::Nvidia, Some("GPU-y"), None),
            (Vendor::Nvidia, Some("GPU-z"), Some(4)),
        ]
    );
    let err = load_err("devices:\n  - {name: g, capacity: 8GiB, vendor: nvidia}\n");
    assert!(
        err.starts_with("t.yaml:2:") && err.contains("needs an index or a uuid"),
        "{err}"
    );
    let err = load_err("devices:\n  - {name: g, capacity: 8GiB, vendor: tpu}\n");
    assert!(
        err.contains("devices[0].vendor") && err.contains("tpu"),
        "{err}"
    );
}

/// A model's device named twice would take two shares of its memory there, each checked alone
/// against the device's room: refused at load.
#[test]
fn a_device_a_model_names_twice_is_refused() {
    let err = load_err(
        "devices:\n  - {name: cuda0, capacity: 24GiB}\nmodels:\n  m:\n    cmd: srv --port ${PORT}\n    memory: {bytes: 40GiB, devices: [cuda0, cuda0]}\n",
    );
    assert!(
        err.contains("memory.devices") && err.contains("\"cuda0\" is named twice"),
        "{err}"
    );
}

#[test]
fn device_refresh_reads_nvidia_smi_only_for_auto_devices() {
    let listed = "devices:\n  - {name: g, capacity: 8GiB}\n";
    assert_eq!(load(listed).device_refresh, None);
    assert_eq!(
        load("devices: auto\n").device_refresh,
        Some(Duration::from_secs(5))
    );
    assert_eq!(
        load("devices: auto\ndeviceRefresh: 2\n").device_refresh,
        Some(Duration::from_secs(2))
    );
    assert_eq!(
        load("devices: auto\ndeviceRefresh: 0\n").device_refresh,
        None
    );
    assert!(load_err("deviceRefresh: -1\n").contains("deviceRefresh"));
}

/// `balance` defaults to prefix; slots and round-robin stay as they were; anything else is refused.
#[test]
fn balance_defaults_to_prefix_and_names_three_modes() {
    let pool = |extra: &str| {
        format!("models:\n  m:\n    cmd: srv --port ${{PORT}}\n    replicas: 2\n{extra}")
    };
    assert_eq!(load(&pool("")).models["m"].pool.balance, Balance::Prefix);
    for (name, mode) in [
        ("prefix", Balance::Prefix),
        ("slots", Balance::Slots),
        ("round-robin", Balance::RoundRobin),
    ] {
        let c = load(&pool(&format!("    balance: {name}\n")));
        assert_eq!(c.models["m"].pool.balance, mode, "{name}");
    }
    assert!(load_err(&pool("    balance: random\n")).contains("prefix, slots or round-robin"));
}

/// `prefixWait` is milliseconds, off by default, and bounded.
#[test]
fn prefix_wait_is_milliseconds_and_off_by_default() {
    let pool = |extra: &str| {
        format!("models:\n  m:\n    cmd: srv --port ${{PORT}}\n    replicas: 2\n{extra}")
    };
    assert_eq!(load(&pool("")).models["m"].pool.prefix_wait, Duration::ZERO);
    assert_eq!(
        load(&pool("    prefixWait: 250\n")).models["m"]
            .pool
            .prefix_wait,
        Duration::from_millis(250)
    );
    for bad in ["-1", "60001", "soon"] {
        let err = load_err(&pool(&format!("    prefixWait: {bad}\n")));
        assert!(err.contains("models.m.prefixWait"), "{bad}: {err}");
    }
}

#[test]
fn placement_is_spread_or_pack() {
    let model = |extra: &str| format!("models:\n  m:\n    cmd: srv --port ${{PORT}}\n{extra}");
    assert!(!load(&model("")).models["m"].memory.pack);
    assert!(
        load(&model("    placement: pack\n")).models["m"]
            .memory
            .pack
    );
    assert!(
        !load(&model("    placement: spread\n")).models["m"]
            .memory
            .pack
    );
    let err = load_err(&model("    placement: fill\n"));
    assert!(
        err.starts_with("t.yaml:4:") && err.contains("spread or pack"),
        "{err}"
    );
}

#[test]
fn a_found_gpu_is_budgeted_with_five_percent_in_reserve_and_known_by_its_selector_and_index() {
    let gpu = crate::gpu::Gpu {
        vendor: Vendor::Nvidia,
        index: 1,
        uuid: Some("GPU-abc".into()),
        product: String::new(),
        total: 20 << 30,
    };
    assert_eq!(
        Device::of_gpu(&gpu),
        Device {
            name: "cuda1".into(),
            capacity: 20 << 30,
            reserve: 1 << 30,
            vendor: Vendor::Nvidia,
            select_as: Some("GPU-abc".into()),
            index: Some(1),
        }
    );
}

/// YAML merge keys, as Go's yaml.v3 applies them for llama-swap: a whole model from a template,
/// and a nested mapping from a list of them, keys written in place winning.
#[test]
fn merge_keys_share_templates_and_errors_point_at_the_anchor() {
    let c = load(
        "models:\n  base: &base\n    cmd: srv --port ${PORT}\n    ttl: 30\n    capabilities: &caps {in: [text], tools: true, context: 4096}\n  big:\n    <<: *base\n    ttl: 60\n    capabilities: {<<: [*caps], context: 202752}\n",
    );
    let big = &c.models["big"];
    assert_eq!(big.argv, ["srv", "--port", "5801"]);
    assert_eq!(big.ttl, Some(Duration::from_secs(60)));
    assert_eq!(big.capabilities.input, ["text"]);
    assert!(big.capabilities.tools);
    assert_eq!(big.capabilities.context, 202752);
    assert_eq!(c.models["base"].capabilities.context, 4096);
    let err = load_err(
        "templates: {t: &t {ttl: soon}}\nmodels:\n  m: {<<: *t, cmd: srv, proxy: 'http://h:1'}\n",
    );
    assert_eq!(
        err,
        "t.yaml:1:25: models.m.ttl: must be an integer, not a string"
    );
    let err = load_err("models:\n  m: {<<: [srv], cmd: srv, proxy: 'http://h:1'}\n");
    assert!(
        err.starts_with("t.yaml:2:7: <<: a merge key takes a mapping"),
        "{err}"
    );
}

/// llama-swap looks for unknown macros only under the keys it knows, and only at `${name}`.
#[test]
fn leftover_macros_are_looked_for_in_known_keys_and_only_as_macro_names() {
    let c = load(
        "defaults:\n  cmd: &cmd \"srv --port ${PORT}\"\nmodels:\n  m: {cmd: *cmd}\n  s: {cmd: \"sh -c 'exec srv --dir ${MODELS:-/models}'\", proxy: 'http://h:1'}\n",
    );
    assert_eq!(c.models["m"].argv, ["srv", "--port", "5800"]);
    assert_eq!(
        c.models["s"].argv,
        ["sh", "-c", "exec srv --dir ${MODELS:-/models}"]
    );
    let err = load_err("models:\n  m: {cmd: 'srv ${a-b} ${MODELS:-x}', proxy: 'http://h:1'}\n");
    assert!(
        err.contains("models.m.cmd: unknown macro '${a-b}'"),
        "{err}"
    );
    let err = load_err("hooks: {on_startup: {preload: ['${nope}']}}\n");
    assert!(err.contains("unknown macro '${nope}'"), "{err}");
}

/// SanitizeCommand trims each line before looking for the `\` that continues it.
#[test]
fn cmd_continuations_are_found_on_trimmed_lines() {
    let c = load(
        "models:\n  a:\n    proxy: 'http://h:1'\n    cmd: |\n      srv \\ \n        --x \\\t\n        # a comment \\\n        --y\n  b: {cmd: 'srv --x \\', proxy: 'http://h:1'}\n",
    );
    assert_eq!(c.models["a"].argv, ["srv", "--x", "--y"]);
    assert_eq!(c.models["b"].argv, ["srv", "--x"]);
}

/// `chat` with two replicas is reached as `chat-0` and `chat-1` too: no other model may be.
#[test]
fn a_replica_named_like_another_model_or_alias_is_refused() {
    let err = load_err(
        "models:\n  chat: {cmd: 'srv --port ${PORT}', replicas: 2}\n  chat-1: {cmd: 'srv --port ${PORT}'}\n",
    );
    assert_eq!(
        err,
        "t.yaml:2:47: models.chat.replicas: replica \"chat-1\" of model \"chat\" has the same name as model \"chat-1\""
    );
    let err = load_err(
        "models:\n  chat: {cmd: 'srv --port ${PORT}', replicas: 2}\n  other: {cmd: 'srv --port ${PORT}', aliases: [chat-0]}\n",
    );
    assert!(
        err.contains(
            "replica \"chat-0\" of model \"chat\" has the same name as an alias of model \"other\""
        ),
        "{err}"
    );
}

#[test]
fn huge_durations_and_bandwidths_are_errors_not_panics() {
    let err = load_err("performance: {every: 99999999999999999999s}\n");
    assert!(
        err.contains("performance.every: \"99999999999999999999s\" is not a duration"),
        "{err}"
    );
    assert_eq!(decode::parse_go_duration("2562048h"), None);
    assert!(decode::parse_go_duration("2562047h").is_some());
    let err = load_err("loadBandwidth: 9000000000000000000\n");
    assert!(
        err.contains("loadBandwidth: must be at most 1TiB/s"),
        "{err}"
    );
    assert!(load_err("loadBandwidth: 2TiB/s\n").contains("at most 1TiB/s"));
    assert_eq!(load("loadBandwidth: 1048576\n").load_bandwidth, 1 << 40);
}

/// A null `proxy` is filled in as an absent one is, replicas included.
#[test]
fn a_null_proxy_gets_the_default() {
    let c = load(
        "models:\n  a:\n    cmd: srv --port ${PORT}\n    proxy:\n  b: {cmd: 'srv --port ${PORT}', proxy: ~, replicas: 2}\n",
    );
    assert_eq!(c.models["a"].proxy, "http://localhost:5800");
    let proxies: Vec<&str> = c.models["b"]
        .instances
        .iter()
        .map(|i| i.proxy.as_str())
        .collect();
    assert_eq!(proxies, ["http://localhost:5801", "http://localhost:5802"]);
}

#[test]
fn an_alias_equal_to_its_own_id_is_accepted() {
    let c = load("models:\n  qwen: {cmd: srv, proxy: 'http://h:1', aliases: [qwen, q]}\n");
    assert_eq!(c.models["qwen"].aliases, ["q"]);
    assert_eq!(c.real_model_name("qwen"), Some("qwen"));
    let err = load_err(
        "models:\n  a: {cmd: srv, proxy: 'http://h:1', aliases: [b]}\n  b: {cmd: srv, proxy: 'http://h:1'}\n",
    );
    assert!(err.contains("alias \"b\" is also a model id"), "{err}");
}

/// `setParamsByID` keys take macros, so one left unresolved is an unknown macro, not an alias.
#[test]
fn set_params_by_id_keys_with_unknown_macros_are_refused() {
    let err = load_err(
        "models:\n  m:\n    cmd: srv\n    proxy: 'http://h:1'\n    filters:\n      setParamsByID:\n        '${typo}:fast': {temperature: 1}\n",
    );
    assert_eq!(
        err,
        "t.yaml:7:25: models.m.filters.setParamsByID: unknown macro '${typo}' in the key \"${typo}:fast\""
    );
}

/// `logToStdout` as llama-swap reads it now: `none`, `both` (every stream) or a comma list of
/// `proxy`, `upstream` and `http`; left out, `proxy`.
#[test]
fn log_to_stdout_takes_a_list_of_streams() {
    let streams = |yaml: &str| {
        let l = load(yaml).log_to_stdout;
        (l.proxy(), l.upstream(), l.http())
    };
    assert_eq!(streams(""), (true, false, false));
    assert_eq!(streams("logToStdout: proxy\n"), (true, false, false));
    assert_eq!(streams("logToStdout: upstream\n"), (false, true, false));
    assert_eq!(streams("logToStdout: http\n"), (false, false, true));
    assert_eq!(streams("logToStdout: both\n"), (true, true, true));
    assert_eq!(streams("logToStdout: none\n"), (false, false, false));
    assert_eq!(streams("logToStdout: proxy,http\n"), (true, false, true));
    assert_eq!(
        streams("logToStdout: ' upstream , http '\n"),
        (false, true, true)
    );
    for bad in ["''", "'proxy,'", "'proxy,both'", "stdout"] {
        let err = load_err(&format!("logToStdout: {bad}\n"));
        assert!(
            err.contains("logToStdout must be none, both, or a comma separated list"),
            "{bad}: {err}"
        );
    }
}

#[test]
fn global_concurrency_limit_is_zero_or_more() {
    assert_eq!(load("").global_concurrency_limit, 0);
    assert_eq!(
        load("globalConcurrencyLimit: 4\n").global_concurrency_limit,
        4
    );
    assert_eq!(
        load_err("globalConcurrencyLimit: -1\n"),
        "t.yaml:1:25: globalConcurrencyLimit must be >= 0"
    );
}

const PROFILED: &str = "models:\n  a: {cmd: srv, proxy: 'http://h:1'}\n  b: {cmd: srv, proxy: 'http://h:1'}\nprofiles:\n  fast: {pins: {a: b}}\n";

#[test]
fn the_startup_profile_must_name_a_profile() {
    assert_eq!(load(PROFILED).startup_profile, None);
    let c = load(&format!(
        "{PROFILED}hooks:\n  on_startup:\n    profile: fast\n"
    ));
    assert_eq!(c.startup_profile.as_deref(), Some("fast"));
    let err = load_err(&format!(
        "{PROFILED}hooks:\n  on_startup:\n    profile: slow\n"
    ));
    assert_eq!(
        err,
        "t.yaml:8:14: hooks.on_startup.profile references unknown profile \"slow\""
    );
}

#[test]
fn disable_keep_alives_is_read_per_model() {
    let c = load("models:\n  a: {cmd: srv, proxy: 'http://h:1', disableKeepAlives: true}\n  b: {cmd: srv, proxy: 'http://h:1'}\n");
    assert!(c.models["a"].disable_keep_alives);
    assert!(!c.models["b"].disable_keep_alives);
}

/// `ollamaApi` is on unless set to false, and anything but a boolean is refused by name.
#[test]
fn the_ollama_api_is_on_unless_switched_off() {
    let load = |yaml: &str| crate::config::load_str("t.yaml", yaml, &|_| None);
    let on = load("models: {}\n").unwrap();
    assert!(on.config.ollama_api);
    let off = load("ollamaApi: false\nmodels: {}\n").unwrap();
    assert!(off.warnings.is_empty(), "{:?}", off.warnings);
    assert!(!off.config.ollama_api);
    let bad = load("ollamaApi: sometimes\nmodels: {}\n")
        .unwrap_err()
        .to_string();
    assert!(
        bad.contains("ollamaApi") && bad.contains("true or false"),
        "{bad}"
    );
}

/// `capabilities.disableAuto` (a boolean) and the `video` modality, as llama-swap takes them.
#[test]
fn capabilities_take_disable_auto_and_video() {
    let c = load(
        "models:\n  m: {cmd: srv, proxy: 'http://h:1', capabilities: {in: [text, video], disableAuto: true}}\n  n: {cmd: srv, proxy: 'http://h:1'}\n",
    );
    assert_eq!(c.models["m"].capabilities.input, ["text", "video"]);
    assert!(c.models["m"].capabilities.disable_auto);
    assert!(!c.models["n"].capabilities.disable_auto);
    let err = load_err(
        "models:\n  m: {cmd: srv, proxy: 'http://h:1', capabilities: {disableAuto: sometimes}}\n",
    );
    assert!(
        err.contains("capabilities.disableAuto: must be true or false"),
        "{err}"
    );
}
