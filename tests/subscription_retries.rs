//! Retries and dead letters of subscriptions (issue 24): every delivery of
//! an event counts one attempt, durably, however the attempt ends (an error,
//! a commit without ack, a terminated or SIGKILLed backend, a server crash);
//! an event delivered `max_attempts` times without an ack is parked in
//! `streams.dead_letters` and the subscription moves past it. `nack` puts an
//! event off (ordered: the whole subscription waits; unordered: that event
//! alone), for retry_after or the subscription's backoff; dead letters are
//! retried or discarded by their owner only. Also: create_subscription's if_not_exists, alter_subscription,
//! the view's retry columns, and bad arguments.
#![cfg(feature = "integration")]

mod common;

use std::time::Duration;

use common::pgbouncer::{column, rows};
use common::subscriptions::*;
use common::webhooks::scratch_cluster;
use common::*;
use postgres::{Client, NoTls};

// --- helpers -----------------------------------------------------------------------

/// The consumers' side effects: one row per processed event, with the
/// attempt that processed it; the key makes a second effect of an event fail.
const EFFECTS: &str = "CREATE TABLE public.effects (position bigint PRIMARY KEY, attempt int NOT NULL)";

/// A poll in the caller's transaction (no wait).
fn deliveries(c: &mut Client, sub: &str, max: i32) -> Vec<Delivery> {
    try_deliveries(c, sub, max, "0").unwrap_or_else(|e| panic!("poll of {sub}: {e}"))
}

/// BEGIN and poll one event (waiting up to 200 ms): the delivery with its
/// transaction open, or None and the transaction committed.
fn begin_one(c: &mut Client, sub: &str) -> Result<Option<Delivery>, postgres::Error> {
    c.batch_execute("BEGIN")?;
    let got = try_deliveries(c, sub, 1, "200 milliseconds")?;
    if got.is_empty() {
        c.batch_execute("COMMIT")?;
    }
    Ok(got.first().copied())
}

/// The next delivery of `sub`, its transaction open (however long a
/// backoff after a failed attempt makes it wait).
fn next_delivery(c: &mut Client, sub: &str) -> Delivery {
    let mut got = None;
    wait_until(&format!("{sub} delivers an event"), Duration::from_secs(30), || {
        got = begin_one(c, sub).unwrap_or_else(|e| panic!("poll of {sub}: {e}"));
        got.is_some()
    });
    got.unwrap()
}

/// Write the effect of `d` and ack it, in its transaction, and commit.
fn process(c: &mut Client, sub: &str, d: Delivery) {
    c.batch_execute(&format!(
        "INSERT INTO public.effects VALUES ({0}, {1}); SELECT streams.ack('{sub}', {0}); COMMIT",
        d.position, d.attempt
    ))
    .unwrap_or_else(|e| panic!("processing {d:?} of {sub}: {e}"));
}

/// End the attempt in the open transaction the way a failing handler does.
fn fail_by_rollback(c: &mut Client) {
    let raised = c.batch_execute("DO $$ BEGIN RAISE EXCEPTION 'the handler fails'; END $$");
    assert!(raised.is_err(), "the handler's exception");
    c.batch_execute("ROLLBACK").unwrap();
}

/// Fail the next delivery of `sub`, which must be `position`, by rolling back: its attempt.
fn fail_next(c: &mut Client, sub: &str, position: i64) -> i32 {
    let d = next_delivery(c, sub);
    assert_eq!(d.position, position, "{sub} delivers {position} again");
    fail_by_rollback(c);
    d.attempt
}

/// The effects written, in position order: (position, attempt).
fn effects(c: &mut Client) -> Vec<(i64, i32)> {
    rows(c, "SELECT position, attempt FROM public.effects ORDER BY position")
        .unwrap()
        .iter()
        .map(|r| (num(&r[0]), num(&r[1])))
        .collect()
}

/// A row of streams.dead_letters.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DeadLetter {
    position: i64,
    attempts: i32,
    first_error: Option<String>,
    last_error: Option<String>,
}

fn parked(position: i64, attempts: i32, first_error: Option<&str>, last_error: Option<&str>) -> DeadLetter {
    DeadLetter {
        position,
        attempts,
        first_error: first_error.map(str::to_owned),
        last_error: last_error.map(str::to_owned),
    }
}

/// The dead letters of `sub` that `c` sees, in position order.
fn dead_letters(c: &mut Client, sub: &str) -> Vec<DeadLetter> {
    rows(
        c,
        &format!(
            "SELECT position, attempts, first_error, last_error FROM streams.dead_letters
             WHERE subscription = '{sub}' ORDER BY position"
        ),
    )
    .unwrap()
    .into_iter()
    .map(|r| DeadLetter {
        position: num(&r[0]),
        attempts: num(&r[1]),
        first_error: r[2].clone(),
        last_error: r[3].clone(),
    })
    .collect()
}

/// (position, attempts) of each dead letter of `sub` (what a failure
/// without a nack leaves as its error is not specified).
const NO_DEAD_LETTERS: [(i64, i32); 0] = [];

fn parked_attempts(c: &mut Client, sub: &str) -> Vec<(i64, i32)> {
    dead_letters(c, sub).iter().map(|d| (d.position, d.attempts)).collect()
}

/// The retry columns of a subscription's row of streams.subscriptions.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Retries {
    max_attempts: Option<i32>,
    retrying: i64,
    next_retry_at: Option<String>,
    parked: i64,
    oldest_parked: Option<String>,
}

