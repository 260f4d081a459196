//! The database side of the metrics: events per stream (streams.stream_stats,
//! counted by the worker exactly once, also across worker restarts and a
//! crash), the streams.streams view (each role sees the streams it may read),
//! and streams.metrics() (the contract's rows, bounded label sets, values
//! that move, for pg_monitor only).
#![cfg(feature = "integration")]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::subscriptions::{fails_with, publish_events};
use common::webhooks::{local_endpoints, scratch_cluster};
use common::*;
use postgres::Client;

const WAIT: Duration = Duration::from_secs(30);

/// One row of streams.metrics().
#[derive(Debug, Clone)]
struct Sample {
    metric: String,
    kind: String,
    help: String,
    labels: serde_json::Value,
    value: f64,
}

impl Sample {
    fn label(&self, name: &str) -> Option<&str> {
        self.labels.get(name).and_then(|v| v.as_str())
    }
}

fn metrics_with(c: &mut Client, max_streams: i32, max_subscriptions: i32) -> Vec<Sample> {
    c.query(
        "SELECT metric, type, help, labels::text, value FROM streams.metrics($1, $2)",
        &[&max_streams, &max_subscriptions],
    )
    .expect("streams.metrics()")
    .iter()
    .map(|r| Sample {
        metric: r.get(0),
        kind: r.get(1),
        help: r.get(2),
        labels: json(r.get::<_, &str>(3)),
        value: r.get(4),
    })
    .collect()
}

fn metrics(c: &mut Client) -> Vec<Sample> {
    metrics_with(c, 100, 100)
}

/// The value of the one sample of `metric` whose labels include `labels`.
fn value(samples: &[Sample], metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let found: Vec<&Sample> =
        samples.iter().filter(|s| s.metric == metric && labels.iter().all(|(k, v)| s.label(k) == Some(v))).collect();
    assert!(found.len() <= 1, "more than one sample of {metric} {labels:?}: {found:?}");
    found.first().map(|s| s.value)
}

fn events_total(samples: &[Sample]) -> BTreeMap<String, f64> {
    samples
        .iter()
        .filter(|s| s.metric == "litebase_streams_events_total")
        .map(|s| (s.label("stream").expect("events_total has a stream label").to_owned(), s.value))
        .collect()
}

/// (stream, events, first_position, last_position) of each stream in the
/// log, counted directly (the truth the statistics must match).
fn counted_in_log(c: &mut Client) -> Vec<(String, i64, i64, i64)> {
    c.query(
        "SELECT stream, count(*), min(position), max(position) FROM streams.events GROUP BY stream ORDER BY stream",
        &[],
    )
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
    .collect()
}

