//! `GET /v1/ws`: subscriptions over one WebSocket.
//!
//! Client → server: `{"type":"subscribe","stream":"payment.*","after":41}` (optionally with
//! `"types":["payment.failed"]` and `"filter":{"currency":"EUR"}`: only the events they keep)
//! (or `since`, `from_tx`; none: from the beginning) and
//! `{"type":"unsubscribe","stream":"payment.*"}`.
//! Server → client: `{"type":"subscribed","stream":…}`,
//! `{"type":"event","subscription":…,"position":…,"stream":…,"time":…,"tx":…,"data":…}`
//! (the same guarantees as SSE, per subscription), `{"type":"unsubscribed","stream":…}`,
//! `{"type":"error","stream":…,"status":…,"error":…,"sqlstate":…}`.
//! A client that falls behind its buffer is closed with code 4008 (the
//! reason says so): reconnect and subscribe again with `after` = the last
//! position received. When the token expires the socket is closed with code
//! 4001: reconnect with a new token.
//!
//! `/v1/ws?until=p` (a position; a bad one is 400, SQLSTATE 22023) bounds
//! every subscription of the socket as SSE's `until` does: once every event
//! of a subscription up to `p` was sent, `{"type":"unsubscribed","stream":…,
//! "until":p}` follows (nothing of it after that), and when none is left the
//! socket gets a normal close (1000).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

use crate::app::{query, start_of, until_of, App, ConnGuard, EventsQuery};
use crate::auth::Identity;
use crate::error::ApiError;
use crate::subscription::{End, Subscription};

/// Close code for a client that fell behind (4000-4999 are the application's).
pub const CLOSE_TOO_SLOW: u16 = 4008;
/// Close code when the connection's token expires.
pub const CLOSE_TOKEN_EXPIRED: u16 = 4001;
/// Messages queued for one WebSocket before its subscriptions wait.
const OUT_QUEUE: usize = 64;
/// Subscriptions one WebSocket may hold at once.
pub const MAX_SUBSCRIPTIONS: usize = 64;

#[derive(Deserialize)]
struct Request {
    #[serde(rename = "type")]
    kind: String,
    stream: Option<String>,
    after: Option<serde_json::Value>,
    since: Option<String>,
    from_tx: Option<serde_json::Value>,
    /// Only events of these types.
    types: Option<Vec<String>>,
    /// Only events whose data contains this JSON object.
    filter: Option<serde_json::Value>,
}

pub async fn upgrade(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    q: Result<Query<EventsQuery>, QueryRejection>,
    ws: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    let q = query(q)?;
    let identity = app.auth.identity(&headers, q.access_token.as_deref())?;
    let until = until_of(q.until.as_deref())?;
    let guard = ConnGuard::new(&app, true)?;
    let max = app.hub.cfg.max_ws_message_bytes;
    Ok(ws
        .max_message_size(max)
        .max_frame_size(max)
        .on_upgrade(move |socket| serve(app, identity, until, socket, guard)))
}

fn text(value: serde_json::Value) -> Message {
    Message::Text(value.to_string().into())
}

fn error(stream: Option<&str>, e: &ApiError) -> Message {
    text(serde_json::json!({
        "type": "error", "stream": stream, "status": e.status().as_u16(), "error": e.message(), "sqlstate": e.sqlstate(),
    }))
}

