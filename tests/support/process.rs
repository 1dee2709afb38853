//! corral as a process: started on port 0, signalled, waited for.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{engine, free_port_range, new_marker, CORRAL};

pub struct Proc {
    pub child: Child,
    pub url: String,
    pub marker: String,
    pub dir: tempfile::TempDir,
}

impl Drop for Proc {
    /// Kills corral and, should a test fail half-way, every process carrying its marker.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for pid in super::marked_pids(&self.marker) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Starts the corral binary on port 0 with `yaml` and waits until it listens.
pub fn spawn_corral(yaml: &str, state_dir: &std::path::Path) -> Proc {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.yaml"),
        format!("startPort: {}\n{yaml}", free_port_range(8)),
    )
    .unwrap();
    spawn_corral_in(dir, state_dir)
}

/// Starts corral on the `config.yaml` in `dir` (a restart reuses the same file, as in real life).
pub fn spawn_corral_in(dir: tempfile::TempDir, state_dir: &std::path::Path) -> Proc {
    let config = dir.path().join("config.yaml");
    spawn_corral_with(dir, &config, state_dir, &[])
}

/// Starts corral on `config`, with more arguments.
pub fn spawn_corral_with(
    dir: tempfile::TempDir,
    config: &Path,
    state_dir: &Path,
    extra: &[&str],
) -> Proc {
    spawn_corral_env(dir, config, state_dir, extra, &[])
}

/// Starts corral on `config`, with more arguments and environment variables.
pub fn spawn_corral_env(
    dir: tempfile::TempDir,
    config: &Path,
    state_dir: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Proc {
    spawn_corral_wrapped(&[], dir, config, state_dir, extra, env)
}

/// corral in `dir` on `models` (YAML under `models:`) with `devices: auto`, refreshed every second,
/// and `env` (the fake GPU tools); the directory the models' events files go to, and the state dir.
pub fn spawn_corral_on_auto_devices(
    dir: tempfile::TempDir,
    models: &str,
    env: &[(&str, &str)],
) -> (Proc, std::path::PathBuf, tempfile::TempDir) {
    let config = dir.path().join("config.yaml");
    let yaml = format!(
        "startPort: {}\ndevices: auto\ndeviceRefresh: 1\nmodels:\n{models}",
        free_port_range(8)
    );
    std::fs::write(&config, yaml).unwrap();
    let state = tempfile::tempdir().unwrap();
    let events = dir.path().to_path_buf();
    let p = spawn_corral_env(dir, &config, state.path(), &[], env);
    (p, events, state)
}

/// Starts corral through `wrapper` (a command line that runs the rest, like `unshare …`).
pub fn spawn_corral_wrapped(
    wrapper: &[&str],
    dir: tempfile::TempDir,
    config: &Path,
    state_dir: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Proc {
    let marker = new_marker();
    let mut command = match wrapper {
        [] => Command::new(CORRAL),
        [program, args @ ..] => {
            let mut c = Command::new(program);
            c.args(args).arg(CORRAL);
            c
        }
    };
    let mut child = command
        .args([
            "--config",
            config.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ])
        .args(extra)
        .envs(env.iter().copied())
        .env("ENGINE", engine())
        .env("DIR", dir.path())
        .env("MARKER", &marker)
        .env("CORRAL_STATE_DIR", state_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.path().join("corral.stderr")).unwrap())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let url = loop {
        let Some(Ok(line)) = lines.next() else {
            let _ = child.kill();
            let stderr =
                std::fs::read_to_string(dir.path().join("corral.stderr")).unwrap_or_default();
            panic!("corral exited before printing its address:\n{stderr}");
        };
        if let Some(addr) = line.split("listening on ").nth(1) {
            break addr.trim().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    Proc {
        child,
        url,
        marker,
        dir,
    }
}

pub async fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "corral did not exit in time");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn signal(child: &Child, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig).unwrap();
}
