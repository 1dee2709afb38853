//! `GET /v1/models`: the OpenAI list, with llama-swap's extra fields (§2.2), the metadata corral
//! fills in (`metadata/`) and llama.cpp's router status (`llama_router/`); `GET /v1/models/<id>`:
//! one entry of it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use http::{Response, StatusCode};
use serde_json::{json, Map, Value};

use crate::api::json;
use crate::api::llama_router;
use crate::api::metadata;
use crate::api::App;
use crate::config::catalog::Catalog;
use crate::config::{Capabilities, ModelConfig, Scope};
use crate::fleet::lifecycle::Status;
use crate::fleet::{PhaseName, Snapshot};
use crate::proxy::body::Body;
use crate::proxy::error::Error;
use crate::routing::grant::Grant;

/// Metadata keys that configured capabilities replace.
const CAPABILITY_KEYS: &[&str] = &[
    "architecture",
    "capabilities",
    "supported_parameters",
    "context_length",
];

/// The list, holding only the models a key with a model list may use.
pub async fn list(app: &App, caller: Option<&Grant>) -> Response<Body> {
    let data = entries(app, caller).await;
    // its CORS header, llama-swap v250's echo of `Origin`, is added with every other answer's
    // (`layers/cors.rs`)
    json(StatusCode::OK, &json!({"object": "list", "data": data}))
}

/// `GET /v1/models/<id>`: the entry the list has for `id`, or 404 as for a model the list hides.
pub async fn one(app: &App, caller: Option<&Grant>, id: &str) -> Result<Response<Body>, Error> {
    let entry = entries(app, caller)
        .await
        .into_iter()
        .find(|e| e["id"].as_str() == Some(id))
        .ok_or_else(|| Error::NotFound(format!("model {id:?} not found")))?;
    Ok(json(StatusCode::OK, &entry))
}

/// Reads what the metadata of the models needs and is not known yet (GGUF headers, new engines'
/// `/props`), for a view that draws it without listing.
pub async fn learn(app: &App) {
    Listing::new(app).learn().await;
}

/// What the dashboard shows of a model's metadata, as its entry in the list has it: the context a
/// request can use and the capability flags that hold.
pub fn shown_metadata(m: &ModelConfig, snapshot: &[Snapshot]) -> Value {
    let mut r = model_record(m, 0, false, &[]);
    if metadata::fills(m) {
        let running = snapshot
            .iter()
            .find(|s| *s.model == *m.id && s.state == PhaseName::Ready);
        metadata::fill(&mut r, &metadata::derive(&metadata::facts_for(m, running)));
    }
    let flags: Vec<&String> = r["capabilities"]
        .as_object()
        .map(|c| {
            c.iter()
                .filter(|(_, v)| **v == true)
                .map(|(k, _)| k)
                .collect()
        })
        .unwrap_or_default();
    json!({"context": r["context_length"], "capabilities": flags})
}

/// Every entry a caller may see, sorted by id.
async fn entries(app: &App, caller: Option<&Grant>) -> Vec<Value> {
    let mut listing = Listing::new(app);
    listing.shows_commands = caller.is_none_or(|g| g.scope.allows(Scope::Admin));
    listing.learn().await;
    let mut data = Vec::new();
    for m in app.config.models.values().filter(|m| !m.unlisted) {
        listing.model_entries(m, &mut data);
    }
    data.extend(listing.pool_entries());
    data.extend(peer_entries(app, listing.created));
    data.extend(selector_entries(app, listing.created));
    data.extend(profile_pins(app, &data, listing.created));
    if let Some(grant) = caller {
        data.retain(|e| e["id"].as_str().is_some_and(|id| grant.may_use(id)));
    }
    data.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
    data.iter_mut().for_each(llama_router::default_architecture);
    data
}

/// The fleet's state, read once per listing so that every entry agrees on what is loaded.
struct Listing<'a> {
    app: &'a App,
    created: u64,
    snapshot: Vec<Snapshot>,
    catalog: Arc<Catalog>,
    statuses: BTreeMap<String, Status>,
    /// Whether entries show the command line a model runs: to an admin, as `/running` does.
    shows_commands: bool,
}

impl<'a> Listing<'a> {
    fn new(app: &'a App) -> Self {
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let snapshot = app.fleet.snapshot();
        let catalog = app.fleet.catalog();
        let statuses = app.fleet.statuses();
        Listing {
            app,
            created,
            snapshot,
            catalog,
            statuses,
            shows_commands: true,
        }
    }

