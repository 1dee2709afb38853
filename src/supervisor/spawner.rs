//! One long-lived OS thread that forks every child.
//!
//! `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not the process. tokio's
//! blocking-pool threads are pruned when idle, which would kill children spawned from them, so all
//! forks happen on this thread, which lives as long as the spawner.
#![allow(unsafe_code)]

use std::io;
use std::sync::mpsc;

use tokio::process::{Child, Command};
use tokio::sync::oneshot;

struct Job {
    cmd: Command,
    reply: oneshot::Sender<io::Result<Child>>,
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
                    let _ = job.reply.send(job.cmd.spawn());
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
