//! `timeouts.streamIdle`: a response body that sends nothing for this long is ended. The timer is
//! armed only while the body waits, and moved on lazily when data came since, so a streaming
//! answer does not reset a timer per chunk.

use std::future::Future;
use std::pin::Pin;
use std::task::Context;
use std::time::Duration;

use tokio::time::{Instant, Sleep};

pub(crate) struct IdleLimit {
    limit: Duration,
    last_data: Instant,
    timer: Option<Pin<Box<Sleep>>>,
}

impl IdleLimit {
    pub(crate) fn new(limit: Duration) -> IdleLimit {
        IdleLimit {
            limit,
            last_data: Instant::now(),
            timer: None,
        }
    }

    pub(crate) fn limit(&self) -> Duration {
        self.limit
    }

    /// Data came: the silence starts again.
    pub(crate) fn touch(&mut self) {
        self.last_data = Instant::now();
    }

    /// True once the body has been silent for the limit; arms the timer otherwise.
    pub(crate) fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            let Some(due) = self.last_data.checked_add(self.limit) else {
                return false;
            };
            let timer = self
                .timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
            if timer.as_mut().poll(cx).is_pending() {
                return false;
            }
            if due <= Instant::now() {
                return true;
            }
            // data came while the timer ran: wait for the rest of the new period
            timer.as_mut().reset(due);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn poll_expired(idle: &mut IdleLimit) -> bool {
        idle.expired(&mut Context::from_waker(std::task::Waker::noop()))
    }

    #[tokio::test(start_paused = true)]
    async fn silence_for_the_limit_expires_and_data_moves_it_on() {
        let mut idle = IdleLimit::new(Duration::from_secs(10));
        assert!(!poll_expired(&mut idle));
        tokio::time::advance(Duration::from_secs(9)).await;
        idle.touch();
        tokio::time::advance(Duration::from_secs(9)).await;
        assert!(!poll_expired(&mut idle), "data came 9 s ago");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(poll_expired(&mut idle));
    }
}
