//! The memory the machine gives corral and its engines: `/proc/meminfo`, bounded by the memory
//! limit of corral's cgroup. In a container (a Kubernetes pod with a memory limit, `docker run -m`)
//! `/proc/meminfo` shows the whole node, hundreds of GiB where the pod may use 16; the limit and
//! what the cgroup already uses are what an engine can still get before the kernel kills it.

/// Memory, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostMemory {
    pub total: u64,
    pub available: u64,
    pub free: u64,
    pub swap_total: u64,
    pub swap_free: u64,
}

/// The memory as now read.
pub fn read() -> HostMemory {
    let text = |path: &str| std::fs::read_to_string(path).ok();
    let meminfo = text("/proc/meminfo").unwrap_or_default();
    let cgroup = cgroup_files().and_then(|[max, current, stat]| {
        let (current, stat) = (text(current), text(stat));
        Cgroup::parse(text(max).as_deref(), current.as_deref(), stat.as_deref())
    });
    bounded(from_meminfo(&meminfo), cgroup)
}

/// The files of corral's cgroup that hold its memory limit, use and breakdown, found once (a
/// process does not move between cgroups): v2 keeps the limit in `memory.max`, v1 in its memory
/// controller's `memory.limit_in_bytes`. `None` where there is no cgroup to read.
fn cgroup_files() -> Option<&'static [String; 3]> {
    static FILES: std::sync::OnceLock<Option<[String; 3]>> = std::sync::OnceLock::new();
    FILES
        .get_or_init(|| {
            let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
            let v2 = ["memory.max", "memory.current", "memory.stat"];
            let v1 = [
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
                "memory.stat",
            ];
            let v2_dirs = directories(&own, "0::", "/sys/fs/cgroup").into_iter();
            let v1_dirs = directories(&own, ":memory:", "/sys/fs/cgroup/memory").into_iter();
            (v2_dirs.map(|dir| (dir, v2)))
                .chain(v1_dirs.map(|dir| (dir, v1)))
                .map(|(dir, files)| files.map(|f| format!("{dir}/{f}")))
                .find(|[max, ..]| std::path::Path::new(max).is_file())
        })
        .as_ref()
}

/// Where corral's cgroup directory may be under `mount`: at its path in `/proc/self/cgroup` (the
/// line after `marker`: `0::/path` for v2, `N:memory:/path` for v1; `/` in a container with its
/// own cgroup namespace, `/system.slice/corral.service` under systemd), else the mount's root (a
/// container that sees its own cgroup there but not its path).
fn directories(proc_self_cgroup: &str, marker: &str, mount: &str) -> Vec<String> {
    let own = proc_self_cgroup.lines().find_map(|l| {
        let path = &l[l.find(marker)? + marker.len()..];
        Some(format!("{mount}{}", path.trim().trim_end_matches('/')))
    });
    let root = std::iter::once(mount.to_string());
    own.into_iter().chain(root).collect()
}

/// `/proc/meminfo`'s figures, in bytes (it gives kB).
fn from_meminfo(text: &str) -> HostMemory {
    let get = |key: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
            .saturating_mul(1024)
    };
    HostMemory {
        total: get("MemTotal"),
        available: get("MemAvailable"),
        free: get("MemFree"),
        swap_total: get("SwapTotal"),
        swap_free: get("SwapFree"),
    }
}

/// A cgroup's memory limit and what its processes use of it, less the file cache the kernel can
/// take back (`inactive_file`, as the kubelet counts a pod's working set).
#[derive(Debug, PartialEq)]
struct Cgroup {
    limit: u64,
    used: u64,
}

impl Cgroup {
    /// `None` without a limit: none set (`max`, or v1's near-`i64::MAX`, which the node's total
    /// bounds anyway), or no cgroup files to read.
    fn parse(max: Option<&str>, current: Option<&str>, stat: Option<&str>) -> Option<Cgroup> {
        let limit: u64 = max?.trim().parse().ok()?;
        let current: u64 = current.and_then(|c| c.trim().parse().ok()).unwrap_or(0);
        let reclaimable = stat.and_then(|s| {
            s.lines().find_map(|l| {
                let (key, value) = l.split_once(' ')?;
                matches!(key, "inactive_file" | "total_inactive_file")
                    .then(|| value.trim().parse::<u64>().ok())?
            })
        });
        Some(Cgroup {
            limit,
            used: current.saturating_sub(reclaimable.unwrap_or(0)),
        })
    }
}

