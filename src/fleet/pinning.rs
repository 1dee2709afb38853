//! Telling an engine which devices are its own: the ledger charges an instance on some devices, and
//! the engine starts with exactly those visible, through the variable its GPU runtime reads
//! (`CUDA_VISIBLE_DEVICES`, `HIP_VISIBLE_DEVICES`/`ROCR_VISIBLE_DEVICES`, `ONEAPI_DEVICE_SELECTOR`,
//! `GGML_VK_VISIBLE_DEVICES`). Without it, llama-server spreads over every GPU it sees and vLLM
//! takes GPU 0, whatever the ledger decided. A user who selects devices in the model's `env` or
//! command keeps that choice.
//!
//! NVIDIA GPUs are shown by their index, with `CUDA_DEVICE_ORDER=PCI_BUS_ID` so that CUDA counts
//! them as nvidia-smi and NVML do: vLLM (through 0.20 at least) reads every entry of
//! `CUDA_VISIBLE_DEVICES` as a number and fails to start on a UUID. In bus order an index names
//! the same card from boot to boot. The UUID stays where an index would be wrong: a MIG instance,
//! and an engine told to count devices in another order.

use std::collections::BTreeMap;

use super::ledger::Sharding;
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
/// command (`env CUDA_VISIBLE_DEVICES=1 ...`, a shell wrapper), or llama-server's `--device`
/// (other engines' `--device`, such as SGLang's `--device cuda`, names a kind, not devices).
pub fn user_selects(env: &[(String, String)], argv: &[String]) -> bool {
    let named = |text: &str| {
        ALL.iter()
            .flat_map(|v| variables(*v))
            .any(|var| text.contains(var))
    };
    let device_flag = |a: &String| a == "--device" || a == "-dev" || a.starts_with("--device=");
    env.iter().any(|(k, _)| named(k))
        || argv.iter().any(|a| named(a))
        || (names_llama_server(argv) && argv.iter().any(device_flag))
}

/// True when any word of the command is llama-server (behind `env`, `nice`, `taskset`, ...).
fn names_llama_server(argv: &[String]) -> bool {
    argv.iter().any(|a| is_program(a, "llama-server"))
}

/// True when the command runs `name` (a program among its first words).
fn runs(argv: &[String], name: &str) -> bool {
    let launched = |i: usize| i == 0 || launches(argv, i - 1);
    (argv.iter().take(3).enumerate()).any(|(i, a)| is_program(a, name) && launched(i))
}

/// True when the word at `i` starts the program the next word names: a launcher (`uv run`,
/// `env`, `nohup`, a Python interpreter) or Python's `-m`. Not any flag: llama-server's `-m`
/// takes a model path, which may contain an engine's name.
fn launches(argv: &[String], i: usize) -> bool {
    let name = |w: &str| w.rsplit('/').next().unwrap_or(w).to_string();
    let word = name(&argv[i]);
    let python = name(&argv[0]).starts_with("python");
    let launchers = [
        "uv", "uvx", "run", "env", "nohup", "exec", "nice", "taskset", "numactl",
    ];
    (word == "-m" && python)
        || word.starts_with("python")
        || launchers.contains(&word.as_str())
        // `env VAR=value program`
        || (argv[i].contains('=') && !argv[i].starts_with('-'))
}

/// True when `word` is the program `name`, by its file name.
fn is_program(word: &str, name: &str) -> bool {
    word.rsplit('/').next().is_some_and(|n| n.starts_with(name))
}

/// The variable that tells CUDA how to number devices, and the value that numbers them as
/// nvidia-smi does.
const ORDER: &str = "CUDA_DEVICE_ORDER";
const BUS_ORDER: &str = "PCI_BUS_ID";

/// True when the engine's CUDA will number devices in bus order, as nvidia-smi does: corral says
/// so unless the model's `env` names an order, and a command may set one itself (`env
/// CUDA_DEVICE_ORDER=FASTEST_FIRST vllm ...`, a shell wrapper), over corral's.
fn counts_in_bus_order(env: &[(String, String)], argv: &[String]) -> bool {
    let own = env.iter().rev().find(|(k, _)| k == ORDER);
    let bus = format!("{ORDER}={BUS_ORDER}");
    own.is_none_or(|(_, v)| v.trim() == BUS_ORDER)
        && !argv.iter().any(|a| a.contains(ORDER) && !a.contains(&bus))
}

