//! Profiles, selectors and peers name what requests would route to (COMPAT.md §1.6-1.8).

use crate::config::{load_str, Config, ConfigError};

/// Models of every kind a name can reach: a model with an alias and a `setParamsByID` alias, a
/// model with replicas, an implicit pool `e` over `e-0` and `e-1`, and a peer with two models.
const BASE: &str = "models:\n  \
    a: {cmd: srv, proxy: 'http://h:1', aliases: [al], filters: {setParamsByID: {var: {temperature: 0}}}}\n  \
    b: {cmd: srv, proxy: 'http://h:1'}\n  \
    r: {cmd: 'srv --port ${PORT}', replicas: 2}\n  \
    e-0: {cmd: srv, proxy: 'http://h:1'}\n  \
    e-1: {cmd: srv, proxy: 'http://h:1'}\n\
    peers:\n  p: {proxy: 'http://peer:1', models: [m, n]}\n";

fn load(yaml: &str) -> Config {
    match load_str("t.yaml", yaml, &|_| None) {
        Ok(l) => l.config,
        Err(e) => panic!("the config should load: {e}"),
    }
}

fn load_err(yaml: &str) -> ConfigError {
    match load_str("t.yaml", yaml, &|_| None) {
        Ok(_) => panic!("the config should be refused"),
        Err(e) => e,
    }
}

/// The error's key, and its message, which must contain `part`.
fn refused(yaml: &str, key: &str, part: &str) {
    let e = load_err(yaml);
    assert_eq!(e.key.as_deref(), Some(key), "{e}");
    assert!(e.msg.contains(part), "{e}");
    assert!(e.loc.as_ref().is_some_and(|l| l.line > 0), "{e}");
}

// === profiles ===

#[test]
fn pins_may_target_anything_a_request_can_name() {
    let c = load(&format!(
        "{BASE}selectors:\n  s: {{strategy: pin, targets: [a]}}\n\
         profiles:\n  all:\n    pins:\n      \
         x1: a\n      x2: al\n      x3: var\n      x4: r-1\n      x5: r\n      x6: e\n      \
         x7: p/m\n      x8: n\n      x9: s\n      a: b\n      off: ~\n      off2: ''\n"
    ));
    let pins = &c.profiles["all"].pins;
    assert_eq!(pins["x7"].as_deref(), Some("p/m"));
    assert_eq!(pins["off"], None);
    assert_eq!(pins["off2"], None);
}

#[test]
fn a_profile_without_pins_is_refused() {
    refused(
        &format!("{BASE}profiles:\n  c: {{pins: {{}}}}\n"),
        "profiles.c.pins",
        "at least one pin",
    );
}

#[test]
fn an_empty_pin_name_is_refused() {
    refused(
        &format!("{BASE}profiles:\n  c:\n    pins: {{'': a}}\n"),
        "profiles.c.pins.",
        "must not be empty",
    );
}

#[test]
fn a_pin_to_nothing_routable_is_refused() {
    refused(
        &format!("{BASE}profiles:\n  c:\n    pins: {{x: a, y: nope}}\n"),
        "profiles.c.pins.y",
        "\"nope\" is not a model",
    );
    // `r-2` would be a replica, but `r` has two
    refused(
        &format!("{BASE}profiles:\n  c:\n    pins: {{x: r-2}}\n"),
        "profiles.c.pins.x",
        "\"r-2\"",
    );
}

#[test]
fn a_pin_named_like_a_peer_model_is_refused() {
    refused(
        &format!("{BASE}profiles:\n  c:\n    pins: {{p/n: a}}\n"),
        "peers.p.models[1]",
        "a pin of profile \"c\"",
    );
}

// === selectors ===

#[test]
fn selectors_over_local_and_peer_targets_load() {
    let c = load(&format!(
        "{BASE}groups:\n  together: {{swap: false, members: [a, b]}}\n\
         selectors:\n  \
         first: {{strategy: pin, targets: [p/m, n, al]}}\n  \
         loaded: {{strategy: warm, targets: [var, b, r-0, r]}}\n  \
         spread: {{strategy: spillover, targets: [a, b, p/m, n]}}\n  \
         e: {{strategy: spillover, targets: [e-0, e-1]}}\n  \
         replicas: {{strategy: spillover, targets: [r-0, r-1]}}\n"
    ));
    assert_eq!(c.selectors["spread"].targets, ["a", "b", "p/m", "n"]);
}

#[test]
fn a_selector_named_like_a_local_name_is_refused() {
    for (id, what) in [
        ("b", "model \"b\""),
        ("al", "an alias of model \"a\""),
        ("var", "an alias of model \"a\""),
        ("r-1", "a replica of model \"r\""),
    ] {
        refused(
            &format!("{BASE}selectors:\n  {id}: {{strategy: pin, targets: [a]}}\n"),
            &format!("selectors.{id}"),
            what,
        );
    }
}

#[test]
fn a_selector_named_like_a_peer_model_is_refused() {
    refused(
        &format!("{BASE}selectors:\n  p/m: {{strategy: pin, targets: [a]}}\n"),
        "peers.p.models[0]",
        "selector \"p/m\"",
    );
}

