//! corral: a drop-in llama-swap compatible proxy in front of local LLM servers.
#![deny(unsafe_code)]
pub mod config;
pub mod logs;
pub mod supervisor;
pub mod body;
pub mod error;
pub mod fleet;
pub mod api;
pub mod proxy;
pub mod server;

pub use server::{run, Options};
pub mod logging;
