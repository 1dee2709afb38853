//! Ollama's API in front of any engine, for the clients that speak only it (Home Assistant, IDE
//! plug-ins, Ollama-first chat apps): the model list, running models and a model's details are
//! answered from what corral knows; chat, generate and embeddings are translated to the engine's
//! OpenAI routes and sent through the model routes' own pipeline (admission, keys' model lists,
//! queueing and loading, metering), and their answers translated back, streamed as NDJSON.
//!
//! The files: `request.rs` (an Ollama request as an OpenAI one), `answer.rs` (a whole OpenAI
//! answer as Ollama's), `stream.rs` (an event stream as NDJSON), `infer.rs` (the round trip),
//! `listing.rs` (`/api/tags`, `/api/ps`, `/api/show`) with `facts.rs` (what the weights say),
//! `keep_alive.rs` and `errors.rs`.

mod answer;
mod errors;
mod facts;
mod infer;
mod keep_alive;
mod listing;
mod names;
mod request;
mod stream;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response};

use crate::api::App;
use crate::config::Config;
use crate::proxy::body::{Body, BoxError};
use crate::proxy::error::Error;

/// What an Ollama route asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    Tags,
    Ps,
    Show,
    Chat,
    Generate,
    Embed,
    /// The older single-prompt embedding route.
    Embeddings,
    /// A route of Ollama's model store that corral does not serve, by name.
    NotServed(&'static str),
}

/// The routes of Ollama's model store, answered with what corral does instead.
const STORE: &[&str] = &["pull", "push", "create", "copy", "delete", "blobs"];

/// The Ollama call a request makes, if the API is on. Only paths under `/api/` are looked at,
/// after the model routes failed to match, so the OpenAI routes never pay for these.
pub fn call(config: &Config, method: &Method, path: &str) -> Option<Call> {
    let rest = path.strip_prefix("/api/")?;
    if !config.ollama_api {
        return None;
    }
    let read = *method == Method::GET || *method == Method::HEAD;
    let post = *method == Method::POST;
    Some(match rest {
        "tags" if read => Call::Tags,
        "ps" if read => Call::Ps,
        "show" if post => Call::Show,
        "chat" if post => Call::Chat,
        "generate" if post => Call::Generate,
        "embed" if post => Call::Embed,
        "embeddings" if post => Call::Embeddings,
        _ => Call::NotServed(store_route(rest)?),
    })
}

/// The store route `rest` (the path after `/api/`) names, whatever the method.
fn store_route(rest: &str) -> Option<&'static str> {
    let first = rest.split('/').next().unwrap_or(rest);
    let name = STORE.iter().find(|s| **s == first)?;
    (rest == *name || *name == "blobs").then_some(*name)
}

/// Whether `path` is one of Ollama's routes (or `/api/version`, which its clients ask first):
/// they need the inference scope, as the model routes do, so an inference key reaches them.
pub fn inference_scoped(path: &str) -> bool {
    let Some(rest) = path.strip_prefix("/api/") else {
        return false;
    };
    matches!(
        rest,
        "tags" | "ps" | "show" | "chat" | "generate" | "embed" | "embeddings" | "version"
    ) || store_route(rest).is_some()
}

/// Reads a whole body. Boxed as `Send`: the collect future's error type otherwise trips the
/// compiler's check of every caller's future for `Send` (as in `forward.rs`).
fn collect(
    body: impl http_body::Body<Data = Bytes, Error = BoxError> + Send + 'static,
) -> futures_util::future::BoxFuture<'static, Result<Bytes, BoxError>> {
    use http_body_util::BodyExt;
    Box::pin(async move { Ok(body.collect().await?.to_bytes()) })
}

/// The answer's work, boxed once as the model routes' is.
pub type Served<'a> = Pin<Box<dyn Future<Output = Result<Response<Body>, Error>> + Send + 'a>>;

/// Answers an Ollama call. Every failure is answered in Ollama's shape, `{"error": "..."}`, so
/// nothing reaches llama-swap's error rendering.
pub fn serve<'a, B>(
    app: &'a Arc<App>,
    req: Request<B>,
    remote: SocketAddr,
    call: Call,
) -> Served<'a>
where
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError> + std::error::Error + Send + Sync + 'static,
{
    let caller = req
        .extensions()
        .get::<crate::routing::grant::Caller>()
        .map(|c| c.0.clone());
    match call {
        Call::Tags => Box::pin(async move { Ok(listing::tags(app, caller.as_deref()).await) }),
        Call::Ps => Box::pin(async move { Ok(listing::ps(app, caller.as_deref()).await) }),
        Call::Show => Box::pin(async move { Ok(listing::show(app, req, caller.as_deref()).await) }),
        Call::NotServed(route) => Box::pin(std::future::ready(Ok(errors::not_served(route)))),
        Call::Chat | Call::Generate | Call::Embed | Call::Embeddings => {
            Box::pin(async move { Ok(infer::infer(app, req, remote, call).await) })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml: &str) -> Config {
        crate::config::load_str("t.yaml", yaml, &|_| None)
            .unwrap()
            .config
    }

    #[test]
    fn calls_are_found_under_api_only_while_the_api_is_on() {
        let on = config("models: {}\n");
        let (get, post) = (Method::GET, Method::POST);
        assert_eq!(call(&on, &get, "/api/tags"), Some(Call::Tags));
        assert_eq!(call(&on, &Method::HEAD, "/api/tags"), Some(Call::Tags));
        assert_eq!(call(&on, &get, "/api/ps"), Some(Call::Ps));
        assert_eq!(call(&on, &post, "/api/chat"), Some(Call::Chat));
        assert_eq!(call(&on, &post, "/api/embeddings"), Some(Call::Embeddings));
        assert_eq!(call(&on, &post, "/api/pull"), Some(Call::NotServed("pull")));
        assert_eq!(
            call(&on, &Method::DELETE, "/api/delete"),
            Some(Call::NotServed("delete"))
        );
        assert_eq!(
            call(&on, &Method::HEAD, "/api/blobs/sha256:00"),
            Some(Call::NotServed("blobs"))
        );
        assert_eq!(call(&on, &get, "/api/chat"), None, "a GET is not a chat");
        assert_eq!(
            call(&on, &get, "/api/version"),
            None,
            "llama-swap's answers it"
        );
        assert_eq!(call(&on, &get, "/api/pullx"), None);
        assert_eq!(call(&on, &post, "/v1/chat/completions"), None);
        let off = config("ollamaApi: false\nmodels: {}\n");
        assert_eq!(call(&off, &get, "/api/tags"), None);
        assert_eq!(call(&off, &post, "/api/chat"), None);
    }

    #[test]
    fn ollama_routes_take_the_inference_scope() {
        for path in [
            "/api/tags",
            "/api/chat",
            "/api/version",
            "/api/blobs/x",
            "/api/pull",
        ] {
            assert!(inference_scoped(path), "{path}");
        }
        for path in ["/api/state", "/api/models/unload", "/api/events", "/tags"] {
            assert!(!inference_scoped(path), "{path}");
        }
    }
}
