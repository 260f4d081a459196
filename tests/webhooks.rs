//! Webhooks: every committed event of a stream POSTed to an HTTP endpoint,
//! signed so that the Standard Webhooks reference verifier accepts it, in
//! position order, retried until delivered, and never to a host the address
//! policy refuses. The endpoint is tests/webhook_receiver.py, a real HTTP
//! server on 127.0.0.1 (tests/common/webhooks.rs).

mod common;

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use common::webhooks::{Behaviour, Receiver, SECRET};
use common::*;
use postgres::Client;

// --- helpers -----------------------------------------------------------------

/// Server-wide webhook settings for these tests: 127.0.0.1 allowed (the
/// receiver), short backoffs (so five failures take about a second) and a
/// 5 s request timeout. Shared by the tests that run at the same time, reset
/// when the last one ends.
struct LocalEndpoints;

const SETTINGS: [(&str, &str); 4] = [
    ("litebase_streams.webhook_allowed_hosts", "127.0.0.1"),
    ("litebase_streams.webhook_retry_min", "50"),
    ("litebase_streams.webhook_retry_max", "400"),
    ("litebase_streams.webhook_timeout", "5000"),
];

/// The settings' current holder; its lock orders setting against resetting.
static SHARED: Mutex<Weak<LocalEndpoints>> = Mutex::new(Weak::new());

fn local_endpoints() -> Arc<LocalEndpoints> {
    let mut shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(live) = shared.upgrade() {
        return live;
    }
    let mut admin = admin();
    for (name, value) in SETTINGS {
        admin.batch_execute(&format!("ALTER SYSTEM SET {name} = '{value}'")).unwrap();
    }
    admin.batch_execute("SELECT pg_reload_conf()").unwrap();
    // A session started after the postmaster reloaded sees the new values.
    wait_until("the webhook settings are loaded", Duration::from_secs(10), || {
        let value: String =
            common::admin().query_one("SHOW litebase_streams.webhook_allowed_hosts", &[]).unwrap().get(0);
        value == "127.0.0.1"
    });
    let live = Arc::new(LocalEndpoints);
    *shared = Arc::downgrade(&live);
    live
}

/// A throwaway cluster with `settings` (for server-wide webhook settings
/// of a test's own, and crashes), a database `app` with the extension and
/// its worker running, and a connection to it.
fn scratch_cluster(name: &str, settings: &[&str]) -> (ScratchCluster, Client) {
    let mut all = vec!["shared_preload_libraries = 'litebase_streams'", "track_commit_timestamp = on"];
    all.extend_from_slice(settings);
    let cluster = ScratchCluster::start(name, &all);
    cluster.connect("postgres").batch_execute("CREATE DATABASE app").unwrap();
    let mut c = cluster.connect("app");
    c.batch_execute("CREATE EXTENSION litebase_streams").unwrap();
    cluster.wait_for_worker("app");
    (cluster, c)
}

impl Drop for LocalEndpoints {
    fn drop(&mut self) {
        let shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
        if shared.upgrade().is_some() {
            // A test started meanwhile set them again and holds them now.
            return;
        }
        let mut admin = admin();
        for (name, _) in SETTINGS {
            let _ = admin.batch_execute(&format!("ALTER SYSTEM RESET {name}"));
        }
        let _ = admin.batch_execute("SELECT pg_reload_conf()");
    }
}

/// One row of `streams.webhooks`.
#[derive(Debug, Clone, PartialEq)]
struct State {
    state: String,
    position: i64,
    pending: i64,
    attempts: i32,
    last_status: Option<i32>,
    last_error: Option<String>,
}

fn state(c: &mut Client, name: &str) -> State {
    let row = c
        .query_one(
            "SELECT state, position, pending, attempts, last_status, last_error FROM streams.webhooks WHERE name = $1",
            &[&name],
        )
        .unwrap_or_else(|e| panic!("webhook {name}: {e:?}"));
    State {
        state: row.get(0),
        position: row.get(1),
        pending: row.get(2),
        attempts: row.get(3),
        last_status: row.get(4),
        last_error: row.get(5),
    }
}

fn wait_for_state(c: &mut Client, name: &str, what: &str, mut condition: impl FnMut(&State) -> bool) -> State {
    let mut last = None;
    wait_until(&format!("webhook {name}: {what}"), Duration::from_secs(30), || {
        let now = state(c, name);
        let done = condition(&now);
        last = Some(now);
        done
    });
    last.unwrap()
}

fn create_webhook(c: &mut Client, name: &str, stream: &str, url: &str) {
    c.query_one("SELECT streams.create_webhook($1, $2, $3, secret => $4)", &[&name, &stream, &url, &SECRET])
        .unwrap_or_else(|e| panic!("create_webhook {name}: {e:?}"));
}

