//! Devices and holders for the ledger's tests.

use std::time::{Duration, Instant};

use super::Holder;
use crate::config::Device;

pub(super) const GIB: u64 = 1 << 30;

pub(super) fn gpu(name: &str, gib: u64) -> Device {
    Device {
        name: name.into(),
        capacity: gib * GIB,
        reserve: 0,
        vendor: crate::config::Vendor::None,
        select_as: None,
        index: None,
    }
}

pub(super) fn holder(id: &str, gib: u64, busy: bool, age_s: u64) -> Holder {
    Holder {
        id: id.into(),
        devices: vec![(0, gib * GIB)],
        bytes: gib * GIB,
        busy,
        stopping: false,
        last_used: Instant::now() - Duration::from_secs(age_s),
    }
}
