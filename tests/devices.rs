//! Placement the engines obey: each instance starts with exactly the devices the ledger charged it
//! on, replicas of a pool land on different GPUs, and a model that picks its own devices keeps them.
//! The GPUs are a fake `nvidia-smi` (`CORRAL_NVIDIA_SMI`) listing two 24 GiB cards.

mod support;

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;

use support::process::*;
use support::*;

fn fake_nvidia_smi(dir: &std::path::Path) -> String {
    let path = dir.join("nvidia-smi");
    std::fs::write(
        &path,
        "#!/bin/sh\nprintf '0, GPU-aaaa-0000, 24576\\n1, GPU-bbbb-1111, 24576\\n'\n",
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
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
    let dir = tempfile::tempdir().unwrap();
    let smi = fake_nvidia_smi(dir.path());
    let config = dir.path().join("config.yaml");
    let yaml = format!(
        "startPort: {}\ndevices: auto\nmodels:\n{}  own:\n    cmd: ${{env.ENGINE}} --port ${{PORT}} --events-file ${{env.DIR}}/own.events\n    env: [\"${{env.MARKER}}\", \"CUDA_VISIBLE_DEVICES=7\"]\n    memory: 4GiB\n",
        free_port_range(8),
        fake_model("chat", "", "replicas: 2\nstartReplicas: all\nmemory: 4GiB"),
    );
    std::fs::write(&config, yaml).unwrap();
    let state = tempfile::tempdir().unwrap();
    let events_dir = dir.path().to_path_buf();
    let p = spawn_corral_env(
        dir,
        &config,
        state.path(),
        &[],
        &[("CORRAL_NVIDIA_SMI", &smi)],
    );
    let url = format!("{}/v1/chat/completions", p.url);
    assert_eq!(post_json(&url, &chat("chat")).await.status, 200);
    eventually(
        std::time::Duration::from_secs(15),
        "both replicas started",
        || visible(&events_dir, "chat").len() == 2,
    )
    .await;
    let seen: BTreeSet<String> = visible(&events_dir, "chat").into_iter().collect();
    assert_eq!(
        seen,
        BTreeSet::from(["GPU-aaaa-0000".to_string(), "GPU-bbbb-1111".to_string()]),
        "one replica per GPU, each by its UUID"
    );
    assert_eq!(post_json(&url, &chat("own")).await.status, 200);
    assert_eq!(
        visible(&events_dir, "own"),
        ["7"],
        "the model's own choice stands"
    );
}
