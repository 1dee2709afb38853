//! The memory ledger: what each instance needs, and where a new one fits.
//!
//! An instance is charged on its devices from the moment it starts until its process has exited
//! (starting, ready and stopping all count), so memory is counted as free only when it really is.
//! Placement is a pure function over the charges, so the rules can be tested without processes.

use std::path::Path;
use std::time::Instant;

use crate::config::{Device, InstanceSpec, ModelConfig};
use crate::memory;

/// What an instance needs, worked out once from the config.
#[derive(Debug, Clone, Default)]
pub struct Need {
    /// Device memory to charge (an estimate until the engine reports its allocations).
    pub bytes: u64,
    /// Bytes of weights to read at load, for the load deadline.
    pub weights: u64,
    /// Where the figure comes from, for logs and `corral check`.
    pub source: String,
}

/// Works out an instance's need: `memory.bytes`, else parameters × quantization, else the GGUF
/// estimate of a llama-server command line.
pub fn need_of(model: &ModelConfig, spec: &InstanceSpec) -> Need {
    let args = memory::parse_llama_args(&spec.argv);
    let weights = args.model.as_deref().map(weights_on_disk).unwrap_or(0)
        + args.mmproj.as_deref().map(weights_on_disk).unwrap_or(0);
    let from_params = || {
        let quant = model.memory.quant.clone().unwrap_or_else(|| "fp16".into());
        model
            .memory
            .params
            .and_then(|p| memory::estimate_params(p, &quant, model.memory.kv_bytes).ok())
    };
    if let Some(bytes) = model.memory.bytes {
        return Need {
            bytes,
            weights: weights.max(from_params().unwrap_or(0)),
            source: "memory.bytes".into(),
        };
    }
    if let Some(bytes) = from_params() {
        return Need {
            bytes,
            weights: weights.max(bytes),
            source: "memory.params".into(),
        };
    }
    if args.model.is_some() {
        match memory::estimate_llama(&args) {
            Ok(e) => {
                return Need {
                    bytes: e.total_bytes,
                    weights: weights.max(e.file_weights_bytes),
                    source: "GGUF estimate".into(),
                }
            }
            Err(e) => {
                return Need {
                    bytes: 0,
                    weights,
                    source: format!("no estimate: {e}"),
                }
            }
        }
    }
    Need {
        bytes: 0,
        weights,
        source: "unknown (no -m and no memory key)".into(),
    }
}

/// The size of a model file, with every part of a split GGUF.
fn weights_on_disk(path: &Path) -> u64 {
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    match gguf::parse_split_name(path) {
        Some((prefix, _, count)) => (1..=count)
            .map(|n| size(&gguf::split_path(&prefix, n, count)))
            .sum(),
        None => size(path),
    }
}

/// An instance that holds memory now.
#[derive(Debug, Clone)]
pub struct Holder {
    pub id: String,
    pub devices: Vec<usize>,
    pub bytes: u64,
    /// Requests in flight or waiting: never evicted.
    pub busy: bool,
    /// Already stopping: its memory comes back when it exits.
    pub stopping: bool,
    pub last_used: Instant,
}

