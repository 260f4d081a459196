//! The console's JSON API, `/v1/console/...`: who the token is; the worker,
//! the horizon and what holds it; the streams with their counts; one event
//! with the rest of its transaction; subscriptions, their dead letters and
//! webhooks; and the changes an owner makes from the console (retry or
//! discard a dead letter, pause or resume a webhook). Live tail and replay
//! are the existing `/v1/streams/{pattern}/events`.
//!
//! The invariant: the console does nothing the token's role could not do in
//! SQL. Every query runs in a transaction as that role (db.rs `begin`) and
//! reads the extension's own views, which show each role its own; nothing
//! runs as the gateway's login role. Subscription and webhook names are per
//! owning role and the functions resolve a name for the current user, so a
//! change to another owner's one runs as that owner (`SET LOCAL ROLE`) when,
//! and only when, the token's role is a member of it: what a member does in
//! SQL with `SET ROLE owner` first.

use std::sync::Arc;
use std::time::{Instant, UNIX_EPOCH};

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use deadpool_postgres::Transaction;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio_postgres::error::SqlState;
use tokio_postgres::Row;

use crate::app::{query, App};
use crate::auth::Identity;
use crate::db::{begin, Server};
use crate::error::ApiError;
use crate::{metrics, pattern};

mod owners;
mod streams;

/// Streams per page of `/v1/console/streams`: by default, and at most.
pub(super) const DEFAULT_STREAMS: i64 = 100;
pub(super) const MAX_STREAMS: i64 = 500;

/// SQLSTATEs the console answers with 404: undefined_object (no such
/// subscription, webhook or role) and no_data_found (not a dead letter;
/// PL/pgSQL's class P0, as the extension raises it).
pub(super) const UNDEFINED_OBJECT: &str = "42704";
const NO_DATA_FOUND: &str = "P0002";
/// wrong_object_type: a dead letter call on a webhook's subscription.
const WRONG_OBJECT_TYPE: &str = "42809";

pub fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/v1/console/session", get(session))
        .route("/v1/console/overview", get(overview))
        .route("/v1/console/streams", get(streams::streams))
        .route("/v1/console/events/{position}", get(streams::event))
        .route("/v1/console/subscriptions", get(owners::subscriptions))
        .route("/v1/console/subscriptions/{owner}/{name}/dead-letters", get(owners::dead_letters))
        .route("/v1/console/subscriptions/{owner}/{name}/dead-letters/{position}/retry", post(owners::retry))
        .route("/v1/console/subscriptions/{owner}/{name}/dead-letters/{position}/discard", post(owners::discard))
        .route("/v1/console/webhooks", get(owners::webhooks))
        .route("/v1/console/webhooks/{owner}/{name}/pause", post(owners::pause))
        .route("/v1/console/webhooks/{owner}/{name}/resume", post(owners::resume))
        .layer(axum::middleware::map_response(private))
}

/// Answers hold what one role may see: no cache keeps them.
async fn private(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    response
}

/// The query string of every console route.
#[derive(Debug, Default, Deserialize)]
pub struct ConsoleQuery {
    after: Option<String>,
    limit: Option<String>,
    access_token: Option<String>,
}

/// The request's role: the token of `Authorization: Bearer` (or the
/// anonymous role without one). Unlike an EventSource, the page's fetches
/// can set headers, so a token in the URL, where logs keep it, is refused.
fn identity(app: &App, headers: &HeaderMap, q: &ConsoleQuery) -> Result<Identity, ApiError> {
    if q.access_token.is_some() {
        return Err(ApiError::unauthorized(
            "the console API takes the token in the Authorization header (Bearer), not as access_token",
        ));
    }
    app.auth.identity(headers, None)
}

/// What a console request answers when it fails: the gateway's
/// [`ApiError`], or a 404 the database gave (no such subscription, webhook,
/// role or dead letter; an event the role cannot read), both rendered as
/// `{"error": ..., "sqlstate": ...}`.
#[derive(Debug)]
pub enum Failure {
    Api(ApiError),
    Missing { message: String, sqlstate: Option<String> },
}

impl Failure {
    fn missing(message: impl Into<String>, sqlstate: Option<&str>) -> Failure {
        Failure::Missing { message: message.into(), sqlstate: sqlstate.map(str::to_owned) }
    }
}

impl From<ApiError> for Failure {
    fn from(e: ApiError) -> Failure {
        Failure::Api(e)
    }
}

