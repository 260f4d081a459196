//! Leases of subscriptions (issue 24): `poll(..., lease => ...)` claims an
//! ordered subscription's next events for a while instead of for the
//! polling transaction, so a consumer commits (autocommit through PgBouncer
//! in transaction pooling) and works outside any transaction. While the
//! lease is live every other poll gets nothing; the lease's events are
//! settled from any session with `ack(subscription, through, lease)` or
//! `nack(..., lease => ...)` (which ends the lease), or kept with
//! `extend_lease`. An expired lease's events come again with the next
//! attempt (parked at max_attempts), and the old lease settles nothing.
//! Other roles can do nothing with a lease; a guessed lease id settles
//! nothing; bad durations and unordered subscriptions are refused.
#![cfg(feature = "integration")]

mod common;

use std::time::Duration;

use common::pgbouncer::{column, rows, Pgbouncer};
use common::subscriptions::*;
use common::*;
use postgres::Client;

// --- helpers -----------------------------------------------------------------------

/// The consumers' side effects: one row per processed event, with the
/// attempt and the consumer that processed it; the key makes a second
/// effect of an event fail.
const EFFECTS: &str =
    "CREATE TABLE public.effects (position bigint PRIMARY KEY, attempt int NOT NULL, consumer text NOT NULL)";

/// Every position of `positions` at `attempt`.
fn all_at(positions: &[i64], attempt: i32) -> Vec<Delivery> {
    positions.iter().map(|&p| at(p, attempt)).collect()
}

/// The database's clock now, as text.
fn clock(c: &mut Client) -> String {
    value(c, "SELECT clock_timestamp()::text").unwrap()
}

/// Wait until the database's clock is past `time` + `plus` (an interval).
fn wait_for_clock(c: &mut Client, time: &str, plus: &str) {
    wait_until(&format!("the database's clock is past {time} + {plus}"), Duration::from_secs(30), || {
        holds(c, &format!("SELECT clock_timestamp() > '{time}'::timestamptz + interval '{plus}'"))
    });
}

/// A poll without a lease, in the caller's transaction (or autocommit):
/// its deliveries (their lease_id is NULL).
fn deliveries(c: &mut Client, sub: &str, max: i32) -> Vec<Delivery> {
    rows(c, &format!("SELECT position, attempt, lease_id FROM streams.poll('{sub}', {max})"))
        .unwrap_or_else(|e| panic!("poll of {sub}: {e:?}"))
        .iter()
        .map(|r| {
            assert_eq!(r[2], None, "a poll without a lease has no lease_id");
            at(num(&r[0]), num(&r[1]))
        })
        .collect()
}

/// The events a poll with a lease returned, under which lease, and the
/// backend that served the poll.
#[derive(Debug)]
struct Lease {
    id: i64,
    events: Vec<Delivery>,
    backend: i32,
}

impl Lease {
    fn last(&self) -> i64 {
        self.events.last().unwrap().position
    }
}

/// A poll with `lease => duration`, in autocommit: the lease, or None when
/// it returned nothing.
fn take_lease(c: &mut Client, sub: &str, max: i32, duration: &str) -> Option<Lease> {
    let sql = format!(
        "SELECT position, attempt, lease_id, pg_backend_pid() FROM streams.poll('{sub}', {max}, lease => '{duration}')"
    );
    let r = rows(c, &sql).unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    let first = r.first()?;
    assert!(first[2].is_some(), "a poll with a lease returns its lease_id: {r:?}");
    assert!(r.iter().all(|row| row[2] == first[2]), "the same lease_id on every row: {r:?}");
    Some(Lease {
        id: num(&first[2]),
        events: r.iter().map(|r| at(num(&r[0]), num(&r[1]))).collect(),
        backend: num(&first[3]),
    })
}

/// Take leases (polling every 10 ms) until one comes with events.
fn next_lease(c: &mut Client, sub: &str, max: i32, duration: &str) -> Lease {
    let mut got = None;
    wait_until(&format!("{sub} leases events"), Duration::from_secs(30), || {
        got = take_lease(c, sub, max, duration);
        got.is_some()
    });
    got.unwrap()
}

