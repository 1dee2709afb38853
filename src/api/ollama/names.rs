//! Model names as Ollama's clients send them: with a tag (`qwen:latest`) where corral's ids have
//! none. `:latest` is dropped when the name with it names nothing, as Ollama reads a name without
//! a tag as `:latest`.

use crate::api::App;
use crate::config::catalog::Target;
use crate::routing::names;

const LATEST: &str = ":latest";

/// The name to route: `name` itself when it names something, else without its `:latest` tag.
pub fn routed(app: &App, name: &str) -> String {
    match name.strip_suffix(LATEST) {
        Some(bare) if !names_something(app, name) => bare.to_string(),
        _ => name.to_string(),
    }
}

/// Whether `name` is a local model, alias, pool, selector, profile pin or peer's model.
fn names_something(app: &App, name: &str) -> bool {
    app.config.selectors.contains_key(name)
        || names::apply_profile(&app.config, &app.profiles, name).as_deref() != Some(name)
        || names::resolve_plain(&app.config, &app.catalog, name).is_ok()
}

/// The local target and model id `name` resolves to (after the active profile: an alias, a
/// replica or a pool names its model's).
pub fn local(app: &App, name: &str) -> Option<(Target, String)> {
    let name = names::apply_profile(&app.config, &app.profiles, name)?;
    match names::resolve_plain(&app.config, &app.catalog, &name).ok()? {
        names::Route::Local { target, model } => Some((target, model.to_string())),
        _ => None,
    }
}
