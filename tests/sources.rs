//! Model sources: parsing, and fetching from an imitation Hub, Ollama registry and file server on
//! loopback, and from S3 as moto serves it.

#[path = "support/hub.rs"]
mod hub;
#[path = "support/s3.rs"]
mod s3;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use corral::{FetchError, Fetcher, Form, Source, Want};
use hub::{bytes, sha256, Hub, RepoFile, COMMIT};

const FILE: Want = Want {
    form: Form::File,
    sha256: None,
};
const DIR: Want = Want {
    form: Form::Directory,
    sha256: None,
};

fn fetcher(vars: &[(&str, String)]) -> Fetcher {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    Fetcher::from_env(&move |k| map.get(k).cloned())
}

/// A fetcher whose every cache lies in `dir` and whose endpoints are the imitation's.
fn local(hub: &Hub, dir: &Path) -> Fetcher {
    fetcher(&[
        ("HOME", dir.join("home").display().to_string()),
        ("HF_HUB_CACHE", dir.join("hf").display().to_string()),
        ("HF_ENDPOINT", hub.url.clone()),
        ("OLLAMA_MODELS", dir.join("ollama").display().to_string()),
        ("OLLAMA_REGISTRY", hub.url.clone()),
        ("CORRAL_CACHE", dir.join("corral").display().to_string()),
    ])
}

fn src(text: &str) -> Source {
    Source::parse(text).unwrap()
}

fn gguf_repo(hub: &Hub) -> Vec<RepoFile> {
    let f = |path: &str, seed, len| RepoFile {
        path: path.into(),
        data: bytes(seed, len),
        lfs: true,
    };
    let files = vec![
        RepoFile {
            path: "README.md".into(),
            data: "# tiny\n".into(),
            lfs: false,
        },
        f("Tiny-Q4_K_M.gguf", 1, 200_000),
        f("Q8_0/Tiny-Q8_0-00001-of-00003.gguf", 2, 50_000),
        f("Q8_0/Tiny-Q8_0-00002-of-00003.gguf", 3, 50_000),
        f("Q8_0/Tiny-Q8_0-00003-of-00003.gguf", 4, 50_000),
        f("mmproj-Tiny-F16.gguf", 5, 30_000),
    ];
    hub.add_repo("org/tiny-GGUF", files.clone());
    files
}

fn file_named<'a>(files: &'a [RepoFile], path: &str) -> &'a RepoFile {
    files.iter().find(|f| f.path == path).unwrap()
}

