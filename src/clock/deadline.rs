//! Deadlines from configured limits. A limit may be set beyond what a clock can add (a timeout of
//! i64::MAX seconds), where `Instant + Duration` would panic in the task that supervises an
//! engine or serves a request.

use std::time::Duration;

use tokio::time::Instant;

/// As good as never: where a limit past any clock's range ends.
const NEVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `limit` after `from`, or as good as never when that is past the clock's range.
pub fn after(from: Instant, limit: Duration) -> Instant {
    from.checked_add(limit).unwrap_or_else(|| from + NEVER)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_past_the_clock_is_never_reached() {
        let now = Instant::now();
        assert_eq!(
            after(now, Duration::from_secs(5)),
            now + Duration::from_secs(5)
        );
        assert_eq!(after(now, Duration::MAX), now + NEVER);
        assert_eq!(
            after(now, Duration::from_secs(i64::MAX as u64)),
            now + NEVER
        );
    }
}
