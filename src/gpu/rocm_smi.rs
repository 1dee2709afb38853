//! AMD GPUs through rocm-smi (`CORRAL_ROCM_SMI` names another command: tests use a fake).
//!
//! The GPUs come from `--showmeminfo vram --showuniqueid --json`: one `cardN` object per GPU,
//! values as strings (`"VRAM Total Memory (B)": "68702699520"`). Processes come from two
//! readings, since neither says it all: `--showpids --json` gives each KFD process's VRAM summed
//! over its GPUs (`"PID1234": "python3, 1, 20971520, 0, 0"`: name, GPU count, VRAM, SDMA, CU
//! occupancy), and `--showpidgpus`, whose JSON form leaves the list out, says in text which GPUs
//! each process uses (`PID 1234 is using 1 DRM device(s):` then the indices).

use std::collections::HashMap;

use serde_json::Value;

use super::{bounded, Gpu, ProcessUse, ToolRunner, Vendor, PROBE_TIMEOUT};

/// The command that reports the AMD GPUs: `rocm-smi`, or `CORRAL_ROCM_SMI`.
fn rocm_smi() -> String {
    std::env::var("CORRAL_ROCM_SMI").unwrap_or_else(|_| "rocm-smi".into())
}

/// Every GPU rocm-smi lists, or `None` when it cannot be run or fails.
pub fn gpus() -> Option<Vec<Gpu>> {
    let out = bounded(PROBE_TIMEOUT, || {
        std::process::Command::new(rocm_smi())
            .args(["--showmeminfo", "vram", "--showuniqueid", "--json"])
            .stderr(std::process::Stdio::null())
            .output()
    })?
    .ok()?;
    out.status
        .success()
        .then(|| parse_gpus(&String::from_utf8_lossy(&out.stdout)))
        .flatten()
}

/// The `cardN` objects of rocm-smi's JSON, by index; `None` when it is not JSON.
pub fn parse_gpus(json: &str) -> Option<Vec<Gpu>> {
    let Value::Object(cards) = serde_json::from_str(json).ok()? else {
        return None;
    };
    let mut gpus: Vec<Gpu> = cards
        .iter()
        .filter_map(|(key, card)| {
            let index = key.strip_prefix("card")?.parse().ok()?;
            let field = |name: &str| card.get(name).and_then(Value::as_str).map(str::trim);
            Some(Gpu {
                vendor: Vendor::Amd,
                index,
                uuid: field("Unique ID").filter(|u| *u != "N/A").map(String::from),
                product: field("Card series").unwrap_or("").to_string(),
                total: field("VRAM Total Memory (B)")?.parse().ok()?,
            })
        })
        .collect();
    gpus.sort_by_key(|g| g.index);
    Some(gpus)
}

/// `pid -> (VRAM bytes over all its GPUs)` from `--showpids --json`; processes whose use rocm-smi
/// could not read are left out.
pub fn parse_pids(json: &str) -> Option<HashMap<u32, u64>> {
    let v: Value = serde_json::from_str(json).ok()?;
    let mut out = HashMap::new();
    let Some(Value::Object(system)) = v.get("system") else {
        return Some(out); // no KFD process: rocm-smi prints no `system`
    };
    for (key, row) in system {
        let (Some(pid), Some(row)) = (key.strip_prefix("PID"), row.as_str()) else {
            continue;
        };
        // the name may hold spaces (rocm-smi turns them into ", "): count from the end
        let fields: Vec<&str> = row.split(',').map(str::trim).collect();
        let vram = fields
            .len()
            .checked_sub(3)
            .and_then(|i| fields[i].parse().ok());
        if let (Ok(pid), Some(vram)) = (pid.parse(), vram) {
            out.insert(pid, vram);
        }
    }
    Some(out)
}

/// `pid -> GPU indices` from the text of `--showpidgpus`.
pub fn parse_pid_gpus(text: &str) -> HashMap<u32, Vec<String>> {
    let mut out: HashMap<u32, Vec<String>> = HashMap::new();
    let mut current: Option<u32> = None;
    for line in text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("PID ") {
            current = rest.split_whitespace().next().and_then(|p| p.parse().ok());
            if let Some(pid) = current {
                out.entry(pid).or_default();
            }
            continue;
        }
        let indices: Vec<&str> = line.split_whitespace().collect();
        match current {
            Some(pid)
                if !indices.is_empty() && indices.iter().all(|i| i.parse::<u32>().is_ok()) =>
            {
                out.entry(pid)
                    .or_default()
                    .extend(indices.iter().map(|i| i.to_string()))
            }
            _ => current = None,
        }
    }
    out
}

/// Each process's VRAM put on its GPUs: split evenly over several (rocm-smi gives only the sum),
/// and on the only AMD device where rocm-smi did not say which.
pub fn attribute(
    vram: &HashMap<u32, u64>,
    gpus_of: &HashMap<u32, Vec<String>>,
    devices: &[String],
) -> Vec<ProcessUse> {
    let mut out = Vec::new();
    for (&pid, &bytes) in vram {
        let on: Vec<String> = match gpus_of.get(&pid) {
            Some(list) if !list.is_empty() => list.clone(),
            _ if devices.len() == 1 => devices.to_vec(),
            _ => continue,
        };
        let share = bytes / on.len() as u64;
        out.extend(on.into_iter().map(|device| ProcessUse {
            vendor: Vendor::Amd,
            device,
            pid,
            bytes: share,
        }));
    }
    out.sort_by(|a, b| (a.pid, &a.device).cmp(&(b.pid, &b.device)));
    out
}

/// One reading of every KFD process's VRAM on `devices` (AMD selectors, which are indices), or
/// `None` when rocm-smi could not tell.
pub async fn process_use(tools: &impl ToolRunner, devices: &[String]) -> Option<Vec<ProcessUse>> {
    let vram = parse_pids(&run(tools, &["--showpids", "--json"]).await?)?;
    let gpus_of = if vram.is_empty() {
        HashMap::new()
    } else {
        parse_pid_gpus(&run(tools, &["--showpidgpus"]).await.unwrap_or_default())
    };
    Some(attribute(&vram, &gpus_of, devices))
}

async fn run(tools: &impl ToolRunner, args: &[&str]) -> Option<String> {
    let mut cmd = tokio::process::Command::new(rocm_smi());
    cmd.args(args);
    match tools.output(cmd, PROBE_TIMEOUT).await {
        Ok(out) if out.status.success() => Some(String::from_utf8_lossy(&out.stdout).into()),
        _ => None,
    }
}

#[cfg(test)]
#[path = "rocm_smi_tests.rs"]
mod tests;
