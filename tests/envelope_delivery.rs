//! The event envelope (`type`, `key`, `headers`) through live delivery:
//! what a LISTENer receives for events with and without one, a private
//! stream's notifications (the type, never the key, headers or data), and
//! an envelope too large for a notification (data goes first, then the
//! headers, each time marked `"truncated": true`). Webhook bodies are in
//! tests/webhook_delivery.rs, the gateway's frames in
//! tests/gateway_envelope.rs.
#![cfg(feature = "integration")]

mod common;

use std::time::Duration;

use common::{wait_for_horizon, Listener, TestDb};
use postgres::Client;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(20);

/// Publish `data` to `stream` with an envelope (any part of it null).
fn publish_with(
    c: &mut Client,
    stream: &str,
    data: &str,
    type_: Option<&str>,
    key: Option<&str>,
    headers: Option<&str>,
) -> i64 {
    c.query_one(
        "SELECT streams.publish($1, $2::text::jsonb, type => $3, key => $4, headers => $5::text::jsonb)",
        &[&stream, &data, &type_, &key, &headers],
    )
    .expect("publish with an envelope")
    .get(0)
}

/// The names of a payload's fields, in the order they were written.
fn field_names(raw: &str) -> Vec<String> {
    let value: serde_json::Map<String, Value> = serde_json::from_str(raw).unwrap();
    // serde_json keeps insertion order only with preserve_order; read the
    // names from the text instead: each top-level `"name":` in order.
    let mut names = Vec::new();
    let mut depth = 0;
    let mut chars = raw.char_indices().peekable();
    while let Some((i, ch)) = chars.next() {
        match ch {
            '{' | '[' => depth += 1,
            '}' | ']' => depth -= 1,
            '"' => {
                let start = i + 1;
                let mut end = start;
                let mut escaped = false;
                for (j, c) in chars.by_ref() {
                    match (escaped, c) {
                        (true, _) => escaped = false,
                        (false, '\\') => escaped = true,
                        (false, '"') => {
                            end = j;
                            break;
                        }
                        _ => {}
                    }
                }
                if depth == 1 && chars.peek().map(|(_, c)| *c) == Some(':') {
                    names.push(raw[start..end].to_owned());
                }
            }
            _ => {}
        }
    }
    assert_eq!(names.len(), value.len(), "every field of {raw} found");
    names
}

