//! A bound on the request bytes buffered at once, across every connection.
//!
//! corral reads a model request's body whole to find the model. One body is bounded (128 MiB),
//! but nothing else bounded how many are held together: a few hundred clients each sending a large
//! body could take all of the machine's memory. Every buffered byte is charged here as it arrives
//! (a client that only declares a large body holds nothing); a body that would pass the budget is
//! refused with 503 and `Retry-After`, before it is read when its declared length already does not
//! fit, and its charge is given back when the request no longer holds the bytes.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::proxy::error::Error;

/// The shared budget (`maxBufferedBodies`).
#[derive(Debug, Clone)]
pub struct BodyBudget {
    bytes: Arc<Semaphore>,
    total: u64,
}

/// Bytes charged to the budget; given back on drop.
#[derive(Debug)]
pub struct Charge(Option<OwnedSemaphorePermit>);

impl BodyBudget {
    pub fn new(total: u64) -> BodyBudget {
        let total = total.clamp(1, Semaphore::MAX_PERMITS as u64);
        BodyBudget {
            bytes: Arc::new(Semaphore::new(total as usize)),
            total,
        }
    }

    /// The default: a quarter of physical memory, at least 256 MiB (two largest bodies).
    pub fn default_total() -> u64 {
        const FLOOR: u64 = 256 * 1024 * 1024;
        physical_memory().map_or(FLOOR, |m| (m / 4).max(FLOOR))
    }

    /// Refuses at once a body whose declared length does not fit in what is left now.
    pub fn has_room_for(&self, n: u64) -> Result<(), Error> {
        match n <= self.bytes.available_permits() as u64 {
            true => Ok(()),
            false => Err(self.exhausted()),
        }
    }

    /// Charges `n` more bytes to `charge`, or refuses when the budget has no room for them now.
    pub fn charge(&self, charge: &mut Charge, n: u64) -> Result<(), Error> {
        if n == 0 {
            return Ok(());
        }
        let more = u32::try_from(n)
            .ok()
            .and_then(|n| self.bytes.clone().try_acquire_many_owned(n).ok())
            .ok_or_else(|| self.exhausted())?;
        match &mut charge.0 {
            Some(held) => held.merge(more),
            none => *none = Some(more),
        }
        Ok(())
    }

    fn exhausted(&self) -> Error {
        Error::Busy {
            status: 503,
            message: format!(
                "corral is holding as many request bodies as maxBufferedBodies allows ({} bytes); retry shortly",
                self.total
            ),
            retry_after: 1,
        }
    }
}

impl Charge {
    pub fn none() -> Charge {
        Charge(None)
    }

    pub fn bytes(&self) -> u64 {
        self.0.as_ref().map_or(0, |p| p.num_permits() as u64)
    }
}

/// `MemTotal` from `/proc/meminfo`, in bytes.
fn physical_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_add_up_and_come_back_on_drop() {
        let budget = BodyBudget::new(100);
        let mut a = Charge::none();
        budget.charge(&mut a, 60).unwrap();
        budget.charge(&mut a, 30).unwrap();
        assert_eq!(a.bytes(), 90);
        let mut b = Charge::none();
        let refused = budget.charge(&mut b, 20).unwrap_err();
        assert_eq!(refused.status(), http::StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            refused.to_string().contains("maxBufferedBodies"),
            "{refused}"
        );
        drop(a);
        budget.charge(&mut b, 100).unwrap();
        assert_eq!(b.bytes(), 100);
    }

    #[test]
    fn more_than_a_permit_count_holds_is_refused_not_wrapped() {
        let budget = BodyBudget::new(u64::MAX);
        assert!(budget
            .charge(&mut Charge::none(), u64::from(u32::MAX) + 1)
            .is_err());
    }

    #[test]
    fn the_default_is_a_share_of_memory() {
        assert!(BodyBudget::default_total() >= 256 * 1024 * 1024);
    }
}
