//! Webhook delivery: every committed event of a stream POSTed to an HTTP
//! endpoint, signed so that the Standard Webhooks reference verifier accepts
//! it, in position order, retried until delivered (the same event under the
//! same webhook-id, also after a crash), disabled when the endpoint is gone
//! or keeps failing, redirects not followed. The endpoint is
//! tests/webhook_receiver.py, a real HTTP server on 127.0.0.1
//! (tests/common/webhooks.rs); what webhooks refuse and bound is in
//! tests/webhooks.rs.
#![cfg(feature = "integration")]

mod common;

use std::time::Duration;

use common::webhooks::*;
use common::*;

// --- delivery ----------------------------------------------------------------

/// Every event of the webhook's streams arrives once, in order, signed, with
/// its full data (private streams' too: the webhook is its owner's own
/// delivery), and nothing of other streams; one event per request, or a
/// JSON array of up to `batch`.
#[test]
fn every_event_reaches_its_endpoint_once_in_order_and_signed() {
    let (receiver, db) =
        local_receiver_and_db(&[("/one", Behaviour::signed(SECRET)), ("/batched", Behaviour::signed(SECRET))]);
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
/// A webhook body carries the event's envelope the way a full payload
/// does: `type`, `key` and `headers` after `prev` and before `data`, only
/// when set, also for a private stream (the webhook's owner reads it); an
/// event without an envelope arrives without those fields.
#[test]
fn a_webhook_body_carries_the_envelope_when_set() {
    let (receiver, db) = local_receiver_and_db(&[("/env", Behaviour::signed(SECRET))]);
    let mut c = db.connect();
    c.batch_execute("SELECT streams.set_private('orders.secret')").unwrap();
    create_webhook(&mut c, "env", "orders.*", &receiver.url("/env"));
    let publish_with = |c: &mut postgres::Client, stream: &str, envelope: [Option<&str>; 3]| -> i64 {
        let [type_, key, headers] = envelope;
        c.query_one(
            "SELECT streams.publish($1, '{\"n\": 1}', type => $2, key => $3, headers => $4::text::jsonb)",
            &[&stream, &type_, &key, &headers],
        )
        .unwrap()
        .get(0)
    };
    let headers = r#"{"traceparent": "00-4bf9-01", "source": "a, b"}"#;
    let full = publish_with(&mut c, "orders.paid", [Some("order.paid"), Some("ord_1"), Some(headers)]);
    let private = publish_with(&mut c, "orders.secret", [Some("order.secret"), Some("ord_2"), Some(headers)]);
    let plain = publish_with(&mut c, "orders.paid", [None, None, None]);
    wait_for_horizon(&mut c, plain);
    assert_eq!(receiver.wait_for_delivered("/env", 3, Duration::from_secs(30)), [full, private, plain]);
    let bodies: Vec<String> = receiver.requests("/env").iter().map(|r| r.raw_body.clone().expect("a body")).collect();
    for (body, position, stream, type_, key) in [
        (&bodies[0], full, "orders.paid", "order.paid", "ord_1"),
        (&bodies[1], private, "orders.secret", "order.secret", "ord_2"),
    ] {
        let envelope = format!(
            r#""type":"{type_}","key":"{key}","headers":{{"source":"a, b","traceparent":"00-4bf9-01"}},"data":{{"n":1}}}}"#
        );
        assert!(body.ends_with(&envelope), "{position}: the envelope after prev, before data: {body}");
        assert!(body.starts_with(&format!(r#"{{"position":{position},"stream":"{stream}","time":"#)), "{body}");
    }
    assert!(bodies[2].contains(r#","prev":"#) && bodies[2].ends_with(r#","data":{"n":1}}"#), "{}", bodies[2]);
    for absent in ["\"type\"", "\"key\"", "\"headers\""] {
        assert!(!bodies[2].contains(absent), "no {absent} without an envelope: {}", bodies[2]);
    }
}

/// A webhook created with `types` and `filter` receives exactly the events
/// of its pattern that have one of the types and whose data contains the
/// filter, in order, and its position moves past the others (also past a
/// run of them at the end, with nothing to send): nothing is read again.
/// A bad filter is refused with 22023 and creates nothing.
#[test]
fn a_filtered_webhook_receives_exactly_the_matching_events() {
    let (receiver, db) = local_receiver_and_db(&[("/paid-eu", Behaviour::signed(SECRET))]);
    let mut c = db.connect();
    c.query_one(
        "SELECT streams.create_webhook('paid-eu', 'orders.*.done', $1, secret => $2, batch => 5,
                types => ARRAY['order.paid'], filter => '{\"region\": \"eu\"}')",
        &[&receiver.url("/paid-eu"), &SECRET],
    )
    .unwrap();
    let mut expected = Vec::new();
    let mut last = 0;
    for n in 0..40 {
        let stream = if n % 5 == 4 { "orders.eu.open" } else { "orders.eu.done" };
        let type_ = if n % 3 == 0 { "order.paid" } else { "order.refunded" };
        let region = if n % 2 == 0 { "eu" } else { "us" };
        let data = format!(r#"{{"n": {n}, "region": "{region}"}}"#);
        last = c
            .query_one("SELECT streams.publish($1, $2::text::jsonb, type => $3)", &[&stream, &data, &type_])
            .unwrap()
            .get(0);
        if stream.ends_with(".done") && type_ == "order.paid" && region == "eu" {
            expected.push(last);
        }
    }
    // A run of events the filter leaves out, at the end.
    for _ in 0..10 {
        last = publish(&mut c, "orders.eu.done", r#"{"region": "eu"}"#);
    }
    wait_for_horizon(&mut c, last);
    assert!(expected.len() >= 4, "{expected:?}");
    assert_eq!(receiver.wait_for_delivered("/paid-eu", expected.len(), Duration::from_secs(30)), expected);
    // The stored position, not the view's (which counts only pending matches).
    wait_until("the webhook moves past the events it leaves out", Duration::from_secs(30), || {
        let stored: i64 =
            c.query_one("SELECT position FROM streams.subscription_state WHERE name = 'paid-eu'", &[]).unwrap().get(0);
        stored == last
    });
    let moved = state(&mut c, "paid-eu");
    assert_eq!((moved.pending, moved.state.as_str()), (0, "active"));
    // A backlog the filter leaves out, longer than one turn reads (100,000
    // positions), then a match: the webhook steps through and delivers it.
    c.batch_execute(
        "SELECT streams.publish_batch('orders.eu.done',
                (SELECT array_agg('{\"region\": \"us\"}'::jsonb) FROM generate_series(1, 250000)), type => 'order.paid')",
    )
    .unwrap();
    let after_backlog: i64 = c
        .query_one("SELECT streams.publish('orders.eu.done', '{\"region\": \"eu\"}', type => 'order.paid')", &[])
        .unwrap()
        .get(0);
    wait_for_horizon(&mut c, after_backlog);
    expected.push(after_backlog);
    assert_eq!(receiver.wait_for_delivered("/paid-eu", expected.len(), Duration::from_secs(30)), expected);
    assert_eq!(receiver.delivered("/paid-eu"), expected, "nothing else, nothing twice");
    let (types, filter): (Vec<String>, String) = c
        .query_one("SELECT types, filter::text FROM streams.webhooks WHERE name = 'paid-eu'", &[])
        .map(|r| (r.get(0), r.get(1)))
        .unwrap();
    assert_eq!((types, filter.as_str()), (vec!["order.paid".to_owned()], r#"{"region": "eu"}"#));

    for (bad, types, filter) in [("array", None, Some("[1]")), ("empty-type", Some(vec![""]), None)] {
        let error = c
            .query_one(
                "SELECT streams.create_webhook($1, 'orders.*', $2, types => $3, filter => $4::text::jsonb)",
                &[&bad, &receiver.url("/paid-eu"), &types, &filter],
            )
            .unwrap_err();
        assert_eq!(error.code(), Some(&postgres::error::SqlState::INVALID_PARAMETER_VALUE), "{bad}: {error}");
    }
    let count: i64 = c.query_one("SELECT count(*) FROM streams.webhooks", &[]).unwrap().get(0);
    assert_eq!(count, 1, "a refused webhook leaves nothing behind");
}

/// A filtered webhook whose endpoint fails on its first matching event,
/// with long runs of events the filter leaves out between the matches: the
/// worker must neither skip the failing match (SKIP only over
/// non-matching ranges) nor send a non-matching event in any attempt; once
/// the endpoint recovers every match arrives exactly once, in order. A
/// seek back while idle redelivers exactly the matches after it.
#[test]
fn a_filtered_webhook_with_a_failing_endpoint_neither_skips_nor_leaks() {
    let (receiver, db) =
        local_receiver_and_db(&[("/f", Behaviour { fail_first: 4, fail_status: 503, ..Behaviour::signed(SECRET) })]);
    let mut c = db.connect();
    c.query_one(
        "SELECT streams.create_webhook('f', 'orders.*', $1, secret => $2, batch => 3,
                types => ARRAY['hit'], filter => '{\"k\": 1}')",
        &[&receiver.url("/f"), &SECRET],
    )
    .unwrap();
    let mut matches = Vec::new();
    let hit = |c: &mut postgres::Client| -> i64 {
        c.query_one("SELECT streams.publish('orders.a', '{\"k\": 1, \"x\": 2}', type => 'hit')", &[]).unwrap().get(0)
    };
    let noise = |c: &mut postgres::Client, n: i32| {
        // Wrong type, wrong data, wrong stream: none match.
        c.execute(
            "SELECT streams.publish_batch('orders.a', (SELECT array_agg('{\"k\": 1}'::jsonb) FROM generate_series(1, $1)), type => 'miss')",
            &[&n],
        )
        .unwrap();
        c.execute(
            "SELECT streams.publish_batch('orders.a', (SELECT array_agg('{\"k\": 2}'::jsonb) FROM generate_series(1, $1)), type => 'hit')",
            &[&n],
        )
        .unwrap();
        c.execute(
            "SELECT streams.publish_batch('other', (SELECT array_agg('{\"k\": 1}'::jsonb) FROM generate_series(1, $1)), type => 'hit')",
            &[&n],
        )
        .unwrap();
    };
    matches.push(hit(&mut c));
    noise(&mut c, 500);
    matches.push(hit(&mut c));
    wait_for_state(&mut c, "f", "retrying", |s| s.state == "retrying");
    noise(&mut c, 70_000); // a non-matching run longer than a turn reads (210,000 positions)
    matches.push(hit(&mut c));
    noise(&mut c, 100);
    let last: i64 = c.query_one("SELECT max(position) FROM streams.event_log", &[]).unwrap().get(0);
    wait_for_horizon(&mut c, last);
    assert_eq!(receiver.wait_for_delivered("/f", 3, Duration::from_secs(60)), matches);
    wait_until("the stored position reaches the end", Duration::from_secs(60), || {
        let p: i64 =
            c.query_one("SELECT position FROM streams.subscription_state WHERE name = 'f'", &[]).unwrap().get(0);
        p == last
    });
    for request in receiver.requests("/f") {
        for p in request.positions() {
            assert!(matches.contains(&p), "a request carried {p}, which the filter leaves out: {request:?}");
        }
    }
    assert!(receiver.requests("/f").iter().filter(|r| !r.succeeded()).count() >= 4);
    assert_eq!(receiver.delivered("/f"), matches, "each once");

    // Seek back to just after the first match: the two later ones again.
    c.batch_execute(&format!("SELECT streams.seek('f', after => {})", matches[0])).unwrap();
    // Nudge the horizon (a seek itself does not wake the webhook worker).
    publish(&mut c, "other", "{}");
    assert_eq!(receiver.wait_for_delivered("/f", 5, Duration::from_secs(60)), [&matches[..], &matches[1..]].concat());
}

#[test]
fn a_failing_endpoint_gets_the_same_event_until_it_succeeds() {
    let (receiver, db) = local_receiver_and_db(&[(
        "/flaky",
        Behaviour { fail_first: 5, fail_status: 500, ..Behaviour::signed(SECRET) },
    )]);
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
    let (receiver, db) = local_receiver_and_db(&[("/down", Behaviour::signed(SECRET))]);
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
    let receiver = Receiver::answering(&[
        ("/slow", Behaviour { sleep: 90.0, ..Behaviour::signed(SECRET) }),
        ("/fast", Behaviour::signed(SECRET)),
    ]);
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
    let (receiver, db) =
        local_receiver_and_db(&[("/gone", Behaviour { fail_first: 1, fail_status: 410, ..Behaviour::signed(SECRET) })]);
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
    let receiver = Receiver::answering(&[("/crash", Behaviour::signed(SECRET))]);
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
    let receiver = Receiver::answering(&[("/batch", Behaviour { sleep: 30.0, ..Behaviour::signed(SECRET) })]);
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

// --- giving up, and redirects ------------------------------------------------

/// A webhook gives up (disabled, the reason in last_error) after
/// `webhook_max_attempts` failed attempts of one request, or after failing
/// for `webhook_disable_after`; a redirect is a failure and is not followed.
#[test]
fn failing_webhooks_are_disabled_and_redirects_are_not_followed() {
    let receiver = Receiver::answering(&[
        ("/broken", Behaviour { fail_first: 1000, ..Behaviour::default() }),
        ("/target", Behaviour::default()),
    ]);
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
    let (receiver, db) = local_receiver_and_db(&[("/slowish", Behaviour { sleep: 1.0, ..Behaviour::default() })]);
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
