//! Subscriptions: durable consumers that resume where they stopped (after a
//! reconnect or a server restart), rewind and skip ahead with `seek`, wait
//! for events in a long poll that costs nothing and ends at once when
//! interrupted, see only their pattern's streams, and refuse bad arguments.
//! Competing and ordered consumers, savepoints and two-phase commit are in
//! tests/subscription_claims.rs; privileges and hostile roles in
//! tests/subscription_security.rs; retries, nack and dead letters in
//! tests/subscription_retries.rs.
#![cfg(feature = "integration")]

mod common;

use std::time::{Duration, Instant};

use common::pgbouncer::{rows, Pgbouncer};
use common::subscriptions::*;
use common::*;
use postgres::Config;

// --- resuming ----------------------------------------------------------------

#[test]
fn a_subscription_resumes_where_its_consumer_stopped_after_reconnecting() {
    let db = TestDb::new();
    let mut owner = db.connect();
    owner.batch_execute("SELECT streams.create_subscription('billing', 'orders', after => 0)").unwrap();
    let p = publish_events(&mut owner, "orders", 10, 3);

    let mut first = db.connect();
    assert_eq!(consume(&mut first, "billing", 4), p[..4]);
    drop(first);
    assert_eq!(progress(&mut owner, "billing").position, p[3]);

    // A consumer that polls and disconnects without committing: its events
    // come back once its session is gone.
    let mut lost = db.connect();
    let lost_pid = backend_pid(&mut lost);
    lost.batch_execute("BEGIN").unwrap();
    assert_eq!(poll(&mut lost, "billing", 3), p[4..7]);
    assert_eq!(progress(&mut owner, "billing").claimed, 3);
    drop(lost);
    wait_until("the lost session ends", Duration::from_secs(20), || !backend_exists(&mut owner, lost_pid));

    let mut again = db.connect();
    assert_eq!(consume(&mut again, "billing", 100), p[4..], "resumes after the last ack, with what was lost");
    assert_eq!(progress(&mut owner, "billing"), Progress { position: p[9], pending: 0, claimed: 0 });
    assert!(consume(&mut db.connect(), "billing", 100).is_empty(), "nothing twice");

    let later = publish_events(&mut owner, "orders", 2, 2);
    assert_eq!(consume(&mut db.connect(), "billing", 100), later);
}

/// Acks survive a crash (immediate stop) and a clean restart; claims of a
/// transaction open during the crash do not, so those events come again.
#[test]
fn a_subscription_resumes_after_a_server_restart() {
    let cluster = ScratchCluster::start(
        "subscriptions-restart",
        &["shared_preload_libraries = 'litebase_streams'", "track_commit_timestamp = on", "fsync = off"],
    );
    cluster.connect("postgres").batch_execute("CREATE DATABASE app").unwrap();
    let mut c = cluster.connect("app");
    c.batch_execute("CREATE EXTENSION litebase_streams").unwrap();
    cluster.wait_for_worker("app");
    c.batch_execute(
        "SELECT streams.create_subscription('in_order', 'orders', after => 0);
         SELECT streams.create_subscription('any_order', 'orders', after => 0, ordered => false)",
    )
    .unwrap();
    let p = publish_events(&mut c, "orders", 10, 2);
    let mut open = cluster.connect("app");
    open.batch_execute("BEGIN").unwrap();
    for sub in ["in_order", "any_order"] {
        assert_eq!(consume(&mut c, sub, 3), p[..3], "{sub}");
        assert_eq!(poll(&mut open, sub, 3), p[3..6], "{sub}: claimed by the transaction open in the crash");
    }

    cluster.restart("immediate");
    assert!(open.batch_execute("SELECT 1").is_err(), "the open transaction died with the server");
    let mut c = cluster.connect("app");
    cluster.wait_for_worker("app");
    wait_for_horizon(&mut c, p[9]);
    for sub in ["in_order", "any_order"] {
        assert_eq!(progress(&mut c, sub).position, p[2], "{sub}: the committed ack survived the crash");
        let mut tx = cluster.connect("app");
        tx.batch_execute("BEGIN").unwrap();
        assert_eq!(poll(&mut tx, sub, 100), p[3..], "{sub}: resumes after the ack, with the lost claims");
        ack(&mut tx, sub, p[6]);
        tx.batch_execute("COMMIT").unwrap();
    }

    cluster.restart("fast");
    let mut c = cluster.connect("app");
    cluster.wait_for_worker("app");
    for sub in ["in_order", "any_order"] {
        assert_eq!(consume(&mut c, sub, 100), p[7..], "{sub}: after a clean restart");
        // The horizon may have passed positions the crash took from the
        // sequence (no event has them): at or after the last event.
        let after = progress(&mut c, sub);
        assert!(after.position >= p[9] && after.pending == 0 && after.claimed == 0, "{sub}: {after:?}");
    }
}

