//! `devices: auto` on each vendor's tool, with no NVML library (none on the machines that build
//! corral; naming an nvidia-smi turns NVML off anyway): a fake nvidia-smi still gives the NVIDIA
//! GPUs, and wins over rocm-smi; without it a fake rocm-smi gives AMD GPUs, pinned through
//! `HIP_VISIBLE_DEVICES`/`ROCR_VISIBLE_DEVICES`, whose processes' memory is read back every
//! `deviceRefresh` like nvidia-smi's. An NVIDIA GPU is shown to its engine by index, counted in
//! bus order as nvidia-smi counts (vLLM takes no UUID in `CUDA_VISIBLE_DEVICES`), unless the model
//! counts in another order or the device is a MIG instance, which keep the UUID.

mod support;

use std::path::Path;
use std::time::Duration;

use support::process::*;
use support::*;

const GIB: u64 = 1 << 30;

/// What the fake rocm-smi answers `--showpids --json` from; `{}` (no KFD process) when missing.
const PIDS: &str = "pids.json";
/// What it answers `--showpidgpus` from.
const PID_GPUS: &str = "pidgpus.txt";

/// A rocm-smi with two 24 GiB cards, printing JSON as rocm-smi prints it.
fn fake_rocm_smi(dir: &Path) -> String {
    let cards = r#"{"card0": {"VRAM Total Memory (B)": "25769803776", "VRAM Total Used Memory (B)": "10993664", "Unique ID": "0x18f68e602b8a790f"}, "card1": {"VRAM Total Memory (B)": "25769803776", "VRAM Total Used Memory (B)": "10993664", "Unique ID": "0x2a1b3c4d5e6f7081"}}"#;
    let (pids, pid_gpus) = (dir.join(PIDS), dir.join(PID_GPUS));
    let script = format!(
        "#!/bin/sh\ncase \"$*\" in\n*--showmeminfo*) echo '{cards}';;\n*--showpids*) cat '{}' 2>/dev/null || echo '{{}}';;\n*--showpidgpus*) cat '{}' 2>/dev/null;;\n*) exit 2;;\nesac\n",
        pids.display(),
        pid_gpus.display()
    );
    executable(&dir.join("rocm-smi"), &script)
}

/// An nvidia-smi with one 16 GiB GPU and no process.
fn fake_nvidia_smi(dir: &Path) -> String {
    let script = "#!/bin/sh\ncase \"$1\" in --query-compute-apps*) exit 0;; esac\nprintf '0, GPU-cccc-2222, 16384, NVIDIA L4\\n'\n";
    executable(&dir.join("nvidia-smi"), script)
}

/// Tools in a directory of their own, which the test keeps until corral is done.
fn tools() -> (tempfile::TempDir, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let rocm = fake_rocm_smi(dir.path());
    let nvidia = fake_nvidia_smi(dir.path());
    (dir, rocm, nvidia)
}

async fn metric(url: &str, line_start: &str) -> Option<u64> {
    let text = get(&format!("{url}/metrics")).await.text();
    text.lines()
        .find_map(|l| l.strip_prefix(line_start))
        .and_then(|v| v.trim().parse().ok())
}

