//! What passed through corral, watched without steering it: each answer's body metered as it
//! streams (token counts, time to first token, the idle limit), the activity log and its store,
//! llama-swap's captures, the performance samples and hardware readings, and the list of requests
//! in flight. It learns of requests through the records the routing room hands it, and depends on
//! neither the HTTP surface nor the routing.

pub(crate) mod activity;
pub(crate) mod announce;
pub(crate) mod cancel;
pub(crate) mod captures;
pub(crate) mod counts;
pub(crate) mod hardware;
pub(crate) mod inflight;
pub(crate) mod meter;
pub(crate) mod performance;
pub(crate) mod scan;
