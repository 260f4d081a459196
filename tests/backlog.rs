//! `litebase_streams.max_backlog`: publishers cannot run further ahead of the
//! worker than the limit. While the worker is stopped, a transaction's first
//! publish waits once the backlog is full; when the worker runs again, the
//! publishers go on and every event becomes visible.
//!
//! A test binary of its own: the setting is server-wide, and other tests'
//! publishers must not be slowed by it.
#![cfg(feature = "integration")]

mod common;

use std::time::Duration;

use common::*;

#[test]
fn publishers_wait_while_the_worker_is_too_far_behind() {
    let db = TestDb::new();
    let worker = db.wait_for_worker();
    let _limit = SystemSetting::set("litebase_streams.max_backlog", "5");
    let mut c = db.connect();
    wait_until("the setting reaches new sessions", Duration::from_secs(10), || {
        db.connect().query_one("SHOW litebase_streams.max_backlog", &[]).unwrap().get::<_, String>(0) == "5"
    });
    let first = publish(&mut c, "orders", "{}"); // this backend knows its database's worker from now on
    wait_for_horizon(&mut c, first);

    let stopped = StoppedWorker::stop(&mut admin(), worker);
    let config = db.config();
    let publisher = std::thread::spawn(move || {
        let mut c = config.connect(postgres::NoTls).unwrap();
        c.batch_execute("SET application_name = 'backlog-publisher'").unwrap();
        (0..40).map(|_| publish(&mut c, "orders", "{}")).last().unwrap()
    });
    let waiting = || -> bool {
        admin()
            .query_one(
                "SELECT count(*) > 0 FROM pg_stat_activity
                 WHERE application_name = 'backlog-publisher' AND wait_event_type = 'Extension'",
                &[],
            )
            .unwrap()
            .get(0)
    };
    wait_until("the publisher waits for the stopped worker", Duration::from_secs(30), waiting);
    assert!(horizon(&mut c) == first, "nothing became visible while the worker was stopped");

    drop(stopped);
    wait_until("the publisher finishes once the worker runs", Duration::from_secs(60), || publisher.is_finished());
    let last = publisher.join().unwrap();
    wait_for_horizon(&mut c, last);
    assert_eq!(count_stored(&mut c), 41, "every event was stored");
}

/// Positions above one an open transaction holds cannot become visible
/// before it ends, however fast the worker is: they are not the worker's
/// backlog, and publishers do not wait for them (each would wait the full
/// second, for nothing).
#[test]
fn an_open_publishing_transaction_slows_nobody_down() {
    let db = TestDb::new();
    let _limit = SystemSetting::set("litebase_streams.max_backlog", "5");
    let mut c = db.connect();
    wait_until("the setting reaches new sessions", Duration::from_secs(10), || {
        db.connect().query_one("SHOW litebase_streams.max_backlog", &[]).unwrap().get::<_, String>(0) == "5"
    });
    let first = publish(&mut c, "orders", "{}");
    wait_for_horizon(&mut c, first);
    let mut holder = db.connect();
    holder.batch_execute("BEGIN; SELECT streams.publish('orders', '{}')").unwrap();

    let config = db.config();
    let publisher = std::thread::spawn(move || {
        let mut c = config.connect(postgres::NoTls).unwrap();
        (0..20).map(|_| publish(&mut c, "orders", "{}")).last().unwrap()
    });
    // Throttled, the twenty would take twenty seconds.
    wait_until("twenty publishes behind the open transaction", Duration::from_secs(10), || publisher.is_finished());
    let last = publisher.join().unwrap();
    assert!(horizon(&mut c) < last, "they wait for the open transaction to become visible");
    holder.batch_execute("COMMIT").unwrap();
    wait_for_horizon(&mut c, last);
}
