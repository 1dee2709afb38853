//! Where finished captures are kept: their bytes copied one after another into one buffer that
//! wraps at the budget, the oldest overwritten first.
//!
//! A capture is built by the thread that serves its request, in a buffer of that thread's, and
//! freed by it once copied here. Kept as they were (each capture's own buffer in a list), captures
//! were freed by whichever thread's newer capture pushed them out: under load half of them went
//! back to the other serving thread's malloc arena, whose lock the two threads then fought over.

use std::borrow::Cow;
use std::collections::VecDeque;

/// Kept captures' bytes and what each says of them (`M`), oldest first, in `budget` bytes.
pub struct Ring<M> {
    budget: usize,
    /// A circle of `budget` bytes once full; grows (by doubling) until then.
    bytes: Vec<u8>,
    /// Where the next capture's bytes go: right after the newest's, and before the oldest's.
    next: usize,
    /// The bytes of all kept captures.
    kept: usize,
    /// In the order they came, each from where it starts, running on past the end of the circle
    /// into its start when it must.
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
            kept: 0,
            items: VecDeque::new(),
        }
    }

    /// Keeps `parts`, one after another, under `id`, dropping the oldest captures until they fit;
    /// false (nothing kept) when they are larger than the whole budget.
    pub fn put(&mut self, id: u64, parts: &[&[u8]], meta: M) -> bool {
        let len: usize = parts.iter().map(|part| part.len()).sum();
        if len > self.budget {
            return false;
        }
        // the free bytes follow the newest capture and end where the oldest begins
        while self.kept + len > self.budget {
            let oldest = self
                .items
                .pop_front()
                .expect("kept bytes belong to kept captures");
            self.kept -= oldest.len;
        }
        let at = self.next;
        let mut to = at;
        for part in parts.iter().filter(|part| !part.is_empty()) {
            let first = part.len().min(self.budget - to);
            self.write(to, &part[..first]);
            if first < part.len() {
                // a part that meets the end of the circle runs on at its start
                self.write(0, &part[first..]);
            }
            to += part.len();
            if to >= self.budget {
                to -= self.budget;
            }
        }
        self.items.push_back(Kept { id, at, len, meta });
        self.kept += len;
        self.next = to;
        true
    }

    fn write(&mut self, at: usize, data: &[u8]) {
        debug_assert!(
            at <= self.bytes.len(),
            "captures are written one after another"
        );
        let end = at + data.len();
        if end > self.bytes.capacity() {
            let grown = (self.bytes.capacity() * 2).clamp(end, self.budget);
            self.bytes.reserve_exact(grown - self.bytes.len());
        }
        // over older bytes where there are some, and past the end (not zeroed first) while the
        // circle is still filling
        let over = (self.bytes.len() - at).min(data.len());
        self.bytes[at..at + over].copy_from_slice(&data[..over]);
        self.bytes.extend_from_slice(&data[over..]);
    }

    /// The bytes kept under `id` (copied only when they run past the end of the circle), and
    /// what was said of them.
    pub fn get(&self, id: u64) -> Option<(Cow<'_, [u8]>, &M)> {
        let k = self.items.iter().rev().find(|k| k.id == id)?;
        let first = k.len.min(self.budget - k.at);
        let head = &self.bytes[k.at..k.at + first];
        let bytes = if first == k.len {
            Cow::Borrowed(head)
        } else {
            Cow::Owned([head, &self.bytes[..k.len - first]].concat())
        };
        Some((bytes, &k.meta))
    }

    /// The bytes of all kept captures.
    #[cfg(test)]
    pub fn kept_bytes(&self) -> usize {
        self.kept
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

    /// The bytes of capture `id`: `len` bytes, each telling its capture and its place.
    fn data(id: u64, len: usize) -> Vec<u8> {
        (0..len).map(|i| (id * 31 + i as u64) as u8).collect()
    }

    /// `data` cut into up to three parts, where `seed` says.
    fn in_parts(data: &[u8], seed: u64) -> Vec<&[u8]> {
        let a = (seed as usize * 7) % (data.len() + 1);
        let b = a + (seed as usize * 13) % (data.len() - a + 1);
        vec![&data[..a], &data[a..b], &data[b..]]
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
                prop_assert_eq!(ring.put(id, &in_parts(&data(id, len), id), len), len <= budget);
                if len <= budget {
                    put.push(id);
                }
                for kept in ring.ids() {
                    let (bytes, &len) = ring.get(kept).unwrap();
                    prop_assert_eq!(&bytes[..], &data(kept, len)[..]);
                }
                prop_assert!(ring.kept_bytes() <= budget);
                prop_assert!(ring.bytes.capacity() <= budget);
                // kept: as many of the newest as fit the budget together, as before a ring
                let mut room = budget;
                let fit = put
                    .iter()
                    .rev()
                    .take_while(|&&id| {
                        let fits = sizes[id as usize] <= room;
                        room = room.saturating_sub(sizes[id as usize]);
                        fits
                    })
                    .count();
                prop_assert_eq!(&ring.ids()[..], &put[put.len() - fit..]);
            }
        }
    }

    /// The oldest go first, only as many as the newest needs room for, and a capture that meets
    /// the end of the circle runs on at its start.
    #[test]
    fn the_oldest_make_room() {
        let mut ring = Ring::new(10);
        for id in 0..5 {
            assert!(ring.put(id, &[&data(id, 2)], ()));
        }
        assert_eq!(ring.ids(), [0, 1, 2, 3, 4]);
        assert!(ring.put(5, &[&data(5, 3)], ()));
        assert_eq!(ring.ids(), [2, 3, 4, 5], "two made room");
        assert!(ring.put(6, &[&data(6, 4)], ()));
        assert_eq!(ring.ids(), [4, 5, 6]);
        assert!(ring.put(7, &[&data(7, 4)], ()));
        assert_eq!(ring.ids(), [6, 7]);
        assert_eq!(
            ring.get(7).unwrap().0,
            &data(7, 4)[..],
            "runs on at the start"
        );
        assert!(!ring.put(8, &[&data(8, 11)], ()), "larger than the budget");
        assert_eq!(ring.ids(), [6, 7]);
        assert!(ring.put(9, &[&data(9, 10)], ()));
        assert_eq!(ring.ids(), [9]);
        assert_eq!(ring.get(9).unwrap().0, &data(9, 10)[..]);
    }

    /// A capture given in parts is kept as one, in their order, even when the end of the circle
    /// falls inside a part or between two.
    #[test]
    fn parts_are_kept_one_after_another() {
        let mut ring = Ring::new(10);
        assert!(ring.put(1, &[&b"abcdefgh"[..]], ()));
        assert!(ring.put(2, &[&b"xy"[..], &b""[..], &b"z"[..]], ()));
        assert_eq!(ring.get(2).unwrap().0, &b"xyz"[..], "the end between parts");
        assert!(ring.put(3, &[&b"lmnop"[..]], ()));
        assert_eq!(ring.ids(), [2, 3]);
        assert!(ring.put(4, &[&b"qr"[..], &b"stuv"[..]], ()));
        assert_eq!(ring.ids(), [4]);
        assert_eq!(
            ring.get(4).unwrap().0,
            &b"qrstuv"[..],
            "the end inside a part"
        );
    }

    /// A budget of nothing keeps only empty captures.
    #[test]
    fn a_budget_of_nothing_keeps_nothing() {
        let mut ring = Ring::new(0);
        assert!(!ring.put(1, &[&b"x"[..]], ()));
        assert!(ring.put(2, &[&b""[..], &b""[..]], ()));
        assert_eq!(ring.get(2).unwrap().0, &b""[..]);
        assert_eq!(ring.ids(), [2]);
    }
}
