//! Replica pools: how a request waits in a pool's FIFO queue, takes a slot on a ready replica, and
//! starts more replicas when demand exceeds the slots on their way. Kept apart from `mod.rs` as a
//! second `impl Fleet` block so the single-instance path and the pool path each read on their own.

use std::collections::HashMap;
use std::time::Duration;

use super::acquire::{backoff_error, failed_start};
use super::instance::Instance;
use super::lease::{Lease, Ticket};
use super::prefix::{Holder, Prefix};
use super::prepare::Prepared;
use super::{pick, Fleet, Phase, State};
use crate::config::Balance;
use crate::error::Error;

impl Fleet {
    pub(super) async fn acquire_pool(
        &self,
        pool: &str,
        avoid: Option<&str>,
        prompt: Option<&Prefix>,
    ) -> Result<Lease, Error> {
        let ticket = {
            let mut st = self.inner.lock();
            let st = &mut *st;
            let p = st.pools.get_mut(pool).ok_or(Error::UnknownModel)?;
            if p.queue.len() >= p.settings.queue_depth.max(1) {
                return Err(Error::Busy {
                    status: 429,
                    message: format!(
                        "all replicas of {pool} are busy and its queue is full ({} waiting)",
                        p.queue.len()
                    ),
                    retry_after: 1,
                });
            }
            st.next_ticket += 1;
            p.queue.push_back(st.next_ticket);
            Ticket {
                inner: self.inner.clone(),
                pool: pool.to_string(),
                id: st.next_ticket,
            }
        };
        let timeout = self
            .inner
            .lock()
            .pools
            .get(pool)
            .map_or(Duration::from_secs(60), |p| p.settings.queue_timeout);
        let deadline = tokio::time::Instant::now() + timeout;
        let mut awaited: HashMap<String, u64> = HashMap::new();
        loop {
            let notified = self.inner.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = self.inner.lock();
                self.check_open(pool)?;
                if !st.pools.contains_key(pool) {
                    return Err(Error::UnknownModel); // removed by a reload while waiting
                }
                if let Some(lease) = self.try_pick(&mut st, pool, ticket.id, avoid, prompt) {
                    return Ok(lease);
                }
                self.grow_pool(&mut st, pool, avoid, &mut awaited)?;
            }
            tokio::select! {
                _ = notified => {}
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

    /// Takes a slot for the ticket when its place in the queue is within the free slots.
    fn try_pick(
        &self,
        st: &mut State,
        pool: &str,
        ticket: u64,
        avoid: Option<&str>,
        prompt: Option<&Prefix>,
    ) -> Option<Lease> {
        let p = &st.pools[pool];
        let round_robin = p.settings.balance == Balance::RoundRobin;
        let prompt = prompt.filter(|_| p.settings.balance == Balance::Prefix);
        let holder = prompt.and_then(|pr| p.prefixes.longest(pr));
        let position = p.queue.iter().position(|t| *t == ticket)?;
        let members: Vec<&Instance> = p.members.iter().map(|m| &st.instances[m]).collect();
        let candidates: Vec<pick::Candidate> = members
            .iter()
            .enumerate()
            .filter(|(_, i)| i.phase == Phase::Ready && Some(i.id.as_str()) != avoid)
            .filter(|(_, i)| self.conflict_free(st, &i.id))
            .map(|(index, i)| pick::Candidate {
                index,
                // round-robin sends regardless of slots: every ready replica always takes one more
                free: if round_robin { 1 } else { i.free_slots() },
                last_picked: i.last_picked,
            })
            .collect();
        let free: usize = candidates.iter().map(|c| c.free).sum();
        if !round_robin && position >= free {
            return None;
        }
        let index = pick::pick_preferring(&candidates, holder.map(|h| h.member))?;
        let chosen = members[index].id.clone();
        if let Some(prompt) = prompt {
            self.remember_prefix(st, pool, prompt, holder, index);
        }
        st.picks += 1;
        let picks = st.picks;
        let inst = st.instances.get_mut(&chosen).expect("member");
        inst.in_flight += 1;
        inst.last_picked = picks;
        let proxy = inst.proxy.clone();
        st.pools
            .get_mut(pool)
            .expect("pool")
            .queue
            .retain(|t| *t != ticket);
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

    /// Starts replicas when waiting requests exceed the slots on their way; fails when none can serve.
    fn grow_pool(
        &self,
        st: &mut State,
        pool: &str,
        avoid: Option<&str>,
        awaited: &mut HashMap<String, u64>,
    ) -> Result<(), Error> {
        let p = &st.pools[pool];
        let members = p.members.clone();
        let waiting = p.queue.len();
        let start_all = p.settings.start_all;
        let mut failed = Vec::new();
        for m in &members {
            let inst = &st.instances[m];
            if let Some(err) = awaited.get(m).and_then(|g| failed_start(inst, Some(*g))) {
                failed.push((m.clone(), err));
            }
        }
        let usable =
            |i: &Instance| Some(i.id.as_str()) != avoid && !failed.iter().any(|(f, _)| *f == i.id);
        let ready_free: usize = members
            .iter()
            .map(|m| &st.instances[m])
            .filter(|i| i.phase == Phase::Ready && usable(i))
            .map(|i| i.free_slots())
            .sum();
        let coming: usize = members
            .iter()
            .map(|m| &st.instances[m])
            .filter(|i| i.phase == Phase::Starting)
            .map(|i| i.slots)
            .sum();
        let alive = members.iter().map(|m| &st.instances[m]).any(|i| {
            matches!(i.phase, Phase::Ready | Phase::Starting | Phase::Stopping) && usable(i)
        });
        let startable: Vec<String> = members
            .iter()
            .filter(|m| {
                let i = &st.instances[*m];
                i.phase == Phase::Stopped && !i.in_backoff() && usable(i)
            })
            .cloned()
            .collect();
        if !alive && startable.is_empty() {
            let reason = failed.first().map(|(_, e)| e.to_string()).or_else(|| {
                members
                    .iter()
                    .map(|m| &st.instances[m])
                    .find(|i| i.in_backoff())
                    .map(|i| backoff_error(i).to_string())
            });
            return Err(match reason {
                Some(r) => Error::Busy {
                    status: 503,
                    message: format!("no replica of {pool} can serve: {r}"),
                    retry_after: 1,
                },
                None => Error::Busy {
                    status: 503,
                    message: format!("no replica of {pool} can serve"),
                    retry_after: 1,
                },
            });
        }
        let demand = waiting.saturating_sub(ready_free);
        if demand == 0 && alive {
            return Ok(());
        }
        let mut capacity = coming;
        for m in startable {
            if !start_all && capacity >= demand && alive {
                break;
            }
            if let Prepared::Started(g) = self.prepare(st, &m, None) {
                awaited.insert(m.clone(), g);
                capacity += st.instances[&m].slots;
            }
            if !start_all && capacity >= demand.max(1) {
                break;
            }
        }
        Ok(())
    }
}
