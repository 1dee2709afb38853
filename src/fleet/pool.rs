//! Replica pools: how a request waits in a pool's FIFO queue, takes a slot on a ready replica, and
//! starts more replicas when demand exceeds the slots on their way. Kept apart from `mod.rs` as a
//! second `impl Fleet` block so the single-instance path and the pool path each read on their own.

use std::collections::HashMap;
use std::time::Duration;

use super::acquire::{backoff_error, failed_start};
use super::grow_plan::{plan_growth, Growth, Member};
use super::instance::Instance;
use super::lease::{Lease, Ticket};
use super::prefix::{Holder, Prefix};
use super::prepare::Prepared;
use super::{pick, Fleet, PhaseName, Retire, State};
use crate::config::Balance;
use crate::proxy::error::Error;

/// What one waiting request asks of its pool.
struct Wants<'a> {
    ticket: u64,
    /// A member not to pick (the one a retry left).
    avoid: Option<&'a str>,
    /// The prompt's block hashes, for `balance: prefix`.
    prompt: Option<&'a Prefix>,
    /// Still within `prefixWait`: a busy holder of the prefix is waited for.
    holding_out: bool,
}

/// True when the replica holding the prefix is ready but has no free slot.
fn busy_holder(candidates: &[pick::Candidate], holder: usize) -> bool {
    candidates.iter().any(|c| c.index == holder && c.free == 0)
}

/// The slots the pool's ready members have free now (a ready member of a round-robin pool always
/// takes one more).
fn free_slots(st: &State, pool: &str) -> usize {
    let Some(p) = st.pools.get(pool) else {
        return 0;
    };
    let round_robin = p.settings.balance == Balance::RoundRobin;
    p.members
        .iter()
        .map(|m| &st.instances[m])
        .filter(|i| i.phase.is_ready())
        .map(|i| if round_robin { 1 } else { i.free_slots() })
        .sum()
}

