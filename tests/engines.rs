//! Engine kinds against the fake engine imitating each of them: the argv corral builds starts it,
//! readiness reads as documented, the live load shows a request in flight, and a failed start is
//! diagnosed.

mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use corral::{engine_argv, engine_env, Cause, EngineKind, Launch, Task};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

/// The fake engine in place of the kind's program: `corral fake-engine --imitate <kind>`, then
/// what the real command has after its program (`serve`, `-m sglang.launch_server`).
fn fake_command(kind: EngineKind) -> Vec<String> {
    let mut cmd = vec![
        support::CORRAL.to_string(),
        "fake-engine".into(),
        "--imitate".into(),
        kind.name().into(),
    ];
    cmd.extend(kind.default_command().into_iter().skip(1));
    cmd
}

/// Starts the fake as `kind` would be started, on a free port.
fn start(kind: EngineKind, task: Task, args: &[&str]) -> (Child, u16) {
    let port = support::free_port_range(1);
    (start_on(kind, task, args, port), port)
}

fn start_on(kind: EngineKind, task: Task, args: &[&str], port: u16) -> Child {
    let command = fake_command(kind);
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let model = if kind == EngineKind::Ollama {
        "qwen3:0.6b"
    } else {
        "/nonexistent/model"
    };
    let launch = Launch {
        command: &command,
        model,
        mmproj: None,
        served_name: "m1",
        host: "127.0.0.1",
        port,
        ctx: Some(1024),
        slots: Some(2),
        task,
        args: &args,
    };
    let argv = engine_argv(kind, &launch);
    Command::new(&argv[0])
        .args(&argv[1..])
        .envs(engine_env(kind, &launch))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// One HTTP/1.1 exchange on a fresh connection: `None` when the connection is refused or the
/// answer does not come within a second; else the status and the body.
async fn http(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let exchange = async {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        let status = out.split(' ').nth(1)?.parse().ok()?;
        let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
        Some((status, body))
    };
    let long = method == "POST";
    let limit = Duration::from_millis(if long { 10_000 } else { 1_000 });
    tokio::time::timeout(limit, exchange).await.ok().flatten()
}

/// Polls the readiness path until ready; returns what each poll saw (`None`: no answer).
async fn until_ready(kind: EngineKind, port: u16) -> Vec<Option<u16>> {
    let r = kind.readiness();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    loop {
        let status = http(port, "GET", r.path, "").await.map(|(s, _)| s);
        seen.push(status);
        if status.is_some_and(|s| r.is_ready(s)) {
            return seen;
        }
        assert!(Instant::now() < deadline, "{kind:?} never ready: {seen:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls the load path until `f` holds for the load read there.
async fn until_load(kind: EngineKind, port: u16, what: &str, f: impl Fn(u64) -> bool) {
    let path = kind.load_report().path.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let body = http(port, "GET", path, "").await.map(|(_, b)| b);
        let load = body.as_deref().and_then(|b| corral::read_load(kind, b));
        if load.is_some_and(|l| f(l.running)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{kind:?}: {what}; last load {load:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts `kind`, checks its readiness against the documented behaviour, then its live load.
async fn readiness_and_load(kind: EngineKind, task: Task) {
    let loading_ms = 1500;
    let (mut child, port) = start(kind, task, &["--loading-ms", &loading_ms.to_string()]);
    let started = Instant::now();
    let seen = until_ready(kind, port).await;
    let answered: Vec<u16> = seen.iter().flatten().copied().collect();
    if kind == EngineKind::Ollama {
        // answers at once: the loading time does not apply
        assert_eq!(answered, [200], "{seen:?}");
    } else {
        assert!(
            started.elapsed() >= Duration::from_millis(loading_ms),
            "{seen:?}"
        );
        if kind.readiness().answers_while_loading {
            assert!(
                answered.contains(&503),
                "{kind:?} never said loading: {seen:?}"
            );
        } else {
            assert_eq!(answered, [200], "{kind:?} answered while loading: {seen:?}");
        }
    }

    until_load(kind, port, "idle at first", |r| r == 0).await;
    let (path, body) = match task {
        Task::Embedding => (
            "/v1/embeddings",
            r#"{"model":"m1","input":"hi","fakellm":{"delay_ms":1500}}"#,
        ),
        Task::TextGeneration => (
            "/v1/chat/completions",
            r#"{"model":"m1","messages":[{"role":"user","content":"hi"}],"fakellm":{"delay_ms":1500}}"#,
        ),
    };
    let request = tokio::spawn(async move { http(port, "POST", path, body).await });
    until_load(kind, port, "one running", |r| r == 1).await;
    let (status, _) = request.await.unwrap().expect("the request was answered");
    assert_eq!(status, 200, "{kind:?}");
    if kind != EngineKind::Ollama {
        until_load(kind, port, "idle again", |r| r == 0).await;
    }
    child.kill().await.unwrap();
}

#[tokio::test]
async fn llama_cpp_loads_with_503_then_reports_its_load() {
    readiness_and_load(EngineKind::LlamaCpp, Task::TextGeneration).await;
}

#[tokio::test]
async fn vllm_refuses_connections_until_loaded() {
    readiness_and_load(EngineKind::Vllm, Task::TextGeneration).await;
}

#[tokio::test]
async fn tgi_binds_once_loaded() {
    readiness_and_load(EngineKind::Tgi, Task::TextGeneration).await;
}

#[tokio::test]
async fn sglang_answers_503_until_warm() {
    readiness_and_load(EngineKind::Sglang, Task::TextGeneration).await;
}

#[tokio::test]
async fn tei_binds_once_loaded() {
    readiness_and_load(EngineKind::Tei, Task::Embedding).await;
}

#[tokio::test]
async fn ollama_is_ready_at_once_and_lists_the_model_in_use() {
    readiness_and_load(EngineKind::Ollama, Task::TextGeneration).await;
}

/// Runs the fake until it exits; returns its output, after checking that it failed.
async fn failed_output(kind: EngineKind, child: Child) -> String {
    let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
        .await
        .expect("exits")
        .unwrap();
    assert!(!out.status.success(), "{kind:?}");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    text
}

const KINDS: [EngineKind; 6] = [
    EngineKind::LlamaCpp,
    EngineKind::Vllm,
    EngineKind::Tgi,
    EngineKind::Sglang,
    EngineKind::Tei,
    EngineKind::Ollama,
];

#[tokio::test]
async fn out_of_memory_is_diagnosed_with_its_size() {
    for kind in KINDS {
        let (child, _) = start(
            kind,
            Task::TextGeneration,
            &["--fail-oom", "--loading-ms", "50"],
        );
        let out = failed_output(kind, child).await;
        let d = corral::diagnose(kind, &out).unwrap_or_else(|| panic!("{kind:?}: {out}"));
        let want = match kind {
            EngineKind::Tei => None,
            _ => Some(2u64 << 30),
        };
        assert_eq!(
            d.cause,
            Cause::OutOfMemory {
                requested_bytes: want
            },
            "{kind:?}: {out}"
        );
        assert!(d.to_string().starts_with("out of GPU memory: "), "{d}");
    }
}

#[tokio::test]
async fn a_taken_port_is_diagnosed() {
    for kind in KINDS {
        let (child, _) = start(kind, Task::TextGeneration, &["--fail-port"]);
        let out = failed_output(kind, child).await;
        let d = corral::diagnose(kind, &out).unwrap_or_else(|| panic!("{kind:?}: {out}"));
        assert_eq!(d.cause, Cause::PortTaken, "{kind:?}: {out}");
    }
}

#[tokio::test]
async fn a_port_really_taken_is_diagnosed() {
    for kind in KINDS {
        let holder = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = holder.local_addr().unwrap().port();
        let child = start_on(kind, Task::TextGeneration, &[], port);
        let out = failed_output(kind, child).await;
        let d = corral::diagnose(kind, &out).unwrap_or_else(|| panic!("{kind:?}: {out}"));
        assert_eq!(d.cause, Cause::PortTaken, "{kind:?}: {out}");
    }
}
