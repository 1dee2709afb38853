//! `corral check`: the resolved plan, model by model, without starting anything.

use std::fmt::Write;

use corral::config::{Config, ModelConfig};

/// The plan as text; commands show `***` for secrets unless `show_secrets`.
pub fn render(config: &Config, show_secrets: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "config ok: {} model(s), {} group(s)",
        config.models.len(),
        config.groups.len()
    );
    render_global(&mut out, config);
    for m in config.models.values() {
        let _ = writeln!(out, "\nmodel {}", m.id);
        render_engine(&mut out, m);
        render_commands(&mut out, config, m, show_secrets);
        render_routing(&mut out, config, m);
        render_loads(&mut out, config, m);
    }
    out
}

/// What bounds or shapes every model request: `globalConcurrencyLimit`, the startup profile, and
/// Ollama's API when it is off.
fn render_global(out: &mut String, config: &Config) {
    if !config.ollama_api {
        let _ = writeln!(
            out,
            "Ollama API: off (ollamaApi: false; /api/tags, /api/chat, ... answer 404)"
        );
    }
    if config.global_concurrency_limit > 0 {
        let _ = writeln!(
            out,
            "global concurrency: {} model request(s) at once across all models, 429 beyond (/upstream not counted)",
            config.global_concurrency_limit
        );
    }
    if let Some(profile) = &config.startup_profile {
        let _ = writeln!(
            out,
            "startup profile: {profile} (active at start and after each reload)"
        );
    }
}

/// The `engine:` line of a model served by a built-in engine: which weights, and that they are
/// fetched before the first start.
fn render_engine(out: &mut String, m: &ModelConfig) {
    let Some(e) = &m.engine else { return };
    let fetch = if e.needs_fetch() {
        "; its weights are fetched before the first start and the command then names them"
    } else {
        ""
    };
    let _ = writeln!(
        out,
        "  engine:      {} from {} ({}){fetch}",
        e.kind.name(),
        e.source,
        e.source.scheme()
    );
}

/// The commands that start and stop the model, secrets masked unless `show_secrets`.
fn render_commands(out: &mut String, config: &Config, m: &ModelConfig, show_secrets: bool) {
    let shown = |argv: &[String]| {
        if show_secrets {
            shell_words(argv)
        } else {
            shell_words(&config.redactor.argv(argv))
        }
    };
    let _ = writeln!(out, "  argv:        {}", shown(&m.argv));
    if let Some(stop) = &m.cmd_stop {
        let _ = writeln!(out, "  cmdStop:     {}", shown(stop));
    }
}

/// How requests reach the model and what bounds them: port, upstream, health check, group,
/// aliases, timeouts and concurrency.
fn render_routing(out: &mut String, config: &Config, m: &ModelConfig) {
    let group = config.group_of(&m.id);
    let _ = writeln!(
        out,
        "  port:        {}",
        m.port.map_or("-".into(), |p| p.to_string())
    );
    let _ = writeln!(out, "  proxy:       {}", m.proxy);
    let _ = writeln!(
        out,
        "  health:      {}",
        m.check_endpoint
            .as_deref()
            .unwrap_or("none (ready at spawn)")
    );
    let _ = writeln!(
        out,
        "  group:       {} (swap: {}, exclusive: {}, persistent: {})",
        group.id, group.swap, group.exclusive, group.persistent
    );
    if !m.aliases.is_empty() {
        let _ = writeln!(out, "  aliases:     {}", m.aliases.join(", "));
    }
    let _ = writeln!(
        out,
        "  timeouts:    health {}s, unload {}s, swap stop {}s, ttl {}",
        config.health_check_timeout.as_secs(),
        m.unload_timeout.as_secs(),
        config.health_check_timeout.as_secs(),
        m.ttl
            .map_or("never".into(), |t| format!("{}s", t.as_secs()))
    );
    let _ = writeln!(out, "  concurrency: {}", m.concurrency_limit);
    if m.disable_keep_alives {
        let _ = writeln!(
            out,
            "  keep-alive:  off (a new upstream connection per request)"
        );
    }
}

/// Per instance: the load deadline, the memory it needs and, when devices are configured, where
/// it would be placed.
fn render_loads(out: &mut String, config: &Config, m: &ModelConfig) {
    for inst in &m.instances {
        let need = corral::need_of(m, inst);
        let deadline = corral::load_deadline(
            config.health_check_timeout,
            need.weights,
            config.load_bandwidth,
            m.load_timeout,
        );
        let label = if m.instances.len() > 1 {
            format!("  {}:", inst.id)
        } else {
            "  load:".to_string()
        };
        let _ = writeln!(
            out,
            "{label:<14}deadline {}s (weights {}), memory {} ({})",
            deadline.as_secs(),
            corral::format_bytes(need.weights),
            corral::format_bytes(need.bytes),
            need.source
        );
        if !config.devices.is_empty() {
            let _ = writeln!(out, "  placed:     {}", placed_alone(config, m, need.bytes));
        }
        if need.host > 0 {
            let _ = writeln!(out, "  host:       {}", corral::format_bytes(need.host));
        }
    }
}

/// Where a model would go if it were started alone on empty devices: each device and the bytes
/// charged there (several for a split), or why it never fits.
fn placed_alone(config: &Config, m: &ModelConfig, need: u64) -> String {
    use corral::{place, Placement};
    if need == 0 {
        return "anywhere (no memory figure)".into();
    }
    let pinned: Vec<usize> = m
        .memory
        .devices
        .iter()
        .filter_map(|name| config.devices.iter().position(|d| &d.name == name))
        .collect();
    match place(&config.devices, need, &pinned, &[]) {
        Placement::Fits(charges) => charges
            .iter()
            .map(|(d, bytes)| {
                format!(
                    "{} {}",
                    config.devices[*d].name,
                    corral::format_bytes(*bytes)
                )
            })
            .collect::<Vec<_>>()
            .join(" + "),
        Placement::Never(why) => format!("never fits: {why}"),
        other => format!("{other:?}"),
    }
}

/// The words quoted as a shell needs them; masked secrets (`***`) stay unquoted, as they are
/// shown, not meant to be pasted.
fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            if a.contains(corral::config::redact::MASK) {
                return a.clone();
            }
            shlex::try_quote(a)
                .map(|q| q.into_owned())
                .unwrap_or_else(|_| a.clone())
        })
        .collect::<Vec<_>>()
        .join(" ")
}