fn spawned_env(events_dir: &Path, model: &str) -> Vec<serde_json::Value> {
    read_events(&events_dir.join(format!("{model}.events")))
        .into_iter()
        .filter(|e| e["event"] == "spawned")
        .map(|e| e["visible"].clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvidia_smi_is_still_read_and_wins_over_rocm_smi() {
    let (tools, rocm, nvidia) = tools();
    let env = [
        ("CORRAL_NVIDIA_SMI", nvidia.as_str()),
        ("CORRAL_ROCM_SMI", rocm.as_str()),
    ];
    let (p, events, _state) = spawn_corral_on_auto_devices(
        tempfile::tempdir().unwrap(),
        &fake_model("a", "", "memory: 4GiB"),
        &env,
    );
    let usable = 16 * GIB - 16 * GIB / 20;
    let cap = r#"corral_device_memory_capacity_bytes{device="cuda0"} "#;
    assert_eq!(metric(&p.url, cap).await, Some(usable));
    let rocm0 = r#"corral_device_memory_capacity_bytes{device="rocm0"} "#;
    assert_eq!(metric(&p.url, rocm0).await, None, "no AMD device");
    let url = format!("{}/v1/chat/completions", p.url);
    assert_eq!(post_json(&url, &chat("a")).await.status, 200);
    let seen = spawned_env(&events, "a");
    assert_eq!(seen[0]["CUDA_VISIBLE_DEVICES"], "0", "{seen:?}");
    assert_eq!(seen[0]["CUDA_DEVICE_ORDER"], "PCI_BUS_ID", "{seen:?}");
    drop(tools);
}

/// A model that has CUDA count its devices fastest first may number them otherwise than
/// nvidia-smi does: it is shown its GPU by UUID, and its order stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_counting_in_another_order_is_shown_its_gpu_by_uuid() {
    let (tools, _, nvidia) = tools();
    let env = [("CORRAL_NVIDIA_SMI", nvidia.as_str())];
    let model = "  ff:\n    cmd: ${env.ENGINE} --port ${PORT} --events-file ${env.DIR}/ff.events\n    env: [\"${env.MARKER}\", \"CUDA_DEVICE_ORDER=FASTEST_FIRST\"]\n    memory: 4GiB\n";
    let (p, events, _state) =
        spawn_corral_on_auto_devices(tempfile::tempdir().unwrap(), model, &env);
    let url = format!("{}/v1/chat/completions", p.url);
    assert_eq!(post_json(&url, &chat("ff")).await.status, 200);
    let seen = spawned_env(&events, "ff");
    assert_eq!(seen[0]["CUDA_VISIBLE_DEVICES"], "GPU-cccc-2222", "{seen:?}");
    assert_eq!(seen[0]["CUDA_DEVICE_ORDER"], "FASTEST_FIRST", "{seen:?}");
    drop(tools);
}

/// Devices the config lists are shown as written: a full GPU given its index by that index, a MIG
/// instance by its UUID, since an index would name the whole card it is carved from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_mig_instance_keeps_its_uuid_and_a_listed_gpu_is_shown_by_index() {
    let yaml = format!(
        "devices:\n  - {{name: mig0, capacity: 10GiB, vendor: nvidia, index: 0, uuid: MIG-aaaa-1111}}\n  - {{name: big, capacity: 24GiB, vendor: nvidia, index: 1, uuid: GPU-bbbb-2222}}\nmodels:\n{}{}",
        fake_model("small", "", "memory: {bytes: 4GiB, devices: [mig0]}"),
        fake_model("large", "", "memory: {bytes: 4GiB, devices: [big]}"),
    );
    let h = Harness::start(&yaml).await;
    let url = format!("{}/v1/chat/completions", h.url);
    for (model, shown) in [("small", "MIG-aaaa-1111"), ("large", "1")] {
        assert_eq!(post_json(&url, &chat(model)).await.status, 200);
        let seen = spawned_env(h.dir.path(), model);
        assert_eq!(seen[0]["CUDA_VISIBLE_DEVICES"], shown, "{model}: {seen:?}");
        assert_eq!(
            seen[0]["CUDA_DEVICE_ORDER"], "PCI_BUS_ID",
            "{model}: {seen:?}"
        );
    }
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rocm_smi_gives_amd_devices_pinned_by_index() {
    let (tools, rocm, _) = tools();
    let env = [
        ("CORRAL_NVIDIA_SMI", "/nonexistent/nvidia-smi"),
        ("CORRAL_ROCM_SMI", rocm.as_str()),
    ];
    let models = fake_model("chat", "", "replicas: 2\nstartReplicas: all\nmemory: 12GiB");
    let (p, events, _state) =
        spawn_corral_on_auto_devices(tempfile::tempdir().unwrap(), &models, &env);
    for gpu in ["rocm0", "rocm1"] {
        let cap = format!("corral_device_memory_capacity_bytes{{device=\"{gpu}\"}} ");
        assert_eq!(
            metric(&p.url, &cap).await,
            Some(24 * GIB - 24 * GIB / 20),
            "{gpu}"
        );
    }
    let url = format!("{}/v1/chat/completions", p.url);
    assert_eq!(post_json(&url, &chat("chat")).await.status, 200);
    eventually(Duration::from_secs(15), "both replicas started", || {
        spawned_env(&events, "chat").len() == 2
    })
    .await;
    let mut seen: Vec<(String, String)> = spawned_env(&events, "chat")
        .iter()
        .map(|v| {
            assert!(v.get("CUDA_VISIBLE_DEVICES").is_none(), "{v}");
            let var = |k: &str| v[k].as_str().unwrap_or("").to_string();
            (var("HIP_VISIBLE_DEVICES"), var("ROCR_VISIBLE_DEVICES"))
        })
        .collect();
    seen.sort();
    // ROCr shows each replica its one GPU, renumbered 0, which is the one HIP then picks
    assert_eq!(seen, [("0".into(), "0".into()), ("0".into(), "1".into())]);
    drop(tools);
}

/// The devices `/running` shows `model` on, or `None` while it is not running.
async fn running_on(url: &str, model: &str) -> Option<Vec<String>> {
    let running = get(&format!("{url}/running")).await.json();
    let entry = running["running"]
        .as_array()?
        .iter()
        .find(|r| r["model"] == model)?
        .clone();
    let devices = entry["devices"].as_array()?;
    Some(
        devices
            .iter()
            .map(|d| d["device"].as_str().unwrap_or("").to_string())
            .collect(),
    )
}

/// Another program (this test's own process, which is no engine) taking 20 GiB on the AMD GPU
/// that holds an idle model: corral stops the model, reports the use, and starts the next model
/// on the other GPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_other_programs_take_on_an_amd_gpu_evicts_an_idle_model() {
    let (tools, rocm, _) = tools();
    let env = [
        ("CORRAL_NVIDIA_SMI", "/nonexistent/nvidia-smi"),
        ("CORRAL_ROCM_SMI", rocm.as_str()),
    ];
    let models = format!(
        "{}{}",
        fake_model("a", "", "memory: 12GiB"),
        fake_model("b", "", "memory: 12GiB")
    );
    let (p, _events, _state) =
        spawn_corral_on_auto_devices(tempfile::tempdir().unwrap(), &models, &env);
    let url = format!("{}/v1/chat/completions", p.url);
    assert_eq!(post_json(&url, &chat("a")).await.status, 200);
    assert_eq!(running_on(&p.url, "a").await.unwrap(), ["rocm0"]);
    let me = std::process::id();
    let row = format!(
        r#"{{"system": {{"PID{me}": "trainer, 1, {}, 0, 0"}}}}"#,
        20 * GIB
    );
    std::fs::write(
        tools.path().join(PID_GPUS),
        format!("PID {me} is using 1 DRM device(s):\n0 \n"),
    )
    .unwrap();
    std::fs::write(tools.path().join(PIDS), row).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while running_on(&p.url, "a").await.is_some() {
        assert!(std::time::Instant::now() < deadline, "a was not stopped");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let used = r#"corral_device_memory_used_by_others_bytes{device="rocm0"} "#;
    assert_eq!(metric(&p.url, used).await, Some(20 * GIB));
    let other = r#"corral_device_memory_used_by_others_bytes{device="rocm1"} "#;
    assert_eq!(metric(&p.url, other).await, Some(0));
    assert_eq!(post_json(&url, &chat("b")).await.status, 200);
    assert_eq!(running_on(&p.url, "b").await.unwrap(), ["rocm1"]);
}

/// With no tool at all, `corral check` says that placing by memory is off.
#[test]
fn no_gpu_tool_turns_placing_by_memory_off() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.yaml");
    std::fs::write(
        &config,
        "devices: auto\nmodels:\n  m:\n    cmd: srv --port ${PORT}\n",
    )
    .unwrap();
    let out = std::process::Command::new(CORRAL)
        .args(["check", "--config"])
        .arg(&config)
        .env("CORRAL_NVIDIA_SMI", "/nonexistent/nvidia-smi")
        .env("CORRAL_ROCM_SMI", "/nonexistent/rocm-smi")
        .output()
        .unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("devices: auto found no GPU"), "{stderr}");
}
