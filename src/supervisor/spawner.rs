//! One long-lived OS thread that forks every child.
//!
//! `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not the process. tokio's
//! blocking-pool threads are pruned when idle, which would kill children spawned from them, so all
//! forks happen on this thread, which lives as long as the spawner.
#![allow(unsafe_code)]

use std::collections::HashSet;
use std::io;
use std::sync::{mpsc, Mutex};

use tokio::process::{Child, Command};
use tokio::sync::oneshot;

struct Job {
    cmd: Command,
    reply: oneshot::Sender<io::Result<Child>>,
}

/// The children corral forked and tokio waits for; the orphan reaper leaves them alone.
static OWN: Mutex<Option<HashSet<u32>>> = Mutex::new(None);

/// Whether `pid` is one of corral's own children (tokio reaps those).
pub fn is_own(pid: u32) -> bool {
    OWN.lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .is_some_and(|own| own.contains(&pid))
}

/// `pid` has been reaped: it may be reused by anything now.
pub fn forget(pid: u32) {
    if let Some(own) = OWN.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        own.remove(&pid);
    }
}

/// A handle to the spawner thread. Dropping the last handle ends the thread.
#[derive(Clone)]
pub struct Spawner {
    jobs: mpsc::Sender<Job>,
}

impl Spawner {
    /// Starts the thread. It enters `runtime` so that tokio can reap the children it forks.
    pub fn start(runtime: tokio::runtime::Handle) -> io::Result<Spawner> {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("corral-spawner".into())
            .spawn(move || {
                let _guard = runtime.enter();
                for mut job in rx {
                    let spawned = job.cmd.spawn();
                    if let Some(pid) = spawned.as_ref().ok().and_then(Child::id) {
                        OWN.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .get_or_insert_with(HashSet::new)
                            .insert(pid);
                    }
                    let _ = job.reply.send(spawned);
                }
            })?;
        Ok(Spawner { jobs: tx })
    }

    /// Spawns `cmd` in its own process group, stdin from /dev/null, killed when corral dies.
    pub async fn spawn(&self, mut cmd: Command) -> io::Result<Child> {
        let parent = std::process::id() as libc::pid_t;
        cmd.process_group(0)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        // SAFETY: only async-signal-safe libc calls run between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) != 0
                {
                    return Err(io::Error::last_os_error());
                }
                // corral may have died between fork and prctl; then no signal would ever come.
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        let (reply, rx) = oneshot::channel();
        self.jobs
            .send(Job { cmd, reply })
            .map_err(|_| io::Error::other("the spawner thread has stopped"))?;
        rx.await
            .map_err(|_| io::Error::other("the spawner thread has stopped"))?
    }
}
