//! Load-aware peers. When several peers serve a model, a request goes to the one with the least
//! work: each corral serves `GET /api/load` (requests running and waiting per model), and corral
//! reads it from every peer that shares a model with another, about once a second. Between two
//! readings, each pick counts as one more request on that peer, so a burst spreads out instead of
//! all landing on the peer that was idlest a moment ago. A peer that fails a request before
//! answering, or fails its reading, is held out for a few seconds (a circuit per peer) unless every
//! candidate is.
//!
//! A report is a peer's word, and a peer may lie: its size is capped ([`REPORT_MAX`]), each count
//! is clamped to [`MOST_WORK`] and added without wrapping, and the requests corral itself has in
//! flight to a peer are the least work that peer is taken to have, so a peer that reports less
//! than that still gets no more than its share.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use serde_json::Value;

use crate::config::Config;
use crate::proxy::upstream::Upstream;

/// How often each peer's load is read.
const POLL_EVERY: Duration = Duration::from_secs(1);
/// How long a peer that failed is held out.
const HOLD_OUT: Duration = Duration::from_secs(5);
/// The largest load report read: about 50 bytes a model, so room for thousands of models; a
/// larger one is not read, and its peer is held out as if it had failed.
const REPORT_MAX: usize = 1 << 20;
/// The most work a report may claim for one model: a larger count is taken as this. Far above
/// what any peer runs, and far below where sums wrap.
const MOST_WORK: u64 = 1 << 20;

/// What is known of one peer.
#[derive(Debug, Default, Clone)]
struct PeerState {
    /// Requests running plus waiting, per model, from the last reading.
    load: BTreeMap<String, u64>,
    /// Picks of this peer, ever.
    picks: u64,
    /// Picks already made when the last reading was asked for: the reading may show those, and
    /// cannot show the ones after.
    reflected: u64,
    held_out_until: Option<Instant>,
    /// Requests corral has sent to this peer and not yet seen the end of, per model.
    in_flight: BTreeMap<String, u64>,
}

impl PeerState {
    fn held_out(&self, now: Instant) -> bool {
        self.held_out_until.is_some_and(|t| t > now)
    }

    /// The work the peer is taken to have for `model`: its last report and the picks since, and
    /// never less than what corral itself has in flight there.
    fn score(&self, model: &str) -> u64 {
        let reported = self.load.get(model).copied().unwrap_or(0);
        let since = self.picks.saturating_sub(self.reflected);
        let ours = self.in_flight.get(model).copied().unwrap_or(0);
        reported.saturating_add(since).max(ours)
    }

    /// A reading asked for when `asked_at` picks had been made: picks made while it was on its way
    /// still count on top of it.
    fn read(&mut self, load: BTreeMap<String, u64>, asked_at: u64) {
        self.load = load;
        self.reflected = asked_at.min(self.picks);
        self.held_out_until = None;
    }
}

/// The peers' loads, read in the background while this value lives.
pub struct PeerLoads {
    state: Arc<Mutex<BTreeMap<String, PeerState>>>,
    pollers: Vec<tokio::task::AbortHandle>,
}

impl Drop for PeerLoads {
    fn drop(&mut self) {
        for p in &self.pollers {
            p.abort();
        }
    }
}

impl PeerLoads {
    /// Starts reading the load of every peer that shares a model with another peer.
    pub fn start(config: &Config, clients: &BTreeMap<String, Arc<Upstream>>) -> PeerLoads {
        let state: Arc<Mutex<BTreeMap<String, PeerState>>> = Default::default();
        let pollers = shared_peers(config)
            .into_iter()
            .filter_map(|id| {
                let peer = config.peers.get(&id)?;
                let reading = Reading {
                    base: peer.proxy.trim_end_matches('/').into(),
                    key: peer.api_key.clone(),
                    client: clients.get(&id)?.clone(),
                };
                let task = tokio::spawn(poll(id, reading, state.clone()));
                Some(task.abort_handle())
            })
            .collect();
        PeerLoads { state, pollers }
    }

    /// The candidates in the order to try them: peers not held out first, least work first (ties
    /// keep the config's order); the first one counts as picked.
    pub fn rank(&self, candidates: &[String], model: &str) -> Vec<String> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let mut ranked: Vec<(bool, u64, usize, &String)> = candidates
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let s = state.get(id).cloned().unwrap_or_default();
                (s.held_out(now), s.score(model), i, id)
            })
            .collect();
        ranked.sort();
        let order: Vec<String> = ranked.into_iter().map(|(_, _, _, id)| id.clone()).collect();
        if let Some(first) = order.first() {
            state.entry(first.clone()).or_default().picks += 1;
        }
        order
    }

    /// A request to `peer` for `model` is on its way: it counts in the peer's work until the
    /// value returned is dropped (with the answer's body).
    pub fn sending(&self, peer: &str, model: &str) -> InFlight {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let s = state.entry(peer.to_string()).or_default();
        *s.in_flight.entry(model.to_string()).or_default() += 1;
        InFlight {
            state: self.state.clone(),
            peer: peer.to_string(),
            model: model.to_string(),
        }
    }

    /// A request to `peer` failed before any answer: hold it out for a while.
    pub fn failed(&self, peer: &str) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.entry(peer.to_string()).or_default().held_out_until = Some(Instant::now() + HOLD_OUT);
    }
}

