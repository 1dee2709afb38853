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

pub use nvidia_smi::command as nvidia_smi;

/// GPU makers, by the variable their runtimes read to choose devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Vendor {
    /// `CUDA_VISIBLE_DEVICES`
    Nvidia,
    /// `HIP_VISIBLE_DEVICES` and `ROCR_VISIBLE_DEVICES`
    Amd,
    /// `ONEAPI_DEVICE_SELECTOR` (level_zero)
    Intel,
    /// `GGML_VK_VISIBLE_DEVICES`
    Vulkan,
    /// Not pinned: corral only budgets its memory.
    None,
}

impl Vendor {
    pub(crate) fn parse(s: &str) -> Option<Vendor> {
        Some(match s {
            "nvidia" | "cuda" => Vendor::Nvidia,
            "amd" | "rocm" | "hip" => Vendor::Amd,
            "intel" | "sycl" | "oneapi" => Vendor::Intel,
            "vulkan" => Vendor::Vulkan,
            "none" => Vendor::None,
            _ => return None,
        })
    }

    /// The vendor a device name suggests (`cuda0`, `rocm1`, `vulkan0`), for configs without one.
    pub(crate) fn from_name(name: &str) -> Vendor {
        let prefix = name.trim_end_matches(|c: char| c.is_ascii_digit());
        Vendor::parse(prefix).unwrap_or(Vendor::None)
    }
}

/// Runs a vendor tool for the periodic probes: corral's spawner in production, so that the tool
/// is reaped with every other child, and may be killed when it outlives `limit`.
pub trait ToolRunner: Sync {
    fn output(
        &self,
        cmd: tokio::process::Command,
        limit: Duration,
    ) -> impl std::future::Future<Output = std::io::Result<std::process::Output>> + Send;
}

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

/// Memory one process holds on one GPU, which is named by its selector (UUID or index).
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessUse {
    pub vendor: Vendor,
    pub device: String,
    pub pid: u32,
    pub bytes: u64,
}

/// What corral knows an NVIDIA GPU by: its UUID, which per-process readings name it by, else its
/// index.
fn nvidia_selector(index: u32, uuid: Option<&str>) -> String {
    match uuid {
        Some(u) if u.starts_with("GPU-") => u.to_string(),
        _ => index.to_string(),
    }
}

impl Gpu {
    /// The name corral gives it: `cudaN` or `rocmN`.
    pub fn name(&self) -> String {
        let prefix = if self.vendor == Vendor::Amd {
            "rocm"
        } else {
            "cuda"
        };
        format!("{prefix}{}", self.index)
    }

    /// What corral knows it by, and matches per-process memory to it by: the UUID for NVIDIA,
    /// the index for AMD, which is also what an AMD engine is pinned by (HIP and ROCr take
    /// indices everywhere; UUIDs only on recent ROCm). An NVIDIA engine is shown its GPU by
    /// [`Gpu::index`] where CUDA counts in bus order (vLLM takes no UUID): see `fleet::pinning`.
    pub fn selector(&self) -> String {
        match self.vendor {
            Vendor::Amd => self.index.to_string(),
            _ => nvidia_selector(self.index, self.uuid.as_deref()),
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
            g.name(),
            g.product,
            g.uuid.as_deref().unwrap_or("no uuid"),
            crate::memory::format_bytes(g.total)
        );
    }
    found
}

/// Every process's memory on the GPUs of the vendors among `devices` (each a vendor and the
/// selector an engine is pinned by), or `None` when no tool could tell.
pub async fn process_use(
    tools: &impl ToolRunner,
    devices: &[(Vendor, Option<&str>)],
) -> Option<Vec<ProcessUse>> {
    let amd: Vec<String> = devices
        .iter()
        .filter(|(vendor, _)| *vendor == Vendor::Amd)
        .filter_map(|(_, selector)| selector.map(String::from))
        .collect();
    let mut read = None;
    if devices.iter().any(|(vendor, _)| *vendor == Vendor::Nvidia) {
        read = match nvml::process_use().await {
            Some(rows) => Some(rows),
            None => nvidia_smi::process_use(tools).await,
        };
    }
    if !amd.is_empty() {
        if let Some(rows) = rocm_smi::process_use(tools, &amd).await {
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
    fn nvidia_gpus_are_known_by_uuid_and_amd_ones_by_index() {
        let g = gpu(Vendor::Nvidia, 1, Some("GPU-abc"));
        assert_eq!(
            (g.name().as_str(), g.selector().as_str()),
            ("cuda1", "GPU-abc")
        );
        let g = gpu(Vendor::Nvidia, 2, Some("N/A"));
        assert_eq!(g.selector(), "2");
        let g = gpu(Vendor::Amd, 3, Some("0x18f68e602b8a790f"));
        assert_eq!((g.name().as_str(), g.selector().as_str()), ("rocm3", "3"));
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
