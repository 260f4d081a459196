//! The gateway's filters and wildcards (issue 25): `types=a,b` and
//! `filter=<url-encoded JSON>` on the SSE and JSON routes and in a
//! WebSocket subscribe message, and `*` segments in the route's pattern.
//! Each reader gets exactly the matching events of the streams its role may
//! read; bad filters are 400s.
#![cfg(feature = "integration")]

mod common;

use std::time::Duration;

use common::gateway::*;
use common::*;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(20);

/// Publish (stream, type, data) as the owner; the positions, once final.
fn publish_typed(db: &TestDb, events: &[(&str, &str, &str)]) -> Vec<i64> {
    let mut owner = db.connect();
    let positions: Vec<i64> = events
        .iter()
        .map(|(stream, ty, data)| {
            owner
                .query_one("SELECT streams.publish($1, $2::text::jsonb, type => $3)", &[stream, data, ty])
                .unwrap()
                .get(0)
        })
        .collect();
    wait_for_horizon(&mut owner, *positions.last().unwrap());
    positions
}

const EVENTS: &[(&str, &str, &str)] = &[
    ("pay.eu.failed", "pay.failed", r#"{"currency":"EUR","n":0}"#),
    ("pay.eu.ok", "pay.ok", r#"{"currency":"EUR","n":1}"#),
    ("pay.us.failed", "pay.failed", r#"{"currency":"USD","n":2}"#),
    ("pay.us.x.failed", "pay.failed", r#"{"currency":"USD","n":3}"#),
    ("secret.eu.failed", "pay.failed", r#"{"currency":"EUR","n":4}"#),
];

fn positions_of(body: &str) -> Vec<i64> {
    json(body).as_array().expect("a JSON array").iter().map(|e| e["position"].as_i64().unwrap()).collect()
}

#[test]
fn json_pages_return_exactly_the_matching_events() {
    let s = Setup::new(&[]);
    let p = publish_typed(&s.db, EVENTS);
    let t = token(&s.reader.name);
    let auth = format!("Bearer {t}");
    let get = |path: &str| s.gateway.request("GET", path, &[("authorization", &auth)], "");
    let cases = [
        ("/v1/streams/pay.*/events?after=0&types=pay.failed", vec![p[0], p[2], p[3]]),
        (
            "/v1/streams/pay.*/events?after=0&types=pay.ok,pay.failed&filter=%7B%22currency%22%3A%22EUR%22%7D",
            vec![p[0], p[1]],
        ),
        ("/v1/streams/pay.*.failed/events?after=0", vec![p[0], p[2]]),
        ("/v1/streams/pay.*.failed/events?after=0&filter=%7B%22n%22%3A2%7D", vec![p[2]]),
        ("/v1/streams/pay.eu.failed/events?after=0&types=pay.ok", vec![]),
    ];
    for (path, expected) in cases {
        let (status, body) = get(path);
        assert_eq!(status, 200, "{path}: {body}");
        assert_eq!(positions_of(&body), expected, "{path}");
    }
    // The role reads pay.* only: a filter over everything is refused, not narrowed to a leak.
    let (status, _) = get("/v1/streams/*/events?after=0&filter=%7B%22n%22%3A4%7D");
    assert_eq!(status, 403);
    let (status, _) = get("/v1/streams/*.eu.failed/events?after=0");
    assert_eq!(status, 403);
    for bad in [
        "/v1/streams/pay.*/events?filter=%5B1%5D",
        "/v1/streams/pay.*/events?filter=%7Bnot%20json",
        "/v1/streams/pay.*/events?types=a,,b",
        "/v1/streams/pay.*x/events",
    ] {
        let (status, body) = get(bad);
        assert_eq!(status, 400, "{bad}: {body}");
    }
}

#[test]
fn sse_and_websocket_deliver_exactly_the_matching_events_live() {
    let s = Setup::new(&[]);
    let t = token(&s.reader.name);
    let first = publish_typed(&s.db, &EVENTS[..2]);
    let mut sse =
        s.gateway.sse("/v1/streams/pay.*.failed/events?filter=%7B%22currency%22%3A%22USD%22%7D", Some(&t), Some(0));
    let mut unfiltered = s.gateway.sse("/v1/streams/pay.eu.failed/events", Some(&t), Some(0));
    let mut typed = s.gateway.sse("/v1/streams/pay.eu.failed/events?types=pay.retried", Some(&t), Some(0));
    let mut ws = s.gateway.ws(&t);
    ws.send(
        json!({"type": "subscribe", "stream": "pay.*", "after": 0, "types": ["pay.ok"], "filter": {"currency": "EUR"}}),
    );
    ws.send(json!({"type": "subscribe", "stream": "pay.us.*", "after": 0, "filter": [1]}));
    let later = publish_typed(
        &s.db,
        &[
            // On the typed reader's one stream, not of its type: a live
            // notification it must not forward.
            ("pay.eu.failed", "pay.failed", r#"{"currency":"EUR","n":4}"#),
            ("pay.us.failed", "pay.failed", r#"{"currency":"USD","n":5}"#),
            ("pay.eu.failed", "pay.retried", r#"{"currency":"EUR","n":6}"#),
            ("pay.eu.ok", "pay.ok", r#"{"currency":"EUR","n":7}"#),
            ("pay.us.x.failed", "pay.failed", r#"{"currency":"USD","n":8}"#),
            ("pay.us.failed", "pay.failed", r#"{"currency":"USD","n":9}"#),
        ],
    );
    let collect = |sse: &mut Sse, want: usize| {
        let mut got = Vec::new();
        while got.len() < want {
            match sse.next(WAIT) {
                Ok(event) => got.push(event.id.expect("an id")),
                Err(e) => panic!("after {got:?}: {e:?}"),
            }
        }
        got
    };
    // The unfiltered reader of the same stream proves the filtered ones had their events' turn.
    assert_eq!(collect(&mut unfiltered, 3), vec![first[0], later[0], later[2]]);
    assert_eq!(collect(&mut sse, 2), vec![later[1], later[5]]);
    assert_eq!(collect(&mut typed, 1), vec![later[2]]);
    let mut ws_events = Vec::new();
    let mut refused = None;
    wait_until("the WebSocket's events and its refusal", WAIT, || {
        if let Some(message) = ws.next(Duration::from_millis(200)) {
            match message["type"].as_str() {
                Some("event") => ws_events.push(message["position"].as_i64()),
                Some("error") => refused = Some(message.clone()),
                _ => {}
            }
        }
        ws_events.len() >= 2 && refused.is_some()
    });
    assert_eq!(ws_events, vec![Some(first[1]), Some(later[3])]);
    let refused = refused.unwrap();
    assert_eq!(refused["stream"], "pay.us.*", "{refused}");
    // Nothing else came: one more matching event arrives next, nothing in between.
    let last = publish_typed(&s.db, &[("pay.us.failed", "pay.failed", r#"{"currency":"USD","n":10}"#)]);
    assert_eq!(collect(&mut sse, 1), last);
}
