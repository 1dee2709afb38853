//! corral: a drop-in llama-swap compatible proxy in front of local LLM servers.
#![deny(unsafe_code)]
pub mod api;
pub mod body;
pub mod catalog;
pub mod config;
pub mod error;
pub mod fleet;
pub mod logs;
pub mod matrix;
pub mod memory;
pub mod metrics;
pub mod proxy;
pub mod server;
mod stall;
pub mod supervisor;
mod trim;
pub mod upstream;
mod workers;

pub use server::{run, run_with_reloads, Options, Reload};
pub mod logging;
