//! Memory that other programs use on the GPUs. The ledger knows only what corral's engines were
//! charged; a desktop, a training run or a second server on the same card takes memory it never
//! sees. So a task re-reads each process's GPU memory every `deviceRefresh` seconds (NVML or
//! nvidia-smi for NVIDIA, rocm-smi for AMD), counts what is not an engine of corral's (nor a child
//! of one) as held on that device, and stops idle instances when that leaves a device holding more
//! than it can. The same reading tells what an asleep engine still holds, charged in place of the
//! fixed residue. Requests never wait on a reading: they read the last figures under the fleet's
//! lock.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use super::{ledger, Fleet, StopReason};
use crate::config::Device;
use crate::gpu::{ProcessUse, ToolRunner};
use crate::supervisor::Spawner;

/// The vendor tools run through the spawner, so each is reaped like any other child.
impl ToolRunner for Spawner {
    async fn output(
        &self,
        cmd: tokio::process::Command,
        limit: Duration,
    ) -> std::io::Result<std::process::Output> {
        crate::supervisor::query_output(self, cmd, limit).await
    }
}

/// Parents followed up from a process before giving up (a loop in /proc would be a kernel bug,
/// but a bound costs nothing).
const MAX_DEPTH: usize = 64;

/// The parent of a process, from `/proc/PID/stat` (the command name may hold spaces and parens,
/// so the fields are read after its last `)`).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

/// True when `pid` is one of `engines` or runs under one.
fn descends_from(pid: u32, engines: &HashSet<u32>, parent: impl Fn(u32) -> Option<u32>) -> bool {
    ancestor_in(pid, |p| engines.contains(&p), parent).is_some()
}

/// `pid` itself or its nearest ancestor that `wanted` takes, if any.
fn ancestor_in(
    pid: u32,
    wanted: impl Fn(u32) -> bool,
    parent: impl Fn(u32) -> Option<u32>,
) -> Option<u32> {
    let mut at = pid;
    for _ in 0..MAX_DEPTH {
        if wanted(at) {
            return Some(at);
        }
        match parent(at) {
            Some(p) if p > 1 && p != at => at = p,
            _ => return None,
        }
    }
    None
}

/// The configured device a reading's row is of: matched by vendor and selector (`select_as` of
/// `devices: auto`).
fn device_of(devices: &[Device], row: &ProcessUse) -> Option<usize> {
    devices
        .iter()
        .position(|d| d.vendor == row.vendor && d.select_as.as_deref() == Some(row.device.as_str()))
}

/// Bytes used on each device by processes that are not engines. A process corral cannot see is not
/// counted: in a container with its own PID namespace the vendor's tools name host processes,
/// corral's engines among them, and counting those would evict idle models for their own memory.
fn used_by_others(
    devices: &[Device],
    rows: &[ProcessUse],
    visible: impl Fn(u32) -> bool,
    is_engine: impl Fn(u32) -> bool,
) -> Vec<u64> {
    let mut used = vec![0; devices.len()];
    for row in rows {
        let Some(d) = device_of(devices, row) else {
            continue;
        };
        if visible(row.pid) && !is_engine(row.pid) {
            used[d] += row.bytes;
        }
    }
    used
}

/// What each asleep instance's processes (`(id, pid)`) use on each device in a reading: the
/// residue its engine keeps while it sleeps. An instance none of whose processes the reading
/// lists is left out (a tool in another PID namespace names none of them), so its charge stays
/// the fixed residue rather than nothing.
fn asleep_use(
    devices: &[Device],
    rows: &[ProcessUse],
    asleep: &[(String, u32)],
    parent: impl Fn(u32) -> Option<u32>,
) -> Vec<(String, ledger::Charges)> {
    let owners: HashMap<u32, &str> = asleep.iter().map(|(id, pid)| (*pid, id.as_str())).collect();
    let mut seen: BTreeMap<&str, ledger::Charges> = BTreeMap::new();
    for row in rows {
        let Some(owner) = ancestor_in(row.pid, |p| owners.contains_key(&p), &parent) else {
            continue;
        };
        let charges = seen.entry(owners[&owner]).or_default();
        let Some(d) = device_of(devices, row) else {
            continue;
        };
        match charges.iter_mut().find(|(c, _)| *c == d) {
            Some((_, bytes)) => *bytes += row.bytes,
            None => charges.push((d, row.bytes)),
        }
    }
    seen.into_iter()
        .map(|(id, charges)| (id.to_string(), charges))
        .collect()
}

