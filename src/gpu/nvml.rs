//! NVML, NVIDIA's management library, opened at run time: no CUDA at build time, and no
//! nvidia-smi process forked every refresh. Where the library is missing (any machine without the
//! NVIDIA driver) every call here answers `None` and the caller falls back to nvidia-smi.
//!
//! A driver in a bad state can hang an NVML call: each call runs on a thread of its own with a
//! deadline, and once one has overrun NVML is not used again (nvidia-smi, bounded per run, takes
//! over).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;

use super::{nvidia_selector, Gpu, ProcessUse, Vendor, PROBE_TIMEOUT};

/// One GPU as NVML describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Card {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub total: u64,
}

/// The NVML calls corral makes, behind a trait so that the mapping to devices is testable without
/// the library.
pub trait Probe {
    fn count(&self) -> Result<u32, String>;
    fn card(&self, at: u32) -> Result<Card, String>;
    /// `(pid, bytes)` of each compute process on the GPU at `at`; `None` bytes where the driver
    /// cannot tell (Windows WDDM).
    fn processes(&self, at: u32) -> Result<Vec<(u32, Option<u64>)>, String>;
}

/// Every GPU, in NVML's order.
pub fn gpus_of(p: &impl Probe) -> Result<Vec<Gpu>, String> {
    (0..p.count()?)
        .map(|at| {
            let c = p.card(at)?;
            Ok(Gpu {
                vendor: Vendor::Nvidia,
                index: c.index,
                uuid: Some(c.uuid),
                product: c.name,
                total: c.total,
            })
        })
        .collect()
}

/// Every compute process's memory on every GPU, each GPU named as its device is selected.
pub fn process_use_of(p: &impl Probe) -> Result<Vec<ProcessUse>, String> {
    let mut out = Vec::new();
    for at in 0..p.count()? {
        let c = p.card(at)?;
        let device = nvidia_selector(c.index, Some(&c.uuid));
        for (pid, bytes) in p.processes(at)? {
            if let Some(bytes) = bytes {
                out.push(ProcessUse {
                    vendor: Vendor::Nvidia,
                    device: device.clone(),
                    pid,
                    bytes,
                });
            }
        }
    }
    Ok(out)
}

/// The loaded library.
struct Real(&'static Nvml);

fn text(e: nvml_wrapper::error::NvmlError) -> String {
    e.to_string()
}

impl Probe for Real {
    fn count(&self) -> Result<u32, String> {
        self.0.device_count().map_err(text)
    }

    fn card(&self, at: u32) -> Result<Card, String> {
        let d = self.0.device_by_index(at).map_err(text)?;
        Ok(Card {
            index: d.index().map_err(text)?,
            name: d.name().map_err(text)?,
            uuid: d.uuid().map_err(text)?,
            total: d.memory_info().map_err(text)?.total,
        })
    }

    fn processes(&self, at: u32) -> Result<Vec<(u32, Option<u64>)>, String> {
        let d = self.0.device_by_index(at).map_err(text)?;
        let procs = d.running_compute_processes().map_err(text)?;
        Ok(procs
            .into_iter()
            .map(|p| match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => (p.pid, Some(b)),
                UsedGpuMemory::Unavailable => (p.pid, None),
            })
            .collect())
    }
}

/// Set once a call overran its deadline: NVML is then left alone.
static HUNG: AtomicBool = AtomicBool::new(false);

/// The library, opened on first use. Not at all when `CORRAL_NVIDIA_SMI` names a command: that
/// command is then what lists the GPUs.
fn library() -> Option<&'static Nvml> {
    static LIB: OnceLock<Option<Nvml>> = OnceLock::new();
    if std::env::var_os("CORRAL_NVIDIA_SMI").is_some() || HUNG.load(Ordering::Relaxed) {
        return None;
    }
    LIB.get_or_init(|| {
        // the unversioned name is only there with the development files
        let mut last = String::new();
        for name in ["libnvidia-ml.so.1", "libnvidia-ml.so"] {
            match Nvml::builder().lib_path(name.as_ref()).init() {
                Ok(nvml) => return Some(nvml),
                Err(e) => last = e.to_string(),
            }
        }
        tracing::debug!("NVML not available ({last}); GPUs are read with nvidia-smi");
        None
    })
    .as_ref()
}

