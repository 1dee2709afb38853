//! What the machine is and how busy it is: `GET /api/hardware` (CPU, memory, GPUs, OS, corral's
//! version) and the system and GPU samples of `/api/performance`. Linux's `/proc` for the CPU and
//! memory; nvidia-smi (`CORRAL_NVIDIA_SMI`, as the device detection reads it) for the GPUs, else
//! the devices the config names.

use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

use crate::config::Config;

/// How long one nvidia-smi reading may take.
const SMI_TIMEOUT: Duration = Duration::from_secs(5);
const GPU_QUERY: &str = "--query-gpu=index,uuid,name,temperature.gpu,utilization.gpu,\
                         utilization.memory,memory.used,memory.total,power.draw";

/// Busy and total jiffies: the whole CPU first, then each core.
pub struct CpuTimes(Vec<(u64, u64)>);

impl CpuTimes {
    pub fn read() -> CpuTimes {
        CpuTimes(parse_stat(&read("/proc/stat")))
    }

    /// Percent busy since `self` (whole CPU, then per core); moves `self` to now.
    fn busy_since(&mut self) -> (f64, Vec<f64>) {
        let now = CpuTimes::read();
        let pct = |(b0, t0): (u64, u64), (b1, t1): (u64, u64)| {
            let total = t1.saturating_sub(t0);
            match total {
                0 => 0.0,
                t => b1.saturating_sub(b0) as f64 * 100.0 / t as f64,
            }
        };
        let all: Vec<f64> = self
            .0
            .iter()
            .zip(&now.0)
            .map(|(a, b)| pct(*a, *b))
            .collect();
        *self = now;
        let whole = all.first().copied().unwrap_or(0.0);
        (whole, all.into_iter().skip(1).collect())
    }
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The `cpu` lines of `/proc/stat`: busy (all but idle and iowait) and total.
fn parse_stat(text: &str) -> Vec<(u64, u64)> {
    text.lines()
        .filter(|l| l.starts_with("cpu"))
        .map(|l| {
            let v: Vec<u64> = l
                .split_whitespace()
                .skip(1)
                .take(8)
                .filter_map(|n| n.parse().ok())
                .collect();
            let total: u64 = v.iter().sum();
            let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
            (total - idle, total)
        })
        .collect()
}

/// One `sys_stats` entry, in llama-swap's fields (plus the whole CPU's percent).
pub fn system_sample(cpu: &mut CpuTimes, now: SystemTime) -> Value {
    let (whole, cores) = cpu.busy_since();
    let crate::memory::host::HostMemory {
        total,
        available,
        free,
        swap_total,
        swap_free,
    } = crate::memory::host::read();
    let load: Vec<f64> = read("/proc/loadavg")
        .split_whitespace()
        .take(3)
        .filter_map(|n| n.parse().ok())
        .collect();
    let mb = |b: u64| b >> 20;
    json!({
        "timestamp": crate::clock::rfc3339::format(now),
        "cpu_util_pct": whole,
        "cpu_util_per_core": cores,
        "mem_total_mb": mb(total),
        "mem_used_mb": mb(total.saturating_sub(available)),
        "mem_free_mb": mb(free),
        "swap_total_mb": mb(swap_total),
        "swap_used_mb": mb(swap_total.saturating_sub(swap_free)),
        "load_avg_1": load.first().copied().unwrap_or(0.0),
        "load_avg_5": load.get(1).copied().unwrap_or(0.0),
        "load_avg_15": load.get(2).copied().unwrap_or(0.0),
        "net_io": [],
    })
}

/// One GPU as nvidia-smi reports it (`[N/A]` fields read as 0).
fn gpu_row(line: &str) -> Option<Value> {
    let f: Vec<&str> = line.split(',').map(str::trim).collect();
    if f.len() < 9 {
        return None;
    }
    let num = |i: usize| f[i].parse::<f64>().unwrap_or(0.0);
    Some(json!({
        "id": f[0].parse::<u32>().ok()?,
        "uuid": f[1],
        "name": f[2],
        "temp_c": num(3),
        "gpu_util_pct": num(4),
        "mem_util_pct": num(5),
        "mem_used_mb": num(6),
        "mem_total_mb": num(7),
        "power_draw_w": num(8),
    }))
}

/// The last reading of the GPUs and when it was taken.
type Reading = Option<(std::time::Instant, Option<Vec<Value>>)>;
static LAST_READING: tokio::sync::Mutex<Reading> = tokio::sync::Mutex::const_new(None);

/// How long a reading stands in for a new one.
const READING_FRESH: Duration = Duration::from_secs(1);

/// The GPUs nvidia-smi lists, or `None` when it is missing or fails. Readings are taken one at a
/// time and one stands for a second: a burst of `/api/hardware` requests (and the sampler) shares
/// one nvidia-smi rather than start a process each, which would queue on the driver's lock.
async fn query_gpus() -> Option<Vec<Value>> {
    let mut last = LAST_READING.lock().await;
    if let Some((at, gpus)) = &*last {
        if at.elapsed() < READING_FRESH {
            return gpus.clone();
        }
    }
    let gpus = read_gpus().await;
    *last = Some((std::time::Instant::now(), gpus.clone()));
    gpus
}

async fn read_gpus() -> Option<Vec<Value>> {
    let mut cmd = tokio::process::Command::new(crate::gpu::nvidia_smi());
    cmd.args([GPU_QUERY, "--format=csv,noheader,nounits"])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(SMI_TIMEOUT, cmd.output())
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    out.status
        .success()
        .then(|| text.lines().filter_map(gpu_row).collect())
}

/// Reads the GPUs each tick, and stops asking once nvidia-smi proved missing or broken.
#[derive(Default)]
pub struct GpuReader {
    failures: u32,
}

impl GpuReader {
    /// This tick's `gpu_stats` entries.
    pub async fn sample(&mut self, now: SystemTime) -> Vec<Value> {
        if self.failures >= 3 {
            return Vec::new();
        }
        let Some(mut gpus) = query_gpus().await else {
            self.failures += 1;
            return Vec::new();
        };
        self.failures = 0;
        let at = crate::clock::rfc3339::format(now);
        for g in &mut gpus {
            g["timestamp"] = Value::String(at.clone());
        }
        gpus
    }
}

/// `/etc/os-release`'s `PRETTY_NAME`.
fn os_name() -> String {
    read("/etc/os-release")
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_string())
        .unwrap_or_else(|| std::env::consts::OS.to_string())
}

