//! Telling an engine which devices are its own: the ledger charges an instance on some devices, and
//! the engine starts with exactly those visible, through the variable its GPU runtime reads
//! (`CUDA_VISIBLE_DEVICES`, `HIP_VISIBLE_DEVICES`/`ROCR_VISIBLE_DEVICES`, `ONEAPI_DEVICE_SELECTOR`,
//! `GGML_VK_VISIBLE_DEVICES`). Without it, llama-server spreads over every GPU it sees and vLLM
//! takes GPU 0, whatever the ledger decided. A user who selects devices in the model's `env` or
//! command keeps that choice.

use std::collections::BTreeMap;

use crate::config::{Device, Vendor};

/// Every variable that selects devices, by vendor.
fn variables(vendor: Vendor) -> &'static [&'static str] {
    match vendor {
        Vendor::Nvidia => &["CUDA_VISIBLE_DEVICES"],
        Vendor::Amd => &["HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"],
        Vendor::Intel => &["ONEAPI_DEVICE_SELECTOR"],
        Vendor::Vulkan => &["GGML_VK_VISIBLE_DEVICES"],
        Vendor::None => &[],
    }
}

const ALL: [Vendor; 4] = [Vendor::Nvidia, Vendor::Amd, Vendor::Intel, Vendor::Vulkan];

/// True when the model already chooses its devices: a selection variable in its `env`, or in its
/// command (`env CUDA_VISIBLE_DEVICES=1 ...`, a shell wrapper), or llama-server's `--device`.
fn user_selects(env: &[(String, String)], argv: &[String]) -> bool {
    let named = |text: &str| {
        ALL.iter()
            .flat_map(|v| variables(*v))
            .any(|var| text.contains(var))
    };
    env.iter().any(|(k, _)| named(k))
        || argv
            .iter()
            .any(|a| named(a) || a == "--device" || a == "-dev" || a.starts_with("--device="))
}

/// The variables that show an engine exactly `placed` (indices into `devices`).
pub fn visible_devices(
    devices: &[Device],
    placed: &[usize],
    env: &[(String, String)],
    argv: &[String],
) -> Vec<(String, String)> {
    if user_selects(env, argv) {
        return Vec::new();
    }
    let mut by_vendor: BTreeMap<Vendor, Vec<&str>> = BTreeMap::new();
    for d in placed.iter().filter_map(|i| devices.get(*i)) {
        if let (Some(id), true) = (d.select_as.as_deref(), d.vendor != Vendor::None) {
            by_vendor.entry(d.vendor).or_default().push(id);
        }
    }
    let mut out = Vec::new();
    for (vendor, ids) in by_vendor {
        let list = ids.join(",");
        let value = match vendor {
            Vendor::Intel => format!("level_zero:{list}"),
            _ => list,
        };
        for var in variables(vendor) {
            out.push((var.to_string(), value.clone()));
        }
    }
    out
}

