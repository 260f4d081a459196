//! The gateway (gateway/, litebase-streams-gateway) against the real server,
//! started by the harness (tests/common/gateway.rs) for each test. It logs in
//! as a NOINHERIT role that is only a member of the roles its tokens name,
//! as the README recommends, so every test also checks that this is enough.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::thread;
use std::time::{Duration, Instant};

use common::gateway::{token, token_with, Gateway, Sse, SseEnd, SseEvent};
use common::{publish, wait_for_horizon, wait_until, TestDb, TestRole};
use serde_json::{json, Value};

/// The test that restarts the server holds this exclusively; the others share it.
static SERVER: RwLock<()> = RwLock::new(());

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    SERVER.read().unwrap_or_else(|e| e.into_inner())
}

/// A database, the gateway's own login role (NOINHERIT, member of `reader`),
/// a role `reader` that may read `pay.*`, and the gateway.
struct Setup {
    gateway: Gateway,
    reader: TestRole,
    login: TestRole,
    db: TestDb,
}

impl Setup {
    fn new(args: &[&str]) -> Setup {
        let db = TestDb::new();
        let login = TestRole::new(&db, "gw", "NOINHERIT");
        let reader = TestRole::new(&db, "reader", "NOLOGIN");
        db.connect()
            .batch_execute(&format!(
                "SELECT streams.grant('read', 'pay.*', '{r}'); GRANT {r} TO {g};",
                r = reader.name,
                g = login.name
            ))
            .unwrap();
        let gateway = Gateway::start(&db, &login.name, args);
        Setup { gateway, reader, login, db }
    }

    /// A NOLOGIN role the gateway may act as, with `grants` run for it
    /// (`{r}` stands for its name).
    fn role(&self, suffix: &str, grants: &str) -> TestRole {
        let role = TestRole::new(&self.db, suffix, "NOLOGIN");
        let sql = format!("{} GRANT {} TO {};", grants.replace("{r}", &role.name), role.name, self.login.name);
        self.db.connect().batch_execute(&sql).unwrap();
        role
    }

    /// Positions of the final events of streams starting with `prefix`, as the owner sees them.
    fn positions(&self, prefix: &str) -> Vec<i64> {
        self.db
            .connect()
            .query("SELECT position FROM streams.events WHERE starts_with(stream, $1) ORDER BY position", &[&prefix])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    }
}

/// Publishers on `streams`, in turn, until stopped; they reconnect after
/// errors (the server may be restarting). Which events committed is read
/// from the database afterwards.
struct Writers {
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<u64>>,
}

impl Writers {
    fn start(db: &TestDb, streams: &[&str]) -> Writers {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = streams
            .iter()
            .map(|stream| {
                let (stop, config, stream) = (stop.clone(), db.config(), stream.to_string());
                thread::spawn(move || {
                    let mut sent = 0u64;
                    let mut client = None;
                    while !stop.load(Ordering::Relaxed) {
                        let c = match client.as_mut() {
                            Some(c) => c,
                            None => match config.connect(postgres::NoTls) {
                                Ok(c) => client.insert(c),
                                Err(_) => {
                                    thread::sleep(Duration::from_millis(50));
                                    continue;
                                }
                            },
                        };
                        let data = format!(r#"{{"n": {sent}, "s": "{stream}"}}"#);
                        match c.execute("SELECT streams.publish($1, $2::text::jsonb)", &[&stream, &data]) {
                            Ok(_) => sent += 1,
                            Err(_) => client = None,
                        }
                        thread::sleep(Duration::from_millis(3));
                    }
                    sent
                })
            })
            .collect();
        Writers { stop, threads }
    }

    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.threads.into_iter().map(|t| t.join().unwrap()).sum()
    }
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

fn assert_exactly_once_in_order(received: &[i64], committed: &[i64], what: &str) {
    let unique: HashSet<_> = received.iter().collect();
    assert_eq!(unique.len(), received.len(), "{what}: duplicates in {received:?}");
    assert!(received.windows(2).all(|w| w[0] < w[1]), "{what}: out of order: {received:?}");
    assert_eq!(received, committed, "{what}: received vs committed");
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
    let mut owner = s.db.connect();
    let newest: i64 = owner.query_one("SELECT max(position) FROM streams.event_log", &[]).unwrap().get(0);
    wait_for_horizon(&mut owner, newest);
    let committed = s.positions("pay.");
    assert!(committed.len() as u64 >= sent, "every acknowledged publish committed");
    let last = *committed.last().unwrap();
    client.pump_until("the last committed event arrived", Duration::from_secs(30), |c| c.last() == Some(last));
    assert_exactly_once_in_order(&client.positions(), &committed, "SSE across restarts");
    let reconnects = s.gateway.metric("gateway_listen_reconnects_total");
    assert!(reconnects >= 1.0, "the gateway re-established LISTEN after the database restart");
}

#[test]
fn websocket_subscribes_to_two_patterns_and_unsubscribes_one() {
    let _shared = shared();
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

/// Reads a page of Chromium's DevTools protocol target list and evaluates
/// JavaScript in the page.
struct Browser {
    _child: KillOnDrop,
    page: tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<std::net::TcpStream>>,
    next_id: u64,
    _profile: TempDir,
}

/// A child process killed when dropped, also by a panic before it is in place.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Browser {
    fn open(url: &str) -> Browser {
        let profile = TempDir(std::env::temp_dir().join(format!("gateway-chromium-{}", std::process::id())));
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = std::process::Command::new("chromium")
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"])
            .arg("--disable-extensions")
            .arg(format!("--remote-debugging-port={port}"))
            .arg(format!("--user-data-dir={}", profile.0.display()))
            .arg(url)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map(KillOnDrop)
            .expect("chromium runs (Debian package chromium; make setup installs it)");
        let mut ws_url = None;
        wait_until("Chromium lists the page on its DevTools port", Duration::from_secs(30), || {
            let Some(body) = devtools_list(port) else { return false };
            let targets: Vec<Value> = serde_json::from_str(&body).unwrap_or_default();
            ws_url = targets
                .iter()
                .find(|t| t["type"] == "page" && t["url"].as_str().is_some_and(|u| u.starts_with("file:")))
                .and_then(|t| t["webSocketDebuggerUrl"].as_str().map(String::from));
            ws_url.is_some()
        });
        let (page, _) = tungstenite::connect(ws_url.unwrap()).unwrap();
        if let tungstenite::stream::MaybeTlsStream::Plain(s) = page.get_ref() {
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap(); // a dead browser fails the test, not hangs it
        }
        Browser { _child: child, page, next_id: 1, _profile: profile }
    }

    /// The value of a JavaScript expression in the page.
    fn eval(&mut self, expression: &str) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let call = json!({"id": id, "method": "Runtime.evaluate", "params": {"expression": expression, "returnByValue": true}});
        self.page.send(tungstenite::Message::Text(call.to_string().into())).unwrap();
        loop {
            if let tungstenite::Message::Text(t) = self.page.read().unwrap() {
                let reply: Value = serde_json::from_str(t.as_str()).unwrap();
                if reply["id"] == id {
                    return reply["result"]["result"]["value"].clone();
                }
            }
        }
    }
}