fn retries(c: &mut Client, sub: &str) -> Retries {
    let r = rows(
        c,
        &format!(
            "SELECT max_attempts, retrying, next_retry_at, parked, oldest_parked
             FROM streams.subscriptions WHERE name = '{sub}'"
        ),
    )
    .unwrap()
    .pop()
    .unwrap_or_else(|| panic!("no row for {sub} in streams.subscriptions"));
    Retries {
        max_attempts: r[0].as_deref().map(|m| m.parse().unwrap()),
        retrying: num(&r[1]),
        next_retry_at: r[2].clone(),
        parked: num(&r[3]),
        oldest_parked: r[4].clone(),
    }
}

/// A query's rows, each as its columns' text.
type Rows = Vec<Vec<Option<String>>>;

/// Every subscription's row of streams.subscriptions (but lag_time, which
/// moves with the clock) and every dead letter, as `c` sees them: what a
/// refused call must leave as it was.
fn snapshot(c: &mut Client) -> (Rows, Rows) {
    let subscriptions = rows(
        c,
        "SELECT name, stream, ordered, owner, position, pending, claimed, last_ack_at, created_at,
                max_attempts, retrying, parked, oldest_parked, next_retry_at
         FROM streams.subscriptions ORDER BY name, owner::text",
    )
    .unwrap();
    let dead = rows(c, "SELECT * FROM streams.dead_letters ORDER BY subscription, position").unwrap();
    (subscriptions, dead)
}

/// now() of the caller's transaction, as text.
fn transaction_time(c: &mut Client) -> String {
    value(c, "SELECT now()::text").unwrap()
}

// --- poison events -----------------------------------------------------------------

const POISONED: &str = "poisoned";

/// The effects table, an ordered subscription with max_attempts => 3 (and
/// a short backoff), and 11 events; the 6th is the poison one.
fn poison_setup(c: &mut Client) -> (Vec<i64>, i64) {
    c.batch_execute(&format!(
        "{EFFECTS};
         SELECT streams.create_subscription('{POISONED}', 'orders', after => 0, max_attempts => 3,
                                            backoff_min => '10 milliseconds', backoff_max => '100 milliseconds')"
    ))
    .unwrap();
    let events = publish_events(c, "orders", 11, 11);
    (events.clone(), events[5])
}

/// The consumer loop: poll one event at a time; process a good one (its
/// effect and its ack in one transaction), end the attempt on the poison one
/// with `end_attempt` (which leaves a working client in its argument), until
/// the last event is processed. The attempt numbers seen for the poison event.
fn consume_around_poison(
    mut c: Client,
    events: &[i64],
    poison: i64,
    mut end_attempt: impl FnMut(&mut Client),
) -> Vec<i32> {
    let last = *events.last().unwrap();
    let mut attempts = Vec::new();
    wait_until("the consumer is past every event", Duration::from_secs(120), || {
        let Some(d) = begin_one(&mut c, POISONED).unwrap_or_else(|e| panic!("poll: {e}")) else {
            return false;
        };
        if d.position != poison {
            process(&mut c, POISONED, d);
            return d.position == last;
        }
        attempts.push(d.attempt);
        assert!(attempts.len() <= 3, "the poison event came again after max_attempts: attempts {attempts:?}");
        end_attempt(&mut c);
        false
    });
    attempts
}

/// What every poison test proves once its consumer is past the events.
fn assert_poison_parked(c: &mut Client, events: &[i64], poison: i64, attempts: &[i32]) {
    assert_eq!(attempts, [1, 2, 3], "the poison event's attempts: no gap, no repeat");
    assert_eq!(parked_attempts(c, POISONED), [(poison, 3)], "parked after its third attempt");
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(deliveries(c, POISONED, 100), NOTHING, "nothing comes again");
    c.batch_execute("COMMIT").unwrap();
    let later = publish_events(c, "orders", 1, 1)[0];
    let d = next_delivery(c, POISONED);
    assert_eq!(d, at(later, 1), "the subscription is past the poison event");
    process(c, POISONED, d);

    let good: Vec<(i64, i32)> = events.iter().chain([&later]).filter(|&&p| p != poison).map(|&p| (p, 1)).collect();
    assert_eq!(effects(c), good, "every good event took effect once, at its first attempt");
    let kept = rows(c, &format!("SELECT position, data->>'n' FROM streams.get({poison})")).unwrap();
    assert_eq!(kept, [[Some(poison.to_string()), Some("6".to_owned())]], "the event stays in the log");
}

#[test]
fn a_poison_event_whose_handler_raises_is_parked_after_its_third_attempt() {
    let db = TestDb::new();
    let mut c = db.connect();
    let (events, poison) = poison_setup(&mut c);
    let attempts = consume_around_poison(db.connect(), &events, poison, fail_by_rollback);
    assert_poison_parked(&mut c, &events, poison, &attempts);
}

/// A commit that does not ack the event ends its attempt too.
#[test]
fn a_poison_event_committed_without_an_ack_is_parked_after_its_third_attempt() {
    let db = TestDb::new();
    let mut c = db.connect();
    let (events, poison) = poison_setup(&mut c);
    let attempts = consume_around_poison(db.connect(), &events, poison, |c| c.batch_execute("COMMIT").unwrap());
    assert_poison_parked(&mut c, &events, poison, &attempts);
}

