//! What the suite reads from /proc: CPU time, resident memory, children, open TCP connections.

use std::collections::BTreeSet;
use std::time::{SystemTime, UNIX_EPOCH};

/// Wall-clock milliseconds since the epoch, the clock of the fake engine's events file.
pub fn unix_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0)
}

pub fn clk_tck() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// CPU time of a whole process (all its threads), in microseconds: user and system apart. The
/// kernel's share is much the same syscalls for every proxy here (how many wake-ups a batch
/// takes moves it a little), so the user share is where they differ most.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Cpu {
    pub user: f64,
    pub system: f64,
}

impl Cpu {
    pub fn total(&self) -> f64 {
        self.user + self.system
    }
}

impl std::ops::AddAssign for Cpu {
    fn add_assign(&mut self, more: Cpu) {
        self.user += more.user;
        self.system += more.system;
    }
}

impl std::ops::Sub for Cpu {
    type Output = Cpu;
    fn sub(self, before: Cpu) -> Cpu {
        Cpu {
            user: self.user - before.user,
            system: self.system - before.system,
        }
    }
}

/// utime and stime of a process, in clock ticks.
pub fn cpu_ticks(pid: u32) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_times(&stat)
}

/// utime and stime from the text of `/proc/PID/stat`.
fn stat_times(stat: &str) -> Option<(u64, u64)> {
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime is field 14, stime field 15.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some((utime, stime))
}

/// CPU time of pids together, in microseconds.
pub fn cpu(pids: &[u32]) -> Cpu {
    let us = 1e6 / clk_tck() as f64;
    let mut sum = Cpu::default();
    for (user, system) in pids.iter().filter_map(|p| cpu_ticks(*p)) {
        sum += Cpu {
            user: user as f64 * us,
            system: system as f64 * us,
        };
    }
    sum
}

/// CPU time of pids together, user and system, in microseconds.
pub fn cpu_us(pids: &[u32]) -> f64 {
    cpu(pids).total()
}

/// Busy clock ticks of the whole machine since boot (every state but idle and iowait; steal
/// included: a hypervisor taking the CPU is noise too).
pub fn machine_busy_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(cpu) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return 0;
    };
    let f: Vec<u64> = cpu
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is already in user)
    [0usize, 1, 2, 5, 6, 7]
        .iter()
        .filter_map(|i| f.get(*i))
        .sum()
}

/// This process's CPU ticks plus those of its waited-for children (corral and nginx once stopped,
/// with the engines and workers they reaped).
pub fn own_ticks_with_children() -> u64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0;
    };
    let Some(end) = stat.rfind(')') else { return 0 };
    let f: Vec<u64> = stat[end + 2..]
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // after the state field (skipped, not a number): utime is f[10], stime f[11], cutime f[12], cstime f[13]
    f.get(10..14).map(|x| x.iter().sum()).unwrap_or(0)
}

/// VmRSS in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// The thread count (`Threads:` in /proc/PID/status).
pub fn threads(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
}

/// How many file descriptors a process holds open (entries of /proc/PID/fd).
pub fn fd_count(pid: u32) -> Option<usize> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count())
}

pub fn rss_sum_kib(pids: &[u32]) -> u64 {
    pids.iter().filter_map(|p| rss_kib(*p)).sum()
}

/// Direct children of a process (over all its threads).
pub fn children(pid: u32) -> Vec<u32> {
    let mut out = BTreeSet::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("children")) {
                out.extend(s.split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
            }
        }
    }
    out.into_iter().collect()
}

pub fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|c| *c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// TCP sockets in ESTABLISHED state whose local port is `port`: the server side of every open
/// connection to a listener on that port. When a proxy closes its upstream connection, the
/// engine's side leaves ESTABLISHED (for CLOSE_WAIT) at once, whether or not the engine noticed.
/// Asks the kernel over NETLINK_SOCK_DIAG (about a millisecond for thousands of sockets); falls
/// back to /proc/net/tcp, which is much slower to read.
pub fn established_on_port(port: u16) -> usize {
    diag_established(port).unwrap_or_else(|| proc_established(port))
}

fn proc_established(port: u16) -> usize {
    let mut n = 0;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let mut f = line.split_whitespace();
            let (Some(_sl), Some(local), Some(_remote), Some(state)) =
                (f.next(), f.next(), f.next(), f.next())
            else {
                continue;
            };
            let local_port = local
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if local_port == Some(port) && state == "01" {
                n += 1;
            }
        }
    }
    n
}

#[repr(C)]
#[derive(Clone, Copy)]
struct InetDiagSockId {
    sport: u16,
    dport: u16,
    src: [u32; 4],
    dst: [u32; 4],
    ifindex: u32,
    cookie: [u32; 2],
}

