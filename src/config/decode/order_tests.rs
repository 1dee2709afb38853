//! A config with several errors reports the same one first whichever way decoding is arranged:
//! these pin the order in which parts of the file are read.

use crate::config::{load_str, ConfigError};

fn first_error(yaml: &str) -> ConfigError {
    match load_str("order.yaml", yaml, &|_| None) {
        Ok(_) => panic!("the config should be refused"),
        Err(e) => e,
    }
}

#[test]
fn peers_are_read_before_the_late_top_level_settings() {
    let e = first_error("logTimeFormat: {a: 1}\npeers:\n  p: {models: [m]}\n");
    assert_eq!(e.key.as_deref(), Some("peers.p.proxy"), "{e}");
}

#[test]
fn a_model_reads_its_lifetime_before_its_description() {
    let long = "n".repeat(129);
    let yaml =
        format!("models:\n  m:\n    cmd: srv --port ${{PORT}}\n    ttl: -5\n    name: {long}\n");
    let e = first_error(&yaml);
    assert_eq!(e.key.as_deref(), Some("models.m.ttl"), "{e}");
}

#[test]
fn routing_is_read_before_profiles_and_after_the_models() {
    let yaml = "models:\n  m: {cmd: srv, proxy: 'http://127.0.0.1:9'}\n\
                routing: {router: {use: other}}\nprofiles: {p: {}}\n";
    let e = first_error(yaml);
    assert_eq!(e.key.as_deref(), Some("routing.router.use"), "{e}");
    let yaml = "models:\n  m: {cmd: srv, proxy: 'http://127.0.0.1:9', ttl: -2}\n\
                routing: {router: {use: other}}\n";
    let e = first_error(yaml);
    assert_eq!(e.key.as_deref(), Some("models.m.ttl"), "{e}");
}
