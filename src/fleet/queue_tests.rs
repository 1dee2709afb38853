//! The pool queue driven as `pool.rs` drives it: requests arrive and leave, slots come back, and
//! waiters wake in any order and try to take one.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;

#[test]
fn a_later_arrival_waits_while_the_only_free_slot_is_an_earlier_ones() {
    let mut q = Queue::default();
    assert!(q.join(1, 8) && q.join(2, 8));
    assert_eq!(q.may_take(2, 1), Some(false));
    assert_eq!(q.may_take(1, 1), Some(true));
    assert_eq!(q.may_take(2, 2), Some(true));
    q.leave(1);
    assert_eq!(q.may_take(2, 1), Some(true));
    assert_eq!(q.may_take(1, 1), None, "served: no longer queued");
}

#[test]
fn a_full_queue_refuses_and_an_empty_depth_still_takes_one() {
    let mut q = Queue::default();
    assert!(q.join(1, 2) && q.join(2, 2));
    assert!(!q.join(3, 2));
    assert_eq!(q.len(), 2);
    let mut unbounded_by_mistake = Queue::default();
    assert!(unbounded_by_mistake.join(1, 0));
    assert!(!unbounded_by_mistake.join(2, 0));
}

#[derive(Debug, Clone)]
enum Step {
    Arrive,
    /// The waiter at this place (modulo the queue's length) wakes and tries.
    Try(usize),
    /// The waiter at this place gives up (its client left).
    Leave(usize),
    /// A slot comes back (a request ended, a replica became ready).
    Free,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        3 => Just(Step::Arrive),
        4 => (0usize..8).prop_map(Step::Try),
        1 => (0usize..8).prop_map(Step::Leave),
        2 => Just(Step::Free),
    ];
    prop::collection::vec(step, 0..60)
}

/// What happened to the requests of one run.
#[derive(Default)]
struct Outcome {
    joined: Vec<u64>,
    served: Vec<u64>,
    left: Vec<u64>,
}

proptest! {
    /// Whatever order waiters wake in: a request is served only when every earlier one still
    /// waiting could be served too (with one free slot, only the oldest is), the queue never
    /// holds more than its depth, and every request that joined is exactly one of served, gone
    /// or still waiting: none is lost or served twice between the queue and its lease.
    #[test]
    fn the_queue_is_served_in_arrival_order_and_loses_no_request(
        steps in steps(),
        depth in 1usize..6,
    ) {
        let (mut q, mut free, mut next) = (Queue::default(), 0usize, 0u64);
        let mut out = Outcome::default();
        let mut waiting: Vec<u64> = Vec::new(); // the model: arrival order
        for step in steps {
            match step {
                Step::Arrive => {
                    next += 1;
                    if q.join(next, depth) {
                        out.joined.push(next);
                        waiting.push(next);
                    }
                }
                Step::Try(n) if !waiting.is_empty() => {
                    let ticket = waiting[n % waiting.len()];
                    if q.may_take(ticket, free) == Some(true) {
                        let head = waiting[0];
                        prop_assert!(free > 1 || ticket == head, "took the oldest's only slot");
                        q.leave(ticket);
                        waiting.retain(|t| *t != ticket);
                        free -= 1;
                        out.served.push(ticket);
                        for earlier in waiting.iter().filter(|t| **t < ticket) {
                            prop_assert_eq!(q.may_take(*earlier, free), Some(true), "{} left without a slot", earlier);
                        }
                    }
                }
                Step::Leave(n) if !waiting.is_empty() => {
                    let ticket = waiting.remove(n % waiting.len());
                    q.leave(ticket);
                    out.left.push(ticket);
                }
                Step::Free => free += 1,
                Step::Try(_) | Step::Leave(_) => {}
            }
            prop_assert!(q.len() <= depth);
            prop_assert_eq!(q.len(), waiting.len());
            for (place, t) in waiting.iter().enumerate() {
                prop_assert_eq!(q.may_take(*t, place), Some(false), "{} out of arrival order", t);
                prop_assert_eq!(q.may_take(*t, place + 1), Some(true), "{} out of arrival order", t);
            }
        }
        let served: BTreeSet<u64> = out.served.iter().copied().collect();
        prop_assert_eq!(served.len(), out.served.len(), "served twice");
        let mut accounted: Vec<u64> = out.served.iter().chain(&out.left).chain(&waiting).copied().collect();
        accounted.sort_unstable();
        prop_assert_eq!(accounted, out.joined);
    }
}