impl Holder {
    fn on(&self, device: usize) -> u64 {
        if self.devices.contains(&device) {
            self.bytes.div_ceil(self.devices.len().max(1) as u64)
        } else {
            0
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Placement {
    /// Start on these devices.
    Fits(Vec<usize>),
    /// Stop these idle instances first (least recently used first).
    Evict(Vec<String>),
    /// Instances that are stopping will free enough: wait for them.
    WaitForStops,
    /// Only busy instances hold the memory: wait for one to become idle. The message names them.
    Blocked(String),
    /// It can never fit.
    Never(String),
}

pub fn charged(holders: &[Holder], device: usize) -> u64 {
    holders.iter().map(|h| h.on(device)).sum()
}

/// Where `need` bytes can go, given the current holders. `pinned` lists the devices the model must
/// be split across; empty means any single device.
pub fn place(devices: &[Device], need: u64, pinned: &[usize], holders: &[Holder]) -> Placement {
    let candidates: Vec<Vec<usize>> = if pinned.is_empty() {
        (0..devices.len()).map(|d| vec![d]).collect()
    } else {
        vec![pinned.to_vec()]
    };
    let mut best: Option<((u8, u64), Placement)> = None;
    let mut blocked = Vec::new();
    let mut never = Vec::new();
    for c in candidates {
        let per = need.div_ceil(c.len() as u64);
        if let Some(d) = c.iter().find(|d| devices[**d].usable() < per) {
            never.push(format!(
                "{} has {} usable",
                devices[*d].name,
                memory::format_bytes(devices[*d].usable())
            ));
            continue;
        }
        let free =
            |d: usize, extra: u64| devices[d].usable().saturating_sub(charged(holders, d)) + extra;
        if c.iter().all(|d| free(*d, 0) >= per) {
            let headroom = c.iter().map(|d| free(*d, 0) - per).min().unwrap_or(0);
            // fitting now beats everything; among fits, the most headroom left
            consider(&mut best, (0, u64::MAX - headroom), Placement::Fits(c));
            continue;
        }
        let stopping = |d: usize| {
            holders
                .iter()
                .filter(|h| h.stopping)
                .map(|h| h.on(d))
                .sum::<u64>()
        };
        if c.iter().all(|d| free(*d, stopping(*d)) >= per) {
            consider(&mut best, (1, 0), Placement::WaitForStops);
            continue;
        }
        let mut idle: Vec<&Holder> = holders
            .iter()
            .filter(|h| !h.busy && !h.stopping && h.devices.iter().any(|d| c.contains(d)))
            .collect();
        idle.sort_by_key(|h| h.last_used);
        let mut chosen: Vec<&Holder> = Vec::new();
        let fits = |chosen: &[&Holder]| {
            c.iter().all(|d| {
                free(
                    *d,
                    stopping(*d) + chosen.iter().map(|h| h.on(*d)).sum::<u64>(),
                ) >= per
            })
        };
        for h in idle {
            if fits(&chosen) {
                break;
            }
            chosen.push(h);
        }
        if fits(&chosen) {
            let evicted: u64 = chosen.iter().map(|h| h.bytes).sum();
            consider(
                &mut best,
                (2, evicted),
                Placement::Evict(chosen.iter().map(|h| h.id.clone()).collect()),
            );
        } else {
            for h in holders
                .iter()
                .filter(|h| h.busy && h.devices.iter().any(|d| c.contains(d)))
            {
                let entry = format!("{} ({})", h.id, memory::format_bytes(h.bytes));
                if !blocked.contains(&entry) {
                    blocked.push(entry);
                }
            }
        }
    }
    match best {
        Some((_, p)) => p,
        None if !blocked.is_empty() => {
            Placement::Blocked(format!("held by {} (serving)", blocked.join(", ")))
        }
        None if !never.is_empty() => Placement::Never(never.join("; ")),
        None => Placement::Blocked("no device has room".into()),
    }
}

/// Keeps the better placement: lower class first (fits, wait, evict), then the lower measure.
fn consider(best: &mut Option<((u8, u64), Placement)>, key: (u8, u64), p: Placement) {
    if best.as_ref().is_none_or(|(k, _)| key < *k) {
        *best = Some((key, p));
    }
}

/// What a loaded llama-server reported allocating on devices (host buffers left out), from its
/// `... buffer size = N MiB` lines.
pub fn measured_from_log(text: &str) -> Option<u64> {
    let mut total = 0;
    let mut found = false;
    for line in text.lines() {
        if let Some((device, _kind, bytes)) = memory::parse_buffer_report(line) {
            if device.contains("CPU") || device.contains("Host") {
                continue;
            }
            total += bytes;
            found = true;
        }
    }
    found.then_some(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const GIB: u64 = 1 << 30;

    fn gpu(name: &str, gib: u64) -> Device {
        Device {
            name: name.into(),
            capacity: gib * GIB,
            reserve: 0,
            vendor: crate::config::Vendor::None,
            select_as: None,
        }
    }

    fn holder(id: &str, gib: u64, busy: bool, age_s: u64) -> Holder {
        Holder {
            id: id.into(),
            devices: vec![0],
            bytes: gib * GIB,
            busy,
            stopping: false,
            last_used: Instant::now() - Duration::from_secs(age_s),
        }
    }

    #[test]
    fn device_buffers_are_summed_and_host_buffers_ignored() {
        let log = "load_tensors:        CUDA0 model buffer size =  1024.00 MiB\nload_tensors:   CPU_Mapped model buffer size =   281.81 MiB\nllama_kv_cache:      CUDA0 KV buffer size =   256.00 MiB\nsched_reserve:      CUDA0 compute buffer size =   300.00 MiB\nsched_reserve:  CUDA_Host compute buffer size =    12.00 MiB\n";
        assert_eq!(
            measured_from_log(log),
            Some((1024 + 256 + 300) * 1024 * 1024)
        );
        assert_eq!(measured_from_log("nothing here"), None);
    }

    #[test]
    fn fits_when_there_is_room() {
        assert_eq!(
            place(&[gpu("g", 10)], 4 * GIB, &[], &[holder("a", 4, false, 0)]),
            Placement::Fits(vec![0])
        );
    }

    #[test]
    fn evicts_the_least_recently_used_idle_instance() {
        let holders = [holder("a", 4, false, 10), holder("b", 4, false, 100)];
        assert_eq!(
            place(&[gpu("g", 10)], 4 * GIB, &[], &holders),
            Placement::Evict(vec!["b".into()])
        );
    }

    #[test]
    fn never_evicts_a_busy_instance() {
        let holders = [holder("a", 8, true, 100)];
        match place(&[gpu("g", 10)], 4 * GIB, &[], &holders) {
            Placement::Blocked(msg) => assert!(msg.contains("a (8.00 GiB)"), "{msg}"),
            other => panic!("{other:?}"),
        }
        let mixed = [holder("busy", 4, true, 100), holder("idle", 4, false, 1)];
        assert_eq!(
            place(&[gpu("g", 10)], 4 * GIB, &[], &mixed),
            Placement::Evict(vec!["idle".into()])
        );
    }

    #[test]
    fn waits_for_stopping_instances_instead_of_evicting_more() {
        let mut stopping = holder("s", 4, false, 0);
        stopping.stopping = true;
        let holders = [stopping, holder("idle", 4, false, 100)];
        assert_eq!(
            place(&[gpu("g", 10)], 6 * GIB, &[], &holders),
            Placement::WaitForStops
        );
    }

    #[test]
    fn too_big_is_never() {
        assert!(matches!(
            place(&[gpu("g", 10)], 11 * GIB, &[], &[]),
            Placement::Never(_)
        ));
    }

    #[test]
    fn picks_the_device_with_room_and_splits_pinned_models() {
        let devices = [gpu("g0", 10), gpu("g1", 10)];
        assert_eq!(
            place(&devices, 4 * GIB, &[], &[holder("a", 8, true, 0)]),
            Placement::Fits(vec![1])
        );
        // 16 GiB split over both: 8 each, but g0 has only 2 free and its holder is busy
        assert!(matches!(
            place(&devices, 16 * GIB, &[0, 1], &[holder("a", 8, true, 0)]),
            Placement::Blocked(_)
        ));
        assert_eq!(
            place(&devices, 16 * GIB, &[0, 1], &[]),
            Placement::Fits(vec![0, 1])
        );
    }
}