/// The machine's figures, none above what the cgroup's limit leaves.
fn bounded(machine: HostMemory, cgroup: Option<Cgroup>) -> HostMemory {
    let Some(cgroup) = cgroup else {
        return machine;
    };
    let left = cgroup.limit.saturating_sub(cgroup.used);
    HostMemory {
        total: machine.total.min(cgroup.limit),
        available: machine.available.min(left),
        free: machine.free.min(left),
        ..machine
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO: &str = "MemTotal:       263921812 kB\nMemFree:        200000000 kB\n\
        MemAvailable:   250000000 kB\nBuffers:          1000 kB\nSwapTotal:       8388604 kB\n\
        SwapFree:        8388604 kB\n";
    const GIB: u64 = 1 << 30;

    /// In a pod limited to 16 GiB on a 250 GiB node, the pod's limit is the total, and what is
    /// available is what the limit leaves after the pod's own use (its reclaimable file cache
    /// aside).
    #[test]
    fn a_cgroup_limit_bounds_the_nodes_memory() {
        let stat = format!("anon 1\nfile 9\ninactive_file {}\nactive_file 3\n", 2 * GIB);
        let cgroup = Cgroup::parse(
            Some(&format!("{}\n", 16 * GIB)),
            Some(&format!("{}\n", 6 * GIB)),
            Some(&stat),
        );
        let m = bounded(from_meminfo(MEMINFO), cgroup);
        assert_eq!(m.total, 16 * GIB);
        assert_eq!(m.available, 12 * GIB);
        assert_eq!(m.free, 12 * GIB);
        assert_eq!(m.swap_total, 8388604 * 1024, "swap is the machine's");
    }

    /// No limit (`max`, v1's huge number, no cgroup files): the machine's figures as they are.
    #[test]
    fn without_a_limit_the_machine_stands() {
        let machine = from_meminfo(MEMINFO);
        assert_eq!(machine.total, 263921812 * 1024);
        assert_eq!(
            bounded(machine, Cgroup::parse(Some("max\n"), Some("5\n"), None)),
            machine
        );
        assert_eq!(bounded(machine, Cgroup::parse(None, None, None)), machine);
        let v1 = Cgroup::parse(Some("9223372036854771712"), Some("4096"), None);
        assert_eq!(bounded(machine, v1), machine);
    }

    /// corral's own cgroup is read first: its path under systemd or a v1 hierarchy, the mount's
    /// root in a container.
    #[test]
    fn the_cgroup_directory_comes_from_proc_self_cgroup() {
        let v2 = |text: &str| directories(text, "0::", "/sys/fs/cgroup");
        assert_eq!(
            v2("0::/system.slice/corral.service\n"),
            [
                "/sys/fs/cgroup/system.slice/corral.service",
                "/sys/fs/cgroup"
            ]
        );
        assert_eq!(v2("0::/\n"), ["/sys/fs/cgroup", "/sys/fs/cgroup"]);
        let hybrid = "5:devices:/\n4:memory:/jobs/42\n0::/\n";
        assert_eq!(
            directories(hybrid, ":memory:", "/sys/fs/cgroup/memory"),
            ["/sys/fs/cgroup/memory/jobs/42", "/sys/fs/cgroup/memory"]
        );
        assert_eq!(directories("1:cpu:/\n", ":memory:", "/m"), ["/m"]);
    }

    /// cgroup v1 names the reclaimable cache `total_inactive_file`.
    #[test]
    fn cgroup_v1_counts_its_file_cache_as_reclaimable() {
        let parsed = Cgroup::parse(
            Some("100"),
            Some("80"),
            Some("cache 5\ntotal_inactive_file 30\n"),
        );
        assert_eq!(
            parsed,
            Some(Cgroup {
                limit: 100,
                used: 50
            })
        );
    }
}
