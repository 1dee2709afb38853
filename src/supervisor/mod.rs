//! Supervision of one engine process: spawn, capture its output, probe readiness, stop.
//!
//! Theory of operation: every child is forked by the [`Spawner`] thread into its own process group,
//! with stdin from /dev/null and a parent-death signal, so it dies with corral. A task waits on the
//! child and publishes its exit on a `watch` channel; nothing ever waits on its pipes, which a
//! grandchild may hold open forever. Stopping signals the whole group: cmdStop or SIGTERM, then
//! SIGKILL after the grace period, and the stop returns only once the child has been reaped.

mod capture;
mod health;
pub mod progress;
pub mod reaper;
pub mod sleep_calls;
mod spawner;
pub mod sweep;
mod withheld;

pub use withheld::holding_secrets;
use withheld::withhold;

use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::sync::{mpsc, oneshot, watch};

use capture::{capture, Pipe};
pub use health::{HealthClient, Probe};
pub use progress::LoadingProgress;
pub use spawner::Spawner;

use crate::logs::{LogMark, LogRing, Logs};

/// Runs a short query (nvidia-smi) through the spawner and returns its output, or an error when it
/// fails to start or outlasts `limit`. Forked there, it counts as one of corral's own children, so
/// the orphan reaper (corral as PID 1) never takes its exit status from tokio.
pub async fn query_output(
    spawner: &Spawner,
    mut cmd: tokio::process::Command,
    limit: Duration,
) -> std::io::Result<std::process::Output> {
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    let child = spawner.spawn(cmd).await?;
    let pid = child.id();
    let out = tokio::time::timeout(limit, child.wait_with_output()).await;
    if let Some(pid) = pid {
        spawner::forget(pid);
    }
    out.map_err(|_| std::io::Error::other(format!("no answer within {}s", limit.as_secs())))?
}

/// What a process needs to run, resolved from the config.
#[derive(Debug, Clone)]
pub struct ProcessSpec {
    pub id: String,
    pub argv: Vec<String>,
    /// The engine's base URL (`proxy`).
    pub base: String,
    pub env: Vec<(String, String)>,
    /// Variables of corral's own environment the process does not inherit: those holding one of
    /// corral's keys (see [`holding_secrets`]). `env` may still set them.
    pub withheld: Vec<std::ffi::OsString>,
    pub cmd_stop: Option<Vec<String>>,
    /// Full URL polled for readiness; `None` means ready once spawned.
    pub health_url: Option<http::Uri>,
    /// The load deadline: past it, a load that shows no progress for `stall` is given up.
    pub load_timeout: Duration,
    pub stall: Duration,
    /// Whether progress may carry a load past `load_timeout`: only a deadline corral derived from
    /// the weights' size, or an explicit `loadTimeout`, is a floor; a plain `healthCheckTimeout`
    /// holds as llama-swap holds it.
    pub extend_on_progress: bool,
}

/// The pids listed in `/proc` (none where it cannot be read).
fn proc_pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
}

/// Why a start failed. Every waiter for the start gets this.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StartError {
    #[error("failed to start command '{cmd}': {error}")]
    Spawn { cmd: String, error: String },
    #[error("upstream command exited prematurely ({status}){}", tail_text(.tail))]
    Exited { status: String, tail: String },
    #[error("health check timed out after {}s with no sign of progress{}", .after.as_secs(), tail_text(.tail))]
    Timeout { after: Duration, tail: String },
    #[error("port {port} is already taken by another process ({address}); stop that process or give the model another port")]
    PortInUse { port: u16, address: String },
    #[error("model unloaded")]
    Aborted,
    #[error("could not get the model's weights: {error}")]
    Fetch { error: String },
    /// A failure whose cause the engine's output shows (out of memory, port taken), said first.
    #[error("{diagnosis}; {cause}")]
    Diagnosed {
        diagnosis: String,
        cause: Box<StartError>,
        /// The engine ran out of device memory, asking for this much more when it said.
        out_of_memory: Option<Option<u64>>,
    },
}

