//! A delivery round that fails is logged, rolled back and retried; publishers
//! are not affected and nothing is lost or repeated.
#![cfg(feature = "integration")]

mod common;

use std::time::{Duration, Instant};

use common::*;

#[test]
fn failing_round_is_retried_and_publishers_are_unaffected() {
    let db = TestDb::new();
    let mut listener = Listener::new(&db, &["orders"]);
    let mut blocker = db.connect();
    let mut publisher = db.connect();
    let mut observer = db.connect();

    // Hold a lock the worker needs: its rounds fail with lock_timeout.
    blocker.batch_execute("BEGIN; LOCK TABLE streams.horizon_state IN ACCESS EXCLUSIVE MODE").unwrap();
    let started = Instant::now();
    let positions: Vec<i64> = (0..3).map(|i| publish(&mut publisher, "orders", &format!(r#"{{"i":{i}}}"#))).collect();
    assert!(started.elapsed() < Duration::from_secs(1), "publishers do not wait for the worker");

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let state: String =
            observer.query_one("SELECT worker_state FROM streams._worker_status()", &[]).unwrap().get(0);
        if state == "retrying" {
            break;
        }
        assert!(Instant::now() < deadline, "the worker reports its failing rounds (state {state})");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(listener.next(Duration::from_millis(200)).is_none(), "nothing delivered while rounds fail");

    blocker.batch_execute("COMMIT").unwrap();
    let received: Vec<i64> = listener.positions(positions.len(), Duration::from_secs(15));
    assert_eq!(received, positions);
    assert!(listener.next(Duration::from_millis(500)).is_none(), "and nothing twice");
}

/// A restore that commits while a round is under way (pg_restore's COPY of
/// `streams.horizon_state`, here an UPDATE by a superuser) is never
/// overwritten by that round: the round gives up, and the next one reads the
/// restored row and starts a new era of transaction ids at its horizon.
#[test]
fn a_restore_committing_during_a_round_starts_a_new_era_instead_of_being_overwritten() {
    let db = TestDb::new();
    let worker = db.wait_for_worker();
    let mut publisher = db.connect();
    let mut restorer = db.connect();
    let mut observer = db.connect();
    let first = publish(&mut publisher, "orders", "{}");
    wait_for_horizon(&mut publisher, first);
    let eras = |c: &mut postgres::Client| -> Option<Vec<i64>> {
        c.query_one("SELECT era_bounds FROM streams.horizon_state", &[]).unwrap().get(0)
    };
    assert_eq!(eras(&mut observer), None, "one era so far");

    restorer.batch_execute("BEGIN; UPDATE streams.horizon_state SET system_identifier = 42").unwrap();
    let second = publish(&mut publisher, "orders", "{}");
    wait_until("the worker's round waits for the restored row", Duration::from_secs(10), || {
        let waiting: Option<String> = observer
            .query_one("SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", &[&worker])
            .unwrap()
            .get(0);
        waiting.as_deref() == Some("Lock")
    });
    restorer.batch_execute("COMMIT").unwrap();

    wait_for_horizon(&mut publisher, second);
    assert_eq!(eras(&mut observer), Some(vec![first]), "a new era starts after the restored horizon");
    let mine: i64 = observer.query_one("SELECT system_identifier FROM pg_control_system()", &[]).unwrap().get(0);
    let written_by: i64 =
        observer.query_one("SELECT system_identifier FROM streams.horizon_state", &[]).unwrap().get(0);
    assert_eq!(written_by, mine, "and the row is this cluster's again");
    let timed: i64 = observer
        .query_one(
            "SELECT count(*) FROM streams.events e WHERE e.position = $1
             AND e.time = pg_xact_commit_timestamp(e.tx::xid)",
            &[&second],
        )
        .unwrap()
        .get(0);
    assert_eq!(timed, 1, "the event the given-up round read is made final with its commit time");
}
