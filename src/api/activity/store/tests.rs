use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::*;
use crate::api::meter::Tokens;

fn row(id: u64, age: Duration) -> Row {
    Row {
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

/// Random bytes where the file should be: moved aside, kept, and a fresh file works.
#[test]
fn a_file_that_is_not_sqlite_is_moved_aside_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let junk: Vec<u8> = (0..8192u32).map(|i| (i * 7919 % 251) as u8).collect();
    std::fs::write(&path, &junk).unwrap();
    let opened = Store::open(&path, 10, Retention::default()).unwrap();
    opened.store.save(row(1, Duration::ZERO));
    drop(opened);
    assert_eq!(count(&path), 1);
    let aside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("a.db.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(std::fs::read(aside[0].path()).unwrap(), junk);
}

/// A path that cannot be a file (a directory) leaves the log in memory, and nothing is renamed.
#[test]
fn an_unusable_path_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    assert!(Store::open(dir.path(), 10, Retention::default()).is_none());
    assert!(dir.path().is_dir());
}
