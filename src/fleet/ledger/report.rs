//! The engine's own report of what it allocated, read from its log, and the charges corrected by it.

use super::Charges;
use crate::memory;

/// What a loaded llama-server reported allocating on devices (host buffers left out), from its
/// `... buffer size = N MiB` lines.
pub fn measured_from_log(text: &str) -> Option<u64> {
    let mut total = 0;
    let mut found = false;
    for line in text.lines() {
        if let Some((device, _kind, bytes)) = memory::parse_buffer_report(line) {
            if device.contains("CPU") || device.contains("Host") {
                continue;
            }
            total += bytes;
            found = true;
        }
    }
    found.then_some(total)
}

/// How far an engine's report may exceed its charge on a device before it counts as an overrun
/// (percent): estimates are rounded, and a few percent either way is normal.
pub const OVERRUN_TOLERANCE_PERCENT: u64 = 10;

/// What a loaded llama-server reported allocating on each device it was shown, by the device's
/// position among them (`CUDA1` is the second device made visible), host buffers left out.
pub fn measured_by_device(text: &str) -> Vec<(usize, u64)> {
    let mut out: Vec<(usize, u64)> = Vec::new();
    for line in text.lines() {
        let Some((device, _kind, bytes)) = memory::parse_buffer_report(line) else {
            continue;
        };
        if device.contains("CPU") || device.contains("Host") {
            continue;
        }
        let digits = &device[device.trim_end_matches(|c: char| c.is_ascii_digit()).len()..];
        let position = digits.parse().unwrap_or(0);
        match out.iter_mut().find(|(p, _)| *p == position) {
            Some((_, total)) => *total += bytes,
            None => out.push((position, bytes)),
        }
    }
    out
}

/// A device whose report exceeded its charge by more than the tolerance.
#[derive(Debug, Clone, PartialEq)]
pub struct Overrun {
    pub device: usize,
    pub charged: u64,
    pub reported: u64,
}

/// The charges with each reported device's figure in place of the estimate (`reported` by
/// position among `placed`, the order the devices were made visible), and the devices that
/// overran. Positions beyond the placement are ignored.
pub fn corrected(placed: &Charges, reported: &[(usize, u64)]) -> (Charges, Vec<Overrun>) {
    let mut charges = placed.clone();
    let mut overruns = Vec::new();
    for (position, bytes) in reported {
        let Some((device, charge)) = charges.get_mut(*position) else {
            continue;
        };
        let allowed = *charge + *charge * OVERRUN_TOLERANCE_PERCENT / 100;
        if *bytes > allowed {
            overruns.push(Overrun {
                device: *device,
                charged: *charge,
                reported: *bytes,
            });
        }
        *charge = *bytes;
    }
    (charges, overruns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_buffers_are_summed_and_host_buffers_ignored() {
        let log = "load_tensors:        CUDA0 model buffer size =  1024.00 MiB\nload_tensors:   CPU_Mapped model buffer size =   281.81 MiB\nllama_kv_cache:      CUDA0 KV buffer size =   256.00 MiB\nsched_reserve:      CUDA0 compute buffer size =   300.00 MiB\nsched_reserve:  CUDA_Host compute buffer size =    12.00 MiB\n";
        assert_eq!(
            measured_from_log(log),
            Some((1024 + 256 + 300) * 1024 * 1024)
        );
        assert_eq!(measured_from_log("nothing here"), None);
    }

    #[test]
    fn each_visible_device_is_read_back_in_placement_order() {
        let log = "load_tensors:        CUDA0 model buffer size =  1024.00 MiB\nload_tensors:        CUDA1 model buffer size =  2048.00 MiB\nload_tensors:   CPU_Mapped model buffer size =   281.81 MiB\nllama_kv_cache:      CUDA1 KV buffer size =   256.00 MiB\n";
        const MIB: u64 = 1 << 20;
        let read = measured_by_device(log);
        assert_eq!(read, [(0, 1024 * MIB), (1, 2304 * MIB)]);
        // placed on device 3 first, then device 1: CUDA0 is device 3
        let placed = vec![(3, 1024 * MIB), (1, 2048 * MIB)];
        let (charges, overruns) = corrected(&placed, &read);
        assert_eq!(charges, [(3, 1024 * MIB), (1, 2304 * MIB)]);
        assert_eq!(
            overruns,
            [Overrun {
                device: 1,
                charged: 2048 * MIB,
                reported: 2304 * MIB
            }],
            "12.5% over is an overrun; exactly the charge is not"
        );
        assert!(
            corrected(&vec![(0, 1000 * MIB), (1, 2100 * MIB)], &read)
                .1
                .is_empty(),
            "2.4% and 9.7% over are within the tolerance"
        );
    }
}
