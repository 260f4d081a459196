//! The gateway's WebSocket protocol, against the real server (the gateway
//! runs as tests/gateway.rs describes): two patterns on one socket and one
//! of them unsubscribed, a socket that falls behind (closed with 4008, then
//! resubscribed), and topics bounded by --max-topics that close and UNLISTEN
//! their channel once their last client left.
#![cfg(feature = "integration")]

mod common;

use std::time::Duration;

use common::gateway::{assert_exactly_once_in_order, token, Setup, Writers};
use common::{publish, wait_for_horizon, wait_until};
use serde_json::{json, Value};

#[test]
fn websocket_subscribes_to_two_patterns_and_unsubscribes_one() {
    let s = Setup::new(&[]);
    let both =
        s.role("both", "SELECT streams.grant('read', 'a.*', '{r}'); SELECT streams.grant('read', 'b.*', '{r}');");
    let mut owner = s.db.connect();
    let early: Vec<i64> = (0..5)
        .flat_map(|i| [publish(&mut owner, "a.x", &format!("{{\"i\":{i}}}")), publish(&mut owner, "b.y", "{}")])
        .collect();
    wait_for_horizon(&mut owner, *early.last().unwrap());

    let mut ws = s.gateway.ws(&token(&both.name));
    ws.send(json!({"type": "subscribe", "stream": "a.*", "after": 0}));
    ws.send(json!({"type": "subscribe", "stream": "b.*", "after": 0}));
    let writers = Writers::start(&s.db, &["a.x", "b.y"]);
    let mut got: Vec<Value> = Vec::new();
    let count =
        |got: &[Value], sub: &str| got.iter().filter(|m| m["type"] == "event" && m["subscription"] == sub).count();
    while count(&got, "b.*") < 20 || count(&got, "a.*") < 20 {
        got.push(ws.next(Duration::from_secs(20)).expect("WebSocket messages keep coming"));
    }
    ws.send(json!({"type": "unsubscribe", "stream": "b.*"}));
    loop {
        let m = ws.next(Duration::from_secs(20)).expect("the unsubscribe is acknowledged");
        let acked = m["type"] == "unsubscribed";
        got.push(m);
        if acked {
            break;
        }
    }
    let acked_at = got.len();
    while count(&got[acked_at..], "a.*") < 20 {
        got.push(ws.next(Duration::from_secs(20)).expect("events of a.* keep coming"));
    }
    writers.stop();
    let committed_a = s.positions("a.");
    let last_a = *committed_a.last().unwrap();
    wait_until("the last a.* event arrived", Duration::from_secs(30), || {
        if let Some(m) = ws.next(Duration::from_millis(100)) {
            got.push(m);
        }
        got.iter().any(|m| m["position"] == last_a)
    });
    let positions = |sub: &str, msgs: &[Value]| -> Vec<i64> {
        msgs.iter()
            .filter(|m| m["type"] == "event" && m["subscription"] == sub)
            .map(|m| m["position"].as_i64().unwrap())
            .collect()
    };
    assert_eq!(got.iter().filter(|m| m["type"] == "subscribed").count(), 2, "{got:?}");
    assert!(got.iter().all(|m| m["type"] != "error"), "no errors: {got:?}");
    assert_exactly_once_in_order(&positions("a.*", &got), &committed_a, "a.* over WebSocket");
    let b = positions("b.*", &got);
    let committed_b = s.positions("b.");
    assert_exactly_once_in_order(&b, &committed_b[..b.len()], "b.* until unsubscribed");
    assert!(positions("b.*", &got[acked_at..]).is_empty(), "nothing of b.* after the unsubscribe was acknowledged");
    for m in got.iter().filter(|m| m["type"] == "event") {
        assert_eq!(m["stream"].as_str().unwrap()[..2], m["subscription"].as_str().unwrap()[..2]);
        assert!(m["data"].is_object() && m["time"].is_string() && m["tx"].is_i64(), "a whole event: {m}");
    }
}

