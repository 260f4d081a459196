//! The event envelope through the gateway (which runs as tests/gateway.rs
//! describes): SSE and WebSocket frames and JSON pages carry `type`, `key`
//! and `headers` when an event has them (from a replay and from a live
//! notification alike), and publishing over HTTP takes `Event-Type`,
//! `Event-Key` and `Idempotency-Key` request headers.
#![cfg(feature = "integration")]

mod common;

use std::time::Duration;

use common::gateway::{token, Setup};
use common::{wait_for_horizon, wait_until};
use postgres::Client;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(20);

const HEADERS: &str = r#"{"traceparent": "00-4bf9-01", "source": "a, b"}"#;

/// The JSON of an event with the envelope of [`publish_typed`], as the gateway encodes it.
fn typed_json(position: i64, time: &str, tx: i64, n: i64) -> String {
    format!(
        r#"{{"position":{position},"stream":"pay.a","time":"{time}","tx":{tx},"type":"payment.captured","key":"ord_\"1\"","headers":{{"source":"a, b","traceparent":"00-4bf9-01"}},"data":{{"n":{n}}}}}"#
    )
}

fn publish_typed(c: &mut Client, n: i64) -> i64 {
    c.query_one(
        "SELECT streams.publish('pay.a', jsonb_build_object('n', $1::bigint), type => 'payment.captured',
                                key => 'ord_\"1\"', headers => $2::text::jsonb)",
        &[&n, &HEADERS],
    )
    .unwrap()
    .get(0)
}

fn publish_plain(c: &mut Client, n: i64) -> i64 {
    c.query_one("SELECT streams.publish('pay.a', jsonb_build_object('n', $1::bigint))", &[&n]).unwrap().get(0)
}

/// Checks `event` (a frame's JSON) against the event of that position:
/// the exact encoding for typed ones, no envelope fields for plain ones.
fn assert_envelope(event: &Value, typed: &[i64]) {
    let position = event["position"].as_i64().unwrap();
    let (time, tx, n) =
        (event["time"].as_str().unwrap(), event["tx"].as_i64().unwrap(), event["data"]["n"].as_i64().unwrap());
    if typed.contains(&position) {
        let expected: Value = serde_json::from_str(&typed_json(position, time, tx, n)).unwrap();
        assert_eq!(event, &expected, "{position}: the whole envelope");
    } else {
        for field in ["type", "key", "headers"] {
            assert!(event.get(field).is_none(), "{position} has no envelope, yet {field}: {event}");
        }
    }
}

#[test]
fn sse_websocket_and_pages_carry_the_envelope() {
    let s = Setup::new(&[]);
    let mut owner = s.db.connect();
    let t = token(&s.reader.name);
    let auth = format!("Bearer {t}");
    let mut typed = vec![publish_typed(&mut owner, 1)];
    let plain = publish_plain(&mut owner, 2);
    wait_for_horizon(&mut owner, plain);

    // A JSON page: the typed event exactly as encoded, the plain one without.
    let (status, body) = s.gateway.request("GET", "/v1/streams/pay.a/events?after=0", &[("Authorization", &auth)], "");
    assert_eq!(status, 200, "{body}");
    let page: Vec<Value> = serde_json::from_str(&body).unwrap();
    assert_eq!(page.len(), 2, "{body}");
    let first = &page[0];
    let exact = typed_json(typed[0], first["time"].as_str().unwrap(), first["tx"].as_i64().unwrap(), 1);
    assert!(body.starts_with(&format!("[{exact},")), "the page's bytes: {body}");
    assert_envelope(&page[1], &typed);

    // SSE and WebSocket from the start (replays), then live events.
    let mut sse = s.gateway.sse("/v1/streams/pay.a/events", Some(&t), Some(0));
    let mut ws = s.gateway.ws(&t);
    ws.send(json!({"type": "subscribe", "stream": "pay.a", "after": 0}));
    let mut sse_events = Vec::new();
    let mut ws_events = Vec::new();
    let mut read_until = |count: usize, sse_events: &mut Vec<Value>, ws_events: &mut Vec<Value>| {
        wait_until(&format!("{count} events over SSE and WebSocket"), WAIT, || {
            if sse_events.len() < count {
                let event = sse.next(Duration::from_millis(50));
                if let Ok(event) = event {
                    sse_events.push(event.data);
                }
            }
            if ws_events.len() < count {
                if let Some(m) = ws.next(Duration::from_millis(50)) {
                    if m["type"] == "event" {
                        ws_events.push(m);
                    }
                }
            }
            sse_events.len() >= count && ws_events.len() >= count
        });
    };
    read_until(2, &mut sse_events, &mut ws_events);
    // Live: a notification each, forwarded or replayed.
    typed.push(publish_typed(&mut owner, 3));
    let plain_live = publish_plain(&mut owner, 4);
    typed.push(publish_typed(&mut owner, 5));
    read_until(5, &mut sse_events, &mut ws_events);

    let positions: Vec<i64> = sse_events.iter().map(|e| e["position"].as_i64().unwrap()).collect();
    assert_eq!(positions, [typed[0], plain, typed[1], plain_live, typed[2]]);
    for (event, page_event) in sse_events.iter().zip(&page) {
        assert_eq!(event, page_event, "SSE and the page encode an event alike");
    }
    for event in &sse_events {
        assert_envelope(event, &typed);
    }
    // A WebSocket message is the event after "type": "event" and its
    // subscription, the envelope's type named event_type.
    for message in &ws_events {
        assert_eq!((&message["type"], &message["subscription"]), (&json!("event"), &json!("pay.a")), "{message}");
        let position = message["position"].as_i64().unwrap();
        let mut expected = sse_events.iter().find(|e| e["position"] == position).unwrap().clone();
        let fields = expected.as_object_mut().unwrap();
        if let Some(type_) = fields.remove("type") {
            fields.insert("event_type".into(), type_);
        }
        fields.insert("type".into(), json!("event"));
        fields.insert("subscription".into(), json!("pay.a"));
        assert_eq!(message, &expected, "{position}: the WebSocket message carries the SSE frame's event");
        assert_eq!(message.get("event_type").is_some(), typed.contains(&position), "{message}");
    }
}

