//! nvidia-smi, where NVML cannot be loaded (`CORRAL_NVIDIA_SMI` names another command: tests use
//! a fake that lists GPUs this machine lacks).

use super::{bounded, Gpu, ProcessUse, ToolRunner, Vendor, PROBE_TIMEOUT};

/// The command that reports the GPUs: `nvidia-smi`, or `CORRAL_NVIDIA_SMI` (tests use a fake
/// that lists GPUs this machine lacks).
pub fn command() -> String {
    std::env::var("CORRAL_NVIDIA_SMI").unwrap_or_else(|_| "nvidia-smi".into())
}

/// Every GPU nvidia-smi lists, or `None` when it cannot be run or fails (no driver, no GPU).
pub fn gpus() -> Option<Vec<Gpu>> {
    let out = bounded(PROBE_TIMEOUT, || {
        std::process::Command::new(command())
            .args([
                "--query-gpu=index,uuid,memory.total,name",
                "--format=csv,noheader,nounits",
            ])
            .stderr(std::process::Stdio::null())
            .output()
    })?;
    match out {
        Ok(o) if o.status.success() => Some(
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(gpu_row)
                .collect(),
        ),
        _ => None,
    }
}

/// One `index, uuid, memory.total (MiB), name` row of `--query-gpu`.
fn gpu_row(line: &str) -> Option<Gpu> {
    let mut fields = line.splitn(4, ',').map(str::trim);
    let (index, uuid, mib) = (fields.next()?, fields.next()?, fields.next()?);
    Some(Gpu {
        vendor: Vendor::Nvidia,
        index: index.parse().ok()?,
        uuid: Some(uuid.to_string()),
        product: fields.next().unwrap_or("").to_string(),
        total: mib.parse::<u64>().ok()? * 1024 * 1024,
    })
}

/// One reading of every compute process's memory, or `None` when nvidia-smi could not tell.
pub async fn process_use(tools: &impl ToolRunner) -> Option<Vec<ProcessUse>> {
    let mut cmd = tokio::process::Command::new(command());
    cmd.args([
        "--query-compute-apps=gpu_uuid,pid,used_memory",
        "--format=csv,noheader,nounits",
    ]);
    match tools.output(cmd, PROBE_TIMEOUT).await {
        Ok(out) if out.status.success() => Some(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(compute_app_row)
                .collect(),
        ),
        _ => None,
    }
}

/// One `gpu_uuid, pid, used_memory` row of `--query-compute-apps` (MiB, no units).
fn compute_app_row(line: &str) -> Option<ProcessUse> {
    let mut fields = line.split(',').map(str::trim);
    let uuid = fields.next()?;
    let pid = fields.next()?.parse().ok()?;
    let mib: u64 = fields.next()?.parse().ok()?;
    Some(ProcessUse {
        vendor: Vendor::Nvidia,
        device: uuid.to_string(),
        pid,
        bytes: mib * 1024 * 1024,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_rows_give_index_uuid_memory_and_name() {
        let g = gpu_row("1, GPU-bbbb-1111, 24576, NVIDIA GeForce RTX 4090, rev b").unwrap();
        assert_eq!(g.index, 1);
        assert_eq!(g.uuid.as_deref(), Some("GPU-bbbb-1111"));
        assert_eq!(g.total, 24 << 30);
        assert_eq!(g.product, "NVIDIA GeForce RTX 4090, rev b");
        // older fakes and drivers print no name
        assert_eq!(gpu_row("0, GPU-a, 1024").unwrap().product, "");
        assert_eq!(gpu_row("No devices were found"), None);
    }

    #[test]
    fn compute_app_rows_name_the_gpu_by_uuid() {
        let row = compute_app_row("GPU-a, 100, 20480").unwrap();
        assert_eq!(
            (row.device.as_str(), row.pid, row.bytes),
            ("GPU-a", 100, 20 << 30)
        );
        assert_eq!(compute_app_row("GPU-a, [N/A], 5"), None);
    }
}