    /// Reads what the metadata rules need and is not known yet: the GGUF headers of the models
    /// corral fills in, and what newly started engines report.
    async fn learn(&self) {
        let argvs = self
            .app
            .config
            .models
            .values()
            .filter(|m| metadata::fills(m))
            .map(|m| self.command_of(m).to_vec())
            .collect();
        metadata::read_headers(argvs).await;
        metadata::learn_running(&self.app.config, &self.snapshot).await;
    }

    /// The command line a model's first running instance runs, else its configured one.
    fn command_of<'m>(&'m self, m: &'m ModelConfig) -> &'m [String] {
        self.members(m)
            .into_iter()
            .find_map(|s| s.argv.as_deref())
            .or_else(|| m.instances.first().map(|i| i.argv.as_slice()))
            .unwrap_or(&m.argv)
    }

    /// A model's instances in the snapshot.
    fn members(&self, m: &ModelConfig) -> Vec<&Snapshot> {
        self.snapshot.iter().filter(|s| *s.model == *m.id).collect()
    }

    /// Whether any of the instances `ids` is ready to serve.
    fn ready(&self, ids: &[String]) -> bool {
        self.snapshot
            .iter()
            .any(|s| ids.contains(&s.instance) && s.state == PhaseName::Ready)
    }

    /// A configured model's entries: its own, one per replica when it has several, and one per
    /// alias when `includeAliasesInList` is set.
    fn model_entries(&self, m: &ModelConfig, data: &mut Vec<Value>) {
        let created = self.created;
        let ids: Vec<String> = m.instances.iter().map(|i| i.id.clone()).collect();
        let loaded = self.ready(&ids);
        data.push(self.model_entry(m, loaded, &ids));
        if ids.len() > 1 {
            for id in &ids {
                let meta = json!({"type": "replica", "modelID": m.id, "pool": m.id});
                data.push(record(
                    id,
                    created,
                    meta,
                    self.ready(std::slice::from_ref(id)),
                ));
            }
        }
        if self.app.config.include_aliases_in_list {
            for alias in &m.aliases {
                let mut r = model_record(m, created, loaded, &ids);
                r["id"] = json!(alias);
                r["meta"]["llamaswap"]["type"] = json!("alias");
                r["meta"]["llamaswap"]["modelID"] = json!(m.id);
                data.push(r);
            }
        }
    }

    /// The model's own entry, with its lifecycle status, any download in progress, the metadata
    /// corral fills in and the router's status.
    fn model_entry(&self, m: &ModelConfig, loaded: bool, ids: &[String]) -> Value {
        let mut r = model_record(m, self.created, loaded, ids);
        let members = self.members(m);
        if metadata::fills(m) {
            let running = members.iter().find(|s| s.state == PhaseName::Ready);
            let facts = metadata::facts_for(m, running.copied());
            metadata::fill(&mut r, &metadata::derive(&facts));
        }
        let redactor = self.shows_commands.then_some(&self.app.config.redactor);
        llama_router::describe(&mut r, &members, redactor);
        if let Some(st) = self.statuses.get(&*m.id) {
            r["status"]["lifecycle"] = json!(st.status.as_str());
            if let Some(reason) = &st.reason {
                r["status"]["reason"] = json!(reason);
            }
        }
        let download = self
            .snapshot
            .iter()
            .find(|s| *s.model == *m.id && s.download.is_some());
        if let Some(d) = download.and_then(|s| s.download.as_ref()) {
            r["status"]["download"] = json!(d);
        }
        r
    }

    /// Pools that are not also a model's id (a model's own pool is listed as that model).
    fn pool_entries(&self) -> Vec<Value> {
        self.catalog
            .pools
            .values()
            .filter(|p| !self.app.config.models.contains_key(&p.id))
            .map(|pool| {
                let meta = json!({"type": "pool", "members": pool.members});
                record(&pool.id, self.created, meta, self.ready(&pool.members))
            })
            .collect()
    }
}

/// One entry per model a peer serves, as `peer/model`; never loaded, as corral does not know.
fn peer_entries(app: &App, created: u64) -> Vec<Value> {
    let mut data = Vec::new();
    for (peer_id, peer) in &app.config.peers {
        for m in &peer.models {
            let fqn = format!("{peer_id}/{m}");
            let mut r = record(
                &fqn,
                created,
                json!({"type": "peer", "peerID": peer_id, "modelID": m}),
                false,
            );
            r["name"] = json!(format!("{peer_id}: {m}"));
            data.push(r);
        }
    }
    data
}

