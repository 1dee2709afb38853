//! Leftovers of a previous run: corral records the process groups it runs in a state file and marks
//! every child's environment, so a run that was SIGKILLed can be cleaned up by the next one.

use std::path::{Path, PathBuf};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// The environment variable every child carries: `<owner key>:<corral pid>`.
pub const MARKER_VAR: &str = "CORRAL_OWNER";

/// Records the process groups this run has started, one per line, in a file of its own
/// (`<key>.<pid>.pgids`), so two corrals on one config never remove each other's records.
pub struct StateFile {
    dir: Option<PathBuf>,
    key: String,
}

impl StateFile {
    /// `key` identifies this corral's config across restarts, whatever address it listens on.
    pub fn new(dir: Option<PathBuf>, key: &str) -> StateFile {
        let key: String = key
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        StateFile { dir, key }
    }

    pub fn marker(&self) -> String {
        format!("{}:{}", self.key, std::process::id())
    }

    fn path_for(&self, owner: u32) -> Option<PathBuf> {
        let dir = self.dir.as_ref()?;
        Some(dir.join(format!("{}.{owner}.pgids", self.key)))
    }

    pub fn record(&self, pgid: u32) {
        if let Some(path) = self.path_for(std::process::id()) {
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

    /// The records of earlier runs of this config whose corral is gone: (file, process groups).
    fn orphaned_records(&self) -> Vec<(PathBuf, Vec<u32>)> {
        let Some(dir) = &self.dir else {
            return Vec::new();
        };
        let prefix = format!("{}.", self.key);
        let entries = std::fs::read_dir(dir).into_iter().flatten().flatten();
        entries
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let owner: u32 = name
                    .strip_prefix(&prefix)?
                    .strip_suffix(".pgids")?
                    .parse()
                    .ok()?;
                if owner == std::process::id() || process_alive(owner) {
                    return None;
                }
                let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                let groups = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
                Some((e.path(), groups))
            })
            .collect()
    }

    /// Kills what earlier runs of this config left behind (whatever address they listened on,
    /// children of wrappers included), never touching the processes of a corral that still runs;
    /// returns the process groups killed.
    pub fn sweep(&self) -> Vec<u32> {
        let records = self.orphaned_records();
        let recorded: Vec<u32> = records
            .iter()
            .flat_map(|(_, g)| g.iter().copied())
            .collect();
        let mut killed = Vec::new();
        for (pid, pgid, owner) in marked_processes(&self.key) {
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
        for (path, _) in records {
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
