//! What the routes share: the application state, the connection count
//! (SSE and WebSocket alike), the query of an event stream and where it
//! starts. http.rs and ws.rs both build on it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::extract::rejection::QueryRejection;
use axum::extract::Query;
use serde::Deserialize;
use tokio::sync::Notify;

use crate::auth::Auth;
use crate::db::{Bound, Start};
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
    /// Up to and including this position, then the response ends.
    pub until: Option<String>,
    pub max_events: Option<String>,
    pub access_token: Option<String>,
    /// Only events of these types: `types=order.failed,order.paid`.
    pub types: Option<String>,
    /// Only events whose data contains this JSON object (URL-encoded).
    pub filter: Option<String>,
    /// SSE frames without `event:` lines: `frames=message`.
    pub frames: Option<String>,
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

/// The query string, or 400.
pub fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    q.map(|Query(q)| q).map_err(|e| ApiError::bad_request(format!("bad query string: {e}")))
}

/// Where to start: `Last-Event-ID` wins over `after`, `since` and `from_tx`;
/// `after` goes with `since` or `from_tx` (not both: 22023), and then the
/// later bound wins, as in replay; none is the beginning.
pub fn start_of(
    last_event_id: Option<&str>,
    after: Option<&str>,
    since: Option<&str>,
    from_tx: Option<&str>,
) -> Result<Start, ApiError> {
    let position = |text: &str, what: &str| {
        text.trim()
            .parse::<i64>()
            .map_err(|_| ApiError::invalid_parameter(format!("{what} must be a position (an integer), not {text:?}")))
    };
    if let Some(id) = last_event_id.filter(|id| !id.is_empty()) {
        return position(id, "Last-Event-ID").map(Start::after);
    }
    let after = after.map(|a| position(a, "after")).transpose()?;
    let bound = match (since, from_tx) {
        (None, None) => None,
        (Some(s), None) => Some(Bound::Since(s.to_owned())),
        // xid8's input takes "1'or'1" as 1: only digits reach it.
        (None, Some(x)) => match x.trim().parse::<u64>() {
            Ok(xid) => Some(Bound::FromTx(xid.to_string())),
            Err(_) => {
                return Err(ApiError::invalid_parameter(format!(
                    "from_tx must be a transaction id (an unsigned integer), not {x:?}"
                )))
            }
        },
        (Some(_), Some(_)) => return Err(ApiError::invalid_parameter("give since or from_tx, not both")),
    };
    Ok(Start { after, bound })
}