#[test]
fn a_selector_targeting_a_selector_is_refused() {
    refused(
        &format!(
            "{BASE}selectors:\n  s: {{strategy: pin, targets: [a, t]}}\n  t: {{strategy: pin, targets: [b]}}\n"
        ),
        "selectors.s.targets[1]",
        "\"t\" is a selector",
    );
}

#[test]
fn a_selector_target_that_routes_nowhere_is_refused() {
    refused(
        &format!("{BASE}selectors:\n  s: {{strategy: pin, targets: [a, q/m]}}\n"),
        "selectors.s.targets[1]",
        "\"q/m\" is not a model",
    );
}

#[test]
fn warm_selectors_refuse_peer_targets() {
    refused(
        &format!("{BASE}selectors:\n  s: {{strategy: warm, targets: [a, n]}}\n"),
        "selectors.s.targets[1]",
        "must be local",
    );
}

#[test]
fn spillover_refuses_two_names_for_one_target() {
    let groups = "groups:\n  g: {swap: false, members: [a, b]}\n";
    refused(
        &format!("{BASE}{groups}selectors:\n  s: {{strategy: spillover, targets: [a, b, var]}}\n"),
        "selectors.s.targets[2]",
        "as \"a\" does",
    );
    refused(
        &format!("{BASE}selectors:\n  s: {{strategy: spillover, targets: [p/n, n]}}\n"),
        "selectors.s.targets[1]",
        "as \"p/n\" does",
    );
    // the same names are fine where nothing is counted per target
    load(&format!(
        "{BASE}selectors:\n  s: {{strategy: pin, targets: [a, var]}}\n"
    ));
}

#[test]
fn spillover_targets_that_evict_each_other_are_refused() {
    refused(
        &format!("{BASE}selectors:\n  s: {{strategy: spillover, targets: [a, b]}}\n"),
        "selectors.s.targets",
        "one group with swap: false",
    );
    let swapping = "groups:\n  g: {members: [a, b]}\n";
    refused(
        &format!("{BASE}{swapping}selectors:\n  s: {{strategy: spillover, targets: [a, b]}}\n"),
        "selectors.s.targets",
        "starting \"a\" stops \"b\"",
    );
    // a pool target brings all its replicas
    let apart = "groups:\n  g: {swap: false, members: [a, b]}\n";
    refused(
        &format!("{BASE}{apart}selectors:\n  s: {{strategy: spillover, targets: [a, r]}}\n"),
        "selectors.s.targets",
        "stops \"r-0\"",
    );
}

#[test]
fn spillover_targets_may_run_together_by_any_swap_rule() {
    let apart =
        "groups:\n  x: {exclusive: false, members: [a]}\n  y: {exclusive: false, members: [b]}\n";
    load(&format!(
        "{BASE}{apart}selectors:\n  s: {{strategy: spillover, targets: [a, b]}}\n"
    ));
    let kept =
        "groups:\n  x: {persistent: true, members: [a]}\n  y: {persistent: true, members: [b]}\n";
    load(&format!(
        "{BASE}{kept}selectors:\n  s: {{strategy: spillover, targets: [a, b]}}\n"
    ));
    // one way is not enough: b's exclusive group stops a, whose group does not persist
    let one_way =
        "groups:\n  x: {exclusive: false, members: [a]}\n  y: {persistent: true, members: [b]}\n";
    refused(
        &format!("{BASE}{one_way}selectors:\n  s: {{strategy: spillover, targets: [a, b]}}\n"),
        "selectors.s.targets",
        "starting \"b\" stops \"a\"",
    );
}

#[test]
fn spillover_under_the_matrix_needs_a_set_holding_every_target() {
    let matrix = |sets: &str| {
        format!(
            "{BASE}routing:\n  router:\n    use: matrix\n    settings:\n      matrix:\n        sets:\n{sets}\
             selectors:\n  s: {{strategy: spillover, targets: [a, b, r]}}\n"
        )
    };
    load(&matrix("          all: 'a & b & r'\n"));
    refused(
        &matrix("          ab: 'a & b'\n          br: 'b & r'\n"),
        "selectors.s.targets",
        "one matrix set",
    );
}

// === peers ===

#[test]
fn a_peer_model_named_like_a_replica_or_a_pool_is_refused() {
    let peer = "peers:\n  q: {proxy: 'http://peer:1', models: [x, r-1]}\n";
    refused(
        &format!("models:\n  q/r: {{cmd: 'srv --port ${{PORT}}', replicas: 2}}\n{peer}"),
        "peers.q.models[1]",
        "a replica of model \"q/r\"",
    );
    let peer = "peers:\n  q: {proxy: 'http://peer:1', models: [e]}\n";
    refused(
        &format!(
            "models:\n  q/e-0: {{cmd: srv, proxy: 'http://h:1'}}\n  q/e-1: {{cmd: srv, proxy: 'http://h:1'}}\n{peer}"
        ),
        "peers.q.models[0]",
        "the pool of models named \"q/e-<n>\"",
    );
}
