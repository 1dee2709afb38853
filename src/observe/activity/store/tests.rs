use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::*;
use crate::observe::counts::Tokens;

fn row(id: u64, age: Duration) -> Row {
    Row {
        key: None,
        src: None,
        id,
        time: SystemTime::now() - age,
        model: Arc::from("m"),
        req_path: Arc::from("/v1/chat/completions"),
        status: 200,
        content_type: "application/json".into(),
        tokens: Some(Tokens {
            prompt: id,
            completion: 2,
            cache: Some(1),
            tokens_per_second: Some(12.5),
            ..Default::default()
        }),
        duration_ms: 7,
        ttft_ms: Some(3),
        error: None,
        has_capture: true,
    }
}

fn count(path: &Path) -> i64 {
    let conn = Connection::open(path).unwrap();
    conn.query_row("SELECT COUNT(*) FROM corral_activity", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn rows_survive_a_reopen_and_ids_continue() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let opened = Store::open(&path, 10, Retention::default()).unwrap();
    assert_eq!((opened.rows.len(), opened.next_id), (0, 1));
    for id in 1..=3 {
        opened.store.save(row(id, Duration::ZERO));
    }
    drop(opened); // commits what the writer holds
    let conn = Connection::open(&path).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    drop(conn);
    let again = Store::open(&path, 2, Retention::default()).unwrap();
    assert_eq!(again.next_id, 4);
    let ids: Vec<u64> = again.rows.iter().map(|r| r.id).collect();
    assert_eq!(ids, [2, 3], "the newest, oldest first");
    let r = &again.rows[1];
    assert_eq!(r.tokens.unwrap().prompt, 3);
    assert_eq!(r.tokens.unwrap().cache, Some(1));
    assert_eq!(r.tokens.unwrap().tokens_per_second, Some(12.5));
    assert_eq!((r.ttft_ms, r.has_capture), (Some(3), false));
}

/// The writer prunes as it goes: past the row count, and past the age.
#[test]
fn old_rows_are_pruned_by_count_and_by_age() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let tiny = Retention {
        max_rows: 5,
        max_bytes: u64::MAX,
        max_age: Duration::from_secs(3600),
    };
    let opened = Store::open(&path, 10, tiny).unwrap();
    let old = Duration::from_secs(7200);
    let n = PRUNE_EVERY_ROWS as u64 + 20;
    for id in 1..=n {
        // the last rows are old: the age prunes them whatever the count says
        opened
            .store
            .save(row(id, if id > n - 2 { old } else { Duration::ZERO }));
    }
    drop(opened);
    let left = count(&path);
    assert!(left <= 5, "{left} rows left");
    let conn = Connection::open(&path).unwrap();
    let oldest: i64 = conn
        .query_row("SELECT MIN(ts_ms) FROM corral_activity", [], |r| r.get(0))
        .unwrap();
    let cutoff = rows::millis(SystemTime::now() - Duration::from_secs(3600));
    assert!(oldest > cutoff, "an old row was kept");
}

/// Past its bytes the file keeps only the newest rows that fit them together, whatever the
/// count allows.
#[test]
fn old_rows_are_pruned_by_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let conn = prepare(&path).unwrap();
    let mut conn = conn;
    let long = |id| Row {
        req_path: Arc::from(format!("/{}", "p".repeat(999))),
        ..row(id, Duration::ZERO)
    };
    rows::insert(&mut conn, &(1..=10).map(long).collect::<Vec<_>>()).unwrap();
    let one: i64 = conn
        .query_row(
            &format!(
                "SELECT {} FROM corral_activity WHERE id = 1",
                rows::ROW_BYTES
            ),
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(one > 1000, "a row counts its path: {one}");
    let keep = Retention {
        max_bytes: 3 * one as u64 + 1,
        ..Retention::default()
    };
    rows::prune(&conn, keep, SystemTime::now()).unwrap();
    let ids: Vec<i64> = conn
        .prepare("SELECT id FROM corral_activity ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(ids, [8, 9, 10]);
}

/// Random bytes where the file should be: refused with an error that names the file, and left
/// byte for byte as it was, nothing renamed.
#[test]
fn a_file_that_is_not_sqlite_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let junk: Vec<u8> = (0..8192u32).map(|i| (i * 7919 % 251) as u8).collect();
    std::fs::write(&path, &junk).unwrap();
    let Err(e) = Store::open(&path, 10, Retention::default()) else {
        panic!("a file that is not SQLite was used");
    };
    assert!(matches!(e, OpenError::NotSqlite { .. }), "{e}");
    assert!(e.to_string().contains(&format!("{path:?}")), "{e}");
    assert_eq!(std::fs::read(&path).unwrap(), junk);
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["a.db", "a.db.lock"]);
}