/// Notes a call that overran, so that no further call waits on a hung driver.
fn overran<T>(out: Option<T>) -> Option<T> {
    if out.is_none() {
        HUNG.store(true, Ordering::Relaxed);
        tracing::warn!(
            "NVML gave no answer within {}s; reading GPUs with nvidia-smi from now on",
            PROBE_TIMEOUT.as_secs()
        );
    }
    out
}

/// The GPUs NVML lists, or `None` when it is missing or fails.
pub fn gpus() -> Option<Vec<Gpu>> {
    let read = super::bounded(PROBE_TIMEOUT, || library().map(|l| gpus_of(&Real(l))));
    settle(overran(read)?)
}

/// Every compute process's memory, or `None` when NVML is missing or fails.
pub async fn process_use() -> Option<Vec<ProcessUse>> {
    if std::env::var_os("CORRAL_NVIDIA_SMI").is_some() || HUNG.load(Ordering::Relaxed) {
        return None;
    }
    let call = tokio::task::spawn_blocking(|| library().map(|l| process_use_of(&Real(l))));
    let read = tokio::time::timeout(PROBE_TIMEOUT, call).await.ok();
    settle(overran(read)?.ok()?)
}

/// An answer from a loaded library, its failure logged (the caller falls back).
fn settle<T>(read: Option<Result<T, String>>) -> Option<T> {
    match read? {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::debug!("NVML failed ({e}); trying nvidia-smi");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two GPUs: the first with a process of unknown size, the second one listed by index 5.
    struct Fake;

    impl Probe for Fake {
        fn count(&self) -> Result<u32, String> {
            Ok(2)
        }
        fn card(&self, at: u32) -> Result<Card, String> {
            Ok(Card {
                index: [0, 5][at as usize],
                name: "NVIDIA H200".into(),
                uuid: format!("GPU-{at}"),
                total: (141 << 30) + at as u64,
            })
        }
        fn processes(&self, at: u32) -> Result<Vec<(u32, Option<u64>)>, String> {
            Ok(match at {
                0 => vec![(10, Some(1 << 30)), (11, None)],
                _ => vec![(12, Some(2 << 30))],
            })
        }
    }

    #[test]
    fn nvml_cards_become_devices_known_by_uuid_beside_their_index() {
        let gpus = gpus_of(&Fake).unwrap();
        assert_eq!(gpus[0].name(), "cuda0");
        assert_eq!(gpus[1].name(), "cuda5");
        assert_eq!(gpus[1].selector(), "GPU-1");
        assert_eq!(gpus[1].index, 5);
        assert_eq!(gpus[1].total, (141 << 30) + 1);
        assert_eq!(gpus[1].vendor, Vendor::Nvidia);
        assert_eq!(gpus[0].product, "NVIDIA H200");
    }

    #[test]
    fn processes_are_named_by_their_gpus_uuid_and_unknown_sizes_skipped() {
        let rows = process_use_of(&Fake).unwrap();
        let seen: Vec<_> = rows
            .iter()
            .map(|r| (r.device.as_str(), r.pid, r.bytes))
            .collect();
        assert_eq!(seen, [("GPU-0", 10, 1 << 30), ("GPU-1", 12, 2 << 30)]);
    }

    struct Broken;

    impl Probe for Broken {
        fn count(&self) -> Result<u32, String> {
            Ok(1)
        }
        fn card(&self, _: u32) -> Result<Card, String> {
            Err("GPU is lost".into())
        }
        fn processes(&self, _: u32) -> Result<Vec<(u32, Option<u64>)>, String> {
            Ok(Vec::new())
        }
    }

    #[test]
    fn a_failing_gpu_fails_the_reading_so_nvidia_smi_is_asked() {
        assert_eq!(gpus_of(&Broken), Err("GPU is lost".into()));
        assert!(process_use_of(&Broken).is_err());
    }

    #[test]
    fn without_the_library_nothing_is_read() {
        // no NVIDIA driver on the machines that build corral
        if library().is_none() {
            assert_eq!(gpus(), None);
        }
    }
}
