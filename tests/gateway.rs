//! The gateway (gateway/, litebase-streams-gateway) against the real server,
//! started by the harness (tests/common/gateway.rs) for each test. It logs in
//! as a NOINHERIT role that is only a member of the roles its tokens name,
//! as docs/gateway.md recommends, so every test also checks that this is enough.
//!
//! This file: SSE and JSON pages. Resuming with Last-Event-ID across gateway
//! and database restarts, many clients over a few database connections, a
//! real browser (EventSource and WebSocket), slow clients, catch-up in pages
//! bounded by bytes or read from a hot standby, heartbeats, and idle topics.
//! The WebSocket protocol is in tests/gateway_ws.rs, tokens, privileges and
//! bad input in tests/gateway_auth.rs, the hostile HTTP edges in
//! tests/gateway_edges.rs.
#![cfg(feature = "integration")]

mod common;

use std::sync::RwLock;
use std::thread;
use std::time::{Duration, Instant};

use common::browser::Browser;
use common::gateway::{
    assert_exactly_once_in_order, set_receive_buffer, token, Gateway, Setup, Sse, SseEnd, SseEvent, Writers,
};
use common::{publish, wait_for_horizon, wait_until};
use serde_json::{json, Value};

/// The test that restarts the server holds this exclusively; the others share it.
/// (A lock of this binary only: cargo runs test binaries one at a time.)
static SERVER: RwLock<()> = RwLock::new(());

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    SERVER.read().unwrap_or_else(|e| e.into_inner())
}

/// An SSE client that behaves like a browser's EventSource: when the
/// connection ends it connects again with `Last-Event-ID`, retrying while the
/// gateway is away or answers 503. It records every event it receives.
struct ResumingSse {
    port: u16,
    path: String,
    token: String,
    sse: Option<Sse>,
    events: Vec<SseEvent>,
    reconnects: usize,
}

impl ResumingSse {
    fn new(port: u16, path: &str, token: &str) -> ResumingSse {
        ResumingSse { port, path: path.into(), token: token.into(), sse: None, events: vec![], reconnects: 0 }
    }

    fn last(&self) -> Option<i64> {
        self.events.last().and_then(|e| e.id)
    }

    fn positions(&self) -> Vec<i64> {
        self.events.iter().map(|e| e.data["position"].as_i64().unwrap()).collect()
    }

    /// Read (and reconnect) for up to `budget`.
    fn pump(&mut self, budget: Duration) {
        let deadline = Instant::now() + budget;
        while Instant::now() < deadline {
            let Some(sse) = self.sse.as_mut() else {
                match Sse::try_connect(self.port, &self.path, Some(&self.token), self.last()) {
                    Ok(sse) if sse.status == 200 => {
                        self.sse = Some(sse);
                        self.reconnects += 1;
                    }
                    _ => thread::sleep(Duration::from_millis(100)),
                }
                continue;
            };
            match sse.next(deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))) {
                Ok(event) => {
                    assert_eq!(event.id, event.data["position"].as_i64(), "id: is the position");
                    assert_eq!(event.event.as_deref(), event.data["stream"].as_str(), "event: is the stream");
                    self.events.push(event);
                }
                Err(SseEnd::Closed) => self.sse = None,
                Err(SseEnd::Timeout) => {}
            }
        }
    }

    fn pump_until(&mut self, what: &str, timeout: Duration, mut done: impl FnMut(&ResumingSse) -> bool) {
        let deadline = Instant::now() + timeout;
        while !done(self) {
            assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting until {what}");
            self.pump(Duration::from_millis(50));
        }
    }
}