/// Every path under `dir` that ends in `.incomplete`.
fn leftovers(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                stack.push(p);
            } else if p.to_string_lossy().ends_with(".incomplete") {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn every_scheme_parses_and_bad_ones_name_the_fix() {
    let hf = |t| match src(t) {
        Source::HuggingFace(h) => (h.repo, h.path, h.quant, h.revision),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        hf("hf://org/repo"),
        ("org/repo".into(), None, None, "main".into())
    );
    assert_eq!(
        hf("hf://org/repo:Q4_K_M"),
        (
            "org/repo".into(),
            None,
            Some("Q4_K_M".into()),
            "main".into()
        )
    );
    assert_eq!(
        hf("hf://org/repo/sub/m.gguf@v1.0"),
        (
            "org/repo".into(),
            Some("sub/m.gguf".into()),
            None,
            "v1.0".into()
        )
    );
    assert_eq!(
        src("s3://b/k/m.gguf"),
        Source::S3 {
            bucket: "b".into(),
            key: "k/m.gguf".into()
        }
    );
    assert_eq!(
        src("ollama://llama3.2"),
        Source::Ollama {
            name: "llama3.2".into(),
            tag: "latest".into()
        }
    );
    assert_eq!(
        src("ollama://user/m:7b"),
        Source::Ollama {
            name: "user/m".into(),
            tag: "7b".into()
        }
    );
    assert_eq!(src("/models/m.gguf"), Source::Path("/models/m.gguf".into()));
    assert_eq!(
        src("file:///models/m.gguf"),
        Source::Path("/models/m.gguf".into())
    );
    let schemes: Vec<&str> = [
        "/m",
        "https://h/m.gguf",
        "hf://a/b",
        "s3://b/k",
        "ollama://m",
    ]
    .iter()
    .map(|t| src(t).scheme())
    .collect();
    assert_eq!(schemes, ["path", "url", "huggingface", "s3", "ollama"]);

    let err = Source::parse("ftp://host/m.gguf").unwrap_err();
    assert_eq!(
        err,
        "unknown source scheme \"ftp\": use hf://, s3://, ollama://, http(s):// or a path"
    );
    for (bad, fix) in [
        ("hf://justname", "org/name"),
        ("hf://org/repo:Q4/file.gguf", "not both"),
        ("hf://org/repo@", "empty revision"),
        ("hf://org/repo@../../escape", "not a branch, tag or commit"),
        ("s3://bucket", "s3://bucket/models/m.gguf"),
        ("ollama://a/b/c/d", "ollama://name[:tag]"),
        ("ollama://../../x:y", "ollama://name[:tag]"),
        ("ollama://x:..", "ollama://name[:tag]"),
        ("https://", "URL"),
        ("", "use hf://"),
    ] {
        let err = Source::parse(bad).unwrap_err();
        assert!(err.contains(fix), "{bad}: {err}");
    }
}

#[test]
fn shown_urls_hide_their_credentials() {
    let s = src("https://user:secret@host/m.gguf?token=abc&x=1");
    let shown = s.to_string();
    assert!(
        !shown.contains("secret") && !shown.contains("abc"),
        "{shown}"
    );
    assert!(
        shown.contains("host/m.gguf") && shown.contains("token=***"),
        "{shown}"
    );
    assert_eq!(
        src("hf://org/repo:Q4_K_M@v2").to_string(),
        "hf://org/repo:Q4_K_M@v2"
    );
}

#[tokio::test]
async fn a_split_quantization_and_its_projector_land_in_the_hub_cache_layout() {
    let (hub, dir) = (Hub::start().await, tempfile::tempdir().unwrap());
    let files = gguf_repo(&hub);
    let got = local(&hub, dir.path())
        .fetch(&src("hf://org/tiny-GGUF:Q8_0"), &FILE)
        .await
        .unwrap();

    let repo = dir.path().join("hf/models--org--tiny-GGUF");
    let snapshot = repo.join("snapshots").join(COMMIT);
    assert_eq!(
        got.model,
        snapshot.join("Q8_0/Tiny-Q8_0-00001-of-00003.gguf")
    );
    assert_eq!(got.mmproj, Some(snapshot.join("mmproj-Tiny-F16.gguf")));
    assert_eq!(got.bytes, 150_000 + 30_000);
    assert_eq!(
        std::fs::read_to_string(repo.join("refs/main")).unwrap(),
        COMMIT
    );
    for (path, ups) in [
        ("Q8_0/Tiny-Q8_0-00001-of-00003.gguf", "../../../"),
        ("Q8_0/Tiny-Q8_0-00003-of-00003.gguf", "../../../"),
        ("mmproj-Tiny-F16.gguf", "../../"),
    ] {
        let f = file_named(&files, path);
        let link = std::fs::read_link(snapshot.join(path)).unwrap();
        assert_eq!(
            link,
            PathBuf::from(format!("{ups}blobs/{}", sha256(&f.data)))
        );
        assert_eq!(std::fs::read(snapshot.join(path)).unwrap(), f.data);
    }
    let mut blobs: Vec<String> = std::fs::read_dir(repo.join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    blobs.sort();
    let mut want: Vec<String> = files[2..].iter().map(|f| sha256(&f.data)).collect();
    want.sort();
    assert_eq!(
        blobs, want,
        "only the chosen files, each named by its sha256"
    );
    assert!(!snapshot.join("Tiny-Q4_K_M.gguf").exists());
    // The resolve step redirected to the CDN path, which was not told where from.
    assert_eq!(hub.hits(&format!("/cdn/{}", sha256(&files[5].data))), 1);
    assert_eq!(hub.state.lock().unwrap().referers, Vec::<String>::new());
}

#[tokio::test]
async fn a_burst_of_fetches_downloads_once_and_a_cached_model_needs_no_network() {
    let (hub, dir) = (Hub::start().await, tempfile::tempdir().unwrap());
    let files = gguf_repo(&hub);
    let f = local(&hub, dir.path());
    let source = src("hf://org/tiny-GGUF:Q4_K_M");
    assert!(f.cached(&source, &FILE).is_none());
    let burst = (0..8).map(|_| {
        let (f, source) = (f.clone(), source.clone());
        tokio::spawn(async move { f.fetch(&source, &FILE).await })
    });
    let results: Vec<_> = futures_util::future::join_all(burst).await;
    let first = results[0].as_ref().unwrap().as_ref().unwrap().clone();
    for r in results {
        assert_eq!(r.unwrap().unwrap(), first);
    }
    let blob = sha256(&file_named(&files, "Tiny-Q4_K_M.gguf").data);
    assert_eq!(
        hub.hits(&format!("/cdn/{blob}")),
        1,
        "one download for eight callers"
    );
    assert_eq!(
        std::fs::read(&first.model).unwrap(),
        file_named(&files, "Tiny-Q4_K_M.gguf").data
    );

    let before = hub.total_hits();
    let again = local(&hub, dir.path());
    assert_eq!(again.cached(&source, &FILE), Some(first.clone()));
    assert_eq!(again.fetch(&source, &FILE).await.unwrap(), first);
    assert_eq!(
        hub.total_hits(),
        before,
        "a cached model asks the network nothing"
    );
    assert!(f.downloads().is_empty());
    assert_eq!(
        f.download_bytes().with_label_values(&["huggingface"]).get(),
        200_000 + 30_000
    );
}

#[tokio::test]
async fn a_whole_snapshot_for_a_directory_engine() {
    let (hub, dir) = (Hub::start().await, tempfile::tempdir().unwrap());
    let config = RepoFile {
        path: "config.json".into(),
        data: "{\"model_type\":\"llama\"}".into(),
        lfs: false,
    };
    let weights = RepoFile {
        path: "model.safetensors".into(),
        data: bytes(9, 64_000),
        lfs: true,
    };
    hub.add_repo("org/tiny-st", vec![config.clone(), weights.clone()]);
    let got = local(&hub, dir.path())
        .fetch(&src("hf://org/tiny-st"), &DIR)
        .await
        .unwrap();
    let repo = dir.path().join("hf/models--org--tiny-st");
    assert_eq!(got.model, repo.join("snapshots").join(COMMIT));
    assert_eq!(got.mmproj, None);
    assert_eq!(
        std::fs::read(got.model.join("config.json")).unwrap(),
        config.data
    );
    // A small file is a git blob, named by its git id in the cache as the Hub names it.
    let link = std::fs::read_link(got.model.join("config.json")).unwrap();
    assert_eq!(
        link,
        PathBuf::from(format!("../../blobs/{}", config.etag()))
    );
    assert_eq!(
        std::fs::read(got.model.join("model.safetensors")).unwrap(),
        weights.data
    );
}

/// A repository that carries its weights in several formats gives a model folder the safetensors
/// alone: not the PyTorch copy, nor Meta's `original/` checkpoint.
#[tokio::test]
async fn a_model_folder_takes_its_weights_in_one_format() {
    let (hub, dir) = (Hub::start().await, tempfile::tempdir().unwrap());
    let file = |path: &str, seed| RepoFile {
        path: path.into(),
        data: bytes(seed, 30_000),
        lfs: true,
    };
    let repo = vec![
        file("config.json", 40),
        file("model.safetensors", 41),
        file("pytorch_model.bin", 42),
        file("original/consolidated.00.pth", 43),
    ];
    hub.add_repo("org/twice", repo.clone());
    let got = local(&hub, dir.path())
        .fetch(&src("hf://org/twice"), &DIR)
        .await
        .unwrap();
    assert!(got.model.join("model.safetensors").exists());
    assert!(got.model.join("config.json").exists());
    assert!(!got.model.join("pytorch_model.bin").exists());
    assert!(!got.model.join("original").exists());
    for skipped in &repo[2..] {
        assert_eq!(hub.hits(&format!("/cdn/{}", sha256(&skipped.data))), 0);
    }
    assert_eq!(got.bytes, 60_000, "the two files it took");
}

/// A snapshot that another tool's config lookup left (its config and tokenizer, no weights) or
/// that lacks a shard its index names is not taken for the model: the weights are fetched.
#[tokio::test]
async fn a_snapshot_without_its_weights_is_not_the_model() {
    let (hub, dir) = (Hub::start().await, tempfile::tempdir().unwrap());
    let file = |path: &str, data: bytes::Bytes, lfs| RepoFile {
        path: path.into(),
        data,
        lfs,
    };
    let index = r#"{"weight_map":{"a":"model-1.safetensors","b":"model-2.safetensors"}}"#;
    let repo = vec![
        file("config.json", "{}".into(), false),
        file("model.safetensors.index.json", index.into(), false),
        file("model-1.safetensors", bytes(31, 20_000), true),
        file("model-2.safetensors", bytes(32, 20_000), true),
    ];
    hub.add_repo("org/sharded", repo.clone());
    let f = local(&hub, dir.path());
    // the Hub client's layout, written by hand as another tool would leave it
    let repo_dir = dir.path().join("hf/models--org--sharded");
    let snapshot = repo_dir.join("snapshots").join(COMMIT);
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo_dir.join("refs")).unwrap();
    std::fs::write(repo_dir.join("refs/main"), COMMIT).unwrap();
    std::fs::write(snapshot.join("config.json"), "{}").unwrap();
    let source = src("hf://org/sharded");
    assert!(f.cached(&source, &DIR).is_none(), "a config alone");
    std::fs::write(snapshot.join("model.safetensors.index.json"), index).unwrap();
    std::fs::write(snapshot.join("model-1.safetensors"), &repo[2].data).unwrap();
    assert!(f.cached(&source, &DIR).is_none(), "one shard of two");
    let got = f.fetch(&source, &DIR).await.unwrap();
    assert_eq!(
        std::fs::read(got.model.join("model-2.safetensors")).unwrap(),
        repo[3].data
    );
    assert!(f.cached(&source, &DIR).is_some());
}

/// A listing whose names would become paths outside the cache (a file `../../../../escape`, as
/// an endpoint that is not the Hub could answer) is refused before anything is written.
#[tokio::test]
async fn a_file_name_that_leaves_the_cache_is_refused() {
    let (hub, dir) = (Hub::start().await, tempfile::tempdir().unwrap());
    let file = |path: &str| RepoFile {
        path: path.into(),
        data: "{}".into(),
        lfs: false,
    };
    hub.add_repo(
        "org/evil",
        vec![file("config.json"), file("../../../../escape")],
    );
    let err = local(&hub, dir.path())
        .fetch(&src("hf://org/evil"), &DIR)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("not a path in the repo"), "{err}");
    assert!(std::fs::symlink_metadata(dir.path().join("escape")).is_err());
}