fn seek_rewinds_to_reprocess_and_skips_ahead(ordered: bool) {
    let db = TestDb::new();
    let mut c = db.connect();
    // Five transactions of two events each.
    let p = publish_events(&mut c, "orders", 10, 2);
    let time_of_5th: String =
        c.query_one("SELECT time::text FROM streams.events WHERE position = $1", &[&p[4]]).unwrap().get(0);
    let tx_of_7th: String =
        c.query_one("SELECT tx::text FROM streams.events WHERE position = $1", &[&p[6]]).unwrap().get(0);
    c.batch_execute(&format!("SELECT streams.create_subscription('s', 'orders', after => 0, ordered => {ordered})"))
        .unwrap();
    assert_eq!(consume(&mut c, "s", 100), p);
    assert_eq!(progress(&mut c, "s").position, p[9]);

    let cases: [(String, &[i64]); 5] = [
        (format!("after => {}", p[2]), &p[3..]),
        (format!("after => {}", p[7]), &p[8..]),
        (format!("since => '{time_of_5th}'"), &p[4..]),
        (format!("from_tx => '{tx_of_7th}'"), &p[6..]),
        ("after => 0".into(), &p[..]),
    ];
    for (to, expected) in cases {
        c.batch_execute(&format!("SELECT streams.seek('s', {to})")).unwrap();
        assert_eq!(progress(&mut c, "s").pending, expected.len() as i64, "seek({to})");
        assert_eq!(consume(&mut c, "s", 100), expected, "after seek({to})");
    }
    // Rewind, then skip ahead before anything was consumed.
    c.batch_execute(&format!("SELECT streams.seek('s', after => 0); SELECT streams.seek('s', after => {})", p[8]))
        .unwrap();
    assert_eq!(consume(&mut c, "s", 100), [p[9]], "skipped ahead");

    // No argument: to the current horizon, skipping everything there is.
    c.batch_execute("SELECT streams.seek('s', after => 0); SELECT streams.seek('s')").unwrap();
    assert_eq!(progress(&mut c, "s"), Progress { position: p[9], pending: 0, claimed: 0 });
    assert!(consume(&mut c, "s", 100).is_empty(), "seek() skips to the horizon");
    let more = publish_events(&mut c, "orders", 1, 1);
    assert_eq!(consume(&mut c, "s", 100), more, "then new events only");
}

#[test]
fn seek_rewinds_to_reprocess_and_skips_ahead_in_order() {
    seek_rewinds_to_reprocess_and_skips_ahead(true);
}

#[test]
fn seek_rewinds_to_reprocess_and_skips_ahead_in_any_order() {
    seek_rewinds_to_reprocess_and_skips_ahead(false);
}

/// A rewind that runs while a consumer holds claims: once both are done,
/// every event is delivered again, also those the consumer acked after the
/// seek returned (an ordered subscription's seek waits for the holder).
fn a_rewind_reprocesses_events_a_consumer_acks_during_it(ordered: bool) {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute(&format!("SELECT streams.create_subscription('s', 'orders', after => 0, ordered => {ordered})"))
        .unwrap();
    let p = publish_events(&mut c, "orders", 10, 10);
    let mut consumer = db.connect();
    consumer.batch_execute("BEGIN").unwrap();
    assert_eq!(poll(&mut consumer, "s", 5), p[..5]);

    let mut seeker = db.connect();
    let seeker_pid = backend_pid(&mut seeker);
    let seek = std::thread::spawn(move || seeker.batch_execute("SELECT streams.seek('s', after => 0)"));
    wait_until("the seek is done or waits for the consumer", Duration::from_secs(20), || {
        seek.is_finished()
            || c.query_one("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", &[&seeker_pid])
                .unwrap()
                .get::<_, Option<bool>>(0)
                == Some(true)
    });
    ack(&mut consumer, "s", p[4]);
    consumer.batch_execute("COMMIT").unwrap();
    seek.join().unwrap().unwrap();

    assert_eq!(consume(&mut c, "s", 100), p, "seek(after => 0) returned: everything is delivered again");
}