impl Fleet {
    pub(super) async fn acquire_pool(
        &self,
        pool: &str,
        avoid: Option<&str>,
        prompt: Option<&Prefix>,
    ) -> Result<Lease, Error> {
        let ticket = self.enqueue(pool)?;
        let (timeout, prefix_wait) = self.queue_timeouts(pool);
        let now = tokio::time::Instant::now();
        let deadline = crate::clock::deadline::after(now, timeout);
        // until then, a request waits for the replica holding its prefix rather than go elsewhere
        let prefer_until = crate::clock::deadline::after(now, prefix_wait);
        let mut awaited: HashMap<String, u64> = HashMap::new();
        loop {
            let waiter = self.inner.changed.waiter();
            let notified = waiter.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = self.inner.lock();
                self.check_open(pool)?;
                if !st.pools.contains_key(pool) {
                    return Err(Error::UnknownModel); // removed by a reload while waiting
                }
                let holding_out = tokio::time::Instant::now() < prefer_until;
                let wants = Wants {
                    ticket: ticket.id,
                    avoid,
                    prompt,
                    holding_out,
                };
                if let Some(lease) = self.try_pick(&mut st, pool, &wants) {
                    return Ok(lease);
                }
                self.grow_pool(&mut st, pool, avoid, &mut awaited)?;
            }
            let holding_out = tokio::time::Instant::now() < prefer_until;
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(prefer_until), if holding_out => {}
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(Error::Busy {
                        status: 503,
                        message: format!("no replica of {pool} had a free slot within {}s", timeout.as_secs()),
                        retry_after: 1,
                    });
                }
            }
        }
    }

    /// Takes a place at the back of the pool's queue, or refuses at once (429) when the queue is
    /// full, so a burst beyond what the pool can absorb is told to come back instead of waiting.
    /// The queue's places are those of requests that wait: one a free slot takes at once does not
    /// count against `queueDepth`, even while it is still choosing its replica.
    pub(super) fn enqueue(&self, pool: &str) -> Result<Ticket, Error> {
        let mut st = self.inner.lock();
        let st = &mut *st;
        let free = free_slots(st, pool);
        let p = st.pools.get_mut(pool).ok_or(Error::UnknownModel)?;
        let ticket = st.next_ticket + 1;
        if !p
            .queue
            .join(ticket, p.settings.queue_depth.saturating_add(free))
        {
            return Err(Error::Busy {
                status: 429,
                message: format!(
                    "all replicas of {pool} are busy and its queue is full ({} waiting)",
                    p.queue.len()
                ),
                retry_after: 1,
            });
        }
        st.next_ticket = ticket;
        Ok(Ticket {
            inner: self.inner.clone(),
            pool: pool.to_string(),
            id: st.next_ticket,
        })
    }

    /// How long a request may wait in the pool's queue (a minute for a pool a reload removed), and
    /// how long for the replica holding its prefix (`prefixWait`).
    fn queue_timeouts(&self, pool: &str) -> (Duration, Duration) {
        self.inner
            .lock()
            .pools
            .get(pool)
            .map_or((Duration::from_secs(60), Duration::ZERO), |p| {
                (p.settings.queue_timeout, p.settings.prefix_wait)
            })
    }

    /// Takes a slot for the ticket when its place in the queue is within the free slots.
    fn try_pick(&self, st: &mut State, pool: &str, wants: &Wants<'_>) -> Option<Lease> {
        let Wants {
            ticket,
            avoid,
            prompt,
            ..
        } = *wants;
        let p = &st.pools[pool];
        let round_robin = p.settings.balance == Balance::RoundRobin;
        let prompt = prompt.filter(|_| p.settings.balance == Balance::Prefix);
        let holder = prompt.and_then(|pr| p.prefixes.longest(pr));
        let members: Vec<&Instance> = p.members.iter().map(|m| &st.instances[m]).collect();
        let draining = draining(&members);
        let candidates: Vec<pick::Candidate> = members
            .iter()
            .enumerate()
            .filter(|(_, i)| i.phase.is_ready() && Some(&*i.id) != avoid)
            .filter(|(_, i)| Some(&*i.id) != draining)
            .filter(|(_, i)| self.conflict_free(st, &i.id))
            .map(|(index, i)| pick::Candidate {
                index,
                // round-robin sends regardless of slots: every ready replica always takes one more
                free: if round_robin { 1 } else { i.free_slots() },
                last_picked: i.last_picked,
            })
            .collect();
        let free: usize = candidates.iter().map(|c| c.free).sum();
        // round-robin takes no turns: it sends regardless of slots
        let first_come = p.queue.may_take(ticket, free)?;
        if !round_robin && !first_come {
            return None;
        }
        if wants.holding_out && holder.is_some_and(|h| busy_holder(&candidates, h.member)) {
            return None; // within prefixWait: wait for the holder's slot
        }
        let index = pick::pick_preferring(&candidates, holder.map(|h| h.member))?;
        let chosen = members[index].id.clone();
        if let Some(prompt) = prompt {
            self.remember_prefix(st, pool, prompt, holder, index);
        }
        st.picks += 1;
        let picks = st.picks;
        let inst = st.instances.get_mut(&*chosen).expect("member");
        inst.in_flight += 1;
        inst.last_picked = picks;
        let proxy = inst.proxy.clone();
        st.pools.get_mut(pool).expect("pool").queue.leave(ticket);
        Some(Lease {
            inner: self.inner.clone(),
            id: chosen,
            proxy,
            direct: false,
        })
    }

    /// Records the request's blocks for the chosen member, and counts a hit when it held them.
    fn remember_prefix(
        &self,
        st: &mut State,
        pool: &str,
        prompt: &Prefix,
        holder: Option<Holder>,
        chosen: usize,
    ) {
        let p = st.pools.get_mut(pool).expect("pool");
        p.prefixes.record(prompt, chosen);
        if let Some(h) = holder.filter(|h| h.member == chosen) {
            let model = st
                .catalog
                .pools
                .get(pool)
                .map_or(pool, |c| c.model.as_str());
            let c = &self.inner.counters;
            c.prefix_hits.with_label_values(&[model]).inc();
            c.prefix_matched_bytes
                .with_label_values(&[model])
                .inc_by(prompt.bytes_in(h.blocks) as u64);
        }
    }

    /// Starts replicas when waiting requests exceed the slots on their way (`grow_plan.rs`
    /// decides which); fails when none can serve.
    fn grow_pool(
        &self,
        st: &mut State,
        pool: &str,
        avoid: Option<&str>,
        awaited: &mut HashMap<String, u64>,
    ) -> Result<(), Error> {
        let p = &st.pools[pool];
        let members = p.members.clone();
        let (waiting, start_all) = (p.queue.len(), p.settings.start_all);
        let failed = failed_members(st, &members, awaited);
        let view = member_view(st, &members, avoid, &failed);
        let starts = match plan_growth(&view, waiting, start_all) {
            Growth::NoneCanServe => return Err(no_replica_error(st, pool, &members, &failed)),
            Growth::Wait => return Ok(()),
            Growth::Start(starts) => starts,
        };
        starts.carry_out(|m| match self.prepare(st, m, None) {
            // a stopped member starts; an asleep one wakes
            Prepared::Started(g) | Prepared::Starting(g) => {
                awaited.insert(m.to_string(), g);
                Some(st.instances[m].slots)
            }
            _ => None,
        });
        Ok(())
    }
}

