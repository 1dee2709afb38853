//! What a requested name means: one instance, or a pool of replicas to balance over.
//!
//! Names resolve in this order: a model id, an alias, a replica id (`chat-1`), then an implicit pool
//! `<role>` formed by models named `<role>-<n>` (as fleet generators write them) when no model or
//! alias is called `<role>`. Unknown names never create anything.

use std::collections::BTreeMap;

use foldhash::HashMap;
use std::sync::Arc;

use crate::config::{Config, ModelConfig};

mod route;
pub mod swap;
pub use route::{route, Route};

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// One instance, by instance id.
    Instance(Arc<str>),
    /// A pool, by pool id; any of its ready replicas may serve.
    Pool(Arc<str>),
}

/// A pool of instances that serve the same role.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolSpec {
    pub id: String,
    /// Instance ids, in replica order.
    pub members: Vec<String>,
    /// The model whose settings (queue bounds, start policy) the pool uses.
    pub model: String,
}

/// An instance: which model it belongs to and which pool, if any.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceRef {
    pub model: String,
    /// Index into the model's `instances`.
    pub index: usize,
    pub pool: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct Catalog {
    names: HashMap<String, (Target, Arc<str>)>,
    /// The length of the longest of `names`, in bytes (`/upstream/` tries no longer prefix).
    longest: usize,
    pub pools: BTreeMap<String, PoolSpec>,
    pub instances: BTreeMap<String, InstanceRef>,
}

impl Catalog {
    pub fn new(config: &Config) -> Catalog {
        let mut c = Catalog::default();
        for m in config.models.values() {
            c.add_instances(m);
        }
        c.add_implicit_pools(config);
        for m in config.models.values() {
            c.add_names(m);
        }
        c.longest = c.names.keys().map(String::len).max().unwrap_or(0);
        c
    }

    /// The model's instances, and the pool of its replicas when it has several.
    fn add_instances(&mut self, m: &ModelConfig) {
        for (index, inst) in m.instances.iter().enumerate() {
            self.instances.insert(
                inst.id.clone(),
                InstanceRef {
                    model: m.id.to_string(),
                    index,
                    pool: None,
                },
            );
        }
        if m.instances.len() > 1 {
            let members: Vec<String> = m.instances.iter().map(|i| i.id.clone()).collect();
            self.add_pool(&m.id, members, &m.id);
        }
    }

    /// The model's id and aliases (its pool when it has replicas), and each replica's id unless
    /// it already names something.
    fn add_names(&mut self, m: &ModelConfig) {
        let target = if m.instances.len() > 1 {
            Target::Pool(m.id.clone())
        } else {
            Target::Instance(m.id.clone())
        };
        for name in std::iter::once(&*m.id).chain(m.aliases.iter().map(String::as_str)) {
            self.names
                .insert(name.to_string(), (target.clone(), m.id.clone()));
        }
        if m.instances.len() > 1 {
            for inst in &m.instances {
                self.names
                    .entry(inst.id.clone())
                    .or_insert((Target::Instance(inst.id.as_str().into()), m.id.clone()));
            }
        }
    }

    fn add_pool(&mut self, id: &str, members: Vec<String>, model: &str) {
        for member in &members {
            if let Some(r) = self.instances.get_mut(member) {
                r.pool = Some(id.to_string());
            }
        }
        self.pools.insert(
            id.to_string(),
            PoolSpec {
                id: id.to_string(),
                members,
                model: model.to_string(),
            },
        );
    }

    /// Models named `<role>-0` .. `<role>-<n>` form the pool `<role>`, unless `<role>` already
    /// names something. Numbers that do not run from 0 without a gap are versions, not replicas
    /// (`gemma-2` and `gemma-3` are two models): no pool.
    fn add_implicit_pools(&mut self, config: &Config) {
        for (role, mut members) in numbered_models(config) {
            let taken = config.real_model_name(&role).is_some() || self.pools.contains_key(&role);
            members.sort();
            let replicas = members
                .iter()
                .enumerate()
                .all(|(i, (n, _))| *n as usize == i);
            if taken || !replicas {
                continue;
            }
            let ids: Vec<String> = members.into_iter().map(|(_, id)| id).collect();
            let model = ids[0].clone();
            self.add_pool(&role, ids, &model);
            self.names.insert(
                role.clone(),
                (Target::Pool(role.as_str().into()), model.into()),
            );
        }
    }

    /// The target a requested name means, and the model whose settings apply.
    pub fn resolve(&self, name: &str) -> Option<(&Target, &Arc<str>)> {
        self.names.get(name).map(|(t, m)| (t, m))
    }

    /// The length of the longest name that resolves, in bytes.
    pub fn longest_name(&self) -> usize {
        self.longest
    }

    /// The model an instance belongs to.
    pub fn model_of(&self, instance: &str) -> Option<&str> {
        self.instances.get(instance).map(|r| r.model.as_str())
    }
}

