//! `globalConcurrencyLimit`: one bound on the model requests served at once, across all models.
//!
//! As in llama-swap, a request past the bound is refused at once with 429 (no queue), after the
//! API key check and before anything else is done for it; `/upstream` and the management routes
//! are not counted. A request holds its place until its answer's body ends. With no limit (0, the
//! default) nothing is counted: one branch per model request.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::proxy::error::Error;

/// The bound and the requests holding a place under it. The count is shared by every App a
/// reload builds, so the requests still answering under the old config count against the new.
#[derive(Debug, Default)]
pub struct GlobalLimit {
    limit: usize,
    in_use: Arc<AtomicUsize>,
}

/// One request's place under the limit, given back when dropped.
#[derive(Debug)]
pub struct Place(Arc<AtomicUsize>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

impl GlobalLimit {
    /// A bound of `limit` requests (0: none), counting with `self`'s count.
    pub fn with_limit(&self, limit: usize) -> GlobalLimit {
        GlobalLimit {
            limit,
            in_use: self.in_use.clone(),
        }
    }

    /// A place for one more request: `None` when there is no limit, 429 when it is reached.
    pub fn admit(&self) -> Result<Option<Place>, Error> {
        if self.limit == 0 {
            return Ok(None);
        }
        let mut held = self.in_use.load(Ordering::Acquire);
        loop {
            if held >= self.limit {
                return Err(Error::ConcurrencyLimit);
            }
            match self.in_use.compare_exchange_weak(
                held,
                held + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(Some(Place(self.in_use.clone()))),
                Err(now) => held = now,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_limit_counts_nothing() {
        let open = GlobalLimit::default();
        assert!((0..100).all(|_| matches!(open.admit(), Ok(None))));
        assert_eq!(open.in_use.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn past_the_limit_is_refused_until_a_place_is_given_back() {
        let limit = GlobalLimit::default().with_limit(2);
        let first = limit.admit().unwrap().unwrap();
        let _second = limit.admit().unwrap().unwrap();
        assert!(matches!(limit.admit(), Err(Error::ConcurrencyLimit)));
        drop(first);
        assert!(limit.admit().unwrap().is_some());
    }

    /// A reload keeps the count: the requests admitted before it still hold their places.
    #[test]
    fn a_new_bound_keeps_the_places_held() {
        let before = GlobalLimit::default().with_limit(1);
        let _held = before.admit().unwrap();
        let after = before.with_limit(1);
        assert!(matches!(after.admit(), Err(Error::ConcurrencyLimit)));
    }
}
