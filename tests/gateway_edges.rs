//! The gateway's HTTP edges, after a hostile review: what a client without
//! a token, or with a token it should not have, can make it hold or do.
//! Slow and oversized headers, idle and surplus TCP connections, clients
//! that stop reading, SSE during an outage, reserved roles, token expiry and
//! nbf, time claims that are huge or not integers, topics one role may hold
//! and how soon they close, junk positions, JSON nested too deep, 405,
//! /healthz, page bytes, publish bodies that trickle.
#![cfg(feature = "integration")]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::gateway::{set_receive_buffer, token, Gateway, Setup, Sse, SECRET};
use common::{json, publish, wait_for_horizon, wait_until, TestDb, TestRole};
use serde_json::Value;

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// A token with the given claims, signed with the harness's secret.
fn token_claims(claims: Value) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .unwrap()
}

/// Read from `stream` until the gateway closes it (EOF or reset), within
/// `timeout`; what it sent meanwhile. Panics if it stays open.
fn read_until_closed(stream: &mut TcpStream, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "the gateway kept the connection open for {timeout:?}");
        stream.set_read_timeout(Some(left)).unwrap();
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => break, // reset
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// A whole HTTP/1.0 response, head and body, as text.
fn raw(port: u16, path: &str, headers: &[(&str, &str)]) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut request = format!("GET {path} HTTP/1.0\r\nHost: x\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    read_until_closed(&mut stream, Duration::from_secs(20))
}

#[test]
fn unfinished_headers_and_idle_connections_are_closed_after_the_header_timeout() {
    let s = Setup::publishing(&["--header-timeout-secs", "1"]);
    let started = Instant::now();
    // Headers that never end.
    let mut slow = TcpStream::connect(("127.0.0.1", s.gateway.port)).unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ").unwrap();
    // Nothing at all.
    let mut silent = TcpStream::connect(("127.0.0.1", s.gateway.port)).unwrap();
    // One request answered, then idle on a kept-alive connection.
    let mut idle = TcpStream::connect(("127.0.0.1", s.gateway.port)).unwrap();
    idle.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut first = [0u8; 12];
    idle.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    for stream in [&mut slow, &mut silent, &mut idle] {
        read_until_closed(stream, Duration::from_secs(8));
    }
    assert!(started.elapsed() >= Duration::from_millis(900), "closed before the timeout: {:?}", started.elapsed());
}

#[test]
fn oversized_headers_are_refused() {
    let s = Setup::publishing(&[]);
    let mut stream = TcpStream::connect(("127.0.0.1", s.gateway.port)).unwrap();
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ").unwrap();
    // 64 kB of one header, unfinished: refused long before the header timeout.
    let _ = stream.write_all(&vec![b'a'; 64 * 1024]);
    let answer = read_until_closed(&mut stream, Duration::from_secs(5));
    assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 431"), "{answer:?}");
}

#[test]
fn tcp_connections_over_the_limit_get_503_and_are_closed() {
    let s = Setup::publishing(&["--max-tcp-connections", "2", "--header-timeout-secs", "60"]);
    // Two kept-alive connections, each answered once (the harness's own
    // probe connection may still hold a permit for a moment: retry).
    let mut held = Vec::new();
    wait_until("two connections are held", Duration::from_secs(10), || {
        let served = |stream: &mut TcpStream| -> std::io::Result<bool> {
            stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")?;
            let mut status = [0u8; 12];
            stream.read_exact(&mut status)?;
            Ok(&status == b"HTTP/1.1 200")
        };
        if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", s.gateway.port)) {
            if served(&mut stream).unwrap_or(false) {
                held.push(stream);
            }
        }
        held.len() == 2
    });
    let mut third = TcpStream::connect(("127.0.0.1", s.gateway.port)).unwrap();
    let answer = read_until_closed(&mut third, Duration::from_secs(5));
    assert!(answer.starts_with("HTTP/1.1 503") && answer.contains("max-tcp-connections"), "{answer:?}");
    // A client that sent its request before being refused reads the 503
    // too: it is not reset away by a close over the unread request.
    for _ in 0..50 {
        let (status, body) = s.gateway.request("POST", "/v1/streams/pay.x/events", &[], &"x".repeat(8192));
        assert_eq!(status, 503, "{body}");
    }
    drop(held);
    wait_until("connections are served again", Duration::from_secs(10), || {
        s.gateway.request("GET", "/metrics", &[], "").0 == 200
    });
}

