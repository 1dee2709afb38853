//! Reaping orphans when corral is PID 1.
//!
//! As a container's init (a sidecar started without tini), corral inherits every process orphaned
//! below its engines: a wrapper's background job whose parent exited is re-parented to it. Such a
//! process must be waited for when it exits, or it stays a zombie for the container's life.
//! corral's own children are left to tokio, which waits for them by pid.
#![allow(unsafe_code)]

use std::time::Duration;

use super::spawner;

/// Whether this process is PID 1 and so inherits orphans.
pub fn needed() -> bool {
    std::process::id() == 1
}

/// Reaps exited orphans every second (they are few and rare).
pub async fn run() {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        for pid in exited_orphans() {
            // SAFETY: waitpid on a specific zombie child; no memory is involved.
            unsafe {
                libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), libc::WNOHANG);
            }
        }
    }
}

/// Children of this process that have exited (zombies) and that corral did not spawn.
fn exited_orphans() -> Vec<u32> {
    let me = std::process::id();
    super::proc_pids()
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            zombie_child_of(&stat, me)
        })
        .filter(|pid| !spawner::is_own(*pid))
        .collect()
}

/// Reads `/proc/<pid>/stat`: state `Z` and parent `parent`. The command name in parentheses may
/// hold spaces and parentheses itself, so the fields are read after its last `)`.
fn zombie_child_of(stat: &str, parent: u32) -> bool {
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return false;
    };
    let mut fields = rest.split_whitespace();
    let state = fields.next();
    let ppid = fields.next().and_then(|p| p.parse::<u32>().ok());
    state == Some("Z") && ppid == Some(parent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_are_read_after_the_command_name() {
        assert!(zombie_child_of("42 (sleep) Z 1 42 42 0 -1", 1));
        assert!(zombie_child_of("42 (a) (b) Z 1 42", 1));
        assert!(!zombie_child_of("42 (sleep) S 1 42", 1));
        assert!(!zombie_child_of("42 (sleep) Z 7 42", 1));
        assert!(!zombie_child_of("garbage", 1));
    }
}