impl StartError {
    /// The error with the secrets it may carry masked: the command line, and the engine's last
    /// words (an engine may print its own arguments, keys among them). It is shown to clients, in
    /// events and in model status, where only masked text may go.
    pub fn redacted(self, redactor: &crate::config::Redactor) -> StartError {
        let mask = |text: String| redactor.text(&text).into_owned();
        match self {
            StartError::Spawn { cmd, error } => StartError::Spawn {
                cmd: mask(cmd),
                error: mask(error),
            },
            StartError::Exited { status, tail } => StartError::Exited {
                status,
                tail: mask(tail),
            },
            StartError::Timeout { after, tail } => StartError::Timeout {
                after,
                tail: mask(tail),
            },
            StartError::Fetch { error } => StartError::Fetch { error: mask(error) },
            StartError::Diagnosed {
                diagnosis,
                cause,
                out_of_memory,
            } => StartError::Diagnosed {
                diagnosis: mask(diagnosis),
                cause: Box::new(cause.redacted(redactor)),
                out_of_memory,
            },
            e @ (StartError::PortInUse { .. } | StartError::Aborted) => e,
        }
    }
}

/// A loopback port the command is told to serve on that something else already listens on.
/// Checked before spawning, so a squatter fails the start at once instead of answering the health
/// checks in the engine's place. Commands that do not name the port (wrappers around a server
/// that runs anyway) are not checked.
fn port_taken(spec: &ProcessSpec) -> Option<StartError> {
    let uri: http::Uri = spec.base.parse().ok()?;
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    let ip: std::net::IpAddr = match host {
        "localhost" => std::net::Ipv4Addr::LOCALHOST.into(),
        other => other.parse().ok()?,
    };
    let port = uri.port_u16()?;
    if !ip.is_loopback() {
        return None;
    }
    let named = port.to_string();
    let names_port = spec.argv.iter().skip(1).any(|arg| {
        arg == &named
            || arg
                .rsplit_once(['=', ':'])
                .is_some_and(|(_, tail)| tail == named)
    });
    if !names_port {
        return None;
    }
    match std::net::TcpListener::bind((ip, port)) {
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Some(StartError::PortInUse {
            port,
            address: format!("{ip}:{port}"),
        }),
        _ => None,
    }
}

fn tail_text(tail: &str) -> String {
    if tail.is_empty() {
        String::new()
    } else {
        format!("; last output:\n{tail}")
    }
}

/// Where a child's output goes.
#[derive(Clone)]
pub struct Sinks {
    pub model: Arc<LogRing>,
    pub logs: Arc<Logs>,
    pub upstream_to_stdout: bool,
    /// Masks the config's secrets in what the engine prints, before it is kept or shown anywhere.
    pub redactor: crate::logs::redact::Redactor,
}

/// A running child.
pub struct Process {
    pub pid: u32,
    exit: watch::Receiver<Option<String>>,
    sinks: Sinks,
    /// Where this process's output begins in its instance's log, which keeps the output of the
    /// instance's earlier starts too.
    output_from: LogMark,
    /// To each pipe's reader: take in all the pipe holds now, then answer.
    catch_up: Vec<mpsc::UnboundedSender<oneshot::Sender<()>>>,
}

