//! Placement the engines obey: each instance starts with exactly the devices the ledger charged it
//! on, replicas of a pool land on different GPUs, and a model that picks its own devices keeps them.
//! The GPUs are a fake `nvidia-smi` (`CORRAL_NVIDIA_SMI`) listing two 24 GiB cards; the processes
//! it reports using them are whatever the test writes to [`COMPUTE_APPS`] in its directory.

mod support;

use std::collections::BTreeSet;

use support::process::*;
use support::*;

/// The file the fake nvidia-smi answers `--query-compute-apps` from (`uuid, pid, MiB` rows).
const COMPUTE_APPS: &str = "compute-apps.csv";

fn fake_nvidia_smi(dir: &std::path::Path) -> String {
    fake_nvidia_smi_reading_in(dir, "0")
}

/// The fake, taking `seconds` to list the processes (a busy machine's nvidia-smi can take that).
fn fake_nvidia_smi_reading_in(dir: &std::path::Path, seconds: &str) -> String {
    let path = dir.join("nvidia-smi");
    let apps = dir.join(COMPUTE_APPS);
    let script = format!(
        "#!/bin/sh\ncase \"$1\" in --query-compute-apps*) sleep {seconds}; cat '{}' 2>/dev/null; exit 0;; esac\nprintf '0, GPU-aaaa-0000, 24576\\n1, GPU-bbbb-1111, 24576\\n'\n",
        apps.display()
    );
    executable(&path, &script)
}

/// corral on `models` (YAML under `models:`) with `devices: auto` reading the fake two-GPU
/// nvidia-smi; the directory the models' events files go to (`${env.DIR}`), and the state dir.
fn corral_on_two_gpus(
    dir: tempfile::TempDir,
    models: &str,
) -> (Proc, std::path::PathBuf, tempfile::TempDir) {
    let smi = fake_nvidia_smi(dir.path());
    spawn_corral_on_auto_devices(dir, models, &[("CORRAL_NVIDIA_SMI", smi.as_str())])
}

/// Starts the pool `chat` (two replicas, `startReplicas: all`) with one request; the GPUs its
/// two engines were given.
async fn gpus_of_both_replicas(p: &Proc, events_dir: &std::path::Path) -> BTreeSet<String> {
    let url = format!("{}/v1/chat/completions", p.url);
    assert_eq!(post_json(&url, &chat("chat")).await.status, 200);
    eventually(
        std::time::Duration::from_secs(15),
        "both replicas started",
        || visible(events_dir, "chat").len() == 2,
    )
    .await;
    visible(events_dir, "chat").into_iter().collect()
}

