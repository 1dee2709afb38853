//! The `corral` command: its arguments, and the commands that are not the server itself
//! (`check`'s plan, `pull`) with the config reload the server is driven by.

mod args;
pub mod plan;
pub mod pull;
pub mod reload;

pub use args::*;
