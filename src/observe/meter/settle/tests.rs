use super::*;
use crate::metrics::Metrics;
use crate::observe::activity::Activity;

const ANSWER: &[u8] = br#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":16}}"#;

/// A finished chat answer counted in `series` and logged in `log`.
fn pending(series: &Arc<RequestSeries>, log: &Arc<Activity>) -> Pending {
    let mut usage = UsageTap::new("application/json");
    usage.observe(&bytes::Bytes::from_static(ANSWER));
    Pending {
        key_series: None,
        key: None,
        series: series.clone(),
        model: "m".into(),
        elapsed: Duration::from_millis(12),
        ttft_ms: Some(3),
        usage,
        activity: Some(Logged::now(ActivityRecord {
            log: log.clone(),
            req_path: "/v1/chat/completions".into(),
            status: 200,
            content_type: "application/json".into(),
            src: "127.0.0.1:9".parse().unwrap(),
        })),
        recording: None,
    }
}

fn logged(log: &Activity) -> u64 {
    log.query("").unwrap()["total"].as_u64().unwrap()
}

/// Held by the tests that look into a queue and by the one that settles them all.
static READERS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn series_and_log() -> (Arc<RequestSeries>, Arc<Activity>) {
    let metrics = Metrics::new();
    let series = metrics.requests.series("m", "/v1/chat/completions", "2xx");
    (series, Arc::new(Activity::new(10)))
}

#[test]
fn a_settle_counts_the_tokens_and_logs_the_request() {
    let (series, log) = series_and_log();
    // no settler on this thread: at once
    queue(pending(&series, &log));
    assert_eq!(series.answered.get(), 1);
    assert_eq!(series.prompt_tokens.get(), 7);
    assert_eq!(series.completion_tokens.get(), 16);
    assert_eq!(series.duration.get_sample_count(), 1);
    let rows = log.query("").unwrap();
    assert_eq!(rows["data"][0]["duration_ms"], 12, "{rows}");
    assert_eq!(rows["data"][0]["tokens"]["output_tokens"], 16, "{rows}");
}

#[test]
fn a_request_that_ends_in_a_connection_poll_is_settled_when_the_poll_returns() {
    let _alone = READERS.lock();
    let (series, log) = series_and_log();
    let in_poll = after_the_write(|| {
        queue(pending(&series, &log));
        // what the poll goes on to do (hyper's write) comes first
        (series.answered.get(), logged(&log))
    });
    assert_eq!(in_poll, (0, 0), "settled before the poll returned");
    assert_eq!(series.answered.get(), 1);
    assert_eq!(series.prompt_tokens.get(), 7);
    assert_eq!(logged(&log), 1);
}

#[test]
fn a_reader_settles_what_another_thread_has_queued() {
    let _alone = READERS.lock();
    let (series, log) = series_and_log();
    after_the_write(|| {
        queue(pending(&series, &log));
        std::thread::scope(|s| {
            s.spawn(settle_all);
        });
        assert_eq!(series.answered.get(), 1);
        assert_eq!(logged(&log), 1);
    });
    assert_eq!(series.answered.get(), 1, "settled once");
}

#[test]
fn a_poll_that_panics_leaves_its_queue_to_the_readers_and_the_next_poll() {
    let (series, log) = series_and_log();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        after_the_write(|| {
            queue(pending(&series, &log));
            panic!("a handler bug");
        })
    }));
    assert!(panicked.is_err());
    // outside a poll again: at once
    let (other, other_log) = series_and_log();
    queue(pending(&other, &other_log));
    assert_eq!(other.answered.get(), 1);
    // the panicked poll's request is not lost
    after_the_write(|| ());
    assert_eq!(series.answered.get(), 1);
}

#[test]
fn the_log_keeps_the_order_the_answers_ended_in() {
    let (series, log) = series_and_log();
    let first = pending(&series, &log);
    let mut second = pending(&series, &log);
    second.elapsed = Duration::from_millis(40);
    // the later answer's bookkeeping done first (another thread's settler came first)
    second.settle();
    first.settle();
    let rows = log.query("").unwrap();
    let durations: Vec<_> = (0..2)
        .map(|i| rows["data"][i]["duration_ms"].clone())
        .collect();
    assert_eq!(durations, [40, 12], "newest first: {rows}");
}
