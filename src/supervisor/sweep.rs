//! Leftovers of a previous run: corral records the process groups it runs in a state file and marks
//! every child's environment, so a run that was SIGKILLed can be cleaned up by the next one.

use std::path::{Path, PathBuf};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// The environment variable every child carries: `<owner key>:<corral pid>`.
pub const MARKER_VAR: &str = "CORRAL_OWNER";

/// Records the process groups this run has started, one per line.
pub struct StateFile {
    path: Option<PathBuf>,
    key: String,
}

impl StateFile {
    /// `key` identifies this corral (its config and listen address) across restarts.
    pub fn new(dir: Option<PathBuf>, key: &str) -> StateFile {
        let key: String = key
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let path = dir.map(|d| d.join(format!("{key}.pgids")));
        StateFile { path, key }
    }

    pub fn marker(&self) -> String {
        format!("{}:{}", self.key, std::process::id())
    }

    pub fn record(&self, pgid: u32) {
        if let Some(path) = &self.path {
            use std::io::Write;
            if let Some(dir) = path.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
            {
                let _ = writeln!(f, "{pgid}");
            }
        }
    }

    /// Kills what a previous run with the same key left behind; returns the process groups killed.
    pub fn sweep(&self) -> Vec<u32> {
        let mut killed = Vec::new();
        let recorded: Vec<u32> = self
            .path
            .as_deref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default();
        let leftovers = marked_processes(&self.key);
        for (pid, pgid, owner) in leftovers {
            if owner == std::process::id() || process_alive(owner) {
                continue;
            }
            let group = if recorded.contains(&pgid) || pgid == pid {
                pgid
            } else {
                pid
            };
            if group > 1 && !killed.contains(&group) {
                let _ = killpg(Pid::from_raw(group as i32), Signal::SIGKILL);
                killed.push(group);
            }
            let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
        if let Some(path) = &self.path {
            let _ = std::fs::remove_file(path);
        }
        killed
    }
}

fn process_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Processes whose environment carries our marker key: (pid, pgid, owner pid).
fn marked_processes(key: &str) -> Vec<(u32, u32, u32)> {
    let prefix = format!("{MARKER_VAR}={key}:");
    let mut out = Vec::new();
    for pid in super::proc_pids() {
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let owner = environ.split(|b| *b == 0).find_map(|var| {
            let var = std::str::from_utf8(var).ok()?;
            var.strip_prefix(&prefix)?.parse::<u32>().ok()
        });
        if let Some(owner) = owner {
            let pgid = nix::unistd::getpgid(Some(Pid::from_raw(pid as i32)))
                .map(|p| p.as_raw() as u32)
                .unwrap_or(pid);
            out.push((pid, pgid, owner));
        }
    }
    out
}