#[test]
fn a_poison_event_whose_handler_terminates_its_backend_is_parked_after_its_third_attempt() {
    let db = TestDb::new();
    let mut c = db.connect();
    let (events, poison) = poison_setup(&mut c);
    let attempts = consume_around_poison(db.connect(), &events, poison, |c| {
        let died = c.batch_execute("SELECT pg_terminate_backend(pg_backend_pid())");
        assert!(died.is_err(), "the handler's backend is terminated");
        *c = db.connect();
    });
    assert_poison_parked(&mut c, &events, poison, &attempts);
}

/// The consumer's backend dies of SIGKILL: the postmaster then restarts
/// every backend, so this runs on a cluster of its own.
#[test]
fn a_poison_event_whose_backend_is_killed_is_parked_after_its_third_attempt() {
    let (cluster, mut c) = scratch_cluster("retries-sigkill", &["fsync = off"]);
    let (events, poison) = poison_setup(&mut c);
    drop(c);
    let attempts = consume_around_poison(cluster.connect("app"), &events, poison, |c| {
        let (backend, worker) = (backend_pid(c), cluster.wait_for_worker("app"));
        signal("KILL", backend);
        // Back once the restarted server has started a new worker.
        wait_until("the server restarted after the SIGKILL", Duration::from_secs(60), || {
            let Ok(mut admin) = cluster.config("postgres").connect(NoTls) else { return false };
            admin
                .query(
                    "SELECT pid FROM pg_stat_activity WHERE backend_type = 'litebase_streams worker' AND datname = 'app'",
                    &[],
                )
                .is_ok_and(|r| r.len() == 1 && r[0].get::<_, i32>(0) != worker)
        });
        *c = cluster.connect("app");
    });
    assert_poison_parked(&mut cluster.connect("app"), &events, poison, &attempts);
}

#[test]
fn a_poison_event_that_crashes_the_server_is_parked_after_its_third_attempt() {
    let (cluster, mut c) = scratch_cluster("retries-crash", &["fsync = off"]);
    let (events, poison) = poison_setup(&mut c);
    drop(c);
    let attempts = consume_around_poison(cluster.connect("app"), &events, poison, |c| {
        cluster.restart("immediate");
        assert!(c.batch_execute("SELECT 1").is_err(), "the consumer's session died with the server");
        *c = cluster.connect("app");
        cluster.wait_for_worker("app");
    });
    assert_poison_parked(&mut cluster.connect("app"), &events, poison, &attempts);
}

// --- nack and backoff --------------------------------------------------------------

/// The redelivery's time is the database's clock in the statement of the
/// poll that returned it; the nack's is now() of its transaction (the API
/// promises no redelivery before now() + retry_after).
#[test]
fn a_nacked_event_is_not_redelivered_before_its_retry_time() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute(
        "SELECT streams.create_subscription('later', 'orders', after => 0);
         SELECT streams.create_subscription('backoff', 'orders', after => 0, backoff_min => '200 milliseconds')",
    )
    .unwrap();
    let p = publish_events(&mut c, "orders", 2, 2);

    c.batch_execute("BEGIN").unwrap();
    assert_eq!(deliveries(&mut c, "later", 1), [at(p[0], 1)]);
    c.batch_execute(&format!(
        "SELECT streams.nack('later', {}, retry_after => '1 second', reason => 'downstream 500')",
        p[0]
    ))
    .unwrap();
    let nacked_at = transaction_time(&mut c);
    c.batch_execute("COMMIT; BEGIN").unwrap();
    assert_eq!(deliveries(&mut c, "later", 10), NOTHING, "ordered: the whole subscription waits for the nacked event");
    c.batch_execute("COMMIT").unwrap();
    let (got, after) = poll_until_delivered(&mut c, "later", 10, &nacked_at);
    assert_eq!(got, [at(p[0], 2), at(p[1], 1)], "the nacked event comes again first, as its second attempt");
    assert!(after >= 1.0, "redelivered {after} s after the nack, before retry_after (1 s)");
    ack(&mut c, "later", p[1]);
    c.batch_execute("COMMIT").unwrap();

    // Without retry_after: the backoff, 200 ms for a first attempt, jittered
    // down to no less than half of it.
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(deliveries(&mut c, "backoff", 1), [at(p[0], 1)]);
    c.batch_execute(&format!("SELECT streams.nack('backoff', {})", p[0])).unwrap();
    let nacked_at = transaction_time(&mut c);
    c.batch_execute("COMMIT").unwrap();
    let due = format!(
        "(SELECT next_retry_at - '{nacked_at}'::timestamptz FROM streams.subscriptions WHERE name = 'backoff')"
    );
    assert!(
        holds(&mut c, &format!("SELECT {due} BETWEEN interval '100 milliseconds' AND interval '450 milliseconds'")),
        "next_retry_at is {:?} after the nack: 100 to 200 ms (and not the default 1 s backoff)",
        value(&mut c, &format!("SELECT {due}"))
    );
    let (got, after) = poll_until_delivered(&mut c, "backoff", 1, &nacked_at);
    assert_eq!(got, [at(p[0], 2)]);
    assert!(after >= 0.1, "redelivered {after} s after the nack, before half the backoff (100 ms)");
    c.batch_execute("COMMIT").unwrap();
}

