//! The `corral` command: parse the command line, load the config, bind, and hand over to the library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use corral::config::{self, Config, Sources};
use corral::{Logs, TlsCertificate};
use tokio_util::sync::CancellationToken;

mod cli;

use cli::{plan, pull, reload};

/// The allocator: glibc's unless built with `--features mimalloc` or `jemalloc` (the A/B in
/// bench/README.md chose the default).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const EXIT_CONFIG: u8 = 64;
const DEMO_CONFIG: &str = include_str!("../config/demo.yaml");

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cmd = match cli::parse(&args) {
        Ok(cmd) => cmd,
        Err(msg) => {
            eprintln!("corral: {msg}\n\n{}", cli::USAGE);
            return ExitCode::from(2);
        }
    };
    match cmd {
        cli::Command::Help => {
            println!("{}", cli::USAGE);
            ExitCode::SUCCESS
        }
        cli::Command::Version => {
            println!("corral {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        cli::Command::FakeEngine(args) => ExitCode::from(fakellm::main_with_args(args) as u8),
        cli::Command::Estimate(args) => match corral::estimate_command(&args) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("corral estimate: {e}");
                ExitCode::from(2)
            }
        },
        cli::Command::Check(opts) => match load(&opts.sources) {
            Ok(loaded) => {
                print!("{}", plan::render(&loaded.config, opts.show_secrets));
                ExitCode::SUCCESS
            }
            Err(code) => code,
        },
        cli::Command::Validate(sources) => validate(&sources),
        cli::Command::Pull(opts) => match load(&opts.sources) {
            Ok(loaded) => pull::run(&loaded.config, &opts.models),
            Err(code) => code,
        },
        cli::Command::Serve(opts) => serve(opts),
    }
}

/// `${env.X}` lookups see the process environment plus `CORRAL_EXE`, the path of this binary.
pub(crate) fn env_lookup(name: &str) -> Option<String> {
    if name == "CORRAL_EXE" {
        if let Ok(v) = std::env::var(name) {
            return Some(v);
        }
        return std::env::current_exe()
            .ok()
            .map(|p| p.display().to_string());
    }
    std::env::var(name).ok()
}

fn load(sources: &Sources) -> Result<config::Loaded, ExitCode> {
    let result = if sources.file.is_none() && sources.dir.is_none() {
        config::load_str("config/demo.yaml (embedded)", DEMO_CONFIG, &env_lookup)
    } else {
        config::load(sources, &env_lookup)
    };
    match result {
        Ok(loaded) => {
            for w in &loaded.warnings {
                eprintln!("corral: warning: {w}");
            }
            Ok(loaded)
        }
        Err(e) => {
            eprintln!("corral: config error: {e}");
            Err(ExitCode::from(EXIT_CONFIG))
        }
    }
}

/// `-validate`: the loader `corral check` and a start use, with llama-swap's summary and exit
/// status (0 valid, 1 not).
fn validate(sources: &Sources) -> ExitCode {
    match load(sources) {
        Ok(loaded) => {
            println!(
                "config is valid: {} model(s), {} peer(s)",
                loaded.config.models.len(),
                loaded.config.peers.len()
            );
            ExitCode::SUCCESS
        }
        Err(_) => ExitCode::FAILURE,
    }
}

/// The listener's certificate and key, read before anything starts; a bad file exits as a bad
/// config does.
fn load_tls(files: Option<&cli::TlsFiles>) -> Result<Option<Arc<TlsCertificate>>, ExitCode> {
    let Some(files) = files else {
        return Ok(None);
    };
    match TlsCertificate::load(&files.cert, &files.key) {
        Ok(tls) => Ok(Some(tls)),
        Err(e) => {
            eprintln!("corral: {e}");
            Err(ExitCode::from(EXIT_CONFIG))
        }
    }
}

fn serve(opts: cli::ServeOptions) -> ExitCode {
    let loaded = match load(&opts.sources) {
        Ok(l) => l,
        Err(code) => return code,
    };
    let tls = match load_tls(opts.tls.as_ref()) {
        Ok(tls) => tls,
        Err(code) => return code,
    };
    let logs = Arc::new(Logs::default());
    corral::logging::init(
        &loaded.config.log_level,
        loaded.config.log_to_stdout.proxy(),
        logs.clone(),
    );
    corral::fdlimit::raise();
    if opts.sources.file.is_none() && opts.sources.dir.is_none() {
        tracing::info!("no --config given: serving the embedded demo config (two fake models)");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("corral: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(serve_on_runtime(opts, loaded.config, logs, tls))
}

/// Binds the listen address, then serves with signals and config reloads watched until stopped.
async fn serve_on_runtime(
    opts: cli::ServeOptions,
    config: Config,
    logs: Arc<Logs>,
    tls: Option<Arc<TlsCertificate>>,
) -> ExitCode {
    let listener = match tokio::net::TcpListener::bind(opts.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("corral: cannot listen on {}: {e}", opts.listen);
            return ExitCode::FAILURE;
        }
    };
    // the SIGHUP handler is in place before corral says it listens
    let reloads = watch_reloads(&opts, tls.clone());
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let scheme = if tls.is_some() { "https" } else { "http" };
    tracing::info!(
        "corral {} listening on {scheme}://{addr}",
        env!("CARGO_PKG_VERSION")
    );
    let shutdown = CancellationToken::new();
    let abort = CancellationToken::new();
    tokio::spawn(watch_signals(shutdown.clone(), abort.clone()));
    let options = corral::Options {
        state_dir: state_dir(),
        state_key: state_key(&opts.sources),
        tls,
        ..Default::default()
    };
    let served = corral::run_with_reloads(
        config,
        listener,
        logs,
        options,
        shutdown,
        abort.clone(),
        reloads,
    )
    .await;
    match served {
        Ok(()) if abort.is_cancelled() => ExitCode::from(130),
        Ok(()) => {
            tracing::info!("stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("corral: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Configs to reload: on SIGHUP, and on every change of the config files with `--watch-config`.
/// SIGHUP reads the TLS certificate and key again too.
fn watch_reloads(
    opts: &cli::ServeOptions,
    tls: Option<Arc<TlsCertificate>>,
) -> tokio::sync::mpsc::Receiver<corral::Reload> {
    let (reload_tx, reloads) = tokio::sync::mpsc::channel(4);
    tokio::spawn(reload::on_sighup(
        opts.sources.clone(),
        tls,
        reload_tx.clone(),
    ));
    if opts.watch_config {
        tokio::spawn(reload::watch(opts.sources.clone(), reload_tx));
    }
    reloads
}

/// First SIGTERM/SIGINT: drain and stop. Second: stop at once.
async fn watch_signals(shutdown: CancellationToken, abort: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return;
    };
    let next = async {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    };
    let first = next.await;
    tracing::info!("{first}: shutting down (send it again to stop at once)");
    shutdown.cancel();
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    abort.cancel();
}

fn state_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("CORRAL_STATE_DIR") {
        return Some(PathBuf::from(dir));
    }
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))?;
    Some(base.join("corral"))
}

/// What makes two runs the same corral: the config they load. Not the listen address, so a run
/// restarted on another address still sweeps what the last one left.
fn state_key(sources: &Sources) -> String {
    let path = |p: &Option<PathBuf>| {
        p.as_ref()
            .map(|p| p.canonicalize().unwrap_or(p.clone()).display().to_string())
            .unwrap_or_default()
    };
    match format!("{}{}", path(&sources.file), path(&sources.dir)) {
        key if key.is_empty() => "embedded-demo".into(),
        key => key,
    }
}