/// The single-instance models named `<role>-<n>` (`n` a plain number), by role, with their
/// numbers.
fn numbered_models(config: &Config) -> BTreeMap<String, Vec<(u32, String)>> {
    let mut roles: BTreeMap<String, Vec<(u32, String)>> = BTreeMap::new();
    for m in config.models.values().filter(|m| m.instances.len() == 1) {
        if let Some((role, suffix)) = m.id.rsplit_once('-') {
            if let Ok(n) = suffix.parse::<u32>() {
                if !role.is_empty() && n.to_string() == suffix {
                    roles
                        .entry(role.to_string())
                        .or_default()
                        .push((n, m.id.to_string()));
                }
            }
        }
    }
    roles
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog(yaml: &str) -> Catalog {
        Catalog::new(
            &crate::config::load_str("t.yaml", yaml, &|_| None)
                .unwrap()
                .config,
        )
    }

    #[test]
    fn replicas_form_a_pool_and_keep_their_own_ids() {
        let c =
            catalog("models:\n  chat: {cmd: 'srv --port ${PORT}', replicas: 3, aliases: [gpt]}\n");
        assert_eq!(c.resolve("chat").unwrap().0, &Target::Pool("chat".into()));
        assert_eq!(c.resolve("gpt").unwrap().0, &Target::Pool("chat".into()));
        assert_eq!(
            c.resolve("chat-1").unwrap().0,
            &Target::Instance("chat-1".into())
        );
        assert_eq!(c.pools["chat"].members, ["chat-0", "chat-1", "chat-2"]);
        assert!(c.resolve("chat-3").is_none());
    }

    #[test]
    fn role_numbered_models_form_an_implicit_pool() {
        let c = catalog("models:\n  embed-0: {cmd: 'srv --port ${PORT}'}\n  embed-1: {cmd: 'srv --port ${PORT}'}\n  solo: {cmd: 'srv --port ${PORT}'}\n");
        assert_eq!(c.resolve("embed").unwrap().0, &Target::Pool("embed".into()));
        assert_eq!(c.pools["embed"].members, ["embed-0", "embed-1"]);
        assert_eq!(
            c.resolve("embed-1").unwrap().0,
            &Target::Instance("embed-1".into())
        );
        assert!(c.resolve("solo-0").is_none());
    }

    /// The longest name counts every name a request may use: a replica's id is longer than its
    /// model's, an alias longer than both.
    #[test]
    fn the_longest_name_covers_replicas_and_aliases() {
        let c = catalog("models:\n  chat: {cmd: 'srv --port ${PORT}', replicas: 12}\n");
        assert_eq!(c.longest_name(), "chat-11".len());
        let c = catalog(
            "models:\n  chat: {cmd: 'srv --port ${PORT}', replicas: 2, aliases: [a-long-alias]}\n",
        );
        assert_eq!(c.longest_name(), "a-long-alias".len());
    }

    /// Numbers that do not run from 0 are versions of different models, not replicas of one.
    #[test]
    fn versions_are_not_replicas() {
        let c = catalog("models:\n  gemma-2: {cmd: 'srv --port ${PORT}'}\n  gemma-3: {cmd: 'srv --port ${PORT}'}\n  llama-3: {cmd: 'srv --port ${PORT}'}\n  e-0: {cmd: 'srv --port ${PORT}'}\n  e-2: {cmd: 'srv --port ${PORT}'}\n");
        for name in ["gemma", "llama", "e"] {
            assert!(c.resolve(name).is_none(), "{name}");
        }
        assert!(c.pools.is_empty());
    }

    #[test]
    fn an_existing_model_keeps_the_role_name() {
        let c = catalog("models:\n  embed: {cmd: 'srv --port ${PORT}'}\n  embed-0: {cmd: 'srv --port ${PORT}'}\n");
        assert_eq!(
            c.resolve("embed").unwrap().0,
            &Target::Instance("embed".into())
        );
        assert!(c.pools.is_empty());
    }

    #[test]
    fn replica_ports_are_consecutive() {
        let cfg = crate::config::load_str("t.yaml", "startPort: 7000\nmodels:\n  b: {cmd: 'srv --port ${PORT} -np 2', replicas: 2}\n  c: {cmd: 'srv --port ${PORT}'}\n", &|_| None).unwrap().config;
        let b = &cfg.models["b"];
        assert_eq!(
            b.instances.iter().map(|i| i.port).collect::<Vec<_>>(),
            [Some(7000), Some(7001)]
        );
        assert_eq!(b.instances[1].argv, ["srv", "--port", "7001", "-np", "2"]);
        assert_eq!(b.instances[1].proxy, "http://localhost:7001");
        assert_eq!(b.instances[1].slots, Some(2));
        assert_eq!(cfg.models["c"].instances[0].port, Some(7002));
    }
}