fn ack_with(sub: &str, through: i64, lease: i64) -> String {
    format!("SELECT streams.ack('{sub}', {through}, lease => {lease})")
}

fn nack_with(sub: &str, position: i64, retry_after: &str, lease: i64) -> String {
    format!("SELECT streams.nack('{sub}', {position}, retry_after => '{retry_after}', reason => 'failed', lease => {lease})")
}

fn extend_sql(sub: &str, lease: i64, duration: &str) -> String {
    format!("SELECT streams.extend_lease('{sub}', {lease}, '{duration}')")
}

/// Every call that settles or keeps lease `lease` of `sub` (at `position`).
fn lease_calls(sub: &str, lease: i64, position: i64) -> [String; 3] {
    [ack_with(sub, position, lease), nack_with(sub, position, "1 second", lease), extend_sql(sub, lease, "1 hour")]
}

/// Each of `sqls` fails with `state` on `c`, and nothing changes (as the
/// superuser `admin` sees it).
fn refused(admin: &mut Client, c: &mut Client, sqls: &[String], state: &str) {
    let before = snapshot(admin);
    for sql in sqls {
        fails_with(c, sql, state);
    }
    assert_eq!(snapshot(admin), before, "the refused calls changed nothing: {sqls:#?}");
}

/// Run `sql` through `other` in a transaction on another backend than the
/// one that served `lease`'s poll (by `poller`): `poller` holds that one in
/// an open transaction meanwhile (transaction pooling hands out the server
/// connection released last first). The transaction's now().
fn elsewhere(poller: &mut Client, lease: &Lease, other: &mut Client, sql: &str) -> Result<String, postgres::Error> {
    poller.batch_execute("BEGIN").unwrap();
    assert_eq!(backend_pid(poller), lease.backend, "the poller holds the backend of its poll");
    other.batch_execute("BEGIN").unwrap();
    let r = rows(other, "SELECT pg_backend_pid(), now()::text").unwrap();
    assert_ne!(num::<i32>(&r[0][0]), lease.backend, "another backend than the poll's");
    let result = other.batch_execute(sql);
    other.batch_execute(if result.is_ok() { "COMMIT" } else { "ROLLBACK" }).unwrap();
    poller.batch_execute("COMMIT").unwrap();
    result.map(|()| r[0][1].clone().unwrap())
}

/// Process `lease`'s events through `through` as `consumer`: their effects
/// and the ack with the lease in one transaction (rolled back on error).
fn process(c: &mut Client, sub: &str, lease: &Lease, through: i64, consumer: &str) -> Result<(), postgres::Error> {
    let effects: Vec<String> = lease
        .events
        .iter()
        .filter(|d| d.position <= through)
        .map(|d| format!("({}, {}, '{consumer}')", d.position, d.attempt))
        .collect();
    let result = c.batch_execute(&format!(
        "BEGIN; INSERT INTO public.effects VALUES {}; {}; COMMIT",
        effects.join(", "),
        ack_with(sub, through, lease.id)
    ));
    if result.is_err() {
        c.batch_execute("ROLLBACK").unwrap();
    }
    result
}

/// The effects written, in position order: (position, attempt, consumer).
fn effects(c: &mut Client) -> Vec<(i64, i32, String)> {
    rows(c, "SELECT position, attempt, consumer FROM public.effects ORDER BY position")
        .unwrap()
        .iter()
        .map(|r| (num(&r[0]), num(&r[1]), r[2].clone().unwrap()))
        .collect()
}

/// (position, attempts) of each dead letter of `sub`, in position order.
fn parked_attempts(c: &mut Client, sub: &str) -> Vec<(i64, i32)> {
    rows(
        c,
        &format!("SELECT position, attempts FROM streams.dead_letters WHERE subscription = '{sub}' ORDER BY position"),
    )
    .unwrap()
    .iter()
    .map(|r| (num(&r[0]), num(&r[1])))
    .collect()
}

