//! A broadcast channel that tells cheaply whether anyone listens.
//!
//! Every request asks (to build an event's JSON only for a listener), on whichever serving thread
//! it runs. tokio's `receiver_count` takes the channel's lock, so the serving threads took turns
//! on that one lock several times a request; here the listeners are counted apart, and asking is
//! one read of a count that changes only when a listener comes or goes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::broadcast;

pub struct Announcer<T> {
    sender: broadcast::Sender<T>,
    listeners: Arc<AtomicUsize>,
}

impl<T: Clone> Announcer<T> {
    /// A channel that keeps up to `capacity` messages for a slow listener.
    pub fn new(capacity: usize) -> Self {
        Announcer {
            sender: broadcast::channel(capacity).0,
            listeners: Arc::default(),
        }
    }

    /// True while someone listens.
    pub fn is_heard(&self) -> bool {
        self.listeners.load(Ordering::Relaxed) > 0
    }

    /// Sends to every listener; a message nobody hears is dropped.
    pub fn send(&self, message: T) {
        let _ = self.sender.send(message);
    }

    pub fn subscribe(&self) -> Listener<T> {
        self.listeners.fetch_add(1, Ordering::Relaxed);
        Listener {
            receiver: self.sender.subscribe(),
            listeners: self.listeners.clone(),
        }
    }
}

/// One listener: a broadcast receiver, counted until dropped.
pub struct Listener<T> {
    receiver: broadcast::Receiver<T>,
    listeners: Arc<AtomicUsize>,
}

impl<T: Clone> Listener<T> {
    /// The next message, as [`broadcast::Receiver::recv`] gives it.
    pub async fn recv(&mut self) -> Result<T, broadcast::error::RecvError> {
        self.receiver.recv().await
    }
}

impl<T> Drop for Listener<T> {
    fn drop(&mut self) {
        self.listeners.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn heard_only_while_someone_listens() {
        let announcer = Announcer::new(4);
        assert!(!announcer.is_heard());
        let mut first = announcer.subscribe();
        let second = announcer.subscribe();
        assert!(announcer.is_heard());
        announcer.send(7);
        assert_eq!(first.recv().await.unwrap(), 7);
        drop(second);
        assert!(announcer.is_heard(), "one still listens");
        drop(first);
        assert!(!announcer.is_heard());
    }
}
