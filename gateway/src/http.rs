//! The HTTP routes: SSE and JSON pages of a pattern, publish, health,
//! metrics, and the JSON errors of everything else.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use crate::app::{query, start_of, until_of, App, ConnGuard, ConnKill, EventsQuery};
use crate::auth::Auth;
use crate::db::{Publish, Server, Start};
use crate::error::ApiError;
use crate::event::Frames;
use crate::hub::Hub;
use crate::subscription::{check_read, End, Subscription};
use crate::{metrics, pattern, ws};

/// How long a /healthz answer is reused.
const HEALTH_TTL: Duration = Duration::from_secs(1);

pub fn router(hub: Arc<Hub>, auth: Auth) -> Router {
    let max_body = hub.cfg.max_body_bytes;
    let cors = cors(hub.cfg.allow_origin.as_deref());
    let app = Arc::new(App { hub, auth, connections: AtomicUsize::new(0), health: Default::default() });
    let router = Router::new()
        .route("/v1/streams/{pattern}/events", get(events).post(publish))
        .route("/v1/ws", get(ws::upgrade))
        .route("/healthz", get(healthz))
        .route("/metrics", get(render_metrics))
        .merge(crate::console::routes())
        .fallback(|| async { ApiError::NotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(app);
    match cors {
        Some(cors) => router.layer(cors),
        None => router,
    }
}

/// CORS for browsers on other origins (EventSource and fetch need it; a
/// WebSocket does not). Tokens travel in the Authorization header or the
/// access_token parameter, never in cookies, so no credentials are allowed.
fn cors(allow_origin: Option<&str>) -> Option<tower_http::cors::CorsLayer> {
    use tower_http::cors::{AllowOrigin, Any, CorsLayer};
    let allow_origin = allow_origin?.trim();
    let origins = if allow_origin == "*" {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(allow_origin.split(',').filter_map(|o| o.trim().parse().ok()))
    };
    Some(
        CorsLayer::new()
            .allow_origin(origins)
            .allow_methods([axum::http::Method::GET, axum::http::Method::POST])
            .allow_headers(Any)
            .expose_headers(Any),
    )
}

async fn events(
    State(app): State<Arc<App>>,
    Path(pattern): Path<String>,
    headers: HeaderMap,
    q: Result<Query<EventsQuery>, QueryRejection>,
    kill: Option<axum::Extension<ConnKill>>,
) -> Result<Response, ApiError> {
    let q = query(q)?;
    let identity = app.auth.identity(&headers, q.access_token.as_deref())?;
    let role = &identity.role;
    let last_event_id = headers.get("last-event-id").and_then(|v| v.to_str().ok());
    let start = start_of(last_event_id, q.after.as_deref(), q.since.as_deref(), q.from_tx.as_deref())?;
    let until = until_of(q.until.as_deref())?;
    let filter = pattern::parse_filter(q.types.as_deref(), q.filter.as_deref()).map_err(ApiError::invalid_parameter)?;
    let frames = Frames::parse(q.frames.as_deref()).map_err(ApiError::invalid_parameter)?;
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    if !accept.contains("text/event-stream") {
        return page(&app, role, &pattern, &start, &filter, until, q.max_events.as_deref()).await;
    }
    if let Some(until) = until {
        // Positions start at 1: no `after` is 0.
        if start.after.unwrap_or(0) >= until {
            // Nothing left up to `until`: 204 tells an EventSource
            // reconnecting with Last-Event-ID (the stream's last `id:` is
            // `until`) to stop.
            return Ok(StatusCode::NO_CONTENT.into_response());
        }
    }
    let opened = match ConnGuard::new(&app, false) {
        Ok(guard) => {
            let kill = kill.map(|k| k.0 .0.clone()).unwrap_or_default();
            Subscription::open(&app.hub, role, &pattern, filter, start, until, kill).await.map(|sub| (sub, guard))
        }
        Err(e) => Err(e),
    };
    let body = match opened {
        Ok((sub, guard)) => sse_body(sub, frames, app.hub.cfg.heartbeat(), identity.deadline(), guard),
        // EventSource gives up for good on any status but 200: tell it to
        // come back instead (the database may be back by then).
        Err(e @ ApiError::Unavailable { .. }) => try_again_later(&e),
        Err(e) => return Err(e),
    };
    Ok(Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .header("x-accel-buffering", "no")
        .body(body)
        .expect("static headers are valid"))
}

/// An SSE body that only says when to reconnect (1 to 3 s, spread so that
/// clients refused together do not all come back at once) and why, as a
/// comment, then ends.
fn try_again_later(e: &ApiError) -> Body {
    let spread = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_millis();
    let retry = 1000 + spread * 2;
    let reason = e.json().to_string();
    Body::from(format!("retry: {retry}\n: {reason}\n\n"))
}

/// The response body: `retry:` first, then events (their frames as
/// `frames` asks) and `: ping` heartbeats,
/// and with `until`, once every event up to it was sent, `id: {until}` (no
/// data: no event, but an EventSource reconnects from there and gets 204),
/// then the end; polled by the connection's own task (no task or queue of
/// its own in between). The frames are the events' own (encoded once for every client)
/// rather than axum's `Sse`, which would encode each event per client.
fn sse_body(
    sub: Subscription,
    frames: Frames,
    heartbeat: Duration,
    expires: tokio::time::Instant,
    guard: ConnGuard,
) -> Body {
    const PING: Bytes = Bytes::from_static(b": ping\n\n");
    struct State {
        sub: Subscription,
        frames: Frames,
        ping: tokio::time::Interval,
        started: bool,
        /// `until` was reached and said: the body ends.
        ended: bool,
        /// The token's expiry: the stream ends then (a reconnect needs a new token).
        expires: Pin<Box<tokio::time::Sleep>>,
        _guard: ConnGuard,
    }
    let ping = tokio::time::interval_at(tokio::time::Instant::now() + heartbeat, heartbeat);
    let expires = Box::pin(tokio::time::sleep_until(expires));
    let state = State { sub, frames, ping, started: false, ended: false, expires, _guard: guard };
    let chunks = futures_util::stream::unfold(state, |mut st| async move {
        if !st.started {
            st.started = true;
            return Some((Ok::<_, Infallible>(Bytes::from_static(b"retry: 1000\n\n")), st));
        }
        if st.ended {
            return None;
        }
        // Both arms are cancel-safe: a catch-up page cut short by a ping is read again.
        let frame = tokio::select! {
            next = st.sub.next() => match next {
                Ok((event, _)) => event.frame(st.frames),
                Err(End::Dropped) => return None,
                Err(End::Reached(until)) => {
                    st.ended = true;
                    Bytes::from(format!("id: {until}\n\n"))
                }
                Err(End::Error(e)) => {
                    tracing::debug!(error = %e.message(), "SSE subscription ended");
                    return None;
                }
            },
            _ = st.ping.tick() => PING,
            _ = st.expires.as_mut() => {
                tracing::debug!("SSE token expired");
                return None;
            }
        };
        Some((Ok(frame), st))
    });
    Body::from_stream(chunks)
}

/// One replay page as a JSON array.
async fn page(
    app: &App,
    role: &str,
    pattern: &str,
    start: &Start,
    filter: &litebase_streams_core::filters::EventFilter,
    until: Option<i64>,
    max_events: Option<&str>,
) -> Result<Response, ApiError> {
    let cfg = &app.hub.cfg;
    let limit = match max_events {
        None => cfg.page_size,
        Some(text) => match text.parse::<i32>() {
            Ok(n) if (0..=cfg.max_page_size).contains(&n) => n,
            _ => return Err(ApiError::invalid_parameter(format!("max_events must be 0 to {}", cfg.max_page_size))),
        },
    };
    let selector = pattern::parse(pattern).map_err(ApiError::invalid_parameter)?;
    check_read(&app.hub, role, pattern, &selector).await?;
    // The database side stops reading near the byte limit (it may read a
    // little past it); the cut here keeps the body within --max-page-bytes
    // unless its first event alone is larger.
    let max_bytes = cfg.limits.max_page_bytes;
    let page =
        app.hub.db.replay_page_bytes(Server::Reader, role, pattern, start, filter, until, limit, max_bytes).await?;
    let mut len = 2;
    let mut count = 0;
    for event in &page.events {
        if count > 0 && len + event.json.len() + 1 > max_bytes {
            break;
        }
        len += event.json.len() + 1;
        count += 1;
    }
    let mut body = String::with_capacity(len);
    body.push('[');
    for (i, event) in page.events[..count].iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str(&event.json);
    }
    body.push(']');
    drop(page);
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// `POST /v1/streams/{stream}/events`: the body is the event's data (JSON);
/// the optional request headers `Event-Type` and `Event-Key` give its type
/// and key, and `Idempotency-Key` publishes it at most once per key
/// (`streams.publish_once`). 201 `{"position": p}` when it was published;
/// with an idempotency key, 200 `{"position": p, "duplicate": true}` for a
/// repeat with the same body and envelope (the original position, nothing
/// written), 422 (SQLSTATE 23505) for the same key with another. A value
/// the database refuses (empty, too long, control characters: 22023) is a
/// 400.
async fn publish(
    State(app): State<Arc<App>>,
    Path(stream): Path<String>,
    headers: HeaderMap,
    q: Result<Query<EventsQuery>, QueryRejection>,
    body: Body,
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    let q = query(q)?;
    // The token first: a client without one never gets a body buffered.
    let role = app.auth.role(&headers, q.access_token.as_deref())?;
    let body = read_body(&app, body).await?;
    pattern::validate_stream_name(&stream).map_err(ApiError::invalid_parameter)?;
    let text = std::str::from_utf8(&body).map_err(|_| ApiError::bad_request("the body is not UTF-8"))?;
    if let Err(e) = serde_json::from_str::<&serde_json::value::RawValue>(text) {
        let message = format!("the body is not JSON: {e}");
        return Err(ApiError::BadRequest { message, sqlstate: Some("22P02".into()) });
    }
    let ask = Publish {
        type_: text_header(&headers, "event-type")?,
        key: text_header(&headers, "event-key")?,
        idempotency_key: text_header(&headers, "idempotency-key")?,
    };
    let (position, duplicate) = app.hub.db.publish(&role, &stream, text, &ask).await?;
    Ok(match (ask.idempotency_key, duplicate) {
        (None, _) => (StatusCode::CREATED, Json(serde_json::json!({ "position": position }))),
        (Some(_), false) => {
            (StatusCode::CREATED, Json(serde_json::json!({ "position": position, "duplicate": false })))
        }
        (Some(_), true) => (StatusCode::OK, Json(serde_json::json!({ "position": position, "duplicate": true }))),
    })
}

/// The value of request header `name` as UTF-8 text, if sent (once: a
/// header sent twice is refused rather than one of them picked).
fn text_header<'h>(headers: &'h HeaderMap, name: &str) -> Result<Option<&'h str>, ApiError> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else { return Ok(None) };
    if values.next().is_some() {
        return Err(ApiError::invalid_parameter(format!("the {name} header is sent more than once")));
    }
    std::str::from_utf8(value.as_bytes())
        .map(Some)
        .map_err(|_| ApiError::invalid_parameter(format!("the {name} header is not UTF-8")))
}