#[test]
fn a_rewind_reprocesses_events_a_consumer_acks_during_it_in_order() {
    a_rewind_reprocesses_events_a_consumer_acks_during_it(true);
}

#[test]
fn a_rewind_reprocesses_events_a_consumer_acks_during_it_in_any_order() {
    a_rewind_reprocesses_events_a_consumer_acks_during_it(false);
}

// --- long polls ------------------------------------------------------------------

fn long_poll_returns_an_event_published_while_it_waits(config: &Config, db: &TestDb) {
    let mut admin = db.connect();
    admin.batch_execute("SELECT streams.create_subscription('waiting', 'orders')").unwrap();
    publish_events(&mut admin, "other", 1, 1); // not for it: it keeps waiting
    let poller = LongPoll::start(config, "waiting", "10s", "");
    poller.wait_until_sleeping(&mut admin);
    let published_at = Instant::now();
    let position = publish(&mut admin, "orders", "{}");
    let (got, _) = poller.join();
    assert_eq!(got.unwrap(), [position]);
    assert!(
        published_at.elapsed() < Duration::from_secs(5),
        "returned {:?} after the publish: woken, not at the end of its wait",
        published_at.elapsed()
    );
}

#[test]
fn a_long_poll_returns_an_event_published_while_it_waits() {
    let db = TestDb::new();
    long_poll_returns_an_event_published_while_it_waits(&db.config(), &db);
}

#[test]
fn a_long_poll_through_pgbouncer_returns_an_event_published_while_it_waits() {
    let db = TestDb::new();
    let bouncer = Pgbouncer::start();
    long_poll_returns_an_event_published_while_it_waits(&bouncer.config(&db.name), &db);
}

/// CPU time (user + system) process `pid` used so far.
fn cpu_time(pid: i32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/<pid>/stat");
    // Fields after the parenthesised command name start with field 3 (state);
    // utime and stime are fields 14 and 15, in clock ticks.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let out = std::process::Command::new("getconf").arg("CLK_TCK").output().expect("getconf runs");
    let per_second: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(100);
    Duration::from_micros(ticks * 1_000_000 / per_second)
}

#[test]
fn a_long_poll_costs_no_cpu_while_it_waits() {
    let db = TestDb::new();
    let bouncer = Pgbouncer::start();
    let mut admin = db.connect();
    admin.batch_execute("SELECT streams.create_subscription('idle', 'orders')").unwrap();
    let poller = LongPoll::start(&bouncer.config(&db.name), "idle", "8s", "");
    poller.wait_until_sleeping(&mut admin);
    let pid = poller.pid;
    let (cpu_before, started) = (cpu_time(pid), Instant::now());
    let (got, took) = poller.join();
    let waited = started.elapsed();
    assert!(got.unwrap().is_empty());
    // Most of the wait is measured (a loaded machine may take a moment to get here).
    assert!(took >= Duration::from_secs(8) && waited >= Duration::from_secs(4), "it waited: {took:?}, {waited:?}");
    let used = cpu_time(pid) - cpu_before;
    assert!(used < Duration::from_millis(200), "{used:?} of CPU in a {waited:?} wait");
}