/// A consumer whose transaction failed nacks from a new transaction of the
/// same session; another session cannot, nor can the first once somebody
/// polled the event again.
#[test]
fn a_nack_after_a_failed_transaction_works_only_from_the_same_session() {
    let db = TestDb::new();
    let mut a = db.connect();
    let mut b = db.connect();
    a.batch_execute(
        "SELECT streams.create_subscription('same', 'orders', after => 0);
         SELECT streams.create_subscription('again', 'orders', after => 0)",
    )
    .unwrap();
    let p = publish_events(&mut a, "orders", 2, 2);

    a.batch_execute("BEGIN").unwrap();
    assert_eq!(deliveries(&mut a, "same", 1), [at(p[0], 1)]);
    a.batch_execute("ROLLBACK").unwrap();
    let before = snapshot(&mut a);
    fails_with(&mut b, &format!("SELECT streams.nack('same', {}, retry_after => '1 hour')", p[0]), "55000");
    assert_eq!(snapshot(&mut a), before, "another session's nack changed nothing");

    a.batch_execute(&format!("SELECT streams.nack('same', {}, retry_after => '1 hour', reason => 'failed')", p[0]))
        .unwrap();
    let r = retries(&mut a, "same");
    assert_eq!((r.retrying, r.parked), (1, 0), "the nack took: {r:?}");
    assert!(
        holds(
            &mut a,
            "SELECT next_retry_at > now() + interval '50 minutes' FROM streams.subscriptions WHERE name = 'same'"
        ),
        "retry in an hour: {r:?}"
    );
    a.batch_execute("BEGIN").unwrap();
    assert_eq!(deliveries(&mut a, "same", 10), NOTHING, "the subscription waits for the nacked event");
    a.batch_execute("COMMIT").unwrap();

    // Polled again by another session since: too late for the first one.
    a.batch_execute("BEGIN").unwrap();
    assert_eq!(deliveries(&mut a, "again", 1), [at(p[0], 1)]);
    a.batch_execute("ROLLBACK").unwrap();
    assert_eq!(next_delivery(&mut b, "again"), at(p[0], 2));
    b.batch_execute("ROLLBACK").unwrap();
    let before = snapshot(&mut a);
    fails_with(&mut a, &format!("SELECT streams.nack('again', {})", p[0]), "55000");
    assert_eq!(snapshot(&mut a), before, "the stale nack changed nothing");
}

// --- dead letters ------------------------------------------------------------------

#[test]
fn dead_letters_are_retried_or_discarded_by_their_owner_only() {
    let db = TestDb::new();
    let (alice, mallory) = (TestRole::new(&db, "alice", ""), TestRole::new(&db, "mallory", ""));
    let mut admin = db.connect();
    admin
        .batch_execute(&format!(
            "{EFFECTS}; GRANT SELECT, INSERT ON public.effects TO {0};
             SELECT streams.grant('read', 'orders', '{0}'), streams.grant('read', 'orders', '{1}')",
            alice.name, mallory.name
        ))
        .unwrap();
    let mut a = db.connect_as(&alice.name);
    a.batch_execute("SELECT streams.create_subscription('dl', 'orders', after => 0, max_attempts => 1)").unwrap();
    let p = publish_events(&mut admin, "orders", 4, 4);
    for (position, reason) in [(p[0], "bad p0"), (p[1], "bad p1")] {
        a.batch_execute("BEGIN").unwrap();
        assert_eq!(deliveries(&mut a, "dl", 1), [at(position, 1)], "the subscription is past the parked events");
        a.batch_execute(&format!("SELECT streams.nack('dl', {position}, reason => '{reason}'); COMMIT")).unwrap();
    }
    assert_eq!(
        dead_letters(&mut a, "dl"),
        [parked(p[0], 1, Some("bad p0"), Some("bad p0")), parked(p[1], 1, Some("bad p1"), Some("bad p1"))],
        "a nack at max_attempts parks the event at once"
    );
    assert_eq!(
        value(&mut a, "SELECT string_agg(DISTINCT owner::text, ',') FROM streams.dead_letters"),
        Some(alice.name.clone())
    );

    // Another role, which may read the stream, can do nothing with them.
    let before = snapshot(&mut a);
    let mut m = db.connect_as(&mallory.name);
    for sql in [
        format!("SELECT streams.retry_dead_letter('dl', {})", p[1]),
        "SELECT streams.retry_dead_letter('dl')".to_owned(),
        format!("SELECT streams.discard_dead_letter('dl', {})", p[1]),
        "SELECT streams.discard_dead_letter('dl')".to_owned(),
        format!("SELECT streams.nack('dl', {})", p[2]),
        "SELECT streams.alter_subscription('dl', max_attempts => 5)".to_owned(),
    ] {
        fails_with(&mut m, &sql, "42501");
    }
    assert_eq!(value(&mut m, "SELECT count(*) FROM streams.dead_letters").as_deref(), Some("0"), "mallory sees none");
    assert_eq!(snapshot(&mut a), before, "mallory changed nothing");

    // Retried: delivered again before the next events, from attempt 1, once.
    assert_eq!(column::<i64>(&mut a, &format!("SELECT streams.retry_dead_letter('dl', {})", p[0])).unwrap(), [1]);
    let d = next_delivery(&mut a, "dl");
    assert_eq!(d, at(p[0], 1), "the retried dead letter comes first");
    process(&mut a, "dl", d);
    for expected in [at(p[2], 1), at(p[3], 1)] {
        let d = next_delivery(&mut a, "dl");
        assert_eq!(d, expected);
        process(&mut a, "dl", d);
    }
    a.batch_execute("BEGIN").unwrap();
    assert_eq!(deliveries(&mut a, "dl", 10), NOTHING, "the retried event came once");
    a.batch_execute("COMMIT").unwrap();
    assert_eq!(effects(&mut admin), [(p[0], 1), (p[2], 1), (p[3], 1)]);
    assert_eq!(
        dead_letters(&mut a, "dl"),
        [parked(p[1], 1, Some("bad p1"), Some("bad p1"))],
        "p0 left the dead letters"
    );

    // Discarded: gone from the dead letters, kept in the log, not delivered.
    assert_eq!(column::<i64>(&mut a, &format!("SELECT streams.discard_dead_letter('dl', {})", p[1])).unwrap(), [1]);
    assert_eq!(parked_attempts(&mut a, "dl"), NO_DEAD_LETTERS, "discarded");
    assert_eq!(value(&mut a, &format!("SELECT position FROM streams.get({})", p[1])), Some(p[1].to_string()));
    a.batch_execute("BEGIN").unwrap();
    assert_eq!(deliveries(&mut a, "dl", 10), NOTHING, "a discarded dead letter is not delivered");
    a.batch_execute("COMMIT").unwrap();
    assert_eq!(retries(&mut a, "dl").parked, 0);
}