/// Listed selectors, with their metadata, strategy and targets.
fn selector_entries(app: &App, created: u64) -> Vec<Value> {
    let mut data = Vec::new();
    for (id, sel) in app.config.selectors.iter().filter(|(_, s)| !s.unlisted) {
        let mut meta: Map<String, Value> = sel.metadata.clone();
        meta.insert("type".into(), json!("selector"));
        meta.insert("strategy".into(), json!(sel.strategy));
        meta.insert("targets".into(), json!(sel.targets));
        if sel.strategy == "spillover" {
            meta.insert("spillover".into(), json!(sel.spillover));
        }
        let mut r = record(id, created, Value::Object(meta), false);
        if let Some(n) = &sel.name {
            r["name"] = json!(n);
        }
        if let Some(d) = &sel.description {
            r["description"] = json!(d);
        }
        data.push(r);
    }
    data
}

/// The active profile's pins that name no listed id (a pin that shadows a model is that model's
/// entry already); pins to nothing are disabled ids and stay unlisted.
fn profile_pins(app: &App, listed: &[Value], created: u64) -> Vec<Value> {
    let Some(active) = app.profiles.active() else {
        return Vec::new();
    };
    let Some(profile) = app.config.profiles.get(&active) else {
        return Vec::new();
    };
    profile
        .pins
        .iter()
        .filter(|(pin, _)| {
            !listed
                .iter()
                .any(|r| r["id"].as_str() == Some(pin.as_str()))
        })
        .filter_map(|(pin, target)| {
            let target = target.as_deref()?;
            let meta = json!({"type": "profile", "profileID": active, "modelID": target});
            Some(record(pin, created, meta, false))
        })
        .collect()
}

fn record(id: &str, created: u64, meta: Value, loaded: bool) -> Value {
    json!({
        "id": id, "object": "model", "created": created, "owned_by": "corral",
        "meta": {"llamaswap": meta},
        "status": {"value": if loaded { "loaded" } else { "unloaded" }},
    })
}

fn model_record(m: &ModelConfig, created: u64, loaded: bool, ids: &[String]) -> Value {
    let caps = &m.capabilities;
    let has_caps = !caps.input.is_empty()
        || !caps.output.is_empty()
        || caps.tools
        || caps.reranker
        || caps.context > 0;
    let mut meta = m.metadata.clone();
    if has_caps {
        meta.retain(|k, _| !CAPABILITY_KEYS.contains(&k.as_str()));
    }
    meta.insert("type".into(), json!("model"));
    if !m.aliases.is_empty() {
        meta.insert("aliases".into(), json!(m.aliases));
    }
    if ids.len() > 1 {
        meta.insert("replicas".into(), json!(ids));
    }
    let mut r = record(&m.id, created, Value::Object(meta), loaded);
    if let Some(name) = &m.name {
        r["name"] = json!(name);
    }
    if let Some(d) = &m.description {
        r["description"] = json!(d);
    }
    if !caps.input.is_empty() || !caps.output.is_empty() {
        let modality = format!("{}->{}", caps.input.join("+"), caps.output.join("+"));
        r["architecture"] = json!({"input_modalities": caps.input, "output_modalities": caps.output, "modality": modality});
    }
    if has_caps {
        capability_fields(&mut r, caps);
    }
    r
}

/// The OpenRouter-style fields that configured capabilities add to a model's entry: the flags
/// they imply, the tool parameters and the context length.
fn capability_fields(r: &mut Value, caps: &Capabilities) {
    let c = capability_flags(caps);
    if !c.is_empty() {
        r["capabilities"] = Value::Object(c);
    }
    if caps.tools {
        r["supported_parameters"] = json!(["tools", "tool_choice"]);
    }
    if caps.context > 0 {
        r["context_length"] = json!(caps.context);
        r["meta"]["n_ctx"] = json!(caps.context);
    }
}

/// The capability flags that hold, from the input and output modalities and the tool and
/// reranker switches.
fn capability_flags(caps: &Capabilities) -> Map<String, Value> {
    let has = |list: &[String], m: &str| list.iter().any(|x| x == m);
    let mut c = Map::new();
    let flags = [
        ("vision", has(&caps.input, "image")),
        (
            "audio_transcriptions",
            has(&caps.input, "audio") && has(&caps.output, "text"),
        ),
        ("audio_speech", has(&caps.output, "audio")),
        ("image_generation", has(&caps.output, "image")),
        (
            "image_to_image",
            has(&caps.input, "image") && has(&caps.output, "image"),
        ),
        ("function_calling", caps.tools),
        ("reranker", caps.reranker),
    ];
    for (k, v) in flags.into_iter().filter(|(_, v)| *v) {
        c.insert(k.into(), json!(v));
    }
    c
}