/// An event with an envelope arrives with it, after `prev` and before
/// `data`, exactly as published; one without an envelope arrives without
/// those fields (the payload as before envelopes existed).
#[test]
fn a_notification_carries_the_envelope_only_when_set() {
    let db = TestDb::new();
    let mut c = db.connect();
    let mut listener = Listener::new(&db, &["orders"]);
    let plain = publish_with(&mut c, "orders", r#"{"n": 1}"#, None, None, None);
    let full = publish_with(
        &mut c,
        "orders",
        r#"{"n": 2, "amount": 49.00}"#,
        Some("order.created"),
        Some("ord_\"123\""),
        Some(r#"{"traceparent": "00-4bf9-00f0-01", "source": "checkout, web"}"#),
    );
    let typed = publish_with(&mut c, "orders", r#"{"n": 3}"#, Some("order.paid"), None, None);
    let mut got = Vec::new();
    while got.len() < 3 {
        let (_, raw) = listener.next(WAIT).expect("three notifications");
        got.push(raw);
    }
    let time = |raw: &str| common::json(raw)["time"].as_str().unwrap().to_owned();
    let tx = |raw: &str| common::json(raw)["tx"].as_i64().unwrap();

    assert_eq!(field_names(&got[0]), ["position", "stream", "time", "tx", "prev", "data"]);
    assert_eq!(
        got[0],
        format!(
            r#"{{"position":{plain},"stream":"orders","time":"{}","tx":{},"prev":0,"data":{{"n":1}}}}"#,
            time(&got[0]),
            tx(&got[0])
        ),
        "an event without an envelope: the payload as before"
    );
    assert_eq!(field_names(&got[1]), ["position", "stream", "time", "tx", "prev", "type", "key", "headers", "data"]);
    assert_eq!(
        got[1],
        format!(
            r#"{{"position":{full},"stream":"orders","time":"{}","tx":{},"prev":{plain},"type":"order.created","key":"ord_\"123\"","headers":{{"source":"checkout, web","traceparent":"00-4bf9-00f0-01"}},"data":{{"n":2,"amount":49.00}}}}"#,
            time(&got[1]),
            tx(&got[1])
        )
    );
    assert_eq!(field_names(&got[2]), ["position", "stream", "time", "tx", "prev", "type", "data"]);
    let third = common::json(&got[2]);
    assert_eq!((third["position"].as_i64(), &third["type"]), (Some(typed), &json!("order.paid")));

    // What streams.get returns is what the notification carried.
    wait_for_horizon(&mut c, typed);
    let row = c.query_one("SELECT type, key, headers::text FROM streams.get($1)", &[&full]).unwrap();
    let notified = common::json(&got[1]);
    assert_eq!(notified["type"], row.get::<_, String>(0));
    assert_eq!(notified["key"], row.get::<_, String>(1));
    assert_eq!(notified["headers"], common::json(&row.get::<_, String>(2)));
}

/// A private stream's notification carries the event's type (a listener
/// may tell what happened), never its key, headers or data.
#[test]
fn a_private_streams_notification_has_its_type_but_no_key_headers_or_data() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute("SELECT streams.set_private('vault')").unwrap();
    let mut listener = Listener::new(&db, &["vault"]);
    let position = publish_with(
        &mut c,
        "vault",
        r#"{"secret": "s3cr3t"}"#,
        Some("vault.opened"),
        Some("customer-42"),
        Some(r#"{"authorization": "Bearer xyz"}"#),
    );
    let (_, raw) = listener.next(WAIT).expect("the private event's notification");
    assert_eq!(field_names(&raw), ["position", "stream", "time", "tx", "prev", "type", "private"]);
    let payload = common::json(&raw);
    assert_eq!(payload["position"].as_i64(), Some(position));
    assert_eq!(payload["type"], "vault.opened");
    assert_eq!(payload["private"], true);
    for secret in ["customer-42", "Bearer", "s3cr3t", "authorization"] {
        assert!(!raw.contains(secret), "{secret:?} in a private stream's payload: {raw}");
    }
}

/// Too large for a notification: the data is dropped first and the
/// envelope kept; when the headers alone do not fit either, they go too.
/// Both payloads say `"truncated": true`, and streams.get has it all.
#[test]
fn a_too_large_payload_drops_data_then_headers() {
    let db = TestDb::new();
    let mut c = db.connect();
    let mut listener = Listener::new(&db, &["big"]);
    let big_data = format!(r#"{{"blob": "{}"}}"#, "x".repeat(9000));
    let small_headers = r#"{"traceparent": "00-1"}"#;
    // 60 headers of 100 quotes: within the headers' limit (64, 8 KB
    // stored), twice that as JSON text (each quote escaped), past what a
    // notification carries.
    let big_headers = serde_json::to_string(
        &(0..60)
            .map(|i| (format!("h{i:02}"), Value::from("\"".repeat(100))))
            .collect::<serde_json::Map<String, Value>>(),
    )
    .unwrap();
    let without_data = publish_with(&mut c, "big", &big_data, Some("t.big"), Some("k1"), Some(small_headers));
    let without_headers =
        publish_with(&mut c, "big", r#"{"small": true}"#, Some("t.big"), Some("k2"), Some(&big_headers));
    let mut got = Vec::new();
    while got.len() < 2 {
        got.push(listener.next(WAIT).expect("two notifications").1);
    }
    assert!(got.iter().all(|raw| raw.len() < 8000), "every payload fits");

    assert_eq!(
        field_names(&got[0]),
        ["position", "stream", "time", "tx", "prev", "type", "key", "headers", "truncated"]
    );
    let first = common::json(&got[0]);
    assert_eq!(first["position"].as_i64(), Some(without_data));
    assert_eq!((&first["type"], &first["key"]), (&json!("t.big"), &json!("k1")));
    assert_eq!(first["headers"], json!({"traceparent": "00-1"}));
    assert_eq!(first["truncated"], true);

    assert_eq!(field_names(&got[1]), ["position", "stream", "time", "tx", "prev", "type", "key", "truncated"]);
    let second = common::json(&got[1]);
    assert_eq!(second["position"].as_i64(), Some(without_headers));
    assert_eq!((&second["type"], &second["key"]), (&json!("t.big"), &json!("k2")));
    assert_eq!(second["truncated"], true, "its data would fit alone, but the headers do not: both go");

    wait_for_horizon(&mut c, without_headers);
    let row = c.query_one("SELECT data::text, headers::text FROM streams.get($1)", &[&without_headers]).unwrap();
    assert_eq!(common::json(&row.get::<_, String>(0)), json!({"small": true}));
    assert_eq!(common::json(&row.get::<_, String>(1)), common::json(&big_headers));
}
