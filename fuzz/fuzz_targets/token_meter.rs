//! An upstream response through the metering body: the token counts are read from JSON bodies and
//! SSE events as bytes pass, and the bytes must reach the client unchanged. The first byte picks
//! the content type and status; each 0xFF byte after it ends a chunk, so events split anywhere.
#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use bytes::Bytes;
use corral::{Activity, Labels, Metered, Metrics};
use http_body_util::{BodyExt, StreamBody};
use libfuzzer_sys::fuzz_target;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    })
}

fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let content_type = if selector & 1 == 0 {
        "text/event-stream"
    } else {
        "application/json"
    };
    let status = if selector & 2 == 0 { 200 } else { 500 };
    let chunks: Vec<Bytes> = rest
        .split(|&b| b == 0xFF)
        .map(Bytes::copy_from_slice)
        .collect();
    let sent: Vec<u8> = chunks.concat();
    let frames = futures_util::stream::iter(
        chunks
            .into_iter()
            .map(|c| Ok::<_, corral::BoxError>(http_body::Frame::data(c))),
    );
    let labels = Labels {
        model: "m".into(),
        route: "/v1/chat/completions".into(),
        status: "2xx",
        key: None,
    };
    let activity = Arc::new(Activity::new(10));
    let mut metered = Metered::new(
        StreamBody::new(frames).boxed(),
        metrics(),
        labels,
        Instant::now(),
        content_type,
    );
    metered.logged_in(
        activity,
        "/v1/chat/completions".into(),
        http::StatusCode::from_u16(status).unwrap(),
        content_type,
        std::net::SocketAddr::from(([127, 0, 0, 1], 9)),
    );
    let received = runtime()
        .block_on(metered.collect())
        .expect("a body without errors reads to the end")
        .to_bytes();
    assert_eq!(&received[..], &sent[..], "the bytes pass unchanged");
});
