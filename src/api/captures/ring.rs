//! Where finished captures are kept: their bytes copied one after another into one buffer that
//! wraps at the budget, the oldest overwritten first.
//!
//! A capture is built by the thread that serves its request, in a buffer of that thread's, and
//! freed by it once copied here. Kept as they were (each capture's own buffer in a list), captures
//! were freed by whichever thread's newer capture pushed them out: under load half of them went
//! back to the other serving thread's malloc arena, whose lock the two threads then fought over.

use std::collections::VecDeque;

/// Kept captures' bytes and what each says of them (`M`), oldest first, in `budget` bytes.
pub struct Ring<M> {
    budget: usize,
    /// Grows as captures come, to the budget at most.
    bytes: Vec<u8>,
    /// Where the next capture's bytes go.
    next: usize,
    /// In the order they came. Those written since the buffer last wrapped lie from its start
    /// up to `next`, one after another; the older ones lie from `next` on, so the first in the list
    /// is the first in the way of the next capture.
    items: VecDeque<Kept<M>>,
}

struct Kept<M> {
    id: u64,
    at: usize,
    len: usize,
    meta: M,
}

impl<M> Ring<M> {
    pub fn new(budget: usize) -> Self {
        Ring {
            budget,
            bytes: Vec::new(),
            next: 0,
            items: VecDeque::new(),
        }
    }

    /// Keeps `data` under `id`, dropping the oldest captures in its way; false (nothing kept)
    /// when it is larger than the whole budget.
    pub fn put(&mut self, id: u64, data: &[u8], meta: M) -> bool {
        if data.len() > self.budget {
            return false;
        }
        if self.next + data.len() > self.budget {
            // too little room left before the end: what lies there goes, and writing starts over
            self.drop_in_way(self.next, usize::MAX);
            self.next = 0;
        }
        let (at, end) = (self.next, self.next + data.len());
        self.drop_in_way(at, end);
        self.write(at, data);
        self.items.push_back(Kept {
            id,
            at,
            len: data.len(),
            meta,
        });
        self.next = end;
        true
    }

    /// Drops the oldest captures while they start within `from..to`.
    fn drop_in_way(&mut self, from: usize, to: usize) {
        while self
            .items
            .front()
            .is_some_and(|k| (from..to).contains(&k.at))
        {
            self.items.pop_front();
        }
    }

    /// Copies `data` in at `at`, growing the buffer (by doubling, up to the budget) when it goes
    /// past what was written so far; nothing kept lies past `at` then.
    fn write(&mut self, at: usize, data: &[u8]) {
        let end = at + data.len();
        if end <= self.bytes.len() {
            self.bytes[at..end].copy_from_slice(data);
            return;
        }
        self.bytes.truncate(at);
        if end > self.bytes.capacity() {
            let grown = (self.bytes.capacity() * 2).clamp(end, self.budget);
            self.bytes.reserve_exact(grown - self.bytes.len());
        }
        self.bytes.extend_from_slice(data);
    }

    /// The bytes kept under `id`, and what was said of them.
    pub fn get(&self, id: u64) -> Option<(&[u8], &M)> {
        let k = self.items.iter().rev().find(|k| k.id == id)?;
        Some((&self.bytes[k.at..k.at + k.len], &k.meta))
    }

    /// The bytes of all kept captures.
    #[cfg(test)]
    pub fn kept_bytes(&self) -> usize {
        self.items.iter().map(|k| k.len).sum()
    }

    /// The ids kept, oldest first.
    #[cfg(test)]
    pub fn ids(&self) -> Vec<u64> {
        self.items.iter().map(|k| k.id).collect()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The bytes of capture `id`: `len` bytes, each telling its capture.
    fn data(id: u64, len: usize) -> Vec<u8> {
        vec![id as u8; len]
    }

    proptest! {
        /// Whatever the sizes, the newest captures that fit the budget together are kept, each
        /// with its own bytes, and the buffer never grows past the budget.
        #[test]
        fn the_newest_captures_are_kept_whole(
            budget in 1usize..400,
            sizes in proptest::collection::vec(0usize..200, 1..60),
        ) {
            let mut ring = Ring::new(budget);
            let mut put = Vec::new();
            for (id, &len) in sizes.iter().enumerate() {
                let id = id as u64;
                prop_assert_eq!(ring.put(id, &data(id, len), len), len <= budget);
                if len <= budget {
                    put.push(id);
                }
                for kept in ring.ids() {
                    let (bytes, &len) = ring.get(kept).unwrap();
                    prop_assert_eq!(bytes, &data(kept, len)[..]);
                }
                prop_assert!(ring.kept_bytes() <= budget);
                prop_assert!(ring.bytes.capacity() <= budget);
                // kept: the newest of those put, none left out between
                let ids = ring.ids();
                prop_assert_eq!(&ids[..], &put[put.len() - ids.len()..]);
                if len <= budget {
                    prop_assert_eq!(ids.last(), Some(&id));
                }
            }
        }
    }

    /// The oldest go first, and only as many as the newest needs room for.
    #[test]
    fn the_oldest_make_room() {
        let mut ring = Ring::new(10);
        for id in 0..5 {
            assert!(ring.put(id, &data(id, 2), ()));
        }
        assert_eq!(ring.ids(), [0, 1, 2, 3, 4]);
        assert!(ring.put(5, &data(5, 3), ()));
        assert_eq!(ring.ids(), [2, 3, 4, 5], "two made room at the start");
        assert!(ring.put(6, &data(6, 4), ()));
        assert_eq!(ring.ids(), [4, 5, 6]);
        assert!(!ring.put(7, &data(7, 11), ()), "larger than the budget");
        assert_eq!(ring.ids(), [4, 5, 6]);
        assert!(ring.put(8, &data(8, 10), ()));
        assert_eq!(ring.ids(), [8]);
    }
}
