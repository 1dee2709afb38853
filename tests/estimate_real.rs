//! Checks corral's memory estimate against what a real llama-server
//! allocates for a tiny model: it logs every buffer
//! (`load_tensors: CPU_Mapped model buffer size = ...`, `KV`, `compute`) at
//! verbosity 4 (`-lv 4`; the default 3 hides them). The binary here is a CPU
//! build, so every buffer is on the CPU, including `token_embd` which the
//! estimate leaves off the GPU; sizes are what is compared.
//!
//! The binary comes from `CORRAL_LLAMA_SERVER` (`scripts/test.sh` sets it);
//! without it the test fails under CI (`CI` set) and is skipped elsewhere.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use corral::{estimate_llama, parse_buffer_report, parse_llama_args, Estimate};

fn llama_server() -> Option<String> {
    match std::env::var("CORRAL_LLAMA_SERVER") {
        Ok(v) if !v.trim().is_empty() => {
            assert!(
                Path::new(&v).is_file(),
                "CORRAL_LLAMA_SERVER={v} does not exist"
            );
            Some(v)
        }
        _ if std::env::var_os("CI").is_some() => {
            panic!("CORRAL_LLAMA_SERVER is not set: run scripts/test.sh, which builds llama-server")
        }
        _ => {
            let _ = writeln!(
                std::io::stderr(),
                "\n*** SKIPPED (no llama-server): CORRAL_LLAMA_SERVER is not set ***\n"
            );
            None
        }
    }
}

/// Kills the server however the test ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn health_ok(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let req = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    let mut resp = String::new();
    s.write_all(req.as_bytes()).is_ok()
        && s.read_to_string(&mut resp).is_ok()
        && resp.starts_with("HTTP/1.1 200")
}

/// Starts llama-server with `flags`, waits for health and returns its log.
fn run_server(bin: &str, dir: &Path, model: &Path, flags: &[String]) -> String {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log_path = dir.join(format!("server-{port}.log"));
    let log = std::fs::File::create(&log_path).unwrap();
    let mut cmd = Command::new(bin);
    cmd.arg("-m")
        .arg(model)
        .args(["--host", "127.0.0.1", "--port"]);
    cmd.arg(port.to_string())
        .args(["-t", "2", "--no-webui", "-lv", "4"])
        .args(flags)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    let mut server = Server(cmd.spawn().expect("start llama-server"));
    let read_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let start = Instant::now();
    while !health_ok(port) {
        if let Ok(Some(status)) = server.0.try_wait() {
            panic!("llama-server exited with {status}:\n{}", read_log());
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "llama-server not healthy after 120 s:\n{}",
            read_log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(server);
    read_log()
}

fn within(what: &str, estimate: u64, reported: u64, tolerance: f64) {
    let err = (estimate as f64 - reported as f64).abs() / reported as f64;
    assert!(
        err <= tolerance,
        "{what}: estimate {estimate} vs reported {reported} ({:.1}% off, allowed {:.0}%)",
        err * 100.0,
        tolerance * 100.0
    );
}

#[test]
fn estimate_matches_llama_server_buffers() {
    let Some(bin) = llama_server() else { return };
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    let opts = gguf::TinyOptions {
        n_embd: 256,
        n_layer: 4,
        n_head: 4,
        n_head_kv: 2,
        n_ff: 512,
        n_ctx: 2048,
        ..Default::default()
    };
    gguf::write_tiny_llama(&model, &opts).unwrap();

    for flags in ["-c 1024 -np 2", "-c 4096 -fa on -ctk q8_0 -ctv q8_0"] {
        let flags: Vec<String> = flags.split_whitespace().map(String::from).collect();
        let log = run_server(&bin, dir.path(), &model, &flags);
        let mut reported: BTreeMap<String, u64> = BTreeMap::new();
        for (_device, kind, bytes) in log.lines().filter_map(parse_buffer_report) {
            *reported.entry(kind).or_default() += bytes;
        }
        let mut argv = vec!["-m".to_string(), model.display().to_string()];
        argv.extend(flags.iter().cloned());
        let e: Estimate = estimate_llama(&parse_llama_args(&argv)).unwrap();
        let get = |k: &str| {
            *reported
                .get(k)
                .unwrap_or_else(|| panic!("no '{k}' buffer line in the log:\n{log}"))
        };
        let (model_b, kv_b, compute_b) = (get("model"), get("KV"), get("compute"));
        let total = model_b + kv_b + compute_b;
        eprintln!(
            "{flags:?}: reported model {model_b} KV {kv_b} compute {compute_b} total {total}; \
             estimate weights {} (file {}) KV {} compute {} total {}",
            e.weights_bytes, e.file_weights_bytes, e.kv_bytes, e.compute_bytes, e.total_bytes
        );
        within("KV", e.kv_bytes, kv_b, 0.10);
        within("total", e.total_bytes, total, 0.25);
        within("compute", e.compute_bytes, compute_b, 0.25);
        within(
            "file weights vs model buffer",
            e.file_weights_bytes,
            model_b,
            0.05,
        );
    }
}
