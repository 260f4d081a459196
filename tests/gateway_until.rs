//! `until` on the gateway's event endpoints, against the real server (the
//! gateway runs as tests/gateway.rs describes): the catch-up up to and
//! including a position, then the end of the response (SSE: the body ends
//! after `id: until`, and a reconnect from there is 204; WebSocket:
//! `unsubscribed` with `until`, then a normal close), also when `until` is
//! above the horizon at connect time and the events come later; the JSON
//! page bounded the same way; bad values refused with 22023.
#![cfg(feature = "integration")]

mod common;

use std::time::Duration;

use common::gateway::{token, Setup, SseEnd};
use common::{publish, wait_for_horizon};
use serde_json::{json, Value};

/// Positions of the events of `stream_prefix` at or below `until`, as the owner sees them.
fn expected(s: &Setup, stream_prefix: &str, until: i64) -> Vec<i64> {
    s.positions(stream_prefix).into_iter().filter(|p| *p <= until).collect()
}

fn sse_positions(events: &[common::gateway::SseEvent]) -> Vec<i64> {
    events
        .iter()
        .map(|e| {
            assert_eq!(e.id, e.data["position"].as_i64(), "id: is the position");
            e.data["position"].as_i64().unwrap()
        })
        .collect()
}

#[test]
fn sse_delivers_the_catch_up_up_to_until_and_ends() {
    let s = Setup::new(&[]);
    let mut owner = s.db.connect();
    let published: Vec<i64> = (0..10)
        .flat_map(|i| [publish(&mut owner, "pay.a", &format!("{{\"i\":{i}}}")), publish(&mut owner, "pay.b", "{}")])
        .collect();
    wait_for_horizon(&mut owner, *published.last().unwrap());
    let reader = token(&s.reader.name);

    // `until` on an event of the pattern, and between two of them (pay.a
    // only: its last event up to `until` is below it).
    for (pattern, until) in [("pay.*", published[9]), ("pay.a", published[11])] {
        let path = format!("/v1/streams/{pattern}/events?after=0&until={until}");
        let mut sse = s.gateway.sse(&path, Some(&reader), None);
        assert_eq!(sse.status, 200);
        let events = sse.drain_until_closed(Duration::from_secs(30));
        let prefix = pattern.trim_end_matches('*');
        assert_eq!(sse_positions(&events), expected(&s, prefix, until), "{path}");

        // The body's last frame is `id: until`, so that an EventSource
        // reconnects from there: and gets 204, which makes it stop.
        let auth = format!("Bearer {reader}");
        let headers = [("Accept", "text/event-stream"), ("Authorization", auth.as_str())];
        let (status, body) = s.gateway.request("GET", &path, &headers, "");
        assert_eq!(status, 200);
        assert!(body.ends_with(&format!("\n\nid: {until}\n\n")), "{path}: {body:?}");
        let again = s.gateway.sse(&path, Some(&reader), Some(until));
        assert_eq!(again.status, 204, "{path} from Last-Event-ID {until}");

        // Resuming below `until` delivers the rest, then ends too.
        let resume_at = published[3];
        let mut rest = s.gateway.sse(&path, Some(&reader), Some(resume_at));
        let events = rest.drain_until_closed(Duration::from_secs(30));
        let want: Vec<i64> = expected(&s, prefix, until).into_iter().filter(|p| *p > resume_at).collect();
        assert_eq!(sse_positions(&events), want, "{path} from {resume_at}");
    }

    // The JSON page is bounded the same way.
    let until = published[6];
    let auth = format!("Bearer {reader}");
    let (status, body) =
        s.gateway.request("GET", &format!("/v1/streams/pay.*/events?until={until}"), &[("Authorization", &auth)], "");
    assert_eq!(status, 200, "{body}");
    let page: Vec<i64> =
        serde_json::from_str::<Vec<Value>>(&body).unwrap().iter().map(|e| e["position"].as_i64().unwrap()).collect();
    assert_eq!(page, expected(&s, "pay.", until));
}

#[test]
fn sse_with_until_above_the_horizon_delivers_events_as_they_come_then_ends() {
    // A short poll interval: the end that no event of the pattern announces
    // (the horizon passes `until` on another stream) is found by a page read
    // every poll interval.
    let s = Setup::new(&["--poll-interval-ms", "100"]);
    let mut owner = s.db.connect();
    let early = [publish(&mut owner, "pay.a", "{}"), publish(&mut owner, "pay.a", "{}")];
    wait_for_horizon(&mut owner, early[1]);
    let until = early[1] + 6;
    let reader = token(&s.reader.name);
    let mut sse = s.gateway.sse(&format!("/v1/streams/pay.a/events?after=0&until={until}"), Some(&reader), None);
    assert_eq!(sse.status, 200);
    let mut got = Vec::new();
    for _ in early {
        got.push(sse.next(Duration::from_secs(30)).expect("the catch-up"));
    }
    assert_eq!(sse_positions(&got), early);

    // Each event published now, up to `until`, arrives while the stream stays open.
    loop {
        let position = publish(&mut owner, "pay.a", "{}");
        if position > until - 3 {
            break;
        }
        let event = sse.next(Duration::from_secs(30)).expect("a live event below until");
        assert_eq!(event.data["position"].as_i64(), Some(position));
        got.push(event);
    }
    // The last events up to and past `until` are on a stream the pattern
    // does not take: the stream ends once the horizon passes `until`.
    let mut last = 0;
    while last <= until {
        last = publish(&mut owner, "pay.b", "{}");
    }
    wait_for_horizon(&mut owner, last);
    got.extend(sse.drain_until_closed(Duration::from_secs(30)));
    assert_eq!(sse_positions(&got), expected(&s, "pay.a", until));

    // And with the end announced by a live event of the pattern past `until`.
    let early = publish(&mut owner, "pay.a", "{}");
    wait_for_horizon(&mut owner, early);
    let until = early + 2;
    let mut sse =
        s.gateway.sse(&format!("/v1/streams/pay.a/events?after={}&until={until}", early - 1), Some(&reader), None);
    let first = sse.next(Duration::from_secs(30)).expect("the catch-up");
    assert_eq!(first.id, Some(early));
    let mut published = vec![early];
    while *published.last().unwrap() <= until {
        published.push(publish(&mut owner, "pay.a", "{}"));
    }
    let mut got = vec![first];
    got.extend(sse.drain_until_closed(Duration::from_secs(30)));
    let want: Vec<i64> = published.into_iter().filter(|p| *p <= until).collect();
    assert_eq!(sse_positions(&got), want);
    assert_eq!(sse.next(Duration::from_millis(1)).err(), Some(SseEnd::Closed));
}

