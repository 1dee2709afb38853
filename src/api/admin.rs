//! Management routes, as a table: the model list, running models, loads and unloads, logs,
//! profiles, metrics and reports. Order matters where patterns overlap: the first row whose methods
//! and pattern accept a request answers it, and a request no row accepts gets the plain 404.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};

use crate::api::control;
use crate::api::json;
use crate::api::log_routes;
use crate::api::reports;
use crate::api::router::{self, Methods, Params, Route};
use crate::api::App;
use crate::proxy::body::Body;
use crate::proxy::error::Error;

/// What answers a management route.
#[derive(Debug, Clone, Copy)]
enum Page {
    ModelList,
    Running,
    State,
    Events,
    Profiles,
    SetProfile,
    Activity,
    Stats,
    Metrics,
    UnloadAll,
    UnloadAllJson,
    Performance,
    Lifecycle,
    ModelDetail,
    Load,
    Version,
    Logs,
    LogStream,
    CancelInflight,
    LoadModel,
    UnloadModel,
    ModelRecord,
    RouterLoad,
    RouterUnload,
    RouterEvents,
}

const fn row(methods: Methods, pattern: &'static str, handler: Page) -> Route<Page> {
    Route {
        methods,
        pattern,
        handler,
    }
}

use Methods::{Post, Put, Read};

/// Every management route, in the order they are tried.
const ROUTES: &[Route<Page>] = &[
    row(Read, "/v1/models", Page::ModelList),
    row(Read, "/v1/models/{id*}", Page::ModelRecord),
    row(Read, "/models", Page::ModelList),
    row(Post, "/models/load", Page::RouterLoad),
    row(Post, "/models/unload", Page::RouterUnload),
    row(Read, "/models/sse", Page::RouterEvents),
    row(Read, "/running", Page::Running),
    row(Read, "/api/state", Page::State),
    row(Read, "/api/events", Page::Events),
    row(Read, "/api/profiles", Page::Profiles),
    row(Put, "/api/profiles/active", Page::SetProfile),
    row(Read, "/api/metrics/activity", Page::Activity),
    row(Read, "/api/metrics/stats", Page::Stats),
    row(Read, "/metrics", Page::Metrics),
    row(Read, "/unload", Page::UnloadAll),
    row(Post, "/api/models/unload", Page::UnloadAllJson),
    row(Read, "/api/performance", Page::Performance),
    row(Read, "/api/hardware", Page::Performance),
    row(Read, "/api/captures/{id*}", Page::Performance),
    row(Read, "/api/lifecycle", Page::Lifecycle),
    row(Read, "/api/models/{id}", Page::ModelDetail),
    row(Read, "/api/load", Page::Load),
    row(Read, "/api/version", Page::Version),
    row(Read, "/logs", Page::Logs),
    row(Read, "/logs/stream", Page::LogStream),
    row(Read, "/logs/stream/{id*}", Page::LogStream),
    row(Post, "/api/inflight/{id}/cancel", Page::CancelInflight),
    row(Post, "/api/models/load/{id*}", Page::LoadModel),
    row(Post, "/api/models/unload/{id*}", Page::UnloadModel),
];

/// The grant of the key a request presented, when keys are configured.
fn caller<B>(req: &Request<B>) -> Option<&crate::routing::grant::Grant> {
    req.extensions()
        .get::<crate::routing::grant::Caller>()
        .map(|c| &*c.0)
}

/// Answers a management route, or 404 where none matches.
pub async fn route<B>(
    app: &Arc<App>,
    req: Request<B>,
    method: &Method,
    path: &str,
) -> Result<Response<Body>, Error>
where
    B: http_body::Body<Data = Bytes> + Send,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    match router::find(ROUTES, method, path) {
        Some((page, params)) => answer(app, req, page, &params).await,
        None => Ok(not_allowed(path).unwrap_or_else(not_found)),
    }
}