/// Requests that waited on one download finish it together, each from a thread of its own: none
/// fails on another's link or manifest being written at the same time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fetches_that_finish_together_all_succeed() {
    let hub = Hub::start().await;
    gguf_repo(&hub);
    let source = src("hf://org/tiny-GGUF:Q8_0");
    for _ in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let f = local(&hub, dir.path());
        let burst = (0..8).map(|_| {
            let (f, source) = (f.clone(), source.clone());
            tokio::spawn(async move { f.fetch(&source, &FILE).await })
        });
        for result in futures_util::future::join_all(burst).await {
            result.unwrap().unwrap();
        }
    }
}

#[tokio::test]
async fn a_dropped_connection_resumes_with_a_range_request() {
    let (hub, dir) = (Hub::start().await, tempfile::tempdir().unwrap());
    let files = gguf_repo(&hub);
    let data = file_named(&files, "Tiny-Q4_K_M.gguf").data.clone();
    let cdn = format!("/cdn/{}", sha256(&data));
    hub.state
        .lock()
        .unwrap()
        .drop_after
        .insert(cdn.clone(), 70_000);
    let f = local(&hub, dir.path());
    let mut updates = f.subscribe();
    let got = f
        .fetch(&src("hf://org/tiny-GGUF/Tiny-Q4_K_M.gguf"), &FILE)
        .await
        .unwrap();
    assert_eq!(std::fs::read(&got.model).unwrap(), data);
    assert_eq!(hub.hits(&cdn), 2);
    let resumed = hub.resumed_at(&cdn);
    assert!(
        resumed.len() == 1 && resumed[0] > 0 && resumed[0] <= 70_000,
        "{resumed:?}"
    );
    assert!(leftovers(dir.path()).is_empty());
    let mut last = None;
    while let Ok(p) = updates.try_recv() {
        last = Some(p);
    }
    let last = last.expect("progress was published");
    assert_eq!(
        (last.bytes, last.total, last.file.as_str()),
        (200_000, Some(200_000), "Tiny-Q4_K_M.gguf")
    );
    assert_eq!(last.source, "hf://org/tiny-GGUF/Tiny-Q4_K_M.gguf");
}

#[tokio::test]
async fn wrong_bytes_fail_the_checksum_and_leave_nothing_complete() {
    let (hub, dir) = (Hub::start().await, tempfile::tempdir().unwrap());
    let files = gguf_repo(&hub);
    let expected = sha256(&file_named(&files, "Tiny-Q4_K_M.gguf").data);
    hub.state
        .lock()
        .unwrap()
        .corrupt
        .insert(format!("/cdn/{expected}"));
    let err = local(&hub, dir.path())
        .fetch(&src("hf://org/tiny-GGUF:Q4_K_M"), &FILE)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, FetchError::Checksum { .. }), "{text}");
    assert!(
        text.contains(&expected) && text.contains("hf://org/tiny-GGUF:Q4_K_M"),
        "{text}"
    );
    let repo = dir.path().join("hf/models--org--tiny-GGUF");
    assert!(!repo.join("blobs").join(&expected).exists());
    assert!(!repo
        .join("snapshots")
        .join(COMMIT)
        .join("Tiny-Q4_K_M.gguf")
        .exists());
    // (The projector's download may still be under way; the bad file's part is gone.)
    assert!(!repo
        .join("blobs")
        .join(format!("{expected}.incomplete"))
        .exists());
}

