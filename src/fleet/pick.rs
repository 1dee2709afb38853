//! Choosing a replica: the ready one with the most free slots, ties to the least recently picked;
//! with a preferred replica (the one holding the prompt's prefix), that one while it has a free slot.

/// What the picker needs to know of one replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub index: usize,
    pub free: usize,
    /// A counter value; lower means picked longer ago.
    pub last_picked: u64,
}

/// The best candidate with a free slot, if any.
pub fn pick(candidates: &[Candidate]) -> Option<usize> {
    candidates
        .iter()
        .filter(|c| c.free > 0)
        .max_by(|a, b| a.free.cmp(&b.free).then(b.last_picked.cmp(&a.last_picked)))
        .map(|c| c.index)
}

/// The preferred candidate when it has a free slot, else the best free one: a request never waits
/// for the preferred replica while another has room.
pub fn pick_preferring(candidates: &[Candidate], preferred: Option<usize>) -> Option<usize> {
    preferred
        .filter(|p| candidates.iter().any(|c| c.index == *p && c.free > 0))
        .or_else(|| pick(candidates))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(index: usize, free: usize, last_picked: u64) -> Candidate {
        Candidate {
            index,
            free,
            last_picked,
        }
    }

    #[test]
    fn most_free_slots_wins() {
        assert_eq!(pick(&[c(0, 1, 0), c(1, 3, 9), c(2, 2, 0)]), Some(1));
    }

    #[test]
    fn ties_go_to_the_least_recently_picked() {
        assert_eq!(pick(&[c(0, 2, 5), c(1, 2, 3), c(2, 2, 4)]), Some(1));
    }

    #[test]
    fn nothing_free_means_no_pick() {
        assert_eq!(pick(&[c(0, 0, 0), c(1, 0, 0)]), None);
        assert_eq!(pick(&[]), None);
    }

    #[test]
    fn the_preferred_replica_wins_while_it_has_a_free_slot() {
        // replica 1 has fewer free slots and was picked more recently, yet holds the prefix
        assert_eq!(pick_preferring(&[c(0, 3, 0), c(1, 1, 9)], Some(1)), Some(1));
    }

    #[test]
    fn a_busy_preferred_replica_falls_back_to_the_free_one() {
        assert_eq!(pick_preferring(&[c(0, 1, 9), c(1, 0, 0)], Some(1)), Some(0));
    }

    #[test]
    fn a_preferred_replica_that_is_not_a_candidate_falls_back() {
        // not ready, or the member a retry avoids
        assert_eq!(pick_preferring(&[c(0, 1, 0), c(2, 2, 0)], Some(1)), Some(2));
        assert_eq!(pick_preferring(&[c(0, 1, 0)], None), Some(0));
    }

    /// Every request to the same prefix, one at a time: none waits while a slot is free anywhere.
    #[test]
    fn a_burst_on_one_prefix_never_waits_while_another_replica_is_free() {
        let mut used = [0usize; 3];
        for _ in 0..6 {
            let cands: Vec<_> = (0..3).map(|i| c(i, 2 - used[i], 0)).collect();
            let i = pick_preferring(&cands, Some(0)).expect("a slot is free");
            used[i] += 1;
        }
        assert_eq!(used, [2, 2, 2]);
        let full: Vec<_> = (0..3).map(|i| c(i, 0, 0)).collect();
        assert_eq!(pick_preferring(&full, Some(0)), None);
    }

    /// Simulates a burst: picking and reserving one slot at a time never oversubscribes and spreads evenly.
    #[test]
    fn a_burst_fills_replicas_evenly_and_never_beyond_their_slots() {
        for (replicas, slots) in [(2usize, 2usize), (3, 4), (4, 1)] {
            let mut used = vec![0usize; replicas];
            let mut last = vec![0u64; replicas];
            for t in 1..=(replicas * slots + 3) as u64 {
                let cands: Vec<_> = (0..replicas)
                    .map(|i| c(i, slots - used[i], last[i]))
                    .collect();
                match pick(&cands) {
                    Some(i) => {
                        used[i] += 1;
                        last[i] = t;
                    }
                    None => assert!(used.iter().all(|u| *u == slots)),
                }
            }
            assert!(used.iter().all(|u| *u == slots), "{used:?}");
        }
    }
}