// --- bad input ---------------------------------------------------------------------

#[test]
fn bad_retry_arguments_fail_with_their_sqlstate_and_change_nothing() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute("SELECT streams.create_subscription('s', 'orders', after => 0)").unwrap();
    let p = publish_events(&mut c, "orders", 3, 3);
    let before = snapshot(&mut c);
    let long_reason = format!("reason => '{}'", "x".repeat(1001));

    let mut fresh = db.connect();
    for (sql, state) in [
        (format!("SELECT streams.nack('nope', {})", p[0]), "42704"),
        (format!("SELECT streams.retry_dead_letter('nope', {})", p[0]), "42704"),
        (format!("SELECT streams.discard_dead_letter('nope', {})", p[0]), "42704"),
        ("SELECT streams.alter_subscription('nope', max_attempts => 2)".to_owned(), "42704"),
        (format!("SELECT streams.nack('s', {})", p[1]), "55000"),
        ("SELECT streams.create_subscription('t', 'orders', max_attempts => 0)".to_owned(), "22023"),
        ("SELECT streams.create_subscription('t', 'orders', max_attempts => -1)".to_owned(), "22023"),
        ("SELECT streams.create_subscription('t', 'orders', max_attempts => 1001)".to_owned(), "22023"),
        ("SELECT streams.alter_subscription('s', max_attempts => 0)".to_owned(), "22023"),
        ("SELECT streams.alter_subscription('s', max_attempts => -1)".to_owned(), "22023"),
        ("SELECT streams.alter_subscription('s', max_attempts => 1001)".to_owned(), "22023"),
        (
            "SELECT streams.create_subscription('t', 'orders', backoff_min => '2 seconds', backoff_max => '1 second')"
                .to_owned(),
            "22023",
        ),
        ("SELECT streams.create_subscription('t', 'orders', backoff_min => '-1 second')".to_owned(), "22023"),
        ("SELECT streams.create_subscription('t', 'orders', backoff_max => '31 days')".to_owned(), "22023"),
        ("SELECT streams.alter_subscription('s', backoff_min => '11 minutes')".to_owned(), "22023"),
        ("SELECT streams.alter_subscription('s', backoff_max => '500 milliseconds')".to_owned(), "22023"),
        (format!("SELECT streams.retry_dead_letter('s', {})", p[0]), "P0002"),
        (format!("SELECT streams.discard_dead_letter('s', {})", p[0]), "P0002"),
    ] {
        fails_with(&mut fresh, &sql, state);
    }

    assert_eq!(snapshot(&mut c), before, "nothing created, changed, nacked or parked");
    assert_eq!(value(&mut c, "SELECT count(*) FROM streams.subscriptions WHERE name = 't'").as_deref(), Some("0"));

    // Bad nacks of an event the transaction did poll: compared within it
    // (how its rollback shows in the view is not the point here).
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(deliveries(&mut c, "s", 1), [at(p[0], 1)]);
    let polled = snapshot(&mut c);
    for (args, what) in [
        ("retry_after => '-1 second'", "a negative retry_after"),
        ("retry_after => '31 days'", "a retry_after over 30 days"),
        (long_reason.as_str(), "a reason of 1001 bytes"),
    ] {
        c.batch_execute("SAVEPOINT bad").unwrap();
        fails_with(&mut c, &format!("SELECT streams.nack('s', {}, {args})", p[0]), "22023");
        c.batch_execute("ROLLBACK TO SAVEPOINT bad").unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(snapshot(&mut c), polled, "{what} changed nothing");
    }
    c.batch_execute("ROLLBACK").unwrap();
    assert_eq!(parked_attempts(&mut c, "s"), NO_DEAD_LETTERS);
    assert_eq!(
        next_delivery(&mut c, "s"),
        at(p[0], 2),
        "not put off (31 days): delivered again, as its second attempt"
    );
    c.batch_execute("ROLLBACK").unwrap();
}

// --- creating and altering -----------------------------------------------------------

