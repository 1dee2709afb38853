//! The memory ledger: what each instance needs, and where a new one fits.
//!
//! An instance is charged on its devices from the moment it starts until its process has exited
//! (starting, ready and stopping all count), so memory is counted as free only when it really is.
//! Placement is a pure function over the charges, so the rules can be tested without processes.
//!
//! The parts: `need.rs` (what an instance needs), `place.rs` with `split.rs` (where a new one goes),
//! `evict.rs` (which idle holders to stop), `report.rs` (the engine's own figures); the charges
//! and holders they all read are here.

mod evict;
#[cfg(test)]
mod fixtures;
pub mod host;
mod need;
mod place;
mod report;
mod split;

use std::time::Instant;

use crate::config::Device;

pub use evict::over_capacity;
pub use need::{need_of, Need};
pub use place::{place, place_by, Placement};
pub use report::{corrected, measured_by_device, measured_from_log};
pub use split::Sharding;

/// Bytes charged on each device an instance is placed on.
pub type Charges = Vec<(usize, u64)>;

/// Device indices of some charges.
pub fn devices_of(charges: &Charges) -> Vec<usize> {
    charges.iter().map(|(d, _)| *d).collect()
}

/// An instance that holds memory now.
#[derive(Debug, Clone)]
pub struct Holder {
    pub id: String,
    pub devices: Charges,
    pub bytes: u64,
    /// Requests in flight or waiting: never evicted.
    pub busy: bool,
    /// Already stopping: its memory comes back when it exits.
    pub stopping: bool,
    pub last_used: Instant,
}

impl Holder {
    fn on(&self, device: usize) -> u64 {
        self.devices
            .iter()
            .filter(|(d, _)| *d == device)
            .map(|(_, b)| *b)
            .sum()
    }

    fn uses(&self, devices: &Charges) -> bool {
        self.devices
            .iter()
            .any(|(d, _)| devices.iter().any(|(c, _)| c == d))
    }
}

/// What the holders charge on one device.
pub fn charged(holders: &[Holder], device: usize) -> u64 {
    holders.iter().map(|h| h.on(device)).sum()
}

/// What a device has free now: usable memory less what the holders charge there.
fn room(devices: &[Device], holders: &[Holder], device: usize) -> u64 {
    devices[device]
        .usable()
        .saturating_sub(charged(holders, device))
}

/// What the holders that are already stopping charge on one device: room that comes back soon.
fn stopping_on(holders: &[Holder], device: usize) -> u64 {
    holders
        .iter()
        .filter(|h| h.stopping)
        .map(|h| h.on(device))
        .sum()
}

/// The devices as placement sees them once other programs' use is taken out: what they hold counts
/// as reserved (usable = capacity - reserve - used by others).
pub fn less_outside_use(devices: &[Device], others: &[u64]) -> Vec<Device> {
    devices
        .iter()
        .enumerate()
        .map(|(i, d)| Device {
            reserve: (d.reserve + others.get(i).copied().unwrap_or(0)).min(d.capacity),
            ..d.clone()
        })
        .collect()
}
#[cfg(test)]
mod tests {
    use super::fixtures::{gpu, GIB};
    use super::*;

    #[test]
    fn outside_use_is_held_like_a_reserve() {
        let devices = [gpu("g0", 24), gpu("g1", 24)];
        let seen = less_outside_use(&devices, &[20 * GIB, 0]);
        assert_eq!(seen[0].usable(), 4 * GIB);
        assert_eq!(seen[1].usable(), 24 * GIB);
        assert_eq!(
            place(&seen, 12 * GIB, &[], &[]),
            Placement::Fits(vec![(1, 12 * GIB)])
        );
        assert_eq!(less_outside_use(&devices, &[30 * GIB])[0].usable(), 0);
    }
}