type Socket = tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<std::net::TcpStream>>;

/// Every message until the gateway closes the socket, and its close frame.
fn read_until_closed(socket: &mut Socket) -> (Vec<Value>, Option<tungstenite::protocol::CloseFrame>) {
    if let tungstenite::stream::MaybeTlsStream::Plain(s) = socket.get_ref() {
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    }
    let mut messages = Vec::new();
    loop {
        match socket.read() {
            Ok(tungstenite::Message::Text(t)) => messages.push(serde_json::from_str(t.as_str()).unwrap()),
            Ok(tungstenite::Message::Close(frame)) => return (messages, frame),
            Ok(_) => {}
            Err(e) => panic!("the WebSocket failed before a close frame: {e} (after {messages:?})"),
        }
    }
}

#[test]
fn websocket_with_until_sends_each_subscription_up_to_it_then_closes_normally() {
    let s = Setup::new(&["--poll-interval-ms", "100"]);
    let mut owner = s.db.connect();
    let early: Vec<i64> =
        (0..4).flat_map(|_| [publish(&mut owner, "pay.a", "{}"), publish(&mut owner, "pay.b", "{}")]).collect();
    wait_for_horizon(&mut owner, *early.last().unwrap());
    // Above the horizon: the rest comes live.
    let until = early.last().unwrap() + 3;
    let url = format!("ws://127.0.0.1:{}/v1/ws?access_token={}&until={until}", s.gateway.port, token(&s.reader.name));
    let (mut socket, _) = tungstenite::connect(url).unwrap();
    for stream in ["pay.a", "pay.b"] {
        let subscribe = json!({"type": "subscribe", "stream": stream, "after": 0});
        socket.send(tungstenite::Message::Text(subscribe.to_string().into())).unwrap();
    }
    // Both subscriptions are open before the events past the horizon exist.
    if let tungstenite::stream::MaybeTlsStream::Plain(s) = socket.get_ref() {
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    }
    let mut messages: Vec<Value> = Vec::new();
    while messages.iter().filter(|m| m["type"] == "subscribed").count() < 2 {
        match socket.read().expect("the subscriptions are acknowledged") {
            tungstenite::Message::Text(t) => messages.push(serde_json::from_str(t.as_str()).unwrap()),
            tungstenite::Message::Close(frame) => panic!("closed before both were acknowledged: {frame:?}"),
            _ => {}
        }
    }
    let mut last = 0;
    while last <= until + 1 {
        last = publish(&mut owner, "pay.a", "{}");
        publish(&mut owner, "pay.b", "{}");
    }
    let (rest, frame) = read_until_closed(&mut socket);
    messages.extend(rest);
    let frame = frame.expect("a close frame");
    assert_eq!(u16::from(frame.code), 1000, "{frame:?}");
    for stream in ["pay.a", "pay.b"] {
        let of_it: Vec<&Value> =
            messages.iter().filter(|m| m["subscription"] == stream || m["stream"] == stream).collect();
        let events: Vec<i64> =
            of_it.iter().filter(|m| m["type"] == "event").map(|m| m["position"].as_i64().unwrap()).collect();
        assert_eq!(events, expected(&s, stream, until), "{stream}");
        let end = of_it.last().unwrap();
        assert_eq!((end["type"].as_str(), end["until"].as_i64()), (Some("unsubscribed"), Some(until)), "{stream}");
    }
}

#[test]
fn a_bad_until_is_refused_with_22023() {
    let s = Setup::new(&[]);
    let reader = token(&s.reader.name);
    let auth = format!("Bearer {reader}");
    for until in ["-1", "x", "1.5", ""] {
        let path = format!("/v1/streams/pay.*/events?after=0&until={until}");
        for headers in [
            vec![("Authorization", auth.as_str())],
            vec![("Authorization", auth.as_str()), ("Accept", "text/event-stream")],
        ] {
            let (status, body) = s.gateway.request("GET", &path, &headers, "");
            assert_eq!(status, 400, "{path} {headers:?}: {body}");
            assert_eq!(common::json(&body)["sqlstate"], "22023", "{path}: {body}");
        }
        let url = format!("ws://127.0.0.1:{}/v1/ws?access_token={reader}&until={until}", s.gateway.port);
        match tungstenite::connect(url) {
            Err(tungstenite::Error::Http(response)) => {
                assert_eq!(response.status(), 400, "{until:?}");
                let body = String::from_utf8(response.body().clone().unwrap_or_default()).unwrap();
                assert_eq!(common::json(&body)["sqlstate"], "22023", "{until:?}: {body}");
            }
            other => panic!("a WebSocket with until={until:?} is refused: {:?}", other.map(|_| ())),
        }
    }
}