#[test]
fn create_subscription_if_not_exists_leaves_an_identical_one_alone() {
    let db = TestDb::new();
    let mut c = db.connect();
    let create = "SELECT streams.create_subscription('s', 'orders', after => 0, if_not_exists => true)";
    c.batch_execute(create).unwrap();
    let p = publish_events(&mut c, "orders", 5, 5);
    assert_eq!(consume(&mut c, "s", 3), p[..3]);
    let before = snapshot(&mut c);
    assert_eq!(progress(&mut c, "s").position, p[2]);

    c.batch_execute(create).unwrap();
    // Other settings than the pattern and ordered do not count, and change nothing.
    c.batch_execute(
        "SELECT streams.create_subscription('s', 'orders', after => 0, max_attempts => 5, if_not_exists => true)",
    )
    .unwrap();
    assert_eq!(snapshot(&mut c), before, "left alone: same position, same settings");
    for sql in [
        "SELECT streams.create_subscription('s', 'payment.*', after => 0, if_not_exists => true)",
        "SELECT streams.create_subscription('s', '*', after => 0, if_not_exists => true)",
        "SELECT streams.create_subscription('s', 'orders', after => 0, ordered => false, if_not_exists => true)",
        "SELECT streams.create_subscription('s', 'orders', after => 0)",
    ] {
        fails_with(&mut c, sql, "42710");
    }
    assert_eq!(snapshot(&mut c), before, "the refused ones changed nothing");
    assert_eq!(before.0.len(), 1, "one subscription");
    assert_eq!(consume(&mut c, "s", 10), p[3..], "it goes on where it was");
}

#[test]
fn alter_subscription_changes_max_attempts_for_the_next_failure() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute(&format!(
        "{EFFECTS};
         SELECT streams.create_subscription('alt', 'orders', after => 0,
                                            backoff_min => '10 milliseconds', backoff_max => '100 milliseconds')"
    ))
    .unwrap();
    let p = publish_events(&mut c, "orders", 3, 3);
    assert_eq!(retries(&mut c, "alt").max_attempts, None, "unlimited by default");
    assert_eq!([fail_next(&mut c, "alt", p[0]), fail_next(&mut c, "alt", p[0])], [1, 2]);
    assert_eq!(parked_attempts(&mut c, "alt"), NO_DEAD_LETTERS, "unlimited: never parked");

    c.batch_execute("SELECT streams.alter_subscription('alt', max_attempts => 2)").unwrap();
    assert_eq!(retries(&mut c, "alt").max_attempts, Some(2));
    let d = next_delivery(&mut c, "alt");
    assert_eq!(d, at(p[1], 1), "the event that failed twice is parked at the next poll");
    process(&mut c, "alt", d);
    assert_eq!(parked_attempts(&mut c, "alt"), [(p[0], 2)]);

    // max_attempts 1 would park p2 at its first failure; unlimited never does.
    c.batch_execute(
        "SELECT streams.alter_subscription('alt', max_attempts => 1);
         SELECT streams.alter_subscription('alt', unlimited_attempts => true)",
    )
    .unwrap();
    assert_eq!(retries(&mut c, "alt").max_attempts, None);
    let failed: Vec<i32> = (0..3).map(|_| fail_next(&mut c, "alt", p[2])).collect();
    assert_eq!(failed, [1, 2, 3]);
    let d = next_delivery(&mut c, "alt");
    assert_eq!(d, at(p[2], 4), "not parked");
    process(&mut c, "alt", d);
    assert_eq!(effects(&mut c), [(p[1], 1), (p[2], 4)]);
    assert_eq!(parked_attempts(&mut c, "alt"), [(p[0], 2)]);
}

// --- status ---------------------------------------------------------------------------

#[test]
fn the_subscriptions_view_shows_retrying_and_parked_events() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute("SELECT streams.create_subscription('st', 'orders', after => 0, max_attempts => 2)").unwrap();
    let p = publish_events(&mut c, "orders", 2, 2);
    let idle = Retries { max_attempts: Some(2), retrying: 0, next_retry_at: None, parked: 0, oldest_parked: None };
    assert_eq!(retries(&mut c, "st"), idle);

    c.batch_execute("BEGIN").unwrap();
    assert_eq!(deliveries(&mut c, "st", 1), [at(p[0], 1)]);
    c.batch_execute(&format!("SELECT streams.nack('st', {}, retry_after => '1 second', reason => 'boom')", p[0]))
        .unwrap();
    let nacked_at = transaction_time(&mut c);
    c.batch_execute("COMMIT").unwrap();
    let waiting = retries(&mut c, "st");
    assert_eq!((waiting.retrying, waiting.parked, waiting.oldest_parked.as_deref()), (1, 0, None), "{waiting:?}");
    assert!(
        holds(
            &mut c,
            &format!(
                "SELECT next_retry_at - '{nacked_at}'::timestamptz BETWEEN interval '1 second' AND interval '1 minute'
                 FROM streams.subscriptions WHERE name = 'st'"
            )
        ),
        "next_retry_at is a second after the nack: {waiting:?}, nacked at {nacked_at}"
    );

    // The second attempt fails too: at max_attempts, the nack parks it.
    let (got, _) = poll_until_delivered(&mut c, "st", 1, &nacked_at);
    assert_eq!(got, [at(p[0], 2)]);
    c.batch_execute(&format!("SELECT streams.nack('st', {}, reason => 'boom again'); COMMIT", p[0])).unwrap();
    let now_parked = retries(&mut c, "st");
    assert_eq!(
        (now_parked.max_attempts, now_parked.retrying, now_parked.next_retry_at.as_deref(), now_parked.parked),
        (Some(2), 0, None, 1),
        "{now_parked:?}"
    );
    assert_eq!(dead_letters(&mut c, "st"), [parked(p[0], 2, Some("boom"), Some("boom again"))]);
    assert!(
        holds(
            &mut c,
            "SELECT s.oldest_parked = d.parked_at AND d.first_failed_at <= d.last_failed_at
                    AND d.last_failed_at <= d.parked_at
             FROM streams.subscriptions s JOIN streams.dead_letters d ON d.subscription = s.name
             WHERE s.name = 'st'"
        ),
        "oldest_parked is the dead letter's parked_at, after its failures: {now_parked:?}"
    );
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(deliveries(&mut c, "st", 10), [at(p[1], 1)], "the subscription moved past it");
    c.batch_execute("ROLLBACK").unwrap();
}

