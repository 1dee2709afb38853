//! End-to-end checks of the fakellm binary over real sockets.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

struct Server {
    child: Child,
    port: u16,
    stderr: Arc<Mutex<String>>,
}

impl Server {
    fn start(args: &[&str]) -> Server {
        let port = free_port();
        let mut child = Command::new(env!("CARGO_BIN_EXE_fakellm"))
            .arg("--port")
            .arg(port.to_string())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn fakellm");
        let stderr = Arc::new(Mutex::new(String::new()));
        let pipe = child.stderr.take().unwrap();
        let sink = stderr.clone();
        thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        Server {
            child,
            port,
            stderr,
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits until the port accepts connections.
    fn wait_listening(&self) {
        let t = Instant::now();
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(t.elapsed() < Duration::from_secs(5), "never listened");
            thread::sleep(Duration::from_millis(10));
        }
    }

    fn wait_healthy(&self) {
        let t = Instant::now();
        loop {
            if let Ok(r) = try_http(self.port, "GET", "/health", &[], b"") {
                if r.status == 200 {
                    return;
                }
            }
            assert!(t.elapsed() < Duration::from_secs(5), "never healthy");
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let t = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(t.elapsed() < within, "process did not exit in {within:?}");
            thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("bad JSON {e}: {}", String::from_utf8_lossy(&self.body)))
    }
}

fn request_bytes(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Vec<u8> {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    let mut out = req.into_bytes();
    out.extend_from_slice(body);
    out
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = find(b, b"\r\n").expect("chunk size line");
        let size =
            usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap().trim(), 16).unwrap();
        b = &b[eol + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

fn parse_response(raw: &[u8]) -> Resp {
    let end = find(raw, b"\r\n\r\n").expect("end of headers");
    let head = std::str::from_utf8(&raw[..end]).unwrap();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[end + 4..].to_vec();
    if headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"))
    {
        body = dechunk(&body);
    }
    Resp {
        status,
        headers,
        body,
    }
}

fn try_http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Resp> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(&request_bytes(port, method, path, headers, body))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    Ok(parse_response(&raw))
}

fn http(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    try_http(port, method, path, headers, body).expect("http request")
}

fn post_json(port: u16, path: &str, v: &Value) -> Resp {
    http(
        port,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        v.to_string().as_bytes(),
    )
}

fn read_events(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("event line is JSON"))
        .collect()
}

fn wait_event(path: &std::path::Path, name: &str) -> Vec<Value> {
    let t = Instant::now();
    loop {
        let evs = read_events(path);
        if evs.iter().any(|e| e["event"] == name) {
            return evs;
        }
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "no {name} event: {evs:?}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

fn slots_busy(port: u16) -> Vec<bool> {
    http(port, "GET", "/slots", &[], b"")
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["is_processing"].as_bool().unwrap())
        .collect()
}

#[test]
fn lifecycle_chat_stream_slots_events_multipart_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    let t0 = Instant::now();
    let mut srv = Server::start(&[
        "--loading-ms",
        "600",
        "--events-file",
        events.to_str().unwrap(),
        "--slots",
        "1",
        "--chunks",
        "5",
        "--chunk-interval-ms",
        "100",
        "--alias",
        "my-model",
        "-m",
        "/nonexistent/model.gguf",
        "-ngl",
        "99",
        "--jinja",
    ]);
    let port = srv.port;
    srv.wait_listening();

    // Loading phase: 503 with llama-server's exact body, everywhere.
    let r = http(port, "GET", "/health", &[], b"");
    assert_eq!(r.status, 503);
    assert_eq!(
        r.body,
        br#"{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}"#
    );
    assert_eq!(r.header("x-fakellm-port"), Some(port.to_string().as_str()));
    assert_eq!(http(port, "GET", "/v1/models", &[], b"").status, 503);
    srv.wait_healthy();
    assert!(
        t0.elapsed() >= Duration::from_millis(500),
        "loaded too early"
    );
    let r = http(port, "GET", "/health", &[], b"");
    assert_eq!(r.json(), json!({"status":"ok"}));

    let models = http(port, "GET", "/v1/models", &[], b"").json();
    assert_eq!(models["data"][0]["id"], "my-model");
    let props = http(port, "GET", "/props", &[], b"").json();
    assert_eq!(props["total_slots"], 1);
    assert_eq!(props["model_path"], "/nonexistent/model.gguf");
    assert_eq!(props["default_generation_settings"]["n_ctx"], 4096);

    // Non-streaming chat.
    let req = json!({"model":"m-x","messages":[{"role":"user","content":"abcdefgh"}]});
    let r = http(
        port,
        "POST",
        "/v1/chat/completions",
        &[
            ("Content-Type", "application/json"),
            ("X-Test-Header", "yes"),
        ],
        req.to_string().as_bytes(),
    );
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "m-x");
    assert!(v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .starts_with("hello from fakellm"));
    assert_eq!(v["usage"]["prompt_tokens"], 2);
    assert_eq!(v["usage"]["completion_tokens"], 5);
    assert_eq!(v["usage"]["total_tokens"], 7);
    assert!(v["timings"]["predicted_n"].is_number());
    assert_eq!(v["fakellm"]["request"], req);
    assert_eq!(v["fakellm"]["headers"]["x-test-header"], "yes");
    assert_eq!(v["fakellm"]["port"], port);
    assert_eq!(v["fakellm"]["pid"], srv.pid());

