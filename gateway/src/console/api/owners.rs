//! Subscriptions, their dead letters and webhooks: the lists (the
//! extension's views, as the role), and what an owner changes from the
//! console, as the owner (see [`act_for`]).

use std::sync::Arc;
use std::time::Instant;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::Json;
use deadpool_postgres::Transaction;
use serde::Serialize;
use serde_json::value::RawValue;

use super::{identity, path, position, raw, transaction, ConsoleQuery, Failure, UNDEFINED_OBJECT};
use crate::app::{query, App};
use crate::auth::Identity;
use crate::db::Server;
use crate::error::ApiError;
use crate::metrics;

/// Dead letters one answer lists at most (by position).
const MAX_DEAD_LETTERS: i64 = 1000;

/// streams.subscriptions as JSON, lag_time in seconds, owners as plain names.
const SUBSCRIPTIONS: &str = "SELECT coalesce(pg_catalog.json_agg(pg_catalog.json_build_object(
    'name', s.name, 'owner', pg_catalog.pg_get_userbyid(s.owner), 'stream', s.stream, 'ordered', s.ordered,
    'position', s.position, 'pending', s.pending, 'lag_seconds', pg_catalog.date_part('epoch', s.lag_time),
    'claimed', s.claimed, 'claimed_by', s.claimed_by, 'last_ack_at', s.last_ack_at, 'created_at', s.created_at,
    'max_attempts', s.max_attempts, 'highest_attempt', s.highest_attempt, 'retrying', s.retrying,
    'parked', s.parked, 'oldest_parked', s.oldest_parked, 'next_retry_at', s.next_retry_at, 'key', s.key,
    'types', s.types, 'filter', s.filter)
    ORDER BY pg_catalog.pg_get_userbyid(s.owner), s.name), '[]')::text
FROM streams.subscriptions s";

/// streams.webhooks as JSON, with the seconds until the next attempt (null:
/// none planned; 0: due).
const WEBHOOKS: &str = "SELECT coalesce(pg_catalog.json_agg(pg_catalog.json_build_object(
    'name', w.name, 'owner', pg_catalog.pg_get_userbyid(w.owner), 'stream', w.stream, 'url', w.url,
    'state', w.state, 'position', w.position, 'pending', w.pending, 'attempts', w.attempts,
    'last_status', w.last_status, 'last_error', w.last_error, 'next_attempt_at', w.next_attempt_at,
    'next_retry_seconds', CASE WHEN w.next_attempt_at IS NOT NULL
        THEN GREATEST(0, pg_catalog.date_part('epoch', w.next_attempt_at - pg_catalog.now())) END,
    'lag_seconds', pg_catalog.date_part('epoch', w.lag_time), 'batch', w.batch, 'disabled_at', w.disabled_at,
    'last_attempt_at', w.last_attempt_at, 'last_success_at', w.last_success_at, 'created_at', w.created_at,
    'types', w.types, 'filter', w.filter)
    ORDER BY pg_catalog.pg_get_userbyid(w.owner), w.name), '[]')::text
FROM streams.webhooks w";

/// One JSON array the database builds from a view, as the request's role.
async fn listing(app: &App, identity: &Identity, statement: &str) -> Result<Box<RawValue>, Failure> {
    let mut client = app.hub.db.client(Server::Primary).await?;
    let tx = transaction(&mut client, &identity.role, true).await?;
    let stmt = tx.prepare_cached(statement).await?;
    let json = raw(tx.query_one(&stmt, &[]).await?.get(0))?;
    tx.commit().await?;
    Ok(json)
}

#[derive(Serialize)]
pub(super) struct Subscriptions {
    subscriptions: Box<RawValue>,
}

pub(super) async fn subscriptions(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    q: Result<Query<ConsoleQuery>, QueryRejection>,
) -> Result<Json<Subscriptions>, Failure> {
    let identity = identity(&app, &headers, &query(q)?)?;
    let timer = Instant::now();
    let subscriptions = listing(&app, &identity, SUBSCRIPTIONS).await?;
    metrics::query_seconds("console_subscriptions", timer);
    Ok(Json(Subscriptions { subscriptions }))
}

#[derive(Serialize)]
pub(super) struct Webhooks {
    webhooks: Box<RawValue>,
}