#[test]
fn sse_refused_for_lack_of_room_is_told_to_retry() {
    let s = Setup::publishing(&["--max-connections", "0"]);
    let auth = format!("Bearer {}", token(&s.reader.name));
    let answer =
        raw(s.gateway.port, "/v1/streams/pay.*/events", &[("Authorization", &auth), ("Accept", "text/event-stream")]);
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.0 200"), "{answer:?}");
    assert!(head.to_ascii_lowercase().contains("content-type: text/event-stream"), "{head:?}");
    assert!(body.starts_with("retry: "), "{body:?}");
    assert!(body.contains("max-connections"), "{body:?}");
}

#[test]
fn sse_during_a_database_outage_is_told_to_retry_and_json_gets_503() {
    let dead_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let gateway = Gateway::start_url(&format!("host=127.0.0.1 port={dead_port} user=postgres dbname=postgres"), &[]);
    let t = token("someone");
    let auth = format!("Bearer {t}");
    let answer =
        raw(gateway.port, "/v1/streams/pay.*/events", &[("Authorization", &auth), ("Accept", "text/event-stream")]);
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.0 200"), "{answer:?}");
    let retry: u64 = body.strip_prefix("retry: ").and_then(|r| r.lines().next()).unwrap().parse().unwrap();
    assert!((1000..=3000).contains(&retry), "{body:?}");
    let (status, body) = gateway.request(
        "GET",
        "/v1/streams/pay.*/events",
        &[("Authorization", &auth), ("Accept", "application/json")],
        "",
    );
    assert_eq!(status, 503, "{body}");
    assert!(json(&body)["error"].as_str().unwrap().contains("database"));
}