impl Fleet {
    /// Re-reads what other programs use on the GPUs every `deviceRefresh` seconds (from the config
    /// in force at each tick, so a reload can turn it on or off). Runs until aborted.
    pub async fn run_device_refresh(self) {
        let mut warned = false;
        loop {
            let every = self.config().device_refresh;
            let Some(every) = every else {
                // off (or turned off by a reload): forget the last reading
                if !self.used_by_others().is_empty() {
                    self.note_outside_use(Vec::new());
                }
                // should a reload turn it on, placements wait for its first reading
                self.inner.lock().reading_due = true;
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            };
            let devices = self.config().devices.clone();
            let selected: Vec<_> = devices
                .iter()
                .map(|d| (d.vendor, d.select_as.as_deref()))
                .collect();
            match crate::gpu::process_use(&self.inner.spawner, &selected).await {
                Some(rows) => {
                    warned = false;
                    let engines = self.engine_pids();
                    let is_engine = |pid| descends_from(pid, &engines, parent_of);
                    let visible = |pid: u32| std::path::Path::new(&format!("/proc/{pid}")).exists();
                    let used = used_by_others(&devices, &rows, visible, is_engine);
                    self.note_asleep_use(&devices, &rows);
                    self.note_outside_use(used);
                }
                None => {
                    if !warned {
                        warned = true;
                        tracing::warn!(
                            "no per-process GPU memory could be read (NVML, nvidia-smi, rocm-smi); keeping the last reading"
                        );
                    }
                    // nothing better will come soon: placements waiting for a reading go ahead
                    self.reading_done();
                }
            }
            tokio::time::sleep(every).await;
        }
    }

    /// Records what each asleep instance's engine still holds on its devices, as read, in place
    /// of the fixed residue; the shedding that follows the reading stops sleepers that leave a
    /// device holding more than it can.
    fn note_asleep_use(&self, devices: &[Device], rows: &[ProcessUse]) {
        let asleep: Vec<(String, u32)> = {
            let st = self.inner.lock();
            let asleep = st.instances.values().filter(|i| i.phase.is_asleep());
            asleep
                .filter_map(|i| Some((i.id.to_string(), i.phase.process()?.pid)))
                .collect()
        };
        if asleep.is_empty() {
            return;
        }
        let seen = asleep_use(devices, rows, &asleep, parent_of);
        let mut st = self.inner.lock();
        for (id, charges) in seen {
            if let Some(inst) = st.instances.get_mut(&id).filter(|i| i.phase.is_asleep()) {
                inst.asleep_use = Some(charges);
            }
        }
    }

    fn engine_pids(&self) -> HashSet<u32> {
        self.inner
            .lock()
            .instances
            .values()
            .filter_map(|i| i.phase.process().map(|p| p.pid))
            .collect()
    }

    /// Memory other programs use on each configured device, as last read.
    pub fn used_by_others(&self) -> Vec<u64> {
        self.inner.lock().used_by_others.clone()
    }

    /// Ends the wait of placements for a reading (see `reading_due`), waking them if it was due.
    pub(super) fn reading_done(&self) {
        let was_due = std::mem::replace(&mut self.inner.lock().reading_due, false);
        if was_due {
            self.inner.touch();
        }
    }

    /// Records a reading and stops idle instances on devices it leaves over capacity (at every
    /// reading: an instance busy at the last one may be idle now).
    pub(super) fn note_outside_use(&self, used: Vec<u64>) {
        let mut st = self.inner.lock();
        let changed = st.used_by_others != used || st.reading_due;
        st.reading_due = false;
        for (d, bytes) in used.iter().enumerate() {
            if st.used_by_others.get(d) != Some(bytes) {
                if let Some(device) = st.config.devices.get(d) {
                    tracing::info!(
                        "{}: other programs use {}",
                        device.name,
                        crate::memory::format_bytes(*bytes)
                    );
                }
            }
        }
        st.used_by_others = used;
        let stopped = shed_overfull(&mut st, "other programs use more memory");
        drop(st);
        if changed || stopped {
            self.inner.touch();
        }
    }
}

