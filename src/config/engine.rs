//! Models named by *what* to serve and *how*: `engine`, `source`, `ctx`, `slots`, `args`, and the
//! top-level `engines:` that says how this host runs each engine kind.
//!
//! A model with `engine` and no `cmd` gets its command built here; a `cmd` still wins where both
//! are given (the engine keys are then ignored, with a warning). Until its weights are fetched the
//! command names the source as written; the fleet fetches them before a start and builds the
//! command again over the real paths with [`EngineModel::argv`].

use std::collections::BTreeMap;

use super::read::MapReader;
use super::yaml::{Node, Value};
use super::ConfigError;
use crate::engines::{EngineKind, Launch, ModelForm, Task};
use crate::sources::{Form, Source, Want};

/// `engines.<kind>`: how this host runs an engine kind.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineSettings {
    /// The command, split like `cmd`; the kind's default when not given.
    pub command: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// A model served by naming an engine and a source.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineModel {
    pub kind: EngineKind,
    pub command: Vec<String>,
    /// `engines.<kind>.env`, set for every model of the kind.
    pub env: Vec<(String, String)>,
    pub source: Source,
    /// `sha256:` the downloaded file must have (URLs).
    pub sha256: Option<String>,
    /// Context per slot.
    pub ctx: Option<u64>,
    /// Parallel sequences.
    pub slots: Option<usize>,
    pub args: Vec<String>,
    pub task: Task,
    /// The id clients use, which the engine is told to answer to.
    pub served_name: String,
}

/// Where the weights lie once fetched: a GGUF file or a model directory, and a vision projector.
pub struct Weights<'a> {
    pub model: &'a str,
    pub mmproj: Option<&'a str>,
}

impl EngineModel {
    /// What the source must yield for this engine.
    pub fn want(&self) -> Want {
        let form = match self.kind.model_form() {
            ModelForm::Directory => Form::Directory,
            ModelForm::File | ModelForm::Name | ModelForm::AsGiven => Form::File,
        };
        Want {
            form,
            sha256: self.sha256.clone(),
        }
    }

    /// True when the weights need fetching before a start (anything but a plain path).
    pub fn needs_fetch(&self) -> bool {
        !matches!(self.source, Source::Path(_))
    }

    /// The engine's command line on `port`, over `weights` (or the source as written when they
    /// are not fetched yet).
    pub fn argv(&self, port: u16, weights: Option<Weights<'_>>) -> Vec<String> {
        let written = self.source.to_string();
        let path_text;
        let (model, mmproj) = match (&weights, &self.source) {
            (Some(w), _) => (w.model, w.mmproj),
            (None, Source::Path(p)) => {
                path_text = p.display().to_string();
                (path_text.as_str(), None)
            }
            (None, _) => (written.as_str(), None),
        };
        let name = self.ollama_name();
        let model = name.as_deref().unwrap_or(model);
        crate::engines::argv(self.kind, &self.launch(port, model, mmproj))
    }

    /// The environment the engine kind needs on top of the model's own, before its weights are
    /// fetched.
    pub fn engine_env(&self, port: u16) -> Vec<(String, String)> {
        let name = self.ollama_name();
        self.engine_env_over(port, name.as_deref().unwrap_or(""))
    }

    /// The same, once the weights lie at `model` (engines given local files run offline).
    pub fn engine_env_over(&self, port: u16, model: &str) -> Vec<(String, String)> {
        let name = self.ollama_name();
        let model = name.as_deref().unwrap_or(model);
        let mut env = self.env.clone();
        env.extend(crate::engines::env(
            self.kind,
            &self.launch(port, model, None),
        ));
        env
    }

    /// Ollama serves models by name from its own store (which corral fills); others take paths.
    /// Requests reach it under that name (`useModelName`, unless set).
    pub fn ollama_name(&self) -> Option<String> {
        match (&self.kind, &self.source) {
            (EngineKind::Ollama, Source::Ollama { name, tag }) => Some(format!("{name}:{tag}")),
            _ => None,
        }
    }

    fn launch<'a>(&'a self, port: u16, model: &'a str, mmproj: Option<&'a str>) -> Launch<'a> {
        Launch {
            command: &self.command,
            model,
            mmproj,
            served_name: &self.served_name,
            host: "127.0.0.1",
            port,
            ctx: self.ctx,
            slots: self.slots,
            task: self.task,
            args: &self.args,
        }
    }
}

/// The top-level `engines:` mapping.
pub fn decode_engines(
    top: &MapReader<'_>,
    warnings: &mut Vec<String>,
) -> Result<BTreeMap<&'static str, EngineSettings>, ConfigError> {
    let engines = top.child("engines", &kind_names(), warnings)?;
    let mut out = BTreeMap::new();
    for (name, _) in engines.entries() {
        let Some(kind) = EngineKind::parse(name) else {
            continue; // warned about as an unknown key
        };
        let e = engines.child(name, &["command", "env"], warnings)?;
        let command = match e.string("command")? {
            Some(c) => super::command::split_command(&c).map_err(|m| e.err("command", m))?,
            None => Vec::new(),
        };
        out.insert(
            kind.name(),
            EngineSettings {
                command,
                env: env_entries(&e)?,
            },
        );
    }
    Ok(out)
}

fn kind_names() -> Vec<&'static str> {
    use strum::IntoEnumIterator;
    EngineKind::iter().map(EngineKind::name).collect()
}

