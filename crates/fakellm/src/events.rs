//! The `--events-file` JSON-lines log.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

/// Appends one JSON object per line; each line is written with a single
/// `write` on a file opened with `O_APPEND`, so lines from several processes
/// sharing the file do not interleave.
pub struct Events {
    file: File,
    pid: u32,
    port: AtomicU32,
}

pub fn unix_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0)
}

impl Events {
    pub fn open(path: &str, pid: u32, port: u16) -> std::io::Result<Events> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Events {
            file,
            pid,
            port: AtomicU32::new(port as u32),
        })
    }

    pub fn set_port(&self, port: u16) {
        self.port.store(port as u32, Ordering::Relaxed);
    }

    /// Writes `{"t_ms":..,"pid":..,"port":..,"event":"..", <extra fields>}`.
    pub fn emit(&self, event: &str, extra: &[(&str, Value)]) {
        let mut line = format!(
            "{{\"t_ms\":{:.3},\"pid\":{},\"port\":{},\"event\":{}",
            unix_ms(),
            self.pid,
            self.port.load(Ordering::Relaxed),
            Value::from(event)
        );
        for (k, v) in extra {
            line.push(',');
            line.push_str(&Value::from(*k).to_string());
            line.push(':');
            line.push_str(&v.to_string());
        }
        line.push_str("}\n");
        // A single write; for regular files opened O_APPEND this is atomic.
        let _ = (&self.file).write_all(line.as_bytes());
        let _ = (&self.file).flush();
    }
}