/// POST with an Idempotency-Key: 201 with the position the first time, 200
/// with the same position (and nothing written) for a repeat with the same
/// body, 422 (SQLSTATE 23505) for the same key with another body. The
/// Event-Type and Event-Key request headers become the event's type and
/// key; values the database refuses are a 400 (22023).
#[test]
fn publish_with_an_idempotency_key_answers_201_then_200_then_422() {
    let s = Setup::publishing(&[]);
    let auth = format!("Bearer {}", token(&s.reader.name));
    let post = |headers: &[(&str, &str)], body: &str| {
        let mut all = vec![("Authorization", auth.as_str())];
        all.extend_from_slice(headers);
        let (status, body) = s.gateway.request("POST", "/v1/streams/pay.a/events", &all, body);
        (status, serde_json::from_str::<Value>(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}")))
    };
    let envelope = [("Idempotency-Key", "charge-42"), ("Event-Type", "payment.captured"), ("Event-Key", "ord_1")];

    let (status, first) = post(&envelope, r#"{"amount": 49.00}"#);
    assert_eq!(status, 201, "{first}");
    let position = first["position"].as_i64().unwrap();
    assert_eq!(first["duplicate"], false);

    let (status, repeat) = post(&envelope, r#"{"amount": 49.00}"#);
    assert_eq!(status, 200, "a repeat: {repeat}");
    assert_eq!((repeat["position"].as_i64(), &repeat["duplicate"]), (Some(position), &json!(true)));

    let (status, other) = post(&envelope, r#"{"amount": 50.00}"#);
    assert_eq!(status, 422, "the same key with another body: {other}");
    assert_eq!(other["sqlstate"], "23505");
    assert!(other["error"].as_str().is_some_and(|e| !e.is_empty()), "{other}");

    // Without an idempotency key, the envelope headers alone: 201 as before.
    let (status, typed) = post(&[("Event-Type", "payment.refunded")], r#"{"amount": 1}"#);
    assert_eq!(status, 201, "{typed}");
    assert!(typed.get("duplicate").is_none(), "{typed}");

    let long_key = "k".repeat(1025);
    for (header, value) in [("Event-Type", ""), ("Event-Key", long_key.as_str()), ("Idempotency-Key", "")] {
        let (status, refused) = post(&[(header, value)], "{}");
        assert_eq!((status, &refused["sqlstate"]), (400, &json!("22023")), "{header}: {refused}");
    }

    let mut owner = s.db.connect();
    wait_for_horizon(&mut owner, typed["position"].as_i64().unwrap());
    let rows =
        owner.query("SELECT position, type, key, data::text FROM streams.events ORDER BY position", &[]).unwrap();
    let stored: Vec<(i64, Option<String>, Option<String>, String)> =
        rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))).collect();
    assert_eq!(
        stored,
        [
            (position, Some("payment.captured".into()), Some("ord_1".into()), r#"{"amount": 49.00}"#.into()),
            (typed["position"].as_i64().unwrap(), Some("payment.refunded".into()), None, r#"{"amount": 1}"#.into()),
        ],
        "one event per idempotency key, nothing of the refused requests"
    );
}
