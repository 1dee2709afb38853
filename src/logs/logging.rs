//! corral's own log lines go to stdout (per `logToStdout`) and into the `/logs` rings.

use std::io::Write;
use std::sync::Arc;

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

use crate::logs::Logs;

#[derive(Clone)]
struct Tee {
    logs: Arc<Logs>,
    to_stdout: bool,
}

impl Write for Tee {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.logs.proxy.write(buf);
        if self.to_stdout {
            self.logs.combined.write(buf);
            let _ = std::io::stdout().write_all(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stdout().flush()
    }
}

impl<'a> MakeWriter<'a> for Tee {
    type Writer = Tee;
    fn make_writer(&'a self) -> Tee {
        self.clone()
    }
}

/// Installs the global subscriber at `level` (`logLevel`; `RUST_LOG` overrides it), writing to
/// stdout too when `to_stdout` (`logToStdout` names the proxy).
pub fn init(level: &str, to_stdout: bool, logs: Arc<Logs>) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("corral={level},warn")));
    let tee = Tee { logs, to_stdout };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_target(false)
        .with_writer(tee)
        .try_init();
}

/// An HTTP access line (`logToStdout` names `http`): kept in its own ring and in `/logs`, and
/// written to stdout.
pub fn http_line(logs: &Logs, line: &[u8]) {
    logs.http.write(line);
    logs.combined.write(line);
    let _ = std::io::stdout().write_all(line);
}