/// A request body of at most --max-body-bytes (413) that must arrive
/// within --body-timeout-secs (408): a body sent a byte at a time holds
/// its buffer no longer than that.
async fn read_body(app: &App, body: Body) -> Result<Bytes, ApiError> {
    let cfg = &app.hub.cfg;
    match tokio::time::timeout(cfg.limits.body_timeout(), axum::body::to_bytes(body, cfg.max_body_bytes)).await {
        Err(_) => Err(ApiError::BodyTimeout),
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) => {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.downcast_ref::<http_body_util::LengthLimitError>().is_some())
                || e.to_string().contains("length limit");
            if too_large {
                Err(ApiError::TooLarge { limit: cfg.max_body_bytes })
            } else {
                Err(ApiError::bad_request(format!("bad body: {e}")))
            }
        }
    }
}

/// 200 when the database answers and (asked as a role that may read) its
/// worker runs; 503 otherwise. Asked at most once a second (it needs no
/// token); the worker's pid stays out of it.
async fn healthz(State(app): State<Arc<App>>) -> Result<Json<serde_json::Value>, ApiError> {
    let mut cached = app.health.lock().await;
    if let Some((at, answer)) = cached.as_ref() {
        if at.elapsed() < HEALTH_TTL {
            return answer.clone().map(Json);
        }
    }
    let answer = health(&app).await;
    *cached = Some((Instant::now(), answer.clone()));
    answer.map(Json)
}