#[test]
fn sse_resumes_with_last_event_id_across_gateway_and_database_restarts_with_writers_running() {
    let _exclusive = SERVER.write().unwrap_or_else(|e| e.into_inner());
    let mut s = Setup::new(&[]);
    let writers = Writers::start(&s.db, &["pay.a", "pay.b"]);
    let mut client = ResumingSse::new(s.gateway.port, "/v1/streams/pay.*/events?after=0", &token(&s.reader.name));
    client.pump_until("30 events arrived", Duration::from_secs(30), |c| c.events.len() >= 30);

    s.gateway.restart();
    let seen = client.events.len();
    client.pump_until("30 more events after the gateway restart", Duration::from_secs(30), |c| {
        c.events.len() >= seen + 30
    });
    assert!(client.reconnects >= 2, "the client reconnected after the gateway restart");

    common::pg_ctl(&["stop", "-m", "immediate"]);
    common::pg_ctl(&["start"]);
    let seen = client.events.len();
    client.pump_until("30 more events after the database restart", Duration::from_secs(60), |c| {
        c.events.len() >= seen + 30
    });

    let sent = writers.stop();
    let committed = s.positions("pay.");
    assert!(committed.len() as u64 >= sent, "every acknowledged publish committed");
    let last = *committed.last().unwrap();
    client.pump_until("the last committed event arrived", Duration::from_secs(30), |c| c.last() == Some(last));
    assert_exactly_once_in_order(&client.positions(), &committed, "SSE across restarts");
    let reconnects = s.gateway.metric("litebase_streams_gateway_listen_reconnects_total");
    assert!(reconnects >= 1.0, "the gateway re-established LISTEN after the database restart");
}

#[test]
fn a_handful_of_database_connections_serve_many_clients() {
    let _shared = shared();
    let s = Setup::new(&["--pool-size", "3"]);
    let t = token(&s.reader.name);
    let mut clients: Vec<Sse> = (0..60)
        .map(|i| {
            s.gateway.sse(&format!("/v1/streams/pay.{}/events", if i % 2 == 0 { "*" } else { "a" }), Some(&t), None)
        })
        .collect();
    let position = publish(&mut s.db.connect(), "pay.a", r#"{"hello": "everyone"}"#);
    for sse in &mut clients {
        assert_eq!(sse.status, 200);
        let event = sse.next(Duration::from_secs(20)).expect("every client gets the event");
        assert_eq!(event.id, Some(position));
        assert_eq!(event.data["data"], json!({"hello": "everyone"}));
    }
    let used: i64 = s
        .db
        .connect()
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'litebase-streams-gateway' AND datname = $1",
            &[&s.db.name],
        )
        .unwrap()
        .get(0);
    assert!((1..=4).contains(&used), "60 clients over {used} database connections (pool of 3 + LISTEN)");
}

