use super::*;

fn entry(model: &str, status: u16, prompt: u64, speed: f64) -> Entry {
    Entry {
        key: None,
        model: model.into(),
        req_path: "/v1/chat/completions".into(),
        status,
        content_type: "application/json".into(),
        tokens: Some(Tokens {
            prompt,
            completion: 2,
            tokens_per_second: Some(speed),
            ..Default::default()
        }),
        duration_ms: 5,
        ttft_ms: Some(1),
        error: (status >= 400).then(|| "boom".to_string()),
        capture: None,
        src: None,
    }
}

/// A model id shared with the config is kept as it is (no lookup); one made for its row
/// alone is swapped for the copy the log shares.
#[test]
fn rows_share_model_names() {
    let log = Activity::new(10);
    let config_id: Arc<str> = "m".into();
    let mut shared = entry("m", 200, 1, 1.0);
    shared.model = config_id.clone();
    log.record(shared);
    log.record(entry("peer/m", 200, 1, 1.0));
    log.record(entry("peer/m", 200, 1, 1.0));
    let rows = log.rows();
    assert!(Arc::ptr_eq(&rows[0].model, &config_id));
    assert!(Arc::ptr_eq(&rows[1].model, &rows[2].model));
}

#[test]
fn rows_are_filtered_sorted_paged_and_bounded() {
    let a = Activity::new(3);
    for (i, m) in ["x", "y", "x", "x"].iter().enumerate() {
        a.record(entry(
            m,
            if i == 1 { 500 } else { 200 },
            i as u64 * 10,
            i as f64,
        ));
    }
    let all = a.query("").unwrap();
    assert_eq!(all["total"], 3, "the oldest row went");
    assert_eq!(all["data"][0]["id"], 4, "newest first");
    let x = a
        .query("model=x&sort=prompt&order=asc&limit=1&page=2")
        .unwrap();
    assert_eq!(
        (x["total"].clone(), x["total_pages"].clone()),
        (json!(2), json!(2))
    );
    assert_eq!(x["data"][0]["tokens"]["input_tokens"], 30);
    assert_eq!(x["data"][0]["tokens"]["cache_tokens"], -1);
    let y = a.query("model=y").unwrap();
    assert_eq!(y["data"][0]["error_msg"], "boom");
    for bad in [
        "limit=0",
        "limit=1000",
        "page=0",
        "sort=nope",
        "order=up",
        "start=today",
        "min_id=0",
        "what=1",
    ] {
        assert!(a.query(bad).is_err(), "{bad}");
    }
    // rows share their names: no allocation of their own outlives a burst of requests
    let rows = a.rows();
    assert!(Arc::ptr_eq(&rows[0].req_path, &rows[1].req_path));
    assert!(Arc::ptr_eq(&rows[0].model, &rows[2].model) || rows[0].model != rows[2].model);
    let stats = a.stats("model=x").unwrap();
    assert_eq!(stats["total_requests"], 2);
    assert_eq!(stats["total_input_tokens"], 20 + 30);
    assert_eq!(stats["gen_histogram"]["max"], 3.0);
}

/// A path of 64 KiB (a passthrough path is the client's) is kept cut, with the mark, in memory
/// and in the file; so are an error and a content type, on a character's edge.
#[test]
fn long_texts_are_cut_in_the_row_and_in_the_stored_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let mut log = Activity::new(10);
    let opened = store::Store::open(&path, 10, store::Retention::default()).unwrap();
    log.store = Some(opened.store);
    let mut e = entry("m", 502, 1, 1.0);
    e.req_path = format!("/upstream/m/{}", "x".repeat(64 << 10)).into();
    e.error = Some("é".repeat(10_000));
    e.content_type = "text/plain; x=".repeat(100).into();
    log.record(e);
    let row = &log.rows()[0];
    assert!(row.req_path.len() <= PATH_MAX && row.req_path.ends_with(CUT));
    assert!(row.req_path.starts_with("/upstream/m/xxx"));
    let error = row.error.as_deref().unwrap();
    assert!(error.len() <= ERROR_MAX && error.ends_with(CUT), "{error}");
    assert!(row.content_type.len() <= CONTENT_TYPE_MAX);
    drop(log); // the writer commits
    let conn = rusqlite::Connection::open(&path).unwrap();
    let (stored, bytes): (String, i64) = conn
        .query_row(
            &format!(
                "SELECT req_path, {} FROM corral_activity",
                store::rows::ROW_BYTES
            ),
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert!(
        stored.len() <= PATH_MAX && stored.ends_with(CUT),
        "{}",
        stored.len()
    );
    assert!(bytes < 8 << 10, "the row takes {bytes} bytes");
}

/// llama-swap's `TestStore_ActivitySourcePrefixSortAndLegacyDefault`: `src_prefix` keeps the rows
/// whose source starts with it, literally; a row from before sources were kept has none (`""`)
/// and passes only without a prefix; `sort=src` orders by the source's text.
#[test]
fn src_prefix_keeps_the_rows_whose_source_starts_with_it() {
    let log = Activity::new(10);
    for src in ["127.0.0.1:10", "[::1]:7", "127.0.0.2:1", "10.0.0.1:9"] {
        log.record(Entry {
            src: src.parse().ok(),
            ..entry("m", 200, 1, 1.0)
        });
    }
    log.record(entry("legacy", 200, 1, 1.0));
    let sources = |query: &str| -> Vec<String> {
        let page = log.query(query).unwrap();
        let rows = page["data"].as_array().unwrap();
        rows.iter()
            .map(|r| r["src"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        sources("src_prefix=ip:127.0.0.&sort=src&order=asc"),
        ["ip:127.0.0.1:10", "ip:127.0.0.2:1"]
    );
    assert_eq!(
        sources("src_prefix=ip:%5B"),
        ["ip:[::1]:7"],
        "percent-decoded"
    );
    assert_eq!(sources("src_prefix=ip:1_.").len(), 0, "no wildcards");
    assert_eq!(sources("src_prefix=tc:").len(), 0);
    assert_eq!(sources("model=legacy"), [""]);
    assert_eq!(sources("src_prefix=").len(), 5, "an empty prefix keeps all");
    assert_eq!(log.query("src_prefix=ip:").unwrap()["total"], 4);
}