/// Stops idle instances on devices that hold more than they can, least recently used first.
/// True when it stopped any.
pub(super) fn shed_overfull(st: &mut super::State, why: &str) -> bool {
    let devices = ledger::less_outside_use(&st.config.devices, &st.used_by_others);
    let holders = Fleet::holders(st, None);
    let grace = st.config.health_check_timeout;
    let victims = ledger::over_capacity(&devices, &holders);
    for id in &victims {
        tracing::warn!(instance = %id, "stopping: {why} than its device can hold");
        if let Some(inst) = st.instances.get_mut(id) {
            inst.order_stop(grace, StopReason::Memory);
        }
    }
    !victims.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Vendor;

    const GIB: u64 = 1 << 30;

    fn gpu(uuid: &str) -> Device {
        Device {
            name: uuid.into(),
            capacity: 24 * GIB,
            reserve: 0,
            vendor: Vendor::Nvidia,
            select_as: Some(uuid.into()),
            index: None,
        }
    }

    fn row(vendor: Vendor, device: &str, pid: u32, bytes: u64) -> ProcessUse {
        ProcessUse {
            vendor,
            device: device.into(),
            pid,
            bytes,
        }
    }

    #[test]
    fn only_processes_outside_the_engines_count() {
        let mut amd = gpu("0");
        amd.vendor = Vendor::Amd;
        let devices = [gpu("GPU-a"), gpu("GPU-b"), amd];
        let rows = [
            row(Vendor::Nvidia, "GPU-a", 100, 20 * GIB),
            row(Vendor::Nvidia, "GPU-a", 200, GIB),
            row(Vendor::Nvidia, "GPU-b", 300, GIB / 2),
            row(Vendor::Nvidia, "GPU-x", 400, 9),
            row(Vendor::Amd, "0", 500, 3 * GIB),
            // an NVIDIA GPU by index is not the AMD GPU of the same index
            row(Vendor::Nvidia, "0", 600, GIB),
        ];
        let used = used_by_others(&devices, &rows, |_| true, |pid| pid == 200);
        assert_eq!(used, [20 * GIB, GIB / 2, 3 * GIB]);
        // in another PID namespace nothing can be told apart: nothing counts
        let unseen = used_by_others(&devices, &rows, |pid| pid == 200, |pid| pid == 200);
        assert_eq!(unseen, [0, 0, 0]);
    }

    #[test]
    fn an_asleep_engine_is_charged_what_its_processes_are_read_to_hold() {
        let devices = [gpu("GPU-a"), gpu("GPU-b")];
        let rows = [
            row(Vendor::Nvidia, "GPU-a", 10, GIB),
            row(Vendor::Nvidia, "GPU-a", 11, GIB / 2),
            row(Vendor::Nvidia, "GPU-b", 11, GIB / 4),
            row(Vendor::Nvidia, "GPU-a", 20, 9 * GIB),
        ];
        // 11 is a worker of engine 10; 30 sleeps with nothing listed; 20 is another program
        let parent = |pid| match pid {
            11 => Some(10),
            _ => Some(1),
        };
        let asleep = [("a".to_string(), 10), ("quiet".to_string(), 30)];
        let seen = asleep_use(&devices, &rows, &asleep, parent);
        assert_eq!(
            seen,
            [("a".to_string(), vec![(0, GIB + GIB / 2), (1, GIB / 4)])],
            "an engine the reading does not list keeps the fixed residue"
        );
    }

    #[test]
    fn an_engines_children_are_the_engines() {
        let engines = HashSet::from([10]);
        // 12 -> 11 -> 10 (engine) -> 1; 20 -> 1
        let parent = |pid| match pid {
            12 => Some(11),
            11 => Some(10),
            10 | 20 => Some(1),
            _ => None,
        };
        assert!(descends_from(12, &engines, parent));
        assert!(descends_from(10, &engines, parent));
        assert!(!descends_from(20, &engines, parent));
        assert!(!descends_from(99, &engines, parent));
    }

    #[test]
    fn a_parent_is_read_from_proc() {
        assert_eq!(
            parent_of(std::process::id()),
            Some(nix::unistd::getppid().as_raw() as u32)
        );
    }
}