/// A query's rows, each as its columns' text.
type Rows = Vec<Vec<Option<String>>>;

/// What a refused call must leave as it was, as the superuser `c` sees it:
/// every subscription's row of streams.subscriptions (but lag_time, which
/// moves with the clock), every dead letter, and the stored deliveries
/// (attempts, leases and their expiry).
fn snapshot(c: &mut Client) -> (Rows, Rows, Rows) {
    let subscriptions = rows(
        c,
        "SELECT name, stream, ordered, owner, position, pending, claimed, claimed_by, last_ack_at, created_at,
                max_attempts, highest_attempt, retrying, parked, oldest_parked, next_retry_at
         FROM streams.subscriptions ORDER BY name, owner::text",
    )
    .unwrap();
    let dead = rows(c, "SELECT * FROM streams.dead_letters ORDER BY subscription, position").unwrap();
    let delivered = rows(c, "SELECT * FROM streams.subscription_deliveries ORDER BY subscription, low").unwrap();
    (subscriptions, dead, delivered)
}

/// Poll `sub` in transactions, acking each batch, until `last` came: every
/// delivery, in order.
fn consume_through(c: &mut Client, sub: &str, last: i64) -> Vec<Delivery> {
    let mut seen: Vec<Delivery> = Vec::new();
    wait_until(&format!("{sub} delivers {last}"), Duration::from_secs(30), || {
        c.batch_execute("BEGIN").unwrap();
        let got = deliveries(c, sub, 100);
        if let Some(d) = got.last() {
            ack(c, sub, d.position);
        }
        c.batch_execute("COMMIT").unwrap();
        seen.extend(got);
        seen.last().is_some_and(|d| d.position >= last)
    });
    seen
}

/// A test database with the effects table and an ordered subscription
/// `sub` of `orders`, and `count` events: the database, a superuser
/// client on it (direct) and the events' positions.
fn setup(sub: &str, options: &str, count: usize) -> (TestDb, Client, Vec<i64>) {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute(&format!("{EFFECTS}; SELECT streams.create_subscription('{sub}', 'orders', after => 0{options})"))
        .unwrap();
    let p = publish_events(&mut c, "orders", count, count);
    (db, c, p)
}

// --- tests -------------------------------------------------------------------------

/// A consumer that takes a lease and stops holds the subscription only
/// until the lease expires; then another consumer gets the events again
/// (attempt 2) and the first one's late ack settles nothing: every event
/// takes effect once.
#[test]
fn an_expired_lease_is_taken_over_and_its_late_ack_is_refused() {
    let (db, mut c, p) = setup("jobs", "", 3);
    let bouncer = Pgbouncer::start();
    let (mut a, mut b) = (bouncer.connect(&db.name, None), bouncer.connect(&db.name, None));

    let started = clock(&mut a);
    let first = take_lease(&mut a, "jobs", 10, "1 second").expect("a lease of the events");
    assert_eq!(first.events, all_at(&p, 1));
    let got = deliveries(&mut b, "jobs", 10);
    assert!(
        holds(&mut b, &format!("SELECT clock_timestamp() < '{started}'::timestamptz + interval '1 second'")),
        "the other consumer polled after the lease's second (a slow machine?): {got:?}"
    );
    assert_eq!(got, NOTHING, "while the lease is live another consumer gets nothing");
    assert!(take_lease(&mut b, "jobs", 10, "1 minute").is_none(), "nor a lease");

    let second = next_lease(&mut b, "jobs", 10, "1 minute");
    assert_eq!(second.events, all_at(&p, 2), "after the expiry: the same events, as their second attempt");
    assert_ne!(second.id, first.id);

    let before = snapshot(&mut c);
    let err = process(&mut a, "jobs", &first, first.last(), "a").expect_err("the expired lease's ack is refused");
    assert_eq!(sqlstate(&err), "55000", "{err}");
    assert_eq!(snapshot(&mut c), before, "the refused ack changed nothing");
    assert_eq!(progress(&mut c, "jobs").position, 0);

    process(&mut b, "jobs", &second, second.last(), "b").unwrap();
    assert_eq!(progress(&mut c, "jobs").position, p[2]);
    let once: Vec<(i64, i32, String)> = p.iter().map(|&p| (p, 2, "b".to_owned())).collect();
    assert_eq!(effects(&mut c), once, "every event took effect once, by the second consumer");
    assert_eq!(deliveries(&mut b, "jobs", 10), NOTHING, "nothing comes again");
}