/// statement_timeout, pg_cancel_backend, the client's cancel request and
/// pg_terminate_backend end a long poll at once, directly and through pgbouncer.
#[test]
fn a_long_poll_ends_at_once_on_timeout_cancel_or_terminate() {
    let db = TestDb::new();
    let bouncer = Pgbouncer::start();
    let mut admin = db.connect();
    admin.batch_execute("SELECT streams.create_subscription('interrupted', 'orders')").unwrap();
    for (via, config) in [("direct", db.config()), ("pgbouncer", bouncer.config(&db.name))] {
        let poller = LongPoll::start(&config, "interrupted", "30s", "SET LOCAL statement_timeout = '300ms'");
        let (got, took) = poller.join();
        let err = got.expect_err("statement_timeout ends the poll");
        assert_eq!(sqlstate(&err), "57014", "{via}: {err}");
        assert!(took < Duration::from_secs(5), "{via}: statement_timeout ended it after {took:?}");

        let poller = LongPoll::start(&config, "interrupted", "30s", "");
        poller.wait_until_sleeping(&mut admin);
        admin.execute("SELECT pg_cancel_backend($1)", &[&poller.pid]).unwrap();
        let (got, took) = poller.join();
        let err = got.expect_err("a cancel ends the poll");
        assert_eq!(sqlstate(&err), "57014", "{via}: {err}");
        assert!(took < Duration::from_secs(10), "{via}: the cancel ended it after {took:?}");

        // The client's own cancel request. Not through pgbouncer: tokio-postgres
        // closes the cancel connection right after writing the request, and
        // pgbouncer 1.18 then drops it ("client unexpected eof"), for any
        // query (libpq waits for the close and gets through).
        if via == "direct" {
            let poller = LongPoll::start(&config, "interrupted", "30s", "");
            poller.wait_until_sleeping(&mut admin);
            poller.cancel.cancel_query(postgres::NoTls).unwrap();
            let (got, took) = poller.join();
            let err =
                got.map(|events| panic!("{via}: the cancel request did not end the poll ({events:?})")).unwrap_err();
            assert_eq!(sqlstate(&err), "57014", "{via}: {err}");
            assert!(took < Duration::from_secs(10), "{via}: the client's cancel ended it after {took:?}");
        }

        let poller = LongPoll::start(&config, "interrupted", "30s", "");
        poller.wait_until_sleeping(&mut admin);
        let gone: bool = admin.query_one("SELECT pg_terminate_backend($1, 10000)", &[&poller.pid]).unwrap().get(0);
        assert!(gone, "{via}: the polling backend exits when terminated");
        let (got, took) = poller.join();
        assert!(got.is_err(), "{via}: the client learns its poll died");
        assert!(took < Duration::from_secs(10), "{via}: terminate ended it after {took:?}");
    }
    // The subscription still works.
    let p = publish(&mut admin, "orders", "{}");
    wait_for_horizon(&mut admin, p);
    assert_eq!(consume(&mut admin, "interrupted", 10), [p]);
}

#[test]
fn a_fast_shutdown_is_not_held_up_by_a_long_poll() {
    let cluster = ScratchCluster::start(
        "subscriptions-shutdown",
        &["shared_preload_libraries = 'litebase_streams'", "track_commit_timestamp = on", "fsync = off"],
    );
    cluster.connect("postgres").batch_execute("CREATE DATABASE app").unwrap();
    let mut admin = cluster.connect("app");
    admin
        .batch_execute("CREATE EXTENSION litebase_streams; SELECT streams.create_subscription('s', 'orders')")
        .unwrap();
    cluster.wait_for_worker("app");
    let poller = LongPoll::start(&cluster.config("app"), "s", "60s", "");
    poller.wait_until_sleeping(&mut admin);
    drop(admin);

    let started = Instant::now();
    cluster.pg_ctl(&["-m", "fast", "stop"]);
    let stopped_in = started.elapsed();
    let (got, _) = poller.join();
    assert!(got.is_err(), "the polling client gets an error when the server shuts down");
    assert!(stopped_in < Duration::from_secs(30), "the fast shutdown took {stopped_in:?}");
}

// --- streams ---------------------------------------------------------------------

#[test]
fn a_prefix_subscription_returns_only_its_streams() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute(
        "SELECT streams.create_subscription('payments', 'payment.*', after => 0);
         SELECT streams.create_subscription('payments_any_order', 'payment.*', after => 0, ordered => false);
         SELECT streams.create_subscription('just_orders', 'orders', after => 0);
         SELECT streams.create_subscription('everything', after => 0)",
    )
    .unwrap();
    let mut expected = Vec::new();
    let mut all = Vec::new();
    for round in 0..3 {
        for stream in ["payment.success", "orders", "payment", "paymentx", "payment.failed", "payment.eu.card", "pay"] {
            let position = publish(&mut c, stream, &format!(r#"{{"round":{round}}}"#));
            all.push(position);
            if stream.starts_with("payment.") {
                expected.push(position);
            }
        }
    }
    wait_for_horizon(&mut c, *all.last().unwrap());
    for sub in ["payments", "payments_any_order"] {
        assert_eq!(progress(&mut c, sub).pending, expected.len() as i64, "{sub}");
        c.batch_execute("BEGIN").unwrap();
        let got: Vec<(i64, String)> =
            rows(&mut c, &format!("SELECT position, stream FROM streams.poll('{sub}', 1000)"))
                .unwrap()
                .into_iter()
                .map(|r| (r[0].as_deref().unwrap().parse().unwrap(), r[1].clone().unwrap()))
                .collect();
        assert!(got.iter().all(|(_, s)| s.starts_with("payment.")), "{sub} returned {got:?}");
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), expected, "{sub}");
        ack(&mut c, sub, *expected.last().unwrap());
        c.batch_execute("COMMIT").unwrap();
        assert_eq!(progress(&mut c, sub).pending, 0, "{sub}: other streams are not pending");
    }
    let orders: Vec<i64> = all.iter().copied().skip(1).step_by(7).collect();
    assert_eq!(consume(&mut c, "just_orders", 1000), orders);
    assert_eq!(consume(&mut c, "everything", 1000), all);
}