/// A request corral has in flight to a peer, counted until it is dropped.
pub struct InFlight {
    state: Arc<Mutex<BTreeMap<String, PeerState>>>,
    peer: String,
    model: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some(s) = state.get_mut(&self.peer) else {
            return;
        };
        if let Some(n) = s.in_flight.get_mut(&self.model) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                s.in_flight.remove(&self.model);
            }
        }
    }
}

/// Peers that serve a model some other peer serves too: only their load decides anything.
fn shared_peers(config: &Config) -> Vec<String> {
    let mut owners: BTreeMap<&str, Vec<&String>> = BTreeMap::new();
    for (id, peer) in &config.peers {
        for m in &peer.models {
            owners.entry(m).or_default().push(id);
        }
    }
    let mut shared: Vec<String> = owners
        .values()
        .filter(|ids| ids.len() > 1)
        .flatten()
        .map(|id| id.to_string())
        .collect();
    shared.sort();
    shared.dedup();
    shared
}

struct Reading {
    /// The peer's base URL (a path prefix included).
    base: Arc<str>,
    key: Option<String>,
    client: Arc<Upstream>,
}

async fn poll(id: String, reading: Reading, state: Arc<Mutex<BTreeMap<String, PeerState>>>) {
    let mut tick = tokio::time::interval(POLL_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let asked_at = picks_of(&state, &id);
        let load = tokio::time::timeout(POLL_EVERY, read(&reading)).await;
        let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
        let s = state.entry(id.clone()).or_default();
        match load {
            Ok(Ok(load)) => s.read(load, asked_at),
            Ok(Err(failure)) => {
                if let Failure::Oversized = failure {
                    tracing::warn!(
                        "peer {id}: its load report is over {REPORT_MAX} bytes and was not read; \
                         the peer is held out"
                    );
                }
                s.held_out_until = Some(Instant::now() + HOLD_OUT);
            }
            Err(_) => s.held_out_until = Some(Instant::now() + HOLD_OUT),
        }
    }
}

fn picks_of(state: &Mutex<BTreeMap<String, PeerState>>, id: &str) -> u64 {
    let state = state.lock().unwrap_or_else(|e| e.into_inner());
    state.get(id).map_or(0, |s| s.picks)
}

/// Why a reading failed (a peer that answers without a load report is not this).
#[derive(Debug)]
enum Failure {
    /// The peer could not be reached, or its answer broke off.
    Unreachable,
    /// Its report was larger than [`REPORT_MAX`].
    Oversized,
}
use Failure::Unreachable;

async fn read(reading: &Reading) -> Result<BTreeMap<String, u64>, Failure> {
    let mut req = http::Request::get("/api/load");
    if let Some(key) = &reading.key {
        req = req.header(http::header::AUTHORIZATION, format!("Bearer {key}"));
    }
    let (parts, ()) = req.body(()).map_err(|_| Unreachable)?.into_parts();
    let out = crate::proxy::Outgoing {
        base: reading.base.clone(),
        path_and_query: "/api/load".into(),
        parts,
        body: crate::proxy::body::empty(),
        client_addr: None,
    };
    let resp = crate::proxy::forward(&reading.client, out, Some(POLL_EVERY), ())
        .await
        .map_err(|_| Unreachable)?;
    if !resp.status().is_success() {
        return Ok(BTreeMap::new()); // not a corral, or too old to report: no load known
    }
    let body = read_capped(resp.into_body(), REPORT_MAX).await?;
    Ok(parse_report(&body))
}

/// A body read whole, unless it is larger than `max` bytes.
async fn read_capped(
    mut body: crate::proxy::body::Body,
    max: usize,
) -> Result<bytes::Bytes, Failure> {
    let mut read = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(|_| Unreachable)?.into_data() else {
            continue; // trailers
        };
        if read.len() + data.len() > max {
            return Err(Failure::Oversized);
        }
        read.extend_from_slice(&data);
    }
    Ok(read.freeze())
}

