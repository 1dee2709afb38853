//! A real llama-server serves a model fetched from each kind of source: the Hugging Face Hub
//! (its imitation on loopback), S3 (moto's server), a URL and the Ollama registry, with corral
//! building each engine command from `engine: llama_cpp`.

#[path = "support/hub.rs"]
mod hub;
#[path = "support/s3.rs"]
mod s3;
mod support;

use std::time::Duration;

use bytes::Bytes;
use hub::{sha256, Hub, RepoFile};
use support::*;

/// The llama-server build the suite uses, or `None` after a loud skip line (fails under CI).
fn llama_server() -> Option<String> {
    match std::env::var("CORRAL_LLAMA_SERVER") {
        Ok(p) if !p.is_empty() => Some(p),
        _ if std::env::var_os("CI").is_some() => panic!("CORRAL_LLAMA_SERVER is not set"),
        _ => {
            eprintln!("\n*** SKIPPED: CORRAL_LLAMA_SERVER is not set; run scripts/test.sh ***\n");
            None
        }
    }
}

fn tiny_gguf() -> Bytes {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    gguf::write_tiny_llama(&path, &gguf::TinyOptions::default()).unwrap();
    Bytes::from(std::fs::read(&path).unwrap())
}

fn model(id: &str, source: &str) -> String {
    format!(
        "  {id}:\n    engine: llama_cpp\n    source: '{source}'\n    ctx: 256\n    slots: 1\n    args: [-t, '1', --no-webui]\n    env: [\"${{env.MARKER}}\"]\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_server_serves_a_model_from_each_source() {
    let Some(server) = llama_server() else { return };
    let weights = tiny_gguf();
    let hub = Hub::start().await;
    hub.add_repo(
        "corral/tiny-GGUF",
        vec![RepoFile {
            path: "tiny-Q8_0.gguf".into(),
            data: weights.clone(),
            lfs: true,
        }],
    );
    hub.state
        .lock()
        .unwrap()
        .files
        .insert("tiny.gguf".into(), weights.clone());
    hub.add_ollama(
        "library/tiny/latest",
        &[("application/vnd.ollama.image.model", weights.clone())],
    );
    let s3 = s3::S3::start("models", "llm/tiny.gguf", &weights);
    let caches = tempfile::tempdir().unwrap();
    let cache = |name: &str| caches.path().join(name).display().to_string();
    let mut source_env = vec![
        ("HF_ENDPOINT".to_string(), hub.url.clone()),
        ("HF_HUB_CACHE".into(), cache("hf")),
        ("OLLAMA_REGISTRY".into(), hub.url.clone()),
        ("OLLAMA_MODELS".into(), cache("ollama")),
        ("CORRAL_CACHE".into(), cache("corral")),
    ];
    let mut models = vec![
        model("from-hub", "hf://corral/tiny-GGUF:Q8_0"),
        model("from-url", &format!("{}/files/tiny.gguf", hub.url)),
        model("from-ollama", "ollama://tiny"),
    ];
    if let Some(s3) = &s3 {
        source_env.extend([
            ("AWS_ENDPOINT_URL".to_string(), s3.url.clone()),
            ("AWS_REGION".into(), "us-east-1".into()),
            ("AWS_ACCESS_KEY_ID".into(), s3.key.clone()),
            ("AWS_SECRET_ACCESS_KEY".into(), s3.secret.clone()),
        ]);
        models.push(model("from-s3", "s3://models/llm/tiny.gguf"));
    }
    let yaml = format!(
        "healthCheckTimeout: 60\nengines:\n  llama_cpp: {{command: '{server}'}}\ngroups:\n  all: {{swap: false, members: [{}]}}\nmodels:\n{}",
        models
            .iter()
            .map(|m| m.split(':').next().unwrap().trim())
            .collect::<Vec<_>>()
            .join(", "),
        models.concat()
    );
    let opts = corral::Options {
        source_env,
        ..Default::default()
    };
    let h = Harness::start_with(&yaml, opts).await;
    let ids: Vec<String> = models
        .iter()
        .map(|m| m.split(':').next().unwrap().trim().to_string())
        .collect();
    for id in &ids {
        let answer = tokio::time::timeout(
            Duration::from_secs(120),
            post_json(&format!("{}/v1/chat/completions", h.url), &chat(id)),
        )
        .await
        .expect("an answer in time");
        assert_eq!(answer.status, 200, "{id}: {}", answer.text());
        let detail = get(&format!("{}/api/models/{id}", h.url)).await.json();
        assert_eq!(detail["status"], "active", "{detail}");
        let cmd = detail["instances"][0]["cmd"].as_str().unwrap_or_default();
        assert!(
            cmd.contains(&format!("-m {}", caches.path().display())),
            "{cmd}"
        );
    }
    let blob = caches
        .path()
        .join("hf/models--corral--tiny-GGUF/blobs")
        .join(sha256(&weights));
    assert_eq!(
        std::fs::read(blob).unwrap(),
        weights,
        "the Hub's cache layout"
    );
    h.stop().await;
}
