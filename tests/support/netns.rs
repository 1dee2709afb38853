//! Network namespaces for tests that need several hosts: each host is a namespace with one veth to
//! a bridge in a namespace of its own, on a private /24 picked per run. Only namespaces made here
//! are touched; the host's interfaces and routes never are.

use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::support::process::Proc;
use crate::support::{engine, new_marker, CORRAL};

/// Every namespace made here starts with this, then the creating process id and a counter.
pub const PREFIX: &str = "corral-ns-";

/// One host: a namespace with loopback up and `eth0` on the shared bridge.
pub struct Host {
    pub ns: String,
    pub addr: Ipv4Addr,
}

impl Host {
    /// Starts corral in this host on `yaml`, listening on `listen` (an address of this host, or
    /// loopback, with port 0), and waits until it listens. It and its engines carry a marker of
    /// their own; dropping the result kills them.
    pub fn spawn_corral(&self, listen: &str, yaml: &str) -> Proc {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.yaml");
        std::fs::write(&config, yaml).unwrap();
        let marker = new_marker();
        let (key, value) = marker.split_once('=').unwrap();
        let stderr = dir.path().join("corral.stderr");
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.ns, CORRAL, "--config"])
            .arg(&config)
            .args(["--listen", listen])
            .env(key, value)
            .env("ENGINE", engine())
            .env("DIR", dir.path())
            .env("MARKER", &marker)
            .env("CORRAL_STATE_DIR", dir.path().join("state"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let url = loop {
            let Some(Ok(line)) = lines.next() else {
                let _ = child.kill();
                let _ = child.wait();
                let log = std::fs::read_to_string(&stderr).unwrap_or_default();
                panic!("corral in {} exited before listening:\n{log}", self.ns);
            };
            if let Some(addr) = line.split("listening on ").nth(1) {
                break addr.trim().to_string();
            }
        };
        std::thread::spawn(move || for _ in lines {});
        Proc {
            child,
            url,
            marker,
            dir,
        }
    }
}

/// Hosts on one bridge; dropping it deletes every namespace (and with them their veths).
pub struct Net {
    hub: String,
    pub hosts: Vec<Host>,
}

impl Net {
    /// Makes `n` hosts, or says why namespaces cannot be made here.
    pub fn new(n: usize) -> Result<Net, String> {
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        if uid != 0 {
            return Err(format!(
                "network namespaces need root (running as uid {uid})"
            ));
        }
        sweep();
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let pid = std::process::id();
        let k = COUNTER.fetch_add(1, Ordering::SeqCst);
        let base = format!("{PREFIX}{pid}-{k}");
        let hub = format!("{base}-hub");
        ip(&["netns", "add", &hub])?;
        let mut net = Net {
            hub,
            hosts: Vec::new(),
        };
        ip(&["-n", &net.hub, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &net.hub, "link", "set", "br0", "up"])?;
        // 10.<from the pid>.<from the counter>.0/24: distinct for concurrent runs, though each
        // run's bridge is its own anyway
        let subnet = [10, (pid % 250 + 1) as u8, (k % 256) as u8];
        for i in 0..n {
            let addr = Ipv4Addr::new(subnet[0], subnet[1], subnet[2], i as u8 + 1);
            let host = Host {
                ns: format!("{base}-{i}"),
                addr,
            };
            ip(&["netns", "add", &host.ns])?;
            net.hosts.push(host);
            net.wire(i)?;
        }
        Ok(net)
    }

    /// Brings up loopback in host `i` and joins it to the bridge.
    fn wire(&self, i: usize) -> Result<(), String> {
        let (hub, host) = (self.hub.as_str(), &self.hosts[i]);
        let port = format!("p{i}");
        let ns = host.ns.as_str();
        let cidr = format!("{}/24", host.addr);
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
        let peer = ["peer", "name", "eth0", "netns", ns];
        ip(&[
            &["-n", hub, "link", "add", &port, "type", "veth"][..],
            &peer,
        ]
        .concat())?;
        ip(&["-n", hub, "link", "set", &port, "master", "br0", "up"])?;
        ip(&["-n", ns, "addr", "add", &cidr, "dev", "eth0"])?;
        ip(&["-n", ns, "link", "set", "eth0", "up"])
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self
            .hosts
            .iter()
            .map(|h| h.ns.as_str())
            .chain([self.hub.as_str()])
        {
            remove(ns);
        }
    }
}

/// Kills what still runs in `ns` (only processes a test started there) and deletes it.
fn remove(ns: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
        for pid in String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    let _ = ip(&["netns", "del", ns]);
}

/// Deletes namespaces left by runs that were killed before they could clean up: those named with
/// [`PREFIX`] whose creating process is gone.
pub fn sweep() {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for name in entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
    {
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            remove(&name);
        }
    }
}

/// `ip ARGS`, its stderr as the error when it fails.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `ip`: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "`ip {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

/// The hosts, or `None` after a loud skip line when namespaces cannot be made. Under `CI` as root
/// they must be made: that fails instead.
pub fn or_skip(made: Result<Net, String>) -> Option<Net> {
    let why = match made {
        Ok(net) => return Some(net),
        Err(why) => why,
    };
    // SAFETY: geteuid has no preconditions.
    if std::env::var_os("CI").is_some() && unsafe { libc::geteuid() } == 0 {
        panic!("network namespaces cannot be made, though running as root under CI: {why}");
    }
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "\n*** SKIPPED: network namespaces cannot be made: {why} ***\n"
    );
    None
}

/// Runs `job` to the end on a thread of its own that has entered `ns`, on a runtime of its own:
/// every socket it opens (and those of the threads it starts) is in that namespace.
pub fn run_in<F, Fut, T>(ns: &str, job: F) -> T
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T>,
    T: Send + 'static,
{
    let path = format!("/run/netns/{ns}");
    let thread = std::thread::spawn(move || {
        let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        use std::os::fd::AsRawFd;
        // SAFETY: a valid namespace file descriptor; a network namespace may be entered by one
        // thread of a process.
        let entered = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(
            entered,
            0,
            "setns {path}: {}",
            std::io::Error::last_os_error()
        );
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(job())
    });
    match thread.join() {
        Ok(v) => v,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}
