//! The worker keeps events visible and correct whatever the database's and
//! roles' settings, and the extension refuses what it cannot serve.
#![cfg(feature = "integration")]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;

/// With hostile `ALTER DATABASE ... SET`s (repeatable read, read-only,
/// tiny statement timeout, replica role, a search_path without pg_catalog
/// first) and a worker restarted under them, concurrent publishers' events
/// all become visible with their commit time and are notified once, in order.
#[test]
fn worker_pins_its_session_settings() {
    let db = TestDb::new();
    let mut owner = db.connect();
    let mut listener = Listener::new(&db, &["orders"]);
    owner
        .batch_execute(&format!(
            "ALTER DATABASE {0} SET default_transaction_isolation = 'repeatable read';
             ALTER DATABASE {0} SET default_transaction_read_only = on;
             ALTER DATABASE {0} SET statement_timeout = '1ms';
             ALTER DATABASE {0} SET lock_timeout = '1ms';
             ALTER DATABASE {0} SET session_replication_role = 'replica';
             ALTER DATABASE {0} SET search_path = public;
             ALTER DATABASE {0} SET synchronous_commit = 'remote_apply';",
            db.name
        ))
        .unwrap();
    let old = db.wait_for_worker();
    admin().execute("SELECT pg_terminate_backend($1)", &[&old]).unwrap();
    wait_until("a new worker starts under the hostile settings", Duration::from_secs(20), || {
        db.wait_for_worker() != old
    });

    // Clients undo the hostile settings in their startup packet, which
    // outranks the database's; the worker has to do it on its own.
    let mut sane = db.config();
    sane.options(
        "-c default_transaction_read_only=off -c statement_timeout=0 -c lock_timeout=0 \
         -c default_transaction_isolation=read\\ committed -c synchronous_commit=on",
    );
    let publishers: Vec<_> = (0..8)
        .map(|i| {
            let config = sane.clone();
            std::thread::spawn(move || {
                let mut c = config.connect(postgres::NoTls).unwrap();
                (0..50).map(|n| publish(&mut c, "orders", &format!(r#"{{"p":{i},"n":{n}}}"#))).collect::<Vec<i64>>()
            })
        })
        .collect();
    let committed: BTreeSet<i64> = publishers.into_iter().flat_map(|t| t.join().unwrap()).collect();

    let received = listener.positions(committed.len(), Duration::from_secs(20));
    assert_eq!(received.len(), committed.len(), "every event was notified");
    assert!(received.windows(2).all(|w| w[0] < w[1]), "in order, once each");
    assert_eq!(received.iter().copied().collect::<BTreeSet<i64>>(), committed);

    let mut reader = sane.connect(postgres::NoTls).unwrap();
    let untimed: i64 = reader.query_one("SELECT count(*) FROM streams.events WHERE time IS NULL", &[]).unwrap().get(0);
    let visible: i64 = reader.query_one("SELECT count(*) FROM streams.events", &[]).unwrap().get(0);
    assert_eq!((visible, untimed), (committed.len() as i64, 0), "all visible, each with its commit time");
    reader.batch_execute(&format!("ALTER DATABASE {} RESET ALL", db.name)).unwrap();
}

/// Notifications and events are JSON text in UTF-8: a database with another
/// encoding is refused at CREATE EXTENSION, with a hint, instead of storing
/// events the worker could never deliver.
#[test]
fn create_extension_refuses_a_non_utf8_database() {
    let name = format!("lbs_latin1_{}", std::process::id());
    let mut admin = admin();
    admin
        .batch_execute(&format!(
            "CREATE DATABASE {name} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
        ))
        .unwrap();
    let mut config = base_config();
    config.dbname(&name);
    let result = config.connect(postgres::NoTls).unwrap().batch_execute("CREATE EXTENSION litebase_streams");
    admin.batch_execute(&format!("DROP DATABASE {name}")).unwrap();
    let err = result.expect_err("CREATE EXTENSION must fail in a LATIN1 database");
    assert_eq!(sqlstate(&err), "0A000");
    let hint = err.as_db_error().and_then(|e| e.hint()).unwrap_or_default().to_owned();
    assert!(hint.contains("UTF8"), "{hint}");
}

/// `streams.status` takes no transaction id and writes nothing, so it works
/// in a read-only transaction (and on a standby).
#[test]
fn status_works_read_only_without_a_transaction_id() {
    let db = TestDb::new();
    let mut c = db.connect();
    publish(&mut c, "orders", "{}");
    c.batch_execute("BEGIN READ ONLY").unwrap();
    c.query_one("SELECT * FROM streams.status", &[]).unwrap();
    let xid: Option<String> = c.query_one("SELECT pg_current_xact_id_if_assigned()::text", &[]).unwrap().get(0);
    assert_eq!(xid, None, "status assigned a transaction id");
    c.batch_execute("COMMIT").unwrap();
}

/// DROP and CREATE EXTENSION start a new log whose positions restart: its
/// log_id (readable by readers, shown in status) changes, so a client can
/// tell its saved position belongs to another log.
#[test]
fn a_recreated_log_has_a_new_log_id() {
    let db = TestDb::new();
    let mut c = db.connect();
    let first: uuid_text::Uuid = uuid_text::get(&mut c, "SELECT streams.log_id()::text");
    let in_status: uuid_text::Uuid = uuid_text::get(&mut c, "SELECT log_id::text FROM streams.status");
    assert_eq!(first, in_status);
    c.batch_execute("DROP EXTENSION litebase_streams; CREATE EXTENSION litebase_streams").unwrap();
    let second = uuid_text::get(&mut c, "SELECT streams.log_id()::text");
    assert_ne!(first, second);
}

/// A re-created log takes publishes at once, also in the transaction that
/// re-creates it: the worker's shared memory holds the old log's horizon
/// until its first round on the new one, and the new log's positions (from
/// 1 again) are below it; each is checked only against its own log's horizon.
#[test]
fn a_recreated_log_takes_publishes_at_once() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute("SELECT streams.publish_batch('orders', array_fill('{}'::jsonb, ARRAY[50]))").unwrap();
    let last: i64 = c.query_one("SELECT max(position) FROM streams.event_log", &[]).unwrap().get(0);
    wait_for_horizon(&mut c, last);
    for round in 0..3 {
        let mut tx = c.transaction().unwrap();
        tx.batch_execute("DROP EXTENSION litebase_streams; CREATE EXTENSION litebase_streams").unwrap();
        let position = tx
            .query_one("SELECT streams.publish('orders', '{}')", &[])
            .unwrap_or_else(|e| panic!("publish in the transaction re-creating the log (round {round}): {e}"))
            .get::<_, i64>(0);
        tx.commit().unwrap();
        assert_eq!(position, 1, "a new log starts at 1");
        wait_for_horizon(&mut c, 1);
        c.batch_execute("SELECT streams.publish_batch('orders', array_fill('{}'::jsonb, ARRAY[50]))").unwrap();
        wait_for_horizon(&mut c, 51);
    }
}

mod uuid_text {
    pub type Uuid = String;
    pub fn get(c: &mut postgres::Client, sql: &str) -> Uuid {
        c.query_one(sql, &[]).unwrap().get(0)
    }
}

/// A role that may not drop a database cannot stop its worker by trying, and
/// a DROP DATABASE that fails (the database is in use) leaves delivery
/// running: the worker it stopped comes back.
#[test]
fn a_failed_drop_database_leaves_delivery_running() {
    let db = TestDb::new();
    let stranger = TestRole::new(&db, "stranger", "");
    let worker = db.wait_for_worker();
    let mut config = base_config();
    config.user(&stranger.name);
    let err =
        config.connect(postgres::NoTls).unwrap().batch_execute(&format!("DROP DATABASE {}", db.name)).unwrap_err();
    assert_eq!(sqlstate(&err), "42501");
    let mut c = db.connect();
    let mut listener = Listener::new(&db, &["orders"]);
    let p = publish(&mut c, "orders", "{}");
    assert_eq!(listener.positions(1, Duration::from_secs(10)), vec![p], "delivery goes on");
    assert_eq!(db.wait_for_worker(), worker, "the same worker, never stopped");

    // In use (the listener and c are connected): the drop fails after the worker was stopped.
    let err = admin().batch_execute(&format!("DROP DATABASE {}", db.name)).unwrap_err();
    assert_eq!(sqlstate(&err), "55006", "{err}");
    let p = publish(&mut c, "orders", "{}");
    assert_eq!(listener.positions(1, Duration::from_secs(20)), vec![p], "a worker delivers again");
    let status: String = c.query_one("SELECT worker_state FROM streams.status", &[]).unwrap().get(0);
    assert_ne!(status, "not running");
}

/// A worker terminated just before its database is dropped (here by
/// pg_terminate_backend; DROP DATABASE ... WITH (FORCE) does the same to a
/// worker still starting) is restarted by the postmaster a second later,
/// when the database is gone: it leaves for good, instead of failing to
/// connect and being restarted every second until the server stops.
#[test]
fn a_worker_restarted_after_its_database_was_dropped_leaves_for_good() {
    let log = std::env::var("LITEBASE_STREAMS_SERVER_LOG").expect("LITEBASE_STREAMS_SERVER_LOG");
    let log_size = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0) as usize;
    let db = TestDb::new();
    let worker = db.wait_for_worker();
    let mut admin = admin();
    let oid: i64 = admin.query_one("SELECT oid::int8 FROM pg_database WHERE datname = $1", &[&db.name]).unwrap().get(0);
    admin.query_one("SELECT pg_terminate_backend($1)", &[&worker]).unwrap();
    admin.batch_execute(&format!("DROP DATABASE {}", db.name)).unwrap();
    let left = format!("for database {oid}: the database was dropped; not restarting");
    let failed = format!("database {oid} does not exist");
    let mut since = String::new();
    wait_until("the restarted worker leaves or fails", Duration::from_secs(20), || {
        let bytes = std::fs::read(&log).unwrap_or_default();
        since = String::from_utf8_lossy(&bytes[log_size.min(bytes.len())..]).into_owned();
        since.contains(&left) || since.contains(&failed)
    });
    assert!(!since.contains(&failed), "the restarted worker tried to connect:\n{since}");
    assert!(since.contains(&left), "{since}");
}

/// A publish that fails while taking its first position (here: in a
/// read-only transaction) inside a savepoint that is rolled back leaves no
/// trace: the transaction stays open, yet the horizon moves past later
/// events and `streams.status` answers at once.
#[test]
fn a_failed_first_publish_in_a_savepoint_holds_nothing() {
    let db = TestDb::new();
    let mut stuck = db.connect();
    stuck.batch_execute("BEGIN READ ONLY; SAVEPOINT s").unwrap();
    let err = stuck.batch_execute("SELECT streams.publish('orders', '{}')").unwrap_err();
    assert_eq!(sqlstate(&err), "25006", "{err}");
    stuck.batch_execute("ROLLBACK TO s").unwrap();

    let mut c = db.connect();
    c.batch_execute("SET statement_timeout = '5s'").unwrap();
    let p = publish(&mut c, "orders", "{}");
    wait_for_horizon(&mut c, p);
    let holder: Option<i32> = c.query_one("SELECT holder_pid FROM streams.status", &[]).unwrap().get(0);
    assert_eq!(holder, None, "nothing holds the horizon");
    stuck.batch_execute("COMMIT").unwrap();
}

/// A publisher whose first position waits on the sequence's lock (someone
/// holds ALTER SEQUENCE open) stalls neither `streams.status` nor the worker,
/// and `pg_cancel_backend` ends its wait without leaving anything held.
#[test]
fn a_publisher_waiting_for_the_sequence_stalls_nobody() {
    let db = TestDb::new();
    let first = publish(&mut db.connect(), "orders", "{}");
    let mut locker = db.connect();
    locker.batch_execute("BEGIN; ALTER SEQUENCE streams.position_seq CACHE 1").unwrap();
    let config = db.config();
    let waiting = std::thread::spawn(move || {
        let mut c = config.connect(postgres::NoTls).unwrap();
        c.batch_execute("SELECT streams.publish('orders', '{}')")
    });
    let pid = || -> Option<i32> {
        admin()
            .query_opt(
                "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'
                   AND query LIKE '%streams.publish%'",
                &[&db.name],
            )
            .unwrap()
            .map(|r| r.get(0))
    };
    wait_until("the publisher waits for the sequence", Duration::from_secs(20), || pid().is_some());
    let publisher = pid().unwrap();

    let config = db.config();
    let status = std::thread::spawn(move || {
        let mut c = config.connect(postgres::NoTls).unwrap();
        c.query_one("SELECT worker_state, holder_pid FROM streams.status", &[]).map(|r| r.get::<_, Option<i32>>(1))
    });
    wait_until("streams.status answers while the publisher waits", Duration::from_secs(10), || status.is_finished());
    assert_eq!(status.join().unwrap().unwrap(), Some(publisher), "status names the waiting publisher");

    admin().execute("SELECT pg_cancel_backend($1)", &[&publisher]).unwrap();
    wait_until("the cancelled publish returns", Duration::from_secs(10), || waiting.is_finished());
    let err = waiting.join().unwrap().unwrap_err();
    assert_eq!(sqlstate(&err), "57014", "{err}");
    locker.batch_execute("COMMIT").unwrap();

    let mut c = db.connect();
    let p = publish(&mut c, "orders", "{}");
    assert!(p > first);
    wait_for_horizon(&mut c, p);
    let holder: Option<i32> = c.query_one("SELECT holder_pid FROM streams.status", &[]).unwrap().get(0);
    assert_eq!(holder, None, "the cancelled publisher holds nothing");
}

/// At a high publish rate the log's BRIN indexes neither flood the server
/// log ("request for BRIN range summarization ... was not recorded", one line
/// per range once autovacuum's request queue is full) nor stay unsummarised:
/// the worker summarises new ranges, so a lookup by tx reads one range, not
/// the whole new tail of the table.
#[test]
fn brin_ranges_are_summarised_without_flooding_the_log() {
    let log = std::env::var("LITEBASE_STREAMS_SERVER_LOG").expect("LITEBASE_STREAMS_SERVER_LOG");
    let log_size = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute(
        "DO $$ BEGIN FOR i IN 1..400 LOOP
             PERFORM count(*) FROM streams.publish_batch('orders',
                 ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(1, 1000) g));
             COMMIT;
         END LOOP; END $$",
    )
    .unwrap();
    let newest: i64 = c.query_one("SELECT max(position) FROM streams.event_log", &[]).unwrap().get(0);
    wait_for_horizon(&mut c, newest);
    let tx: String = c.query_one("SELECT tx::text FROM streams.event_log WHERE position = 1000", &[]).unwrap().get(0);
    wait_until("a lookup by tx reads a few block ranges, not the unsummarised tail", Duration::from_secs(90), || {
        let plan: Vec<String> = c
            .query(
                &format!("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) SELECT * FROM streams.event_log WHERE tx = '{tx}'"),
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        let lossy: i64 = plan
            .iter()
            .find_map(|l| l.split("lossy=").nth(1))
            .and_then(|n| n.split_whitespace().next()?.parse().ok())
            .unwrap_or(i64::MAX);
        lossy <= 64
    });
    let text = std::fs::read(&log).unwrap_or_default();
    let added = String::from_utf8_lossy(&text[(log_size as usize).min(text.len())..]).into_owned();
    let flood = added.lines().filter(|l| l.contains("was not recorded")).count();
    assert_eq!(flood, 0, "BRIN summarization requests flooded the server log");
}

/// While an open publishing transaction holds the horizon, the worker waits
/// for it instead of running a round (a transaction) per commit that cannot
/// advance anything; once it ends, everything becomes visible.
#[test]
fn a_held_horizon_costs_no_rounds() {
    let db = TestDb::new();
    let mut c = db.connect();
    let first = publish(&mut c, "orders", "{}");
    wait_for_horizon(&mut c, first);
    let mut holder = db.connect();
    holder.batch_execute("BEGIN; SELECT streams.publish('orders', '{}')").unwrap();
    let rounds =
        |c: &mut postgres::Client| -> i64 { c.query_one("SELECT rounds FROM streams.status", &[]).unwrap().get(0) };
    // The round that sees the holder first, then quiet.
    let mut seen = rounds(&mut c);
    wait_until("the worker settles behind the holder", Duration::from_secs(10), || {
        let now = rounds(&mut c);
        let settled = now == seen;
        seen = now;
        settled && c.query_one("SELECT holder_pid IS NOT NULL FROM streams.status", &[]).unwrap().get::<_, bool>(0)
    });
    let before = rounds(&mut c);
    let started = std::time::Instant::now();
    let mut last = 0;
    for _ in 0..300 {
        last = publish(&mut c, "orders", "{}"); // each commit wakes the worker
    }
    let elapsed = started.elapsed();
    let ran = rounds(&mut c) - before;
    // One round per idle_poll (1 s), which enforces hold_timeout, and no more.
    let allowed = 2 + elapsed.as_secs() as i64;
    assert!(ran <= allowed, "{ran} rounds in {elapsed:?} while the horizon was held (at most {allowed})");
    assert!(horizon(&mut c) < last, "nothing after the holder is visible yet");
    holder.batch_execute("COMMIT").unwrap();
    wait_for_horizon(&mut c, last);
}
