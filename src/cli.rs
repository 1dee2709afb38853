//! Command-line parsing, with llama-swap's single-dash spellings (`-config`, `-listen`, ...).

use std::net::SocketAddr;
use std::path::PathBuf;

use corral::config::Sources;

pub const USAGE: &str =
    "usage: corral [--config FILE] [--config-dir DIR] [--listen ADDR] [--watch-config]
       corral check --config FILE [--config-dir DIR] [--show-secrets]
       corral pull --config FILE [--config-dir DIR] [MODEL...]   (fetch weights, start nothing)
       corral estimate FILE.gguf [-c N] [-np N] [-ngl N] [-ctk T] [-ctv T]
       corral fake-engine --port N [...]   (a small llama-server imitation for demos and tests)
       corral --version

With no --config, corral serves an embedded demo config (two fake models).
--listen defaults to :8080 (all interfaces), like llama-swap.";

pub struct ServeOptions {
    pub sources: Sources,
    pub listen: SocketAddr,
    pub watch_config: bool,
    /// `corral check` only: print keys and tokens in commands instead of `***`.
    pub show_secrets: bool,
}

/// `corral pull`: the config, and the models named (ids or aliases; none means every model
/// with a source).
pub struct PullOptions {
    pub sources: Sources,
    pub models: Vec<String>,
}

pub enum Command {
    Serve(ServeOptions),
    Check(ServeOptions),
    Pull(PullOptions),
    FakeEngine(Vec<String>),
    Estimate(Vec<String>),
    Version,
    Help,
}

/// Which command the flags belong to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Serve,
    Check,
    Pull,
}

pub fn parse(args: &[String]) -> Result<Command, String> {
    let mut args = args.to_vec();
    let mode = match args.first().map(String::as_str) {
        Some("fake-engine") => return Ok(Command::FakeEngine(args[1..].to_vec())),
        Some("estimate") => return Ok(Command::Estimate(args[1..].to_vec())),
        Some("check") => Mode::Check,
        Some("pull") => Mode::Pull,
        _ => Mode::Serve,
    };
    if mode != Mode::Serve {
        args.remove(0);
    }
    let mut models = Vec::new();
    let mut opts = ServeOptions {
        sources: Sources::default(),
        listen: parse_listen(":8080")?,
        watch_config: false,
        show_secrets: false,
    };
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with('-') => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        if mode == Mode::Pull && !flag.starts_with('-') {
            models.push(arg);
            continue;
        }
        let flag = flag.trim_start_matches('-');
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("--{name} needs a value"))
        };
        match flag {
            "config" => opts.sources.file = Some(PathBuf::from(value("config")?)),
            "config-dir" => opts.sources.dir = Some(PathBuf::from(value("config-dir")?)),
            "listen" if mode != Mode::Pull => opts.listen = parse_listen(&value("listen")?)?,
            "watch-config" if mode != Mode::Pull => opts.watch_config = true,
            "show-secrets" if mode == Mode::Check => opts.show_secrets = true,
            "version" => return Ok(Command::Version),
            "help" | "h" => return Ok(Command::Help),
            _ => return Err(format!("unknown argument {arg:?}")),
        }
    }
    Ok(match mode {
        Mode::Check => Command::Check(opts),
        Mode::Pull => Command::Pull(PullOptions {
            sources: opts.sources,
            models,
        }),
        Mode::Serve => Command::Serve(opts),
    })
}

/// `:8080` means every interface, as in Go; `host:port` and `[v6]:port` as usual.
fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    let full = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else {
        s.to_string()
    };
    if let Ok(addr) = full.parse() {
        return Ok(addr);
    }
    use std::net::ToSocketAddrs;
    full.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| format!("--listen {s:?} is not an address like :8080 or 127.0.0.1:8080"))
}