impl Process {
    pub async fn spawn(
        spawner: &Spawner,
        spec: &ProcessSpec,
        sinks: Sinks,
        marker: &str,
    ) -> Result<Process, StartError> {
        if let Some(taken) = port_taken(spec) {
            return Err(taken);
        }
        let output_from = sinks.model.mark();
        let mut cmd = tokio::process::Command::new(&spec.argv[0]);
        withhold(&mut cmd, spec);
        cmd.args(&spec.argv[1..])
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .env(sweep::MARKER_VAR, marker)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = spawner.spawn(cmd).await.map_err(|e| StartError::Spawn {
            cmd: spec.argv.join(" "),
            error: e.to_string(),
        })?;
        let pid = child.id().unwrap_or(0);
        let mut catch_up = Vec::new();
        for pipe in [
            child.stdout.take().map(Pipe::Out),
            child.stderr.take().map(Pipe::Err),
        ]
        .into_iter()
        .flatten()
        {
            let (asks, asked) = mpsc::unbounded_channel();
            catch_up.push(asks);
            tokio::spawn(capture(pipe, sinks.clone(), asked));
        }
        let (tx, exit) = watch::channel(None);
        tokio::spawn(async move {
            let status = match child.wait().await {
                Ok(s) => describe_status(s),
                Err(e) => format!("wait failed: {e}"),
            };
            spawner::forget(pid);
            let _ = tx.send(Some(status));
        });
        Ok(Process {
            pid,
            exit,
            sinks,
            output_from,
            catch_up,
        })
    }

    /// Returns once what the child has printed so far is in its log: each pipe is read until it
    /// is empty. An engine prints its last loading lines (llama-server's buffer sizes) before it
    /// answers its health check, so once it is ready they are all there to read.
    pub async fn log_caught_up(&self) {
        for reader in &self.catch_up {
            let (done, caught_up) = oneshot::channel();
            if reader.send(done).is_ok() {
                // an error: the pipe has ended, and its reader kept all it held
                let _ = caught_up.await;
            }
        }
    }

    /// Resolves with a description of the exit status once the child has exited and been reaped.
    pub async fn exited(&self) -> String {
        let mut rx = self.exit.clone();
        loop {
            if let Some(status) = rx.borrow_and_update().clone() {
                return status;
            }
            if rx.changed().await.is_err() {
                return "unknown".into();
            }
        }
    }

    pub fn has_exited(&self) -> bool {
        self.exit.borrow().is_some()
    }

    /// The last lines the child printed.
    pub fn tail(&self) -> String {
        self.sinks.model.tail_lines(self.output_from, 20)
    }

    /// What the child has printed so far (as much as its log still holds).
    pub fn output(&self) -> Vec<u8> {
        self.sinks.model.since(self.output_from)
    }

    /// Polls the health URL until it answers 200: quickly at first (a small model is ready in
    /// milliseconds), then every 100 ms. A 503 "Loading model" is just loading; a not-ready answer
    /// that reports its progress (see [`progress`]) is handed to `on_loading` when it changes, and
    /// each new progress value restarts the countdown.
    pub async fn wait_ready(
        &self,
        spec: &ProcessSpec,
        health: &HealthClient,
        mut on_loading: impl FnMut(LoadingProgress),
    ) -> Result<(), StartError> {
        let Some(url) = &spec.health_url else {
            return Ok(());
        };
        let started = Instant::now();
        let mut load = LoadWatch::new(spec.load_timeout);
        loop {
            let probe = tokio::select! {
                status = self.exited() => {
                    tokio::time::sleep(Duration::from_millis(50)).await; // let the last output arrive
                    return Err(StartError::Exited { status, tail: self.tail() });
                }
                probe = health.probe(url) => probe,
            };
            match probe {
                Probe::Ready => return Ok(()),
                Probe::NotReady { answer, loading } => load.heard(answer, loading, &mut on_loading),
            }
            if tokio::time::Instant::now() >= load.deadline {
                let progress = self.recent_progress(load.answer_changed, spec.stall);
                let Some(progress) = progress.filter(|_| spec.extend_on_progress) else {
                    return Err(StartError::Timeout {
                        after: started.elapsed(),
                        tail: self.tail(),
                    });
                };
                load.deadline = crate::clock::deadline::after(
                    tokio::time::Instant::from_std(progress),
                    spec.stall,
                );
            }
            tokio::select! {
                _ = tokio::time::sleep(poll_interval(started.elapsed())) => {}
                _ = tokio::time::sleep_until(load.deadline) => {}
            }
        }
    }

