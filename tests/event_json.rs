//! One JSON form of an event, byte for byte on every path: `streams.to_json`
//! of a replay row, the LISTEN notification without `prev`, the gateway's
//! JSON pages and SSE `data:` (replayed and live), and a webhook's request
//! body without `prev`. Events with and without an envelope, numbers as
//! stored (49.00), unicode and escapes in strings. The gateway runs as
//! tests/gateway.rs describes, the webhook receiver as tests/webhooks.rs'.
#![cfg(feature = "integration")]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::gateway::{token, Setup, Sse};
use common::webhooks::{create_webhook, local_endpoints, Behaviour, Receiver};
use common::{wait_for_horizon, Listener};
use postgres::Client;
use serde_json::value::RawValue;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(20);

/// An event to publish: (stream, data, type, key, headers).
type Published = (&'static str, &'static str, Option<&'static str>, Option<&'static str>, Option<&'static str>);

const EVENTS: [Published; 4] = [
    ("pay.a", r#"{"amount": 49.00, "note": "é ☃ 😀 \"q\" \\ a, b: c\n"}"#, None, None, None),
    (
        "pay.b",
        r#"{"amount": 49.00, "n": [1, 2.50, 1e2, 12345678901234567890.000]}"#,
        Some("order.paid"),
        Some("ord_ü\"1\""),
        Some(r#"{"traceparent": "00-ab-01", "zz": "ü, b"}"#),
    ),
    ("pay.a", r#"{"only": "a type"}"#, Some("t"), None, None),
    ("pay.b", r#"{}"#, None, Some("k"), None),
];

fn publish(c: &mut Client, (stream, data, type_, key, headers): Published) -> i64 {
    c.query_one(
        "SELECT streams.publish($1, $2::text::jsonb, type => $3, key => $4, headers => $5::text::jsonb)",
        &[&stream, &data, &type_, &key, &headers],
    )
    .unwrap()
    .get(0)
}

/// `text` without its `,"prev":N` (the first: it follows `tx`, before
/// anything a publisher wrote).
fn without_prev(text: &str) -> String {
    let at = text.find(r#","prev":"#).unwrap_or_else(|| panic!("no prev: {text}"));
    let digits = text[at + 8..].find(|c: char| !c.is_ascii_digit()).unwrap();
    format!("{}{}", &text[..at], &text[at + 8 + digits..])
}

fn position_of(text: &str) -> i64 {
    serde_json::from_str::<Value>(text).unwrap()["position"].as_i64().unwrap()
}

fn sse_texts(sse: &mut Sse, count: usize) -> BTreeMap<i64, String> {
    (0..count)
        .map(|i| {
            let e = sse.next(WAIT).unwrap_or_else(|e| panic!("SSE event {i}: {e:?}"));
            (e.id.unwrap(), e.raw)
        })
        .collect()
}

#[test]
fn every_path_hands_out_the_same_bytes() {
    let s = Setup::new(&[]);
    let mut owner = s.db.connect();
    let t = token(&s.reader.name);
    let _settings = local_endpoints();
    let receiver = Receiver::answering(&[("/hook", Behaviour::default())]);
    create_webhook(&mut owner, "canonical", "pay.*", &receiver.url("/hook"));
    let mut listener = Listener::new(&s.db, &["pay.a", "pay.b"]);
    let mut live = s.gateway.sse("/v1/streams/pay.*/events?after=0", Some(&t), None);
    assert_eq!(live.status, 200);

    let positions: Vec<i64> = EVENTS.iter().map(|e| publish(&mut owner, *e)).collect();
    wait_for_horizon(&mut owner, *positions.last().unwrap());

    // streams.to_json of the replay rows: the reference.
    let canonical: BTreeMap<i64, String> = owner
        .query("SELECT e.position, streams.to_json(e)::text FROM streams.replay(after => 0) e", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(canonical.keys().copied().collect::<Vec<_>>(), positions);
    let (tx, time): (i64, String) = {
        let r = owner
            .query_one(
                "SELECT tx::text::bigint, to_char(time AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')
                 FROM streams.get($1)",
                &[&positions[1]],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(
        canonical[&positions[1]],
        format!(
            r#"{{"position":{},"stream":"pay.b","time":"{time}","tx":{tx},"type":"order.paid","key":"ord_ü\"1\"","headers":{{"zz":"ü, b","traceparent":"00-ab-01"}},"data":{{"n":[1,2.50,100,12345678901234567890.000],"amount":49.00}}}}"#,
            positions[1]
        ),
        "the canonical form: head, envelope when set, data as jsonb keeps it"
    );
    assert!(canonical[&positions[0]].ends_with(r#","data":{"note":"é ☃ 😀 \"q\" \\ a, b: c\n","amount":49.00}}"#));
    // The same row read through get, and the function's answer for a null row.
    let got: String =
        owner.query_one("SELECT streams.to_json(streams.get($1))::text", &[&positions[2]]).unwrap().get(0);
    assert_eq!(got, canonical[&positions[2]]);
    let none: Option<String> =
        owner.query_one("SELECT streams.to_json(NULL::streams.events)::text", &[]).unwrap().get(0);
    assert_eq!(none, None);

    // LISTEN: the notification's text without prev.
    let notified: BTreeMap<i64, String> = (0..EVENTS.len())
        .map(|_| {
            let (_, payload) = listener.next(WAIT).expect("a notification");
            (position_of(&payload), without_prev(&payload))
        })
        .collect();
    assert_eq!(notified, canonical, "notifications without prev");

    // The gateway: a JSON page's elements, SSE data live and replayed.
    let auth = format!("Bearer {t}");
    let (status, body) = s.gateway.request("GET", "/v1/streams/pay.*/events?after=0", &[("Authorization", &auth)], "");
    assert_eq!(status, 200, "{body}");
    let page: BTreeMap<i64, String> = serde_json::from_str::<Vec<&RawValue>>(&body)
        .unwrap()
        .iter()
        .map(|raw| (position_of(raw.get()), raw.get().to_owned()))
        .collect();
    assert_eq!(page, canonical, "the gateway's JSON page");
    assert_eq!(sse_texts(&mut live, EVENTS.len()), canonical, "SSE data, live");
    let mut replayed = s.gateway.sse("/v1/streams/pay.*/events?after=0&frames=message", Some(&t), None);
    assert_eq!(sse_texts(&mut replayed, EVENTS.len()), canonical, "SSE data, replayed");

    // A webhook's body (one event per request): without prev.
    receiver.wait_for_delivered("/hook", EVENTS.len(), Duration::from_secs(30));
    let hooked: BTreeMap<i64, String> = receiver
        .requests("/hook")
        .iter()
        .filter(|r| r.succeeded())
        .map(|r| {
            let body = r.raw_body.as_deref().expect("a body");
            (position_of(body), without_prev(body))
        })
        .collect();
    assert_eq!(hooked, canonical, "webhook bodies without prev");
}
