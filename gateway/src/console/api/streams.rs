//! The streams page (streams.streams by name) and one event with the
//! events of its transaction the role may read.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::Json;
use serde::Serialize;
use serde_json::value::RawValue;

use super::{after_name, identity, page_limit, path, position, raw, transaction, ConsoleQuery, Failure};
use crate::app::{query, App};
use crate::db::Server;
use crate::metrics;

/// Events of an event's transaction one answer lists at most (and at most
/// --max-page-bytes of them).
const MAX_TRANSACTION_EVENTS: usize = 1000;
/// Rows read per round trip of the transaction's portal.
const TRANSACTION_CHUNK: i32 = 64;

/// One page of streams.streams by name (byte order, the order of its
/// index): the rows after `$1` (null: from the first), at most `$2`.
const STREAMS: &str = "SELECT s.stream::text, pg_catalog.json_build_object(
    'stream', s.stream, 'events', s.events, 'first_position', s.first_position,
    'last_position', s.last_position, 'last_time', s.last_time)::text
FROM streams.streams s
WHERE $1::text IS NULL OR s.stream COLLATE \"C\" > $1::text
ORDER BY s.stream COLLATE \"C\"
LIMIT $2";

#[derive(Serialize)]
pub(super) struct StreamsPage {
    streams: Vec<Box<RawValue>>,
    /// The `after` of the next page; null: this is the last.
    next: Option<String>,
}

pub(super) async fn streams(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    q: Result<Query<ConsoleQuery>, QueryRejection>,
) -> Result<Json<StreamsPage>, Failure> {
    let q = query(q)?;
    let identity = identity(&app, &headers, &q)?;
    let limit = page_limit(q.limit.as_deref())?;
    let after = after_name(q.after.as_deref())?;
    let timer = Instant::now();
    let mut client = app.hub.db.client(Server::Primary).await?;
    let tx = transaction(&mut client, &identity.role, true).await?;
    let stmt = tx.prepare_cached(STREAMS).await?;
    // One more than the page: whether another follows.
    let rows = tx.query(&stmt, &[&after, &(limit + 1)]).await?;
    tx.commit().await?;
    metrics::query_seconds("console_streams", timer);
    let more = rows.len() as i64 > limit;
    let page = &rows[..rows.len().min(limit as usize)];
    let next = if more { page.last().map(|row| row.get::<_, String>(0)) } else { None };
    let streams = page.iter().map(|row| raw(row.get(1))).collect::<Result<_, _>>()?;
    Ok(Json(StreamsPage { streams, next }))
}

const EVENT: &str = "SELECT streams.to_json(e)::text, e.tx::text FROM streams.get($1) e WHERE e.position IS NOT NULL";
const TRANSACTION: &str = "SELECT streams.to_json(e)::text FROM streams.transaction_events($1::text::xid8) e";

#[derive(Serialize)]
pub(super) struct EventDetail {
    event: Box<RawValue>,
    /// The events of its transaction the role may read, in position order
    /// (itself included; none while part of the transaction is not final).
    transaction: Vec<Box<RawValue>>,
    /// The list stopped at [`MAX_TRANSACTION_EVENTS`] or --max-page-bytes.
    transaction_truncated: bool,
}

pub(super) async fn event(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    q: Result<Query<ConsoleQuery>, QueryRejection>,
    p: Result<Path<String>, PathRejection>,
) -> Result<Json<EventDetail>, Failure> {
    let identity = identity(&app, &headers, &query(q)?)?;
    let position = position(&path(p)?)?;
    let timer = Instant::now();
    let mut client = app.hub.db.client(Server::Primary).await?;
    let tx = transaction(&mut client, &identity.role, true).await?;
    let stmt = tx.prepare_cached(EVENT).await?;
    // Row-level security leaves out an event the role may not read: the
    // same answer as no event at all.
    let Some(row) = tx.query_opt(&stmt, &[&position]).await? else {
        return Err(Failure::missing(format!("no event at position {position} that this role may read"), None));
    };
    let event = raw(row.get(0))?;
    let xid: String = row.get(1);
    let stmt = tx.prepare_cached(TRANSACTION).await?;
    let portal = tx.bind(&stmt, &[&xid]).await?;
    let max_bytes = app.hub.cfg.limits.max_page_bytes;
    let (mut transaction, mut bytes, mut truncated) = (Vec::new(), 0usize, false);
    'chunks: loop {
        let rows = tx.query_portal(&portal, TRANSACTION_CHUNK).await?;
        let last = rows.len() < TRANSACTION_CHUNK as usize;
        for row in rows {
            let text: String = row.get(0);
            let full = transaction.len() == MAX_TRANSACTION_EVENTS
                || (!transaction.is_empty() && bytes + text.len() > max_bytes);
            if full {
                truncated = true;
                break 'chunks;
            }
            bytes += text.len();
            transaction.push(raw(text)?);
        }
        if last {
            break;
        }
    }
    tx.commit().await?;
    metrics::query_seconds("console_event", timer);
    Ok(Json(EventDetail { event, transaction, transaction_truncated: truncated }))
}
