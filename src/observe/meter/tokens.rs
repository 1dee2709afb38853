//! Token counts from an answer's `usage` (OpenAI, Anthropic) or `timings` (llama.cpp) value, found
//! by its key and read member by member ([`crate::observe::scan`]): nothing else of the answer is parsed.

use std::sync::LazyLock;

use memchr::memmem::Finder;

pub(crate) use crate::observe::counts::Tokens;
use crate::observe::scan::{self, count, float};

/// What a `usage` value holds, by the names OpenAI and Anthropic give it.
#[derive(Default)]
struct Usage {
    prompt_tokens: Option<u64>,
    input_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    /// `prompt_tokens_details.cached_tokens`
    prompt_cached: Option<u64>,
    /// `input_tokens_details.cached_tokens`
    input_cached: Option<u64>,
}

/// What llama.cpp's `timings` value holds.
#[derive(Default)]
struct Timings {
    prompt_n: Option<u64>,
    predicted_n: Option<u64>,
    cache_n: Option<u64>,
    draft_n: Option<u64>,
    draft_n_accepted: Option<u64>,
    prompt_per_second: Option<f64>,
    predicted_per_second: Option<f64>,
}

impl Tokens {
    /// Reads a JSON document's `usage`/`timings` into typed fields. Only those values are read:
    /// found by their keys (the same words inside a string have escaped quotes and do not match).
    /// Counts come from `usage` when it has them, else from `timings`; speeds, cache and draft
    /// counts from whichever carries them. A value with a member of the wrong type, or a member
    /// twice, is not read at all.
    pub fn from_slice(bytes: &[u8]) -> Option<Tokens> {
        let mut t = Tokens::default();
        let mut found = false;
        let (usage, timings) = values(bytes);
        if let Some(u) = usage.and_then(read_usage) {
            let prompt = u.prompt_tokens.or(u.input_tokens);
            let completion = u.completion_tokens.or(u.output_tokens);
            if prompt.is_some() || completion.is_some() {
                t.prompt = prompt.unwrap_or(0);
                t.completion = completion.unwrap_or(0);
                found = true;
            }
            t.cache = u
                .cache_read_input_tokens
                .or(u.prompt_cached)
                .or(u.input_cached);
        }
        if let Some(tm) = timings.and_then(read_timings) {
            if !found {
                t.prompt = tm.prompt_n.unwrap_or(0);
                t.completion = tm.predicted_n.unwrap_or(0);
                found = true;
            }
            t.cache = t.cache.or(tm.cache_n);
            t.draft = tm.draft_n;
            t.draft_accepted = tm.draft_n_accepted;
            t.prompt_per_second = tm.prompt_per_second;
            t.tokens_per_second = tm.predicted_per_second;
        }
        found.then_some(t)
    }
}

impl Tokens {
    /// The counts of a stream with `later`, read from one of its later events, added. A stream's
    /// counts only grow, and an event may give some of them alone: Anthropic's `message_start`
    /// gives the input's, its `message_delta` the output's. So each count is the most any event
    /// gave, and the rest is the latest given.
    pub fn then(self, later: Tokens) -> Tokens {
        Tokens {
            prompt: self.prompt.max(later.prompt),
            completion: self.completion.max(later.completion),
            cache: later.cache.or(self.cache),
            draft: later.draft.or(self.draft),
            draft_accepted: later.draft_accepted.or(self.draft_accepted),
            prompt_per_second: later.prompt_per_second.or(self.prompt_per_second),
            tokens_per_second: later.tokens_per_second.or(self.tokens_per_second),
        }
    }
}

/// The searchers for the two keys, built once: building one costs more than a search of a small
/// answer, and every JSON answer and event is searched. Forward searches, since only they are
/// vectorized.
pub(crate) static USAGE_KEY: LazyLock<Finder<'static>> =
    LazyLock::new(|| Finder::new(b"\"usage\""));
pub(crate) static TIMINGS_KEY: LazyLock<Finder<'static>> =
    LazyLock::new(|| Finder::new(b"\"timings\""));

