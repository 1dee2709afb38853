//! What the pool benchmarks share: a seeded generator, free ports, starting corral from a config
//! and reading its address, and percentiles.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;

/// A small deterministic generator (SplitMix64), so every mode sees the same requests.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Exponentially distributed with the given mean (the gaps of a Poisson process).
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -(1.0 - self.next_f64()).ln() * mean
    }
}

/// A base for `n` free consecutive ports below the ephemeral range (32768 and up).
pub fn free_port_run(n: u16, salt: u16) -> u16 {
    let mut base = 20000 + (std::process::id() as u16).wrapping_add(salt.wrapping_mul(97)) % 12000;
    while !(base..base + n).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()) {
        base = if base + 2 * n >= 32000 {
            20000
        } else {
            base + n
        };
    }
    base
}

/// A corral process started for one run; killed when dropped.
pub struct Corral {
    pub url: String,
    child: Child,
}

impl Corral {
    /// Starts `corral --config <dir>/config.yaml --listen 127.0.0.1:0` and waits for its address.
    pub async fn start(corral: &str, dir: &std::path::Path, config: &str) -> Corral {
        std::fs::create_dir_all(dir).unwrap();
        let path = dir.join("config.yaml");
        std::fs::write(&path, config).unwrap();
        let mut child = tokio::process::Command::new(corral)
            .args([
                "--config",
                path.to_str().unwrap(),
                "--listen",
                "127.0.0.1:0",
            ])
            .env("RUST_LOG", "warn,corral=info")
            .stderr(if std::env::var_os("CORRAL_BENCH_LOG").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("corral starts");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let url = loop {
            let line = lines
                .next_line()
                .await
                .unwrap()
                .expect("corral prints its address");
            if let Some(addr) = line.split("listening on ").nth(1) {
                break addr.trim().to_string();
            }
        };
        // CORRAL_BENCH_LOG=FILE keeps corral's log (its engines' output included) for a look after
        let mut log = std::env::var_os("CORRAL_BENCH_LOG").and_then(|p| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .ok()
        });
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(f) = &mut log {
                    use std::io::Write;
                    let _ = writeln!(f, "{line}");
                }
            }
        });
        Corral { url, child }
    }

    /// Stops corral (and with it the engines it started) and waits for it to exit.
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            // SIGTERM lets corral stop its engines; SIGKILL would orphan them.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.start_kill();
            let _ = self.child.wait().await;
        }
    }
}

/// The `p` quantile (0 to 1) of sorted values, nearest rank; NaN when empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}
