//! The table and the statements on it: activity rows in, old rows out, the newest rows back.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection};

use super::Retention;
use crate::observe::activity::{content_type, Row};
use crate::observe::counts::Tokens;

/// corral's own table name, so a file shared with another program (llama-swap's own log) is
/// never mistaken for ours; `user_version` marks the layout.
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS corral_activity (
    id INTEGER PRIMARY KEY,
    ts_ms INTEGER NOT NULL,
    model TEXT NOT NULL,
    req_path TEXT NOT NULL,
    status INTEGER NOT NULL,
    content_type TEXT NOT NULL,
    duration_ms INTEGER NOT NULL,
    ttft_ms INTEGER,
    prompt_tokens INTEGER,
    completion_tokens INTEGER,
    cache_tokens INTEGER,
    draft_tokens INTEGER,
    draft_accepted INTEGER,
    prompt_per_second REAL,
    tokens_per_second REAL,
    error TEXT,
    api_key TEXT,
    src TEXT
);
CREATE INDEX IF NOT EXISTS corral_activity_ts ON corral_activity (ts_ms);
";

/// The layout `SCHEMA` makes; older files are brought to it by [`migrate`].
const VERSION: i64 = 3;

/// Makes the table, or brings an older one to this layout: version 1 had no `api_key` column (the
/// label of the API key that made the request), version 2 no `src` (where it came from).
pub fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(SCHEMA)?;
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    for column in ["api_key", "src"] {
        let has = conn
            .prepare(&format!("SELECT {column} FROM corral_activity LIMIT 0"))
            .is_ok();
        if version < VERSION && !has {
            conn.execute_batch(&format!(
                "ALTER TABLE corral_activity ADD COLUMN {column} TEXT"
            ))?;
        }
    }
    conn.pragma_update(None, "user_version", VERSION)
}

pub fn millis(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis().min(i64::MAX as u128) as i64)
}

fn count(v: Option<u64>) -> Option<i64> {
    v.map(|n| n.min(i64::MAX as u64) as i64)
}

/// Writes rows in one transaction (a row already there, by id, is replaced).
pub fn insert(conn: &mut Connection, rows: &[Row]) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    {
        let mut stmt = tx.prepare_cached(
            "INSERT OR REPLACE INTO corral_activity (id, ts_ms, model, req_path, status, \
             content_type, duration_ms, ttft_ms, prompt_tokens, completion_tokens, cache_tokens, \
             draft_tokens, draft_accepted, prompt_per_second, tokens_per_second, error, api_key, \
             src) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, \
             ?18)",
        )?;
        for r in rows {
            let t = r.tokens;
            stmt.execute(params![
                count(Some(r.id)),
                millis(r.time),
                &*r.model,
                &*r.req_path,
                r.status,
                &*r.content_type,
                count(Some(r.duration_ms)),
                count(r.ttft_ms),
                count(t.map(|t| t.prompt)),
                count(t.map(|t| t.completion)),
                count(t.and_then(|t| t.cache)),
                count(t.and_then(|t| t.draft)),
                count(t.and_then(|t| t.draft_accepted)),
                t.and_then(|t| t.prompt_per_second),
                t.and_then(|t| t.tokens_per_second),
                r.error.as_deref(),
                r.key.as_deref(),
                r.src.map(|_| crate::observe::activity::source::text(r.src)),
            ])?;
        }
    }
    tx.commit()
}

/// A row's bytes as retention counts them: its texts, and 100 for its numbers and SQLite's own
/// bookkeeping.
pub const ROW_BYTES: &str = "100 + length(CAST(model AS BLOB)) + length(CAST(req_path AS BLOB)) \
     + length(CAST(content_type AS BLOB)) + COALESCE(length(CAST(error AS BLOB)), 0) \
     + COALESCE(length(CAST(api_key AS BLOB)), 0) + COALESCE(length(CAST(src AS BLOB)), 0)";

/// Deletes rows older than the retention's age, then all but its newest `max_rows`, then the
/// oldest of those until the rest fit in `max_bytes`.
pub fn prune(conn: &Connection, keep: Retention, now: SystemTime) -> rusqlite::Result<()> {
    let cutoff = now.checked_sub(keep.max_age).unwrap_or(UNIX_EPOCH);
    conn.execute(
        "DELETE FROM corral_activity WHERE ts_ms < ?1",
        params![millis(cutoff)],
    )?;
    conn.execute(
        "DELETE FROM corral_activity WHERE id <= \
         (SELECT id FROM corral_activity ORDER BY id DESC LIMIT 1 OFFSET ?1)",
        params![count(Some(keep.max_rows))],
    )?;
    // the newest row whose bytes, with those of all newer rows, pass the bound, and all older
    conn.execute(
        &format!(
            "DELETE FROM corral_activity WHERE id <= \
             (SELECT id FROM (SELECT id, SUM({ROW_BYTES}) OVER (ORDER BY id DESC) AS newer \
              FROM corral_activity) WHERE newer > ?1 ORDER BY id DESC LIMIT 1)"
        ),
        params![count(Some(keep.max_bytes))],
    )?;
    Ok(())
}

/// The newest `keep` rows, oldest first, and the id after the largest one in the file.
pub fn newest(conn: &Connection, keep: usize) -> rusqlite::Result<(Vec<Row>, u64)> {
    let last: i64 = conn.query_row(
        "SELECT COALESCE(MAX(id), 0) FROM corral_activity",
        [],
        |r| r.get(0),
    )?;
    let mut stmt = conn.prepare(
        "SELECT id, ts_ms, model, req_path, status, content_type, duration_ms, ttft_ms, \
         prompt_tokens, completion_tokens, cache_tokens, draft_tokens, draft_accepted, \
         prompt_per_second, tokens_per_second, error, api_key, src \
         FROM corral_activity ORDER BY id DESC LIMIT ?1",
    )?;
    let limit = keep.min(i64::MAX as usize) as i64;
    let mut rows = stmt
        .query_map(params![limit], read_row)?
        .collect::<rusqlite::Result<Vec<Row>>>()?;
    rows.reverse();
    Ok((rows, last.max(0) as u64 + 1))
}

fn read_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    let n = |i: usize| -> rusqlite::Result<Option<u64>> {
        Ok(r.get::<_, Option<i64>>(i)?.map(|v| v.max(0) as u64))
    };
    let tokens = match (n(8)?, n(9)?) {
        (Some(prompt), Some(completion)) => Some(Tokens {
            prompt,
            completion,
            cache: n(10)?,
            draft: n(11)?,
            draft_accepted: n(12)?,
            prompt_per_second: r.get(13)?,
            tokens_per_second: r.get(14)?,
        }),
        _ => None,
    };
    let ts: i64 = r.get(1)?;
    Ok(Row {
        id: n(0)?.unwrap_or(0),
        time: UNIX_EPOCH + Duration::from_millis(ts.max(0) as u64),
        model: Arc::from(r.get::<_, String>(2)?),
        req_path: Arc::from(r.get::<_, String>(3)?),
        status: r.get(4)?,
        content_type: content_type(&r.get::<_, String>(5)?),
        tokens,
        duration_ms: n(6)?.unwrap_or(0),
        ttft_ms: n(7)?,
        error: r.get(15)?,
        has_capture: false,
        key: r.get::<_, Option<String>>(16)?.map(Arc::from),
        src: r
            .get::<_, Option<String>>(17)?
            .and_then(|s| crate::observe::activity::source::parse(&s)),
    })
}