/// A lease outlives the polling statement's (implicit) transaction: another
/// session, on another backend, acks part of it; the rest stays leased
/// until acked too; then the next events flow to an ordinary poll.
#[test]
fn a_lease_is_acked_in_parts_from_another_session() {
    let (db, mut c, p) = setup("work", "", 3);
    let bouncer = Pgbouncer::start();
    let (mut a, mut b) = (bouncer.connect(&db.name, None), bouncer.connect(&db.name, None));

    let lease = take_lease(&mut a, "work", 10, "1 minute").expect("a lease of the events");
    assert_eq!(lease.events, all_at(&p, 1));
    elsewhere(&mut a, &lease, &mut b, &ack_with("work", p[1], lease.id)).unwrap();
    assert_eq!(progress(&mut c, "work").position, p[1], "the ack through the second event moved the position");

    assert_eq!(deliveries(&mut b, "work", 10), NOTHING, "the third event stays leased");
    assert!(take_lease(&mut b, "work", 10, "1 minute").is_none(), "the third event stays leased");
    elsewhere(&mut a, &lease, &mut b, &ack_with("work", p[2], lease.id)).unwrap();
    assert_eq!(progress(&mut c, "work").position, p[2]);

    let next = publish_events(&mut c, "orders", 2, 2);
    b.batch_execute("BEGIN").unwrap();
    assert_eq!(deliveries(&mut b, "work", 10), all_at(&next, 1), "the next events, to an ordinary poll");
    ack(&mut b, "work", next[1]);
    b.batch_execute("COMMIT").unwrap();
    assert_eq!(progress(&mut c, "work").position, next[1]);
}

/// extend_lease keeps a lease past its first expiry; once a lease expired,
/// neither extend_lease nor ack nor nack with it does anything, and its
/// events come again.
#[test]
fn extend_lease_keeps_a_lease_and_an_expired_one_settles_nothing() {
    let (db, mut c, p) = setup("long", "", 2);
    let bouncer = Pgbouncer::start();
    let (mut a, mut b) = (bouncer.connect(&db.name, None), bouncer.connect(&db.name, None));

    let lease = take_lease(&mut a, "long", 10, "1 second").expect("a lease of the events");
    // It was written before the poll returned: it expires by then + 1 second.
    let polled = clock(&mut a);
    let r = rows(
        &mut a,
        &format!(
            "SELECT e::text, extract(epoch FROM e - now()) FROM streams.extend_lease('long', {}, '1 minute') e",
            lease.id
        ),
    )
    .unwrap_or_else(|e| panic!("extend_lease of a live lease: {e:?}"));
    let (expiry, from_now) = (r[0][0].clone().unwrap(), num::<f64>(&r[0][1]));
    assert!((59.99..61.0).contains(&from_now), "extended to {expiry}, {from_now} s from now(): a minute");

    wait_for_clock(&mut b, &polled, "1.1 seconds");
    assert_eq!(deliveries(&mut b, "long", 10), NOTHING, "the extended lease still holds the events");
    assert!(take_lease(&mut b, "long", 10, "1 minute").is_none(), "the extended lease still holds the events");
    b.batch_execute(&ack_with("long", lease.last(), lease.id)).unwrap();
    assert_eq!(progress(&mut c, "long").position, p[1], "the extended lease's ack took");

    let next = publish_events(&mut c, "orders", 2, 2);
    let short = take_lease(&mut a, "long", 10, "200 milliseconds").expect("a lease of the next events");
    assert_eq!(short.events, all_at(&next, 1));
    let polled = clock(&mut a);
    wait_for_clock(&mut b, &polled, "200 milliseconds");
    refused(&mut c, &mut b, &lease_calls("long", short.id, short.last()), "55000");
    assert_eq!(
        next_lease(&mut b, "long", 10, "1 minute").events,
        all_at(&next, 2),
        "the expired lease's events come again"
    );
}