fn cpu_model() -> String {
    read("/proc/cpuinfo")
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            matches!(k.trim(), "model name" | "Model" | "Hardware").then(|| v.trim().to_string())
        })
        .unwrap_or_default()
}

/// The accelerators: nvidia-smi's when it answers, else the devices of the config.
async fn accelerators(config: &Config) -> Vec<Value> {
    if let Some(gpus) = query_gpus().await.filter(|g| !g.is_empty()) {
        let mib = |v: &Value| (v.as_f64().unwrap_or(0.0) as u64) << 20;
        return gpus
            .iter()
            .map(|g| {
                json!({"name": g["name"], "vendor": "nvidia", "uuid": g["uuid"], "source": "nvidia-smi",
                       "memory_total_bytes": mib(&g["mem_total_mb"]),
                       "memory_used_bytes": mib(&g["mem_used_mb"])})
            })
            .collect();
    }
    config
        .devices
        .iter()
        .map(|d| {
            json!({"name": d.name, "vendor": format!("{:?}", d.vendor).to_lowercase(),
                   "source": "config", "memory_total_bytes": d.capacity, "memory_used_bytes": null})
        })
        .collect()
}

/// `GET /api/hardware`.
pub async fn snapshot(config: &Config) -> Value {
    let logical = read("/proc/cpuinfo")
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let usable = std::thread::available_parallelism().map_or(0, |n| n.get());
    let memory = crate::memory::host::read();
    json!({
        "schema_version": 1,
        "architecture": std::env::consts::ARCH,
        "operating_system": {
            "family": std::env::consts::OS,
            "name": os_name(),
            "kernel": read("/proc/sys/kernel/osrelease").trim(),
        },
        "environment": {"container": std::path::Path::new("/.dockerenv").exists()
            || std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()},
        "cpu": {"model": cpu_model(), "cores": usable.max(1), "logical_cores": logical.max(usable)},
        "memory": {"capacity_bytes": memory.total, "available_bytes": memory.available},
        "accelerators": accelerators(config).await,
        "corral": {"version": env!("CARGO_PKG_VERSION")},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_and_nvidia_smi_rows_parse() {
        let stat = "cpu  10 0 10 70 10 0 0 0 0 0\ncpu0 5 0 5 35 5 0 0 0\nintr 1 2\n";
        assert_eq!(parse_stat(stat), vec![(20, 100), (10, 50)]);
        let row = gpu_row("0, GPU-abc, NVIDIA H200, 35, 7, 1, 1024, 143771, [N/A]").unwrap();
        assert_eq!(
            (row["id"].as_u64(), row["name"].as_str()),
            (Some(0), Some("NVIDIA H200"))
        );
        assert_eq!(
            (row["mem_total_mb"].as_f64(), row["power_draw_w"].as_f64()),
            (Some(143771.0), Some(0.0))
        );
        assert!(gpu_row("not, enough").is_none());
    }
}
