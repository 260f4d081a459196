//! Idempotent publish: at most one event (or batch) per (stream,
//! idempotency key) while the key is remembered, also among concurrent
//! publishers that roll back at random; a repeat returns the original
//! positions and says it was a duplicate; a key used again for other data is
//! refused (23505); nobody but the owner sees or writes the keys.
#![cfg(feature = "integration")]

mod common;

use std::sync::{Arc, Barrier};

use common::*;
use rand::Rng;

/// publish_once: (position, duplicate).
fn publish_once(c: &mut postgres::Client, stream: &str, data: &str, key: &str) -> (i64, bool) {
    let row = c
        .query_one(
            "SELECT position, duplicate FROM streams.publish_once($1, $2::text::jsonb, $3)",
            &[&stream, &data, &key],
        )
        .unwrap();
    (row.get(0), row.get(1))
}

fn events_of(c: &mut postgres::Client, stream: &str) -> Vec<i64> {
    c.query("SELECT position FROM streams.event_log WHERE stream = $1 ORDER BY position", &[&stream])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[test]
fn sixteen_sessions_with_one_key_publish_one_event() {
    let db = TestDb::new();
    const SESSIONS: usize = 16;
    for round in 0..4 {
        let stream = format!("orders.r{round}");
        let barrier = Arc::new(Barrier::new(SESSIONS));
        let threads: Vec<_> = (0..SESSIONS)
            .map(|i| {
                let (config, barrier, stream) = (db.config(), barrier.clone(), stream.clone());
                std::thread::spawn(move || {
                    let mut c = config.connect(postgres::NoTls).unwrap();
                    let mut rng = rand::thread_rng();
                    // Session 0 always commits, so every round has its event.
                    let commit = i == 0 || rng.gen_bool(0.5);
                    barrier.wait();
                    c.batch_execute("BEGIN").unwrap();
                    let (position, duplicate) = publish_once(&mut c, &stream, r#"{"order":"ord_1"}"#, "checkout-7");
                    std::thread::sleep(std::time::Duration::from_millis(rng.gen_range(0..20)));
                    c.batch_execute(if commit { "COMMIT" } else { "ROLLBACK" }).unwrap();
                    (commit, position, duplicate)
                })
            })
            .collect();
        let results: Vec<(bool, i64, bool)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let mut c = db.connect();
        let events = events_of(&mut c, &stream);
        assert_eq!(events.len(), 1, "round {round}: exactly one event, got {events:?} from {results:?}");
        for (commit, position, _) in &results {
            if *commit {
                assert_eq!(*position, events[0], "round {round}: a committed caller got the event's position");
            }
        }
        let originals = results.iter().filter(|(commit, _, duplicate)| *commit && !duplicate).count();
        assert_eq!(originals, 1, "round {round}: one committed caller wrote it, the others were told duplicate");
    }
}

#[test]
fn a_repeat_returns_the_original_and_other_data_is_refused() {
    let db = TestDb::new();
    let mut c = db.connect();
    let (first, duplicate) = publish_once(&mut c, "pay", r#"{"amount": 49.00}"#, "k1");
    assert!(!duplicate);
    // The same JSON value, spelled differently, is the same event.
    assert_eq!(publish_once(&mut c, "pay", r#"{ "amount":49.00 }"#, "k1"), (first, true));
    let again: i64 = c
        .query_one("SELECT streams.publish('pay', '{\"amount\": 49.00}', idempotency_key => 'k1')", &[])
        .unwrap()
        .get(0);
    assert_eq!(again, first, "publish itself returns the original position");
    // The key is per stream.
    assert!(!publish_once(&mut c, "pay.other", r#"{"amount": 49.00}"#, "k1").1);
    for sql in [
        "SELECT streams.publish('pay', '{\"amount\": 50}', idempotency_key => 'k1')",
        "SELECT streams.publish('pay', '{\"amount\": 49.00}', type => 'x', idempotency_key => 'k1')",
        "SELECT streams.publish_batch('pay', ARRAY['{\"amount\": 49.00}', '{}']::jsonb[], idempotency_key => 'k1')",
    ] {
        let err = c.batch_execute(sql).unwrap_err();
        assert_eq!(sqlstate(&err), "23505", "{sql}: {err}");
    }
    assert_eq!(events_of(&mut c, "pay"), vec![first], "nothing else was written");

    let batch = |c: &mut postgres::Client| -> Vec<i64> {
        c.query(
            "SELECT streams.publish_batch('pay', ARRAY['{\"n\":1}', '{\"n\":2}']::jsonb[], idempotency_key => 'b1')",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
    };
    let positions = batch(&mut c);
    assert_eq!(positions.len(), 2);
    assert_eq!(batch(&mut c), positions, "a repeated batch returns the original positions");
    assert_eq!(events_of(&mut c, "pay").len(), 3);
}

#[test]
fn a_rolled_back_publish_forgets_its_key() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute("BEGIN").unwrap();
    let (rolled_back, _) = publish_once(&mut c, "pay", "{}", "k");
    c.batch_execute("ROLLBACK").unwrap();
    let (position, duplicate) = publish_once(&mut c, "pay", "{}", "k");
    assert!(!duplicate && position != rolled_back);
    assert_eq!(events_of(&mut c, "pay"), vec![position]);
}

#[test]
fn only_the_owner_sees_or_writes_idempotency_keys() {
    let db = TestDb::new();
    let mut owner = db.connect();
    publish_once(&mut owner, "secret", r#"{"card":"4111"}"#, "k-secret");
    let spy = TestRole::new(&db, "spy", "IN ROLE pg_read_all_data, pg_write_all_data");
    owner.batch_execute(&format!("SELECT streams.grant('publish', 'public.*', '{}')", spy.name)).unwrap();
    let mut s = db.connect_as(&spy.name);
    let seen: i64 = s.query_one("SELECT count(*) FROM streams.idempotency_keys", &[]).unwrap().get(0);
    assert_eq!(seen, 0, "row-level security hides the keys from pg_read_all_data");
    for sql in [
        "INSERT INTO streams.idempotency_keys VALUES ('secret', 'k-forged', '{1}', now())",
        "UPDATE streams.idempotency_keys SET positions = '{1}'",
        "DELETE FROM streams.idempotency_keys",
    ] {
        let result = s.execute(sql, &[]);
        assert!(result.as_ref().map_or(true, |n| *n == 0), "{sql}: {result:?}");
    }
    // Probing another stream's keys needs the publish privilege there.
    let err = s
        .query_one("SELECT * FROM streams.publish_once('secret', '{\"card\":\"4111\"}', 'k-secret')", &[])
        .unwrap_err();
    assert_eq!(sqlstate(&err), "42501");
    let remembered: i64 =
        owner.query_one("SELECT count(*) FROM streams.idempotency_keys WHERE key = 'k-secret'", &[]).unwrap().get(0);
    assert_eq!(remembered, 1, "the key is still there, unchanged");
}