    /// The latest sign of progress (output, a changing health answer) if it came inside the last
    /// stall window: past its deadline, a load gets until it has been quiet for that long.
    fn recent_progress(&self, answer_changed: Instant, stall: Duration) -> Option<Instant> {
        let latest = self
            .sinks
            .model
            .last_write()
            .map_or(answer_changed, |w| w.max(answer_changed));
        (latest.elapsed() < stall).then_some(latest)
    }

    /// Stops the process group: cmdStop or SIGTERM, SIGKILL after `grace`, then waits for the reap.
    pub async fn stop(&self, spec: &ProcessSpec, grace: Duration, spawner: &Spawner) {
        if self.has_exited() {
            signal_group(self.pid, Signal::SIGKILL); // grandchildren left in the group
            return;
        }
        match &spec.cmd_stop {
            Some(argv) => {
                let argv: Vec<String> = argv
                    .iter()
                    .map(|a| a.replace("${PID}", &self.pid.to_string()))
                    .collect();
                let mut cmd = tokio::process::Command::new(&argv[0]);
                withhold(&mut cmd, spec);
                cmd.args(&argv[1..])
                    .envs(spec.env.iter().map(|(k, v)| (k, v)));
                match spawner.spawn(cmd).await {
                    Ok(mut child) => {
                        let pid = child.id();
                        tokio::spawn(async move {
                            let _ = child.wait().await;
                            if let Some(pid) = pid {
                                spawner::forget(pid);
                            }
                        });
                    }
                    Err(e) => {
                        tracing::warn!(model = %spec.id, "cmdStop failed ({e}); sending SIGTERM");
                        signal_group(self.pid, Signal::SIGTERM);
                    }
                }
            }
            None => signal_group(self.pid, Signal::SIGTERM),
        }
        if tokio::time::timeout(grace, self.exited()).await.is_err() {
            tracing::warn!(model = %spec.id, pid = self.pid, "did not stop within {}s; sending SIGKILL", grace.as_secs_f32());
        }
        signal_group(self.pid, Signal::SIGKILL);
        self.exited().await;
    }
}

/// Readiness probes: every 5 ms for the first two seconds (small models are ready in that time, and
/// a user waits for each probe), every 20 ms up to five seconds, then every 100 ms.
fn poll_interval(elapsed: Duration) -> Duration {
    Duration::from_millis(match elapsed.as_millis() {
        0..=1999 => 5,
        2000..=4999 => 20,
        _ => 100,
    })
}

fn signal_group(pgid: u32, signal: Signal) {
    if pgid > 1 {
        let _ = killpg(Pid::from_raw(pgid as i32), signal);
    }
}

fn describe_status(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => {
            let name = Signal::try_from(sig)
                .map(|s| s.as_str().to_string())
                .unwrap_or_else(|_| sig.to_string());
            format!("killed by signal {name}")
        }
        _ => "unknown exit".into(),
    }
}

/// A load's countdown while it is polled: its deadline, and the signs that it moves.
struct LoadWatch {
    deadline: tokio::time::Instant,
    load_timeout: Duration,
    /// The last answer's fingerprint, and when it last changed.
    last_answer: Option<u64>,
    answer_changed: Instant,
    countdown: progress::Countdown,
}

impl LoadWatch {
    fn new(load_timeout: Duration) -> LoadWatch {
        LoadWatch {
            deadline: crate::clock::deadline::after(tokio::time::Instant::now(), load_timeout),
            load_timeout,
            last_answer: None,
            answer_changed: Instant::now(),
            countdown: progress::Countdown::default(),
        }
    }

