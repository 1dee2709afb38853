//! The round trip of a chat, generate or embedding request: its body read and translated, sent as
//! an OpenAI request through the model routes' pipeline (so it is admitted, held to the key's
//! model list, queued, loaded and metered as theirs are), and the answer translated back:
//! streamed as NDJSON, or whole.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};

use super::answer;
use super::errors::{self, error};
use super::request::{self, Asked, Translated, Upstream};
use super::stream::{Ndjson, NdjsonBody};
use super::{keep_alive, names, Call};
use crate::api::App;
use crate::proxy::body::{full, Body, BoxError};
use crate::proxy::error::Error;
use crate::routing::extract;
use crate::routing::grant::{self, Caller};

const NDJSON: &str = "application/x-ndjson";

/// Answers an Ollama chat, generate or embedding request; every failure in Ollama's shape.
pub async fn infer<B>(
    app: &Arc<App>,
    req: Request<B>,
    remote: SocketAddr,
    call: Call,
) -> Response<Body>
where
    B: http_body::Body<Data = Bytes> + Send,
    B::Error: Into<BoxError> + std::error::Error + Send + Sync + 'static,
{
    let started = Instant::now();
    let (parts, body) = req.into_parts();
    let declared = extract::declared_length(&parts.headers);
    let read = extract::read_body(declared, body, app.limits.body_bytes, &app.budget).await;
    let value: Value = match read {
        Err(e) => return errors::from_error(&e, ""),
        Ok((bytes, _charge)) => match serde_json::from_slice(&bytes) {
            Ok(v) => v,
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    &format!("the request body is not JSON: {e}"),
                )
            }
        },
    };
    match request::translate(call, &value) {
        Err(why) => error(StatusCode::BAD_REQUEST, &why),
        Ok(Translated::LoadOnly(asked)) => load_only(app, &parts, asked).await,
        Ok(Translated::Forward(asked, upstream)) => {
            drop(value);
            forward(app, parts, remote, (asked, upstream), started).await
        }
    }
}

/// Sends the translated request down the model routes' pipeline and translates the answer.
async fn forward(
    app: &Arc<App>,
    mut parts: http::request::Parts,
    remote: SocketAddr,
    (asked, upstream): (Asked, Upstream),
    started: Instant,
) -> Response<Body> {
    let name = names::routed(app, &asked.model);
    let mut body = upstream.body;
    body["model"] = json!(name);
    let bytes = Bytes::from(body.to_string());
    parts.uri = http::Uri::from_static(upstream.path);
    let headers = &mut parts.headers;
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
    // the answer is read to be translated: it must come as the engine wrote it
    headers.remove(header::ACCEPT_ENCODING);
    headers.remove(header::TRANSFER_ENCODING);
    let req = Request::from_parts(parts, Full::new(bytes));
    let answer =
        crate::api::model_request::translated(app, req, remote, upstream.route, upstream.path);
    let resp = match answer.await {
        Err(e) => return errors::from_error(&e.redacted(&app.config.redactor), &asked.model),
        Ok(resp) if !resp.status().is_success() => return errors::from_upstream(resp).await,
        Ok(resp) => resp,
    };
    if let Some(ttl) = asked.keep_alive {
        keep_alive::apply(app, &name, ttl);
    }
    let event_stream = extract::content_type(resp.headers()).starts_with("text/event-stream");
    match asked.stream && event_stream {
        true => streamed(resp, &asked, started),
        false => whole(resp, &asked, started).await,
    }
}

/// The engine's event stream, translated as it goes.
fn streamed(resp: Response<Body>, asked: &Asked, started: Instant) -> Response<Body> {
    let body = NdjsonBody::new(resp.into_body(), Ndjson::new(asked, started));
    Response::builder()
        .header(header::CONTENT_TYPE, NDJSON)
        .body(BodyExt::boxed(body))
        .expect("valid response")
}

/// The engine's whole answer as one object: plain JSON, or one NDJSON line when a stream was
/// asked for and the engine answered whole.
async fn whole(resp: Response<Body>, asked: &Asked, started: Instant) -> Response<Body> {
    let bytes = match super::collect(resp.into_body()).await {
        Ok(bytes) => bytes,
        Err(e) => {
            return error(
                StatusCode::BAD_GATEWAY,
                &format!("the engine's answer broke off: {e}"),
            )
        }
    };
    let openai: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => {
            return error(
                StatusCode::BAD_GATEWAY,
                &format!("the engine's answer is not JSON: {e}"),
            )
        }
    };
    one(asked, answer::whole(asked, &openai, started))
}

/// One object, as the request asked: a JSON answer, or a stream of one line.
fn one(asked: &Asked, object: Value) -> Response<Body> {
    if !asked.stream {
        return crate::api::json(StatusCode::OK, &object);
    }
    Response::builder()
        .header(header::CONTENT_TYPE, NDJSON)
        .body(full(format!("{object}\n")))
        .expect("valid response")
}

/// A generate without a prompt or a chat without messages: the model is loaded (and its
/// `keep_alive` set), or with `keep_alive: 0` unloaded, as Ollama does, and the answer says which.
async fn load_only(app: &Arc<App>, parts: &http::request::Parts, asked: Asked) -> Response<Body> {
    let name = names::routed(app, &asked.model);
    let Some((target, model)) = names::local(app, &name) else {
        return errors::from_error(&Error::UnknownModel, &asked.model);
    };
    let caller = parts.extensions.get::<Caller>().map(|c| &*c.0);
    if let Err(e) = grant::may_use(caller, &name).or_else(|_| grant::may_use(caller, &model)) {
        return errors::from_error(&e, &asked.model);
    }
    let reason = if asked.keep_alive == Some(Some(Duration::ZERO)) {
        app.fleet.unload(Some(std::slice::from_ref(&model))).await;
        "unload"
    } else {
        if let Err(e) = app.fleet.acquire(&target, None).await {
            return errors::from_error(&e.redacted(&app.config.redactor), &asked.model);
        }
        if let Some(ttl) = asked.keep_alive {
            keep_alive::apply(app, &name, ttl);
        }
        "load"
    };
    let mut object = answer::head(&asked.model);
    match asked.call {
        Call::Generate => object.insert("response".into(), json!("")),
        _ => object.insert("message".into(), answer::message("", "", &[])),
    };
    object.insert("done".into(), json!(true));
    object.insert("done_reason".into(), json!(reason));
    one(&asked, Value::Object(object))
}
