//! The group swap rules (llama-swap §1.4) as a pure function.

use crate::config::Config;

/// Which running models must stop before `target` may run.
///
/// A member of the target's own group is evicted when that group swaps; a member of another group is
/// evicted when the target's group is exclusive and the other group is not persistent.
pub fn conflicts<'a>(
    config: &Config,
    target: &str,
    running: impl IntoIterator<Item = &'a str>,
) -> Vec<String> {
    let g = config.group_of(target);
    running
        .into_iter()
        .filter(|m| *m != target)
        .filter(|m| {
            let h = config.group_of(m);
            if h.id == g.id {
                g.swap
            } else {
                g.exclusive && !h.persistent
            }
        })
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml: &str) -> Config {
        crate::config::load_str("t.yaml", yaml, &|_| None)
            .unwrap()
            .config
    }

    const MODELS: &str = "models:\n  a: {cmd: x, proxy: 'http://h:1'}\n  b: {cmd: x, proxy: 'http://h:1'}\n  c: {cmd: x, proxy: 'http://h:1'}\n  d: {cmd: x, proxy: 'http://h:1'}\n";

    #[test]
    fn default_group_runs_one_model_at_a_time() {
        let c = config(MODELS);
        assert_eq!(conflicts(&c, "a", ["b", "c"]), vec!["b", "c"]);
        assert!(conflicts(&c, "a", ["a"]).is_empty());
    }

    #[test]
    fn non_swapping_group_keeps_its_members_together() {
        let c = config(&format!(
            "{MODELS}groups:\n  g: {{swap: false, members: [a, b]}}\n"
        ));
        assert!(conflicts(&c, "a", ["b"]).is_empty());
        // exclusive (the default) still evicts other groups, here the implicit default group
        assert_eq!(conflicts(&c, "a", ["b", "c"]), vec!["c"]);
    }

    #[test]
    fn persistent_groups_survive_other_groups() {
        let c = config(&format!(
            "{MODELS}groups:\n  p: {{persistent: true, members: [a]}}\n  x: {{members: [b, c]}}\n"
        ));
        assert!(conflicts(&c, "b", ["a"]).is_empty());
        assert_eq!(conflicts(&c, "b", ["a", "c"]), vec!["c"]);
        // the default group (d) is exclusive: it evicts x but not the persistent p
        assert_eq!(conflicts(&c, "d", ["a", "b"]), vec!["b"]);
    }

    #[test]
    fn non_exclusive_group_never_evicts_outside() {
        let c = config(&format!(
            "{MODELS}groups:\n  n: {{exclusive: false, members: [a]}}\n"
        ));
        assert!(conflicts(&c, "a", ["b"]).is_empty());
        assert_eq!(conflicts(&c, "b", ["a"]), vec!["a"]);
    }
}