pub(super) async fn webhooks(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    q: Result<Query<ConsoleQuery>, QueryRejection>,
) -> Result<Json<Webhooks>, Failure> {
    let identity = identity(&app, &headers, &query(q)?)?;
    let timer = Instant::now();
    let webhooks = listing(&app, &identity, WEBHOOKS).await?;
    metrics::query_seconds("console_webhooks", timer);
    Ok(Json(Webhooks { webhooks }))
}

/// The longest role name PostgreSQL keeps (NAMEDATALEN - 1).
const MAX_ROLE_NAME_BYTES: usize = 63;

/// The role `owner`, acted for: the token's role itself, or a role it is a
/// member of, which the rest of the transaction then runs as (as a member
/// would `SET ROLE` in SQL first); 403 for any other, 404 for no such role.
/// Its oid.
async fn act_for(tx: &Transaction<'_>, owner: &str) -> Result<u32, Failure> {
    // Longer than a role name can be (NAMEDATALEN - 1 bytes): no such role,
    // rather than the 42622 the database would raise for the parameter.
    if owner.len() > MAX_ROLE_NAME_BYTES {
        return Err(Failure::missing(
            "role does not exist (the name is longer than any role name)",
            Some(UNDEFINED_OBJECT),
        ));
    }
    let stmt = tx
        .prepare_cached(
            "SELECT r.oid, r.rolname = current_user, pg_catalog.pg_has_role(current_user, r.oid, 'MEMBER')
             FROM pg_catalog.pg_roles r WHERE r.rolname = $1",
        )
        .await?;
    let Some(row) = tx.query_opt(&stmt, &[&owner]).await? else {
        return Err(Failure::missing(format!("role \"{owner}\" does not exist"), Some(UNDEFINED_OBJECT)));
    };
    let (oid, own, member): (u32, bool, bool) = (row.get(0), row.get(1), row.get(2));
    if !member {
        return Err(ApiError::forbidden(format!(
            "permission denied: the token's role is not a member of \"{owner}\", which owns it"
        ))
        .into());
    }
    if !own {
        let stmt = tx.prepare_cached("SELECT pg_catalog.set_config('role', $1, true)").await?;
        tx.execute(&stmt, &[&owner]).await?;
    }
    Ok(oid)
}

/// 404 unless `owner` (acted for) has a subscription `name` (a webhook's,
/// with `webhook`).
async fn require(tx: &Transaction<'_>, name: &str, owner: u32, webhook: bool) -> Result<(), Failure> {
    let (statement, what) = match webhook {
        false => ("SELECT FROM streams.subscriptions s WHERE s.name = $1 AND s.owner::oid = $2", "subscription"),
        true => ("SELECT FROM streams.webhooks w WHERE w.name = $1 AND w.owner::oid = $2", "webhook"),
    };
    let stmt = tx.prepare_cached(statement).await?;
    match tx.query_opt(&stmt, &[&name, &owner]).await? {
        Some(_) => Ok(()),
        None => Err(Failure::missing(format!("{what} \"{name}\" does not exist"), Some(UNDEFINED_OBJECT))),
    }
}

const DEAD_LETTERS: &str = "SELECT pg_catalog.json_build_object(
    'subscription', d.subscription, 'owner', pg_catalog.pg_get_userbyid(d.owner), 'position', d.position,
    'stream', d.stream, 'attempts', d.attempts, 'first_error', d.first_error, 'last_error', d.last_error,
    'first_failed_at', d.first_failed_at, 'last_failed_at', d.last_failed_at, 'parked_at', d.parked_at)::text
FROM streams.dead_letters d
WHERE d.subscription = $1 AND d.owner::oid = $2
ORDER BY d.position
LIMIT $3";

#[derive(Serialize)]
pub(super) struct DeadLetters {
    dead_letters: Vec<Box<RawValue>>,
    /// More than [`MAX_DEAD_LETTERS`]: the rest are not listed.
    more: bool,
}