/// What `CUDA_VISIBLE_DEVICES` names an NVIDIA device by: its index when CUDA counts in bus order
/// (vLLM refuses a UUID there, and in that order the index is nvidia-smi's, so the same card),
/// else `id`, its UUID where known. A MIG instance (`MIG-...`) keeps its UUID: an index would name
/// the whole GPU it is carved from.
fn cuda_name(id: &str, index: Option<u32>, bus_order: bool) -> String {
    match index {
        Some(i) if bus_order && !id.starts_with("MIG-") => i.to_string(),
        _ => id.to_string(),
    }
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
    let bus_order = counts_in_bus_order(env, argv);
    let mut by_vendor: BTreeMap<Vendor, Vec<String>> = BTreeMap::new();
    for d in placed.iter().filter_map(|i| devices.get(*i)) {
        if let (Some(id), true) = (d.select_as.as_deref(), d.vendor != Vendor::None) {
            let shown = match d.vendor {
                Vendor::Nvidia => cuda_name(id, d.index, bus_order),
                _ => id.to_string(),
            };
            by_vendor.entry(d.vendor).or_default().push(shown);
        }
    }
    let mut out = Vec::new();
    let set = |out: &mut Vec<(String, String)>, var: &str, value: String| {
        out.push((var.to_string(), value));
    };
    for (vendor, ids) in by_vendor {
        let list = ids.join(",");
        match vendor {
            Vendor::Intel => set(
                &mut out,
                "ONEAPI_DEVICE_SELECTOR",
                format!("level_zero:{list}"),
            ),
            // ROCr hides the rest first and numbers what is left from 0, and HIP picks among those
            Vendor::Amd => {
                let renumbered: Vec<String> = (0..ids.len()).map(|i| i.to_string()).collect();
                set(&mut out, "HIP_VISIBLE_DEVICES", renumbered.join(","));
                set(&mut out, "ROCR_VISIBLE_DEVICES", list);
            }
            // CUDA numbers devices fastest first unless told otherwise; discovery and the
            // config number them as nvidia-smi does, in bus order
            Vendor::Nvidia => {
                set(&mut out, "CUDA_VISIBLE_DEVICES", list);
                if !env.iter().any(|(k, _)| k == ORDER) {
                    set(&mut out, ORDER, BUS_ORDER.into());
                }
            }
            _ => {
                for var in variables(vendor) {
                    set(&mut out, var, list.clone());
                }
            }
        }
    }
    out
}

/// How the engine `argv` runs splits a model over several devices: vLLM, SGLang and TGI by
/// tensor parallelism, anything else (llama-server) by layer.
pub fn sharding(argv: &[String]) -> Sharding {
    match tensor_engine(argv) {
        Some(_) => Sharding::Tensors,
        None => Sharding::Layers,
    }
}

/// The PyTorch engines, which split a model by tensor parallelism.
#[derive(Clone, Copy)]
enum TensorEngine {
    Vllm,
    Sglang,
    Tgi,
}