#[tokio::test]
async fn hub_errors_say_what_is_missing_and_what_to_do() {
    let (hub, dir) = (Hub::start().await, tempfile::tempdir().unwrap());
    gguf_repo(&hub);
    let f = local(&hub, dir.path());
    let fail = |text: &'static str, want: Want| {
        let f = f.clone();
        async move { f.fetch(&src(text), &want).await.unwrap_err() }
    };
    let e = fail("hf://org/nothing:Q4_K_M", FILE).await;
    assert!(
        matches!(e, FetchError::NotFound { .. }) && e.to_string().contains("org/nothing"),
        "{e}"
    );
    let e = fail("hf://org/tiny-GGUF:Q4_K_M@v9", FILE).await;
    assert!(e.to_string().contains("revision v9"), "{e}");
    let e = fail("hf://org/tiny-GGUF/absent.gguf", FILE).await;
    assert!(e.to_string().contains("absent.gguf"), "{e}");
    let e = fail("hf://org/tiny-GGUF:Q2_K", FILE).await;
    assert!(
        e.to_string().contains("the repository has: Q4_K_M, Q8_0"),
        "{e}"
    );
    let e = fail("hf://org/tiny-GGUF", FILE).await;
    assert!(e.to_string().contains(":Q4_K_M"), "{e}");

    hub.state.lock().unwrap().token = Some("hf_secret".into());
    let e = fail("hf://org/tiny-GGUF:Q4_K_M", FILE).await;
    assert!(
        matches!(e, FetchError::Credentials { status: 401, .. })
            && e.to_string().contains("set HF_TOKEN"),
        "{e}"
    );
    let with_token = fetcher(&[
        ("HF_HUB_CACHE", dir.path().join("hf").display().to_string()),
        ("HF_ENDPOINT", hub.url.clone()),
        // as a secret mounted from a file gives it
        ("HF_TOKEN", "hf_secret\n".into()),
    ]);
    with_token
        .fetch(&src("hf://org/tiny-GGUF:Q4_K_M"), &FILE)
        .await
        .unwrap();
}

/// A part that cannot be of the file (longer than it) and cannot be removed (here a directory) is
/// an error naming it, not a loop of tries that keeps a thread busy for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_that_cannot_be_removed_is_an_error() {
    let (hub, dir) = (Hub::start().await, tempfile::tempdir().unwrap());
    let config = RepoFile {
        path: "config.json".into(),
        data: "{\"model_type\":\"llama\"}".into(),
        lfs: false,
    };
    hub.add_repo("org/stuck", vec![config.clone()]);
    let blobs = dir.path().join("hf/models--org--stuck/blobs");
    // a directory whose size (as the file system counts it) is past the file's 22 bytes
    let stuck = blobs.join(format!("{}.incomplete", config.etag()));
    for n in 0..64 {
        std::fs::create_dir_all(stuck.join(format!("entry-with-a-long-name-{n:03}"))).unwrap();
    }
    assert!(std::fs::metadata(&stuck).unwrap().len() > 22);
    let (f, source) = (local(&hub, dir.path()), src("hf://org/stuck"));
    let fetch = f.fetch(&source, &DIR);
    let e = tokio::time::timeout(std::time::Duration::from_secs(10), fetch)
        .await
        .expect("an answer, not endless tries")
        .unwrap_err();
    assert!(e.to_string().contains(".incomplete"), "{e}");
}

/// A refusal's error carries what the server said of it (an expired link, a bad request), on one
/// line: often the only hint of what to fix.
#[tokio::test]
async fn a_refusal_says_what_the_server_said() {
    let (hub, dir) = (Hub::start().await, tempfile::tempdir().unwrap());
    let f = local(&hub, dir.path());
    for (status, said) in [
        (403, "Request has expired\n(X-Amz-Expires: 3600)"),
        (400, "Invalid range for this object"),
    ] {
        let name = format!("refused-{status}.gguf");
        let refusal = (status, said.to_string());
        hub.state
            .lock()
            .unwrap()
            .refuse
            .insert(format!("/files/{name}"), refusal);
        let url = src(&format!("{}/files/{name}", hub.url));
        let e = f.fetch(&url, &FILE).await.unwrap_err().to_string();
        let one_line = said.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(e.contains(&format!("the server said: {one_line}")), "{e}");
    }
}

#[tokio::test]
async fn paths_are_used_where_they_lie() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.gguf");
    std::fs::write(&model, b"GGUF....").unwrap();
    let f = fetcher(&[]);
    let got = f.fetch(&Source::Path(model.clone()), &FILE).await.unwrap();
    assert_eq!((got.model, got.bytes), (model, 8));
    let e = f
        .fetch(&Source::Path(dir.path().join("gone.gguf")), &FILE)
        .await
        .unwrap_err();
    assert!(
        matches!(e, FetchError::PathMissing { .. }) && e.to_string().contains("gone.gguf"),
        "{e}"
    );
    let e = f
        .fetch(&Source::Path(dir.path().to_path_buf()), &FILE)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("is a directory"), "{e}");
}

#[tokio::test]
async fn urls_are_checked_against_their_sha256_and_resumed() {
    let (hub, dir) = (Hub::start().await, tempfile::tempdir().unwrap());
    let data = bytes(7, 120_000);
    hub.state
        .lock()
        .unwrap()
        .files
        .insert("m.gguf".into(), data.clone());
    let url = format!("{}/files/m.gguf", hub.url);
    let f = local(&hub, dir.path());

    let wrong = Want {
        form: Form::File,
        sha256: Some(sha256(b"other")),
    };
    let e = f
        .fetch(&Source::Url(url.clone()), &wrong)
        .await
        .unwrap_err();
    assert!(
        matches!(e, FetchError::Checksum { .. }) && e.to_string().contains(&sha256(b"other")),
        "{e}"
    );
    assert!(
        f.cached(&Source::Url(url.clone()), &wrong).is_none(),
        "nothing left as complete"
    );
    assert!(leftovers(dir.path()).is_empty());

    hub.state
        .lock()
        .unwrap()
        .drop_after
        .insert("/files/m.gguf".into(), 50_000);
    let right = Want {
        form: Form::File,
        sha256: Some(format!("sha256:{}", sha256(&data))),
    };
    let got = f.fetch(&Source::Url(url.clone()), &right).await.unwrap();
    assert_eq!(std::fs::read(&got.model).unwrap(), data);
    assert!(
        got.model
            .starts_with(dir.path().join("corral/url/127.0.0.1"))
            && got.model.ends_with("m.gguf")
    );
    let resumed = hub.resumed_at("/files/m.gguf");
    assert!(
        resumed.len() == 1 && resumed[0] > 0 && resumed[0] <= 50_000,
        "{resumed:?}"
    );
    let e = f
        .fetch(&src(&format!("{}/files/absent.gguf", hub.url)), &FILE)
        .await
        .unwrap_err();
    assert!(matches!(e, FetchError::NotFound { .. }), "{e}");
}