// --- batches -----------------------------------------------------------------------

/// In a batch, only the failing event uses up its attempts: the events
/// after a nacked one come again after it, as attempts they had not used,
/// so with max_attempts => 2 the nacked event is parked and the good ones
/// after it are processed, never parked with it.
#[test]
fn a_nack_in_a_batch_uses_up_the_attempts_of_the_failing_event_alone() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute(EFFECTS).unwrap();
    c.batch_execute("SELECT streams.create_subscription('batch', 'orders', after => 0, max_attempts => 2)").unwrap();
    let p = publish_events(&mut c, "orders", 3, 3);
    for attempt in 1..=2 {
        c.batch_execute("BEGIN").unwrap();
        let got = deliveries(&mut c, "batch", 10);
        assert_eq!(got[0], at(p[0], attempt), "the failing event, attempt {attempt}");
        assert!(got[1..].iter().all(|d| d.attempt == 1), "the others were never tried: {got:?}");
        c.batch_execute(&format!("SELECT streams.nack('batch', {}, retry_after => '0'); COMMIT", p[0])).unwrap();
    }
    assert_eq!(parked_attempts(&mut c, "batch"), [(p[0], 2)]);
    c.batch_execute("BEGIN").unwrap();
    let got = deliveries(&mut c, "batch", 10);
    assert_eq!(got, [at(p[1], 1), at(p[2], 1)], "the good events come, as their first attempt");
    for d in got {
        c.batch_execute(&format!("INSERT INTO public.effects VALUES ({}, {})", d.position, d.attempt)).unwrap();
    }
    c.batch_execute(&format!("SELECT streams.ack('batch', {}); COMMIT", p[2])).unwrap();
    assert_eq!(effects(&mut c), [(p[1], 1), (p[2], 1)]);
    assert_eq!(parked_attempts(&mut c, "batch"), [(p[0], 2)], "nothing else parked");
}

/// A nacked event that is not the first of the next delivery (its
/// transaction rolled back, the nack came after) is not handed out before
/// its retry time with the events before it: the delivery stops before it.
#[test]
fn a_nacked_event_in_the_middle_of_a_batch_waits_for_its_retry_time() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute("SELECT streams.create_subscription('middle', 'orders', after => 0)").unwrap();
    let p = publish_events(&mut c, "orders", 3, 3);
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(deliveries(&mut c, "middle", 10).len(), 3);
    c.batch_execute("ROLLBACK").unwrap();
    c.batch_execute(&format!("SELECT streams.nack('middle', {}, retry_after => '1 hour')", p[1])).unwrap();
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(deliveries(&mut c, "middle", 10), [at(p[0], 2)], "the first event alone, not the nacked one");
    c.batch_execute(&format!("SELECT streams.ack('middle', {}); COMMIT", p[0])).unwrap();
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(deliveries(&mut c, "middle", 10), NOTHING, "then the nacked one holds the subscription");
    c.batch_execute("COMMIT").unwrap();
}

/// A dead letter discarded before any poll moved past it (parked by a nack
/// at its last attempt) is not delivered again: the next poll skips it.
#[test]
fn a_dead_letter_discarded_before_the_subscription_moved_past_it_is_not_delivered_again() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute("SELECT streams.create_subscription('early', 'orders', after => 0, max_attempts => 1)").unwrap();
    let p = publish_events(&mut c, "orders", 2, 2);
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(deliveries(&mut c, "early", 1), [at(p[0], 1)]);
    c.batch_execute(&format!("SELECT streams.nack('early', {}, reason => 'bad data'); COMMIT", p[0])).unwrap();
    assert_eq!(parked_attempts(&mut c, "early"), [(p[0], 1)], "parked at its last attempt");
    assert_eq!(value(&mut c, "SELECT streams.discard_dead_letter('early')").as_deref(), Some("1"));
    assert_eq!(parked_attempts(&mut c, "early"), NO_DEAD_LETTERS, "gone from the dead letters");
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(deliveries(&mut c, "early", 10), [at(p[1], 1)], "the next event, never the discarded one");
    c.batch_execute(&format!("SELECT streams.ack('early', {}); COMMIT", p[1])).unwrap();
    assert_eq!(retries(&mut c, "early").parked, 0);
}

// --- competing consumers (unordered) -------------------------------------------------

/// An unordered subscription counts attempts the same way: a poison event
/// polled alone and rolled back three times is parked by the next poll,
/// which goes on with the events after it in its chunk.
#[test]
fn an_unordered_poison_event_is_parked_after_its_third_attempt() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute(&format!(
        "{EFFECTS};
         SELECT streams.create_subscription('{POISONED}', 'orders', after => 0, ordered => false, max_attempts => 3)"
    ))
    .unwrap();
    let events = publish_events(&mut c, "orders", 11, 11);
    let poison = events[5];
    let attempts = consume_around_poison(db.connect(), &events, poison, fail_by_rollback);
    assert_poison_parked(&mut c, &events, poison, &attempts);
}

