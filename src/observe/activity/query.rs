//! The parameters of `GET /api/metrics/activity`: which rows, in what order, which page.

use std::time::SystemTime;

use super::Row;

#[derive(Clone, PartialEq)]
enum Sort {
    Id,
    Time,
    Src,
    Model,
    Key,
    Path,
    Status,
    ContentType,
    Cached,
    Prompt,
    Generated,
    Drafted,
    PromptSpeed,
    GenSpeed,
    Duration,
}

impl Sort {
    /// The field a `sort` parameter names, by its name in the rows' JSON.
    fn parse(name: &str) -> Result<Sort, String> {
        Ok(match name {
            "id" => Sort::Id,
            "time" => Sort::Time,
            "src" => Sort::Src,
            "model" => Sort::Model,
            "key" => Sort::Key,
            "req_path" => Sort::Path,
            "resp_status_code" => Sort::Status,
            "resp_content_type" => Sort::ContentType,
            "cached" => Sort::Cached,
            "prompt" => Sort::Prompt,
            "generated" => Sort::Generated,
            "drafted" => Sort::Drafted,
            "prompt_speed" => Sort::PromptSpeed,
            "gen_speed" => Sort::GenSpeed,
            "duration" => Sort::Duration,
            other => return Err(format!("sort: unknown field {other:?}")),
        })
    }
}

/// Whether an `order` parameter asks for the largest first.
fn descending(order: &str) -> Result<bool, String> {
    match order {
        "desc" => Ok(true),
        "asc" => Ok(false),
        other => Err(format!("order must be asc or desc, not {other:?}")),
    }
}

fn compare(a: &Row, b: &Row, key: &Sort) -> std::cmp::Ordering {
    let (ta, tb) = (a.tokens.unwrap_or_default(), b.tokens.unwrap_or_default());
    let rate = |x: Option<f64>, y: Option<f64>| x.unwrap_or(-1.0).total_cmp(&y.unwrap_or(-1.0));
    match key {
        Sort::Id => a.id.cmp(&b.id),
        Sort::Time => a.time.cmp(&b.time),
        Sort::Src => super::source::text(a.src).cmp(&super::source::text(b.src)),
        Sort::Model => a.model.cmp(&b.model),
        Sort::Key => a.key.cmp(&b.key),
        Sort::Path => a.req_path.cmp(&b.req_path),
        Sort::Status => a.status.cmp(&b.status),
        Sort::ContentType => a.content_type.cmp(&b.content_type),
        Sort::Cached => ta.cache.cmp(&tb.cache),
        Sort::Prompt => ta.prompt.cmp(&tb.prompt),
        Sort::Generated => ta.completion.cmp(&tb.completion),
        Sort::Drafted => ta.draft.cmp(&tb.draft),
        Sort::PromptSpeed => rate(ta.prompt_per_second, tb.prompt_per_second),
        Sort::GenSpeed => rate(ta.tokens_per_second, tb.tokens_per_second),
        Sort::Duration => a.duration_ms.cmp(&b.duration_ms),
    }
}

pub(crate) struct Query {
    models: Vec<String>,
    /// Key labels (names or fingerprints); rows made with any of them pass.
    keys: Vec<String>,
    /// Rows whose source starts with it pass (taken literally; empty passes all).
    src_prefix: String,
    start: Option<SystemTime>,
    end: Option<SystemTime>,
    min_id: Option<u64>,
    max_id: Option<u64>,
    pub limit: usize,
    pub page: usize,
    sort: Sort,
    descending: bool,
}

impl Query {
    pub fn parse(query: &str) -> Result<Query, String> {
        let mut q = Query {
            models: Vec::new(),
            keys: Vec::new(),
            src_prefix: String::new(),
            start: None,
            end: None,
            min_id: None,
            max_id: None,
            limit: 25,
            page: 1,
            sort: Sort::Id,
            descending: true,
        };
        let number = |k: &str, v: &str, min: u64, max: u64| -> Result<u64, String> {
            v.parse::<u64>()
                .ok()
                .filter(|n| (min..=max).contains(n))
                .ok_or_else(|| format!("{k} must be a whole number from {min} to {max}, not {v:?}"))
        };
        let time = |k: &str, v: &str| {
            crate::clock::rfc3339::parse(v)
                .ok_or_else(|| format!("{k} must be an RFC 3339 time, not {v:?}"))
        };
        for (k, v) in form_urlencoded::parse(query.as_bytes()).into_owned() {
            match k.as_str() {
                "model" => q.models.push(v),
                "key" => q.keys.push(v),
                "src_prefix" => q.src_prefix = v,
                "start" => q.start = Some(time(&k, &v)?),
                "end" => q.end = Some(time(&k, &v)?),
                "min_id" => q.min_id = Some(number(&k, &v, 1, u64::MAX)?),
                "max_id" => q.max_id = Some(number(&k, &v, 1, u64::MAX)?),
                "limit" => q.limit = number(&k, &v, 1, 999)? as usize,
                "page" => q.page = number(&k, &v, 1, 1_000_000)? as usize,
                "sort" => q.sort = Sort::parse(&v)?,
                "order" => q.descending = descending(&v)?,
                other => return Err(format!("unknown parameter {other:?}")),
            }
        }
        Ok(q)
    }

    /// Whether a row passes the model, key, source, time and id filters.
    pub fn keeps(&self, r: &Row) -> bool {
        (self.src_prefix.is_empty() || super::source::text(r.src).starts_with(&self.src_prefix))
            && (self.models.is_empty() || self.models.iter().any(|m| **m == *r.model))
            && (self.keys.is_empty() || self.keys.iter().any(|k| Some(&**k) == r.key.as_deref()))
            && self.start.is_none_or(|s| r.time >= s)
            && self.end.is_none_or(|e| r.time <= e)
            && self.min_id.is_none_or(|m| r.id >= m)
            && self.max_id.is_none_or(|m| r.id <= m)
    }

    /// Orders rows by the chosen field, ties by id, the largest first unless `order=asc`.
    pub fn sort(&self, rows: &mut [Row]) {
        rows.sort_by(|a, b| {
            let ord = compare(a, b, &self.sort).then(a.id.cmp(&b.id));
            if self.descending {
                ord.reverse()
            } else {
                ord
            }
        });
    }
}