fn json_text(value: &serde_json::Value) -> Option<String> {
    match value {
        serde_json::Value::Null => None,
        serde_json::Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// Why a WebSocket is closed by the gateway.
enum Close {
    Client,
    TooSlow,
    Expired,
    /// Every subscription got every event up to the socket's `until`.
    Reached(i64),
}

/// What a subscription's task shares with its socket.
#[derive(Clone)]
struct Link {
    out: mpsc::Sender<Message>,
    kill: Arc<Notify>,
    /// The socket's `until`.
    until: Option<i64>,
    /// A subscription (its stream and task) that reached `until`, after its
    /// last message was queued.
    reached: mpsc::UnboundedSender<(String, tokio::task::Id)>,
}

async fn serve(app: Arc<App>, identity: Identity, until: Option<i64>, socket: WebSocket, _guard: ConnGuard) {
    let role = identity.role.clone();
    let expiry = tokio::time::sleep_until(identity.deadline());
    tokio::pin!(expiry);
    let (mut sink, mut incoming) = socket.split();
    let (out, mut queue) = mpsc::channel::<Message>(OUT_QUEUE);
    let kill = Arc::new(Notify::new());
    let (reached, mut reached_rx) = mpsc::unbounded_channel();
    let link = Link { out: out.clone(), kill: kill.clone(), until, reached };
    let mut subscriptions: HashMap<String, JoinHandle<()>> = HashMap::new();
    let heartbeat = app.hub.cfg.heartbeat();
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + heartbeat, heartbeat);
    let close = loop {
        tokio::select! {
            message = incoming.next() => {
                let text = match message {
                    Some(Ok(Message::Text(t))) => t,
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break Close::Client,
                    Some(Ok(Message::Binary(_))) => {
                        let _ = out.try_send(error(None, &ApiError::bad_request("send JSON text messages")));
                        continue;
                    }
                    Some(Ok(_)) => continue, // ping/pong
                };
                handle(&app, &role, text.as_str(), &link, &mut subscriptions);
            }
            Some((stream, task)) = reached_rx.recv() => {
                if subscriptions.get(&stream).is_some_and(|t| t.id() == task) {
                    subscriptions.remove(&stream);
                }
                subscriptions.retain(|_, task| !task.is_finished());
                if let (Some(until), true) = (until, subscriptions.is_empty()) {
                    break Close::Reached(until);
                }
            }
            Some(message) = queue.recv() => {
                tokio::select! {
                    sent = sink.send(message) => if sent.is_err() { break Close::Client },
                    _ = kill.notified() => break Close::TooSlow,
                }
            }
            _ = ping.tick() => {
                // A client that stops reading fails this write after
                // --write-timeout (limits.rs); the kill switch is heard meanwhile.
                tokio::select! {
                    sent = sink.send(Message::Ping(Default::default())) => if sent.is_err() { break Close::Client },
                    _ = kill.notified() => break Close::TooSlow,
                }
            }
            _ = kill.notified() => break Close::TooSlow,
            _ = &mut expiry => break Close::Expired,
        }
    };
    for (_, task) in subscriptions.drain() {
        task.abort();
    }
    if let Close::Reached(_) = close {
        // What the subscriptions queued before they reached `until` goes first.
        while let Ok(message) = queue.try_recv() {
            match tokio::time::timeout(Duration::from_secs(1), sink.send(message)).await {
                Ok(Ok(())) => {}
                _ => return,
            }
        }
    }
    let frame = match close {
        Close::Client => return,
        Close::TooSlow => CloseFrame {
            code: CLOSE_TOO_SLOW,
            reason: "too slow: buffer full; reconnect and subscribe with after = your last position".into(),
        },
        Close::Expired => {
            CloseFrame { code: CLOSE_TOKEN_EXPIRED, reason: "token expired: reconnect with a new one".into() }
        }
        Close::Reached(until) => {
            CloseFrame { code: axum::extract::ws::close_code::NORMAL, reason: format!("until {until} reached").into() }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), sink.send(Message::Close(Some(frame)))).await;
}

fn handle(app: &Arc<App>, role: &str, text: &str, link: &Link, subscriptions: &mut HashMap<String, JoinHandle<()>>) {
    let out = &link.out;
    subscriptions.retain(|_, task| !task.is_finished());
    let request = match serde_json::from_str::<Request>(text) {
        Ok(r) => r,
        Err(e) => {
            let _ = out.try_send(error(None, &ApiError::bad_request(format!("bad message: {e}"))));
            return;
        }
    };
    let Some(stream) = request.stream.clone() else {
        let _ = out.try_send(error(None, &ApiError::bad_request("a message needs \"stream\"")));
        return;
    };
    match request.kind.as_str() {
        "subscribe" => {
            if subscriptions.contains_key(&stream) {
                let _ = out.try_send(error(Some(&stream), &ApiError::bad_request("already subscribed")));
                return;
            }
            if subscriptions.len() >= MAX_SUBSCRIPTIONS {
                let e = ApiError::bad_request(format!("at most {MAX_SUBSCRIPTIONS} subscriptions per WebSocket"));
                let _ = out.try_send(error(Some(&stream), &e));
                return;
            }
            let after = request.after.as_ref().and_then(json_text);
            let from_tx = request.from_tx.as_ref().and_then(json_text);
            let start = match start_of(None, after.as_deref(), request.since.as_deref(), from_tx.as_deref()) {
                Ok(s) => s,
                Err(e) => {
                    let _ = out.try_send(error(Some(&stream), &e));
                    return;
                }
            };
            let types = request.types.as_ref().map(|t| t.join(","));
            let filter_text = request.filter.as_ref().map(|f| f.to_string());
            let filter = match crate::pattern::parse_filter(types.as_deref(), filter_text.as_deref()) {
                Ok(f) => f,
                Err(e) => {
                    let _ = out.try_send(error(Some(&stream), &ApiError::invalid_parameter(e)));
                    return;
                }
            };
            let hub = app.hub.clone();
            let task = tokio::spawn(run(hub, role.to_owned(), stream.clone(), filter, start, link.clone()));
            subscriptions.insert(stream, task);
        }
        "unsubscribe" => match subscriptions.remove(&stream) {
            Some(task) => {
                // Aborted before the acknowledgement is queued: nothing of
                // this subscription follows it.
                task.abort();
                let out = out.clone();
                tokio::spawn(async move {
                    let _ = out.send(text_msg("unsubscribed", &stream)).await;
                });
            }
            None => {
                let _ = out.try_send(error(Some(&stream), &ApiError::NotSubscribed));
            }
        },
        other => {
            let _ =
                out.try_send(error(Some(&stream), &ApiError::bad_request(format!("unknown message type {other:?}"))));
        }
    }
}

fn text_msg(kind: &str, stream: &str) -> Message {
    text(serde_json::json!({"type": kind, "stream": stream}))
}

async fn run(
    hub: Arc<crate::hub::Hub>,
    role: String,
    pattern: String,
    filter: litebase_streams_core::filters::EventFilter,
    start: crate::db::Start,
    link: Link,
) {
    let out = link.out;
    let mut sub = match Subscription::open(&hub, &role, &pattern, filter, start, link.until, link.kill).await {
        Ok(sub) => sub,
        Err(e) => {
            let _ = out.send(error(Some(&pattern), &e)).await;
            return;
        }
    };
    if out.send(text_msg("subscribed", &pattern)).await.is_err() {
        return;
    }
    loop {
        match sub.next().await {
            Ok((event, _)) => {
                if out.send(Message::Text(event.ws_message(&sub.topic.pattern_json).into())).await.is_err() {
                    return;
                }
            }
            Err(End::Dropped) => return,
            Err(End::Reached(until)) => {
                let done = serde_json::json!({"type": "unsubscribed", "stream": pattern, "until": until});
                if out.send(text(done)).await.is_ok() {
                    let _ = link.reached.send((pattern, tokio::task::id()));
                }
                return;
            }
            Err(End::Error(e)) => {
                let _ = out.send(error(Some(&pattern), &e)).await;
                return;
            }
        }
    }
}
