//! A child's output, copied from its pipes into the log rings: whole lines, with the config's
//! secrets masked, never blocking the child. Asked, a pipe's reader reads to the pipe's end, so
//! what a child printed before some moment (an engine's memory report, before it answered its
//! health check) is in its log after it.

use bytes::Bytes;
use futures_util::FutureExt;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{mpsc, oneshot};

use super::Sinks;

pub(super) enum Pipe {
    Out(tokio::process::ChildStdout),
    Err(tokio::process::ChildStderr),
}

/// The most a pipe holds (Linux's largest pipe size): what a child wrote before a request to catch
/// up is all read within it, even while the child goes on writing.
const PIPE_MOST: usize = 1024 * 1024;

/// A partial line longer than this is passed on without waiting for its end.
const LONGEST_HELD_LINE: usize = 16 * 1024;

/// Copies a pipe into the log rings until EOF, whole lines at a time with the config's secrets
/// masked, so a secret split between two reads of the pipe is still found, and no ring, stream or
/// stdout ever holds it. It never blocks the child: rings drop old bytes. A partial line (a loader
/// printing dots) still counts as progress while it waits for its end. Asked to catch up, it reads
/// until the pipe is empty and then answers.
pub(super) async fn capture(
    pipe: Pipe,
    sinks: Sinks,
    mut catch_up: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
) {
    let mut buf = vec![0u8; 8192];
    let mut reader: Box<dyn AsyncRead + Unpin + Send> = match pipe {
        Pipe::Out(p) => Box::new(p),
        Pipe::Err(p) => Box::new(p),
    };
    let mut pending: Vec<u8> = Vec::new();
    loop {
        // a read is cancel-safe: one that a request to catch up interrupts has taken nothing
        let read = tokio::select! {
            read = reader.read(&mut buf) => read,
            Some(done) = catch_up.recv() => {
                let open = read_what_is_there(&mut *reader, &mut buf, &mut pending, &sinks);
                let _ = done.send(());
                if open {
                    continue;
                }
                break;
            }
        };
        match read {
            Ok(n) if n > 0 => take(&mut pending, &buf[..n], &sinks),
            _ => break,
        }
    }
    if !pending.is_empty() {
        emit(&sinks, pending);
    }
}

/// Reads what the pipe holds now, up to a full pipe, without waiting; false once it has ended.
fn read_what_is_there(
    reader: &mut (dyn AsyncRead + Unpin + Send),
    buf: &mut [u8],
    pending: &mut Vec<u8>,
    sinks: &Sinks,
) -> bool {
    let mut budget = PIPE_MOST;
    while budget > 0 {
        match reader.read(buf).now_or_never() {
            None => return true, // empty
            Some(Ok(n)) if n > 0 => {
                take(pending, &buf[..n], sinks);
                budget = budget.saturating_sub(n);
            }
            Some(_) => return false,
        }
    }
    true
}

/// Adds what a read gave to the partial line held, and passes on every line it completes.
fn take(pending: &mut Vec<u8>, read: &[u8], sinks: &Sinks) {
    pending.extend_from_slice(read);
    let line_end = pending.iter().rposition(|b| *b == b'\n' || *b == b'\r');
    let cut = match line_end {
        Some(i) => i + 1,
        None if pending.len() > LONGEST_HELD_LINE => pending.len(),
        None => {
            sinks.model.touch();
            return;
        }
    };
    let rest = pending.split_off(cut);
    emit(sinks, std::mem::replace(pending, rest));
}

fn emit(sinks: &Sinks, data: Vec<u8>) {
    let data = sinks.redactor.bytes(Bytes::from(data));
    sinks.model.write(&data);
    sinks.logs.upstream.write(&data);
    if sinks.upstream_to_stdout {
        sinks.logs.combined.write(&data);
        use std::io::Write;
        let _ = std::io::stdout().write_all(&data);
    }
}
