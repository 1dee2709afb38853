//! What GPUs this machine has and how much memory each process holds on them, from the vendors'
//! own tools: NVIDIA through NVML (libnvidia-ml, loaded at run time so that corral builds and runs
//! without CUDA) or nvidia-smi where the library is missing, AMD through rocm-smi. `devices: auto`
//! reads the GPUs once at config load; the `deviceRefresh` task reads the processes. Every probe
//! runs off the request path and is bounded in time: a sick driver can hang a query forever.

mod nvidia_smi;
mod nvml;
mod rocm_smi;

use std::sync::mpsc;
use std::time::Duration;

use crate::config::{Device, Vendor};
use crate::supervisor::Spawner;

/// How long one probe may take before it is given up.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// A GPU as its vendor's tool reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Gpu {
    pub vendor: Vendor,
    /// The vendor tool's index (`nvidia-smi -i`, rocm-smi's `cardN`).
    pub index: u32,
    /// The vendor's stable id (`GPU-…` for NVIDIA, `0x…` for AMD), where reported.
    pub uuid: Option<String>,
    /// The product name (`NVIDIA H100 80GB HBM3`); empty where the tool does not say.
    pub product: String,
    /// Installed memory, in bytes.
    pub total: u64,
}

/// Memory one process holds on one GPU, which is named as its [`Device::select_as`] names it.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessUse {
    pub vendor: Vendor,
    pub device: String,
    pub pid: u32,
    pub bytes: u64,
}

/// What an NVIDIA GPU is selected by: its UUID (renumbering cannot move an engine), else its index.
fn nvidia_selector(index: u32, uuid: Option<&str>) -> String {
    match uuid {
        Some(u) if u.starts_with("GPU-") => u.to_string(),
        _ => index.to_string(),
    }
}

impl Gpu {
    /// The device corral budgets: `cudaN` or `rocmN`, 5% kept in reserve, pinned by UUID for
    /// NVIDIA and by index for AMD (HIP and ROCr take indices everywhere; UUIDs only on recent
    /// ROCm).
    pub fn device(&self) -> Device {
        let (prefix, select_as) = match self.vendor {
            Vendor::Amd => ("rocm", self.index.to_string()),
            _ => ("cuda", nvidia_selector(self.index, self.uuid.as_deref())),
        };
        Device {
            name: format!("{prefix}{}", self.index),
            capacity: self.total,
            reserve: self.total / 20,
            vendor: self.vendor,
            select_as: Some(select_as),
        }
    }
}

/// `devices: auto`: the NVIDIA GPUs (NVML, else nvidia-smi); where there are none, the AMD ones
/// (rocm-smi); else none.
pub fn discover() -> Vec<Gpu> {
    let nvidia = nvml::gpus()
        .or_else(nvidia_smi::gpus)
        .filter(|g| !g.is_empty());
    let found = nvidia.or_else(rocm_smi::gpus).unwrap_or_default();
    for g in &found {
        tracing::debug!(
            "found {} {:?} ({}, {})",
            g.device().name,
            g.product,
            g.uuid.as_deref().unwrap_or("no uuid"),
            crate::memory::format_bytes(g.total)
        );
    }
    found
}

/// Every process's memory on the GPUs of the vendors among `devices`, or `None` when no tool
/// could tell.
pub async fn process_use(spawner: &Spawner, devices: &[Device]) -> Option<Vec<ProcessUse>> {
    let amd: Vec<String> = devices
        .iter()
        .filter(|d| d.vendor == Vendor::Amd)
        .filter_map(|d| d.select_as.clone())
        .collect();
    let mut read = None;
    if devices.iter().any(|d| d.vendor == Vendor::Nvidia) {
        read = match nvml::process_use().await {
            Some(rows) => Some(rows),
            None => nvidia_smi::process_use(spawner).await,
        };
    }
    if !amd.is_empty() {
        if let Some(rows) = rocm_smi::process_use(spawner, &amd).await {
            read.get_or_insert_with(Vec::new).extend(rows);
        }
    }
    read
}

/// Runs `probe` on a thread of its own and waits at most `limit` for it; `None` past that (the
/// thread is left to finish or hang alone). For the probes at config load, which is synchronous.
fn bounded<T: Send + 'static>(
    limit: Duration,
    probe: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("corral-gpu-probe".into())
        .spawn(move || {
            let _ = tx.send(probe());
        })
        .ok()?;
    rx.recv_timeout(limit).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(vendor: Vendor, index: u32, uuid: Option<&str>) -> Gpu {
        Gpu {
            vendor,
            index,
            uuid: uuid.map(String::from),
            product: String::new(),
            total: 20 << 30,
        }
    }

    #[test]
    fn nvidia_gpus_are_pinned_by_uuid_and_amd_ones_by_index() {
        let d = gpu(Vendor::Nvidia, 1, Some("GPU-abc")).device();
        assert_eq!(
            (d.name.as_str(), d.select_as.as_deref(), d.reserve),
            ("cuda1", Some("GPU-abc"), 1 << 30)
        );
        let d = gpu(Vendor::Nvidia, 2, Some("N/A")).device();
        assert_eq!(d.select_as.as_deref(), Some("2"));
        let d = gpu(Vendor::Amd, 3, Some("0x18f68e602b8a790f")).device();
        assert_eq!(
            (d.name.as_str(), d.select_as.as_deref(), d.vendor),
            ("rocm3", Some("3"), Vendor::Amd)
        );
    }

    #[test]
    fn a_probe_that_hangs_is_given_up() {
        let started = std::time::Instant::now();
        let out = bounded(Duration::from_millis(50), || {
            std::thread::sleep(Duration::from_secs(5));
            1
        });
        assert_eq!(out, None);
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(bounded(Duration::from_secs(5), || 2), Some(2));
    }
}