impl From<deadpool_postgres::PoolError> for Failure {
    fn from(e: deadpool_postgres::PoolError) -> Failure {
        Failure::Api(e.into())
    }
}

impl From<tokio_postgres::Error> for Failure {
    /// As everywhere in the gateway (error.rs), and besides: what the
    /// database says does not exist is a 404, a dead letter call on a
    /// webhook's subscription a 422.
    fn from(e: tokio_postgres::Error) -> Failure {
        match e.as_db_error() {
            Some(db) => Failure::from_sqlstate(db.code().code(), db.message(), db.detail()),
            None => Failure::Api(ApiError::from_db(&e)),
        }
    }
}

impl Failure {
    /// The server's error as the console answers it (tests call this
    /// directly: tokio_postgres cannot build a `DbError`).
    pub(super) fn from_sqlstate(code: &str, message: &str, detail: Option<&str>) -> Failure {
        let e = ApiError::from_sqlstate(code, message, detail);
        match (code, e) {
            (UNDEFINED_OBJECT | NO_DATA_FOUND, e) => Failure::missing(e.message(), Some(code)),
            (WRONG_OBJECT_TYPE, ApiError::Internal { message, sqlstate }) => {
                Failure::Api(ApiError::Unprocessable { message, sqlstate })
            }
            (_, e) => Failure::Api(e),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Failure::Api(e) => e.status(),
            Failure::Missing { .. } => StatusCode::NOT_FOUND,
        }
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let status = self.status();
        match self {
            Failure::Api(e) => e.into_response(),
            Failure::Missing { message, sqlstate } => {
                (status, Json(serde_json::json!({"error": message, "sqlstate": sqlstate}))).into_response()
            }
        }
    }
}

/// A transaction as `role` (read-only ones in one snapshot), with
/// timestamps in UTC for the JSON the database writes.
async fn transaction<'c>(
    client: &'c mut deadpool_postgres::Object,
    role: &str,
    read_only: bool,
) -> Result<Transaction<'c>, Failure> {
    let tx = begin(client, role, read_only).await?;
    let stmt = tx.prepare_cached("SELECT pg_catalog.set_config('TimeZone', 'UTC', true)").await?;
    tx.execute(&stmt, &[]).await?;
    Ok(tx)
}

/// `statement`'s row (if any) in a savepoint, or the database's message
/// when the role lacks a privilege for it (42501): a part of an answer the
/// role may not see is left out instead of failing the answer.
async fn unless_refused(tx: &mut Transaction<'_>, statement: &str) -> Result<Result<Option<Row>, String>, Failure> {
    let savepoint = tx.savepoint("console_part").await?;
    let asked = async {
        let stmt = savepoint.prepare_cached(statement).await?;
        savepoint.query_opt(&stmt, &[]).await
    }
    .await;
    match asked {
        Ok(row) => {
            savepoint.commit().await?;
            Ok(Ok(row))
        }
        Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
            savepoint.rollback().await?;
            Ok(Err(e.as_db_error().map_or_else(|| e.to_string(), |db| db.message().to_owned())))
        }
        Err(e) => Err(e.into()),
    }
}

/// JSON text the database wrote, passed on as it is.
fn raw(text: String) -> Result<Box<RawValue>, Failure> {
    RawValue::from_string(text).map_err(|e| {
        Failure::Api(ApiError::Internal {
            message: format!("the database wrote JSON that does not parse: {e}"),
            sqlstate: None,
        })
    })
}

fn path<T>(p: Result<Path<T>, PathRejection>) -> Result<T, ApiError> {
    p.map(|Path(p)| p).map_err(|e| ApiError::bad_request(format!("bad path: {e}")))
}

/// `limit` of a streams page: 1 to [`MAX_STREAMS`], [`DEFAULT_STREAMS`] when
/// not given; anything else 22023.
pub(super) fn page_limit(limit: Option<&str>) -> Result<i64, ApiError> {
    let Some(text) = limit else { return Ok(DEFAULT_STREAMS) };
    match text.trim().parse::<i64>() {
        Ok(n) if (1..=MAX_STREAMS).contains(&n) => Ok(n),
        _ => Err(ApiError::invalid_parameter(format!("limit must be 1 to {MAX_STREAMS}, not {text:?}"))),
    }
}