/// GET /json/list of Chromium's DevTools HTTP server (HTTP/1.1, Content-Length).
fn devtools_list(port: u16) -> Option<String> {
    use std::io::{BufRead, Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream.write_all(format!("GET /json/list HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n").as_bytes()).ok()?;
    let mut reader = std::io::BufReader::new(stream);
    let mut length = 0;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    String::from_utf8(body).ok()
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
fn privileges_decide_what_each_token_sees() {
    let _shared = shared();
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
    let unverified = gw.metric("gateway_unverified_notifications_total");
    let mut intruder = s.db.connect_as(&s.login.name);
    intruder
        .execute(
            "SELECT pg_notify('pay.a', $1), pg_notify('secret.plans', $2)",
            &[&forged.to_string(), &forged_secret.to_string()],
        )
        .unwrap();
    wait_until("the gateway received the forged notifications", Duration::from_secs(10), || {
        gw.metric("gateway_unverified_notifications_total") >= unverified + 2.0
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
        s.gateway.metric("gateway_slow_client_drops_total") >= 1.0
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

fn set_receive_buffer(socket: &std::net::TcpStream, bytes: i32) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid socket and a pointer to an int that outlives the call.
    let rc = unsafe {
        libc_setsockopt(
            socket.as_raw_fd(),
            1, /* SOL_SOCKET */
            8, /* SO_RCVBUF */
            &bytes as *const i32 as *const _,
            4,
        )
    };
    assert_eq!(rc, 0, "setsockopt SO_RCVBUF");
}

extern "C" {
    #[link_name = "setsockopt"]
    fn libc_setsockopt(fd: i32, level: i32, name: i32, value: *const std::ffi::c_void, len: u32) -> i32;
}

#[test]
fn bad_input_gets_the_documented_status() {
    let _shared = shared();
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
        ("GET", "/v1/streams/pay.*/events?after=1&since=now", &sse[..], "", 400, Some("22023")),
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

#[test]
fn a_websocket_that_falls_behind_is_closed_with_4008_and_resubscribes() {
    let _shared = shared();
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

/// Subscriptions open topics up to --max-topics, then get 503; a topic
/// whose last client left closes and UNLISTENs its channel, which makes room.
#[test]
fn topics_are_bounded_and_closed_topics_unlisten() {
    let _shared = shared();
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
    assert_eq!(gw.metric("gateway_listen_channels"), 2.0);
    ws.send(json!({"type": "subscribe", "stream": "pay.nothing3"}));
    let m = expect(&mut ws, "error");
    assert_eq!(m["status"], 503, "{m}");
    assert!(m["error"].as_str().unwrap().contains("--max-topics"), "{m}");
    ws.send(json!({"type": "unsubscribe", "stream": "pay.nothing1"}));
    expect(&mut ws, "unsubscribed");
    wait_until("the idle topic closed and UNLISTENed its channel", Duration::from_secs(20), || {
        gw.metric("gateway_topics") == 1.0 && gw.metric("gateway_listen_channels") == 1.0
    });
    ws.send(json!({"type": "subscribe", "stream": "pay.nothing3"}));
    expect(&mut ws, "subscribed");
    // Another role on the same stream shares the channel; it is UNLISTENed only when both topics closed.
    let other = s.role("other", "SELECT streams.grant('read', 'pay.*', '{r}');");
    ws.send(json!({"type": "unsubscribe", "stream": "pay.nothing2"}));
    expect(&mut ws, "unsubscribed");
    let mut ws2 = gw.ws(&token(&other.name));
    wait_until("the idle topic closed", Duration::from_secs(20), || gw.metric("gateway_topics") == 1.0);
    ws2.send(json!({"type": "subscribe", "stream": "pay.nothing3"}));
    expect(&mut ws2, "subscribed");
    assert_eq!((gw.metric("gateway_topics"), gw.metric("gateway_listen_channels")), (2.0, 1.0));
    ws.send(json!({"type": "unsubscribe", "stream": "pay.nothing3"}));
    expect(&mut ws, "unsubscribed");
    wait_until("one of the two topics on the channel closed", Duration::from_secs(20), || {
        gw.metric("gateway_topics") == 1.0
    });
    assert_eq!(gw.metric("gateway_listen_channels"), 1.0, "the other topic still uses the channel");
    // It still works: an event on it arrives.
    let position = publish(&mut s.db.connect(), "pay.nothing3", r#"{"late": true}"#);
    let m = expect(&mut ws2, "event");
    assert_eq!(m["position"], position);
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
    let before = s.gateway.metric("gateway_topic_replays_total");
    let started = Instant::now();
    // Without backoff, 2 s at 50 ms would be 40 replays; doubling from 50 ms it is 6.
    thread::sleep(Duration::from_secs(2));
    let replays = s.gateway.metric("gateway_topic_replays_total") - before;
    assert!(replays <= 10.0, "{replays} replays of an idle topic in {:?}", started.elapsed());
    // A stream the pattern had not met: found by a replay, then live.
    let mut owner = s.db.connect();
    let first = publish(&mut owner, "pay.fresh", "{}");
    assert_eq!(sse.next(Duration::from_secs(15)).expect("the new stream's event").id, Some(first));
    let second = publish(&mut owner, "pay.fresh", "{}");
    assert_eq!(sse.next(Duration::from_secs(5)).expect("the next event, promptly").id, Some(second));
}

/// After `streams.revoke`, a single-stream subscription forwards nothing
/// more: a notification is forwarded without a query only while the last
/// privilege check is younger than a poll interval; otherwise the gateway
/// checks again, finds the revocation and disconnects the client.
#[test]
fn a_revoked_read_privilege_stops_live_forwarding() {
    let _shared = shared();
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
    let checks = s.gateway.metric("gateway_privilege_checks_total");
    publish(&mut owner, "pay.a", r#"{"revoked": true}"#);
    let after = sse.drain_until_closed(Duration::from_secs(20));
    assert!(after.is_empty(), "nothing reaches the client after the revoke: {after:?}");
    assert!(s.gateway.metric("gateway_privilege_checks_total") > checks, "the gateway checked again");
    let again = s.gateway.sse("/v1/streams/pay.a/events", Some(&token(&fickle.name)), Some(granted));
    assert_eq!(again.status, 403);
}

/// Forged notifications (from a role that may only connect) cost neither
/// memory nor load: they are not stored, and the replays they force come at
/// most once per poll interval. The next real event still arrives.
#[test]
fn forged_notifications_are_not_stored_and_force_few_replays() {
    let _shared = shared();
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
    let replays_before = s.gateway.metric("gateway_topic_replays_total");
    let unverified = s.gateway.metric("gateway_unverified_notifications_total");
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
        s.gateway.metric("gateway_unverified_notifications_total") >= unverified + forged as f64
    });
    let secs = started.elapsed().as_secs_f64();
    let replays = s.gateway.metric("gateway_topic_replays_total") - replays_before;
    let growth_kb = s.gateway.memory_kb("VmHWM").saturating_sub(peak_before);
    // Two topics, one forced replay each per second at most (plus the one in progress).
    assert!(replays <= 2.0 * (secs + 2.0), "{replays} replays for {forged} forged notifications in {secs:.1} s");
    assert!(growth_kb < 16 * 1024, "{forged} forged 7.9 kB notifications grew the peak memory by {growth_kb} kB");
    let sentinel = publish(&mut owner, "pay.a", r#"{"sentinel": true}"#);
    assert_eq!(exact.next(Duration::from_secs(10)).unwrap().id, Some(sentinel));
    assert_eq!(pattern.next(Duration::from_secs(10)).unwrap().id, Some(sentinel));
}