// --- bad input ---------------------------------------------------------------------

#[test]
fn bad_arguments_fail_with_their_sqlstate_and_change_nothing() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute("SELECT streams.create_subscription('s', 'orders', after => 0)").unwrap();
    let p = publish_events(&mut c, "orders", 5, 5);
    let before = stored_subscriptions(&mut c);

    for (sql, state) in [
        ("SELECT * FROM streams.poll('nope')", "42704"),
        ("SELECT streams.ack('nope', 1)", "42704"),
        ("SELECT streams.seek('nope', after => 0)", "42704"),
        ("SELECT streams.create_subscription('s')", "42710"),
        ("SELECT streams.create_subscription('s', 'payment.*', after => 0)", "42710"),
        ("SELECT streams.create_subscription('t', 'pay*ment*')", "22023"),
        ("SELECT streams.create_subscription('t', 'a b')", "22023"),
        ("SELECT streams.create_subscription('t', '')", "22023"),
        ("SELECT streams.create_subscription('bad name', 'orders')", "22023"),
        ("SELECT streams.create_subscription('', 'orders')", "22023"),
        ("SELECT streams.create_subscription('t', 'orders', after => -1)", "22023"),
        ("SELECT streams.create_subscription('t', 'orders', after => 0, since => now())", "22023"),
        ("SELECT streams.create_subscription(NULL, 'orders')", "22004"),
        ("SELECT streams.create_subscription('t', NULL)", "22004"),
        ("SELECT streams.create_subscription('t', 'orders', ordered => NULL)", "22004"),
        ("SELECT * FROM streams.poll('s', 0)", "22023"),
        ("SELECT * FROM streams.poll('s', -1)", "22023"),
        ("SELECT * FROM streams.poll('s', 10001)", "22023"),
        ("SELECT * FROM streams.poll('s', 10, '-1 second')", "22023"),
        ("SELECT * FROM streams.poll('s', 10, '-1 day 1 hour')", "22023"),
        ("SELECT * FROM streams.poll(NULL)", "22004"),
        ("SELECT * FROM streams.poll('s', NULL)", "22004"),
        ("SELECT * FROM streams.poll('s', 10, NULL)", "22004"),
        ("SELECT streams.ack('s', NULL)", "22004"),
        ("SELECT streams.ack('s', 1)", "22023"),
        ("SELECT streams.seek('s', after => -1)", "22023"),
        ("SELECT streams.seek('s', after => 1, from_tx => '1')", "22023"),
    ] {
        fails_with(&mut c, sql, state);
    }
    assert!(!c.query_one("SELECT streams.drop_subscription('nope')", &[]).unwrap().get::<_, bool>(0));
    assert_eq!(stored_subscriptions(&mut c), before, "nothing created, changed or moved");

    // An ack beyond what the transaction polled, or with nothing polled.
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(poll(&mut c, "s", 3), p[..3]);
    fails_with(&mut c, &format!("SELECT streams.ack('s', {})", p[3]), "22023");
    c.batch_execute("ROLLBACK").unwrap();
    c.batch_execute("BEGIN").unwrap();
    fails_with(&mut c, &format!("SELECT streams.ack('s', {})", p[0]), "22023");
    c.batch_execute("ROLLBACK").unwrap();
    // Polled in one transaction, acked in the next.
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(poll(&mut c, "s", 3), p[..3]);
    c.batch_execute("COMMIT; BEGIN").unwrap();
    fails_with(&mut c, &format!("SELECT streams.ack('s', {})", p[0]), "22023");
    c.batch_execute("ROLLBACK").unwrap();
    assert_eq!(stored_subscriptions(&mut c), before, "the position did not move");
    assert_eq!(progress(&mut c, "s"), Progress { position: 0, pending: 5, claimed: 0 });
    assert_eq!(consume(&mut c, "s", 10), p, "every event is still there");
}