/// A long poll behind a live lease (ordered: it waits) wakes when the lease
/// expires and gets its events again.
#[test]
fn a_long_poll_wakes_when_a_lease_expires() {
    let (db, _c, p) = setup("waiting", "", 2);
    let bouncer = Pgbouncer::start();
    let (mut a, mut b) = (bouncer.connect(&db.name, None), bouncer.connect(&db.name, None));

    let started = clock(&mut a);
    take_lease(&mut a, "waiting", 10, "1 second").expect("a lease of the events");
    b.batch_execute("BEGIN").unwrap();
    let r = rows(
        &mut b,
        &format!(
            "SELECT position, attempt, extract(epoch FROM clock_timestamp() - '{started}'::timestamptz)
             FROM streams.poll('waiting', 10, wait => '20 seconds')"
        ),
    )
    .unwrap();
    let got: Vec<Delivery> = r.iter().map(|r| at(num(&r[0]), num(&r[1]))).collect();
    assert_eq!(got, all_at(&p, 2), "the long poll gets the expired lease's events");
    let after = num::<f64>(&r[0][2]);
    assert!((1.0..10.0).contains(&after), "returned {after} s after the lease was taken: at its expiry (1 s)");
    b.batch_execute("ROLLBACK").unwrap();
}

/// A nack with the lease, from another session, puts the event off for
/// retry_after and ends the lease: the nacked event comes again as its
/// second attempt, then the lease's events after it, in order, as their
/// first (the consumer failed before trying them: only the failing event
/// uses up its attempts).
#[test]
fn a_nack_with_a_lease_ends_it_and_its_events_come_again_in_order() {
    let (db, mut c, p) = setup("retry", "", 4);
    let bouncer = Pgbouncer::start();
    let (mut a, mut b) = (bouncer.connect(&db.name, None), bouncer.connect(&db.name, None));

    let lease = take_lease(&mut a, "retry", 10, "1 minute").expect("a lease of the events");
    assert_eq!(lease.events, all_at(&p, 1));
    elsewhere(&mut a, &lease, &mut b, &ack_with("retry", p[0], lease.id)).unwrap();
    let nacked_at = elsewhere(&mut a, &lease, &mut b, &nack_with("retry", p[1], "1 second", lease.id)).unwrap();
    refused(&mut c, &mut b, &lease_calls("retry", lease.id, p[3]), "55000");

    let (first, after) = poll_until_delivered(&mut b, "retry", 1, &nacked_at);
    assert_eq!(first, [at(p[1], 2)], "the nacked event comes again first, as its second attempt");
    assert!(after >= 1.0, "redelivered {after} s after the nack, before retry_after (1 s)");
    ack(&mut b, "retry", p[1]);
    b.batch_execute("COMMIT").unwrap();
    assert_eq!(consume_through(&mut b, "retry", p[3]), all_at(&p[2..], 1), "then the rest of the lease, in order");
    assert_eq!(progress(&mut c, "retry").position, p[3]);
}

/// Every lease counts a delivery attempt: with max_attempts => 2, an event
/// whose two leases expired is parked and the subscription moves on.
#[test]
fn an_event_whose_leases_expire_max_attempts_times_is_parked() {
    let (db, mut c, p) = setup("capped", ", max_attempts => 2", 2);
    let mut a = db.connect();

    for attempt in [1, 2] {
        let lease = next_lease(&mut a, "capped", 1, "200 milliseconds");
        assert_eq!(lease.events, [at(p[0], attempt)], "lease {attempt} of the first event");
    }
    let lease = next_lease(&mut a, "capped", 1, "200 milliseconds");
    assert_eq!(lease.events, [at(p[1], 1)], "once both leases expired, the subscription is past the first event");
    assert_eq!(parked_attempts(&mut c, "capped"), [(p[0], 2)], "parked after its second attempt");
    a.batch_execute(&ack_with("capped", p[1], lease.id)).unwrap();
    assert_eq!(progress(&mut c, "capped").position, p[1]);
    assert_eq!(value(&mut c, &format!("SELECT position FROM streams.get({})", p[0])), Some(p[0].to_string()));
}