/// A 206 whose bytes start elsewhere than the end of the part (here: at the file's first byte)
/// is not appended to the part: the file is fetched again whole, where the part and the answer
/// used to be joined into a file of the wrong bytes.
#[tokio::test]
async fn a_range_answered_from_elsewhere_is_not_appended() {
    let (hub, dir) = (Hub::start().await, tempfile::tempdir().unwrap());
    let data = bytes(9, 120_000);
    let path = "/files/r.gguf";
    {
        let mut s = hub.state.lock().unwrap();
        s.files.insert("r.gguf".into(), data.clone());
        s.drop_after.insert(path.into(), 50_000);
        s.range_from_start.insert(path.into());
    }
    let source = src(&format!("{}{path}", hub.url));
    let got = local(&hub, dir.path()).fetch(&source, &FILE).await.unwrap();
    assert_eq!(std::fs::read(&got.model).unwrap(), data);
    assert_eq!(hub.resumed_at(path).len(), 1, "a range was asked for");
    assert_eq!(hub.hits(path), 3, "cut, answered from elsewhere, whole");
    assert!(leftovers(dir.path()).is_empty());
}

/// A part an interrupted run left is resumed only while the source still serves the version it
/// came from: a file changed since comes whole, never as the old part and the new rest. A part
/// whose version is not known (nor checkable by a digest) is fetched again whole too.
#[tokio::test]
async fn a_part_of_a_file_changed_since_is_not_resumed() {
    let (hub, dir) = (Hub::start().await, tempfile::tempdir().unwrap());
    let serve = |data: &bytes::Bytes| {
        let mut s = hub.state.lock().unwrap();
        s.files.insert("w.gguf".into(), data.clone());
    };
    let (old, new) = (bytes(31, 90_000), bytes(32, 90_000));
    serve(&old);
    let source = src(&format!("{}/files/w.gguf", hub.url));
    let dest = local(&hub, dir.path())
        .fetch(&source, &FILE)
        .await
        .unwrap()
        .model;
    let part = dest.with_file_name("w.gguf.incomplete");
    let version = dest.with_file_name("w.gguf.incomplete.version");
    let left = |data: &bytes::Bytes, from: Option<&bytes::Bytes>| {
        let _ = std::fs::remove_file(&dest);
        std::fs::write(&part, &data[..50_000]).unwrap();
        match from {
            Some(v) => std::fs::write(&version, format!("\"{}\"", sha256(v))).unwrap(),
            None => assert!(!version.exists()),
        }
    };
    let fetched = || async {
        let got = local(&hub, dir.path()).fetch(&source, &FILE).await.unwrap();
        std::fs::read(got.model).unwrap()
    };

    left(&old, Some(&old));
    serve(&new);
    assert_eq!(fetched().await, new, "the new version whole");
    let ranges = || hub.resumed_at("/files/w.gguf");
    let asked = ranges().len();
    left(&old, None);
    assert_eq!(fetched().await, new, "an unknown version is not resumed");
    assert_eq!(ranges().len(), asked, "nor asked for a range");
    left(&new, Some(&new));
    assert_eq!(fetched().await, new);
    assert_eq!(ranges()[asked..], [50_000], "the same version is resumed");
    assert!(!version.exists() && leftovers(dir.path()).is_empty());
}

/// Two fetchers that share nothing but the cache (two processes, say) download a file once: the
/// second waits for the first's lock, then finds the file whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_download_a_file_once() {
    let (hub, dir) = (Hub::start().await, tempfile::tempdir().unwrap());
    let files = gguf_repo(&hub);
    let data = file_named(&files, "Tiny-Q4_K_M.gguf").data.clone();
    let cdn = format!("/cdn/{}", sha256(&data));
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let stall = (cdn.clone(), (50_000, gate.clone()));
    hub.state.lock().unwrap().stall_after.extend([stall]);
    let source = src("hf://org/tiny-GGUF/Tiny-Q4_K_M.gguf");
    let fetch = |f: Fetcher| {
        let source = source.clone();
        tokio::spawn(async move { f.fetch(&source, &FILE).await })
    };
    let first = fetch(local(&hub, dir.path()));
    while hub.hits(&cdn) == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let second = fetch(local(&hub, dir.path()));
    // the second has asked the Hub for the listing, and waits for the lock or the download
    let listing = "/api/models/org/tiny-GGUF/revision/main";
    while hub.hits(listing) < 2 {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    gate.add_permits(1);
    let (a, b) = (
        first.await.unwrap().unwrap(),
        second.await.unwrap().unwrap(),
    );
    assert_eq!(a, b);
    assert_eq!(std::fs::read(&a.model).unwrap(), data);
    assert_eq!(hub.hits(&cdn), 1, "one download");
}

/// A connection that keeps dropping, each time after more of the file came, does not use up the
/// tries: only tries in a row that bring nothing do.
#[tokio::test]
async fn drops_that_each_bring_more_of_the_file_do_not_use_up_the_tries() {
    let (hub, dir) = (Hub::start().await, tempfile::tempdir().unwrap());
    let files = gguf_repo(&hub);
    let data = file_named(&files, "Tiny-Q4_K_M.gguf").data.clone();
    let cdn = format!("/cdn/{}", sha256(&data));
    // 200,000 bytes, 20,000 of them per connection: nine drops, then the rest
    let cuts = (cdn.clone(), (20_000, 9));
    hub.state.lock().unwrap().cut_each.extend([cuts]);
    let got = local(&hub, dir.path())
        .fetch(&src("hf://org/tiny-GGUF/Tiny-Q4_K_M.gguf"), &FILE)
        .await
        .unwrap();
    assert_eq!(std::fs::read(&got.model).unwrap(), data);
    assert_eq!(hub.hits(&cdn), 10);
}

