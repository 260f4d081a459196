//! The gateway's tokens and privileges, against the real server (the
//! gateway runs as tests/gateway.rs describes): what each token may read and
//! publish, private streams and forged notifications included; a revoked
//! read privilege stops live forwarding; forged notifications cost neither
//! memory nor load; bad input gets the documented status.
#![cfg(feature = "integration")]

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::gateway::{token, token_with, Gateway, Setup};
use common::{publish, wait_for_horizon, wait_until, TestRole};
use serde_json::{json, Value};

#[test]
fn privileges_decide_what_each_token_sees() {
    let s = Setup::new(&[]);
    let stranger = s.role("stranger", "");
    let orders = s.role("orders", "SELECT streams.grant('read', 'orders', '{r}');");
    let insider = s.role(
        "insider",
        "SELECT streams.grant('read', 'secret.*', '{r}'); SELECT streams.grant('read', 'pay.*', '{r}');",
    );
    let writer = s.role("writer", "SELECT streams.grant('publish', 'pay.*', '{r}');");
    let outsider = TestRole::new(&s.db, "outsider", "NOLOGIN"); // the gateway is not a member
    s.db.connect().batch_execute("SELECT streams.set_private('secret.*')").unwrap();
    let gw = &s.gateway;

    // Reading: 403 without read on the whole pattern, for SSE, pages and WebSocket.
    for (role, path) in [
        (&stranger.name, "/v1/streams/pay.*/events"),
        (&orders.name, "/v1/streams/pay.*/events"),
        (&s.reader.name, "/v1/streams/*/events"),
        (&s.reader.name, "/v1/streams/secret.x/events"),
    ] {
        let sse = gw.sse(path, Some(&token(role)), None);
        assert_eq!(sse.status, 403, "{role} {path}");
        assert_eq!(sse.error_body()["sqlstate"], "42501");
        let (status, body) = gw.request("GET", path, &[("Authorization", &format!("Bearer {}", token(role)))], "");
        assert_eq!(status, 403, "{role} {path} as a page: {body}");
    }
    // The gateway's own role reads nothing: a token naming it is refused.
    let own = token(&s.login.name);
    assert_eq!(gw.sse("/v1/streams/pay.a/events", Some(&own), None).status, 401);
    let (status, body) =
        gw.request("GET", "/v1/streams/pay.a/events", &[("Authorization", &format!("Bearer {own}"))], "");
    assert_eq!(status, 401, "the gateway's own role as a page: {body}");
    let mut ws = gw.ws(&token(&stranger.name));
    ws.send(json!({"type": "subscribe", "stream": "pay.*"}));
    let m = ws.next(Duration::from_secs(10)).unwrap();
    assert_eq!((m["type"].as_str(), m["status"].as_i64()), (Some("error"), Some(403)), "{m}");
    // A role the gateway is not a member of, and one that does not exist.
    assert_eq!(gw.sse("/v1/streams/pay.*/events", Some(&token(&outsider.name)), None).status, 403);
    assert_eq!(gw.sse("/v1/streams/pay.*/events", Some(&token("no_such_role_at_all")), None).status, 401);

    // Publishing: 403 without the publish grant, 201 with it.
    let (status, _) = gw.request(
        "POST",
        "/v1/streams/pay.a/events",
        &[("Authorization", &format!("Bearer {}", token(&s.reader.name)))],
        "{}",
    );
    assert_eq!(status, 403);
    let (status, body) = gw.request(
        "POST",
        "/v1/streams/pay.a/events",
        &[("Authorization", &format!("Bearer {}", token(&writer.name)))],
        r#"{"via": "http"}"#,
    );
    assert_eq!(status, 201, "{body}");
    let published: Value = serde_json::from_str(&body).unwrap();
    assert!(published["position"].as_i64().unwrap() > 0);

    // Private data reaches only roles that may read it; a forged
    // notification on a stream's channel reaches nobody.
    // Both streams exist before the subscriptions, so the gateway LISTENs
    // on their channels from the start.
    let mut owner = s.db.connect();
    let secret = publish(&mut owner, "secret.plans", r#"{"launch": "tuesday"}"#);
    wait_for_horizon(&mut owner, secret);
    let mut reader = gw.sse("/v1/streams/pay.*/events", Some(&token(&s.reader.name)), published["position"].as_i64());
    // One stream exactly: the topic that may forward a payload without a query.
    let mut exact = gw.sse("/v1/streams/pay.a/events", Some(&token(&s.reader.name)), published["position"].as_i64());
    let mut insider_all =
        gw.sse("/v1/streams/secret.*/events", Some(&token(&insider.name)), published["position"].as_i64());
    assert_eq!((reader.status, insider_all.status), (200, 200));
    // Someone with a connection sends forged notifications on the channels.
    let forged = json!({"position": secret + 1000, "stream": "pay.a", "time": "2026-01-01T00:00:00.000000Z", "tx": 1, "prev": 0, "data": {"forged": true}});
    let forged_secret = json!({"position": secret + 1001, "stream": "secret.plans", "time": "2026-01-01T00:00:00.000000Z", "tx": 1, "prev": 0, "data": {"forged": true}});
    let unverified = gw.metric("litebase_streams_gateway_unverified_notifications_total");
    let mut intruder = s.db.connect_as(&s.login.name);
    intruder
        .execute(
            "SELECT pg_notify('pay.a', $1), pg_notify('secret.plans', $2)",
            &[&forged.to_string(), &forged_secret.to_string()],
        )
        .unwrap();
    wait_until("the gateway received the forged notifications", Duration::from_secs(10), || {
        gw.metric("litebase_streams_gateway_unverified_notifications_total") >= unverified + 2.0
    });
    let sentinel = publish(&mut owner, "pay.a", r#"{"sentinel": true}"#);
    let secret_after = publish(&mut owner, "secret.plans", r#"{"launch": "friday"}"#);
    // The reader receives the sentinel, which comes after the secret and the forgery: nothing else before it.
    let event = reader.next(Duration::from_secs(20)).unwrap();
    assert_eq!(event.id, Some(sentinel), "the reader's next event is the sentinel: {:?}", event.data);
    assert_eq!(event.data["data"], json!({"sentinel": true}));
    let event = exact.next(Duration::from_secs(20)).unwrap();
    assert_eq!(event.id, Some(sentinel), "the exact subscriber's next event is the sentinel: {:?}", event.data);
    assert_eq!(event.data["data"], json!({"sentinel": true}));
    let a = insider_all.next(Duration::from_secs(20)).unwrap();
    let b = insider_all.next(Duration::from_secs(20)).unwrap();
    assert_eq!(
        (a.id, b.id),
        (Some(secret), Some(secret_after)),
        "the insider gets the private events, not the forged one"
    );
    assert_eq!(a.data["data"], json!({"launch": "tuesday"}), "with their data, fetched by replay as the insider");
    assert_eq!(b.data["data"], json!({"launch": "friday"}));
}

#[test]
fn bad_input_gets_the_documented_status() {
    let s = Setup::new(&[]);
    let gw = &s.gateway;
    let t = token(&s.reader.name);
    let auth = format!("Bearer {t}");
    let h = [("Authorization", auth.as_str())];
    let sse = [("Authorization", auth.as_str()), ("Accept", "text/event-stream")];
    for (method, path, headers, body, status, sqlstate) in [
        ("GET", "/v1/streams/bad%20name/events", &h[..], "", 400, Some("22023")),
        ("GET", "/v1/streams/a*b*/events", &sse[..], "", 400, Some("22023")),
        ("GET", "/v1/streams/pay.*/events?after=x", &h[..], "", 400, Some("22023")),
        ("GET", "/v1/streams/pay.*/events?since=now&from_tx=1", &sse[..], "", 400, Some("22023")),
        ("GET", "/v1/streams/pay.*/events?frames=named", &sse[..], "", 400, Some("22023")),
        ("GET", "/v1/streams/pay.*/events?since=yesterday-ish", &h[..], "", 400, Some("22007")),
        ("GET", "/v1/streams/pay.*/events?max_events=-1", &h[..], "", 400, Some("22023")),
        ("POST", "/v1/streams/pay.a/events", &h[..], "{not json", 400, Some("22P02")),
        ("POST", "/v1/streams/bad%20name!/events", &h[..], "{}", 400, Some("22023")),
        ("GET", "/v1/streams/pay.*/events", &[][..], "", 401, None),
        ("GET", "/v1/streams/pay.*/events", &[("Authorization", "Bearer not.a.token")][..], "", 401, None),
        ("GET", "/v1/nothing/here", &h[..], "", 404, None),
    ] {
        let (got, text) = gw.request(method, path, headers, body);
        assert_eq!(got, status, "{method} {path}: {text}");
        let error: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{method} {path}: not JSON: {text}"));
        assert!(error["error"].is_string(), "{method} {path}: {error}");
        assert_eq!(error["sqlstate"].as_str(), sqlstate, "{method} {path}: {error}");
    }
    let other_secret = token_with(&s.reader.name, "another-secret");
    assert_eq!(gw.sse("/v1/streams/pay.*/events", Some(&other_secret), None).status, 401);
    let big = format!(r#"{{"blob": "{}"}}"#, "x".repeat(2 * 1024 * 1024));
    let (status, body) = gw.request("POST", "/v1/streams/pay.a/events", &h, &big);
    assert_eq!(status, 413, "a body over --max-body-bytes");
    assert!(serde_json::from_str::<Value>(&body).unwrap()["error"].is_string(), "{body}");
    let bad_id = [("Authorization", auth.as_str()), ("Accept", "text/event-stream"), ("Last-Event-ID", "abc")];
    let (status, body) = gw.request("GET", "/v1/streams/pay.*/events", &bad_id, "");
    assert_eq!(status, 400, "a bad Last-Event-ID: {body}");
    // WebSocket: bad messages get error messages, and the socket stays usable.
    let mut ws = gw.ws(&t);
    ws.send(json!({"type": "subscribe"}));
    assert_eq!(ws.next(Duration::from_secs(10)).unwrap()["type"], "error");
    ws.send(json!({"type": "dance", "stream": "pay.*"}));
    assert_eq!(ws.next(Duration::from_secs(10)).unwrap()["type"], "error");
    ws.send(json!({"type": "subscribe", "stream": "pay.*", "after": "x"}));
    assert_eq!(ws.next(Duration::from_secs(10)).unwrap()["status"], 400);
    ws.send(json!({"type": "subscribe", "stream": "pay.*"}));
    assert_eq!(ws.next(Duration::from_secs(10)).unwrap()["type"], "subscribed");
    // The database unreachable: 503, for /healthz too.
    let dead_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let orphan = Gateway::start_url(&format!("host=127.0.0.1 port={dead_port} user=postgres dbname=postgres"), &[]);
    let (status, body) = orphan.request("GET", "/v1/streams/pay.*/events", &h, "");
    assert_eq!(status, 503, "{body}");
    assert_eq!(orphan.request("GET", "/healthz", &[], "").0, 503);
    assert_eq!(gw.request("GET", "/healthz", &[], "").0, 200);
}

/// After `streams.revoke`, a single-stream subscription forwards nothing
/// more: a notification is forwarded without a query only while the last
/// privilege check is younger than a poll interval; otherwise the gateway
/// checks again, finds the revocation and disconnects the client.
#[test]
fn a_revoked_read_privilege_stops_live_forwarding() {
    let s = Setup::new(&["--poll-interval-ms", "200"]);
    let fickle = s.role("fickle", "SELECT streams.grant('read', 'pay.a', '{r}');");
    let mut owner = s.db.connect();
    let start = publish(&mut owner, "pay.a", "{}");
    wait_for_horizon(&mut owner, start);
    let mut sse = s.gateway.sse("/v1/streams/pay.a/events", Some(&token(&fickle.name)), Some(start));
    assert_eq!(sse.status, 200);
    let granted = publish(&mut owner, "pay.a", r#"{"granted": true}"#);
    assert_eq!(sse.next(Duration::from_secs(10)).expect("the event while granted").id, Some(granted));
    owner.execute("SELECT streams.revoke('read', 'pay.a', $1::text::regrole)", &[&fickle.name]).unwrap();
    // The check made for `granted` was trusted for one poll interval (200 ms); let it expire.
    thread::sleep(Duration::from_millis(600));
    let checks = s.gateway.metric("litebase_streams_gateway_privilege_checks_total");
    publish(&mut owner, "pay.a", r#"{"revoked": true}"#);
    let after = sse.drain_until_closed(Duration::from_secs(20));
    assert!(after.is_empty(), "nothing reaches the client after the revoke: {after:?}");
    assert!(s.gateway.metric("litebase_streams_gateway_privilege_checks_total") > checks, "the gateway checked again");
    let again = s.gateway.sse("/v1/streams/pay.a/events", Some(&token(&fickle.name)), Some(granted));
    assert_eq!(again.status, 403);
}

/// Forged notifications (from a role that may only connect) cost neither
/// memory nor load: they are not stored, and the replays they force come at
/// most once per poll interval. The next real event still arrives.
#[test]
fn forged_notifications_are_not_stored_and_force_few_replays() {
    let s = Setup::new(&[]);
    let t = token(&s.reader.name);
    let mut owner = s.db.connect();
    let start = publish(&mut owner, "pay.a", "{}");
    wait_for_horizon(&mut owner, start);
    let mut exact = s.gateway.sse("/v1/streams/pay.a/events", Some(&t), Some(start));
    let mut pattern = s.gateway.sse("/v1/streams/pay.*/events", Some(&t), Some(start));
    assert_eq!((exact.status, pattern.status), (200, 200));
    // Learn the worker's pid (a replay reads it) with one real event.
    let real = publish(&mut owner, "pay.a", "{}");
    assert_eq!(exact.next(Duration::from_secs(10)).unwrap().id, Some(real));
    assert_eq!(pattern.next(Duration::from_secs(10)).unwrap().id, Some(real));
    let peak_before = s.gateway.memory_kb("VmHWM");
    let replays_before = s.gateway.metric("litebase_streams_gateway_topic_replays_total");
    let unverified = s.gateway.metric("litebase_streams_gateway_unverified_notifications_total");
    let started = Instant::now();
    let mut intruder = s.db.connect_as(&s.login.name);
    let padding = "f".repeat(7_800);
    let forged = 20_000;
    for _ in 0..4 {
        intruder
            .execute(
                "SELECT pg_notify('pay.a', format('{\"position\": %s, \"stream\": \"pay.a\", \"prev\": 0, \"pad\": \"%s\"}', \
                 9000000000000000000 - i, $1::text)) FROM generate_series(1, $2::int) i",
                &[&padding, &(forged / 4)],
            )
            .unwrap();
    }
    wait_until("the gateway received the forged notifications", Duration::from_secs(60), || {
        s.gateway.metric("litebase_streams_gateway_unverified_notifications_total") >= unverified + forged as f64
    });
    let secs = started.elapsed().as_secs_f64();
    let replays = s.gateway.metric("litebase_streams_gateway_topic_replays_total") - replays_before;
    let growth_kb = s.gateway.memory_kb("VmHWM").saturating_sub(peak_before);
    // Two topics, one forced replay each per second at most (plus the one in progress).
    assert!(replays <= 2.0 * (secs + 2.0), "{replays} replays for {forged} forged notifications in {secs:.1} s");
    assert!(growth_kb < 16 * 1024, "{forged} forged 7.9 kB notifications grew the peak memory by {growth_kb} kB");
    let sentinel = publish(&mut owner, "pay.a", r#"{"sentinel": true}"#);
    assert_eq!(exact.next(Duration::from_secs(10)).unwrap().id, Some(sentinel));
    assert_eq!(pattern.next(Duration::from_secs(10)).unwrap().id, Some(sentinel));
}
