//! Running the twin query language (QRY-1) over the store: one page of rows at a time, in
//! identity order, for `POST /devices/query`; and the identities a scheduled job's condition
//! selects, from where the job got to.
//!
//! # Invariants
//! - A page reads the store directly, in identity order: every write acknowledged before a
//!   page is read is in it (IoT Hub's own index is only eventually consistent).
//! - A [`Position`] is bound to its query text by a hash; the last page has none.
//! - Queries without aggregates scan until the page is full plus one row, so a page that
//!   says "more" always has more; aggregated queries read every row, then page the result.
//! - Rows are the JSON a client reads back ([`twin_json`], [`device_job_json`]), so a filter
//!   means what the client sees.
//! - A query with an indexed probe (`ferrohub_engine::twin_index`) reads only the twins the
//!   probe proposes, in index order, and still checks each against its whole condition;
//!   any other query reads every twin in identity order (docs/query.md gives both costs).
//!   Scheduled jobs always read in identity order: their cursor is an identity.

use base64::Engine as _;
use ferrohub_engine::archive::IdentityRecords;
use ferrohub_engine::scheduled_jobs::{JobCursor, JobTarget};
use ferrohub_engine::twin::store::Twin;
use ferrohub_engine::{StorageError, Store};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::twin_rows::{device_job_json, twin_json};
use crate::routing::query::{Aggregation, Collection, IndexProbe, Statement};

/// Devices read from the store per step of a scan: the first step is small (a page of one
/// row should not read hundreds of devices), then each step doubles up to the largest.
const FIRST_STEP: usize = 8;
const LARGEST_STEP: usize = 256;

/// A continuation token that does not belong to the query it came with.
#[derive(Debug, thiserror::Error)]
#[error("the continuation token is not valid for this query")]
pub struct BadToken;

/// Where the next page starts.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Position {
    /// Hash of the query text the token belongs to.
    h: u32,
    /// Last device whose rows were all returned (devices), or that the last row came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    d: Option<String>,
    /// Last module returned within `d` (module queries).
    #[serde(skip_serializing_if = "Option::is_none")]
    m: Option<String>,
    /// Last device-job row returned (its store key, base64url).
    #[serde(skip_serializing_if = "Option::is_none")]
    k: Option<String>,
    /// Rows returned so far (TOP), or the offset into an aggregated result.
    n: usize,
}

impl Position {
    /// The first page of the query `text`.
    pub fn start(text: &str) -> Position {
        Position {
            h: crc32fast::hash(text.as_bytes()),
            ..Position::default()
        }
    }

    /// The token a client sends back for the next page.
    pub fn encode(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
    }

    /// Reads a token of the query `text`.
    ///
    /// # Errors
    /// [`BadToken`] for anything but a token this hub gave for the same query text.
    pub fn decode(token: &str, text: &str) -> Result<Position, BadToken> {
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token.trim())
            .map_err(|_| BadToken)?;
        let p: Position = serde_json::from_slice(&bytes).map_err(|_| BadToken)?;
        if p.h != crc32fast::hash(text.as_bytes()) {
            return Err(BadToken);
        }
        Ok(p)
    }
}

/// One page of at most `size` rows from `position`, and where the next starts if there is
/// a next.
///
/// # Errors
/// Storage errors.
pub fn page(
    s: &Store,
    statement: &Statement,
    size: usize,
    position: Position,
) -> Result<(Vec<Value>, Option<Position>), StorageError> {
    if statement.aggregated() {
        let mut aggregation = Aggregation::new(statement);
        scan(s, statement, &Position::default(), |row| {
            if statement.matches(&row.value) {
                aggregation.add(&row.value);
            }
            true
        })?;
        let all = aggregation.finish();
        let top = statement.top().unwrap_or(usize::MAX).min(all.len());
        let end = (position.n + size).min(top);
        let page = all
            .get(position.n.min(end)..end)
            .map(<[Value]>::to_vec)
            .unwrap_or_default();
        let next = (end < top).then(|| Position { n: end, ..position });
        return Ok((page, next));
    }
    let remaining = statement
        .top()
        .map_or(usize::MAX, |t| t.saturating_sub(position.n));
    let want = size.min(remaining);
    if want == 0 {
        return Ok((Vec::new(), None));
    }
    let mut rows: Vec<(Value, Position)> = Vec::new();
    let mut more = false;
    scan(s, statement, &position, |row| {
        if !statement.matches(&row.value) {
            return true;
        }
        if rows.len() == want {
            more = true;
            return false;
        }
        rows.push((statement.project(row.value), row.at));
        true
    })?;
    let returned = position.n + rows.len();
    let next = match rows.last() {
        Some((_, at)) if more && returned < statement.top().unwrap_or(usize::MAX) => {
            Some(Position {
                h: position.h,
                n: returned,
                ..at.clone()
            })
        }
        _ => None,
    };
    Ok((rows.into_iter().map(|(r, _)| r).collect(), next))
}

