//! How the gateway's SSE frames name their events, and where its event
//! endpoints start (the gateway runs as tests/gateway.rs describes):
//! `frames=message` leaves out the `event:` line, so that a browser's
//! `EventSource.onmessage` receives every stream of a pattern (`id:` and
//! `data:` as in the named frames); any other value is 400 with 22023.
//! `after` goes with `since` (the later bound wins), on SSE and JSON pages,
//! and `Last-Event-ID` still wins over both.
#![cfg(feature = "integration")]

mod common;

use std::time::{Duration, Instant};

use common::gateway::{token, Setup, Sse, SseEvent};
use common::{publish, wait_for_horizon};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(20);

/// The next `count` events of `sse`, each within [`WAIT`].
fn read(sse: &mut Sse, count: usize) -> Vec<SseEvent> {
    (0..count).map(|i| sse.next(WAIT).unwrap_or_else(|e| panic!("event {i} of {count}: {e:?}"))).collect()
}

fn positions(events: &[SseEvent]) -> Vec<i64> {
    events.iter().map(|e| e.data["position"].as_i64().unwrap()).collect()
}

#[test]
fn message_frames_carry_every_stream_of_a_pattern_without_an_event_line() {
    let s = Setup::new(&[]);
    let mut owner = s.db.connect();
    let t = token(&s.reader.name);
    let replayed = [publish(&mut owner, "pay.a", r#"{"n": 1}"#), publish(&mut owner, "pay.b", r#"{"n": 2}"#)];
    wait_for_horizon(&mut owner, replayed[1]);

    let mut named = s.gateway.sse("/v1/streams/pay.*/events", Some(&t), Some(0));
    let mut message = s.gateway.sse("/v1/streams/pay.*/events?frames=message", Some(&t), Some(0));
    assert_eq!((named.status, message.status), (200, 200));
    let mut named_events = read(&mut named, 2);
    let mut message_events = read(&mut message, 2);
    // Then live ones, of both streams.
    let live = [publish(&mut owner, "pay.b", r#"{"n": 3}"#), publish(&mut owner, "pay.a", r#"{"n": 4}"#)];
    named_events.extend(read(&mut named, 2));
    message_events.extend(read(&mut message, 2));

    let all: Vec<i64> = replayed.iter().chain(&live).copied().collect();
    assert_eq!(positions(&message_events), all);
    assert_eq!(positions(&named_events), all);
    for (m, n) in message_events.iter().zip(&named_events) {
        assert_eq!(m.event, None, "no event: line, so onmessage gets it: {m:?}");
        assert_eq!(n.event.as_deref(), n.data["stream"].as_str(), "named frames keep event: {n:?}");
        assert_eq!(m.id, m.data["position"].as_i64(), "id: is the position");
        assert_eq!((m.id, &m.raw), (n.id, &n.raw), "id: and data: as in the named frames");
    }
}

#[test]
fn frames_other_than_message_are_refused_with_22023() {
    let s = Setup::new(&[]);
    let auth = format!("Bearer {}", token(&s.reader.name));
    let page = [("Authorization", auth.as_str())];
    let sse = [("Authorization", auth.as_str()), ("Accept", "text/event-stream")];
    for frames in ["named", "", "MESSAGE", "message,named", "data"] {
        for headers in [&page[..], &sse[..]] {
            let path = format!("/v1/streams/pay.*/events?frames={frames}");
            let (status, body) = s.gateway.request("GET", &path, headers, "");
            assert_eq!(status, 400, "{path} {headers:?}: {body}");
            let error: Value = serde_json::from_str(&body).unwrap();
            assert_eq!(error["sqlstate"], "22023", "{path}: {error}");
        }
    }
    // A page takes it too (it has no frames to change).
    let (status, body) = s.gateway.request("GET", "/v1/streams/pay.*/events?frames=message", &page, "");
    assert_eq!((status, body.as_str()), (200, "[]"));
}

/// `after` with `since`: only events past both. A page loop from a time
/// (since => t, after => the last position seen) reads each event once,
/// and an SSE stream started that way begins at the later bound;
/// Last-Event-ID wins over both.
#[test]
fn after_goes_with_since_and_the_later_bound_wins() {
    let s = Setup::new(&[]);
    let mut owner = s.db.connect();
    let auth = format!("Bearer {}", token(&s.reader.name));
    let h = [("Authorization", auth.as_str())];
    let early = publish(&mut owner, "pay.a", r#"{"early": true}"#);
    wait_for_horizon(&mut owner, early);
    let since: String = owner
        .query_one("SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')", &[])
        .unwrap()
        .get(0);
    // Committed after `since`: one transaction each.
    let late: Vec<i64> = (0..7).map(|i| publish(&mut owner, "pay.a", &format!(r#"{{"i": {i}}}"#))).collect();
    wait_for_horizon(&mut owner, *late.last().unwrap());

    let page = |after: Option<i64>, max: usize| -> Vec<i64> {
        let after = after.map_or(String::new(), |a| format!("&after={a}"));
        let path = format!("/v1/streams/pay.*/events?since={since}{after}&max_events={max}");
        let (status, body) = s.gateway.request("GET", &path, &h, "");
        assert_eq!(status, 200, "{path}: {body}");
        let events: Vec<Value> = serde_json::from_str(&body).unwrap();
        events.iter().map(|e| e["position"].as_i64().unwrap()).collect()
    };
    let mut seen = Vec::new();
    let mut last = None;
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(Instant::now() < deadline, "the page loop did not end: {seen:?}");
        let got = page(last, 2);
        if got.is_empty() {
            break;
        }
        last = got.last().copied();
        seen.extend(got);
    }
    assert_eq!(seen, late, "each event committed since the time, once, in order");
    // The earlier bound loses either way.
    assert_eq!(page(Some(0), 100), late, "since is later than after => 0");
    assert_eq!(page(Some(late[4]), 100), late[5..], "after is later than since");

    let path = format!("/v1/streams/pay.*/events?since={since}&after={}", late[2]);
    let mut sse = s.gateway.sse(&path, Some(&token(&s.reader.name)), None);
    assert_eq!(sse.status, 200);
    assert_eq!(positions(&read(&mut sse, 4)), late[3..]);
    let mut resumed = s.gateway.sse(&path, Some(&token(&s.reader.name)), Some(late[5]));
    assert_eq!(positions(&read(&mut resumed, 1)), [late[6]], "Last-Event-ID wins over after and since");
    let early_too = s.gateway.sse(&path, Some(&token(&s.reader.name)), Some(0)).next(WAIT).unwrap();
    assert_eq!(early_too.data["position"], early, "Last-Event-ID wins over since too");
}