/// For a path some route answers with other methods: 405 with the methods in `Allow`, as
/// llama-swap's Go mux answers, so a client that used the wrong method is told so.
fn not_allowed(path: &str) -> Option<Response<Body>> {
    let mut methods = router::methods_for(ROUTES, path);
    let model = crate::routing::inference::model_route(path).map(|_| router::Methods::Post);
    let query = crate::routing::inference::query_route(path).map(|_| router::Methods::Read);
    for m in model.into_iter().chain(query) {
        if !methods.contains(&m) {
            methods.push(m);
        }
    }
    if methods.is_empty() {
        return None;
    }
    let allow: Vec<&str> = methods.iter().map(|m| m.names()).collect();
    let response = Response::builder()
        .status(StatusCode::METHOD_NOT_ALLOWED)
        .header(header::ALLOW, allow.join(", "))
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(crate::proxy::body::full("Method Not Allowed\n"))
        .expect("valid");
    Some(response)
}

async fn answer<B>(
    app: &Arc<App>,
    req: Request<B>,
    page: Page,
    params: &Params<'_>,
) -> Result<Response<Body>, Error>
where
    B: http_body::Body<Data = Bytes> + Send,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    // what every answer so far wrote to the metrics and the activity log is there to read
    crate::observe::meter::settle_all();
    let query = req.uri().query();
    match page {
        Page::ModelList => Ok(crate::api::models::list(app, caller(&req)).await),
        Page::ModelRecord => crate::api::models::one(app, caller(&req), &params.get("id")).await,
        Page::RouterLoad => crate::api::llama_router::load(app, req).await,
        Page::RouterUnload => crate::api::llama_router::unload(app, req).await,
        Page::RouterEvents => Ok(crate::api::llama_router::stream(app)),
        Page::Running => Ok(reports::running(app)),
        Page::State => {
            crate::api::models::learn(app).await;
            Ok(json(StatusCode::OK, &crate::api::state::state(app)))
        }
        Page::Events => Ok(crate::api::events::stream(app)),
        Page::Profiles => Ok(json(StatusCode::OK, &control::profiles(app))),
        Page::SetProfile => control::set_profile(app, req).await,
        Page::Activity => reports::activity(app, query),
        Page::Stats => reports::stats(app, query),
        Page::Metrics => match query.and_then(|q| crate::routing::extract::query_param(q, "model"))
        {
            Some(model) => {
                crate::api::llama_router::engine_metrics(app, caller(&req), &model).await
            }
            None => Ok(reports::metrics(app)),
        },
        Page::UnloadAll => control::unload_all(app).await,
        Page::UnloadAllJson => control::unload_all_json(app).await,
        Page::Performance => {
            crate::api::observed::answer(app, req.uri().path(), req.uri().query()).await
        }
        Page::Lifecycle => Ok(json(StatusCode::OK, &reports::lifecycle(app))),
        Page::ModelDetail => model_detail(app, &params.get("id")),
        Page::Load => Ok(json(
            StatusCode::OK,
            &reports::load_report(app, caller(&req)),
        )),
        Page::Version => Ok(json(StatusCode::OK, &reports::version())),
        Page::Logs => Ok(log_routes::history(app, req.headers())),
        Page::LogStream => log_routes::stream(app, req.uri()),
        Page::CancelInflight => control::cancel_inflight(app, params.raw("id")),
        Page::LoadModel => control::load(app, &params.get("id")).await,
        Page::UnloadModel => control::unload(app, &params.get("id")).await,
    }
}

/// `GET /api/models/<id>`; an empty id names no model, and gets the plain 404.
fn model_detail(app: &App, id: &str) -> Result<Response<Body>, Error> {
    if id.is_empty() {
        return Ok(not_found());
    }
    Ok(json(
        StatusCode::OK,
        &crate::api::model_detail::detail(app, id)?,
    ))
}

/// The answer to a path no route serves, worded as llama-swap's (Go's) default.
fn not_found() -> Response<Body> {
    Response::builder()
        .status(StatusCode::NOT_FOUND)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(crate::proxy::body::full("404 page not found\n"))
        .expect("valid")
}