/// Up to `limit` identities `statement` selects after `cursor`, in identity order, and
/// whether the scan reached the end.
///
/// # Errors
/// Storage errors.
pub fn targets(
    s: &Store,
    statement: &Statement,
    cursor: Option<&JobCursor>,
    limit: usize,
) -> Result<(Vec<JobTarget>, bool), StorageError> {
    let from = Position {
        d: cursor.map(|c| c.device_id.clone()),
        m: cursor.and_then(|c| c.module_id.clone()),
        ..Position::default()
    };
    let mut out = Vec::new();
    let mut ended = true;
    // Identity order, whatever the index offers: the job's cursor is an identity.
    scan_twins(s, statement.from, &from, |records| {
        let row = twin_row(records);
        if !statement.matches(&row.value) {
            return true;
        }
        if out.len() == limit {
            ended = false;
            return false;
        }
        out.push(JobTarget {
            device_id: row.at.d.unwrap_or_default(),
            module_id: row.at.m,
        });
        true
    })?;
    Ok((out, ended))
}

/// A row and where a scan resumes after it.
struct Row {
    value: Value,
    at: Position,
}

/// Orders module ids as their keys do: by length, then bytes.
fn module_after(module: &str, last: &str) -> bool {
    (module.len(), module.as_bytes()) > (last.len(), last.as_bytes())
}

fn twin_row(records: IdentityRecords) -> Row {
    let at = Position {
        d: Some(records.identity.device_id.clone()),
        m: records.identity.module_id.clone(),
        ..Position::default()
    };
    Row {
        value: twin_json(&Twin {
            identity: records.identity,
            record: records.twin,
        }),
        at,
    }
}

/// Feeds `visit` the rows of `statement`'s collection after `from` until it returns false or
/// the rows run out: through the index when a probe of the statement is indexed (in entry
/// order), otherwise every row in identity order.
fn scan(
    s: &Store,
    statement: &Statement,
    from: &Position,
    mut visit: impl FnMut(Row) -> bool,
) -> Result<(), StorageError> {
    let collection = statement.from;
    if collection == Collection::Jobs {
        return scan_device_jobs(s, from, visit);
    }
    let definition = s.twin_index_definition();
    let probe = statement
        .index_probes()
        .into_iter()
        .find(|p| definition.as_ref().is_some_and(|d| d.covers(&p.path)));
    match probe {
        Some(p) => scan_index(s, collection == Collection::Modules, &p, from, visit),
        None => scan_twins(s, collection, from, |records| visit(twin_row(records))),
    }
}

/// The twins an index probe proposes, after the entry in `from`, in entry order.
fn scan_index(
    s: &Store,
    modules: bool,
    p: &IndexProbe,
    from: &Position,
    visit: impl FnMut(Row) -> bool,
) -> Result<(), StorageError> {
    scan_keyed(
        from,
        |after, limit| {
            Ok(s.twin_index_page(modules, &p.path, &p.probe, after, limit)?
                .unwrap_or_default())
        },
        |twin, at| Row {
            value: twin_json(&twin),
            at: Position {
                d: Some(twin.identity.device_id.clone()),
                m: twin.identity.module_id.clone(),
                ..at
            },
        },
        visit,
    )
}