/// Publish one event per transaction; their positions, once final.
fn publish_each(c: &mut Client, stream: &str, count: usize) -> Vec<i64> {
    let positions: Vec<i64> = (0..count).map(|n| publish(c, stream, &format!(r#"{{"n": {n}}}"#))).collect();
    wait_for_horizon(c, *positions.last().unwrap());
    positions
}

// --- delivery ----------------------------------------------------------------

/// Every event of the webhook's streams arrives once, in order, signed, with
/// its full data (private streams' too: the webhook is its owner's own
/// delivery), and nothing of other streams; one event per request, or a
/// JSON array of up to `batch`.
#[test]
fn every_event_reaches_its_endpoint_once_in_order_and_signed() {
    let _settings = local_endpoints();
    let receiver = Receiver::start();
    receiver.configure("/one", Behaviour::signed(SECRET));
    receiver.configure("/batched", Behaviour::signed(SECRET));
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute("SELECT streams.set_private('orders.secret')").unwrap();
    create_webhook(&mut c, "one", "orders.*", &receiver.url("/one"));
    c.query_one(
        "SELECT streams.create_webhook('batched', 'orders.*', $1, secret => $2, batch => 7)",
        &[&receiver.url("/batched"), &SECRET],
    )
    .unwrap();

    let big = format!(r#"{{"blob": "{}"}}"#, "x".repeat(20_000)); // beyond what a notification carries
    let mut expected = Vec::new();
    for n in 0..30 {
        let stream = ["orders.paid", "orders.secret", "other"][n % 3];
        let data = if n == 4 { big.clone() } else { format!(r#"{{"n": {n}, "amount": 49.00}}"#) };
        let position = publish(&mut c, stream, &data);
        if stream != "other" {
            expected.push((position, stream, data));
        }
    }
    wait_for_horizon(&mut c, expected.last().unwrap().0);
    let positions: Vec<i64> = expected.iter().map(|e| e.0).collect();

    for path in ["/one", "/batched"] {
        assert_eq!(receiver.wait_for_delivered(path, positions.len(), Duration::from_secs(30)), positions, "{path}");
        let requests = receiver.requests(path);
        assert!(requests.iter().all(|r| r.succeeded()), "{path}: no failed attempt expected");
        for request in &requests {
            assert_eq!(request.verified, Some(true), "{path}: {:?}", request.verify_error);
            assert_eq!(request.content_type.as_deref(), Some("application/json"));
        }
        let events: Vec<serde_json::Value> = requests
            .iter()
            .flat_map(|r| match &r.body {
                serde_json::Value::Array(events) => events.clone(),
                single => vec![single.clone()],
            })
            .collect();
        for (event, (position, stream, data)) in events.iter().zip(&expected) {
            assert_eq!(event["position"].as_i64(), Some(*position));
            assert_eq!(event["stream"].as_str(), Some(*stream));
            let sent: serde_json::Value = serde_json::from_str(data).unwrap();
            assert_eq!(event["data"], sent, "{path}: the full data of {position}, private or large");
            assert!(event.get("truncated").is_none() && event.get("private").is_none());
        }
        let mut ids: Vec<&str> = requests.iter().map(|r| r.webhook_id.as_deref().unwrap()).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), requests.len(), "{path}: one webhook-id per request");
    }
    assert_eq!(receiver.requests("/one").len(), positions.len(), "one request per event");
    assert!(receiver.requests("/batched").len() < positions.len(), "batches carry several events");
    assert!(receiver.requests("/batched").iter().all(|r| r.body.is_array() && r.positions().len() <= 7));
    let done = wait_for_state(&mut c, "one", "caught up", |s| s.pending == 0);
    assert!(done.position >= positions[19], "{done:?}");
    assert_eq!((done.state.as_str(), done.last_status), ("active", Some(200)));
}

/// Five 500s, then 200: the same event (the same webhook-id) is retried
/// until it is delivered, the view shows the attempts meanwhile, and the
/// events after it follow in order.
#[test]
fn a_failing_endpoint_gets_the_same_event_until_it_succeeds() {
    let _settings = local_endpoints();
    let receiver = Receiver::start();
    receiver.configure("/flaky", Behaviour { fail_first: 5, fail_status: 500, ..Behaviour::signed(SECRET) });
    let db = TestDb::new();
    let mut c = db.connect();
    create_webhook(&mut c, "flaky", "payments", &receiver.url("/flaky"));
    let positions = publish_each(&mut c, "payments", 3);

    let retrying = wait_for_state(&mut c, "flaky", "retrying after a 500", |s| s.state == "retrying");
    assert_eq!(retrying.last_status, Some(500));
    assert!(retrying.attempts >= 1 && retrying.last_error.as_deref().unwrap_or("").contains("500"), "{retrying:?}");
    assert_eq!(retrying.position, positions[0] - 1, "nothing is delivered while the first event fails");

    assert_eq!(receiver.wait_for_delivered("/flaky", 3, Duration::from_secs(30)), positions);
    let requests = receiver.requests("/flaky");
    assert_eq!(requests.len(), 8, "5 failures and 3 deliveries: {requests:?}");
    let first_id = requests[0].webhook_id.clone();
    assert!(requests[..6].iter().all(|r| r.webhook_id == first_id && r.positions() == [positions[0]]));
    assert!(requests.iter().all(|r| r.verified == Some(true)));
    let done = wait_for_state(&mut c, "flaky", "active again", |s| s.state == "active");
    assert_eq!((done.attempts, done.last_status, done.last_error), (0, Some(200), None));
}

/// The endpoint is down for ten seconds while events are published: they
/// all arrive once it is back, once each, in order.
#[test]
fn an_endpoint_down_for_ten_seconds_loses_nothing() {
    let _settings = local_endpoints();
    let receiver = Receiver::start();
    receiver.configure("/down", Behaviour::signed(SECRET));
    let db = TestDb::new();
    let mut c = db.connect();
    create_webhook(&mut c, "down", "payments", &receiver.url("/down"));
    let before = publish_each(&mut c, "payments", 2);
    receiver.wait_for_delivered("/down", 2, Duration::from_secs(30));

    receiver.stop();
    let down_since = std::time::Instant::now();
    let mut during = publish_each(&mut c, "payments", 3);
    let failing = wait_for_state(&mut c, "down", "failing to connect", |s| s.attempts >= 2);
    assert_eq!(failing.last_status, None, "no response at all: {failing:?}");
    during.extend(publish_each(&mut c, "payments", 3));
    std::thread::sleep(Duration::from_secs(10).saturating_sub(down_since.elapsed()));
    receiver.start_again();

    let all: Vec<i64> = before.iter().chain(&during).copied().collect();
    assert_eq!(receiver.wait_for_delivered("/down", all.len(), Duration::from_secs(30)), all);
    wait_for_state(&mut c, "down", "caught up", |s| s.state == "active" && s.pending == 0);
    assert_eq!(receiver.delivered("/down"), all, "nothing twice");
}

/// One webhook's endpoint hangs; another webhook's
/// endpoint, and LISTEN, get every event meanwhile: the hanging request is
/// still open when they are done.
#[test]
fn a_slow_endpoint_holds_back_neither_other_webhooks_nor_listen() {
    let receiver = Receiver::start();
    receiver.configure("/slow", Behaviour { sleep: 90.0, ..Behaviour::signed(SECRET) });
    receiver.configure("/fast", Behaviour::signed(SECRET));
    // A request timeout far longer than a loaded machine needs for the rest,
    // so that the slow request is still open when the others are done.
    let (cluster, mut c) = scratch_cluster(
        "webhooks-slow",
        &["litebase_streams.webhook_allowed_hosts = '127.0.0.1'", "litebase_streams.webhook_timeout = 60000"],
    );
    create_webhook(&mut c, "slow", "ticks", &receiver.url("/slow"));
    create_webhook(&mut c, "fast", "ticks", &receiver.url("/fast"));
    let mut listener = Listener::on(cluster.connect("app"), &["ticks"]);
    let positions = publish_each(&mut c, "ticks", 20);

    assert_eq!(receiver.wait_for_delivered("/fast", 20, Duration::from_secs(30)), positions);
    assert_eq!(listener.positions(20, Duration::from_secs(10)), positions);
    let slow = state(&mut c, "slow");
    assert_eq!(
        (receiver.requests("/slow").len(), slow.attempts, slow.position),
        (1, 0, positions[0] - 1),
        "the slow endpoint's first request is still open (it times out after 60 s): {slow:?}"
    );
}

/// 410 Gone disables the webhook at once; resume_webhook delivers again
/// from where it stopped.
#[test]
fn gone_disables_and_resume_continues_where_it_stopped() {
    let _settings = local_endpoints();
    let receiver = Receiver::start();
    receiver.configure("/gone", Behaviour { fail_first: 1, fail_status: 410, ..Behaviour::signed(SECRET) });
    let db = TestDb::new();
    let mut c = db.connect();
    create_webhook(&mut c, "gone", "payments", &receiver.url("/gone"));
    let positions = publish_each(&mut c, "payments", 3);

    let disabled = wait_for_state(&mut c, "gone", "disabled by 410", |s| s.state == "disabled");
    assert_eq!(disabled.last_status, Some(410));
    assert!(disabled.last_error.as_deref().unwrap_or("").contains("410"), "{disabled:?}");
    assert_eq!(receiver.requests("/gone").len(), 1, "a disabled webhook sends nothing more");

    c.batch_execute("SELECT streams.resume_webhook('gone')").unwrap();
    assert_eq!(receiver.wait_for_delivered("/gone", 3, Duration::from_secs(30)), positions);
    let requests = receiver.requests("/gone");
    assert_eq!(requests[0].webhook_id, requests[1].webhook_id, "the same event, the same id");
    wait_for_state(&mut c, "gone", "active after resume", |s| s.state == "active" && s.pending == 0);

    c.batch_execute("SELECT streams.pause_webhook('gone')").unwrap();
    assert_eq!(state(&mut c, "gone").state, "paused");
    let later = publish_each(&mut c, "payments", 2);
    wait_for_state(&mut c, "gone", "two events pending while paused", |s| s.pending == 2);
    c.batch_execute("SELECT streams.resume_webhook('gone')").unwrap();
    let all: Vec<i64> = positions.iter().chain(&later).copied().collect();
    assert_eq!(receiver.wait_for_delivered("/gone", 5, Duration::from_secs(30)), all);
}

/// The server crashes (immediate stop) while a request is in flight: after
/// the restart the webhook goes on from its durable position, repeating
/// only the event that was in flight.
#[test]
fn a_crash_mid_delivery_repeats_at_most_the_request_in_flight() {
    let receiver = Receiver::start();
    receiver.configure("/crash", Behaviour::signed(SECRET));
    let (cluster, mut c) = scratch_cluster(
        "webhooks-crash",
        &[
            "litebase_streams.webhook_allowed_hosts = '127.0.0.1'",
            "litebase_streams.webhook_retry_min = 50",
            "litebase_streams.webhook_retry_max = 400",
        ],
    );
    create_webhook(&mut c, "crash", "orders", &receiver.url("/crash"));
    let delivered = publish_each(&mut c, "orders", 3);
    receiver.wait_for_delivered("/crash", 3, Duration::from_secs(30));

    receiver.configure("/crash", Behaviour { sleep: 30.0, ..Behaviour::signed(SECRET) });
    let rest = publish_each(&mut c, "orders", 3);
    wait_until("the fourth event is in flight", Duration::from_secs(30), || receiver.requests("/crash").len() == 4);
    receiver.configure("/crash", Behaviour::signed(SECRET)); // for the requests after the crash
    cluster.restart("immediate");
    cluster.wait_for_worker("app");

    let mut c = cluster.connect("app");
    wait_until("the webhook caught up after the crash", Duration::from_secs(30), || {
        receiver.delivered("/crash").len() >= 6
    });
    wait_for_state(&mut c, "crash", "caught up", |s| s.pending == 0 && s.state == "active");
    let sent: Vec<Vec<i64>> = receiver.requests("/crash").iter().map(|r| r.positions()).collect();
    let expected: Vec<Vec<i64>> =
        [&delivered[..], &rest[..1], &rest[..]].concat().into_iter().map(|p| vec![p]).collect();
    assert_eq!(sent, expected, "only the event in flight at the crash came twice");
}

/// A batch retried after a crash is the same request (issue 22): the same
/// events under the same `webhook-id`, which is what a Standard Webhooks
/// receiver dedupes by, although more events were published meanwhile and
/// would fit the batch. Then the rest follows, each event once more at
/// most.
#[test]
fn a_batch_retried_after_a_crash_keeps_its_events_and_its_id() {
    let receiver = Receiver::start();
    receiver.configure("/batch", Behaviour { sleep: 30.0, ..Behaviour::signed(SECRET) });
    let (cluster, mut c) = scratch_cluster(
        "webhooks-batch-crash",
        &["litebase_streams.webhook_allowed_hosts = '127.0.0.1'", "litebase_streams.webhook_retry_min = 50"],
    );
    c.query_one(
        "SELECT streams.create_webhook('batch', 'orders', $1, secret => $2, batch => 50)",
        &[&receiver.url("/batch"), &SECRET],
    )
    .unwrap();
    // One transaction, so that the first request carries all three.
    c.batch_execute("BEGIN").unwrap();
    let first: Vec<i64> = (0..3).map(|n| publish(&mut c, "orders", &format!(r#"{{"n": {n}}}"#))).collect();
    c.batch_execute("COMMIT").unwrap();
    wait_until("the first batch is in flight", Duration::from_secs(30), || receiver.requests("/batch").len() == 1);
    let rest = publish_each(&mut c, "orders", 3);
    receiver.configure("/batch", Behaviour::signed(SECRET));
    cluster.restart("immediate");
    cluster.wait_for_worker("app");

    let mut c = cluster.connect("app");
    wait_until("the rest is delivered", Duration::from_secs(30), || receiver.delivered("/batch").len() >= 6);
    wait_for_state(&mut c, "batch", "caught up", |s| s.pending == 0);
    let requests = receiver.requests("/batch");
    assert!(requests.len() >= 3, "{requests:?}");
    let (lost, retried) = (&requests[0], &requests[1]);
    assert_eq!(lost.positions(), first, "the request in flight at the crash");
    assert_eq!(retried.positions(), first, "its retry carries the same events");
    assert_eq!(retried.webhook_id, lost.webhook_id, "and the same webhook-id");
    let after: Vec<i64> = requests[2..].iter().flat_map(|r| r.positions()).collect();
    assert_eq!(after, rest, "then the rest, once");
}

// --- refusals ----------------------------------------------------------------

/// Bad URLs, refused hosts, bad secrets and names: each its SQLSTATE, and
/// nothing created.
#[test]
fn bad_arguments_fail_with_their_sqlstate_and_create_nothing() {
    let _settings = local_endpoints();
    let db = TestDb::new();
    let mut c = db.connect();
    let create = |c: &mut Client, name: &str, url: &str, secret: Option<&str>, batch: i32| {
        c.query_one(
            "SELECT streams.create_webhook($1, 'orders', $2, secret => $3, batch => $4)",
            &[&name, &url, &secret, &batch],
        )
        .map(drop)
    };
    for (url, why) in [
        ("http://10.0.0.1/hook", "a private address"),
        ("http://169.254.169.254/latest/meta-data", "the cloud metadata address"),
        ("http://[::1]:8080/", "IPv6 loopback"),
        ("http://localhost:8080/", "a local name"),
        ("http://127.0.0.2:8080/", "loopback, but not the allowed address"),
        ("ftp://127.0.0.1/", "not http"),
        ("javascript:alert(1)", "not http"),
        ("not a url", "malformed"),
        ("https://user:pw@example.com/", "credentials"),
        ("", "empty"),
    ] {
        let error = create(&mut c, "w", url, None, 1).expect_err(url);
        assert_eq!(sqlstate(&error), "22023", "{url} ({why}): {error:?}");
    }
    for (secret, batch, code) in
        [(Some("abc"), 1, "22023"), (Some("whsec_c2hvcnQ="), 1, "22023"), (None, 0, "22023"), (None, 1001, "22023")]
    {
        let error = create(&mut c, "w", "http://127.0.0.1:9/", secret, batch).expect_err("bad secret or batch");
        assert_eq!(sqlstate(&error), code, "{secret:?} {batch}");
    }
    let error = create(&mut c, "bad name", "http://127.0.0.1:9/", None, 1).unwrap_err();
    assert_eq!(sqlstate(&error), "22023");
    for (sql, code) in [
        ("SELECT streams.create_webhook('w', 'bad pattern', 'http://127.0.0.1:9/')", "22023"),
        ("SELECT streams.create_webhook('w', 'orders', NULL)", "22004"),
        ("SELECT streams.pause_webhook('nope')", "42704"),
        ("SELECT streams.resume_webhook('nope')", "42704"),
    ] {
        assert_eq!(sqlstate(&c.batch_execute(sql).unwrap_err()), code, "{sql}");
    }
    let dropped: bool = c.query_one("SELECT streams.drop_webhook('nope')", &[]).unwrap().get(0);
    assert!(!dropped);
    let counts: (i64, i64) = {
        let row = c
            .query_one(
                "SELECT (SELECT count(*) FROM streams.webhooks), (SELECT count(*) FROM streams.subscription_state)",
                &[],
            )
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(counts, (0, 0), "nothing created");

    create(&mut c, "w", "http://127.0.0.1:9/", None, 1).unwrap();
    assert_eq!(sqlstate(&create(&mut c, "w", "http://127.0.0.1:9/", None, 1).unwrap_err()), "42710");
}

/// The address policy also holds when the worker connects: with loopback
/// no longer allowed, a webhook to a name that resolves to loopback gets no
/// request through. Its owner learns that the address is not allowed, not
/// which address the name resolves to (how internal names resolve is for the
/// server's operator, who finds it in the server log).
#[test]
fn the_worker_refuses_an_address_the_policy_no_longer_allows() {
    let receiver = Receiver::start();
    receiver.configure("/late", Behaviour::signed(SECRET));
    let (cluster, mut c) = scratch_cluster(
        "webhooks-policy",
        &["litebase_streams.webhook_allowed_hosts = 'localhost'", "litebase_streams.webhook_retry_min = 50"],
    );
    let url = receiver.url("/late").replace("127.0.0.1", "localhost");
    create_webhook(&mut c, "late", "orders", &url);
    c.batch_execute("ALTER SYSTEM SET litebase_streams.webhook_allowed_hosts = ''").unwrap();
    c.batch_execute("SELECT pg_reload_conf()").unwrap();
    wait_until("the setting is reloaded", Duration::from_secs(10), || {
        let value: String =
            cluster.connect("app").query_one("SHOW litebase_streams.webhook_allowed_hosts", &[]).unwrap().get(0);
        value.is_empty()
    });
    publish_each(&mut c, "orders", 1);
    let refused = wait_for_state(&mut c, "late", "refused at connection", |s| s.attempts >= 2);
    let error = refused.last_error.clone().unwrap_or_default();
    assert!(error.contains("is not allowed"), "{refused:?}");
    assert!(!error.contains("127.0.0.1") && !error.contains("::1"), "last_error names no resolved address: {error}");
    assert!(receiver.requests("/late").is_empty(), "no request reached loopback");
    wait_until("the server log names the refused address", Duration::from_secs(10), || {
        cluster.server_log().contains("address policy refused a request: localhost resolves to")
    });
}

// --- privileges --------------------------------------------------------------

/// Creating a webhook takes EXECUTE on create_webhook and read on every
/// stream of its pattern. Another role cannot see the secret or the
/// webhook, manage it, poll its subscription, or widen the host list; and
/// when its owner loses the read privilege, delivery stops.
#[test]
fn other_roles_cannot_create_see_steer_or_widen_webhooks() {
    let _settings = local_endpoints();
    let receiver = Receiver::start();
    receiver.configure("/alice", Behaviour::signed(SECRET));
    let db = TestDb::new();
    let mut owner = db.connect();
    let alice = TestRole::new(&db, "alice", "");
    let mallory = TestRole::new(&db, "mallory", "");
    owner
        .batch_execute(&format!(
            "SELECT streams.grant('read', 'orders.*', '{a}');
             SELECT streams.grant('read', '*', '{m}');
             GRANT EXECUTE ON FUNCTION streams.create_webhook(text, text, text, bigint, text, integer) TO {a};",
            a = alice.name,
            m = mallory.name
        ))
        .unwrap();
    let mut a = db.connect_as(&alice.name);
    let mut m = db.connect_as(&mallory.name);

    let denied = m.batch_execute("SELECT streams.create_webhook('m', '*', 'https://example.com/')").unwrap_err();
    assert_eq!(sqlstate(&denied), "42501", "no EXECUTE on create_webhook");
    let uncovered = a.batch_execute("SELECT streams.create_webhook('a', '*', 'https://example.com/')").unwrap_err();
    assert_eq!(sqlstate(&uncovered), "42501", "read on orders.* does not cover *");
    create_webhook(&mut a, "alice", "orders.*", &receiver.url("/alice"));

    for sql in [
        "SELECT secret FROM streams.webhook_state",
        "SELECT streams.pause_webhook('alice')",
        "SELECT streams.resume_webhook('alice')",
        "SELECT streams.drop_webhook('alice')",
        "SELECT streams.seek('alice', after => 0)",
        "SELECT * FROM streams.poll('alice')",
        "ALTER SYSTEM SET litebase_streams.webhook_allowed_hosts = '0.0.0.0/0'",
    ] {
        assert_eq!(sqlstate(&m.batch_execute(sql).unwrap_err()), "42501", "mallory: {sql}");
    }
    assert_eq!(
        sqlstate(&m.batch_execute("SET litebase_streams.webhook_allowed_hosts = '0.0.0.0/0'").unwrap_err()),
        "55P02",
        "a server-wide setting"
    );
    let seen: i64 = m.query_one("SELECT count(*) FROM streams.webhooks", &[]).unwrap().get(0);
    assert_eq!(seen, 0, "mallory sees no webhook of alice's");
    for sql in ["SELECT * FROM streams.poll('alice')", "SELECT streams.drop_subscription('alice')"] {
        assert_eq!(sqlstate(&a.batch_execute(sql).unwrap_err()), "42809", "alice: {sql}");
    }
    let columns: Vec<String> = a
        .query(
            "SELECT attname::text FROM pg_attribute WHERE attrelid = 'streams.webhooks'::regclass AND attnum > 0",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(!columns.iter().any(|c| c.contains("secret")), "the view never shows the secret: {columns:?}");

    let first = publish_each(&mut owner, "orders.eu", 2);
    assert_eq!(receiver.wait_for_delivered("/alice", 2, Duration::from_secs(30)), first);
    owner.batch_execute(&format!("SELECT streams.revoke('read', 'orders.*', '{}')", alice.name)).unwrap();
    publish_each(&mut owner, "orders.eu", 2);
    let disabled = wait_for_state(&mut owner, "alice", "disabled once alice may not read", |s| s.state == "disabled");
    let error = disabled.last_error.unwrap_or_default();
    assert!(error.contains("may no longer read") || error.contains("permission denied"), "{error}");
    assert_eq!(receiver.delivered("/alice"), first, "nothing after the revoke reached alice's endpoint");
}

// --- lifecycle ---------------------------------------------------------------

/// DROP EXTENSION and DROP DATABASE go through while the webhook worker
/// runs with a request in flight, and the worker leaves.
#[test]
fn drop_extension_and_drop_database_work_with_webhooks_in_flight() {
    let _settings = local_endpoints();
    let receiver = Receiver::start();
    receiver.configure("/hang", Behaviour { sleep: 30.0, ..Behaviour::default() });
    let db = TestDb::new();
    let mut c = db.connect();
    let webhook_workers = |db: &TestDb| -> i64 {
        admin()
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'litebase_streams webhooks' AND datname = $1",
                &[&db.name],
            )
            .unwrap()
            .get(0)
    };
    for round in 0..2 {
        create_webhook(&mut c, "hang", "orders", &receiver.url("/hang"));
        publish_each(&mut c, "orders", 1);
        wait_until("a request is in flight", Duration::from_secs(30), || receiver.requests("/hang").len() == round + 1);
        assert_eq!(webhook_workers(&db), 1);
        if round == 0 {
            c.batch_execute("DROP EXTENSION litebase_streams").unwrap();
            wait_until("the webhook worker left", Duration::from_secs(30), || webhook_workers(&db) == 0);
            c.batch_execute("CREATE EXTENSION litebase_streams").unwrap();
            db.wait_for_worker();
        }
    }
    drop(c);
    admin().batch_execute(&format!("DROP DATABASE {}", db.name)).unwrap();
    assert_eq!(webhook_workers(&db), 0);
}

// --- bounds against a hostile webhook owner ------------------------------------

/// However many webhooks hang, the worker has at most
/// `webhook_max_concurrency` requests (threads) in flight; the rest wait
/// their turn and are delivered once the hanging ones end.
#[test]
fn requests_in_flight_are_bounded_by_webhook_max_concurrency() {
    let receiver = Receiver::start();
    receiver.configure("/hang", Behaviour { sleep: 6.0, ..Behaviour::default() });
    let (_cluster, mut c) = scratch_cluster(
        "webhooks-concurrency",
        &["litebase_streams.webhook_allowed_hosts = '127.0.0.1'", "litebase_streams.webhook_max_concurrency = 2"],
    );
    for n in 0..6 {
        create_webhook(&mut c, &format!("hang{n}"), "orders", &receiver.url("/hang"));
    }
    publish_each(&mut c, "orders", 1);
    wait_until("two requests hang", Duration::from_secs(30), || receiver.requests("/hang").len() == 2);
    let pid: i32 = c
        .query_one("SELECT pid FROM pg_stat_activity WHERE backend_type = 'litebase_streams webhooks'", &[])
        .unwrap()
        .get(0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let threads: usize = status.lines().find_map(|l| l.strip_prefix("Threads:")).unwrap().trim().parse().unwrap();
    assert!(threads <= 3, "the main thread and at most 2 request threads: {threads}");
    assert_eq!(receiver.requests("/hang").len(), 2, "the other four wait for a free slot");
    wait_until("all six are delivered", Duration::from_secs(60), || receiver.delivered("/hang").len() == 6);
}

/// A webhook owner that keeps its webhook's rows locked (pause_webhook in
/// a transaction left open) delays only that webhook: another owner's
/// webhook goes on being delivered.
#[test]
fn a_webhook_locked_by_its_owner_does_not_stall_the_others() {
    let _settings = local_endpoints();
    let receiver = Receiver::start();
    receiver.configure("/locked", Behaviour { sleep: 0.5, ..Behaviour::default() });
    receiver.configure("/other", Behaviour::default());
    let db = TestDb::new();
    let mut c = db.connect();
    create_webhook(&mut c, "locked", "a", &receiver.url("/locked"));
    create_webhook(&mut c, "other", "b", &receiver.url("/other"));
    publish_each(&mut c, "a", 1);
    wait_until("the locked webhook's request is in flight", Duration::from_secs(30), || {
        receiver.requests("/locked").len() == 1
    });
    let mut holder = db.connect();
    holder.batch_execute("BEGIN; SELECT streams.pause_webhook('locked')").unwrap();
    let positions = publish_each(&mut c, "b", 5);
    assert_eq!(receiver.wait_for_delivered("/other", 5, Duration::from_secs(30)), positions);
    holder.batch_execute("ROLLBACK").unwrap();
    wait_for_state(&mut c, "locked", "its outcome recorded once the lock is gone", |s| s.pending == 0);
}

/// A transaction that creates many webhooks starts no background worker
/// itself (it could fill every slot while it stays open); after it commits,
/// one webhook worker serves them all.
#[test]
fn creating_many_webhooks_in_one_transaction_starts_one_worker_after_commit() {
    let _settings = local_endpoints();
    let receiver = Receiver::start();
    receiver.configure("/many", Behaviour::default());
    let db = TestDb::new();
    let mut c = db.connect();
    let webhook_workers = || -> i64 {
        admin()
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'litebase_streams webhooks' AND datname = $1",
                &[&db.name],
            )
            .unwrap()
            .get(0)
    };
    let mut tx = db.connect();
    tx.batch_execute("BEGIN").unwrap();
    tx.query(
        "SELECT streams.create_webhook('many' || n, 'orders', $1) FROM generate_series(1, 40) n",
        &[&receiver.url("/many")],
    )
    .unwrap();
    assert_eq!(webhook_workers(), 0, "no worker started for an open transaction");
    tx.batch_execute("COMMIT").unwrap();
    wait_until("the webhook worker started", Duration::from_secs(30), || webhook_workers() == 1);
    publish_each(&mut c, "orders", 1);
    wait_until("all 40 webhooks delivered", Duration::from_secs(60), || receiver.delivered("/many").len() == 40);
    assert_eq!(webhook_workers(), 1);
}

/// Settings a database owner may give its database (`session_authorization`,
/// `exit_on_error`, a read-only default) do not stop the workers.
#[test]
fn database_settings_do_not_stop_the_workers() {
    let _settings = local_endpoints();
    let receiver = Receiver::start();
    receiver.configure("/settings", Behaviour::signed(SECRET));
    let db = TestDb::new();
    let nobody = TestRole::new(&db, "nobody", "");
    let mut c = db.connect();
    create_webhook(&mut c, "settings", "orders", &receiver.url("/settings"));
    let first = publish_each(&mut c, "orders", 1);
    receiver.wait_for_delivered("/settings", 1, Duration::from_secs(30));
    // Recorded too, or the terminated worker rightly sends it once more.
    wait_for_state(&mut c, "settings", "the first event recorded", |s| s.pending == 0);
    admin()
        .batch_execute(&format!(
            "ALTER DATABASE {db} SET session_authorization = '{role}';
             ALTER DATABASE {db} SET exit_on_error = on;
             ALTER DATABASE {db} SET default_transaction_read_only = on;
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = '{db}' AND backend_type IN ('litebase_streams worker', 'litebase_streams webhooks')",
            db = db.name,
            role = nobody.name
        ))
        .unwrap();
    let mut c = db.connect();
    c.batch_execute("SET default_transaction_read_only = off; RESET session_authorization").unwrap();
    let later: Vec<i64> = (0..3).map(|n| publish(&mut c, "orders", &format!(r#"{{"n": {n}}}"#))).collect();
    wait_for_horizon(&mut c, *later.last().unwrap());
    let all: Vec<i64> = first.iter().chain(&later).copied().collect();
    assert_eq!(receiver.wait_for_delivered("/settings", 4, Duration::from_secs(30)), all);
    admin().batch_execute(&format!("ALTER DATABASE {} RESET ALL", db.name)).unwrap();
}

// --- giving up, and redirects ------------------------------------------------

/// A webhook gives up (disabled, the reason in last_error) after
/// `webhook_max_attempts` failed attempts of one request, or after failing
/// for `webhook_disable_after`; a redirect is a failure and is not followed.
#[test]
fn failing_webhooks_are_disabled_and_redirects_are_not_followed() {
    let receiver = Receiver::start();
    receiver.configure("/broken", Behaviour { fail_first: 1000, ..Behaviour::default() });
    receiver.configure("/target", Behaviour::default());
    receiver.configure(
        "/moved",
        Behaviour { status: 307, location: Some(receiver.url("/target")), ..Behaviour::default() },
    );
    let (cluster, mut c) = scratch_cluster(
        "webhooks-give-up",
        &[
            "litebase_streams.webhook_allowed_hosts = '127.0.0.1'",
            "litebase_streams.webhook_retry_min = 20",
            "litebase_streams.webhook_retry_max = 100",
            "litebase_streams.webhook_max_attempts = 3",
        ],
    );
    create_webhook(&mut c, "attempts", "orders", &receiver.url("/broken"));
    create_webhook(&mut c, "moved", "orders", &receiver.url("/moved"));
    publish_each(&mut c, "orders", 1);

    let disabled = wait_for_state(&mut c, "attempts", "disabled after 3 attempts", |s| s.state == "disabled");
    assert_eq!((disabled.attempts, disabled.last_status), (3, Some(500)));
    assert!(disabled.last_error.as_deref().unwrap_or("").contains("after 3 failed attempts"), "{disabled:?}");
    assert_eq!(receiver.requests("/broken").len(), 3);

    let moved = wait_for_state(&mut c, "moved", "disabled after 3 redirects", |s| s.state == "disabled");
    assert_eq!(moved.last_status, Some(307));
    assert_eq!(receiver.requests("/moved").len(), 3);
    assert!(receiver.requests("/target").is_empty(), "the redirect was followed");

    c.batch_execute("ALTER SYSTEM SET litebase_streams.webhook_max_attempts = 0").unwrap();
    c.batch_execute("ALTER SYSTEM SET litebase_streams.webhook_disable_after = 1").unwrap();
    c.batch_execute("SELECT pg_reload_conf()").unwrap();
    wait_until("the settings are reloaded", Duration::from_secs(10), || {
        let value: String =
            cluster.connect("app").query_one("SHOW litebase_streams.webhook_disable_after", &[]).unwrap().get(0);
        value == "1s"
    });
    c.batch_execute("SELECT streams.resume_webhook('attempts')").unwrap();
    let gave_up = wait_for_state(&mut c, "attempts", "disabled after failing for 1 s", |s| s.state == "disabled");
    assert!(gave_up.last_error.as_deref().unwrap_or("").contains("webhook_disable_after"), "{gave_up:?}");
    assert!(receiver.requests("/broken").len() > 3 + 2, "it kept trying for about a second first");
}

/// A turn that fails (here: its tables locked past the worker's
/// lock_timeout) keeps the outcomes it could not record: the delivered
/// event is recorded later, not sent again.
#[test]
fn outcomes_survive_a_failed_turn() {
    let _settings = local_endpoints();
    let receiver = Receiver::start();
    receiver.configure("/slowish", Behaviour { sleep: 1.0, ..Behaviour::default() });
    let db = TestDb::new();
    let mut c = db.connect();
    create_webhook(&mut c, "slowish", "orders", &receiver.url("/slowish"));
    let log = std::env::var("LITEBASE_STREAMS_SERVER_LOG").expect("LITEBASE_STREAMS_SERVER_LOG");
    let log_size = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0) as usize;
    publish_each(&mut c, "orders", 1);
    wait_until("the request is in flight", Duration::from_secs(30), || receiver.requests("/slowish").len() == 1);
    let mut locker = db.connect();
    locker.batch_execute("BEGIN; LOCK TABLE streams.webhook_state IN ACCESS EXCLUSIVE MODE").unwrap();
    // The endpoint answers 1 s after the request arrived: by then the
    // outcome waits in the worker, and the next turn fails on the lock.
    std::thread::sleep(Duration::from_millis(1500));
    let log_size = log_size.max(std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0) as usize);
    wait_until("a turn failed on the lock after the answer", Duration::from_secs(30), || {
        let text = std::fs::read(&log).unwrap_or_default();
        String::from_utf8_lossy(&text[log_size.min(text.len())..]).contains("webhook worker turn failed")
    });
    locker.batch_execute("COMMIT").unwrap();
    wait_for_state(&mut c, "slowish", "the delivery recorded", |s| s.pending == 0 && s.last_status == Some(200));
    assert_eq!(receiver.requests("/slowish").len(), 1, "delivered once, not sent again after the failed turn");
}