/// What a command split over several devices is told: llama-server the share of each
/// (`--tensor-split` in the order the devices are made visible, by layer), vLLM and SGLang how many
/// ways to split (tensor parallelism). Nothing when the command already says, or for one device.
pub fn split_args(argv: &[String], charges: &[(usize, u64)]) -> Vec<String> {
    if charges.len() < 2 {
        return Vec::new();
    }
    let has = |flags: &[&str]| {
        argv.iter().any(|a| {
            flags
                .iter()
                .any(|f| a == f || a.starts_with(&format!("{f}=")))
        })
    };
    let program = |name: &str| {
        argv.iter()
            .take(3)
            .any(|a| a.rsplit('/').next().is_some_and(|n| n.starts_with(name)))
    };
    if program("llama-server") {
        if has(&["--tensor-split", "-ts"]) {
            return Vec::new();
        }
        let mib: Vec<String> = charges
            .iter()
            .map(|(_, b)| (b >> 20).max(1).to_string())
            .collect();
        let mut out = vec!["--tensor-split".to_string(), mib.join(",")];
        if !has(&["--split-mode", "-sm"]) {
            out.extend(["--split-mode".to_string(), "layer".to_string()]);
        }
        return out;
    }
    let n = charges.len().to_string();
    if program("vllm") && !has(&["--tensor-parallel-size", "-tp"]) {
        return vec!["--tensor-parallel-size".into(), n];
    }
    if argv.iter().any(|a| a.contains("sglang")) && !has(&["--tp-size", "--tp"]) {
        return vec!["--tp-size".into(), n];
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(name: &str, vendor: Vendor, id: &str) -> Device {
        Device {
            name: name.into(),
            capacity: 1 << 34,
            reserve: 0,
            vendor,
            select_as: Some(id.into()),
        }
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn each_vendor_gets_its_variable_for_the_devices_placed_on() {
        let devices = [
            device("cuda0", Vendor::Nvidia, "GPU-aaa"),
            device("cuda1", Vendor::Nvidia, "GPU-bbb"),
            device("rocm0", Vendor::Amd, "0"),
            device("xpu0", Vendor::Intel, "0"),
            device("vk1", Vendor::Vulkan, "1"),
        ];
        let argv = strings(&["llama-server"]);
        let pairs = |placed: &[usize]| visible_devices(&devices, placed, &[], &argv);
        assert_eq!(
            pairs(&[1]),
            [("CUDA_VISIBLE_DEVICES".into(), "GPU-bbb".into())]
        );
        assert_eq!(
            pairs(&[0, 1]),
            [("CUDA_VISIBLE_DEVICES".into(), "GPU-aaa,GPU-bbb".into())]
        );
        assert_eq!(
            pairs(&[2]),
            [
                ("HIP_VISIBLE_DEVICES".into(), "0".into()),
                ("ROCR_VISIBLE_DEVICES".into(), "0".into())
            ]
        );
        assert_eq!(
            pairs(&[3]),
            [("ONEAPI_DEVICE_SELECTOR".into(), "level_zero:0".into())]
        );
        assert_eq!(
            pairs(&[4]),
            [("GGML_VK_VISIBLE_DEVICES".into(), "1".into())]
        );
    }

    #[test]
    fn the_users_own_selection_wins() {
        let devices = [device("cuda0", Vendor::Nvidia, "0")];
        let env = [("CUDA_VISIBLE_DEVICES".to_string(), "3".to_string())];
        let argv = strings(&["llama-server"]);
        assert!(visible_devices(&devices, &[0], &env, &argv).is_empty());
        for argv in [
            strings(&["sh", "-c", "CUDA_VISIBLE_DEVICES=2 llama-server"]),
            strings(&["llama-server", "--device", "CUDA1"]),
        ] {
            assert!(
                visible_devices(&devices, &[0], &[], &argv).is_empty(),
                "{argv:?}"
            );
        }
    }

    #[test]
    fn a_split_tells_each_engine_its_shares_or_its_ways() {
        const GIB: u64 = 1 << 30;
        let split = [(0, 18 * GIB), (1, 12 * GIB)];
        let llama = strings(&["/opt/llama-server", "-m", "m.gguf"]);
        assert_eq!(
            split_args(&llama, &split),
            strings(&["--tensor-split", "18432,12288", "--split-mode", "layer"])
        );
        let own = strings(&["llama-server", "-ts", "1,1"]);
        assert!(
            split_args(&own, &split).is_empty(),
            "the command's own split stands"
        );
        let vllm = strings(&["vllm", "serve", "org/m"]);
        assert_eq!(
            split_args(&vllm, &split),
            strings(&["--tensor-parallel-size", "2"])
        );
        let sglang = strings(&["python", "-m", "sglang.launch_server"]);
        assert_eq!(split_args(&sglang, &split), strings(&["--tp-size", "2"]));
        assert!(
            split_args(&llama, &split[..1]).is_empty(),
            "one device: nothing to split"
        );
    }

    #[test]
    fn devices_that_are_only_budgeted_are_not_pinned() {
        let devices = [device("ram", Vendor::None, "0")];
        assert!(visible_devices(&devices, &[0], &[], &strings(&["srv"])).is_empty());
    }
}