async fn health(app: &App) -> Result<serde_json::Value, ApiError> {
    let cfg = &app.hub.cfg;
    let role = cfg.health_role.clone().or(cfg.anonymous_role.clone()).or(app.hub.last_role.lock().unwrap().clone());
    let listening = app.hub.listening.load(Ordering::Relaxed);
    match (role.is_some(), app.hub.db.health(role.as_deref()).await?) {
        (true, None) => Err(ApiError::unavailable("no litebase_streams worker runs for this database")),
        (_, _) => Ok(serde_json::json!({
            "status": "ok",
            "database": "ok",
            "worker": if role.is_some() { "running" } else { "unknown: no role to ask as (--health-role)" },
            "listening": listening,
        })),
    }
}

/// GET /metrics. With --metrics-token only a scrape that sends it gets an
/// answer (all of it); without, anyone gets the gateway's own counters
/// (metrics/access.rs).
async fn render_metrics(State(app): State<Arc<App>>, headers: HeaderMap) -> Result<Response, ApiError> {
    let scope = metrics::access::scope(app.hub.cfg.metrics_token.as_deref(), &headers)?;
    let listening = app.hub.listening.load(Ordering::Relaxed) as usize;
    metrics::get().db_connections.set((app.hub.db.connections() + listening) as f64);
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], metrics::render(scope)).into_response())
}

#[cfg(test)]
mod tests;