#[test]
fn a_real_browser_receives_events_over_eventsource_and_websocket() {
    let _shared = shared();
    let s = Setup::new(&["--allow-origin", "*"]);
    let mut owner = s.db.connect();
    let before = publish(&mut owner, "pay.a", r#"{"before": "the page opened", "amount": 49.00}"#);
    wait_for_horizon(&mut owner, before);
    let page = std::env::temp_dir().join(format!("gateway-page-{}.html", std::process::id()));
    let html = include_str!("gateway_page.html")
        .replace("GATEWAY_URL", &format!("127.0.0.1:{}", s.gateway.port))
        .replace("TOKEN", &token(&s.reader.name));
    std::fs::write(&page, html).unwrap();
    let mut browser = Browser::open(&format!("file://{}", page.display()));
    wait_until("the page connected both ways", Duration::from_secs(30), || {
        browser.eval("window.received && window.received.open") == json!(2)
    });
    let live: Vec<i64> = (0..5)
        .map(|i| publish(&mut owner, if i % 2 == 0 { "pay.a" } else { "pay.b" }, &format!(r#"{{"live": {i}}}"#)))
        .collect();
    let expected: Vec<i64> = std::iter::once(before).chain(live.iter().copied()).collect();
    let got = |browser: &mut Browser, which: &str| -> Vec<i64> {
        serde_json::from_value(browser.eval(&format!("window.received.{which}.map(e => e.position)"))).unwrap()
    };
    wait_until("the page received every event over both", Duration::from_secs(30), || {
        got(&mut browser, "sse").len() >= expected.len() && got(&mut browser, "ws").len() >= expected.len()
    });
    assert_eq!(got(&mut browser, "sse"), expected, "EventSource");
    assert_eq!(got(&mut browser, "ws"), expected, "WebSocket");
    assert_eq!(browser.eval("window.received.sse[0].data.amount_text"), json!("49.00"), "numbers as stored");
    assert_eq!(browser.eval("window.received.errors"), json!([]));
    let _ = std::fs::remove_file(&page);
}

#[test]
fn a_slow_client_is_disconnected_and_memory_stays_bounded() {
    let _shared = shared();
    let s = Setup::new(&["--client-buffer-bytes", "65536", "--client-buffer-events", "64"]);
    let t = token(&s.reader.name);
    // A client that stops reading, with a small receive buffer.
    let socket = {
        let raw = std::net::TcpStream::connect(("127.0.0.1", s.gateway.port)).unwrap();
        set_receive_buffer(&raw, 4096);
        raw
    };
    let mut slow = Sse::over(socket, "/v1/streams/pay.*/events", Some(&t), Some(0)).unwrap();
    assert_eq!(slow.status, 200);
    // A healthy client beside it keeps up (and keeps its connection).
    let mut healthy = s.gateway.sse("/v1/streams/pay.*/events", Some(&t), Some(0));
    let peak_before = s.gateway.memory_kb("VmHWM");
    // 48 MB of events, 4 kB each, in batches of 10 (smaller than the buffer,
    // so the healthy client keeps up): far more than the buffers hold.
    let blob = "x".repeat(4000);
    let mut owner = s.db.connect();
    let mut healthy_got = 0;
    for batch in 0..1200 {
        let data: Vec<String> =
            (0..10).map(|i| format!(r#"{{"batch": {batch}, "i": {i}, "blob": "{blob}"}}"#)).collect();
        owner.execute("SELECT streams.publish_batch('pay.big', $1::text[]::jsonb[])", &[&data]).unwrap();
        while healthy_got < (batch + 1) * 10 {
            healthy.next(Duration::from_secs(20)).expect("the healthy client keeps receiving");
            healthy_got += 1;
        }
    }
    let committed = s.positions("pay.");
    let last = *committed.last().unwrap();
    let growth_kb = s.gateway.memory_kb("VmHWM").saturating_sub(peak_before);
    assert!(growth_kb < 16 * 1024, "the gateway's peak memory grew by {growth_kb} kB for 48 MB of events");
    wait_until("the gateway dropped the slow client", Duration::from_secs(30), || {
        s.gateway.metric("litebase_streams_gateway_slow_client_drops_total") >= 1.0
    });
    // The slow client finds its connection closed after what was in flight, and resumes.
    let delivered = slow.drain_until_closed(Duration::from_secs(30));
    let resume_at = delivered.last().and_then(|e| e.id).unwrap_or(0);
    assert!(delivered.len() < committed.len(), "it was cut off before the end ({} events)", delivered.len());
    let mut resumed = s.gateway.sse("/v1/streams/pay.*/events", Some(&t), Some(resume_at));
    let mut positions: Vec<i64> = delivered.iter().map(|e| e.id.unwrap()).collect();
    while positions.last() != Some(&last) {
        positions.push(resumed.next(Duration::from_secs(20)).expect("the resumed client catches up").id.unwrap());
    }
    assert_exactly_once_in_order(&positions, &committed, "slow client, then resumed");
    while healthy_got < committed.len() {
        healthy.next(Duration::from_secs(20)).expect("the healthy client got everything");
        healthy_got += 1;
    }
}

#[test]
fn json_pages_page_through_the_log_as_the_role() {
    let _shared = shared();
    let s = Setup::new(&[]);
    let mut owner = s.db.connect();
    let positions: Vec<i64> =
        (0..7).map(|i| publish(&mut owner, "pay.a", &format!(r#"{{"i": {i}, "amount": 1.50}}"#))).collect();
    publish(&mut owner, "internal.x", "{}"); // not readable by the reader
    wait_for_horizon(&mut owner, *positions.last().unwrap() + 1);
    let auth = format!("Bearer {}", token(&s.reader.name));
    let mut after = 0;
    let mut seen = Vec::new();
    loop {
        let (status, body) = s.gateway.request(
            "GET",
            &format!("/v1/streams/*/events?after={after}&max_events=3"),
            &[("Authorization", &auth)],
            "",
        );
        if status == 403 {
            // '*' is not the reader's: page through its own pattern.
            let (status, body) = s.gateway.request(
                "GET",
                &format!("/v1/streams/pay.*/events?after={after}&max_events=3"),
                &[("Authorization", &auth), ("Accept", "application/json")],
                "",
            );
            assert_eq!(status, 200, "{body}");
            let page: Vec<Value> = serde_json::from_str(&body).unwrap();
            seen.extend(page.iter().map(|e| e["position"].as_i64().unwrap()));
            if page.len() < 3 {
                break;
            }
            after = *seen.last().unwrap();
            assert!(body.contains(r#""amount":1.50"#), "numbers as stored: {body}");
            continue;
        }
        panic!("the reader may not read '*': {status} {body}");
    }
    assert_eq!(seen, positions);
}

#[test]
fn catch_up_reads_go_to_a_hot_standby_and_live_events_come_from_the_primary() {
    let _shared = shared();
    let s = Setup::new(&[]);
    let mut owner = s.db.connect();
    let old: Vec<i64> = (0..50).map(|i| publish(&mut owner, "pay.a", &format!(r#"{{"old": {i}}}"#))).collect();
    wait_for_horizon(&mut owner, *old.last().unwrap());
    let standby = common::ScratchCluster::standby_of_test_cluster();
    let mut on_standby = standby.connect(&s.db.name);
    wait_until("the standby replayed the events", Duration::from_secs(30), || {
        common::horizon(&mut on_standby) >= *old.last().unwrap()
    });
    let replica = format!("host=127.0.0.1 port={} user={} dbname={}", standby.port, s.login.name, s.db.name);
    let gateway = Gateway::start(&s.db, &s.login.name, &["--replica-url", &replica]);
    let mut client = ResumingSse::new(gateway.port, "/v1/streams/pay.*/events?after=0", &token(&s.reader.name));
    client.pump_until("the old events arrived", Duration::from_secs(30), |c| c.events.len() >= old.len());
    let used: i64 = on_standby
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'litebase-streams-gateway' AND datname = $1",
            &[&s.db.name],
        )
        .unwrap()
        .get(0);
    assert!(used >= 1, "the catch-up read from the standby");
    let live: Vec<i64> = (0..5).map(|i| publish(&mut owner, "pay.b", &format!(r#"{{"live": {i}}}"#))).collect();
    let last = *live.last().unwrap();
    client.pump_until("the live events arrived", Duration::from_secs(30), |c| c.last() == Some(last));
    assert_exactly_once_in_order(&client.positions(), &s.positions("pay."), "catch-up on the standby, then live");
}

#[test]
fn idle_streams_get_heartbeats() {
    let _shared = shared();
    let s = Setup::new(&["--heartbeat-secs", "1"]);
    let mut sse = s.gateway.sse("/v1/streams/pay.*/events", Some(&token(&s.reader.name)), None);
    assert_eq!(sse.status, 200);
    let content_type = sse.headers.iter().find(|(k, _)| k == "content-type").map(|(_, v)| v.clone());
    assert_eq!(content_type.as_deref(), Some("text/event-stream"));
    wait_until("two `: ping` comments arrived", Duration::from_secs(10), || {
        assert_eq!(sse.next(Duration::from_millis(100)).err(), Some(SseEnd::Timeout), "no event, no end");
        sse.pings >= 2
    });
}

/// Clients that never read, each catching up on a backlog of large events:
/// a catch-up page is read in chunks and stops at the client's byte budget,
/// so the gateway holds about a budget per client, not a page of 1,000
/// events (12 MB here) per client. A client that reads gets every event once.
#[test]
fn catch_up_pages_stop_at_the_client_byte_budget() {
    let _shared = shared();
    let s = Setup::new(&["--client-buffer-bytes", "262144"]);
    let t = token(&s.reader.name);
    let mut owner = s.db.connect();
    let blob = "y".repeat(40_000);
    for batch in 0..30 {
        let data: Vec<String> =
            (0..10).map(|i| format!(r#"{{"batch": {batch}, "i": {i}, "blob": "{blob}"}}"#)).collect();
        owner.execute("SELECT streams.publish_batch('pay.backlog', $1::text[]::jsonb[])", &[&data]).unwrap();
    }
    let committed = s.positions("pay.");
    wait_for_horizon(&mut owner, *committed.last().unwrap());
    let peak_before = s.gateway.memory_kb("VmHWM");
    let stalled: Vec<Sse> = (0..8)
        .map(|_| {
            let raw = std::net::TcpStream::connect(("127.0.0.1", s.gateway.port)).unwrap();
            set_receive_buffer(&raw, 4096);
            let sse = Sse::over(raw, "/v1/streams/pay.backlog/events", Some(&t), Some(0)).unwrap();
            assert_eq!(sse.status, 200);
            sse
        })
        .collect();
    // A reading client goes through the whole backlog, by then the stalled ones have read their first pages.
    let mut reader = s.gateway.sse("/v1/streams/pay.backlog/events", Some(&t), Some(0));
    let mut positions = Vec::new();
    while positions.len() < committed.len() {
        positions.push(reader.next(Duration::from_secs(20)).expect("the reading client catches up").id.unwrap());
    }
    assert_exactly_once_in_order(&positions, &committed, "catch-up in byte-bounded pages");
    let growth_kb = s.gateway.memory_kb("VmHWM").saturating_sub(peak_before);
    assert!(
        growth_kb < 32 * 1024,
        "8 stalled clients on a 12 MB backlog grew the gateway's peak memory by {growth_kb} kB"
    );
    drop(stalled);
}

/// A topic whose replays come back empty polls less and less often (up to
/// 10 s), and as soon as events come again, it is prompt again.
#[test]
fn idle_topics_back_off_their_safety_net_replays() {
    let _shared = shared();
    let s = Setup::new(&["--poll-interval-ms", "50"]);
    let t = token(&s.reader.name);
    let mut sse = s.gateway.sse("/v1/streams/pay.*/events", Some(&t), None);
    assert_eq!(sse.status, 200);
    let before = s.gateway.metric("litebase_streams_gateway_topic_replays_total");
    let started = Instant::now();
    // Without backoff, 2 s at 50 ms would be 40 replays; doubling from 50 ms it is 6.
    thread::sleep(Duration::from_secs(2));
    let replays = s.gateway.metric("litebase_streams_gateway_topic_replays_total") - before;
    assert!(replays <= 10.0, "{replays} replays of an idle topic in {:?}", started.elapsed());
    // A stream the pattern had not met: found by a replay, then live.
    let mut owner = s.db.connect();
    let first = publish(&mut owner, "pay.fresh", "{}");
    assert_eq!(sse.next(Duration::from_secs(15)).expect("the new stream's event").id, Some(first));
    let second = publish(&mut owner, "pay.fresh", "{}");
    assert_eq!(sse.next(Duration::from_secs(5)).expect("the next event, promptly").id, Some(second));
}
