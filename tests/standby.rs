//! Hot standbys: a streaming replica made with `pg_basebackup -R` serves
//! `streams.events`, `replay`, `get` and `status` read-only, respects the
//! horizon (a publishing transaction held open on the primary hides the same
//! events on the standby), and once promoted starts its worker and delivers.
//!
//! A test binary of its own: it copies the whole test cluster.
#![cfg(feature = "integration")]

mod common;

use std::time::Duration;

use common::*;
use postgres::Client;

/// Wait until the standby has replayed everything the primary wrote so far.
fn catch_up(primary: &mut Client, standby: &mut Client) {
    let lsn: String = primary.query_one("SELECT pg_current_wal_insert_lsn()::text", &[]).unwrap().get(0);
    wait_until("the standby replays the primary's WAL", Duration::from_secs(30), || {
        standby.query_one("SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn", &[&lsn]).unwrap().get::<_, bool>(0)
    });
}

fn positions(client: &mut Client, sql: &str) -> Vec<i64> {
    client.query(sql, &[]).unwrap().iter().map(|r| r.get(0)).collect()
}

#[test]
fn a_standby_serves_final_events_and_a_promoted_one_delivers() {
    let db = TestDb::new();
    let mut primary = db.connect();
    let first: Vec<i64> = (0..3).map(|n| publish(&mut primary, "orders", &format!(r#"{{"n":{n}}}"#))).collect();
    wait_for_horizon(&mut primary, first[2]);
    let mut holder = db.connect();
    holder.batch_execute("BEGIN").unwrap();
    let held = publish(&mut holder, "orders", r#"{"held":true}"#);
    let later = publish(&mut primary, "orders", r#"{"later":true}"#);
    wait_until("the primary's worker has seen the later commit", Duration::from_secs(20), || {
        primary.query_one("SELECT newest_position FROM streams.status", &[]).unwrap().get::<_, i64>(0) >= later
    });

    let standby = ScratchCluster::standby_of_test_cluster();
    let mut s = standby.connect(&db.name);
    catch_up(&mut primary, &mut s);
    assert_eq!(
        positions(&mut s, "SELECT position FROM streams.events ORDER BY position"),
        first,
        "held and later stay hidden"
    );
    assert_eq!(positions(&mut s, "SELECT position FROM streams.replay(after => 0)"), first);
    let got: Option<i64> = s.query_one("SELECT (streams.get($1)).position", &[&first[1]]).unwrap().get(0);
    assert_eq!(got, Some(first[1]));
    let (state, horizon): (String, i64) = {
        let row = s.query_one("SELECT worker_state, horizon FROM streams.status", &[]).unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!((state.as_str(), horizon), ("standby", first[2]), "status works read-only on the standby");

    // streams.wait works read-only too (it failed with XX000 "cannot assign
    // TransactionIds during recovery"): at once for a final event, false
    // for one still held, and true once the standby replays its commit.
    let waited = |s: &mut Client, position: i64, timeout: &str| -> bool {
        s.query_one("SELECT streams.wait($1, $2::text::interval)", &[&position, &timeout])
            .unwrap_or_else(|e| panic!("streams.wait on the standby: {e:?}"))
            .get(0)
    };
    assert!(waited(&mut s, first[2], "0s"), "a final event needs no wait");
    assert!(!waited(&mut s, held, "100ms"), "a held event is not final on the standby either");
    let waiter = {
        let config = standby.config(&db.name);
        std::thread::spawn(move || waited(&mut connect_retrying(&config), later, "30s"))
    };

    holder.batch_execute("COMMIT").unwrap();
    wait_for_horizon(&mut primary, later);
    catch_up(&mut primary, &mut s);
    assert!(waiter.join().unwrap(), "a wait on the standby ends when the standby replays the horizon");
    let expected: Vec<i64> = first.iter().copied().chain([held, later]).collect();
    assert_eq!(positions(&mut s, "SELECT position FROM streams.events ORDER BY position"), expected);
    let err = s.batch_execute("SELECT streams.publish('orders', '{}')").unwrap_err();
    assert_eq!(sqlstate(&err), "25006", "publishing on a standby fails clearly: {err}");
    assert!(!format!("{err:?}").contains("rust_begin_unwind"), "no Rust backtrace reaches the user: {err:?}");

    // Promotion: the launcher starts the worker there, which delivers.
    standby.pg_ctl(&["promote"]);
    let mut promoted = standby.connect(&db.name);
    wait_until("the promoted server runs the database's worker", Duration::from_secs(30), || {
        promoted.query_one("SELECT worker_pid FROM streams.status", &[]).unwrap().get::<_, Option<i32>>(0).is_some()
    });
    let mut listener = standby.connect(&db.name);
    listener.batch_execute("LISTEN orders").unwrap();
    let p: i64 = promoted.query_one("SELECT streams.publish('orders', '{\"promoted\":true}')", &[]).unwrap().get(0);
    assert!(p > later, "positions continue after promotion");
    wait_until("the event is final on the promoted server", Duration::from_secs(20), || {
        promoted.query_one("SELECT streams.horizon()", &[]).unwrap().get::<_, i64>(0) >= p
    });
    use postgres::fallible_iterator::FallibleIterator;
    let mut notifications = listener.notifications();
    let n = notifications.timeout_iter(Duration::from_secs(10)).next().unwrap().expect("a notification");
    let payload: serde_json::Value = serde_json::from_str(n.payload()).unwrap();
    assert_eq!(payload["position"].as_i64(), Some(p));
}
