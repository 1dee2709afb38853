//! Getting a model request to where it is served: the body read within its limits and budget, the
//! model it names (`names.rs`: profiles, selectors, local models, pools, peers), the body
//! rewritten where asked (`filters.rs`), and the forwarding to a local instance (`forward.rs`),
//! the loading stream (`loading.rs`) or a peer (`peers.rs`, by load: `peer_load.rs`).
//! `seen.rs` is the request's record, handed to the observation room when the answer ends;
//! `grant.rs` what the key it presented may use.

pub(crate) mod budget;
pub(crate) mod extract;
pub(crate) mod filters;
pub(crate) mod forward;
pub(crate) mod grant;
pub(crate) mod inference;
pub(crate) mod loading;
pub(crate) mod names;
pub(crate) mod passthrough;
pub(crate) mod peer_load;
pub(crate) mod peers;
pub(crate) mod seen;
