//! fakellm: a small imitation of llama.cpp's `llama-server`.
//!
//! It is used by corral's tests, demo and benchmarks as a stand-in upstream:
//! it answers the llama-server / OpenAI endpoints with deterministic fake
//! content, and can be told to misbehave (slow loading, crashing mid-stream,
//! ignoring SIGTERM, leaving grandchildren behind...) from its command line.
//! Run `fakellm --help` for the flags.

/// Writes a line to stderr, ignoring errors (the reader may have gone away).
macro_rules! elog {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($t)*);
    }};
}

pub mod args;
mod events;
pub mod imitate;
mod kind;
pub mod multipart;
mod server;
mod sleep;

use std::time::Duration;

/// Runs the fake engine with the given arguments (program name excluded).
///
/// Builds its own tokio runtime and serves until killed, told to exit
/// (`--exit-after-ms`) or sent SIGTERM; returns the process exit code.
pub fn main_with_args(args: Vec<String>) -> i32 {
    let env = |k: &str| std::env::var(k).ok();
    let (kind, own_args) = match imitate::translate(&args, &env) {
        Ok(x) => x,
        Err(e) => {
            elog!("error: {e}");
            return 2;
        }
    };
    let mut cfg = match args::parse(&own_args) {
        Ok(args::Parsed::Run(cfg)) => *cfg,
        Ok(args::Parsed::Help) => {
            print!("{}", args::USAGE);
            return 0;
        }
        Err(e) => {
            elog!("error: {e}");
            elog!("run with --help for usage");
            return 2;
        }
    };
    cfg.imitate = kind;
    for w in &cfg.warnings {
        elog!("{w}");
    }
    let rt = if cfg.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cfg.threads)
            .enable_all()
            .build()
    };
    let rt = match rt {
        Ok(rt) => rt,
        Err(e) => {
            elog!("error: cannot start the runtime: {e}");
            return 1;
        }
    };
    let code = rt.block_on(server::run(cfg, args));
    rt.shutdown_timeout(Duration::from_millis(0));
    code
}