const MODEL: &str = "application/vnd.ollama.image.model";
const PROJECTOR: &str = "application/vnd.ollama.image.projector";

#[tokio::test]
async fn an_ollama_store_answers_without_the_network() {
    let (hub, dir) = (Hub::start().await, tempfile::tempdir().unwrap());
    let (model, proj) = (bytes(11, 40_000), bytes(12, 9_000));
    // The same manifest as the registry would send, written into a store by hand.
    let manifest = hub.add_ollama(
        "library/tiny/q4",
        &[(MODEL, model.clone()), (PROJECTOR, proj.clone())],
    );
    hub.state.lock().unwrap().manifests.clear();
    let store = dir.path().join("ollama");
    let mdir = store.join("manifests/registry.ollama.ai/library/tiny");
    std::fs::create_dir_all(&mdir).unwrap();
    std::fs::write(mdir.join("q4"), manifest).unwrap();
    std::fs::create_dir_all(store.join("blobs")).unwrap();
    for d in [&model, &proj] {
        std::fs::write(store.join(format!("blobs/sha256-{}", sha256(d))), d).unwrap();
    }
    let got = local(&hub, dir.path())
        .fetch(&src("ollama://tiny:q4"), &FILE)
        .await
        .unwrap();
    assert_eq!(
        got.model,
        store.join(format!("blobs/sha256-{}", sha256(&model)))
    );
    assert_eq!(
        got.mmproj,
        Some(store.join(format!("blobs/sha256-{}", sha256(&proj))))
    );
    assert_eq!(hub.total_hits(), 0);
}

#[tokio::test]
async fn the_ollama_registry_fills_the_store_as_ollama_lays_it_out() {
    let (hub, dir) = (Hub::start().await, tempfile::tempdir().unwrap());
    let model = bytes(13, 80_000);
    let manifest = hub.add_ollama("user/tiny/latest", &[(MODEL, model.clone())]);
    let f = local(&hub, dir.path());
    let got = f.fetch(&src("ollama://user/tiny"), &FILE).await.unwrap();
    let store = dir.path().join("ollama");
    assert_eq!(
        got.model,
        store.join(format!("blobs/sha256-{}", sha256(&model)))
    );
    assert_eq!(std::fs::read(&got.model).unwrap(), model);
    let written = store.join("manifests/registry.ollama.ai/user/tiny/latest");
    assert_eq!(std::fs::read_to_string(written).unwrap(), manifest);
    assert_eq!(
        std::fs::read_dir(store.join("blobs")).unwrap().count(),
        2,
        "the config blob too"
    );
    let before = hub.total_hits();
    assert_eq!(
        f.fetch(&src("ollama://user/tiny:latest"), &FILE)
            .await
            .unwrap(),
        got
    );
    assert_eq!(hub.total_hits(), before);
    let e = f.fetch(&src("ollama://nothing"), &FILE).await.unwrap_err();
    assert!(
        matches!(e, FetchError::NotFound { .. }) && e.to_string().contains("nothing:latest"),
        "{e}"
    );
}

/// A key is asked for as the bucket stores it, whatever characters it has.
#[tokio::test]
async fn an_s3_key_is_fetched_as_written() {
    let data = bytes(22, 10_000);
    let Some(server) = s3::S3::start("models", "tiny/m~v2.gguf", &data) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let f = s3_fetcher(dir.path(), &server, &server.key, &server.secret);
    let got = f
        .fetch(&src("s3://models/tiny/m~v2.gguf"), &FILE)
        .await
        .unwrap();
    assert_eq!(std::fs::read(&got.model).unwrap(), data);
}

fn s3_fetcher(dir: &Path, s3: &s3::S3, key: &str, secret: &str) -> Fetcher {
    fetcher(&[
        ("CORRAL_CACHE", dir.join("corral").display().to_string()),
        ("AWS_ENDPOINT_URL", s3.url.clone()),
        ("AWS_REGION", "us-east-1".into()),
        ("AWS_ACCESS_KEY_ID", key.into()),
        ("AWS_SECRET_ACCESS_KEY", secret.into()),
    ])
}