/// Another role that may read the stream can neither settle, keep, poll
/// nor see someone else's lease, nor use its id on a subscription of its
/// own; a guessed lease id settles nothing for the owner either.
#[test]
fn only_the_lease_holder_settles_a_lease_and_a_guessed_id_settles_nothing() {
    let db = TestDb::new();
    let (alice, mallory) = (TestRole::new(&db, "alice", ""), TestRole::new(&db, "mallory", ""));
    let mut c = db.connect();
    c.batch_execute(&format!(
        "SELECT streams.grant('read', 'orders', '{0}'), streams.grant('read', 'orders', '{1}')",
        alice.name, mallory.name
    ))
    .unwrap();
    let (mut a, mut m) = (db.connect_as(&alice.name), db.connect_as(&mallory.name));
    a.batch_execute("SELECT streams.create_subscription('alice_sub', 'orders', after => 0)").unwrap();
    m.batch_execute("SELECT streams.create_subscription('mallory_sub', 'orders', after => 0)").unwrap();
    let p = publish_events(&mut c, "orders", 3, 3);
    let lease = take_lease(&mut a, "alice_sub", 10, "1 minute").expect("alice's lease");

    let mut hostile = lease_calls("alice_sub", lease.id, p[2]).to_vec();
    hostile.extend([
        "SELECT * FROM streams.poll('alice_sub', lease => '1 minute')".to_owned(),
        "SELECT * FROM streams.subscription_deliveries".to_owned(),
    ]);
    refused(&mut c, &mut m, &hostile, "42501");
    let visible = value(&mut m, "SELECT count(*) FROM streams.subscriptions WHERE name = 'alice_sub'");
    assert_eq!(visible.as_deref(), Some("0"), "mallory sees no row of alice's subscription");
    refused(&mut c, &mut m, &lease_calls("mallory_sub", lease.id, p[2]), "55000");

    let guessed = lease.id.checked_add(1).unwrap_or(lease.id - 1);
    refused(&mut c, &mut a, &lease_calls("alice_sub", guessed, p[2]), "55000");

    a.batch_execute(&ack_with("alice_sub", p[2], lease.id)).unwrap();
    assert_eq!(progress(&mut a, "alice_sub").position, p[2], "alice's own lease still works");
    assert_eq!(
        column::<i64>(&mut m, "SELECT position FROM streams.poll('mallory_sub', 10)").unwrap(),
        p,
        "mallory's subscription is untouched"
    );
}

#[test]
fn bad_lease_durations_and_unordered_subscriptions_are_refused() {
    let (db, mut c, p) = setup("s", "", 2);
    c.batch_execute("SELECT streams.create_subscription('pool', 'orders', after => 0, ordered => false)").unwrap();
    let bad: Vec<String> = ["0", "-1 second", "2 days", "1 day 1 second"]
        .iter()
        .map(|d| format!("SELECT * FROM streams.poll('s', 10, lease => '{d}')"))
        .collect();
    let mut fresh = db.connect();
    refused(&mut c, &mut fresh, &bad, "22023");
    refused(&mut c, &mut fresh, &["SELECT * FROM streams.poll('pool', 10, lease => '1 minute')".to_owned()], "0A000");

    let longest = take_lease(&mut c, "s", 10, "1 day").expect("a lease of a day");
    assert_eq!(longest.events, all_at(&p, 1), "the refused polls counted no attempt");
    c.batch_execute(&ack_with("s", p[1], longest.id)).unwrap();
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(deliveries(&mut c, "pool", 10), all_at(&p, 1), "the unordered subscription delivers without a lease");
    c.batch_execute("COMMIT").unwrap();
}