#[test]
fn tokens_for_none_reserved_names_or_the_gateways_own_role_are_refused() {
    let s = Setup::publishing(&[]);
    let mut client = s.db.connect();
    let secret = publish(&mut client, "secret.one", r#"{"private": true}"#);
    wait_for_horizon(&mut client, secret);
    for role in ["none", "NONE", "None", "public", "current_user", "session_user", "pg_read_all_data", &s.login.name] {
        let auth = format!("Bearer {}", token(role));
        for accept in ["application/json", "text/event-stream"] {
            let (status, body) = s.gateway.request(
                "GET",
                "/v1/streams/secret.*/events",
                &[("Authorization", &auth), ("Accept", accept)],
                "",
            );
            assert_eq!(status, 401, "{role} {accept}: {body}");
            assert!(!body.contains("private"), "{role}: {body}");
        }
        let (status, _) =
            s.gateway.request("POST", "/v1/streams/pay.x/events", &[("Authorization", &auth)], r#"{"a": 1}"#);
        assert_eq!(status, 401, "{role} publish");
    }
}

#[test]
fn a_token_not_valid_yet_gets_401() {
    let s = Setup::publishing(&[]);
    let t = token_claims(serde_json::json!({"role": s.reader.name, "nbf": now() + 600, "exp": now() + 3600}));
    let auth = format!("Bearer {t}");
    let (status, body) = s.gateway.request(
        "GET",
        "/v1/streams/pay.*/events",
        &[("Authorization", &auth), ("Accept", "application/json")],
        "",
    );
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("ImmatureSignature") || body.contains("invalid token"), "{body}");
}

#[test]
fn an_sse_stream_and_a_websocket_end_when_their_token_expires() {
    let s = Setup::publishing(&[]);
    // Expiring now: accepted within the 5 s leeway, so it ends 4 to 5 s
    // after it is made (`now` is in whole seconds). Each part makes its own
    // right before use, so a slow machine does not eat into the time left.
    let expiring = || token_claims(serde_json::json!({"role": s.reader.name, "exp": now()}));
    let mut client = s.db.connect();
    let p = publish(&mut client, "pay.one", r#"{"n": 1}"#);
    wait_for_horizon(&mut client, p);
    let t = expiring();
    let started = Instant::now();
    let mut sse = s.gateway.sse("/v1/streams/pay.*/events", Some(&t), None);
    assert_eq!(sse.status, 200);
    let events = sse.drain_until_closed(Duration::from_secs(10));
    assert_eq!(events.iter().map(|e| e.id.unwrap()).collect::<Vec<_>>(), vec![p]);
    assert!(started.elapsed() < Duration::from_secs(10));

    let mut ws = s.gateway.ws(&expiring());
    ws.send(serde_json::json!({"type": "subscribe", "stream": "pay.*"}));
    if let tungstenite::stream::MaybeTlsStream::Plain(s) = ws.socket.get_ref() {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    }
    let code = loop {
        match ws.socket.read() {
            Ok(tungstenite::Message::Close(frame)) => break frame.map(|f| u16::from(f.code)),
            Ok(_) => {}
            Err(e) => panic!("the WebSocket was not closed by the gateway: {e}"),
        }
    };
    assert_eq!(code, Some(4001));
}

#[test]
fn a_client_that_stops_reading_is_closed_after_the_write_timeout() {
    // A buffer large enough that only the write timeout can end it.
    let s = Setup::publishing(&[
        "--write-timeout-secs",
        "1",
        "--client-buffer-bytes",
        "67108864",
        "--client-buffer-events",
        "100000",
    ]);
    let mut client = s.db.connect();
    let big = format!(r#"{{"pad": "{}"}}"#, "x".repeat(200_000));
    let socket = TcpStream::connect(("127.0.0.1", s.gateway.port)).unwrap();
    set_receive_buffer(&socket, 4096);
    let t = token(&s.reader.name);
    let sse = Sse::over(socket, "/v1/streams/pay.*/events", Some(&t), None).unwrap();
    assert_eq!(sse.status, 200);
    wait_until("the SSE connection is counted", Duration::from_secs(10), || {
        s.gateway.metric("litebase_streams_gateway_connections{transport=\"sse\"}") == 1.0
    });
    let mut last = 0;
    for _ in 0..40 {
        last = publish(&mut client, "pay.big", &big);
    }
    wait_for_horizon(&mut client, last);
    // The client reads nothing; no more events come. Without a write
    // timeout the connection would hold its slot and buffers for ever.
    wait_until("the gateway closes the connection of a client that stopped reading", Duration::from_secs(20), || {
        s.gateway.metric("litebase_streams_gateway_connections{transport=\"sse\"}") == 0.0
    });
    drop(sse);
}

#[test]
fn junk_positions_deep_json_and_wrong_methods_get_json_errors() {
    let s = Setup::publishing(&[]);
    let auth = format!("Bearer {}", token(&s.reader.name));
    let page = [("Authorization", auth.as_str()), ("Accept", "application/json")];
    for query in ["from_tx=1'or'1", "from_tx=-1", "from_tx=1.5", "from_tx=", "after=1x"] {
        let (status, body) = s.gateway.request("GET", &format!("/v1/streams/pay.*/events?{query}"), &page, "");
        assert_eq!(status, 400, "{query}: {body}");
        assert_eq!(json(&body)["sqlstate"], "22023", "{query}: {body}");
    }
    let (status, body) = s.gateway.request("GET", "/v1/streams/pay.*/events?from_tx=1", &page, "");
    assert_eq!(status, 200, "{body}");

    let depth = 500_000;
    let deep = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let (status, body) = s.gateway.request("POST", "/v1/streams/pay.deep/events", &[("Authorization", &auth)], &deep);
    assert_eq!(status, 400, "{body}");
    assert_eq!(json(&body)["sqlstate"], "54001", "{body}");

    for (method, path) in [("PUT", "/v1/streams/pay.x/events"), ("POST", "/healthz"), ("DELETE", "/v1/ws")] {
        let (status, body) = s.gateway.request(method, path, &[("Authorization", &auth)], "");
        assert_eq!(status, 405, "{method} {path}");
        assert!(json(&body)["error"].as_str().unwrap().contains("method"), "{method} {path}: {body}");
    }
}

#[test]
fn a_publish_body_that_trickles_gets_408_and_one_without_a_token_is_never_read() {
    let s = Setup::publishing(&["--body-timeout-secs", "1"]);
    let auth = format!("Bearer {}", token(&s.reader.name));
    let mut slow = TcpStream::connect(("127.0.0.1", s.gateway.port)).unwrap();
    let head = format!(
        "POST /v1/streams/pay.slow/events HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nContent-Length: 100\r\n\r\n{{"
    );
    slow.write_all(head.as_bytes()).unwrap();
    let answer = read_until_closed(&mut slow, Duration::from_secs(10));
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    assert!(answer.contains("did not arrive in time"), "{answer:?}");
    // No token: 401 at once, whatever body is announced.
    let mut anonymous = TcpStream::connect(("127.0.0.1", s.gateway.port)).unwrap();
    anonymous
        .write_all(b"POST /v1/streams/pay.x/events HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n{")
        .unwrap();
    let mut status = [0u8; 12];
    anonymous.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    anonymous.read_exact(&mut status).unwrap();
    assert_eq!(&status, b"HTTP/1.1 401");
}

#[test]
fn healthz_is_asked_at_most_once_a_second_and_shows_no_pid() {
    let db = TestDb::new();
    let login = TestRole::new(&db, "gw", "NOINHERIT");
    let health = TestRole::new(&db, "health", "NOLOGIN");
    db.connect()
        .batch_execute(&format!(
            "SELECT streams.grant('read', 'pay.*', '{r}'); GRANT {r} TO {g};",
            r = health.name,
            g = login.name
        ))
        .unwrap();
    let gateway = Gateway::start(&db, &login.name, &["--health-role", &health.name]);
    let mut admin = db.connect();
    let asked = Instant::now();
    let (status, body) = gateway.request("GET", "/healthz", &[], "");
    assert_eq!(status, 200, "{body}");
    let answer = json(&body);
    assert_eq!(answer["worker"], "running", "{body}");
    assert!(answer.get("worker_pid").is_none(), "{body}");
    // The gateway may no longer ask as the health role: the next second's
    // answers are the cached one, then the refusal shows.
    admin.batch_execute(&format!("REVOKE {} FROM {}", health.name, login.name)).unwrap();
    let (status, body) = gateway.request("GET", "/healthz", &[], "");
    // Within the second, surely; a machine too loaded to get here in 0.9 s
    // cannot tell a cached answer from a new one.
    if asked.elapsed() < Duration::from_millis(900) {
        assert_eq!(status, 200, "not cached: {body}");
    }
    wait_until("/healthz asks again", Duration::from_secs(10), || gateway.request("GET", "/healthz", &[], "").0 != 200);
}

#[test]
fn json_pages_are_cut_at_max_page_bytes() {
    let s = Setup::publishing(&["--max-page-bytes", "250000"]);
    let mut client = s.db.connect();
    let big = format!(r#"{{"pad": "{}"}}"#, "x".repeat(100_000));
    let positions: Vec<i64> = (0..6).map(|_| publish(&mut client, "pay.big", &big)).collect();
    wait_for_horizon(&mut client, *positions.last().unwrap());
    let auth = format!("Bearer {}", token(&s.reader.name));
    let mut after = 0;
    let mut got = Vec::new();
    for _ in 0..3 {
        let (status, body) = s.gateway.request(
            "GET",
            &format!("/v1/streams/pay.*/events?after={after}&max_events=100"),
            &[("Authorization", &auth), ("Accept", "application/json")],
            "",
        );
        assert_eq!(status, 200);
        assert!(body.len() <= 250_000, "{} bytes", body.len());
        let page: Vec<Value> = serde_json::from_str(&body).unwrap();
        assert_eq!(page.len(), 2);
        got.extend(page.iter().map(|e| e["position"].as_i64().unwrap()));
        after = *got.last().unwrap();
    }
    assert_eq!(got, positions);
}

/// Whether a WebSocket subscription to `stream` was taken; the error message otherwise.
fn ws_subscribe(ws: &mut common::gateway::Ws, stream: &str) -> Result<(), Value> {
    ws.send(serde_json::json!({"type": "subscribe", "stream": stream}));
    let m = ws.next(Duration::from_secs(20)).expect("an answer to subscribe");
    match m["type"].as_str() {
        Some("subscribed") => Ok(()),
        Some("error") => Err(m),
        _ => panic!("neither subscribed nor an error: {m}"),
    }
}

/// One token holder's subscriptions open at most --max-topics-per-role
/// topics (the rest are told to retry, as for --max-topics), so another
/// role still gets one while the gateway-wide cap has room.
#[test]
fn one_role_cannot_take_every_topic() {
    let s = Setup::publishing(&["--max-topics", "8", "--max-topics-per-role", "2"]);
    let other = s.role("other", "SELECT streams.grant('read', 'pay.*', '{r}');");
    let greedy = token(&s.reader.name);
    let held: Vec<Sse> = ["pay.a", "pay.b"]
        .iter()
        .map(|stream| {
            let sse = s.gateway.sse(&format!("/v1/streams/{stream}/events"), Some(&greedy), None);
            assert_eq!(sse.status, 200, "{stream}");
            sse
        })
        .collect();
    let auth = format!("Bearer {greedy}");
    let answer =
        raw(s.gateway.port, "/v1/streams/pay.c/events", &[("Authorization", &auth), ("Accept", "text/event-stream")]);
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.0 200"), "{answer:?}");
    assert!(body.starts_with("retry: ") && body.contains("--max-topics-per-role"), "{body:?}");
    let mut ws = s.gateway.ws(&greedy);
    let refused = ws_subscribe(&mut ws, "pay.c").unwrap_err();
    assert_eq!(refused["status"], 503, "{refused}");
    assert!(refused["error"].as_str().unwrap().contains("--max-topics-per-role"), "{refused}");
    // The same patterns are not new topics: more clients of the role share them.
    ws_subscribe(&mut ws, "pay.a").unwrap();

    let t = token(&other.name);
    let mut theirs = s.gateway.sse("/v1/streams/pay.c/events", Some(&t), None);
    assert_eq!(theirs.status, 200);
    let p = publish(&mut s.db.connect(), "pay.c", r#"{"for": "other"}"#);
    assert_eq!(theirs.next(Duration::from_secs(15)).expect("the other role's event").id, Some(p));
    drop(held);
}

/// A topic closes about --topic-idle-ms (1 s by default) after its last
/// client left, not after its backed-off poll: the role's count drops with
/// it, and the role may open another at once.
#[test]
fn a_topic_closes_soon_after_its_last_client_leaves() {
    // --max-topics 4: by default each role holds at most one topic.
    let s = Setup::publishing(&["--max-topics", "4"]);
    let t = token(&s.reader.name);
    let sse = s.gateway.sse("/v1/streams/pay.a/events", Some(&t), None);
    assert_eq!(sse.status, 200);
    let mut ws = s.gateway.ws(&t);
    let refused = ws_subscribe(&mut ws, "pay.b").unwrap_err();
    assert!(refused["error"].as_str().unwrap().contains("--max-topics-per-role"), "{refused}");
    assert_eq!(s.gateway.metric("litebase_streams_gateway_topics"), 1.0);
    drop(sse);
    wait_until("the topic of the client that left closed", Duration::from_secs(5), || {
        s.gateway.metric("litebase_streams_gateway_topics") == 0.0
    });
    ws_subscribe(&mut ws, "pay.b").unwrap();
    let p = publish(&mut s.db.connect(), "pay.b", "{}");
    let m = ws.next(Duration::from_secs(15)).expect("an event on the new topic");
    assert_eq!((m["type"].as_str(), m["position"].as_i64()), (Some("event"), Some(p)), "{m}");
}

/// `exp`, `nbf` and `iat` must be integers: an `exp` past what the clock
/// holds, a float, or a string (which jsonwebtoken would skip, so a string
/// `nbf` hid a future one) gets 401, and the gateway goes on serving.
#[test]
fn tokens_with_huge_or_non_integer_times_get_401() {
    let s = Setup::publishing(&[]);
    let role = s.reader.name.as_str();
    let later = now() + 3600;
    let bad = [
        serde_json::json!({"role": role, "exp": 1u64 << 63}),
        serde_json::json!({"role": role, "exp": u64::MAX}),
        serde_json::json!({"role": role, "exp": 1e30}),
        serde_json::json!({"role": role, "exp": later.to_string()}),
        serde_json::json!({"role": role, "exp": later, "nbf": "99999999999"}),
        serde_json::json!({"role": role, "exp": later, "iat": now().to_string()}),
    ];
    let page = |t: &str| {
        let auth = format!("Bearer {t}");
        s.gateway.request(
            "GET",
            "/v1/streams/pay.*/events",
            &[("Authorization", &auth), ("Accept", "application/json")],
            "",
        )
    };
    for claims in &bad {
        let t = token_claims(claims.clone());
        let (status, body) = page(&t);
        assert_eq!(status, 401, "{claims}: {body}");
        assert!(json(&body)["error"].as_str().unwrap().starts_with("invalid token"), "{claims}: {body}");
        let sse = s.gateway.sse("/v1/streams/pay.*/events", Some(&t), None);
        assert_eq!(sse.status, 401, "{claims} over SSE");
        let url = format!("ws://127.0.0.1:{}/v1/ws?access_token={t}", s.gateway.port);
        match tungstenite::connect(url) {
            Err(tungstenite::Error::Http(response)) => assert_eq!(response.status(), 401, "{claims} over WebSocket"),
            other => panic!("{claims} over WebSocket: {:?}", other.map(|(_, r)| r.status())),
        }
    }
    let fine = token_claims(serde_json::json!({"role": role, "exp": later, "nbf": now() - 60, "iat": now() - 60}));
    let (status, body) = page(&fine);
    assert_eq!(status, 200, "{body}");
}