/// Competing consumers nack a failing event and ack the rest of their
/// batch: the others take effect once each, at their first attempt; the
/// failing one comes again (to whichever consumer polls it: it is not held
/// back behind its chunk) until it is parked at max_attempts.
#[test]
fn competing_consumers_nack_a_failing_event_and_process_the_rest_once() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute(&format!(
        "{EFFECTS};
         SELECT streams.create_subscription('jobs', 'orders', after => 0, ordered => false, max_attempts => 2)"
    ))
    .unwrap();
    let events = publish_events(&mut c, "orders", 20, 20);
    let poison = events[7];
    let mut consumers = [db.connect(), db.connect()];
    let mut poison_attempts = Vec::new();
    let mut turn = 0;
    wait_until("the consumers are past every event", Duration::from_secs(60), || {
        let consumer = &mut consumers[turn % 2];
        turn += 1;
        consumer.batch_execute("BEGIN").unwrap();
        let got = deliveries(consumer, "jobs", 5);
        for d in &got {
            if d.position == poison {
                poison_attempts.push(d.attempt);
                consumer
                    .batch_execute(&format!(
                        "SELECT streams.nack('jobs', {poison}, retry_after => '0', reason => 'bad')"
                    ))
                    .unwrap();
            } else {
                consumer
                    .batch_execute(&format!("INSERT INTO public.effects VALUES ({}, {})", d.position, d.attempt))
                    .unwrap();
            }
        }
        if let Some(last) = got.last() {
            ack(consumer, "jobs", last.position);
        }
        consumer.batch_execute("COMMIT").unwrap();
        got.is_empty() && effects(&mut c).len() == 19 && !parked_attempts(&mut c, "jobs").is_empty()
    });
    assert_eq!(poison_attempts, [1, 2], "the failing event's attempts");
    assert_eq!(dead_letters(&mut c, "jobs"), [parked(poison, 2, Some("bad"), Some("bad"))]);
    let good: Vec<(i64, i32)> = events.iter().filter(|&&p| p != poison).map(|&p| (p, 1)).collect();
    assert_eq!(effects(&mut c), good, "every other event took effect once, at its first attempt");
    assert_eq!(retries(&mut c, "jobs").retrying, 0, "nothing is waiting for a retry");
}

/// A nacked event of an unordered subscription does not hold the others:
/// the rest of its batch is acked, later events come at once, and it comes
/// again only after its retry time (the database's own timestamps), as its
/// second attempt. After a failed transaction only the same session may
/// nack it.
#[test]
fn an_unordered_nacked_event_comes_again_after_its_retry_time_and_holds_nothing() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute("SELECT streams.create_subscription('pool', 'orders', after => 0, ordered => false)").unwrap();
    let p = publish_events(&mut c, "orders", 3, 3);
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(deliveries(&mut c, "pool", 10), [at(p[0], 1), at(p[1], 1), at(p[2], 1)]);
    c.batch_execute(&format!("SELECT streams.nack('pool', {}, retry_after => '1 second')", p[1])).unwrap();
    let nacked_at = transaction_time(&mut c);
    ack(&mut c, "pool", p[2]);
    c.batch_execute("COMMIT").unwrap();
    let later = publish_events(&mut c, "orders", 1, 1)[0];
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(deliveries(&mut c, "pool", 10), [at(later, 1)], "a later event comes at once, the nacked one not yet");
    ack(&mut c, "pool", later);
    c.batch_execute("COMMIT").unwrap();
    let (got, after) = poll_until_delivered(&mut c, "pool", 10, &nacked_at);
    assert_eq!(got, [at(p[1], 2)], "the nacked event, as its second attempt");
    assert!(after >= 1.0, "redelivered {after} s after the nack, before retry_after (1 s)");
    c.batch_execute("ROLLBACK").unwrap();

    // Its transaction failed: another session may not nack it, the same may.
    let mut other = db.connect();
    fails_with(&mut other, &format!("SELECT streams.nack('pool', {})", p[1]), "55000");
    // The error comes before its transaction's end lets go of the chunk.
    other.batch_execute("SELECT").unwrap();
    c.batch_execute(&format!("SELECT streams.nack('pool', {}, retry_after => '0', reason => 'again')", p[1])).unwrap();
    let d = next_delivery(&mut c, "pool");
    assert_eq!(d, at(p[1], 3), "the nacked event, as its third attempt");
    ack(&mut c, "pool", p[1]);
    c.batch_execute("COMMIT").unwrap();
    assert_eq!(retries(&mut c, "pool").retrying, 0, "acked: no failure left");
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(deliveries(&mut c, "pool", 10), NOTHING, "every event processed");
    c.batch_execute("COMMIT").unwrap();
}

/// Two failing events in one batch of an ordered subscription: the second
/// nack changes nothing (its event comes again after the first, untried)
/// and does not fail the transaction, so a consumer may nack every event
/// that failed, as the example of docs/subscriptions.md does.
#[test]
fn a_second_nack_in_an_ordered_batch_changes_nothing() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute("SELECT streams.create_subscription('two', 'orders', after => 0, max_attempts => 3)").unwrap();
    let p = publish_events(&mut c, "orders", 3, 3);
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(deliveries(&mut c, "two", 10), [at(p[0], 1), at(p[1], 1), at(p[2], 1)]);
    c.batch_execute(&format!(
        "SELECT streams.nack('two', {}, retry_after => '0'); SELECT streams.nack('two', {}, retry_after => '0')",
        p[0], p[2]
    ))
    .unwrap();
    c.batch_execute("COMMIT").unwrap();
    assert_eq!(retries(&mut c, "two").retrying, 1, "one failure: the first nacked event");
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(
        deliveries(&mut c, "two", 10),
        [at(p[0], 2), at(p[1], 1), at(p[2], 1)],
        "the first comes again first; the others untried"
    );
    c.batch_execute("ROLLBACK").unwrap();
}
