//! `corral pull`: weights fetched ahead of serving, from a file server the test starts on
//! loopback, with the cache in a temporary folder.

mod support;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use support::CORRAL;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Requests seen, and how many were being answered at once at most.
#[derive(Default)]
struct Counts {
    hits: AtomicUsize,
    active: AtomicUsize,
    most: AtomicUsize,
}

/// Serves `body` at every path, in `chunks` pieces `every` apart. A request stops counting as
/// active before its last piece leaves, so a client can never see it end while it still counts.
async fn file_server(body: Vec<u8>, chunks: usize, every: Duration) -> (String, Arc<Counts>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let counts = Arc::new(Counts::default());
    let seen = counts.clone();
    tokio::spawn(async move {
        loop {
            let (mut sock, _) = listener.accept().await.unwrap();
            seen.hits.fetch_add(1, SeqCst);
            let now = seen.active.fetch_add(1, SeqCst) + 1;
            seen.most.fetch_max(now, SeqCst);
            let (body, seen) = (body.clone(), seen.clone());
            tokio::spawn(async move {
                let mut head = vec![0u8; 4096];
                let _ = sock.read(&mut head).await;
                let header = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                sock.write_all(header.as_bytes()).await.unwrap();
                let pieces: Vec<&[u8]> = body.chunks(body.len().div_ceil(chunks)).collect();
                for (i, part) in pieces.iter().enumerate() {
                    if i + 1 == pieces.len() {
                        seen.active.fetch_sub(1, SeqCst);
                    } else {
                        tokio::time::sleep(every).await;
                    }
                    if sock.write_all(part).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (base, counts)
}

fn weights() -> (Vec<u8>, String) {
    use sha2::Digest;
    let body: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
    let sha = sha2::Sha256::digest(&body)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    (body, sha)
}

/// A model served by llama.cpp from `url`, checked against `sha`.
fn url_model(id: &str, url: &str, sha: &str) -> String {
    format!("  {id}:\n    engine: llama_cpp\n    source: '{url}'\n    sha256: '{sha}'\n")
}

struct Run {
    code: i32,
    out: String,
    err: String,
}

/// Runs `corral pull` on `yaml` with the model cache in `cache`, stdout and stderr piped.
async fn pull(cache: &Path, yaml: &str, names: &[&str]) -> Run {
    let config = cache.join("config.yaml");
    std::fs::write(&config, yaml).unwrap();
    let out = tokio::process::Command::new(CORRAL)
        .arg("pull")
        .arg("--config")
        .arg(&config)
        .args(names)
        .env("CORRAL_CACHE", cache.join("models"))
        .env("XDG_CACHE_HOME", cache.join("xdg"))
        .env("HF_HOME", cache.join("hf"))
        .output()
        .await
        .unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        out: String::from_utf8_lossy(&out.stdout).into_owned(),
        err: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The path a `<id>: <path> (<size>)` line gives for `id`.
fn done_path(out: &str, id: &str) -> Option<String> {
    let line = out.lines().find(|l| l.starts_with(&format!("{id}: /")))?;
    let rest = line.strip_prefix(&format!("{id}: "))?;
    Some(rest.rsplit_once(" (")?.0.to_string())
}

/// A URL source lands in the cache with a line saying where; a second pull finds it there and
/// asks the server nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_fetches_then_finds_the_weights_cached() {
    let (body, sha) = weights();
    let (base, counts) = file_server(body.clone(), 1, Duration::ZERO).await;
    let cache = tempfile::tempdir().unwrap();
    let yaml = format!(
        "models:\n{}",
        url_model("web", &format!("{base}/w/tiny.gguf"), &sha)
    );
    let first = pull(cache.path(), &yaml, &[]).await;
    assert_eq!(first.code, 0, "{}{}", first.out, first.err);
    let path = done_path(&first.out, "web").unwrap_or_else(|| panic!("{}", first.out));
    assert!(first.out.contains("(64.00 KiB)"), "{}", first.out);
    assert!(path.starts_with(&cache.path().join("models").display().to_string()));
    assert_eq!(std::fs::read(&path).unwrap(), body);
    assert_eq!(counts.hits.load(SeqCst), 1);

    let second = pull(cache.path(), &yaml, &["web"]).await;
    assert_eq!(second.code, 0, "{}{}", second.out, second.err);
    assert!(
        second.out.contains(&format!("web: cached at {path}")),
        "{}",
        second.out
    );
    assert_eq!(counts.hits.load(SeqCst), 1, "a cached model asks nothing");
}

/// One model failing its checksum fails the pull, naming it, after the other is fetched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_model_is_named_and_the_others_still_land() {
    let (body, sha) = weights();
    let (base, _) = file_server(body, 1, Duration::ZERO).await;
    let cache = tempfile::tempdir().unwrap();
    let yaml = format!(
        "models:\n{}{}",
        url_model("good", &format!("{base}/a/good.gguf"), &sha),
        url_model("bad", &format!("{base}/b/bad.gguf"), &"0".repeat(64))
    );
    let run = pull(cache.path(), &yaml, &[]).await;
    assert_ne!(run.code, 0, "{}{}", run.out, run.err);
    let failure = run.err.lines().find(|l| l.contains("bad:"));
    assert!(
        failure.is_some_and(|l| l.contains("checksum")),
        "{}",
        run.err
    );
    assert!(run.err.contains("1 model failed: bad"), "{}", run.err);
    assert!(!run.err.contains("good"), "{}", run.err);
    let good = done_path(&run.out, "good").unwrap_or_else(|| panic!("{}", run.out));
    assert!(Path::new(&good).is_file());
}

/// An unknown name stops the pull before any request; a named alias pulls its model alone, and
/// a model that runs a plain `cmd` is skipped with a note.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_are_checked_before_anything_downloads() {
    let (body, sha) = weights();
    let (base, counts) = file_server(body, 1, Duration::ZERO).await;
    let cache = tempfile::tempdir().unwrap();
    let yaml = format!(
        "models:\n{}    aliases: [small]\n{}  plain:\n    cmd: /bin/true ${{PORT}}\n",
        url_model("one", &format!("{base}/1/one.gguf"), &sha),
        url_model("two", &format!("{base}/2/two.gguf"), &sha),
    );
    let unknown = pull(cache.path(), &yaml, &["one", "nosuch"]).await;
    assert_eq!(unknown.code, 2, "{}{}", unknown.out, unknown.err);
    assert!(
        unknown.err.contains("unknown model: nosuch"),
        "{}",
        unknown.err
    );
    assert_eq!(counts.hits.load(SeqCst), 0);
    assert!(!cache.path().join("models").exists());

    let named = pull(cache.path(), &yaml, &["small", "plain"]).await;
    assert_eq!(named.code, 0, "{}{}", named.out, named.err);
    assert!(done_path(&named.out, "one").is_some(), "{}", named.out);
    assert!(named.out.contains("plain: skipped"), "{}", named.out);
    assert!(!named.out.contains("two"), "{}", named.out);
    assert_eq!(counts.hits.load(SeqCst), 1);
}

/// Away from a terminal the output is plain lines, one per file in a few seconds at most, and
/// no more than three downloads run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_lines_and_three_downloads_at_once() {
    let (body, sha) = weights();
    let (base, counts) = file_server(body, 8, Duration::from_millis(60)).await;
    let cache = tempfile::tempdir().unwrap();
    let models: String = (1..=5)
        .map(|i| url_model(&format!("m{i}"), &format!("{base}/{i}/file{i}.gguf"), &sha))
        .collect();
    let run = pull(cache.path(), &format!("models:\n{models}"), &[]).await;
    assert_eq!(run.code, 0, "{}{}", run.out, run.err);
    let all = format!("{}{}", run.out, run.err);
    assert!(!all.contains('\r') && !all.contains('\x1b'), "{all:?}");
    for i in 1..=5 {
        let progress = run
            .out
            .lines()
            .filter(|l| l.starts_with(&format!("m{i}: file{i}.gguf ")))
            .count();
        assert_eq!(progress, 1, "one progress line for m{i}:\n{}", run.out);
        assert!(
            done_path(&run.out, &format!("m{i}")).is_some(),
            "{}",
            run.out
        );
    }
    assert_eq!(counts.most.load(SeqCst), 3, "downloads at once");
}
