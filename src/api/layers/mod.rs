//! The request pipeline as tower layers around the management route table, outermost first:
//! CORS headers, error rendering, the open routes, auth, and the split of model requests from the table.
//!
//! Every service borrows the `App` its request runs under (a reload swaps `App` between two
//! requests on one connection), so building the stack per request costs a few pointers and no
//! allocation or reference count. Each is always ready.

mod auth;
mod cors;
mod errors;
mod model;
mod open;

use crate::api::model_request::Routed;
use std::future::{ready, Ready};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::future::Either;
use http::{Request, Response};

use crate::api::admin;
use crate::api::App;
use crate::proxy::body::Body;
use crate::proxy::error::Error;

pub use auth::AuthLayer;
pub use cors::CorsLayer;
pub use errors::RenderErrorsLayer;
pub use model::ModelRequestLayer;
pub use open::OpenRoutesLayer;

/// A future a layer answers at once, or leaves to the service it wraps.
type Answer<F> = Either<Ready<Result<Response<Body>, Error>>, F>;

fn answer_now<F>(result: Result<Response<Body>, Error>) -> Answer<F> {
    Either::Left(ready(result))
}

/// The management routes (`admin.rs`'s table) as the innermost service.
#[derive(Clone, Copy)]
pub struct RouteTable<'a> {
    app: &'a Arc<App>,
}

impl<'a> RouteTable<'a> {
    pub fn new(app: &'a Arc<App>) -> Self {
        RouteTable { app }
    }
}

impl<'a, B> tower::Service<Request<B>> for RouteTable<'a>
where
    B: http_body::Body<Data = Bytes> + Send + 'a,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    type Response = Response<Body>;
    type Error = Error;
    type Future = Routed<'a>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let app = self.app;
        Box::pin(async move {
            // the request moves into its handler; the route is matched on a copy of its path
            let path = req.uri().path().to_string();
            let method = req.method().clone();
            admin::route(app, req, &method, &path).await
        })
    }
}

#[cfg(test)]
mod stub {
    //! An inner service that keeps the head of each request it is called with and answers as told.

    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll};

    use http::{Request, Response};

    use crate::proxy::body::Body;
    use crate::proxy::error::Error;

    /// What test requests carry.
    pub type Sent = http_body_util::Full<bytes::Bytes>;

    #[derive(Clone)]
    pub struct Stub {
        pub heads: Arc<Mutex<Vec<http::request::Parts>>>,
        answer: fn() -> Result<Response<Body>, Error>,
    }

    impl Stub {
        pub fn answering(answer: fn() -> Result<Response<Body>, Error>) -> Stub {
            Stub {
                heads: Default::default(),
                answer,
            }
        }

        pub fn calls(&self) -> usize {
            self.heads.lock().unwrap().len()
        }
    }

    impl tower::Service<Request<Sent>> for Stub {
        type Response = Response<Body>;
        type Error = Error;
        type Future = std::future::Ready<Result<Response<Body>, Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: Request<Sent>) -> Self::Future {
            self.heads.lock().unwrap().push(req.into_parts().0);
            std::future::ready((self.answer)())
        }
    }

    pub fn ok() -> Result<Response<Body>, Error> {
        Ok(crate::api::text(http::StatusCode::OK, "inner"))
    }

    pub fn request(method: &str, uri: &str, headers: &[(&str, &str)]) -> Request<Sent> {
        with_body(method, uri, headers, "")
    }

    pub fn with_body(
        method: &str,
        uri: &str,
        headers: &[(&str, &str)],
        body: &'static str,
    ) -> Request<Sent> {
        let mut req = Request::builder().method(method).uri(uri);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        req.body(Sent::from(body)).unwrap()
    }

    pub async fn text(resp: Response<Body>) -> String {
        let bytes = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap()
            .to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }
}
