#![cfg(feature = "integration")]
//! Hostile-user findings against the issue 24 subscriptions (attempts,
//! nack, dead letters, leases, order per key), each held by a test that
//! fails until it is fixed:
//!
//! * a role with pg_write_all_data takes `LOCK TABLE` on the extension's
//!   subscription tables (LOCK needs only UPDATE or DELETE, which that role
//!   has on every table; row-level security does not apply to LOCK) and
//!   stalls every other role's poll for as long as it likes;
//! * a publisher of a stream poisons another role's subscription ordered
//!   per key with one event whose key is longer than a btree entry: every
//!   ack of a poll that returned it fails, so the events of the other keys
//!   polled with it use up their attempts and are parked as dead letters,
//!   and `discard_dead_letter` cannot remove it either;
//! * a subscriber that nacks an event with no delay and polls it again in
//!   the same transaction keeps the attempt records the worker must rewrite
//!   locked: the worker waited for that lock (its lock_timeout, 100 ms) with
//!   every other poller of the database waiting behind it, and the subscriber
//!   could repeat it with savepoints forever;
//! * and one that held from the start: `streams._attempt`, callable by
//!   PUBLIC, tells nothing of another session's poll.

mod common;

use common::subscriptions::*;
use common::*;
use postgres::Client;

/// A subscription owner and a stranger who may read and publish `orders`.
fn two_roles(db: &TestDb) -> (TestRole, TestRole, Client) {
    let (consumer, publisher) = (TestRole::new(db, "consumer", ""), TestRole::new(db, "publisher", ""));
    let mut owner = db.connect();
    owner
        .batch_execute(&format!(
            "SELECT streams.grant('read', 'orders', '{0}');
             SELECT streams.grant('read', 'orders', '{1}'), streams.grant('publish', 'orders', '{1}')",
            consumer.name, publisher.name
        ))
        .unwrap();
    (consumer, publisher, owner)
}

/// pg_write_all_data passes LOCK TABLE's privilege check on every table, row
/// security or not. An ACCESS EXCLUSIVE lock on subscription_deliveries
/// (or subscription_state, subscription_failures, event_log, ...) held in
/// an idle transaction made every poll of every other role wait for it:
/// here a poll with statement_timeout 3s was cancelled. The lock must be
/// refused, or must not keep others' polls waiting.
#[test]
fn pg_write_all_data_cannot_stall_another_roles_poll_with_lock_table() {
    let db = TestDb::new();
    let (consumer, _publisher, mut owner) = two_roles(&db);
    let writer = TestRole::new(&db, "all_data", "");
    admin().batch_execute(&format!("GRANT pg_read_all_data, pg_write_all_data TO {}", writer.name)).unwrap();
    let mut c = db.connect_as(&consumer.name);
    c.batch_execute("SELECT streams.create_subscription('victim', 'orders', after => 0, max_attempts => 5)").unwrap();
    let p = publish_events(&mut owner, "orders", 3, 3);

    for table in ["subscription_deliveries", "subscription_failures", "subscription_state", "subscription_keys"] {
        let mut w = db.connect_as(&writer.name);
        w.batch_execute("BEGIN").unwrap();
        let locked = w.batch_execute(&format!("LOCK TABLE streams.{table} IN ACCESS EXCLUSIVE MODE"));
        if locked.is_err() {
            continue; // refused: what the fix may do
        }
        c.batch_execute("SET statement_timeout = '3s'; BEGIN").unwrap();
        let polled = try_poll(&mut c, "victim", 10);
        c.batch_execute("ROLLBACK; RESET statement_timeout").unwrap();
        w.batch_execute("ROLLBACK").unwrap();
        let polled = polled.unwrap_or_else(|e| {
            panic!(
                "a pg_write_all_data role's LOCK TABLE streams.{table} stalled another role's poll: {} {:?}",
                sqlstate(&e),
                e.as_db_error().map(|d| d.message().to_owned())
            )
        });
        assert_eq!(polled, p, "the poll returned the events despite the lock on {table}");
    }
}