/// `env` as a mapping (`NAME: value`) or a list (`NAME=value`).
fn env_entries(e: &MapReader<'_>) -> Result<Vec<(String, String)>, ConfigError> {
    let Some(node) = e.get("env") else {
        return Ok(Vec::new());
    };
    if let Value::Map(entries) = &node.value {
        return entries
            .iter()
            .map(|(k, v)| match v.scalar_text() {
                Some(text) => Ok((k.clone(), text)),
                None => Err(e.err("env", format!("{k} must be a string"))),
            })
            .collect();
    }
    e.strings("env")?
        .into_iter()
        .map(|entry| match entry.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(e.err("env", format!("{entry:?} is not NAME=value"))),
        })
        .collect()
}

/// A model's engine keys; `None` for a model without `engine`, or whose `cmd` wins.
pub fn decode_model_engine(
    id: &str,
    m: &MapReader<'_>,
    engines: &BTreeMap<&'static str, EngineSettings>,
    warnings: &mut Vec<String>,
) -> Result<Option<EngineModel>, ConfigError> {
    let Some(kind) = engine_kind(id, m)? else {
        return Ok(None);
    };
    if cmd_wins(m, warnings)? {
        return Ok(None);
    }
    let settings = engines.get(kind.name()).cloned().unwrap_or_default();
    let command = engine_command(m, kind, settings.command)?;
    let source = model_source(id, m)?;
    Ok(Some(EngineModel {
        kind,
        command,
        env: settings.env,
        source,
        sha256: sha256(m)?,
        ctx: positive(m, "ctx")?,
        slots: positive(m, "slots")?.map(|n| n as usize),
        args: args(m)?,
        task: task(m)?,
        served_name: id.to_string(),
    }))
}

/// A model that names an engine and also gives a `cmd` runs the `cmd`, with a warning that its
/// engine keys go unused.
fn cmd_wins(m: &MapReader<'_>, warnings: &mut Vec<String>) -> Result<bool, ConfigError> {
    let given = m.string("cmd")?.is_some_and(|c| !c.trim().is_empty());
    if given {
        warnings.push(format!(
            "{}: cmd is given, so it runs as written and engine, source, ctx, slots and args are not used",
            m.path
        ));
    }
    Ok(given)
}

/// The model's `source`, which a model served by an engine needs.
fn model_source(id: &str, m: &MapReader<'_>) -> Result<Source, ConfigError> {
    let source_text = m
        .string("source")?
        .ok_or_else(|| m.err("source", format!("model {id} names an engine but no source: add source: hf://org/repo, s3://bucket/key, ollama://name:tag, a URL or a path")))?;
    Source::parse(&source_text).map_err(|e| m.err("source", e))
}

/// The model's `engine`; `None` without one, where a `source` alone is an error (it would be
/// ignored).
fn engine_kind(id: &str, m: &MapReader<'_>) -> Result<Option<EngineKind>, ConfigError> {
    let Some(kind_name) = m.string("engine")? else {
        if m.get("source").is_some() {
            return Err(m.err(
                "source",
                format!(
                    "model {id} has a source but no engine: add engine: llama_cpp (or {})",
                    kind_names().join(", ")
                ),
            ));
        }
        return Ok(None);
    };
    let kind = EngineKind::parse(&kind_name).ok_or_else(|| {
        m.err(
            "engine",
            format!(
                "unknown engine {kind_name:?}: use one of {}",
                kind_names().join(", ")
            ),
        )
    })?;
    Ok(Some(kind))
}

/// The `engines.<kind>.command` configured, else the kind's default; an error for a kind that
/// has none.
fn engine_command(
    m: &MapReader<'_>,
    kind: EngineKind,
    configured: Vec<String>,
) -> Result<Vec<String>, ConfigError> {
    let command = match configured {
        c if !c.is_empty() => c,
        _ => kind.default_command(),
    };
    if command.is_empty() {
        return Err(m.err(
            "engine",
            format!(
                "engine {} has no default command: set engines.{}.command",
                kind.name(),
                kind.name()
            ),
        ));
    }
    Ok(command)
}

fn sha256(m: &MapReader<'_>) -> Result<Option<String>, ConfigError> {
    let Some(text) = m.string("sha256")? else {
        return Ok(None);
    };
    let hex = text
        .trim()
        .trim_start_matches("sha256:")
        .to_ascii_lowercase();
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(m.err("sha256", "must be 64 hexadecimal digits"));
    }
    Ok(Some(hex))
}

fn positive(m: &MapReader<'_>, key: &str) -> Result<Option<u64>, ConfigError> {
    match m.int(key)? {
        None => Ok(None),
        Some(n) if n > 0 => Ok(Some(n as u64)),
        Some(_) => Err(m.err(key, "must be a number above 0")),
    }
}

/// `args` as a list, or one string split like a command.
fn args(m: &MapReader<'_>) -> Result<Vec<String>, ConfigError> {
    match m.get("args").map(|n| &n.value) {
        None => Ok(Vec::new()),
        Some(Value::Str(s)) => {
            shlex::split(s).ok_or_else(|| m.err("args", "cannot split: unbalanced quotes"))
        }
        Some(_) => m.strings("args"),
    }
}

fn task(m: &MapReader<'_>) -> Result<Task, ConfigError> {
    match m.string("task")? {
        None => Ok(Task::default()),
        Some(t) => Task::parse(&t).ok_or_else(|| {
            m.err(
                "task",
                format!("unknown task {t:?}: use text-generation or embedding"),
            )
        }),
    }
}

/// True when a model entry builds its command from an engine (so `${PORT}` is its own).
pub fn builds_command(model: &Node) -> bool {
    let cmd_given =
        matches!(model.get("cmd"), Some(Node { value: Value::Str(s), .. }) if !s.trim().is_empty());
    let named = |key| model.get(key).is_some_and(|n: &Node| !n.is_null());
    (named("engine") || named("source")) && !cmd_given
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