    /// Takes in a not-ready answer: a changed answer is a sign of progress, a new progress value
    /// restarts the countdown, and a changed report is shown.
    fn heard(
        &mut self,
        answer: Option<u64>,
        loading: Option<LoadingProgress>,
        on_loading: &mut impl FnMut(LoadingProgress),
    ) {
        if answer.is_some() && answer != self.last_answer {
            self.last_answer = answer;
            self.answer_changed = Instant::now();
        }
        let Some(report) = loading else { return };
        let noted = self.countdown.note(&report);
        if noted.restart {
            let restarted =
                crate::clock::deadline::after(tokio::time::Instant::now(), self.load_timeout);
            self.deadline = self.deadline.max(restarted);
        }
        if noted.changed {
            on_loading(report);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_are_fast_while_a_load_is_young() {
        assert_eq!(poll_interval(Duration::ZERO), Duration::from_millis(5));
        assert_eq!(
            poll_interval(Duration::from_millis(1999)),
            Duration::from_millis(5)
        );
        assert_eq!(
            poll_interval(Duration::from_secs(3)),
            Duration::from_millis(20)
        );
        assert_eq!(
            poll_interval(Duration::from_secs(60)),
            Duration::from_millis(100)
        );
    }

    /// A process `m` running `argv`, served at `base`, with no health check.
    fn spec(argv: &[&str], base: &str) -> ProcessSpec {
        ProcessSpec {
            id: "m".into(),
            argv: argv.iter().map(|a| a.to_string()).collect(),
            base: base.into(),
            env: vec![],
            withheld: vec![],
            cmd_stop: None,
            health_url: None,
            load_timeout: Duration::from_secs(1),
            stall: Duration::from_secs(1),
            extend_on_progress: true,
        }
    }

    /// What a child printed before now is in its log once the log has caught up, however late
    /// the pipe's reader would otherwise have run: here it has not run at all, the only thread
    /// having waited for the child without yielding.
    #[tokio::test(flavor = "current_thread")]
    async fn the_log_catches_up_with_what_the_child_printed() {
        let spawner = Spawner::start(tokio::runtime::Handle::current()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let printed = dir.path().join("printed");
        let script = format!(
            "echo 'the last loading line'; touch '{}'; sleep 30",
            printed.display()
        );
        let spec = spec(&["sh", "-c", &script], "http://127.0.0.1:9");
        let sinks = Sinks {
            model: Arc::new(LogRing::default()),
            logs: Arc::new(Logs::default()),
            upstream_to_stdout: false,
            redactor: Default::default(),
        };
        let process = Process::spawn(&spawner, &spec, sinks.clone(), "m")
            .await
            .unwrap();
        let started = Instant::now();
        while !printed.exists() {
            assert!(started.elapsed() < Duration::from_secs(10), "sh never ran");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            sinks.model.history().is_empty(),
            "the reader has not run yet"
        );
        process.log_caught_up().await;
        let log = String::from_utf8_lossy(&sinks.model.history()).into_owned();
        process.stop(&spec, Duration::ZERO, &spawner).await;
        assert!(log.contains("the last loading line"), "{log:?}");
    }

    /// The port check applies to loopback ports the command names, in any spelling.
    #[test]
    fn only_ports_the_command_names_are_checked() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = held.local_addr().unwrap().port();
        let local = format!("http://127.0.0.1:{port}");
        for argv in [
            vec!["srv", "--port", &*port.to_string()],
            vec!["srv", &*format!("--port={port}")],
            vec!["srv", "--listen", &*format!("127.0.0.1:{port}")],
        ] {
            assert!(
                matches!(
                    port_taken(&spec(&argv, &local)),
                    Some(StartError::PortInUse { .. })
                ),
                "{argv:?}"
            );
        }
        assert!(port_taken(&spec(&["sleep", "infinity"], &local)).is_none());
        let named = ["srv", "--port", &*port.to_string()];
        assert!(port_taken(&spec(&named, &format!("http://10.0.0.9:{port}"))).is_none());
        drop(held);
        assert!(port_taken(&spec(&named, &local)).is_none());
    }
}
