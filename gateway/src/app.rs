//! What the routes share: the application state, the connection count
//! (SSE and WebSocket alike), the query of an event stream and where it
//! starts. http.rs and ws.rs both build on it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::Deserialize;
use tokio::sync::Notify;

use crate::auth::Auth;
use crate::db::Start;
use crate::error::ApiError;
use crate::hub::Hub;
use crate::metrics;

pub struct App {
    pub hub: Arc<Hub>,
    pub auth: Auth,
    pub(crate) connections: AtomicUsize,
    /// The latest /healthz answer and when it was asked: at most one health
    /// query a second, however many requests come (it needs no token).
    pub(crate) health: tokio::sync::Mutex<Option<(Instant, Result<serde_json::Value, ApiError>)>>,
}

/// The kill switch of the TCP connection a request came on (main.rs): the
/// fan-out pulls it when the client falls behind its buffer, and the
/// connection is closed whether or not the client reads.
#[derive(Clone)]
pub struct ConnKill(pub Arc<Notify>);

#[derive(Debug, Default, Deserialize)]
pub struct EventsQuery {
    pub after: Option<String>,
    pub since: Option<String>,
    pub from_tx: Option<String>,
    pub max_events: Option<String>,
    pub access_token: Option<String>,
}

/// Counts an SSE or WebSocket connection while it lives.
pub struct ConnGuard {
    app: Arc<App>,
    gauge: &'static ::metrics::Gauge,
}

impl ConnGuard {
    pub fn new(app: &Arc<App>, websocket: bool) -> Result<ConnGuard, ApiError> {
        if app.connections.fetch_add(1, Ordering::Relaxed) >= app.hub.cfg.max_connections {
            app.connections.fetch_sub(1, Ordering::Relaxed);
            return Err(ApiError::unavailable("too many connections (--max-connections)"));
        }
        let m = metrics::get();
        let gauge = if websocket { &m.ws_connections } else { &m.sse_connections };
        gauge.increment(1.0);
        Ok(ConnGuard { app: app.clone(), gauge })
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.app.connections.fetch_sub(1, Ordering::Relaxed);
        self.gauge.decrement(1.0);
    }
}

/// Where to start: `Last-Event-ID` wins over `after`, `since` and `from_tx`
/// (at most one of those); none is the beginning, as in replay.
pub fn start_of(
    last_event_id: Option<&str>,
    after: Option<&str>,
    since: Option<&str>,
    from_tx: Option<&str>,
) -> Result<Start, ApiError> {
    let bad = |what: String| ApiError { sqlstate: Some("22023".into()), ..ApiError::bad_request(what) };
    let position = |text: &str, what: &str| {
        text.trim().parse::<i64>().map_err(|_| bad(format!("{what} must be a position (an integer), not {text:?}")))
    };
    if let Some(id) = last_event_id.filter(|id| !id.is_empty()) {
        return position(id, "Last-Event-ID").map(Start::After);
    }
    match (after, since, from_tx) {
        (None, None, None) => Ok(Start::After(0)),
        (Some(a), None, None) => position(a, "after").map(Start::After),
        (None, Some(s), None) => Ok(Start::Since(s.to_owned())),
        // xid8's input takes "1'or'1" as 1: only digits reach it.
        (None, None, Some(x)) => match x.trim().parse::<u64>() {
            Ok(xid) => Ok(Start::FromTx(xid.to_string())),
            Err(_) => Err(bad(format!("from_tx must be a transaction id (an unsigned integer), not {x:?}"))),
        },
        _ => Err(bad("give at most one of after, since and from_tx".into())),
    }
}