pub(super) async fn dead_letters(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    q: Result<Query<ConsoleQuery>, QueryRejection>,
    p: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<DeadLetters>, Failure> {
    let identity = identity(&app, &headers, &query(q)?)?;
    let (owner, name) = path(p)?;
    let timer = Instant::now();
    let mut client = app.hub.db.client(Server::Primary).await?;
    let tx = transaction(&mut client, &identity.role, true).await?;
    let owner = act_for(&tx, &owner).await?;
    require(&tx, &name, owner, false).await?;
    let stmt = tx.prepare_cached(DEAD_LETTERS).await?;
    let mut rows = tx.query(&stmt, &[&name, &owner, &(MAX_DEAD_LETTERS + 1)]).await?;
    tx.commit().await?;
    metrics::query_seconds("console_dead_letters", timer);
    let more = rows.len() as i64 > MAX_DEAD_LETTERS;
    rows.truncate(MAX_DEAD_LETTERS as usize);
    let dead_letters = rows.into_iter().map(|row| raw(row.get(0))).collect::<Result<_, _>>()?;
    Ok(Json(DeadLetters { dead_letters, more }))
}

#[derive(Serialize)]
pub(super) struct Changed {
    changed: i64,
}

/// Retry or discard one dead letter of `owner`'s subscription, as `owner`.
async fn settle(
    app: &App,
    headers: &HeaderMap,
    q: Result<Query<ConsoleQuery>, QueryRejection>,
    p: Result<Path<(String, String, String)>, PathRejection>,
    statement: &str,
) -> Result<Json<Changed>, Failure> {
    let identity = identity(app, headers, &query(q)?)?;
    let (owner, name, position_text) = path(p)?;
    let position = position(&position_text)?;
    let timer = Instant::now();
    let mut client = app.hub.db.client(Server::Primary).await?;
    let tx = transaction(&mut client, &identity.role, false).await?;
    let owner = act_for(&tx, &owner).await?;
    require(&tx, &name, owner, false).await?;
    let stmt = tx.prepare_cached(statement).await?;
    let changed: i64 = tx.query_one(&stmt, &[&name, &position]).await?.get(0);
    tx.commit().await?;
    metrics::query_seconds("console_settle", timer);
    Ok(Json(Changed { changed }))
}

pub(super) async fn retry(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    q: Result<Query<ConsoleQuery>, QueryRejection>,
    p: Result<Path<(String, String, String)>, PathRejection>,
) -> Result<Json<Changed>, Failure> {
    settle(&app, &headers, q, p, "SELECT streams.retry_dead_letter($1, $2)").await
}

pub(super) async fn discard(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    q: Result<Query<ConsoleQuery>, QueryRejection>,
    p: Result<Path<(String, String, String)>, PathRejection>,
) -> Result<Json<Changed>, Failure> {
    settle(&app, &headers, q, p, "SELECT streams.discard_dead_letter($1, $2)").await
}

#[derive(Serialize)]
pub(super) struct WebhookState {
    name: String,
    owner: String,
    /// active, retrying, paused or disabled, after the change.
    state: String,
}

/// Pause or resume `owner`'s webhook, as `owner`; its state after.
async fn set_webhook(
    app: &App,
    headers: &HeaderMap,
    q: Result<Query<ConsoleQuery>, QueryRejection>,
    p: Result<Path<(String, String)>, PathRejection>,
    statement: &str,
) -> Result<Json<WebhookState>, Failure> {
    let identity = identity(app, headers, &query(q)?)?;
    let (owner_name, name) = path(p)?;
    let timer = Instant::now();
    let mut client = app.hub.db.client(Server::Primary).await?;
    let tx = transaction(&mut client, &identity.role, false).await?;
    let owner = act_for(&tx, &owner_name).await?;
    require(&tx, &name, owner, true).await?;
    let stmt = tx.prepare_cached(statement).await?;
    tx.execute(&stmt, &[&name]).await?;
    let stmt =
        tx.prepare_cached("SELECT w.state FROM streams.webhooks w WHERE w.name = $1 AND w.owner::oid = $2").await?;
    let state: String = tx.query_one(&stmt, &[&name, &owner]).await?.get(0);
    tx.commit().await?;
    metrics::query_seconds("console_webhook", timer);
    Ok(Json(WebhookState { name, owner: owner_name, state }))
}

pub(super) async fn pause(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    q: Result<Query<ConsoleQuery>, QueryRejection>,
    p: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<WebhookState>, Failure> {
    set_webhook(&app, &headers, q, p, "SELECT streams.pause_webhook($1)").await
}

pub(super) async fn resume(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    q: Result<Query<ConsoleQuery>, QueryRejection>,
    p: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<WebhookState>, Failure> {
    set_webhook(&app, &headers, q, p, "SELECT streams.resume_webhook($1)").await
}
