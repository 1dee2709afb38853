//! Host memory for sleepers: an engine put to sleep at level 1 keeps its weights in host memory,
//! so a sleep is decided only where the host has room for them, making room by stopping older
//! sleepers first.

use std::time::Instant;

/// A sleeping instance that holds host memory.
#[derive(Debug, Clone)]
pub struct Sleeper {
    pub id: String,
    /// What it holds in host memory.
    pub bytes: u64,
    /// When it was last used: the oldest sleepers are stopped first.
    pub last_used: Instant,
}

/// Which sleepers to stop, oldest first, so that `need` fits in the host memory free now
/// (`room`); `None` when stopping them all would not make room.
pub fn make_host_room(room: u64, need: u64, sleepers: &[Sleeper]) -> Option<Vec<String>> {
    let mut oldest_first: Vec<&Sleeper> = sleepers.iter().collect();
    oldest_first.sort_by_key(|s| s.last_used);
    let mut free = room;
    let mut stops = Vec::new();
    for s in oldest_first {
        if free >= need {
            break;
        }
        free = free.saturating_add(s.bytes);
        stops.push(s.id.clone());
    }
    (free >= need).then_some(stops)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_oldest_sleepers_make_room_and_none_is_stopped_in_vain() {
        let now = Instant::now();
        let sleeper = |id: &str, gib: u64, age: u64| Sleeper {
            id: id.into(),
            bytes: gib << 30,
            last_used: now - Duration::from_secs(age),
        };
        let sleepers = [
            sleeper("new", 4, 1),
            sleeper("old", 4, 100),
            sleeper("mid", 4, 50),
        ];
        assert_eq!(make_host_room(8 << 30, 8 << 30, &sleepers), Some(vec![]));
        assert_eq!(
            make_host_room(1 << 30, 8 << 30, &sleepers),
            Some(vec!["old".to_string(), "mid".to_string()])
        );
        assert_eq!(make_host_room(0, 13 << 30, &sleepers), None);
    }
}
