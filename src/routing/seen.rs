//! A model request's record: what it learns on its way (its model, its place in the in-flight
//! list, its capture), and on its end the metrics and activity entry it leaves.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use http::{header, Method, Response, StatusCode};
use http_body_util::BodyExt;

use crate::config::Config;
use crate::observe::activity;
use crate::observe::cancel::Cancel;
use crate::observe::captures;
use crate::observe::inflight;
use crate::observe::meter;
use crate::proxy::body::Body;
use crate::proxy::error::Error;
use crate::routing::grant::{self, Grant};
use crate::routing::Gateway;

/// What a model request learns on its way: its model, and its place in the in-flight list.
pub struct Seen {
    model: Option<Arc<str>>,
    holds: Vec<Box<dyn Send + Sync>>,
    guard: Option<inflight::Guard>,
    pub(crate) cancel: Arc<Cancel>,
    method: Method,
    /// The request's path: one of the model routes' own, or a passthrough path as sent.
    path: Cow<'static, str>,
    remote: SocketAddr,
    /// Its request, when captures are on.
    pub(crate) capture: Option<captures::Capture>,
    /// The grant of the key it presented; `None` when no keys are configured.
    pub(crate) caller: Option<Arc<Grant>>,
    /// The model name it sent, once read (after the active profile).
    named: Option<Arc<str>>,
}

impl Seen {
    /// Inlined: the model routes and the requests other APIs translate call it from two
    /// instantiations of the request's future, and a call would move the record twice.
    #[inline(always)]
    pub(crate) fn new(
        gateway: &Gateway,
        method: &Method,
        path: Cow<'static, str>,
        headers: &http::HeaderMap,
        remote: SocketAddr,
        caller: Option<Arc<Grant>>,
    ) -> Seen {
        let capture = gateway
            .activity
            .captures
            .as_ref()
            .and_then(|c| c.begin(&path, headers));
        Seen {
            model: None,
            holds: Vec::new(),
            guard: None,
            cancel: Cancel::new(),
            method: method.clone(),
            path,
            remote,
            capture,
            caller,
            named: None,
        }
    }

    /// The model name the request sent, which a key's model list may name as well as the model
    /// it resolves to.
    pub(crate) fn named(&mut self, name: &str) {
        if self.caller.is_some() {
            self.named = Some(name.into());
        }
    }

    /// Ok when no key was checked or the key may use the model `model()` names (a local
    /// model's id or `peer/model`) or the name the request sent for it. The name is made only
    /// for a request that presented a key.
    pub(crate) fn may_use(&self, model: impl FnOnce() -> String) -> Result<(), Error> {
        let Some(grant) = &self.caller else {
            return Ok(());
        };
        if self.named.as_deref().is_some_and(|n| grant.may_use(n)) {
            return Ok(());
        }
        grant::may_use(Some(grant), &model())
    }

    /// Ok when no key was checked or the key has the admin scope; `what` names what needs it.
    pub(crate) fn needs_admin(&self, what: &str) -> Result<(), Error> {
        grant::needs_admin(self.caller.as_deref(), what)
    }

    /// Keeps something alive until the response body ends.
    pub(crate) fn hold(&mut self, thing: Box<dyn Send + Sync>) {
        self.holds.push(thing);
    }

    /// The model is known, and the key may use it ([`Seen::may_use`], asked first): list the
    /// request as in flight.
    pub(crate) fn found(&mut self, gateway: &Gateway, model: Arc<str>) {
        self.guard = Some(gateway.inflight.register(
            model.clone(),
            self.path.clone(),
            &self.method,
            self.remote.ip(),
            self.cancel.clone(),
        ));
        self.model = Some(model);
    }
}

/// Records a model request: per model when the model is known, else as unknown.
///
/// Inlined for the same reason as [`Seen::new`]: called out of line, the record is moved into
/// the call.
#[inline(always)]
pub(crate) fn metered(
    gateway: &Arc<Gateway>,
    route: &'static str,
    started: Instant,
    mut seen: Seen,
    result: Result<Response<Body>, Error>,
) -> Result<Response<Body>, Error> {
    let Some(model) = seen.model.take() else {
        if matches!(result, Err(Error::NoModel | Error::UnknownModel)) {
            gateway.metrics.requests.unknown_model.inc();
        }
        return result;
    };
    let status = match &result {
        Ok(resp) => resp.status(),
        Err(e) => e.status(),
    };
    let labels = meter::Labels {
        model,
        route,
        status: meter::status_class(status),
        key: seen.caller.as_ref().map(|g| g.label.clone()),
    };
    match result {
        Err(e) => Err(failed(gateway, labels, started, seen, status, e)),
        Ok(resp) => Ok(answered(gateway, labels, started, seen, status, resp)),
    }
}

/// A request that failed before its answer: counted, and logged with its (redacted) error.
fn failed(
    gateway: &Gateway,
    labels: meter::Labels,
    started: Instant,
    seen: Seen,
    status: StatusCode,
    e: Error,
) -> Error {
    meter::record_error(&gateway.metrics, &labels, started);
    gateway.activity.record(activity::Entry {
        model: labels.model,
        req_path: seen.path,
        status: status.as_u16(),
        content_type: "application/json".into(),
        tokens: None,
        duration_ms: started.elapsed().as_millis() as u64,
        ttft_ms: None,
        error: Some(gateway.config.redactor.text(&e.to_string()).into_owned()),
        capture: seen.capture,
        key: labels.key.clone(),
        src: Some(seen.remote),
    });
    e
}

/// An answer on its way back: its body is metered, and holds the request's in-flight place and
/// whatever it kept alive until the last byte is sent.
fn answered(
    gateway: &Arc<Gateway>,
    labels: meter::Labels,
    started: Instant,
    seen: Seen,
    status: StatusCode,
    resp: Response<Body>,
) -> Response<Body> {
    let Seen {
        guard,
        cancel,
        holds,
        path,
        capture,
        remote,
        ..
    } = seen;
    let (parts, body) = resp.into_parts();
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let idle_limit = stream_idle_limit(&gateway.config, &labels.model);
    let length = parts.headers.get(header::CONTENT_LENGTH);
    let length_framed = length.is_some();
    let declared = length.and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    let recording = capture
        .zip(gateway.activity.captures.as_ref())
        .map(|(c, captures)| captures.record(c, &parts.headers, declared));
    // set in place: the body is moved once, into its box
    let mut body = meter::Metered::new(body, &gateway.metrics, labels, started, content_type);
    body.with_inflight(guard, cancel)
        .with_idle_limit(idle_limit)
        .length_framed(length_framed)
        .logged_in(gateway.activity.clone(), path, status, content_type, remote)
        .recording(recording)
        .holding(holds);
    Response::from_parts(parts, BodyExt::boxed(body))
}

/// `timeouts.streamIdle` of a model, or of the peer for `peer/model`.
fn stream_idle_limit(config: &Config, model: &str) -> Option<std::time::Duration> {
    if let Some(m) = config.models.get(model) {
        return m.timeouts.stream_idle;
    }
    let (peer, _) = model.split_once('/')?;
    config.peers.get(peer)?.timeouts.stream_idle
}