#[test]
fn a_websocket_that_falls_behind_is_closed_with_4008_and_resubscribes() {
    // A queue of one event: a burst of 50 in one commit overflows it at once.
    let s = Setup::new(&["--client-buffer-events", "1"]);
    let mut ws = s.gateway.ws(&token(&s.reader.name));
    ws.send(json!({"type": "subscribe", "stream": "pay.*", "after": 0}));
    assert_eq!(ws.next(Duration::from_secs(10)).unwrap()["type"], "subscribed");
    let data: Vec<String> = (0..50).map(|i| format!(r#"{{"i": {i}}}"#)).collect();
    s.db.connect().execute("SELECT streams.publish_batch('pay.burst', $1::text[]::jsonb[])", &[&data]).unwrap();
    let mut got: Vec<i64> = Vec::new();
    let close = loop {
        match ws.socket.read() {
            Ok(tungstenite::Message::Text(t)) => {
                let m: Value = serde_json::from_str(t.as_str()).unwrap();
                assert_eq!(m["type"], "event", "{m}");
                got.push(m["position"].as_i64().unwrap());
            }
            Ok(tungstenite::Message::Close(frame)) => break frame,
            Ok(_) => {}
            Err(e) => panic!("the socket ended without a close frame: {e}"),
        }
    };
    let frame = close.expect("a close frame with a code");
    assert_eq!(u16::from(frame.code), 4008, "{frame:?}");
    assert!(frame.reason.contains("too slow"), "{frame:?}");
    assert!(got.len() < 50, "closed before the end of the burst");
    // Subscribing again after the last position received gets the rest, once.
    let mut again = s.gateway.ws(&token(&s.reader.name));
    again.send(json!({"type": "subscribe", "stream": "pay.*", "after": got.last().copied().unwrap_or(0)}));
    assert_eq!(again.next(Duration::from_secs(10)).unwrap()["type"], "subscribed");
    let committed = s.positions("pay.");
    while got.len() < committed.len() {
        let m = again.next(Duration::from_secs(20)).expect("the rest of the burst");
        got.push(m["position"].as_i64().unwrap());
    }
    assert_exactly_once_in_order(&got, &committed, "WebSocket closed with 4008, then resubscribed");
}

/// Subscriptions open topics up to --max-topics, then get 503; a topic
/// whose last client left closes and UNLISTENs its channel, which makes room.
#[test]
fn topics_are_bounded_and_closed_topics_unlisten() {
    let s = Setup::new(&[
        "--max-topics",
        "2",
        "--max-topics-per-role",
        "2",
        "--topic-idle-ms",
        "100",
        "--poll-interval-ms",
        "100",
    ]);
    let gw = &s.gateway;
    let mut ws = gw.ws(&token(&s.reader.name));
    let expect = |ws: &mut common::gateway::Ws, kind: &str| -> Value {
        let m = ws.next(Duration::from_secs(20)).unwrap_or_else(|| panic!("a {kind} message"));
        assert_eq!(m["type"], kind, "{m}");
        m
    };
    // Streams that do not exist: exact names are LISTENed on all the same.
    ws.send(json!({"type": "subscribe", "stream": "pay.nothing1"}));
    expect(&mut ws, "subscribed");
    ws.send(json!({"type": "subscribe", "stream": "pay.nothing2"}));
    expect(&mut ws, "subscribed");
    assert_eq!(gw.metric("litebase_streams_gateway_listen_channels"), 2.0);
    ws.send(json!({"type": "subscribe", "stream": "pay.nothing3"}));
    let m = expect(&mut ws, "error");
    assert_eq!(m["status"], 503, "{m}");
    assert!(m["error"].as_str().unwrap().contains("--max-topics"), "{m}");
    ws.send(json!({"type": "unsubscribe", "stream": "pay.nothing1"}));
    expect(&mut ws, "unsubscribed");
    wait_until("the idle topic closed and UNLISTENed its channel", Duration::from_secs(20), || {
        gw.metric("litebase_streams_gateway_topics") == 1.0
            && gw.metric("litebase_streams_gateway_listen_channels") == 1.0
    });
    ws.send(json!({"type": "subscribe", "stream": "pay.nothing3"}));
    expect(&mut ws, "subscribed");
    // Another role on the same stream shares the channel; it is UNLISTENed only when both topics closed.
    let other = s.role("other", "SELECT streams.grant('read', 'pay.*', '{r}');");
    ws.send(json!({"type": "unsubscribe", "stream": "pay.nothing2"}));
    expect(&mut ws, "unsubscribed");
    let mut ws2 = gw.ws(&token(&other.name));
    wait_until("the idle topic closed", Duration::from_secs(20), || {
        gw.metric("litebase_streams_gateway_topics") == 1.0
    });
    ws2.send(json!({"type": "subscribe", "stream": "pay.nothing3"}));
    expect(&mut ws2, "subscribed");
    assert_eq!(
        (gw.metric("litebase_streams_gateway_topics"), gw.metric("litebase_streams_gateway_listen_channels")),
        (2.0, 1.0)
    );
    ws.send(json!({"type": "unsubscribe", "stream": "pay.nothing3"}));
    expect(&mut ws, "unsubscribed");
    wait_until("one of the two topics on the channel closed", Duration::from_secs(20), || {
        gw.metric("litebase_streams_gateway_topics") == 1.0
    });
    assert_eq!(gw.metric("litebase_streams_gateway_listen_channels"), 1.0, "the other topic still uses the channel");
    // It still works: an event on it arrives.
    let position = publish(&mut s.db.connect(), "pay.nothing3", r#"{"late": true}"#);
    let m = expect(&mut ws2, "event");
    assert_eq!(m["position"], position);
}