    // Invalid JSON.
    let r = http(port, "POST", "/v1/chat/completions", &[], b"{nope");
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], 400);

    // Streaming: chunks arrive separately in time (interval 100 ms).
    let body = json!({"model":"m-s","stream":true,"messages":[]}).to_string();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let sent = Instant::now();
    s.write_all(&request_bytes(
        port,
        "POST",
        "/v1/chat/completions",
        &[],
        body.as_bytes(),
    ))
    .unwrap();
    let mut raw = Vec::new();
    let mut first = None;
    let mut done = None;
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        if first.is_none() && find(&raw, b"tok0").is_some() {
            first = Some(sent.elapsed());
        }
        if done.is_none() && find(&raw, b"[DONE]").is_some() {
            done = Some(sent.elapsed());
        }
    }
    let (first, done) = (first.unwrap(), done.unwrap());
    assert!(
        first < Duration::from_millis(250),
        "first chunk late: {first:?}"
    );
    assert!(
        done >= first + Duration::from_millis(350),
        "chunks not spread in time: first {first:?}, done {done:?}"
    );
    let r = parse_response(&raw);
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let text = String::from_utf8(r.body).unwrap();
    let datas: Vec<&str> = text
        .split("\n\n")
        .filter(|c| !c.is_empty())
        .map(|c| c.strip_prefix("data: ").expect("data: prefix"))
        .collect();
    assert_eq!(datas.len(), 7, "{text}");
    for (i, d) in datas[..5].iter().enumerate() {
        let v: Value = serde_json::from_str(d).unwrap();
        assert_eq!(v["model"], "m-s");
        assert_eq!(v["choices"][0]["delta"]["content"], format!("tok{i} "));
    }
    let fin: Value = serde_json::from_str(datas[5]).unwrap();
    assert_eq!(fin["choices"][0]["finish_reason"], "stop");
    assert!(fin["timings"].is_object());
    assert!(fin.get("usage").is_none());
    assert_eq!(datas[6], "[DONE]");

    // include_usage adds usage to the final chunk; max_tokens sets the count.
    let r = post_json(
        port,
        "/v1/chat/completions",
        &json!({"stream":true,"max_tokens":2,"stream_options":{"include_usage":true},"fakellm":{"interval_ms":0}}),
    );
    let text = String::from_utf8(r.body).unwrap();
    assert_eq!(text.matches("\"tok").count(), 2);
    assert!(text.contains("\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2"));

    // Slots: a long stream occupies the only slot; the next request waits.
    assert_eq!(slots_busy(port), vec![false]);
    let long = thread::spawn(move || {
        post_json(
            port,
            "/v1/chat/completions",
            &json!({"stream":true,"fakellm":{"chunks":8,"interval_ms":50}}),
        )
    });
    let t = Instant::now();
    while slots_busy(port) != vec![true] {
        assert!(t.elapsed() < Duration::from_secs(2), "slot never busy");
        thread::sleep(Duration::from_millis(10));
    }
    let metrics = String::from_utf8(http(port, "GET", "/metrics", &[], b"").body).unwrap();
    assert!(
        metrics.contains("llamacpp:requests_processing 1"),
        "{metrics}"
    );
    let t = Instant::now();
    let r = post_json(port, "/v1/chat/completions", &json!({"messages":[]}));
    assert_eq!(r.status, 200);
    assert!(
        t.elapsed() >= Duration::from_millis(150),
        "second request did not wait for the slot: {:?}",
        t.elapsed()
    );
    assert_eq!(long.join().unwrap().status, 200);
    assert_eq!(slots_busy(port), vec![false]);

    // A stream dropped by the client is recorded as peer_closed.
    {
        let body = json!({"stream":true,"fakellm":{"chunks":40,"interval_ms":50}}).to_string();
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(&request_bytes(
            port,
            "POST",
            "/v1/chat/completions",
            &[],
            body.as_bytes(),
        ))
        .unwrap();
        let mut buf = [0u8; 1024];
        let mut got = Vec::new();
        while find(&got, b"tok0").is_none() {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0);
            got.extend_from_slice(&buf[..n]);
        }
    }
    wait_event(&events, "peer_closed");
    let t = Instant::now();
    while slots_busy(port) != vec![false] {
        assert!(t.elapsed() < Duration::from_secs(2), "slot not released");
        thread::sleep(Duration::from_millis(10));
    }

    // Multipart upload: sha256 of the file as received.
    let file: Vec<u8> = (0..3000u32)
        .map(|i| (i % 256) as u8)
        .chain(b"\r\n--XBOUNDARYnot\r\n".iter().copied())
        .collect();
    let boundary = "XBOUNDARYX";
    let mut mp = Vec::new();
    mp.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n"
        )
        .as_bytes(),
    );
    mp.extend_from_slice(
        format!("--{boundary}\r\nContent-Disposition: form-data; name=\"language\"\r\n\r\nen\r\n")
            .as_bytes(),
    );
    mp.extend_from_slice(
        format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n")
            .as_bytes(),
    );
    mp.extend_from_slice(&file);
    mp.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let ct = format!("multipart/form-data; boundary={boundary}");
    let r = http(
        port,
        "POST",
        "/v1/audio/transcriptions",
        &[("Content-Type", ct.as_str())],
        &mp,
    );
    assert_eq!(r.status, 200);
    let v = r.json();
    let want: String = Sha256::digest(&file)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(v["text"], "fake transcript");
    assert_eq!(v["model"], "whisper-1");
    assert_eq!(v["file_bytes"], file.len());
    assert_eq!(v["file_sha256"], want);
    assert_eq!(v["fields"], json!({"model":"whisper-1","language":"en"}));

    // Embeddings, rerank, echo.
    let v = post_json(
        port,
        "/v1/embeddings",
        &json!({"model":"e","input":["a","b"]}),
    )
    .json();
    assert_eq!(v["model"], "e");
    assert_eq!(v["data"].as_array().unwrap().len(), 2);
    assert_eq!(v["data"][0]["embedding"].as_array().unwrap().len(), 8);
    let v = post_json(
        port,
        "/v1/rerank",
        &json!({"query":"red apple","documents":["sky","red apple"]}),
    )
    .json();
    assert_eq!(v["results"][0]["index"], 1);
    let r = http(
        port,
        "PATCH",
        "/some/a%2Fb?x=%20y",
        &[("X-Echo", "1")],
        b"12345",
    );
    let v = r.json();
    assert_eq!(v["method"], "PATCH");
    assert_eq!(v["path"], "/some/a%2Fb");
    assert_eq!(v["query"], "x=%20y");
    assert_eq!(v["headers"]["x-echo"], "1");
    assert_eq!(v["body_bytes"], 5);
    assert_eq!(v["port"], port);

    // SIGTERM: exit 0 promptly.
    let t = Instant::now();
    // SAFETY: signalling our own child process.
    unsafe {
        libc::kill(srv.pid(), libc::SIGTERM);
    }
    let st = srv.wait_exit(Duration::from_secs(2));
    assert_eq!(st.code(), Some(0), "{st:?}");
    assert!(t.elapsed() < Duration::from_millis(500));

    // The events file tells the whole story.
    let evs = read_events(&events);
    for e in &evs {
        assert_eq!(e["pid"], srv.pid());
        assert_eq!(e["port"], port);
        assert!(e["t_ms"].as_f64().unwrap() > 1.0e12);
    }
    let names: Vec<&str> = evs.iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(names[0], "spawned");
    assert!(evs[0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a == "--alias"));
    assert_eq!(names[1], "listening");
    assert_eq!(*names.last().unwrap(), "sigterm");
    let chat = evs
        .iter()
        .find(|e| e["event"] == "request" && e["model"] == "m-x")
        .expect("request event with model");
    assert_eq!(chat["method"], "POST");
    assert_eq!(chat["path"], "/v1/chat/completions");
    assert_eq!(chat["active"], 1);
    assert!(evs
        .iter()
        .any(|e| e["event"] == "request" && e["active"].as_u64().unwrap() >= 2));
    assert!(evs
        .iter()
        .any(|e| e["event"] == "done" && e["path"] == "/v1/chat/completions"));
    assert_eq!(names.iter().filter(|n| **n == "peer_closed").count(), 1);

    let err = srv.stderr();
    assert!(
        err.contains("warning: ignoring unknown argument -ngl 99"),
        "{err}"
    );
    assert!(err.contains(&format!(
        "main: server is listening on http://127.0.0.1:{port} - starting the main loop"
    )));
    assert!(err.contains("srv  update_slots: all slots are idle"));
}