#[tokio::test]
async fn s3_objects_download_resume_and_refuse_wrong_keys() {
    let data = bytes(21, 90_000);
    let Some(server) = s3::S3::start("models", "tiny/m.gguf", &data) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let f = s3_fetcher(dir.path(), &server, &server.key, &server.secret);
    let dest = dir.path().join("corral/s3/models/tiny/m.gguf");

    // A part left by an earlier run is resumed with a ranged GET, and the whole checked.
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    std::fs::write(dest.with_file_name("m.gguf.incomplete"), &data[..30_000]).unwrap();
    let got = f
        .fetch(&src("s3://models/tiny/m.gguf"), &FILE)
        .await
        .unwrap();
    assert_eq!((got.model.as_path(), got.bytes), (dest.as_path(), 90_000));
    assert_eq!(std::fs::read(&dest).unwrap(), data);
    assert_eq!(
        f.download_bytes().with_label_values(&["s3"]).get(),
        60_000,
        "only the rest came"
    );

    // a part left whole (a run ended before its rename) is checked and kept, not fetched again
    std::fs::remove_file(&dest).unwrap();
    std::fs::write(dest.with_file_name("m.gguf.incomplete"), &data).unwrap();
    let again = s3_fetcher(dir.path(), &server, &server.key, &server.secret);
    let got = again
        .fetch(&src("s3://models/tiny/m.gguf"), &FILE)
        .await
        .unwrap();
    assert_eq!(std::fs::read(&got.model).unwrap(), data);
    assert_eq!(again.download_bytes().with_label_values(&["s3"]).get(), 0);
    // and one whole but wrong (another tool's) is fetched again, not an error
    std::fs::remove_file(&dest).unwrap();
    std::fs::write(dest.with_file_name("m.gguf.incomplete"), vec![0u8; 90_000]).unwrap();
    let got = again
        .fetch(&src("s3://models/tiny/m.gguf"), &FILE)
        .await
        .unwrap();
    assert_eq!(std::fs::read(&got.model).unwrap(), data);

    let e = f
        .fetch(&src("s3://models/tiny/absent.gguf"), &FILE)
        .await
        .unwrap_err();
    assert!(
        matches!(e, FetchError::NotFound { .. }) && e.to_string().contains("absent.gguf"),
        "{e}"
    );
    let wrong = s3_fetcher(dir.path(), &server, "AKIAWRONGWRONGWRONG0", "nope");
    let e = wrong
        .fetch(&src("s3://models/tiny/other.gguf"), &FILE)
        .await
        .unwrap_err();
    assert!(
        matches!(e, FetchError::Credentials { .. }) && e.to_string().contains("AWS_ACCESS_KEY_ID"),
        "{e}"
    );

    // a sha256 the config gives is what the object is checked against (the ETag is no MD5 for
    // an object encrypted with SSE-KMS)
    let fresh = tempfile::tempdir().unwrap();
    let f = s3_fetcher(fresh.path(), &server, &server.key, &server.secret);
    let want = |sha: String| Want {
        form: Form::File,
        sha256: Some(sha),
    };
    let source = src("s3://models/tiny/m.gguf");
    let e = f.fetch(&source, &want("0".repeat(64))).await.unwrap_err();
    assert!(matches!(e, FetchError::Checksum { .. }), "{e}");
    let got = f.fetch(&source, &want(sha256(&data))).await.unwrap();
    assert_eq!(std::fs::read(&got.model).unwrap(), data);

    // and a cached object that no longer matches it is refused, and left as it is
    let mut tampered = data.to_vec();
    tampered[5] ^= 1;
    std::fs::write(&got.model, &tampered).unwrap();
    let again = s3_fetcher(fresh.path(), &server, &server.key, &server.secret);
    assert!(again.cached(&source, &want(sha256(&data))).is_none());
    let e = again
        .fetch(&source, &want(sha256(&data)))
        .await
        .unwrap_err();
    assert!(matches!(e, FetchError::Tampered { .. }), "{e}");
    assert_eq!(std::fs::read(&got.model).unwrap(), tampered);
}

/// A server that answers every request for a file with a chunked body (no declared length): the
/// first `cut` answers end early and close the connection, the first inside a chunk, the others
/// after a whole chunk and before the last; the answers after them send the file whole.
async fn chunked_server(
    data: bytes::Bytes,
    cut: usize,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/c.gguf", listener.local_addr().unwrap());
    let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = served.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let n = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let data = data.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(k) => head.extend_from_slice(&buf[..k]),
                    }
                }
                let half = data.len() / 2;
                let mut out = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
                match n {
                    0 if cut > 0 => {
                        out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
                        out.extend_from_slice(&data[..half]);
                    }
                    n if n < cut => {
                        out.extend_from_slice(format!("{half:x}\r\n").as_bytes());
                        out.extend_from_slice(&data[..half]);
                        out.extend_from_slice(b"\r\n");
                    }
                    _ => {
                        out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
                        out.extend_from_slice(&data);
                        out.extend_from_slice(b"\r\n0\r\n\r\n");
                    }
                }
                let _ = tcp.write_all(&out).await;
                let _ = tcp.shutdown().await;
            });
        }
    });
    (url, served)
}

/// A chunked answer (no declared length) that ends early, inside a chunk or before the last one,
/// is not kept as the whole file: it is fetched again.
#[tokio::test]
async fn a_chunked_answer_cut_short_is_not_kept_as_complete() {
    let data = bytes(41, 40_000);
    let (url, served) = chunked_server(data.clone(), 2).await;
    let dir = tempfile::tempdir().unwrap();
    let f = fetcher(&[("CORRAL_CACHE", dir.path().display().to_string())]);
    let got = f.fetch(&Source::Url(url), &FILE).await.unwrap();
    assert_eq!(std::fs::read(&got.model).unwrap(), data);
    assert_eq!(served.load(std::sync::atomic::Ordering::SeqCst), 3);
}

/// An answer that goes on past the size the Hub's listing gives (chunked, so no length says when
/// it ends) is stopped there, with an error: a server cannot fill the disk, and no part longer
/// than the file is kept.
#[tokio::test]
async fn a_download_longer_than_its_listing_stops_at_the_listed_size() {
    let (hub, dir) = (Hub::start().await, tempfile::tempdir().unwrap());
    let files = gguf_repo(&hub);
    let data = file_named(&files, "Tiny-Q4_K_M.gguf").data.clone();
    let cdn = format!("/cdn/{}", sha256(&data));
    hub.state
        .lock()
        .unwrap()
        .overlong
        .insert(cdn.clone(), 1 << 20);
    let e = local(&hub, dir.path())
        .fetch(&src("hf://org/tiny-GGUF/Tiny-Q4_K_M.gguf"), &FILE)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("more than the 200000 bytes"), "{e}");
    assert_eq!(hub.hits(&cdn), 1, "stopped, not tried again");
    let blobs = dir.path().join("hf/models--org--tiny-GGUF/blobs");
    for entry in std::fs::read_dir(&blobs).unwrap() {
        let entry = entry.unwrap();
        assert!(entry.metadata().unwrap().len() <= 200_000, "{entry:?}");
    }
    assert!(leftovers(dir.path()).is_empty());
}

/// A link planted in a shared cache where corral keeps a file's part (here to a file of the
/// user's) is refused, naming it, and the file it points at is left untouched; so is a blobs
/// folder that is a link.
#[tokio::test]
async fn a_link_planted_in_the_cache_is_refused_and_its_target_untouched() {
    let (hub, dir) = (Hub::start().await, tempfile::tempdir().unwrap());
    let files = gguf_repo(&hub);
    let data = file_named(&files, "Tiny-Q4_K_M.gguf").data.clone();
    let victim = dir.path().join("victim.txt");
    std::fs::write(&victim, "precious").unwrap();
    let blobs = dir.path().join("hf/models--org--tiny-GGUF/blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    let part = blobs.join(format!("{}.incomplete", sha256(&data)));
    std::os::unix::fs::symlink(&victim, &part).unwrap();
    let source = src("hf://org/tiny-GGUF/Tiny-Q4_K_M.gguf");
    let e = local(&hub, dir.path())
        .fetch(&source, &FILE)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&part.display().to_string()) && e.contains("symbolic link"),
        "{e}"
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");

    // the blobs folder itself a link to a folder of the user's
    let theirs = dir.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::remove_file(&part).unwrap();
    std::fs::remove_dir(&blobs).unwrap();
    std::os::unix::fs::symlink(&theirs, &blobs).unwrap();
    let e = local(&hub, dir.path())
        .fetch(&source, &FILE)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("blobs is a symbolic link"), "{e}");
    assert_eq!(std::fs::read_dir(&theirs).unwrap().count(), 0);
}

