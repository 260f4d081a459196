//! A delivery round that fails is logged, rolled back and retried; publishers
//! are not affected and nothing is lost or repeated.

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