/// The `CUDA_VISIBLE_DEVICES` each start of a model's engines saw.
fn visible(dir: &std::path::Path, model: &str) -> Vec<String> {
    read_events(&dir.join(format!("{model}.events")))
        .iter()
        .filter(|e| e["event"] == "spawned")
        .map(|e| {
            e["visible"]["CUDA_VISIBLE_DEVICES"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_see_only_the_gpus_they_are_charged_on() {
    let models = format!(
        "{}  own:\n    cmd: ${{env.ENGINE}} --port ${{PORT}} --events-file ${{env.DIR}}/own.events\n    env: [\"${{env.MARKER}}\", \"CUDA_VISIBLE_DEVICES=7\"]\n    memory: 4GiB\n",
        fake_model("chat", "", "replicas: 2\nstartReplicas: all\nmemory: 4GiB"),
    );
    let (p, events_dir, _state) = corral_on_two_gpus(tempfile::tempdir().unwrap(), &models);
    let seen = gpus_of_both_replicas(&p, &events_dir).await;
    let url = format!("{}/v1/chat/completions", p.url);
    assert_eq!(
        seen,
        BTreeSet::from(["0".to_string(), "1".to_string()]),
        "one replica per GPU, each by its index in bus order"
    );
    assert_eq!(post_json(&url, &chat("own")).await.status, 200);
    assert_eq!(
        visible(&events_dir, "own"),
        ["7"],
        "the model's own choice stands"
    );
}

/// vLLM with a `memory:` size is told that share of its card, where it took 90% of it; one sized
/// from its weights alone (its parameters here) is left to take what it takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_is_told_the_share_of_the_card_it_was_charged() {
    let dir = tempfile::tempdir().unwrap();
    // vLLM by name: the fake engine behind a link
    let vllm = dir.path().join("vllm");
    std::os::unix::fs::symlink(CORRAL, &vllm).unwrap();
    let model = |id: &str, memory: &str| {
        format!(
            "  {id}:\n    cmd: {} fake-engine --port ${{PORT}} --events-file ${{env.DIR}}/{id}.events\n    env: [\"${{env.MARKER}}\"]\n{memory}",
            vllm.display()
        )
    };
    // sized by its parameters, a figure for the weights alone
    let models =
        model("sized", "    memory: 6GiB\n") + &model("unsized", "    memory: {params: 1B}\n");
    let (p, events_dir, _state) = corral_on_two_gpus(dir, &models);
    let url = format!("{}/v1/chat/completions", p.url);
    let args =
        |id: &str| read_events(&events_dir.join(format!("{id}.events")))[0]["args"].to_string();
    assert_eq!(post_json(&url, &chat("sized")).await.status, 200);
    let shown = visible(&events_dir, "sized");
    assert!(
        shown[0].parse::<u32>().is_ok(),
        "vLLM takes no UUID: {shown:?}"
    );
    assert!(
        args("sized").contains(r#""--gpu-memory-utilization","0.250""#),
        "{}",
        args("sized")
    );
    assert_eq!(post_json(&url, &chat("unsized")).await.status, 200);
    assert!(
        !args("unsized").contains("--gpu-memory-utilization"),
        "{}",
        args("unsized")
    );
}

/// A model no single GPU can hold is split over both in proportion to their room: each is charged
/// its share, the engine sees both GPUs, and llama-server is told the shares.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_too_big_for_one_gpu_is_split_over_two() {
    let dir = tempfile::tempdir().unwrap();
    // llama-server by name: the fake engine behind a link, so corral treats it as llama-server
    let llama = dir.path().join("llama-server");
    std::os::unix::fs::symlink(CORRAL, &llama).unwrap();
    let models = format!(
        "  big:\n    cmd: {} fake-engine --port ${{PORT}} --events-file ${{env.DIR}}/big.events\n    env: [\"${{env.MARKER}}\"]\n    memory: 30GiB\n",
        llama.display()
    );
    let (p, events_dir, _state) = corral_on_two_gpus(dir, &models);
    let url = format!("{}/v1/chat/completions", p.url);
    assert_eq!(post_json(&url, &chat("big")).await.status, 200);
    assert_eq!(visible(&events_dir, "big"), ["0,1"]);
    let spawned = read_events(&events_dir.join("big.events"));
    let args = spawned[0]["args"].to_string();
    assert!(
        args.contains(r#""--tensor-split","15360,15360","--split-mode","layer""#),
        "{args}"
    );
    assert_15_gib_on_each_gpu(&p.url).await;
    let metrics = get(&format!("{}/metrics", p.url)).await.text();
    for gpu in ["cuda0", "cuda1"] {
        let line = format!(
            "corral_device_memory_charged_bytes{{device=\"{gpu}\"}} {}",
            15u64 << 30
        );
        assert!(metrics.contains(&line), "{line} in:\n{metrics}");
    }
}

/// The devices `/running` shows an instance of `model` on, or `None` while it is not running.
async fn running_on(url: &str, model: &str) -> Option<Vec<String>> {
    let running = get(&format!("{url}/running")).await.json();
    let entry = running["running"]
        .as_array()?
        .iter()
        .find(|r| r["model"] == model)?
        .clone();
    Some(
        entry["devices"]
            .as_array()?
            .iter()
            .map(|d| d["device"].as_str().unwrap_or("").to_string())
            .collect(),
    )
}

/// Polls `check` until it holds, for at most 15 s.
async fn until<F: std::future::Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while !check().await {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Says that this test's own process uses `mib` on each GPU given: it is no engine of corral's.
fn outside_use(dir: &std::path::Path, gpus: &[(&str, u64)]) {
    let rows: String = gpus
        .iter()
        .map(|(uuid, mib)| format!("{uuid}, {}, {mib}\n", std::process::id()))
        .collect();
    std::fs::write(dir.join(COMPUTE_APPS), rows).unwrap();
}

/// `/running` shows the one instance charged 15 GiB on each GPU.
async fn assert_15_gib_on_each_gpu(url: &str) {
    let running = get(&format!("{url}/running")).await.json();
    assert_eq!(
        running["running"][0]["devices"],
        serde_json::json!([{"device": "cuda0", "bytes": 15u64 << 30}, {"device": "cuda1", "bytes": 15u64 << 30}]),
        "{running}"
    );
}

/// Waits until corral has read that other programs use `gib` GiB on `device`.
async fn until_used_by_others(url: &str, device: &str, gib: u64) {
    let line = format!(
        "corral_device_memory_used_by_others_bytes{{device=\"{device}\"}} {}",
        gib << 30
    );
    until("the other programs' use read", || async {
        get(&format!("{url}/metrics")).await.text().contains(&line)
    })
    .await;
}

/// Model `big` (`memory: 30GiB`), run by the fake engine behind a link named `vllm` in `dir`, so
/// corral takes it for vLLM; `env` adds to its environment (YAML list items after the marker).
fn big_vllm_model(dir: &std::path::Path, env: &str) -> String {
    let vllm = dir.join("vllm");
    std::os::unix::fs::symlink(CORRAL, &vllm).unwrap();
    format!(
        "  big:\n    cmd: {} fake-engine --port ${{PORT}} --events-file ${{env.DIR}}/big.events\n    env: [\"${{env.MARKER}}\"{env}]\n    memory: 30GiB\n",
        vllm.display()
    )
}

const GPU0: &str = "GPU-aaaa-0000";
const GPU1: &str = "GPU-bbbb-1111";

/// Another program taking 20 GiB on the GPU that holds an idle model: corral stops the model
/// (reason memory), reports the outside use, and the next model starts on the other GPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_other_programs_take_evicts_an_idle_model() {
    let models = format!(
        "{}{}",
        fake_model("a", "", "memory: 12GiB"),
        fake_model("b", "", "memory: 12GiB")
    );
    let (p, dir, _state) = corral_on_two_gpus(tempfile::tempdir().unwrap(), &models);
    let url = format!("{}/v1/chat/completions", p.url);
    assert_eq!(post_json(&url, &chat("a")).await.status, 200);
    assert_eq!(running_on(&p.url, "a").await.unwrap(), ["cuda0"]);
    outside_use(&dir, &[(GPU0, 20 * 1024)]);
    until("a stopped for the outside use", || async {
        running_on(&p.url, "a").await.is_none()
    })
    .await;
    let metrics = get(&format!("{}/metrics", p.url)).await.text();
    let line = format!(
        "corral_device_memory_used_by_others_bytes{{device=\"cuda0\"}} {}",
        20u64 << 30
    );
    assert!(metrics.contains(&line), "{line} in:\n{metrics}");
    assert!(
        metrics.contains(r#"reason="memory"} 1"#),
        "a stop for memory in:\n{metrics}"
    );
    assert_eq!(post_json(&url, &chat("b")).await.status, 200);
    assert_eq!(running_on(&p.url, "b").await.unwrap(), ["cuda1"]);
}

/// Other programs hold 20 GiB of each 24 GiB GPU before corral starts, and nvidia-smi takes a
/// second to say so: the first request for a 10 GiB model waits for that reading and is refused
/// naming the use, as every later one is, instead of starting the model on memory that is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_placement_waits_for_the_first_reading() {
    let dir = tempfile::tempdir().unwrap();
    outside_use(dir.path(), &[(GPU0, 20 * 1024), (GPU1, 20 * 1024)]);
    let smi = fake_nvidia_smi_reading_in(dir.path(), "1");
    let models = fake_model("b", "", "memory: 10GiB\nqueueTimeout: 1");
    let (p, _dir, _state) =
        spawn_corral_on_auto_devices(dir, &models, &[("CORRAL_NVIDIA_SMI", smi.as_str())]);
    let url = format!("{}/v1/chat/completions", p.url);
    for _ in 0..2 {
        let refused = post_json(&url, &chat("b")).await;
        assert_eq!(refused.status, 503, "{}", refused.text());
        assert!(
            refused
                .text()
                .contains("other programs use 20.00 GiB on cuda0"),
            "{}",
            refused.text()
        );
        assert!(running_on(&p.url, "b").await.is_none(), "b never started");
    }
}

/// A model serving a request is never stopped for other programs' use, however much they take; a
/// start that cannot fit waits its `queueTimeout` for that use to go, then is refused naming it;
/// once idle, the model is stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_other_programs_take_never_stops_a_busy_model() {
    let models = format!(
        "{}{}",
        fake_model("slow", "--response-delay-ms 6000", "memory: 12GiB"),
        fake_model("b", "", "memory: 12GiB\nqueueTimeout: 1")
    );
    let (p, dir, _state) = corral_on_two_gpus(tempfile::tempdir().unwrap(), &models);
    let url = format!("{}/v1/chat/completions", p.url);
    let request = tokio::spawn({
        let url = url.clone();
        async move { post_json(&url, &chat("slow")).await.status }
    });
    until("slow serving", || async {
        let running = get(&format!("{}/running", p.url)).await.json();
        running["running"][0]["inFlight"] == 1 && running["running"][0]["state"] == "ready"
    })
    .await;
    outside_use(&dir, &[(GPU0, 20 * 1024), (GPU1, 20 * 1024)]);
    until_used_by_others(&p.url, "cuda1", 20).await;
    let asked = std::time::Instant::now();
    let refused = post_json(&url, &chat("b")).await;
    assert!(
        asked.elapsed() >= std::time::Duration::from_secs(1),
        "waited for the outside use to go"
    );
    assert_eq!(refused.status, 503);
    assert!(
        refused.text().contains("insufficient_memory")
            && refused
                .text()
                .contains("other programs use 20.00 GiB on cuda0"),
        "{}",
        refused.text()
    );
    assert!(
        running_on(&p.url, "slow").await.is_some(),
        "still running while busy"
    );
    assert_eq!(request.await.unwrap(), 200);
    until("slow stopped once idle", || async {
        running_on(&p.url, "slow").await.is_none()
    })
    .await;
}

/// An engine that reports allocating more on its GPU than it was charged: the ledger takes its
/// report device by device, the overrun is counted, and the idle model it crowds out is stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_takes_more_than_its_charge_crowds_out_idle_models() {
    let report = "--buffer-report --report-device CUDA0 --report-model-mib 15000 --report-kv-mib 500 --report-compute-mib 200";
    let models = format!(
        "{}{}",
        fake_model("a", "", "memory: 12GiB"),
        fake_model("b", report, "memory: {bytes: 4GiB, devices: [cuda0]}")
    );
    let (p, _dir, _state) = corral_on_two_gpus(tempfile::tempdir().unwrap(), &models);
    let url = format!("{}/v1/chat/completions", p.url);
    assert_eq!(post_json(&url, &chat("a")).await.status, 200);
    assert_eq!(running_on(&p.url, "a").await.unwrap(), ["cuda0"]);
    assert_eq!(post_json(&url, &chat("b")).await.status, 200);
    // the engine's report is read from its log, which may come after it answers
    let reported = serde_json::json!([{"device": "cuda0", "bytes": 15700u64 << 20}]);
    until("b charged what its engine reported", || async {
        let running = get(&format!("{}/running", p.url)).await.json();
        let entries = running["running"].as_array().cloned().unwrap_or_default();
        entries
            .iter()
            .any(|r| r["model"] == "b" && r["devices"] == reported)
    })
    .await;
    let overrun = r#"corral_device_overrun_total{device="cuda0"} 1"#;
    until("the overrun counted", || async {
        get(&format!("{}/metrics", p.url))
            .await
            .text()
            .contains(overrun)
    })
    .await;
    until("a stopped to make room for b's overrun", || async {
        running_on(&p.url, "a").await.is_none()
    })
    .await;
}

/// `placement: pack` puts a pool's replicas on the same GPU while it has room, keeping the other
/// one whole for a big model; the default spreads them (the first test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placement_pack_keeps_a_gpu_whole() {
    let models = fake_model(
        "chat",
        "",
        "replicas: 2\nstartReplicas: all\nmemory: 4GiB\nplacement: pack",
    );
    let (p, events_dir, _state) = corral_on_two_gpus(tempfile::tempdir().unwrap(), &models);
    let seen = gpus_of_both_replicas(&p, &events_dir).await;
    assert_eq!(seen.len(), 1, "both on one GPU: {seen:?}");
}

/// vLLM splits a model in equal shares (tensor parallelism), so with less room on one GPU (another
/// program takes 4 GiB there) it is charged the same on both, and told the share each rank takes:
/// a split in proportion to the room (16.4 and 13.6 GiB) would tell it 0.685 of each card, more
/// than the second can give.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_split_over_two_gpus_takes_equal_shares() {
    let dir = tempfile::tempdir().unwrap();
    outside_use(dir.path(), &[(GPU1, 4 * 1024)]);
    let models = big_vllm_model(dir.path(), "");
    let (p, events_dir, _state) = corral_on_two_gpus(dir, &models);
    until_used_by_others(&p.url, "cuda1", 4).await;
    let url = format!("{}/v1/chat/completions", p.url);
    let answer = post_json(&url, &chat("big")).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let args = read_events(&events_dir.join("big.events"))[0]["args"].to_string();
    assert!(
        args.contains(r#""--tensor-parallel-size","2""#)
            && args.contains(r#""--gpu-memory-utilization","0.625""#),
        "{args}"
    );
    assert_15_gib_on_each_gpu(&p.url).await;
}

/// A model whose env chooses its GPU runs on that one: it is told no split and no share of the
/// devices the ledger would have given it, which it cannot see.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_chooses_its_gpu_is_told_no_split_of_others() {
    let dir = tempfile::tempdir().unwrap();
    let models = big_vllm_model(dir.path(), ", \"CUDA_VISIBLE_DEVICES=1\"");
    let (p, events_dir, _state) = corral_on_two_gpus(dir, &models);
    let url = format!("{}/v1/chat/completions", p.url);
    let answer = post_json(&url, &chat("big")).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let args = read_events(&events_dir.join("big.events"))[0]["args"].to_string();
    assert!(
        !args.contains("--tensor-parallel-size") && !args.contains("--gpu-memory-utilization"),
        "{args}"
    );
    assert_eq!(visible(&events_dir, "big"), ["1"], "its own choice stands");
}

/// An asleep engine is charged what the GPUs are read to show it still holding, not the fixed
/// residue: read to hold 6 GiB beside the model that took its card, it leaves the card holding
/// more than it can, and is stopped for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asleep_engine_is_charged_what_the_gpu_shows_it_holding() {
    let dir = tempfile::tempdir().unwrap();
    let sleeper = "  a:\n    cmd: ${env.ENGINE} --imitate vllm serve /m --enable-sleep-mode --port ${PORT} --events-file ${env.DIR}/a.events\n    env: [\"${env.MARKER}\", VLLM_SERVER_DEV_MODE=1]\n    memory: 20GiB\n    sleepEndpoints: [{endpoint: /sleep?level=1}]\n    wakeEndpoints: [{endpoint: /wake_up}]\n";
    let models = format!(
        "{sleeper}{}{}",
        fake_model("b", "", "memory: 20GiB"),
        fake_model("c", "", "memory: 20GiB")
    );
    let (p, events, _state) = corral_on_two_gpus(dir, &models);
    let url = format!("{}/v1/chat/completions", p.url);
    for model in ["a", "b", "c"] {
        let answer = post_json(&url, &chat(model)).await;
        assert_eq!(answer.status, 200, "{model}: {}", answer.text());
    }
    let a_events = || read_events(&events.join("a.events"));
    assert!(
        a_events().iter().any(|e| e["event"] == "sleep_call"),
        "a slept to make room for c"
    );
    assert!(!a_events().iter().any(|e| e["event"] == "sigterm"));
    let pid = a_events()
        .iter()
        .find(|e| e["event"] == "spawned")
        .and_then(|e| e["pid"].as_u64())
        .unwrap();
    let rows = format!("GPU-aaaa-0000, {pid}, 6144\n");
    std::fs::write(events.join(COMPUTE_APPS), rows).unwrap();
    eventually(
        std::time::Duration::from_secs(15),
        "the sleeper stopped once read to hold 6 GiB",
        || a_events().iter().any(|e| e["event"] == "sigterm"),
    )
    .await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let running = get(&format!("{}/running", p.url)).await.json();
        let models: BTreeSet<String> = running["running"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["model"].as_str().unwrap().to_string())
            .collect();
        if models == BTreeSet::from(["b".into(), "c".into()]) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{running}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
