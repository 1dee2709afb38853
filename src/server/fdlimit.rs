//! The open-file limit.
//!
//! Every client connection, upstream connection and engine pipe is a file descriptor, and the
//! usual soft limit (1024) is far below the hard one. Like nginx and Go servers, corral raises its
//! soft limit to the hard limit at start.

use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// Raises the soft RLIMIT_NOFILE to the hard limit and logs the change; returns the limit in force.
pub fn raise() -> u64 {
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 1024;
    };
    if soft >= hard {
        return soft;
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => {
            tracing::info!("raised the open-file limit from {soft} to {hard}");
            hard
        }
        Err(e) => {
            tracing::warn!("could not raise the open-file limit from {soft} to {hard}: {e}");
            soft
        }
    }
}

/// The soft open-file limit in force.
pub fn current() -> u64 {
    getrlimit(Resource::RLIMIT_NOFILE).map_or(1024, |(soft, _)| soft)
}