#[test]
fn startup_failures() {
    // Missing model with --require-model.
    let mut srv = Server::start(&["-m", "/nonexistent/x.gguf", "--require-model"]);
    let st = srv.wait_exit(Duration::from_secs(3));
    assert_eq!(st.code(), Some(1));
    thread::sleep(Duration::from_millis(50));
    assert!(srv
        .stderr()
        .contains("error: failed to open model file '/nonexistent/x.gguf'"));

    // Port already taken.
    let held = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let out = Command::new(env!("CARGO_BIN_EXE_fakellm"))
        .args(["--port", &port.to_string()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "couldn't bind HTTP server socket, hostname: 127.0.0.1, port: {port}"
        )),
        "{err}"
    );

    // Missing --port.
    let out = Command::new(env!("CARGO_BIN_EXE_fakellm"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn exit_after_and_stderr_lines() {
    let mut srv = Server::start(&[
        "--exit-after-ms",
        "300",
        "--exit-code",
        "3",
        "--stderr-lines",
        "4",
    ]);
    srv.wait_healthy();
    let st = srv.wait_exit(Duration::from_secs(3));
    assert_eq!(st.code(), Some(3));
    thread::sleep(Duration::from_millis(50));
    let err = srv.stderr();
    assert!(err.contains("stderr line 1\nstderr line 2\nstderr line 3\nstderr line 4\n"));
    assert!(err.contains("fatal: exiting as told (code 3)"));
}

#[test]
fn abort_mid_stream_and_forced_status() {
    let mut srv = Server::start(&["--abort-after-chunks", "2", "--chunk-interval-ms", "20"]);
    srv.wait_healthy();
    let r = post_json(
        srv.port,
        "/v1/chat/completions",
        &json!({"fakellm":{"status":429}}),
    );
    assert_eq!(r.status, 429);
    assert_eq!(r.json()["error"]["code"], 429);
    let body = json!({"stream":true,"fakellm":{"chunks":10}}).to_string();
    let mut s = TcpStream::connect(("127.0.0.1", srv.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&request_bytes(
        srv.port,
        "POST",
        "/v1/chat/completions",
        &[],
        body.as_bytes(),
    ))
    .unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw); // may end with a reset
    let text = String::from_utf8_lossy(&raw);
    assert!(text.contains("tok1 "), "{text}");
    assert!(!text.contains("tok2 "), "{text}");
    assert!(!text.contains("[DONE]"));
    let st = srv.wait_exit(Duration::from_secs(3));
    assert_eq!(st.signal(), Some(libc::SIGKILL));
}

#[test]
fn completion_status_flag_and_ignore_sigterm() {
    let mut srv = Server::start(&[
        "--completion-status",
        "500",
        "--ignore-sigterm",
        "--cache-type-k",
        "q8_0",
    ]);
    srv.wait_healthy();
    let r = post_json(srv.port, "/v1/completions", &json!({"prompt":"x"}));
    assert_eq!(r.status, 500);
    assert_eq!(r.json()["error"]["type"], "server_error");
    // SAFETY: signalling our own child process.
    unsafe {
        libc::kill(srv.pid(), libc::SIGTERM);
    }
    thread::sleep(Duration::from_millis(200));
    assert!(
        srv.child.try_wait().unwrap().is_none(),
        "SIGTERM was not ignored"
    );
    assert_eq!(http(srv.port, "GET", "/health", &[], b"").status, 200);
}

/// `--health-progress`: while loading, `/health` reports the share of `--loading-ms` passed in
/// `--progress-ms` steps (other routes keep llama-server's body), then 200 once loaded.
#[test]
fn health_progress_reports_the_load_in_steps() {
    let srv = Server::start(&[
        "--loading-ms",
        "1000",
        "--progress-ms",
        "250",
        "--health-progress",
    ]);
    srv.wait_listening();
    let r = http(srv.port, "GET", "/health", &[], b"");
    assert_eq!(r.status, 503);
    let first = r.json();
    assert_eq!(first["message"], "loading tensors");
    let progress = |v: &Value| v["progress"].as_f64().unwrap();
    assert!(progress(&first) < 1.0, "{first}");
    let other = http(srv.port, "GET", "/v1/models", &[], b"");
    assert!(String::from_utf8_lossy(&other.body).contains("Loading model"));
    let t = Instant::now();
    let mut seen = vec![progress(&first)];
    loop {
        let r = http(srv.port, "GET", "/health", &[], b"");
        if r.status == 200 {
            break;
        }
        let p = progress(&r.json());
        assert!(p * 4.0 == (p * 4.0).round(), "in 250 ms steps of 1000: {p}");
        if seen.last() != Some(&p) {
            seen.push(p);
        }
        assert!(t.elapsed() < Duration::from_secs(5), "never loaded");
        thread::sleep(Duration::from_millis(20));
    }
    assert!(seen.len() >= 3, "the progress moved: {seen:?}");
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
}
