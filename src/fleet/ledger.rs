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

/// Bytes charged on each device an instance is placed on.
pub type Charges = Vec<(usize, u64)>;

/// Device indices of some charges.
pub fn devices_of(charges: &Charges) -> Vec<usize> {
    charges.iter().map(|(d, _)| *d).collect()
}

/// An instance that holds memory now.
#[derive(Debug, Clone)]
pub struct Holder {
    pub id: String,
    pub devices: Charges,
    pub bytes: u64,
    /// Requests in flight or waiting: never evicted.
    pub busy: bool,
    /// Already stopping: its memory comes back when it exits.
    pub stopping: bool,
    pub last_used: Instant,
}

impl Holder {
    fn on(&self, device: usize) -> u64 {
        self.devices
            .iter()
            .filter(|(d, _)| *d == device)
            .map(|(_, b)| *b)
            .sum()
    }

    fn uses(&self, devices: &Charges) -> bool {
        self.devices
            .iter()
            .any(|(d, _)| devices.iter().any(|(c, _)| c == d))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Placement {
    /// Start on these devices, charged this much on each.
    Fits(Charges),
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
/// be split across evenly; empty means any single device, or, for a model no single device can
/// hold, a split over the fewest devices that can.
pub fn place(devices: &[Device], need: u64, pinned: &[usize], holders: &[Holder]) -> Placement {
    place_by(devices, need, pinned, holders, false)
}

/// [`place`], choosing among the devices it fits on now by the least room left when `pack` (bin
/// packing: whole devices stay free for big models) instead of the most (spreading).
pub fn place_by(
    devices: &[Device],
    need: u64,
    pinned: &[usize],
    holders: &[Holder],
    pack: bool,
) -> Placement {
    let candidates: Vec<Charges> = if pinned.is_empty() {
        let singles = (0..devices.len()).map(|d| vec![(d, need)]);
        singles.chain(split(devices, need, holders)).collect()
    } else {
        let per = need.div_ceil(pinned.len() as u64);
        vec![pinned.iter().map(|d| (*d, per)).collect()]
    };
    let mut best: Option<((u8, u64), Placement)> = None;
    let mut blocked = Vec::new();
    let mut never = Vec::new();
    for c in candidates {
        if let Some((d, _)) = c.iter().find(|(d, share)| devices[*d].usable() < *share) {
            never.push(format!(
                "{} has {} usable",
                devices[*d].name,
                memory::format_bytes(devices[*d].usable())
            ));
            continue;
        }
        let free =
            |d: usize, extra: u64| devices[d].usable().saturating_sub(charged(holders, d)) + extra;
        if c.iter().all(|(d, share)| free(*d, 0) >= *share) {
            let headroom = c
                .iter()
                .map(|(d, share)| free(*d, 0) - share)
                .min()
                .unwrap_or(0);
            // fitting now beats everything; one device beats a split; then the most headroom left
            // (spread) or the least (pack)
            let class = if c.len() == 1 { 0 } else { 1 };
            let measure = if pack { headroom } else { u64::MAX - headroom };
            consider(&mut best, (class, measure), Placement::Fits(c));
            continue;
        }
        let stopping = |d: usize| {
            holders
                .iter()
                .filter(|h| h.stopping)
                .map(|h| h.on(d))
                .sum::<u64>()
        };
        if c.iter().all(|(d, share)| free(*d, stopping(*d)) >= *share) {
            consider(&mut best, (2, 0), Placement::WaitForStops);
            continue;
        }
        let mut idle: Vec<&Holder> = holders
            .iter()
            .filter(|h| !h.busy && !h.stopping && h.uses(&c))
            .collect();
        idle.sort_by_key(|h| h.last_used);
        let mut chosen: Vec<&Holder> = Vec::new();
        let fits = |chosen: &[&Holder]| {
            c.iter().all(|(d, share)| {
                free(
                    *d,
                    stopping(*d) + chosen.iter().map(|h| h.on(*d)).sum::<u64>(),
                ) >= *share
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
                (3, evicted),
                Placement::Evict(chosen.iter().map(|h| h.id.clone()).collect()),
            );
        } else {
            for h in holders.iter().filter(|h| h.busy && h.uses(&c)) {
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

/// A model no single device can hold, split over the fewest devices that can (those with the most
/// room first), each charged in proportion to its room: free memory now when that is enough, else
/// usable memory (room that evicting idle holders would make). `None` when no split is needed or
/// none can ever hold it.
fn split(devices: &[Device], need: u64, holders: &[Holder]) -> Option<Charges> {
    if devices.len() < 2 || devices.iter().any(|d| d.usable() >= need) {
        return None;
    }
    let free = |d: usize| devices[d].usable().saturating_sub(charged(holders, d));
    let mut order: Vec<usize> = (0..devices.len()).collect();
    order.sort_by_key(|d| {
        (
            std::cmp::Reverse(free(*d)),
            std::cmp::Reverse(devices[*d].usable()),
        )
    });
    let mut chosen = Vec::new();
    for d in order {
        chosen.push(d);
        if chosen.iter().map(|d| devices[*d].usable()).sum::<u64>() >= need {
            break;
        }
    }
    let room: u64 = chosen.iter().map(|d| free(*d)).sum();
    let basis = |d: usize| {
        if room >= need {
            free(d)
        } else {
            devices[d].usable()
        }
    };
    proportional(need, &chosen, basis).filter(|c| c.iter().all(|(d, b)| *b <= devices[*d].usable()))
}

/// `need` shared over `chosen` in proportion to `basis`, the last one taking the rounding.
fn proportional(need: u64, chosen: &[usize], basis: impl Fn(usize) -> u64) -> Option<Charges> {
    let total: u128 = chosen.iter().map(|d| u128::from(basis(*d))).sum();
    if total == 0 {
        return None;
    }
    let mut left = need;
    let mut charges: Charges = chosen
        .iter()
        .map(|d| {
            let share = (u128::from(need) * u128::from(basis(*d)) / total) as u64;
            left -= share.min(left);
            (*d, share)
        })
        .collect();
    if let Some(last) = charges.last_mut() {
        last.1 += left;
    }
    Some(charges)
}

/// Keeps the better placement: lower class first (fits on one device, fits split, wait, evict),
/// then the lower measure.
fn consider(best: &mut Option<((u8, u64), Placement)>, key: (u8, u64), p: Placement) {
    if best.as_ref().is_none_or(|(k, _)| key < *k) {
        *best = Some((key, p));
    }
}

/// The devices as placement sees them once other programs' use is taken out: what they hold counts
/// as reserved (usable = capacity - reserve - used by others).
pub fn less_outside_use(devices: &[Device], others: &[u64]) -> Vec<Device> {
    devices
        .iter()
        .enumerate()
        .map(|(i, d)| Device {
            reserve: (d.reserve + others.get(i).copied().unwrap_or(0)).min(d.capacity),
            ..d.clone()
        })
        .collect()
}

/// Idle instances to stop because a device holds more than it can (other programs grew, or an
/// engine allocated more than it was charged): on each such device, least recently used first,
/// until what is left fits. Busy instances are never chosen; stopping ones already count as gone.
pub fn over_capacity(devices: &[Device], holders: &[Holder]) -> Vec<String> {
    let mut chosen: Vec<&Holder> = Vec::new();
    for (d, device) in devices.iter().enumerate() {
        let staying = |chosen: &[&Holder]| {
            holders
                .iter()
                .filter(|h| !h.stopping && !chosen.iter().any(|c| c.id == h.id))
                .map(|h| h.on(d))
                .sum::<u64>()
        };
        let mut idle: Vec<&Holder> = holders
            .iter()
            .filter(|h| !h.busy && !h.stopping && h.on(d) > 0)
            .collect();
        idle.sort_by_key(|h| h.last_used);
        for h in idle {
            if staying(&chosen) <= device.usable() {
                break;
            }
            if !chosen.iter().any(|c| c.id == h.id) {
                chosen.push(h);
            }
        }
    }
    chosen.into_iter().map(|h| h.id.clone()).collect()
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

/// How far an engine's report may exceed its charge on a device before it counts as an overrun
/// (percent): estimates are rounded, and a few percent either way is normal.
pub const OVERRUN_TOLERANCE_PERCENT: u64 = 10;

/// What a loaded llama-server reported allocating on each device it was shown, by the device's
/// position among them (`CUDA1` is the second device made visible), host buffers left out.
pub fn measured_by_device(text: &str) -> Vec<(usize, u64)> {
    let mut out: Vec<(usize, u64)> = Vec::new();
    for line in text.lines() {
        let Some((device, _kind, bytes)) = memory::parse_buffer_report(line) else {
            continue;
        };
        if device.contains("CPU") || device.contains("Host") {
            continue;
        }
        let digits = &device[device.trim_end_matches(|c: char| c.is_ascii_digit()).len()..];
        let position = digits.parse().unwrap_or(0);
        match out.iter_mut().find(|(p, _)| *p == position) {
            Some((_, total)) => *total += bytes,
            None => out.push((position, bytes)),
        }
    }
    out
}

/// A device whose report exceeded its charge by more than the tolerance.
#[derive(Debug, Clone, PartialEq)]
pub struct Overrun {
    pub device: usize,
    pub charged: u64,
    pub reported: u64,
}

/// The charges with each reported device's figure in place of the estimate (`reported` by
/// position among `placed`, the order the devices were made visible), and the devices that
/// overran. Positions beyond the placement are ignored.
pub fn corrected(placed: &Charges, reported: &[(usize, u64)]) -> (Charges, Vec<Overrun>) {
    let mut charges = placed.clone();
    let mut overruns = Vec::new();
    for (position, bytes) in reported {
        let Some((device, charge)) = charges.get_mut(*position) else {
            continue;
        };
        let allowed = *charge + *charge * OVERRUN_TOLERANCE_PERCENT / 100;
        if *bytes > allowed {
            overruns.push(Overrun {
                device: *device,
                charged: *charge,
                reported: *bytes,
            });
        }
        *charge = *bytes;
    }
    (charges, overruns)
}

#[cfg(test)]
#[path = "ledger_props.rs"]
mod props;

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
            devices: vec![(0, gib * GIB)],
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
            Placement::Fits(vec![(0, 4 * GIB)])
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
            Placement::Fits(vec![(1, 4 * GIB)])
        );
        // 16 GiB split over both: 8 each, but g0 has only 2 free and its holder is busy
        assert!(matches!(
            place(&devices, 16 * GIB, &[0, 1], &[holder("a", 8, true, 0)]),
            Placement::Blocked(_)
        ));
        assert_eq!(
            place(&devices, 16 * GIB, &[0, 1], &[]),
            Placement::Fits(vec![(0, 8 * GIB), (1, 8 * GIB)])
        );
    }

    #[test]
    fn a_model_no_device_holds_is_split_in_proportion_to_the_room() {
        let two = [gpu("g0", 24), gpu("g1", 24)];
        assert_eq!(
            place(&two, 30 * GIB, &[], &[]),
            Placement::Fits(vec![(0, 15 * GIB), (1, 15 * GIB)])
        );
        // 8 GiB busy on g1: 24 and 16 free, so 18 and 12 of 30
        let held = [Holder {
            devices: vec![(1, 8 * GIB)],
            ..holder("a", 8, true, 0)
        }];
        assert_eq!(
            place(&two, 30 * GIB, &[], &held),
            Placement::Fits(vec![(0, 18 * GIB), (1, 12 * GIB)])
        );
        // the fewest devices that can hold it: the two large ones, not the small one too
        let three = [gpu("small", 8), gpu("g1", 24), gpu("g2", 24)];
        assert_eq!(
            place(&three, 30 * GIB, &[], &[]),
            Placement::Fits(vec![(1, 15 * GIB), (2, 15 * GIB)])
        );
        assert!(matches!(
            place(&two, 60 * GIB, &[], &[]),
            Placement::Never(_)
        ));
        // one device that can hold it beats a split
        assert_eq!(
            place(&three, 20 * GIB, &[], &[]),
            Placement::Fits(vec![(1, 20 * GIB)])
        );
    }

    #[test]
    fn pack_fills_the_fullest_device_that_fits_and_spread_the_emptiest() {
        let devices = [gpu("g0", 24), gpu("g1", 24)];
        let held = [Holder {
            devices: vec![(1, 10 * GIB)],
            ..holder("a", 10, true, 0)
        }];
        assert_eq!(
            place(&devices, 4 * GIB, &[], &held),
            Placement::Fits(vec![(0, 4 * GIB)]),
            "spread: the most room"
        );
        assert_eq!(
            place_by(&devices, 4 * GIB, &[], &held, true),
            Placement::Fits(vec![(1, 4 * GIB)]),
            "pack: the least room that still fits"
        );
        assert_eq!(
            place_by(&devices, 20 * GIB, &[], &held, true),
            Placement::Fits(vec![(0, 20 * GIB)]),
            "pack: only where it fits"
        );
    }

    /// Whatever the devices and holders, a placement that fits charges exactly the need, and never
    /// more on a device than its capacity less its reserve and what others hold there.
    #[test]
    fn a_fit_never_overcommits_a_device() {
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..5000 {
            let devices: Vec<Device> = (0..1 + next(4))
                .map(|i| Device {
                    reserve: next(2) * GIB,
                    ..gpu(&format!("g{i}"), 4 + next(44))
                })
                .collect();
            let holders: Vec<Holder> = (0..next(4))
                .map(|i| {
                    let d = next(devices.len() as u64) as usize;
                    let gib = 1 + next(8);
                    Holder {
                        devices: vec![(d, gib * GIB)],
                        ..holder(&format!("h{i}"), gib, next(2) == 0, i)
                    }
                })
                .collect();
            let need = (1 + next(80)) * GIB / 2;
            if let Placement::Fits(charges) = place(&devices, need, &[], &holders) {
                assert_eq!(charges.iter().map(|(_, b)| b).sum::<u64>(), need);
                for (d, b) in &charges {
                    let room = devices[*d].usable().saturating_sub(charged(&holders, *d));
                    assert!(
                        *b <= room,
                        "{b} on {d} with {room} free: {devices:?} {holders:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn outside_use_is_held_like_a_reserve() {
        let devices = [gpu("g0", 24), gpu("g1", 24)];
        let seen = less_outside_use(&devices, &[20 * GIB, 0]);
        assert_eq!(seen[0].usable(), 4 * GIB);
        assert_eq!(seen[1].usable(), 24 * GIB);
        assert_eq!(
            place(&seen, 12 * GIB, &[], &[]),
            Placement::Fits(vec![(1, 12 * GIB)])
        );
        assert_eq!(less_outside_use(&devices, &[30 * GIB])[0].usable(), 0);
    }

    #[test]
    fn an_overfull_device_sheds_idle_holders_least_recently_used_first() {
        let devices = [gpu("g", 10)];
        let holders = [
            holder("busy", 4, true, 300),
            holder("old", 3, false, 200),
            holder("new", 3, false, 100),
        ];
        assert!(over_capacity(&devices, &holders).is_empty());
        let shrunk = less_outside_use(&devices, &[2 * GIB]);
        assert_eq!(over_capacity(&shrunk, &holders), ["old"]);
        let tiny = less_outside_use(&devices, &[9 * GIB]);
        assert_eq!(
            over_capacity(&tiny, &holders),
            ["old", "new"],
            "never the busy one, even when it alone is too much"
        );
    }

    #[test]
    fn each_visible_device_is_read_back_in_placement_order() {
        let log = "load_tensors:        CUDA0 model buffer size =  1024.00 MiB\nload_tensors:        CUDA1 model buffer size =  2048.00 MiB\nload_tensors:   CPU_Mapped model buffer size =   281.81 MiB\nllama_kv_cache:      CUDA1 KV buffer size =   256.00 MiB\n";
        const MIB: u64 = 1 << 20;
        let read = measured_by_device(log);
        assert_eq!(read, [(0, 1024 * MIB), (1, 2304 * MIB)]);
        // placed on device 3 first, then device 1: CUDA0 is device 3
        let placed = vec![(3, 1024 * MIB), (1, 2048 * MIB)];
        let (charges, overruns) = corrected(&placed, &read);
        assert_eq!(charges, [(3, 1024 * MIB), (1, 2304 * MIB)]);
        assert_eq!(
            overruns,
            [Overrun {
                device: 1,
                charged: 2048 * MIB,
                reported: 2304 * MIB
            }],
            "12.5% over is an overrun; exactly the charge is not"
        );
        assert!(
            corrected(&vec![(0, 1000 * MIB), (1, 2100 * MIB)], &read)
                .1
                .is_empty(),
            "2.4% and 9.7% over are within the tolerance"
        );
    }
}
