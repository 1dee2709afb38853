//! corral: a drop-in llama-swap compatible proxy in front of local LLM servers.
#![deny(unsafe_code)]
mod admission;
pub mod api;
pub mod body;
pub mod catalog;
pub mod config;
pub mod error;
pub mod fdlimit;
pub mod fleet;
mod idle;
pub mod logs;
pub mod matrix;
pub mod memory;
pub mod metrics;
pub mod proxy;
pub mod server;
mod slow_body;
mod stall;
pub mod supervisor;
mod trim;
pub mod ui;
pub mod upstream;
mod workers;

pub use server::{run, run_with_reloads, Options, Reload};
pub mod logging;