/// The same from streams.streams.
fn counted_in_view(c: &mut Client) -> Vec<(String, i64, i64, i64)> {
    c.query("SELECT stream, events, first_position, last_position FROM streams.streams ORDER BY stream", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
}

/// Wait until every committed event is final, then until streams.streams
/// counts exactly what the log holds; the counts.
fn wait_until_counted(c: &mut Client, what: &str) -> Vec<(String, i64, i64, i64)> {
    let newest: i64 = c.query_one("SELECT coalesce(max(position), 0) FROM streams.event_log", &[]).unwrap().get(0);
    wait_for_horizon(c, newest);
    let truth = counted_in_log(c);
    wait_until(&format!("streams.streams counts {what}: {truth:?}"), WAIT, || counted_in_view(c) == truth);
    truth
}

/// Publish `count` events round-robin over `streams`, one transaction per
/// `per_tx`, rolling back every third transaction.
fn publish_mixed(c: &mut Client, streams: &[&str], count: usize, per_tx: usize) {
    let mut n = 0;
    let mut tx = 0;
    while n < count {
        c.batch_execute("BEGIN").unwrap();
        for _ in 0..per_tx {
            publish(c, streams[n % streams.len()], &format!(r#"{{"n":{n}}}"#));
            n += 1;
        }
        tx += 1;
        c.batch_execute(if tx % 3 == 0 { "ROLLBACK" } else { "COMMIT" }).unwrap();
    }
}

// --- streams.stream_stats and streams.streams --------------------------------------

/// Every committed event is counted once per stream; rolled-back ones never.
/// With the worker terminated twice while a publisher runs, the counts still
/// match the log exactly, and each start shows in worker_starts_total.
#[test]
fn stream_counts_are_exact_across_worker_restarts() {
    let db = TestDb::new();
    let mut c = db.connect();
    publish_mixed(&mut c, &["orders.created", "orders.paid", "audit"], 60, 4);
    let counts = wait_until_counted(&mut c, "the first events");
    assert_eq!(counts.iter().map(|s| s.1).sum::<i64>(), 40, "20 of 60 were rolled back: {counts:?}");
    let starts = value(&metrics(&mut c), "litebase_streams_worker_starts_total", &[]).unwrap();

    let config = db.config();
    let publisher = std::thread::spawn(move || {
        let mut p = connect_retrying(&config);
        publish_mixed(&mut p, &["orders.created", "orders.paid", "audit", "late.stream"], 3000, 3);
    });
    let mut admin = admin();
    for restart in 1..=2 {
        let old = db.wait_for_worker();
        std::thread::sleep(Duration::from_millis(300)); // mid-stream: the publisher keeps going
        admin.execute("SELECT pg_terminate_backend($1)", &[&old]).unwrap();
        wait_until(&format!("worker restart {restart}"), WAIT, || {
            let pid = admin
                .query_opt(
                    "SELECT pid FROM pg_stat_activity WHERE backend_type = 'litebase_streams worker' AND datname = $1",
                    &[&db.name],
                )
                .unwrap()
                .map(|r| r.get::<_, i32>(0));
            pid.is_some_and(|pid| pid != old)
        });
    }
    publisher.join().unwrap();
    let counts = wait_until_counted(&mut c, "every event after two restarts");
    // 1000 transactions of 3, every third rolled back.
    assert_eq!(counts.iter().map(|s| s.1).sum::<i64>(), 40 + 667 * 3, "{counts:?}");
    assert_eq!(counts.len(), 4);
    wait_until("worker_starts_total counts both restarts", WAIT, || {
        value(&metrics(&mut c), "litebase_streams_worker_starts_total", &[]) == Some(starts + 2.0)
    });
    let totals = events_total(&metrics(&mut c));
    for (stream, events, _, _) in &counts {
        assert_eq!(totals.get(stream), Some(&(*events as f64)), "events_total of {stream}: {totals:?}");
    }
}

/// A crash (immediate shutdown) while events are published and counted
/// loses no count and counts nothing twice: totals and the mark commit
/// together. Then counting from 0 again (what an update from 0.2.0 starts
/// with) arrives at the same totals.
#[test]
fn stream_counts_are_exact_across_a_crash_and_a_recount() {
    let (cluster, _) = scratch_cluster("metrics-crash", &[]);
    let config = cluster.config("app");
    let publisher = std::thread::spawn(move || {
        let mut p = connect_retrying(&config);
        for round in 0..400 {
            // Through the crash: a failed transaction is simply not counted.
            if p.is_closed() {
                p = connect_retrying(&config);
            }
            let _ = p.batch_execute(&format!(
                "SELECT streams.publish_batch('s.' || ({round} % 5), ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(1, 20) g))"
            ));
        }
    });
    std::thread::sleep(Duration::from_millis(500));
    cluster.restart("immediate");
    publisher.join().unwrap();
    let mut c2 = cluster.connect("app");
    let truth = wait_until_counted(&mut c2, "every event after a crash");
    assert!(truth.iter().map(|s| s.1).sum::<i64>() > 0);

    // The worker's own row lock first, so that no step of its commits between the two statements.
    c2.batch_execute(
        "BEGIN; SELECT FROM streams.stream_stats_state FOR UPDATE; DELETE FROM streams.stream_stats;
         UPDATE streams.stream_stats_state SET counted_through = 0, events = 0; COMMIT",
    )
    .unwrap();
    assert_eq!(wait_until_counted(&mut c2, "the log counted again from 0"), truth);
}

/// streams.streams shows each role the streams it may read, as the log's
/// row security does: a pattern grant its streams, '*' all (a private
/// stream only keeps its data out of NOTIFY, so '*' readers see it), a role
/// with no read grant none, and a role without the schema nothing at all.
#[test]
fn the_streams_view_shows_a_role_only_the_streams_it_may_read() {
    let db = TestDb::new();
    let orders = TestRole::new(&db, "orders_reader", "");
    let everything = TestRole::new(&db, "star_reader", "");
    let publisher = TestRole::new(&db, "publisher", "");
    let stranger = TestRole::new(&db, "stranger", "");
    let mut c = db.connect();
    c.batch_execute(&format!(
        "SELECT streams.grant('read', 'orders.*', '{}');
         SELECT streams.grant('read', '*', '{}');
         SELECT streams.grant('publish', 'orders.created', '{}');
         SELECT streams.set_private('internal.*')",
        orders.name, everything.name, publisher.name
    ))
    .unwrap();
    for stream in ["orders.created", "orders.paid", "payments.card", "internal.keys"] {
        publish(&mut c, stream, PAYMENT);
    }
    wait_until_counted(&mut c, "four streams");

    let names = |c: &mut Client| -> Vec<String> {
        c.query("SELECT stream FROM streams.streams ORDER BY stream", &[]).unwrap().iter().map(|r| r.get(0)).collect()
    };
    assert_eq!(names(&mut db.connect_as(&orders.name)), ["orders.created", "orders.paid"]);
    assert_eq!(
        names(&mut db.connect_as(&everything.name)),
        ["internal.keys", "orders.created", "orders.paid", "payments.card"]
    );
    assert!(names(&mut db.connect_as(&publisher.name)).is_empty(), "publishing is not reading");
    // No grant at all: not even the schema.
    fails_with(&mut db.connect_as(&stranger.name), "SELECT * FROM streams.streams", "42501");
    // The statistics table itself is the owner's alone.
    fails_with(&mut db.connect_as(&everything.name), "SELECT * FROM streams.stream_stats", "42501");
    // A condition of the caller's never sees a hidden row (security_barrier):
    // a cheap function that reports every stream it is called with.
    let spied = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut config = db.config();
    let notices = spied.clone();
    config.user(&orders.name).notice_callback(move |n| notices.lock().unwrap().push(n.message().to_owned()));
    let mut o = connect_retrying(&config);
    o.batch_execute(
        "CREATE FUNCTION pg_temp.spy(s text) RETURNS boolean LANGUAGE plpgsql COST 0.0000001 AS
         $$ BEGIN RAISE NOTICE 'spied %', s; RETURN true; END $$",
    )
    .unwrap();
    let rows = o.query("SELECT stream FROM streams.streams WHERE pg_temp.spy(stream)", &[]).unwrap();
    assert_eq!(rows.len(), 2);
    let spied = spied.lock().unwrap().clone();
    assert_eq!(spied, ["spied orders.created", "spied orders.paid"], "the spy saw other streams");
}

// --- streams.metrics(): shape and bounds -------------------------------------------

const METRICS: [(&str, &str); 21] = [
    ("litebase_streams_horizon", "gauge"),
    ("litebase_streams_newest_position", "gauge"),
    ("litebase_streams_horizon_lag_positions", "gauge"),
    ("litebase_streams_horizon_holder_age_seconds", "gauge"),
    ("litebase_streams_delivery_lag_positions", "gauge"),
    ("litebase_streams_worker_up", "gauge"),
    ("litebase_streams_worker_state", "gauge"),
    ("litebase_streams_worker_starts_total", "counter"),
    ("litebase_streams_worker_rounds_total", "counter"),
    ("litebase_streams_notifications_failing", "gauge"),
    ("litebase_streams_notification_failures_total", "counter"),
    ("litebase_streams_events_total", "counter"),
    ("litebase_streams_subscription_pending", "gauge"),
    ("litebase_streams_subscription_lag_seconds", "gauge"),
    ("litebase_streams_subscription_claimed", "gauge"),
    ("litebase_streams_subscription_retrying", "gauge"),
    ("litebase_streams_subscription_parked", "gauge"),
    ("litebase_streams_webhook_state", "gauge"),
    ("litebase_streams_webhook_consecutive_failures", "gauge"),
    ("litebase_streams_webhook_next_retry_seconds", "gauge"),
    ("litebase_streams_webhook_pending", "gauge"),
];

/// Every metric of the contract with its type and a help text, grouped by
/// name, every sample labelled with the database; events_total names the
/// max_streams streams with the lowest first position and sums the rest into
/// "(other)" and the private streams into "(private)", and that set stays
/// the same as streams are added, so each counter only grows.
#[test]
fn metrics_have_the_contract_rows_and_bounded_stream_labels() {
    let _endpoints = local_endpoints();
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute(
        "SELECT streams.set_private('secret.*');
         SELECT streams.create_subscription('billing', 'orders.*', after => 0);
         SELECT streams.create_webhook('hook', 'orders.*', 'http://127.0.0.1:9/h')",
    )
    .unwrap();
    for (stream, n) in [("a.first", 3), ("b.second", 2), ("c.third", 4), ("secret.keys", 5), ("d.fourth", 1)] {
        publish_events(&mut c, stream, n, n);
    }
    wait_until_counted(&mut c, "five streams");

    let samples = metrics_with(&mut c, 2, 100);
    let mut seen = Vec::new();
    for s in &samples {
        if seen.last() != Some(&s.metric) {
            assert!(!seen.contains(&s.metric), "the samples of {} are not together", s.metric);
            seen.push(s.metric.clone());
        }
        assert_eq!(s.label("database"), Some(db.name.as_str()), "{s:?}");
        assert!(!s.help.is_empty());
    }
    let kinds: BTreeMap<&str, &str> = samples.iter().map(|s| (s.metric.as_str(), s.kind.as_str())).collect();
    assert_eq!(kinds, METRICS.into_iter().collect::<BTreeMap<_, _>>());
    let expected: BTreeMap<String, f64> = [("a.first", 3.0), ("b.second", 2.0), ("(other)", 5.0), ("(private)", 5.0)]
        .map(|(k, v)| (k.to_owned(), v))
        .into();
    assert_eq!(events_total(&samples), expected);
    assert!(!samples.iter().any(|s| s.labels.to_string().contains("secret.keys")), "a private stream's name");

    // A new stream joins "(other)"; the named ones stay and only grow.
    publish_events(&mut c, "0.new", 6, 6);
    publish_events(&mut c, "a.first", 1, 1);
    wait_until_counted(&mut c, "the new stream");
    let expected: BTreeMap<String, f64> = [("a.first", 4.0), ("b.second", 2.0), ("(other)", 11.0), ("(private)", 5.0)]
        .map(|(k, v)| (k.to_owned(), v))
        .into();
    assert_eq!(events_total(&metrics_with(&mut c, 2, 100)), expected);
    assert_eq!(events_total(&metrics_with(&mut c, 0, 100)).keys().collect::<Vec<_>>(), ["(other)", "(private)"]);
    fails_with(&mut c, "SELECT * FROM streams.metrics(-1)", "22023");
    fails_with(&mut c, "SELECT * FROM streams.metrics(100, NULL)", "22023");
}

/// An attacker who may read a stream creates 500 subscriptions: the label
/// set stays at max_subscriptions names plus "(other)", which sums what is
/// cheap to sum (claimed, retrying, parked) and has no pending or lag row
/// (counting those would read every subscription's backlog).
#[test]
fn many_subscriptions_do_not_grow_the_label_set() {
    let db = TestDb::new();
    let attacker = TestRole::new(&db, "attacker", "");
    let mut c = db.connect();
    c.batch_execute(&format!("SELECT streams.grant('read', 'spam', '{}')", attacker.name)).unwrap();
    publish_events(&mut c, "spam", 3, 3);
    let mut a = db.connect_as(&attacker.name);
    a.batch_execute(
        "SELECT streams.create_subscription('sub_' || g, 'spam', after => 0) FROM generate_series(1, 500) g",
    )
    .unwrap();
    let samples = metrics(&mut c);
    let pending: Vec<&Sample> =
        samples.iter().filter(|s| s.metric == "litebase_streams_subscription_pending").collect();
    assert_eq!(pending.len(), 100, "100 named, no (other)");
    let labels: BTreeSet<String> = samples.iter().map(|s| s.labels.to_string()).collect();
    assert!(labels.len() < 140, "{} label sets", labels.len());
    assert_eq!(value(&samples, "litebase_streams_subscription_pending", &[("subscription", "(other)")]), None);
    assert_eq!(value(&samples, "litebase_streams_subscription_lag_seconds", &[("subscription", "(other)")]), None);
    for metric in ["claimed", "retrying", "parked"] {
        let metric = format!("litebase_streams_subscription_{metric}");
        assert_eq!(value(&samples, &metric, &[("subscription", "(other)")]), Some(0.0), "{metric}");
    }
    assert_eq!(value(&samples, "litebase_streams_subscription_pending", &[("subscription", "sub_1")]), Some(3.0));
    assert_eq!(value(&samples, "litebase_streams_subscription_pending", &[("subscription", "sub_101")]), None);
    let small = metrics_with(&mut c, 100, 3);
    assert_eq!(small.iter().filter(|s| s.metric == "litebase_streams_subscription_lag_seconds").count(), 3);
    assert_eq!(small.iter().filter(|s| s.metric == "litebase_streams_subscription_parked").count(), 4);
}

// --- streams.metrics(): values -------------------------------------------------------

/// An open publishing transaction holds the horizon: lag positions and the
/// holder's age rise, and fall back to 0 when it commits.
#[test]
fn horizon_lag_and_holder_age_move_with_an_open_transaction() {
    let db = TestDb::new();
    let mut c = db.connect();
    publish_events(&mut c, "orders", 2, 1);
    let samples = metrics(&mut c);
    assert_eq!(value(&samples, "litebase_streams_horizon_lag_positions", &[]), Some(0.0));
    assert_eq!(value(&samples, "litebase_streams_horizon_holder_age_seconds", &[]), Some(0.0));
    assert_eq!(value(&samples, "litebase_streams_worker_up", &[]), Some(1.0));
    assert_eq!(value(&samples, "litebase_streams_worker_state", &[("state", "idle")]), Some(1.0));

    let mut holder = db.connect();
    holder.batch_execute("BEGIN").unwrap();
    let held = publish(&mut holder, "orders", PAYMENT);
    for _ in 0..3 {
        publish(&mut c, "orders", PAYMENT);
    }
    wait_until("the holder shows in the metrics", WAIT, || {
        let samples = metrics(&mut c);
        value(&samples, "litebase_streams_horizon_lag_positions", &[]) == Some(4.0)
            && value(&samples, "litebase_streams_horizon_holder_age_seconds", &[]).unwrap() > 0.0
    });
    let samples = metrics(&mut c);
    assert_eq!(value(&samples, "litebase_streams_horizon", &[]), Some((held - 1) as f64));
    assert_eq!(value(&samples, "litebase_streams_newest_position", &[]), Some((held + 3) as f64));
    holder.batch_execute("COMMIT").unwrap();
    wait_until("the horizon passes the holder", WAIT, || {
        let samples = metrics(&mut c);
        value(&samples, "litebase_streams_horizon_lag_positions", &[]) == Some(0.0)
            && value(&samples, "litebase_streams_horizon_holder_age_seconds", &[]) == Some(0.0)
            && value(&samples, "litebase_streams_delivery_lag_positions", &[]) == Some(0.0)
    });
}

/// Nobody polls: pending and lag rise; a claim, a nack and a parked event show as claimed,
/// retrying and parked.
#[test]
fn subscription_metrics_follow_consumers() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute(
        "SELECT streams.create_subscription('idle', 'orders', after => 0);
         SELECT streams.create_subscription('retry', 'orders', after => 0, max_attempts => 3, backoff_min => '1 hour', backoff_max => '1 hour');
         SELECT streams.create_subscription('park', 'orders', after => 0, max_attempts => 1)",
    )
    .unwrap();
    let p = publish_events(&mut c, "orders", 5, 5);
    let sub = |name: &'static str| [("subscription", name)];
    wait_until("lag_seconds rises while nobody polls", WAIT, || {
        let samples = metrics(&mut c);
        value(&samples, "litebase_streams_subscription_pending", &sub("idle")) == Some(5.0)
            && value(&samples, "litebase_streams_subscription_lag_seconds", &sub("idle")).unwrap() > 0.5
    });

    let mut consumer = db.connect();
    consumer.batch_execute("BEGIN").unwrap();
    consumer.query("SELECT * FROM streams.poll('idle', 2)", &[]).unwrap();
    let samples = metrics(&mut c);
    assert_eq!(value(&samples, "litebase_streams_subscription_claimed", &sub("idle")), Some(2.0));
    consumer.batch_execute("COMMIT").unwrap();

    for (name, expect) in
        [("retry", "litebase_streams_subscription_retrying"), ("park", "litebase_streams_subscription_parked")]
    {
        consumer.batch_execute("BEGIN").unwrap();
        consumer.query(&format!("SELECT * FROM streams.poll('{name}', 1)"), &[]).unwrap();
        consumer.batch_execute(&format!("SELECT streams.nack('{name}', {}, reason => 'boom'); COMMIT", p[0])).unwrap();
        let samples = metrics(&mut c);
        assert_eq!(value(&samples, expect, &sub(name)), Some(1.0), "{name}");
    }
    let samples = metrics(&mut c);
    assert_eq!(value(&samples, "litebase_streams_subscription_parked", &sub("retry")), Some(0.0));
    assert_eq!(value(&samples, "litebase_streams_subscription_retrying", &sub("park")), Some(0.0));
    assert_eq!(value(&samples, "litebase_streams_subscription_claimed", &sub("idle")), Some(0.0));
    // Pending as streams.subscriptions counts it.
    for row in c.query("SELECT name, pending FROM streams.subscriptions", &[]).unwrap() {
        let (name, pending): (String, i64) = (row.get(0), row.get(1));
        let metric = value(&samples, "litebase_streams_subscription_pending", &[("subscription", name.as_str())]);
        assert_eq!(metric, Some(pending as f64), "{name}");
    }
}

/// A webhook whose endpoint refuses: its state is retrying (a state set of
/// four), failures and pending show, and its URL, which may hold a token,
/// appears nowhere.
#[test]
fn webhook_metrics_never_show_the_url() {
    let _endpoints = local_endpoints();
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute("SELECT streams.create_webhook('hook', 'orders', 'http://127.0.0.1:9/in/tok3n-s3cret')").unwrap();
    publish_events(&mut c, "orders", 2, 2);
    let hook = [("webhook", "hook")];
    wait_until("the webhook fails", WAIT, || {
        value(&metrics(&mut c), "litebase_streams_webhook_consecutive_failures", &hook).unwrap_or(0.0) > 0.0
    });
    let samples = metrics(&mut c);
    let states: BTreeMap<&str, f64> = samples
        .iter()
        .filter(|s| s.metric == "litebase_streams_webhook_state")
        .map(|s| (s.label("state").unwrap(), s.value))
        .collect();
    assert_eq!(states, [("active", 0.0), ("disabled", 0.0), ("paused", 0.0), ("retrying", 1.0)].into());
    assert_eq!(value(&samples, "litebase_streams_webhook_pending", &hook), Some(2.0));
    c.batch_execute("SELECT streams.pause_webhook('hook')").unwrap();
    assert_eq!(
        value(&metrics(&mut c), "litebase_streams_webhook_state", &[("webhook", "hook"), ("state", "paused")]),
        Some(1.0)
    );
    let everything: String = samples.iter().map(|s| format!("{} {} {}\n", s.metric, s.help, s.labels)).collect();
    assert!(!everything.contains("tok3n") && !everything.contains("127.0.0.1"), "{everything}");
}

// --- who may call it ----------------------------------------------------------------

/// streams.metrics() is pg_monitor's: PUBLIC, a reader and pg_read_all_data
/// get 42501; a pg_monitor member reads it. pg_read_all_data reads no row of
/// the statistics tables (row security).
#[test]
fn metrics_are_for_pg_monitor_only() {
    let db = TestDb::new();
    let reader = TestRole::new(&db, "reader", "");
    let monitor = TestRole::new(&db, "monitor", "IN ROLE pg_monitor");
    let all_data = TestRole::new(&db, "all_data", "IN ROLE pg_read_all_data");
    let mut c = db.connect();
    c.batch_execute(&format!("SELECT streams.grant('read', '*', '{}')", reader.name)).unwrap();
    publish_events(&mut c, "orders", 2, 2);
    wait_until_counted(&mut c, "orders");

    fails_with(&mut db.connect_as(&reader.name), "SELECT * FROM streams.metrics()", "42501");
    let mut a = db.connect_as(&all_data.name);
    fails_with(&mut a, "SELECT * FROM streams.metrics()", "42501");
    let rows: i64 = a
        .query_one(
            "SELECT (SELECT count(*) FROM streams.stream_stats) + (SELECT count(*) FROM streams.stream_stats_state)",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(rows, 0, "pg_read_all_data reads statistics rows");
    let samples = metrics(&mut db.connect_as(&monitor.name));
    assert_eq!(events_total(&samples).get("orders"), Some(&2.0));
    let grantees: Vec<String> = c
        .query(
            "SELECT coalesce(r.rolname, 'PUBLIC') FROM pg_proc p, aclexplode(p.proacl) a LEFT JOIN pg_roles r ON r.oid = a.grantee
             WHERE p.oid = 'streams.metrics(integer, integer)'::regprocedure AND a.grantee <> p.proowner",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(grantees, ["pg_monitor"]);
}

// --- an updated log ------------------------------------------------------------------

/// A log of 0.1.0 updated step by step to the current version starts with
/// counted_through 0, and the worker counts the events it already had (and
/// the ones after), exactly.
#[test]
fn an_updated_log_counts_the_events_it_already_had() {
    let db = TestDb::without_extension();
    let dir = std::path::PathBuf::from(pg_config("--sharedir")).join("extension");
    let script = dir.join("litebase_streams--0.1.0.sql");
    let source = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("sql/litebase_streams--0.1.0.sql");
    // As tests/upgrade.rs does: the frozen script is in place for this CREATE EXTENSION alone.
    std::fs::copy(&source, &script).expect("copy the frozen 0.1.0 script");
    let created = db.connect().batch_execute("CREATE EXTENSION litebase_streams VERSION '0.1.0'");
    std::fs::remove_file(&script).expect("remove the frozen 0.1.0 script");
    created.expect("CREATE EXTENSION litebase_streams VERSION '0.1.0'");
    db.wait_for_worker();
    let mut c = db.connect();
    for n in 0..30 {
        publish(&mut c, if n % 3 == 0 { "old.a" } else { "old.b" }, &format!(r#"{{"n":{n}}}"#));
    }
    c.batch_execute("BEGIN; SELECT streams.publish('old.rolled_back', '{}'); ROLLBACK").unwrap();
    wait_for_horizon(&mut c, 30);
    for version in ["0.2.0", "0.3.0"] {
        c.batch_execute(&format!("ALTER EXTENSION litebase_streams UPDATE TO '{version}'")).unwrap();
    }
    publish(&mut c, "new.c", PAYMENT);
    let counts = wait_until_counted(&mut c, "the events from before the update");
    assert_eq!(
        counts.iter().map(|(stream, events, _, _)| (stream.as_str(), *events)).collect::<Vec<_>>(),
        [("new.c", 1), ("old.a", 10), ("old.b", 20)]
    );
}