/// The text from the `usage` value on and from the `timings` value on: each the value after the
/// last `"key":` in `bytes` (a string that reads like a key has no colon after it). An engine
/// writes `timings` after `usage`, past the answer's text, so that is searched first; the text
/// before `usage` only when nothing follows it.
fn values(bytes: &[u8]) -> (Option<&[u8]>, Option<&[u8]>) {
    let end = bytes.len();
    let Some((key, usage)) = last_value(bytes, &USAGE_KEY, 0, end) else {
        return (
            None,
            last_value(bytes, &TIMINGS_KEY, 0, end).map(|(_, v)| v),
        );
    };
    let after = key + USAGE_KEY.needle().len();
    let timings = last_value(bytes, &TIMINGS_KEY, after, end)
        .or_else(|| last_value(bytes, &TIMINGS_KEY, 0, key));
    (Some(usage), timings.map(|(_, v)| v))
}

/// Where the last `quoted_key:` within `bytes[from..to]` starts, and the text from its value on
/// (to the end of `bytes`). Searched with `find` from each match on, as `find_iter` does, without
/// the copy of the searcher that `find_iter` makes first.
fn last_value<'a>(
    bytes: &'a [u8],
    quoted_key: &Finder,
    from: usize,
    to: usize,
) -> Option<(usize, &'a [u8])> {
    let mut value = None;
    let mut at = from;
    while let Some(found) = quoted_key.find(&bytes[at..to]) {
        let key = at + found;
        at = key + quoted_key.needle().len();
        if let Some(after) = bytes[at..].trim_ascii_start().strip_prefix(b":") {
            value = Some((key, after));
        }
    }
    value
}

/// Stores a member's value once: a second one makes the whole value unreadable.
fn once<T>(slot: &mut Option<T>, seen: &mut u16, bit: u16, value: Option<T>) -> Option<()> {
    if *seen & bit != 0 {
        return None;
    }
    *seen |= bit;
    *slot = value;
    Some(())
}

fn read_usage(text: &[u8]) -> Option<Usage> {
    let mut u = Usage::default();
    let mut seen = 0u16;
    scan::members(text, |key, v| {
        let (slot, bit, value) = match key {
            b"prompt_tokens" => (&mut u.prompt_tokens, 1, count(v)),
            b"input_tokens" => (&mut u.input_tokens, 2, count(v)),
            b"completion_tokens" => (&mut u.completion_tokens, 4, count(v)),
            b"output_tokens" => (&mut u.output_tokens, 8, count(v)),
            b"cache_read_input_tokens" => (&mut u.cache_read_input_tokens, 16, count(v)),
            b"prompt_tokens_details" => (&mut u.prompt_cached, 32, cached(v)),
            b"input_tokens_details" => (&mut u.input_cached, 64, cached(v)),
            _ => return Some(()),
        };
        once(slot, &mut seen, bit, value.ok()?)
    })?;
    Some(u)
}

/// `{"cached_tokens": N, ...}` (or `null`) as its count; `Err` for any other value.
fn cached(text: &[u8]) -> Result<Option<u64>, ()> {
    if text == b"null" {
        return Ok(None);
    }
    let mut cached = None;
    let mut seen = 0u16;
    scan::members(text, |key, v| match key {
        b"cached_tokens" => once(&mut cached, &mut seen, 1, count(v).ok()?),
        _ => Some(()),
    })
    .ok_or(())?;
    Ok(cached)
}

fn read_timings(text: &[u8]) -> Option<Timings> {
    let mut t = Timings::default();
    let mut seen = 0u16;
    scan::members(text, |key, v| {
        let (slot, bit, value) = match key {
            b"prompt_n" => (&mut t.prompt_n, 1, count(v)),
            b"predicted_n" => (&mut t.predicted_n, 2, count(v)),
            b"cache_n" => (&mut t.cache_n, 4, count(v)),
            b"draft_n" => (&mut t.draft_n, 8, count(v)),
            b"draft_n_accepted" => (&mut t.draft_n_accepted, 16, count(v)),
            b"prompt_per_second" => {
                return once(&mut t.prompt_per_second, &mut seen, 32, float(v).ok()?)
            }
            b"predicted_per_second" => {
                return once(&mut t.predicted_per_second, &mut seen, 64, float(v).ok()?)
            }
            _ => return Some(()),
        };
        once(slot, &mut seen, bit, value.ok()?)
    })?;
    Some(t)
}

#[cfg(test)]
#[path = "tokens_props.rs"]
mod props;