/// The PyTorch engine `argv` runs, known by the program or module run, not by any argument (a
/// model path or alias may contain an engine's name): `vllm serve`, `python -m
/// sglang.launch_server`, `text-generation-launcher`.
fn tensor_engine(argv: &[String]) -> Option<TensorEngine> {
    [
        ("vllm", TensorEngine::Vllm),
        ("sglang", TensorEngine::Sglang),
        ("text-generation-launcher", TensorEngine::Tgi),
    ]
    .into_iter()
    .find_map(|(name, engine)| runs(argv, name).then_some(engine))
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
    if runs(argv, "llama-server") {
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
    // TGI counts its shards from CUDA_VISIBLE_DEVICES alone, which AMD pinning does not set
    let (flag, own): (&str, &[&str]) = match tensor_engine(argv) {
        Some(TensorEngine::Vllm) => ("--tensor-parallel-size", &["--tensor-parallel-size", "-tp"]),
        Some(TensorEngine::Sglang) => (
            "--tp-size",
            &["--tp-size", "--tp", "--tensor-parallel-size"],
        ),
        Some(TensorEngine::Tgi) => ("--num-shard", &["--num-shard", "--sharded"]),
        None => return Vec::new(),
    };
    match has(own) {
        true => Vec::new(),
        false => vec![flag.into(), charges.len().to_string()],
    }
}

/// What a PyTorch engine is told of its share of each device it runs on: vLLM, SGLang and TGI
/// otherwise take most of the card (vLLM 90%) whatever the ledger charged them, and fail to start
/// beside anything else. vLLM's share is its own budget: the largest charge's part of its device
/// (tensor parallelism takes the same on each). SGLang's and TGI's is a ceiling on the whole
/// card's use, what others hold included (each sizes its cache as the free memory less the rest
/// of the card), so theirs is the charge plus `beside[device]`, what other instances and other
/// programs hold there. Rounded down; nothing for other engines, unplaced instances, or a command
/// that says already.
pub fn memory_share_args(
    argv: &[String],
    charges: &[(usize, u64)],
    devices: &[Device],
    beside: &[u64],
) -> Vec<String> {
    let (flag, whole_card) = match tensor_engine(argv) {
        Some(TensorEngine::Vllm) => ("--gpu-memory-utilization", false),
        Some(TensorEngine::Sglang) => ("--mem-fraction-static", true),
        Some(TensorEngine::Tgi) => ("--cuda-memory-fraction", true),
        None => return Vec::new(),
    };
    if argv
        .iter()
        .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
    {
        return Vec::new();
    }
    let share = charges
        .iter()
        .filter_map(|(i, bytes)| {
            let capacity = devices.get(*i)?.capacity;
            let others = if whole_card {
                beside.get(*i).copied().unwrap_or(0)
            } else {
                0
            };
            (capacity > 0).then(|| bytes.saturating_add(others) as f64 / capacity as f64)
        })
        .fold(0.0_f64, f64::max);
    if share <= 0.0 {
        return Vec::new();
    }
    let thousandths = (share * 1000.0).floor().clamp(1.0, 999.0);
    vec![flag.to_string(), format!("{:.3}", thousandths / 1000.0)]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device known by `id`, whose index is the number its name ends with.
    fn device(name: &str, vendor: Vendor, id: &str) -> Device {
        let digits = name.trim_start_matches(|c: char| !c.is_ascii_digit());
        Device {
            name: name.into(),
            capacity: 1 << 34,
            reserve: 0,
            vendor,
            select_as: Some(id.into()),
            index: digits.parse().ok(),
        }
    }

    fn cuda(list: &str) -> [(String, String); 2] {
        [
            ("CUDA_VISIBLE_DEVICES".to_string(), list.to_string()),
            ("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into()),
        ]
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
        assert_eq!(pairs(&[1]), cuda("1"));
        assert_eq!(pairs(&[0, 1]), cuda("0,1"));
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

    /// ROCr shows the devices it is given as 0, 1, ...; HIP then picks among those, so the
    /// second AMD GPU is `ROCR_VISIBLE_DEVICES=1` with `HIP_VISIBLE_DEVICES=0`, where `1` for
    /// both left the engine no GPU at all.
    #[test]
    fn amd_devices_are_shown_by_rocr_and_numbered_anew_for_hip() {
        let devices = [
            device("rocm0", Vendor::Amd, "0"),
            device("rocm1", Vendor::Amd, "1"),
            device("rocm2", Vendor::Amd, "2"),
        ];
        let pairs = visible_devices(&devices, &[1, 2], &[], &strings(&["llama-server"]));
        assert_eq!(
            pairs,
            [
                ("HIP_VISIBLE_DEVICES".into(), "0,1".into()),
                ("ROCR_VISIBLE_DEVICES".into(), "1,2".into())
            ]
        );
    }

    /// A model that sets its own device order keeps it.
    #[test]
    fn a_device_order_of_the_users_own_stands() {
        let devices = [device("cuda1", Vendor::Nvidia, "1")];
        let env = [("CUDA_DEVICE_ORDER".to_string(), "FASTEST_FIRST".to_string())];
        let pairs = visible_devices(&devices, &[0], &env, &strings(&["vllm"]));
        assert_eq!(pairs, [("CUDA_VISIBLE_DEVICES".into(), "1".into())]);
    }

    /// vLLM reads each entry of `CUDA_VISIBLE_DEVICES` as a number and fails to start on a UUID:
    /// a GPU known by its UUID is shown by its index, which in bus order is nvidia-smi's.
    #[test]
    fn nvidia_gpus_are_shown_by_their_index_in_bus_order() {
        let devices = [
            device("cuda0", Vendor::Nvidia, "GPU-aaa"),
            device("cuda1", Vendor::Nvidia, "GPU-bbb"),
        ];
        let vllm = strings(&["vllm", "serve", "org/m"]);
        assert_eq!(visible_devices(&devices, &[1], &[], &vllm), cuda("1"));
        assert_eq!(visible_devices(&devices, &[1, 0], &[], &vllm), cuda("1,0"));
        // the model's own bus order is the same order
        let env = [("CUDA_DEVICE_ORDER".to_string(), "PCI_BUS_ID".to_string())];
        assert_eq!(
            visible_devices(&devices, &[1], &env, &vllm),
            [("CUDA_VISIBLE_DEVICES".into(), "1".into())]
        );
        let wrapped = strings(&["sh", "-c", "CUDA_DEVICE_ORDER=PCI_BUS_ID exec vllm serve m"]);
        assert_eq!(visible_devices(&devices, &[1], &[], &wrapped), cuda("1"));
    }

    /// Counted fastest first, an index may name another card than nvidia-smi's: the UUID stays,
    /// whether the model's `env` or its command sets the order.
    #[test]
    fn another_device_order_keeps_the_uuid() {
        let devices = [
            device("cuda0", Vendor::Nvidia, "GPU-aaa"),
            device("cuda1", Vendor::Nvidia, "GPU-bbb"),
        ];
        let vllm = strings(&["vllm", "serve", "org/m"]);
        let env = [("CUDA_DEVICE_ORDER".to_string(), "FASTEST_FIRST".to_string())];
        assert_eq!(
            visible_devices(&devices, &[1], &env, &vllm),
            [("CUDA_VISIBLE_DEVICES".into(), "GPU-bbb".into())]
        );
        let own = strings(&[
            "env",
            "CUDA_DEVICE_ORDER=FASTEST_FIRST",
            "vllm",
            "serve",
            "m",
        ]);
        assert_eq!(visible_devices(&devices, &[1], &[], &own), cuda("GPU-bbb"));
    }

    /// A MIG instance has no index of its own (its GPU's would show the whole card), and a device
    /// the config names by UUID alone has no known index: both are shown by their UUID.
    #[test]
    fn mig_instances_and_devices_of_unknown_index_keep_their_uuid() {
        let mut unknown = device("g", Vendor::Nvidia, "GPU-ccc");
        unknown.index = None;
        let devices = [device("mig0", Vendor::Nvidia, "MIG-abc"), unknown];
        let vllm = strings(&["vllm", "serve", "org/m"]);
        assert_eq!(visible_devices(&devices, &[0], &[], &vllm), cuda("MIG-abc"));
        assert_eq!(visible_devices(&devices, &[1], &[], &vllm), cuda("GPU-ccc"));
    }

    /// Only NVIDIA devices are shown by index: the others are shown as before, by what corral
    /// knows them by.
    #[test]
    fn other_vendors_are_shown_by_what_they_are_known_by() {
        let mut amd = device("rocm0", Vendor::Amd, "3");
        amd.index = Some(0);
        let mut vk = device("vk0", Vendor::Vulkan, "2");
        vk.index = Some(0);
        let argv = strings(&["llama-server"]);
        assert_eq!(
            visible_devices(&[amd, vk], &[0, 1], &[], &argv),
            [
                ("HIP_VISIBLE_DEVICES".into(), "0".into()),
                ("ROCR_VISIBLE_DEVICES".into(), "3".into()),
                ("GGML_VK_VISIBLE_DEVICES".into(), "2".into()),
            ]
        );
    }

    /// SGLang's `--device cuda` names a kind of device, not which: the engine is still pinned.
    #[test]
    fn only_llama_servers_device_flag_is_a_choice_of_devices() {
        let devices = [device("cuda1", Vendor::Nvidia, "1")];
        let sglang = strings(&["python", "-m", "sglang.launch_server", "--device", "cuda"]);
        assert!(!visible_devices(&devices, &[0], &[], &sglang).is_empty());
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
            strings(&["env", "A=1", "B=2", "llama-server", "--device", "CUDA1"]),
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
        let sglang_own = strings(&["sglang", "serve", "--tensor-parallel-size", "2"]);
        assert!(split_args(&sglang_own, &split).is_empty());
        let tgi = strings(&["text-generation-launcher", "--model-id", "/m"]);
        assert_eq!(split_args(&tgi, &split), strings(&["--num-shard", "2"]));
        // a llama-server whose model path names SGLang is still llama-server
        let llama_named = strings(&["llama-server", "-m", "/models/sglang-test.gguf"]);
        assert_eq!(
            split_args(&llama_named, &split),
            strings(&["--tensor-split", "18432,12288", "--split-mode", "layer"])
        );
        assert_eq!(sharding(&llama_named), Sharding::Layers);
        let behind_env = strings(&["env", "HF_HOME=/h", "vllm", "serve", "org/m"]);
        assert_eq!(sharding(&behind_env), Sharding::Tensors);
        let uv = strings(&["uv", "run", "vllm", "serve", "org/m"]);
        assert_eq!(sharding(&uv), Sharding::Tensors);
        assert_eq!(sharding(&tgi), Sharding::Tensors);
        assert!(
            split_args(&llama, &split[..1]).is_empty(),
            "one device: nothing to split"
        );
    }

    /// vLLM, SGLang and TGI are told the part of the card the ledger charged them, where they
    /// took most of it (vLLM 90%) and failed beside anything else; llama-server allocates what
    /// it needs and is told nothing, as is a command that says already.
    #[test]
    fn pytorch_engines_are_told_their_share_of_the_card() {
        const GIB: u64 = 1 << 30;
        let mut big = device("cuda0", Vendor::Nvidia, "0");
        big.capacity = 80 * GIB;
        let devices = [big];
        let charged = [(0, 30 * GIB)];
        let share = |argv: &[&str]| memory_share_args(&strings(argv), &charged, &devices, &[]);
        assert_eq!(
            share(&["vllm", "serve", "/m"]),
            strings(&["--gpu-memory-utilization", "0.375"])
        );
        assert_eq!(
            share(&["python", "-m", "sglang.launch_server"]),
            strings(&["--mem-fraction-static", "0.375"])
        );
        assert_eq!(
            share(&["text-generation-launcher", "--model-id", "/m"]),
            strings(&["--cuda-memory-fraction", "0.375"])
        );
        assert!(share(&["llama-server", "-m", "m.gguf"]).is_empty());
        assert!(share(&["llama-server", "-m", "/m/sglang-tuned.gguf"]).is_empty());
        assert!(share(&["vllm", "serve", "/m", "--gpu-memory-utilization=0.5"]).is_empty());
        assert!(memory_share_args(&strings(&["vllm"]), &[], &devices, &[]).is_empty());
        // 40 GiB held beside it: SGLang and TGI are told the whole card's ceiling (70 of 80),
        // vLLM still its own budget
        let beside = [40 * GIB];
        let with = |argv: &[&str]| memory_share_args(&strings(argv), &charged, &devices, &beside);
        assert_eq!(
            with(&["python", "-m", "sglang.launch_server"]),
            strings(&["--mem-fraction-static", "0.875"])
        );
        assert_eq!(
            with(&["text-generation-launcher", "--model-id", "/m"]),
            strings(&["--cuda-memory-fraction", "0.875"])
        );
        assert_eq!(
            with(&["vllm", "serve", "/m"]),
            strings(&["--gpu-memory-utilization", "0.375"])
        );
    }

    #[test]
    fn devices_that_are_only_budgeted_are_not_pinned() {
        let devices = [device("ram", Vendor::None, "0")];
        assert!(visible_devices(&devices, &[0], &[], &strings(&["srv"])).is_empty());
    }
}