/// `{"models": {"m": {"running": 1, "waiting": 2}}}` as work per model, each count and their sum
/// at most [`MOST_WORK`].
fn parse_report(body: &[u8]) -> BTreeMap<String, u64> {
    let Ok(Value::Object(report)) = serde_json::from_slice::<Value>(body) else {
        return BTreeMap::new();
    };
    let Some(Value::Object(models)) = report.get("models") else {
        return BTreeMap::new();
    };
    // a count that is not a whole number is no count: a peer that lies low is bounded by the
    // requests corral has in flight to it, not by what it says
    let work = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    let total = |v: &Value| {
        work(v, "running")
            .saturating_add(work(v, "waiting"))
            .min(MOST_WORK)
    };
    models.iter().map(|(m, v)| (m.clone(), total(v))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loads(entries: &[(&str, u64)]) -> PeerLoads {
        let state = entries
            .iter()
            .map(|(id, n)| {
                let load = BTreeMap::from([("m".to_string(), *n)]);
                (
                    id.to_string(),
                    PeerState {
                        load,
                        ..Default::default()
                    },
                )
            })
            .collect();
        PeerLoads {
            state: Arc::new(Mutex::new(state)),
            pollers: Vec::new(),
        }
    }

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_least_loaded_peer_comes_first_and_picks_count_until_the_next_reading() {
        let l = loads(&[("a", 3), ("b", 1)]);
        let c = ids(&["a", "b"]);
        assert_eq!(l.rank(&c, "m"), ids(&["b", "a"]));
        assert_eq!(l.rank(&c, "m"), ids(&["b", "a"]), "b at 2, a at 3");
        assert_eq!(
            l.rank(&c, "m"),
            ids(&["a", "b"]),
            "b at 3: the config order breaks the tie"
        );
    }

    /// Picks made while a reading was on its way are not in it, so they still count after it.
    #[test]
    fn picks_made_while_a_reading_travels_outlive_it() {
        let l = loads(&[("a", 0), ("b", 0)]);
        let c = ids(&["a", "b"]);
        assert_eq!(l.rank(&c, "m")[0], "a");
        let asked_at = l.state.lock().unwrap()["a"].picks;
        for _ in 0..3 {
            l.rank(&c, "m"); // b, a, b: a has 2 picks, b 2
        }
        let fresh = BTreeMap::from([("m".to_string(), 1)]); // a's first request, still running
        l.state
            .lock()
            .unwrap()
            .get_mut("a")
            .unwrap()
            .read(fresh, asked_at);
        let state = l.state.lock().unwrap();
        assert_eq!(
            state["a"].score("m"),
            2,
            "the running request and the later pick"
        );
        assert_eq!(state["b"].score("m"), 2);
    }

    #[test]
    fn a_failed_peer_is_tried_last() {
        let l = loads(&[("a", 0), ("b", 5)]);
        l.failed("a");
        assert_eq!(l.rank(&ids(&["a", "b"]), "m"), ids(&["b", "a"]));
    }

    /// A report of more work than fits a number, or absurdly much, is clamped: the sum does not
    /// wrap to an idle-looking count.
    #[test]
    fn absurd_reports_are_clamped_and_never_wrap() {
        let r = parse_report(br#"{"models":{"m":{"running":18446744073709551615,"waiting":1}}}"#);
        assert_eq!(r["m"], MOST_WORK);
        let l = loads(&[("liar", r["m"]), ("honest", 0)]);
        let c = ids(&["liar", "honest"]);
        for _ in 0..10 {
            assert_eq!(l.rank(&c, "m")[0], "honest");
        }
    }

    /// A peer that reports no work still has the requests corral has in flight to it, until
    /// their answers end.
    #[test]
    fn a_peer_that_lies_low_is_held_to_the_requests_in_flight_to_it() {
        let l = loads(&[("liar", 0), ("honest", 0)]);
        let c = ids(&["liar", "honest"]);
        let sent: Vec<InFlight> = (0..3).map(|_| l.sending("liar", "m")).collect();
        let zero = || BTreeMap::from([("m".to_string(), 0)]);
        for id in ["liar", "honest"] {
            let mut state = l.state.lock().unwrap();
            let s = state.get_mut(id).unwrap();
            let asked_at = s.picks;
            s.read(zero(), asked_at);
        }
        assert_eq!(l.rank(&c, "m")[0], "honest", "liar at 3, honest at 0");
        assert_eq!(l.rank(&c, "m")[0], "honest", "liar at 3, honest at 1");
        assert_eq!(l.rank(&c, "m")[0], "honest", "liar at 3, honest at 2");
        drop(sent);
        assert_eq!(l.state.lock().unwrap()["liar"].score("m"), 0);
        assert_eq!(l.rank(&c, "m")[0], "liar", "its answers ended");
    }

    #[tokio::test]
    async fn a_report_over_the_cap_is_not_read() {
        let big = crate::proxy::body::full(vec![b' '; 100]);
        assert!(matches!(
            read_capped(big, 99).await,
            Err(Failure::Oversized)
        ));
        let fits = crate::proxy::body::full(vec![b' '; 99]);
        assert_eq!(read_capped(fits, 99).await.unwrap().len(), 99);
    }

    #[test]
    fn reports_parse() {
        let r = parse_report(br#"{"models":{"m":{"running":2,"waiting":3},"n":{}}}"#);
        assert_eq!(r, BTreeMap::from([("m".into(), 5), ("n".into(), 0)]));
        assert!(parse_report(b"not json").is_empty());
    }

    #[test]
    fn only_peers_that_share_a_model_are_read() {
        let yaml = "peers:\n  a: {proxy: 'http://127.0.0.1:1', models: [m, x]}\n  b: {proxy: 'http://127.0.0.1:2', models: [m]}\n  c: {proxy: 'http://127.0.0.1:3', models: [y]}\n";
        let config = crate::config::load_str("t.yaml", yaml, &|_| None)
            .unwrap()
            .config;
        assert_eq!(shared_peers(&config), ids(&["a", "b"]));
    }
}