/// Items fetched a growing page at a time as `(key, item)` by `fetch(after, limit)`, from
/// after the key in `from.k`; each becomes a row (with its key as the position) by `row`.
fn scan_keyed<T>(
    from: &Position,
    mut fetch: impl FnMut(Option<&[u8]>, usize) -> Result<Vec<(Vec<u8>, T)>, StorageError>,
    row: impl Fn(T, Position) -> Row,
    mut visit: impl FnMut(Row) -> bool,
) -> Result<(), StorageError> {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut after = from.k.as_deref().and_then(|k| b64.decode(k).ok());
    let mut step = FIRST_STEP;
    loop {
        let page = fetch(after.as_deref(), step)?;
        let Some((last, _)) = page.last() else {
            return Ok(());
        };
        let last = last.clone();
        for (key, item) in page {
            let at = Position {
                k: Some(b64.encode(&key)),
                ..Position::default()
            };
            if !visit(row(item, at)) {
                return Ok(());
            }
        }
        after = Some(last);
        step = (step * 2).min(LARGEST_STEP);
    }
}

/// Every device twin (`Devices`) or module twin (`Modules`), in identity order, until `visit`
/// returns false.
///
/// # Errors
/// Storage errors.
pub fn each_twin(
    s: &Store,
    collection: Collection,
    mut visit: impl FnMut(Twin) -> bool,
) -> Result<(), StorageError> {
    scan_twins(s, collection, &Position::default(), |records| {
        visit(Twin {
            identity: records.identity,
            record: records.twin,
        })
    })
}

/// How many rows of its collection `statement`'s WHERE selects.
///
/// # Errors
/// Storage errors.
pub fn count(s: &Store, statement: &Statement) -> Result<u64, StorageError> {
    let mut n = 0;
    scan(s, statement, &Position::default(), |row| {
        if statement.matches(&row.value) {
            n += 1;
        }
        true
    })?;
    Ok(n)
}

fn scan_twins(
    s: &Store,
    collection: Collection,
    from: &Position,
    mut visit: impl FnMut(IdentityRecords) -> bool,
) -> Result<(), StorageError> {
    let mut step = FIRST_STEP;
    let mut page = match (&from.d, &from.m, collection) {
        (Some(d), Some(_), Collection::Modules) => s.archive_page_from(d, step)?,
        (d, _, _) => s.archive_page(d.as_deref(), step)?,
    };
    let mut first = true;
    loop {
        let Some(last) = page.last().map(|d| d.device.identity.device_id.clone()) else {
            return Ok(());
        };
        for device in page {
            if collection == Collection::Devices {
                if !visit(device.device) {
                    return Ok(());
                }
                continue;
            }
            let skip_to = match (&from.d, &from.m) {
                (Some(d), Some(m)) if first && *d == device.device.identity.device_id => {
                    Some(m.clone())
                }
                _ => None,
            };
            first = false;
            for module in device.modules {
                let id = module.identity.module_id.clone().unwrap_or_default();
                if skip_to.as_deref().is_some_and(|m| !module_after(&id, m)) {
                    continue;
                }
                if !visit(module) {
                    return Ok(());
                }
            }
        }
        step = (step * 2).min(LARGEST_STEP);
        page = s.archive_page(Some(&last), step)?;
    }
}

fn scan_device_jobs(
    s: &Store,
    from: &Position,
    visit: impl FnMut(Row) -> bool,
) -> Result<(), StorageError> {
    scan_keyed(
        from,
        |after, limit| s.device_job_rows(after, limit),
        |row, at| Row {
            value: device_job_json(&row),
            at,
        },
        visit,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_belong_to_their_query() {
        let p = Position {
            d: Some("dev/1".into()),
            m: Some("m".into()),
            n: 42,
            ..Position::start("SELECT * FROM devices")
        };
        let token = p.encode();
        assert!(token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        assert_eq!(
            Position::decode(&token, "SELECT * FROM devices").unwrap(),
            p
        );
        assert!(Position::decode(&token, "SELECT * FROM devices.modules").is_err());
        assert!(Position::decode("not a token", "SELECT * FROM devices").is_err());
    }

    #[test]
    fn modules_order_as_their_keys() {
        assert!(module_after("b", "a") && module_after("aa", "b") && !module_after("a", "a"));
    }
}