/// A path that cannot be a file (a directory) is an error that names it, and nothing is renamed.
#[test]
fn an_unusable_path_is_an_error_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let Err(e) = Store::open(dir.path(), 10, Retention::default()) else {
        panic!("a directory was used as the store");
    };
    assert!(e.to_string().contains(&format!("{:?}", dir.path())), "{e}");
    assert!(dir.path().is_dir());
}

/// The store, its WAL and shared-memory files and its lock are readable by their owner only,
/// whatever the umask.
#[test]
fn the_store_and_its_files_are_private() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let opened = Store::open(&path, 10, Retention::default()).unwrap();
    opened.store.save(row(1, Duration::ZERO));
    let mode = |suffix: &str| {
        let meta = std::fs::metadata(beside(&path, suffix)).unwrap();
        meta.permissions().mode() & 0o777
    };
    for suffix in ["", "-wal", "-shm", ".lock"] {
        assert_eq!(mode(suffix), 0o600, "a.db{suffix}");
    }
    drop(opened);
}

/// A second store on one file is refused while the first holds it, with an error that names
/// the file; once the first closes, the file opens again.
#[test]
fn a_second_store_on_one_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let first = Store::open(&path, 10, Retention::default()).unwrap();
    let Err(e) = Store::open(&path, 10, Retention::default()) else {
        panic!("two stores opened one file");
    };
    assert!(matches!(e, OpenError::Locked { .. }), "{e}");
    let said = e.to_string();
    assert!(
        said.contains(&format!("{path:?}")) && said.contains("another corral"),
        "{said}"
    );
    drop(first);
    assert!(Store::open(&path, 10, Retention::default()).is_ok());
}

#[test]
fn a_rows_key_label_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let opened = Store::open(&path, 10, Retention::default()).unwrap();
    opened.store.save(Row {
        key: Some("apps".into()),
        ..row(1, Duration::ZERO)
    });
    opened.store.save(row(2, Duration::ZERO));
    drop(opened);
    let again = Store::open(&path, 10, Retention::default()).unwrap();
    let keys: Vec<Option<&str>> = again.rows.iter().map(|r| r.key.as_deref()).collect();
    assert_eq!(keys, [Some("apps"), None]);
}

#[test]
fn a_store_of_the_first_layout_gains_the_key_and_source_columns_and_keeps_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    {
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE corral_activity (id INTEGER PRIMARY KEY, ts_ms INTEGER NOT NULL, \
             model TEXT NOT NULL, req_path TEXT NOT NULL, status INTEGER NOT NULL, \
             content_type TEXT NOT NULL, duration_ms INTEGER NOT NULL, ttft_ms INTEGER, \
             prompt_tokens INTEGER, completion_tokens INTEGER, cache_tokens INTEGER, \
             draft_tokens INTEGER, draft_accepted INTEGER, prompt_per_second REAL, \
             tokens_per_second REAL, error TEXT); PRAGMA user_version = 1; \
             INSERT INTO corral_activity (id, ts_ms, model, req_path, status, content_type, \
             duration_ms) VALUES (1, CAST(strftime('%s','now') AS INTEGER) * 1000, 'old', '/v1/chat/completions', 200, 'application/json', 5);",
        )
        .unwrap();
    }
    let opened = Store::open(&path, 10, Retention::default()).unwrap();
    assert_eq!(opened.rows.len(), 1);
    assert_eq!(
        (&*opened.rows[0].model, opened.rows[0].key.as_deref()),
        ("old", None)
    );
    let src = "[::1]:51234".parse().ok();
    opened.store.save(Row {
        key: Some("apps".into()),
        src,
        ..row(2, Duration::ZERO)
    });
    drop(opened);
    let again = Store::open(&path, 10, Retention::default()).unwrap();
    assert_eq!(again.rows[1].key.as_deref(), Some("apps"));
    assert_eq!((again.rows[0].src, again.rows[1].src), (None, src));
    let conn = Connection::open(&path).unwrap();
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 3);
}
