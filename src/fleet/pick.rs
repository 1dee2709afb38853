//! Choosing a replica: the ready one with the most free slots, ties to the least recently picked.

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