/// Members whose start this request waited on and that failed it: passed over from then on, so
/// a request does not start a broken replica again and again.
fn failed_members(
    st: &State,
    members: &[String],
    awaited: &HashMap<String, u64>,
) -> Vec<(String, Error)> {
    members
        .iter()
        .filter_map(|m| {
            let member = &st.instances[m];
            // a start a reload called off was not the member's failure: its successor serves
            if member.retire != Retire::No {
                return None;
            }
            let err = awaited
                .get(m)
                .and_then(|g| failed_start(member, Some(*g)))?;
            Some((m.clone(), err))
        })
        .collect()
}

/// The pool's members as the growth decision sees them, the avoided and failed ones unusable.
fn member_view(
    st: &State,
    members: &[String],
    avoid: Option<&str>,
    failed: &[(String, Error)],
) -> Vec<Member> {
    let instances: Vec<&Instance> = members.iter().map(|m| &st.instances[m]).collect();
    let draining = draining(&instances);
    members
        .iter()
        .map(|m| {
            let i = &st.instances[m];
            let asleep = i.phase.is_asleep();
            Member {
                id: m.clone(),
                // an asleep member is brought back as a stopped one is, by a wake
                phase: match asleep {
                    true => PhaseName::Stopped,
                    false => i.phase.name(),
                },
                asleep,
                // a draining member's free slots are not the queue's
                free: if Some(m.as_str()) == draining {
                    0
                } else {
                    i.free_slots()
                },
                slots: i.slots,
                backing_off: i.in_backoff(),
                usable: Some(m.as_str()) != avoid && !failed.iter().any(|(f, _)| f == m),
            }
        })
        .collect()
}

/// The member a reload retired that takes no new requests, so that it can finish its own, stop
/// and make way for its successor: one at a time (the first in the pool's order) and only while
/// another member is ready to serve in its place, so that a busy pool is replaced member by
/// member (an instance retires once no request is in flight there).
fn draining<'a>(members: &[&'a Instance]) -> Option<&'a str> {
    let ready = members.iter().filter(|i| i.phase.is_ready()).count();
    if ready < 2 {
        return None;
    }
    members
        .iter()
        .find(|i| i.phase.is_ready() && i.retire != Retire::No)
        .map(|i| &*i.id)
}

/// Why no member of the pool can serve: a failed start this request saw, else a member's backoff.
fn no_replica_error(
    st: &State,
    pool: &str,
    members: &[String],
    failed: &[(String, Error)],
) -> Error {
    let reason = failed.first().map(|(_, e)| e.to_string()).or_else(|| {
        members
            .iter()
            .map(|m| &st.instances[m])
            .find(|i| i.in_backoff())
            .map(|i| backoff_error(i).to_string())
    });
    let message = match reason {
        Some(r) => format!("no replica of {pool} can serve: {r}"),
        None => format!("no replica of {pool} can serve"),
    };
    Error::Busy {
        status: 503,
        message,
        retry_after: 1,
    }
}

#[cfg(test)]
mod tests {
    use crate::fleet::testing::{fleet, make_ready};

    /// Two requests for a pool whose two replicas are idle are both let in with `queueDepth: 1`:
    /// neither waits, so neither counts against the depth, however close together they come.
    /// Past the free slots, the depth holds.
    #[tokio::test]
    async fn requests_that_free_slots_take_do_not_fill_the_queue() {
        let fleet = fleet(
            "models:\n  chat:\n    cmd: srv --port ${PORT} -np 1\n    replicas: 2\n    queueDepth: 1\n",
        );
        let _a = make_ready(&fleet, "chat-0");
        let _b = make_ready(&fleet, "chat-1");
        let first = fleet.enqueue("chat").expect("a free slot takes it");
        let second = fleet.enqueue("chat").expect("the other free slot takes it");
        let waiting = fleet.enqueue("chat").expect("one may wait");
        let refused = fleet.enqueue("chat").map(|_| ()).unwrap_err();
        assert!(refused.to_string().contains("queue is full"), "{refused}");
        drop((first, second, waiting));
    }
}
