//! Any role can fill PostgreSQL's cluster-wide notification queue (8 GB):
//! one session listens and stays in a transaction, another notifies. Events
//! must keep becoming visible meanwhile, `streams.status` must say why
//! notifications fail, and once the queue drains listeners must receive
//! every event, late but in order and once.
//!
//! The test writes the whole 8 GB queue (about a minute here). It has a test
//! binary of its own so that no other test's listeners share the full queue,
//! and it is skipped, visibly, where the disk has less than 20 GB free.
#![cfg(feature = "integration")]

mod common;

use std::time::{Duration, Instant};

use common::*;

fn free_disk_bytes(path: &str) -> u64 {
    let out = std::process::Command::new("df").args(["-B1", "--output=avail", path]).output().expect("df runs");
    String::from_utf8_lossy(&out.stdout).lines().nth(1).and_then(|l| l.trim().parse().ok()).unwrap_or(0)
}

#[test]
fn a_full_notification_queue_delays_delivery_but_never_visibility() {
    let pgdata = std::env::var("LITEBASE_STREAMS_PGDATA").expect("LITEBASE_STREAMS_PGDATA");
    let free = free_disk_bytes(&pgdata);
    if free < 20 << 30 {
        eprintln!(
            "SKIPPED a_full_notification_queue_delays_delivery_but_never_visibility: {} GB free, 20 GB needed",
            free >> 30
        );
        return;
    }
    wait_until("the notification queue is empty to begin with", Duration::from_secs(120), || {
        admin().query_one("SELECT pg_notification_queue_usage()", &[]).unwrap().get::<_, f64>(0) < 0.01
    });
    let db = TestDb::new();
    let attacker = TestRole::new(&db, "attacker", "");
    let mut owner = db.connect();
    let mut listener = Listener::new(&db, &["orders"]);
    let before = publish(&mut owner, "orders", r#"{"n":0}"#);
    assert_eq!(listener.positions(1, Duration::from_secs(10)), vec![before]);

    // The attack: a listener that never reads, and junk until the queue is full.
    let mut sleeper = db.connect_as(&attacker.name);
    sleeper.batch_execute("LISTEN junk").unwrap(); // committed: it now holds the queue's tail
    sleeper.batch_execute("BEGIN; SELECT 1").unwrap();
    let mut filler = db.connect_as(&attacker.name);
    let started = Instant::now();
    let mut batch = 0i64;
    loop {
        let sql = format!(
            "SELECT pg_notify('junk', {batch}::text || '-' || g || repeat('x', 7900)) FROM generate_series(1, 20000) g"
        );
        match filler.batch_execute(&sql) {
            Ok(()) => batch += 1,
            Err(e) => {
                assert_eq!(sqlstate(&e), "54000", "the queue fills up: {e}");
                break;
            }
        }
        assert!(started.elapsed() < Duration::from_secs(300), "the notification queue never filled");
    }

    // Publishing and visibility go on.
    let during: Vec<i64> = (1..=5).map(|n| publish(&mut owner, "orders", &format!(r#"{{"n":{n}}}"#))).collect();
    wait_for_horizon(&mut owner, *during.last().unwrap());
    let visible =
        event_positions(&mut owner, "SELECT position FROM streams.events WHERE position > 1 ORDER BY position");
    assert_eq!(visible, during, "events are visible while NOTIFY fails");
    wait_until("status reports the full queue", Duration::from_secs(20), || {
        let state: Option<String> = owner.query_one("SELECT notify_state FROM streams.status", &[]).unwrap().get(0);
        state.as_deref() == Some("failing: the notification queue is full")
    });
    // streams.metrics() (the gateway's /metrics): the failure has its reason and is counted.
    wait_until("streams.metrics() reports the full queue and counts the failures", Duration::from_secs(30), || {
        let (failing, reason, failures) = notification_metrics(&mut owner);
        failing == 1.0 && reason == "queue_full" && failures >= 1.0
    });

    // The attacker goes away. The queue drains once no listener holds its
    // tail; PostgreSQL moves an idle listener forward only when a notifying
    // commit wakes it, and none can commit while the queue is full, so a
    // listener that was connected through the attack reconnects, following
    // the reconnect rule of docs/protocol.md: LISTEN, replay after the last position
    // seen, then follow notifications and drop what replay already returned.
    let sleeper_pid: i32 = sleeper.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    admin().execute("SELECT pg_terminate_backend($1)", &[&sleeper_pid]).unwrap();
    drop(filler);
    let old_pid: i32 = listener.client.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    drop(listener);
    wait_until("the old listener's session ends", Duration::from_secs(20), || {
        admin().query_opt("SELECT 1 FROM pg_stat_activity WHERE pid = $1", &[&old_pid]).unwrap().is_none()
    });
    wait_until("the notification queue drains", Duration::from_secs(120), || {
        admin().query_one("SELECT pg_notification_queue_usage()", &[]).unwrap().get::<_, f64>(0) < 0.5
    });
    let mut listener = Listener::new(&db, &["orders"]);
    let mut seen = event_positions(&mut listener.client, "SELECT position FROM streams.replay(after => 1)");
    wait_until("status reports notifications working again", Duration::from_secs(60), || {
        let state: Option<String> = owner.query_one("SELECT notify_state FROM streams.status", &[]).unwrap().get(0);
        state.as_deref() == Some("ok")
    });
    let (failing, reason, _) = notification_metrics(&mut owner);
    assert_eq!((failing, reason.as_str()), (0.0, "ok"), "streams.metrics() reports notifications working again");
    while let Some((_, payload)) = listener.next(Duration::from_millis(500)) {
        let position = serde_json::from_str::<serde_json::Value>(&payload).unwrap()["position"].as_i64().unwrap();
        if position > *seen.last().unwrap_or(&1) {
            seen.push(position);
        }
    }
    assert_eq!(seen, during, "replay and the late notifications give every event once, in order");
    let after = publish(&mut owner, "orders", r#"{"n":"after"}"#);
    assert_eq!(listener.positions(1, Duration::from_secs(10)), vec![after], "live delivery is back");
    wait_until("the queue empties for the tests that follow", Duration::from_secs(120), || {
        admin().query_one("SELECT pg_notification_queue_usage()", &[]).unwrap().get::<_, f64>(0) < 0.01
    });
}

/// The notification rows of streams.metrics(): litebase_streams_notifications_failing
/// (its value and reason) and litebase_streams_notification_failures_total.
fn notification_metrics(client: &mut postgres::Client) -> (f64, String, f64) {
    let rows = client
        .query(
            "SELECT metric, labels->>'reason', value FROM streams.metrics()
             WHERE metric IN ('litebase_streams_notifications_failing', 'litebase_streams_notification_failures_total')",
            &[],
        )
        .unwrap();
    let (mut failing, mut reason, mut failures) = (f64::NAN, String::new(), f64::NAN);
    for row in rows {
        let (metric, label, value): (String, Option<String>, f64) = (row.get(0), row.get(1), row.get(2));
        if metric == "litebase_streams_notifications_failing" {
            (failing, reason) = (value, label.unwrap_or_default());
        } else {
            failures = value;
        }
    }
    (failing, reason, failures)
}