#[repr(C)]
#[derive(Clone, Copy)]
struct InetDiagReqV2 {
    family: u8,
    protocol: u8,
    ext: u8,
    pad: u8,
    states: u32,
    id: InetDiagSockId,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DiagRequest {
    nlh: libc::nlmsghdr,
    req: InetDiagReqV2,
}

struct Fd(i32);

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: closing a descriptor we own.
        unsafe {
            libc::close(self.0);
        }
    }
}

fn diag_established(port: u16) -> Option<usize> {
    const SOCK_DIAG_BY_FAMILY: u16 = 20;
    const TCP_ESTABLISHED: u32 = 1;
    const NLMSG_HDRLEN: usize = 16;
    // SAFETY: a netlink socket and plain-old-data requests and replies, bounds-checked below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return None;
    }
    let fd = Fd(fd);
    let mut count = 0;
    let mut buf = vec![0u8; 256 * 1024];
    for (seq, family) in [(1u32, libc::AF_INET as u8), (2, libc::AF_INET6 as u8)] {
        let req = DiagRequest {
            nlh: libc::nlmsghdr {
                nlmsg_len: std::mem::size_of::<DiagRequest>() as u32,
                nlmsg_type: SOCK_DIAG_BY_FAMILY,
                nlmsg_flags: (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16,
                nlmsg_seq: seq,
                nlmsg_pid: 0,
            },
            req: InetDiagReqV2 {
                family,
                protocol: libc::IPPROTO_TCP as u8,
                ext: 0,
                pad: 0,
                states: 1 << TCP_ESTABLISHED,
                id: InetDiagSockId {
                    sport: 0,
                    dport: 0,
                    src: [0; 4],
                    dst: [0; 4],
                    ifindex: 0,
                    cookie: [0; 2],
                },
            },
        };
        // SAFETY: `req` is a repr(C) value of the size we pass.
        let sent = unsafe {
            libc::send(
                fd.0,
                &req as *const DiagRequest as *const libc::c_void,
                std::mem::size_of::<DiagRequest>(),
                0,
            )
        };
        if sent < 0 {
            return None;
        }
        'recv: loop {
            // SAFETY: receiving into a buffer we own, of the length we pass.
            let n =
                unsafe { libc::recv(fd.0, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
            if n <= 0 {
                return None;
            }
            let data = &buf[..n as usize];
            let mut off = 0;
            while off + NLMSG_HDRLEN <= data.len() {
                let len = u32::from_ne_bytes(data[off..off + 4].try_into().ok()?) as usize;
                let kind = u16::from_ne_bytes(data[off + 4..off + 6].try_into().ok()?);
                if len < NLMSG_HDRLEN || off + len > data.len() {
                    return None;
                }
                match kind as i32 {
                    libc::NLMSG_DONE => break 'recv,
                    libc::NLMSG_ERROR => return None,
                    _ => {
                        // inet_diag_msg: family, state, timer, retrans, then the id (sport first, big-endian).
                        let msg = &data[off + NLMSG_HDRLEN..off + len];
                        if msg.len() >= 6
                            && msg[1] as u32 == TCP_ESTABLISHED
                            && u16::from_be_bytes([msg[4], msg[5]]) == port
                        {
                            count += 1;
                        }
                    }
                }
                off += (len + 3) & !3;
            }
        }
    }
    Some(count)
}

/// Raises the soft open-file limit to the hard limit; returns the new soft limit.
#[allow(clippy::unnecessary_cast)] // rlim_t is not u64 everywhere
pub fn raise_nofile() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 0;
        }
        if r.rlim_cur < r.rlim_max {
            let want = libc::rlimit {
                rlim_cur: r.rlim_max,
                rlim_max: r.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                r.rlim_cur = r.rlim_max;
            }
        }
    }
    r.rlim_cur as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        assert!(cpu_ticks(me).is_some());
        assert!(cpu(&[me]).total() >= 0.0);
        assert!(rss_kib(me).unwrap() > 0);
        assert!(!cmdline(me).is_empty());
        assert!(threads(me).unwrap() >= 1);
        // stdin, stdout, stderr and the directory being read, at least.
        assert!(fd_count(me).unwrap() >= 4);
    }

    #[test]
    fn user_and_system_time_are_read_apart() {
        // a command name with spaces and a parenthesis, as a process may take
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 17 5 0 0 20 0 1 0 9 0 0";
        assert_eq!(stat_times(stat), Some((17, 5)));
        assert_eq!(stat_times("42 (x) S 1"), None);
    }

    #[test]
    fn counts_a_loopback_connection() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let _c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let _s = l.accept().unwrap();
        assert_eq!(established_on_port(port), 1);
        assert_eq!(proc_established(port), 1);
        assert_eq!(diag_established(port), Some(1));
    }
}