/// Where to stop: `until` (inclusive), a non-negative position; none: no
/// end, live on. A bad one is 22023, as the database's replay answers a
/// negative one, but refused here before any query.
pub fn until_of(until: Option<&str>) -> Result<Option<i64>, ApiError> {
    let Some(text) = until else { return Ok(None) };
    match text.trim().parse::<i64>() {
        Ok(p) if p >= 0 => Ok(Some(p)),
        _ => {
            Err(ApiError::invalid_parameter(format!("until must be a position (a non-negative integer), not {text:?}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SQLSTATE and message of a refused start.
    fn refused(result: Result<Start, ApiError>) -> (u16, Option<String>, String) {
        let e = result.expect_err("a bad start is refused");
        (e.status().as_u16(), e.sqlstate().map(str::to_owned), e.message().into_owned())
    }

    fn since(text: &str) -> Option<Bound> {
        Some(Bound::Since(text.into()))
    }

    fn from_tx(xid: &str) -> Option<Bound> {
        Some(Bound::FromTx(xid.into()))
    }

    #[test]
    fn no_start_is_the_beginning_and_each_parameter_is_read() {
        assert_eq!(start_of(None, None, None, None).unwrap(), Start::default());
        assert_eq!(start_of(None, Some("41"), None, None).unwrap(), Start::after(41));
        assert_eq!(start_of(None, Some(" 41 "), None, None).unwrap(), Start::after(41));
        assert_eq!(start_of(None, Some("-3"), None, None).unwrap(), Start::after(-3));
        let time = "2024-01-01T00:00:00Z";
        assert_eq!(start_of(None, None, Some(time), None).unwrap(), Start { after: None, bound: since(time) });
        // The database reads `since` (a bad one is its 22007).
        assert_eq!(
            start_of(None, None, Some("yesterday-ish"), None).unwrap(),
            Start { after: None, bound: since("yesterday-ish") }
        );
        assert_eq!(start_of(None, None, None, Some("7")).unwrap(), Start { after: None, bound: from_tx("7") });
        assert_eq!(start_of(None, None, None, Some(" 007 ")).unwrap(), Start { after: None, bound: from_tx("7") });
        assert_eq!(
            start_of(None, None, None, Some("18446744073709551615")).unwrap(),
            Start { after: None, bound: from_tx(&u64::MAX.to_string()) }
        );
    }

    #[test]
    fn last_event_id_wins_over_the_query() {
        assert_eq!(start_of(Some("9"), None, None, None).unwrap(), Start::after(9));
        assert_eq!(start_of(Some("9"), Some("1"), None, None).unwrap(), Start::after(9));
        assert_eq!(start_of(Some("9"), Some("1"), Some("now"), Some("3")).unwrap(), Start::after(9));
        assert_eq!(start_of(Some("9"), None, Some("now"), None).unwrap(), Start::after(9));
        // An empty one is none at all.
        assert_eq!(start_of(Some(""), Some("1"), None, None).unwrap(), Start::after(1));
        let (status, sqlstate, message) = refused(start_of(Some("abc"), Some("1"), None, None));
        assert_eq!((status, sqlstate.as_deref()), (400, Some("22023")));
        assert!(message.starts_with("Last-Event-ID must be a position"), "{message}");
    }

    #[test]
    fn after_goes_with_since_or_from_tx_but_not_both() {
        assert_eq!(
            start_of(None, Some("5"), Some("now"), None).unwrap(),
            Start { after: Some(5), bound: since("now") }
        );
        assert_eq!(start_of(None, Some("5"), None, Some("2")).unwrap(), Start { after: Some(5), bound: from_tx("2") });
        for after in [None, Some("1")] {
            let (status, sqlstate, message) = refused(start_of(None, after, Some("now"), Some("2")));
            assert_eq!((status, sqlstate.as_deref()), (400, Some("22023")), "{after:?}");
            assert_eq!(message, "give since or from_tx, not both");
        }
        let (status, sqlstate, message) = refused(start_of(None, Some("x"), Some("now"), None));
        assert_eq!((status, sqlstate.as_deref()), (400, Some("22023")));
        assert!(message.starts_with("after must be a position"), "{message}");
    }

    #[test]
    fn bad_positions_and_transaction_ids_are_22023() {
        for after in ["x", "1x", "", "1.5", "99999999999999999999"] {
            let (status, sqlstate, message) = refused(start_of(None, Some(after), None, None));
            assert_eq!((status, sqlstate.as_deref()), (400, Some("22023")), "{after:?}");
            assert!(message.starts_with("after must be a position"), "{after:?}: {message}");
        }
        // xid8's input would take "1'or'1" as 1: only digits pass.
        for from_tx in ["1'or'1", "-1", "1.5", "", "+", "0x10", "18446744073709551616"] {
            let (status, sqlstate, message) = refused(start_of(None, None, None, Some(from_tx)));
            assert_eq!((status, sqlstate.as_deref()), (400, Some("22023")), "{from_tx:?}");
            assert!(message.starts_with("from_tx must be a transaction id"), "{from_tx:?}: {message}");
        }
    }

    #[test]
    fn until_is_a_non_negative_position_or_none() {
        assert_eq!(until_of(None).unwrap(), None);
        assert_eq!(until_of(Some("0")).unwrap(), Some(0));
        assert_eq!(until_of(Some("41")).unwrap(), Some(41));
        assert_eq!(until_of(Some(" 41 ")).unwrap(), Some(41));
        assert_eq!(until_of(Some("9223372036854775807")).unwrap(), Some(i64::MAX));
        for until in ["-1", "x", "1x", "", " ", "1.5", "+", "0x10", "1'or'1", "9223372036854775808"] {
            let e = until_of(Some(until)).expect_err(until);
            assert_eq!((e.status().as_u16(), e.sqlstate()), (400, Some("22023")), "{until:?}");
            let message = e.message();
            assert!(message.starts_with("until must be a position (a non-negative integer)"), "{until:?}: {message}");
        }
    }
}