/// A blob found in a store whose content does not match the digest it is named by is refused,
/// naming the file and both digests, and left where it is; one that matches is checked once.
#[tokio::test]
async fn a_tampered_blob_in_a_store_is_refused() {
    let (hub, dir) = (Hub::start().await, tempfile::tempdir().unwrap());
    let model = bytes(14, 40_000);
    let manifest = hub.add_ollama("library/tiny/q4", &[(MODEL, model.clone())]);
    let store = dir.path().join("ollama");
    let mdir = store.join("manifests/registry.ollama.ai/library/tiny");
    std::fs::create_dir_all(&mdir).unwrap();
    std::fs::write(mdir.join("q4"), manifest).unwrap();
    std::fs::create_dir_all(store.join("blobs")).unwrap();
    let blob = store.join(format!("blobs/sha256-{}", sha256(&model)));
    let mut tampered = model.to_vec();
    tampered[1_000] ^= 1;
    std::fs::write(&blob, &tampered).unwrap();
    let f = local(&hub, dir.path());
    let source = src("ollama://tiny:q4");
    assert!(
        f.cached(&source, &FILE).is_none(),
        "not used before it is checked"
    );
    let e = f.fetch(&source, &FILE).await.unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, FetchError::Tampered { .. }), "{text}");
    assert!(
        text.contains(&blob.display().to_string())
            && text.contains(&sha256(&model))
            && text.contains(&sha256(&tampered)),
        "{text}"
    );
    assert_eq!(std::fs::read(&blob).unwrap(), tampered, "left as it is");

    std::fs::write(&blob, &model).unwrap();
    assert_eq!(f.fetch(&source, &FILE).await.unwrap().model, blob);
    assert!(
        f.cached(&source, &FILE).is_some(),
        "checked once, remembered"
    );
    assert_eq!(hub.total_hits(), 0);
}

/// A Hub blob already in the cache that does not match its name is refused too, whether the
/// snapshot's link names it or a fresh listing does.
#[tokio::test]
async fn a_tampered_hub_blob_is_refused() {
    let (hub, dir) = (Hub::start().await, tempfile::tempdir().unwrap());
    let files = gguf_repo(&hub);
    let source = src("hf://org/tiny-GGUF/Tiny-Q4_K_M.gguf");
    let got = local(&hub, dir.path()).fetch(&source, &FILE).await.unwrap();
    let data = file_named(&files, "Tiny-Q4_K_M.gguf").data.clone();
    let blob = dir
        .path()
        .join("hf/models--org--tiny-GGUF/blobs")
        .join(sha256(&data));
    let mut tampered = data.to_vec();
    tampered[7] ^= 1;
    std::fs::write(&blob, &tampered).unwrap();
    let f = local(&hub, dir.path());
    assert!(f.cached(&source, &FILE).is_none());
    let e = f.fetch(&source, &FILE).await.unwrap_err();
    assert!(matches!(e, FetchError::Tampered { .. }), "{e}");
    // with no ref, the listing names the blob, and the download finds it in place
    std::fs::remove_file(dir.path().join("hf/models--org--tiny-GGUF/refs/main")).unwrap();
    std::fs::remove_file(&got.model).unwrap();
    let e = f.fetch(&source, &FILE).await.unwrap_err();
    assert!(matches!(e, FetchError::Tampered { .. }), "{e}");
    assert_eq!(std::fs::read(&blob).unwrap(), tampered);
}

/// An Ollama manifest past the bound on JSON answers is refused rather than read whole.
#[tokio::test]
async fn an_answer_past_the_json_bound_is_refused() {
    let (hub, dir) = (Hub::start().await, tempfile::tempdir().unwrap());
    let model = bytes(15, 10_000);
    let manifest = hub.add_ollama("library/big/latest", &[(MODEL, model)]);
    // still a valid manifest, padded past 8 MiB
    let padded = format!("{}{}", " ".repeat(9 << 20), manifest);
    let key = "library/big/latest".to_string();
    hub.state.lock().unwrap().manifests.insert(key, padded);
    let e = local(&hub, dir.path())
        .fetch(&src("ollama://big"), &FILE)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("the registry's manifest is over 8388608 bytes"),
        "{e}"
    );
    assert!(!dir.path().join("ollama/manifests").exists());
}

/// Links that loop in a snapshot (as anyone who can write a shared cache may leave) do not make
/// the walk over it endless: they are refused, named.
#[tokio::test]
async fn links_that_loop_in_a_snapshot_are_refused() {
    let (hub, dir) = (Hub::start().await, tempfile::tempdir().unwrap());
    gguf_repo(&hub);
    let source = src("hf://org/tiny-GGUF:Q4_K_M");
    let f = local(&hub, dir.path());
    let got = f.fetch(&source, &FILE).await.unwrap();
    let snapshot = got.model.parent().unwrap().to_path_buf();
    for name in ["a", "b"] {
        std::os::unix::fs::symlink(".", snapshot.join(name)).unwrap();
    }
    let (done, answer) = std::sync::mpsc::channel();
    let (f2, source2) = (local(&hub, dir.path()), source.clone());
    std::thread::spawn(move || done.send(f2.cached(&source2, &FILE)));
    let found = answer
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("the walk ends");
    assert!(found.is_none());
    let e = f.fetch(&source, &FILE).await.unwrap_err().to_string();
    let named = |link: &str| e.contains(&format!("{}/{link} links to .", snapshot.display()));
    assert!(named("a") || named("b"), "{e}");
}