/// `after` of a streams page: a stream name (the last of the page before),
/// none when not given or empty; a string that is no stream name is 22023.
pub(super) fn after_name(after: Option<&str>) -> Result<Option<&str>, ApiError> {
    match after.filter(|a| !a.is_empty()) {
        None => Ok(None),
        Some(name) => pattern::validate_stream_name(name)
            .map(|()| Some(name))
            .map_err(|e| ApiError::invalid_parameter(format!("after: {e}"))),
    }
}

/// An event's position in a path: an integer, else 22023.
pub(super) fn position(text: &str) -> Result<i64, ApiError> {
    text.parse::<i64>()
        .map_err(|_| ApiError::invalid_parameter(format!("the position must be an integer, not {text:?}")))
}

// --- who, and the worker -----------------------------------------------------

#[derive(Serialize)]
struct Session {
    role: String,
    /// When the gateway stops taking the token (its `exp` plus the 5 s of
    /// leeway it is checked with), Unix seconds; null: never.
    expires_at: Option<u64>,
    database: String,
    /// Null when the role may not call streams.log_id() (no read grant).
    log_id: Option<String>,
}

async fn session(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    q: Result<Query<ConsoleQuery>, QueryRejection>,
) -> Result<Json<Session>, Failure> {
    let identity = identity(&app, &headers, &query(q)?)?;
    let timer = Instant::now();
    let mut client = app.hub.db.client(Server::Primary).await?;
    let mut tx = transaction(&mut client, &identity.role, true).await?;
    let stmt = tx.prepare_cached("SELECT pg_catalog.current_database()::text").await?;
    let database: String = tx.query_one(&stmt, &[]).await?.get(0);
    let log_id = unless_refused(&mut tx, "SELECT streams.log_id()::text").await?;
    let log_id = log_id.ok().flatten().and_then(|row| row.get(0));
    tx.commit().await?;
    metrics::query_seconds("console_session", timer);
    let expires_at = identity.expires.and_then(|at| at.duration_since(UNIX_EPOCH).ok()).map(|d| d.as_secs());
    Ok(Json(Session { role: identity.role, expires_at, database, log_id }))
}

/// streams.status as JSON: its columns, with the holder's age in seconds.
const STATUS: &str = "SELECT pg_catalog.json_build_object(
    'horizon', s.horizon, 'newest_position', s.newest_position, 'worker_pid', s.worker_pid,
    'worker_state', s.worker_state, 'delivered_position', s.delivered_position,
    'lag_positions', s.lag_positions, 'notify_state', s.notify_state, 'log_id', s.log_id,
    'holder_pid', s.holder_pid, 'holder_position', s.holder_position,
    'holder_xid', s.holder_xid::text::bigint,
    'holder_age_seconds', pg_catalog.date_part('epoch', s.holder_age),
    'holder_waits_for', s.holder_waits_for, 'rounds', s.rounds)::text
FROM streams.status s";

#[derive(Serialize)]
struct Overview {
    status: Option<Box<RawValue>>,
    status_error: Option<String>,
    horizon: Option<i64>,
    time: Box<RawValue>,
}

async fn overview(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    q: Result<Query<ConsoleQuery>, QueryRejection>,
) -> Result<Json<Overview>, Failure> {
    let identity = identity(&app, &headers, &query(q)?)?;
    let timer = Instant::now();
    let mut client = app.hub.db.client(Server::Primary).await?;
    let mut tx = transaction(&mut client, &identity.role, true).await?;
    let stmt = tx.prepare_cached("SELECT pg_catalog.to_json(pg_catalog.now())::text").await?;
    let time = raw(tx.query_one(&stmt, &[]).await?.get(0))?;
    let horizon = unless_refused(&mut tx, "SELECT streams.horizon()").await?;
    let horizon = horizon.ok().flatten().and_then(|row| row.get(0));
    let (status, status_error) = match unless_refused(&mut tx, STATUS).await? {
        Ok(Some(row)) => (Some(raw(row.get(0))?), None),
        Ok(None) => (None, Some("streams.status returned no row".to_owned())),
        Err(refusal) => (
            None,
            Some(format!(
                "{refusal}: the worker's state needs GRANT USAGE ON SCHEMA streams, GRANT SELECT ON streams.status \
                 and GRANT EXECUTE ON FUNCTION streams._worker_status() to the role {}",
                identity.role
            )),
        ),
    };
    tx.commit().await?;
    metrics::query_seconds("console_overview", timer);
    Ok(Json(Overview { status, status_error, horizon, time }))
}