/// A publisher of `orders` published a key of 6400 bytes between two
/// ordinary events of another role's subscription ordered per key. Every
/// ack of the poll that returned the three failed with 54000 (index row
/// size exceeds btree maximum, subscription_keys_pkey), so the two
/// innocent events used up their attempts with it and became dead letters;
/// discarding the poisoned one failed the same way. A key must be stored in
/// a bounded form (a digest), or refused at publish time for keyed use.
#[test]
fn a_huge_key_does_not_poison_the_other_keys_of_a_keyed_subscription() {
    let db = TestDb::new();
    let (consumer, publisher, _owner) = two_roles(&db);
    let mut c = db.connect_as(&consumer.name);
    c.batch_execute("SELECT streams.create_subscription('keyed', 'orders', key => 'id', max_attempts => 2)").unwrap();
    let mut p = db.connect_as(&publisher.name);
    // Incompressible (a compressible key would fit the index after pglz).
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let huge: String = (0..400)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            format!("{x:016x}")
        })
        .collect();
    let first = publish(&mut p, "orders", r#"{"id": "a"}"#);
    let poison = publish(&mut p, "orders", &format!(r#"{{"id": "{huge}"}}"#));
    let last = publish(&mut p, "orders", r#"{"id": "b"}"#);
    wait_for_horizon(&mut p, last);

    c.batch_execute("BEGIN").unwrap();
    let got = poll(&mut c, "keyed", 10);
    assert_eq!(got, [first, poison, last]);
    let acked = try_ack(&mut c, "keyed", last);
    c.batch_execute("ROLLBACK").unwrap();
    if let Err(e) = acked {
        // Show the damage: the innocent events become dead letters too.
        c.batch_execute("BEGIN").unwrap();
        let _ = poll(&mut c, "keyed", 10);
        let _ = try_ack(&mut c, "keyed", last);
        c.batch_execute("ROLLBACK; BEGIN").unwrap();
        let _ = try_poll(&mut c, "keyed", 10);
        c.batch_execute("COMMIT").unwrap();
        let parked = event_positions(&mut c, "SELECT position FROM streams.dead_letters ORDER BY position");
        let discard = c.batch_execute(&format!("SELECT streams.discard_dead_letter('keyed', {poison})"));
        panic!(
            "a publisher's 6400-byte key made the ack of the consumer's poll fail: {:?}; \
             dead letters afterwards: {parked:?}; discarding the poisoned one: {:?}",
            e.as_db_error().map(|d| d.message().to_owned()),
            discard.err().map(|d| sqlstate(&d))
        );
    }
}

/// `streams._attempt`, which PUBLIC may call (poll asks it once per event),
/// answers from the calling backend's own last poll only: a stranger asking
/// for the positions another role's open poll claimed gets NULL, and the
/// stranger's own poll of its own subscription answers for its own events.
#[test]
fn attempt_tells_a_stranger_nothing_of_another_sessions_poll() {
    let db = TestDb::new();
    let (consumer, publisher, mut owner) = two_roles(&db);
    let mut c = db.connect_as(&consumer.name);
    c.batch_execute("SELECT streams.create_subscription('mine', 'orders', after => 0)").unwrap();
    let p = publish_events(&mut owner, "orders", 3, 3);
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(poll(&mut c, "mine", 10), p);
    let mut stranger = db.connect_as(&publisher.name);
    for &position in &p {
        let attempt: Option<i32> = stranger.query_one("SELECT streams._attempt($1)", &[&position]).unwrap().get(0);
        assert_eq!(attempt, None, "the attempt of {position}, polled by another session");
    }
    stranger.batch_execute("SELECT streams.create_subscription('theirs', 'orders', after => 0)").unwrap();
    stranger.batch_execute("BEGIN").unwrap();
    assert_eq!(poll(&mut stranger, "theirs", 1), [p[0]]);
    let own: Option<i32> = stranger.query_one("SELECT streams._attempt($1)", &[&p[0]]).unwrap().get(0);
    let other: Option<i32> = stranger.query_one("SELECT streams._attempt($1)", &[&p[1]]).unwrap().get(0);
    assert_eq!((own, other), (Some(1), None), "its own poll's event only");
    stranger.batch_execute("COMMIT").unwrap();
    c.batch_execute("COMMIT").unwrap();
}

/// A subscriber nacked an event with no delay, acked the one before it and
/// polled again in the same transaction: its own uncommitted rewrite of the
/// attempt records locks the rows the worker must change for that delivery.
/// The worker waited for the lock until its lock_timeout (100 ms), holding
/// up every poll of the database meanwhile, then failed the delivery (55000,
/// "could not write down"); with a savepoint around each poll the
/// subscriber could repeat that without end. Now the worker does not wait:
/// that poll alone fails at once with 55P03, and another role's polls go on
/// while the locks are still held.
#[test]
fn a_subscriber_keeping_its_attempt_records_locked_holds_up_no_other_poll() {
    let db = TestDb::new();
    let (consumer, publisher, mut owner) = two_roles(&db);
    let mut c = db.connect_as(&consumer.name);
    c.batch_execute("SELECT streams.create_subscription('mine', 'orders', after => 0)").unwrap();
    let mut v = db.connect_as(&publisher.name);
    v.batch_execute("SELECT streams.create_subscription('victim', 'orders', after => 0, ordered => false)").unwrap();
    let p = publish_events(&mut owner, "orders", 40, 40);

    c.batch_execute("BEGIN").unwrap();
    assert_eq!(poll(&mut c, "mine", 3), p[..3]);
    c.batch_execute(&format!(
        "SELECT streams.nack('mine', {}, retry_after => '0'); SELECT streams.ack('mine', {})",
        p[1], p[0]
    ))
    .unwrap();
    let mut victim_got = Vec::new();
    for round in 0..20 {
        c.batch_execute("SAVEPOINT again").unwrap();
        let polled = try_poll(&mut c, "mine", 3);
        c.batch_execute("ROLLBACK TO SAVEPOINT again").unwrap();
        match polled {
            Err(e) => assert_eq!(sqlstate(&e), "55P03", "round {round}: {e}"),
            Ok(got) => panic!("round {round}: polled {got:?} while its own nack and ack are uncommitted"),
        }
        // The locks are still held: another role's poll is written down.
        v.batch_execute("BEGIN").unwrap();
        let got = poll(&mut v, "victim", 2);
        v.batch_execute(&format!("SELECT streams.ack('victim', {})", got.last().unwrap())).unwrap();
        v.batch_execute("COMMIT").unwrap();
        victim_got.extend(got);
    }
    assert_eq!(victim_got, p, "the victim got every event once, in 20 polls beside the held locks");
    c.batch_execute("COMMIT").unwrap();
    // Once the transaction ended, the nacked event comes again, attempt 2.
    c.batch_execute("BEGIN").unwrap();
    let again: Vec<(i64, i32)> = c
        .query("SELECT position, attempt FROM streams.poll('mine', 1)", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    c.batch_execute("COMMIT").unwrap();
    assert_eq!(again, [(p[1], 2)]);
}
