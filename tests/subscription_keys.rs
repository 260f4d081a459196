//! Subscriptions ordered per key (issue 24): `key => 'order_id'` (a path
//! into data) or `key => '$stream'`. The events of one key are handed out
//! in position order, one transaction at a time; different keys go to
//! competing consumers in parallel. A nacked event holds its key until due,
//! a parked one until it is discarded (on_dead_letter 'hold') or not at all
//! ('skip'); other keys go on. Also: bad arguments, other roles, leases.
#![cfg(feature = "integration")]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use common::pgbouncer::{column, rows, Pgbouncer};
use common::subscriptions::*;
use common::*;
use postgres::{Client, Config};

// --- helpers -----------------------------------------------------------------------

/// An event's data: {"order_id": key, "n": n}.
fn order(key: &str, n: usize) -> String {
    format!(r#"{{"order_id":"{key}","n":{n}}}"#)
}

/// Publish `data` to `stream` in one transaction and wait until it is final: the positions.
fn publish_data(c: &mut Client, stream: &str, data: &[String]) -> Vec<i64> {
    let positions: Vec<i64> = c
        .query("SELECT p FROM streams.publish_batch($1, $2::text[]::jsonb[]) p", &[&stream, &data])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    wait_for_horizon(c, *positions.last().unwrap());
    positions
}

/// One event per key, {"order_id": key, "n": its index}, in one transaction.
fn publish_orders(c: &mut Client, keys: &[&str]) -> Vec<i64> {
    let data: Vec<String> = keys.iter().enumerate().map(|(n, k)| order(k, n)).collect();
    publish_data(c, "orders", &data)
}

/// The positions of `p` whose key (`keys`, in the same order) is `key`, or is not.
fn of_key(p: &[i64], keys: &[&str], key: &str, is: bool) -> Vec<i64> {
    p.iter().zip(keys).filter(|(_, k)| (**k == key) == is).map(|(p, _)| *p).collect()
}

/// BEGIN and poll (at most `max`): the positions, the transaction left open.
fn begin_poll(c: &mut Client, sub: &str, max: i32) -> Vec<i64> {
    c.batch_execute("BEGIN").unwrap();
    poll(c, sub, max)
}

/// Ack through `through` (if any) and commit.
fn ack_commit(c: &mut Client, sub: &str, through: Option<&i64>) {
    if let Some(&through) = through {
        ack(c, sub, through);
    }
    c.batch_execute("COMMIT").unwrap();
}

/// A poll in a transaction of its own that takes nothing away: the positions.
fn peek(c: &mut Client, sub: &str) -> Vec<i64> {
    let got = begin_poll(c, sub, 50);
    c.batch_execute("ROLLBACK").unwrap();
    got
}

/// An error with its SQLSTATE, message and detail.
fn error(e: &postgres::Error) -> String {
    e.as_db_error().map_or(e.to_string(), |d| format!("{} {d} {:?} {:?}", d.code().code(), d.detail(), d.where_()))
}

/// The one value of a one-row, one-column query, as text.
fn value(c: &mut Client, sql: &str) -> String {
    let r = rows(c, sql).unwrap_or_else(|e| panic!("{sql}: {}", error(&e)));
    assert_eq!(r.len(), 1, "{sql}: one row");
    r[0][0].clone().unwrap_or_else(|| "NULL".into())
}

/// A column of `sub`'s row of streams.subscriptions, as text.
fn status(c: &mut Client, sub: &str, column: &str) -> String {
    value(c, &format!("SELECT {column} FROM streams.subscriptions WHERE name = '{sub}'"))
}

/// (position, attempts) of `sub`'s dead letters.
fn dead_letters(c: &mut Client, sub: &str) -> Vec<(i64, i32)> {
    rows(c, &format!("SELECT position, attempts FROM streams.dead_letters WHERE subscription = '{sub}' ORDER BY 1"))
        .unwrap()
        .iter()
        .map(|r| (r[0].as_deref().unwrap().parse().unwrap(), r[1].as_deref().unwrap().parse().unwrap()))
        .collect()
}

/// What a poll that returns nothing returns.
const NOTHING: [i64; 0] = [];

/// A deterministic pseudo-random sequence (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn percent(&mut self, p: u64) -> bool {
        self.next() % 100 < p
    }
}

// --- competing consumers -----------------------------------------------------------

const SUB: &str = "by_order";
const EVENTS: usize = 2000;
const KEYS: u64 = 50;

/// One row per processed event; `steps` orders what the consumers did:
/// `polled` is taken right after the poll that returned the event,
/// `committed` right before the COMMIT that made the row (one value each
/// per transaction). A key's transactions must not overlap, and its events
/// take effect in position order.
const EFFECTS: &str = "CREATE SEQUENCE public.steps;
    CREATE TABLE public.effects (position bigint PRIMARY KEY, key text NOT NULL, consumer int NOT NULL,
                                 polled bigint NOT NULL, committed bigint)";

#[derive(Debug, Default)]
struct Work {
    committed_batches: usize,
    rolled_back_batches: usize,
    terminated: bool,
    deadlocks: usize,
}

/// A consumer at the moment it holds a batch, waiting to be told to go on.
struct HoldOnce {
    holding: mpsc::Sender<i32>,
    go_on: mpsc::Receiver<()>,
}

/// The consumer loop: BEGIN; poll up to 50; an effect row per event; ack the
/// last; COMMIT, or (10 %) ROLLBACK. With `hold`, its third batch is held
/// (its backend pid reported) until the test says go on, when the backend
/// is expected to be gone: then it reconnects and goes on.
fn consume_orders(id: i32, config: Config, done: &AtomicBool, mut hold: Option<HoldOnce>) -> Work {
    let mut c = connect_retrying(&config);
    let (mut rng, mut work, mut batches) = (Rng(0x9e37_79b9 + id as u64), Work::default(), 0);
    while !done.load(Ordering::Relaxed) {
        c.batch_execute("BEGIN").unwrap();
        let sql = format!("SELECT position, data->>'order_id' FROM streams.poll('{SUB}', 50, '100 milliseconds')");
        let polled: Vec<(i64, String)> = rows(&mut c, &sql)
            .unwrap_or_else(|e| panic!("consumer {id}: poll: {}", error(&e)))
            .into_iter()
            .map(|r| (r[0].as_deref().unwrap().parse().unwrap(), r[1].clone().unwrap()))
            .collect();
        if polled.is_empty() {
            c.batch_execute("COMMIT").unwrap();
            continue;
        }
        assert!(polled.windows(2).all(|w| w[0].0 < w[1].0), "consumer {id}: a poll out of order: {polled:?}");
        let step: i64 = column(&mut c, "SELECT nextval('public.steps')").unwrap()[0];
        for (position, key) in &polled {
            c.batch_execute(&format!("INSERT INTO public.effects VALUES ({position}, '{key}', {id}, {step})"))
                .unwrap_or_else(|e| panic!("consumer {id}: the effect of {position} ({key}): {}", error(&e)));
        }
        batches += 1;
        if batches == 3 {
            if let Some(hold) = hold.take() {
                hold.holding.send(backend_pid(&mut c)).unwrap();
                hold.go_on.recv().unwrap();
                let gone = c.batch_execute(&format!("SELECT streams.ack('{SUB}', {})", polled.last().unwrap().0));
                assert!(gone.is_err(), "consumer {id}: the terminated backend still answers");
                c = connect_retrying(&config);
                work.terminated = true;
                continue;
            }
        }
        let through = polled.last().unwrap().0;
        match c.batch_execute(&format!("SELECT streams.ack('{SUB}', {through})")) {
            Ok(()) => {}
            // A bug (see concurrent_acks_of_different_keys_do_not_deadlock),
            // counted, so that the rest is checked all the same.
            Err(e) if sqlstate(&e) == "40P01" => {
                c.batch_execute("ROLLBACK").unwrap();
                work.deadlocks += 1;
                continue;
            }
            Err(e) => panic!("consumer {id}: ack through {through} of {polled:?}: {}", error(&e)),
        }
        if rng.percent(10) {
            c.batch_execute("ROLLBACK").unwrap();
            work.rolled_back_batches += 1;
        } else {
            c.batch_execute(
                "UPDATE public.effects SET committed = (SELECT nextval('public.steps')) WHERE committed IS NULL; COMMIT",
            )
            .unwrap_or_else(|e| panic!("consumer {id}: commit: {}", error(&e)));
            work.committed_batches += 1;
        }
    }
    work
}

/// A row of public.effects.
#[derive(Debug)]
struct Effect {
    position: i64,
    key: String,
    consumer: i32,
    polled: i64,
    committed: i64,
}

fn effects(c: &mut Client) -> Vec<Effect> {
    c.query(
        "SELECT position, key, consumer, polled, committed FROM public.effects ORDER BY key, committed, position",
        &[],
    )
    .unwrap()
    .iter()
    .map(|r| Effect { position: r.get(0), key: r.get(1), consumer: r.get(2), polled: r.get(3), committed: r.get(4) })
    .collect()
}

/// Tells the consumers to stop when dropped.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[test]
fn competing_consumers_process_every_event_once_and_each_key_in_order() {
    let db = TestDb::new();
    let bouncer = Pgbouncer::start();
    let mut c = db.connect();
    c.batch_execute(&format!(
        "{EFFECTS}; SELECT streams.create_subscription('{SUB}', 'orders', after => 0, key => 'order_id')"
    ))
    .unwrap();

    let done = AtomicBool::new(false);
    let (holding_tx, holding) = mpsc::channel();
    let (go_on, go_on_rx) = mpsc::channel();
    let mut hold = Some(HoldOnce { holding: holding_tx, go_on: go_on_rx });
    let (published, work) = std::thread::scope(|scope| {
        // However this ends, the consumers stop (and one held stops waiting).
        let (_stop, go_on) = (StopOnDrop(&done), go_on);
        let consumers: Vec<_> = (0..4)
            .map(|id| {
                let config = if id < 2 { db.config() } else { bouncer.config(&db.name) };
                let (done, hold) = (&done, if id == 0 { hold.take() } else { None });
                scope.spawn(move || consume_orders(id, config, done, hold))
            })
            .collect();

        // 2,000 events over 50 keys, interleaved pseudo-randomly, in 20 transactions.
        let mut rng = Rng(7);
        let mut published: Vec<(i64, String)> = Vec::new();
        for batch in 0..20 {
            let data: Vec<(String, String)> = (0..EVENTS / 20)
                .map(|i| {
                    let key = format!("o{}", rng.next() % KEYS);
                    let data = order(&key, batch * (EVENTS / 20) + i);
                    (key, data)
                })
                .collect();
            let positions = publish_data(&mut c, "orders", &data.iter().map(|d| d.1.clone()).collect::<Vec<_>>());
            published.extend(positions.into_iter().zip(data.into_iter().map(|d| d.0)));
        }

        // Consumer 0 holds its third batch: terminate its backend then.
        let pid = holding.recv_timeout(Duration::from_secs(60)).expect("consumer 0 holds a batch");
        let claimed_by = status(&mut c, SUB, "claimed_by");
        assert!(claimed_by.contains(&pid.to_string()), "backend {pid} holds polled events: claimed_by {claimed_by}");
        c.batch_execute(&format!("SELECT pg_terminate_backend({pid})")).unwrap();
        wait_until("the consumer's backend is gone", Duration::from_secs(20), || !backend_exists(&mut c, pid));
        go_on.send(()).unwrap();

        wait_until("every event has its effect", Duration::from_secs(180), || {
            consumers.iter().any(|t| t.is_finished())
                || value(&mut c, "SELECT count(*) FROM public.effects") == EVENTS.to_string()
        });
        done.store(true, Ordering::Relaxed);
        let work: Vec<Work> = consumers.into_iter().map(|t| t.join().expect("a consumer failed")).collect();
        (published, work)
    });

    // Exactly once: a second committed effect of an event would have failed
    // its consumer (the primary key); none is missing, none is foreign.
    let effects = effects(&mut c);
    let mut seen: Vec<(i64, String)> = effects.iter().map(|e| (e.position, e.key.clone())).collect();
    seen.sort();
    assert_eq!(seen.len(), EVENTS, "one effect per event");
    assert_eq!(seen, published, "every event took effect once, with its key");

    // Per key: in position order, one transaction at a time.
    for pair in effects.windows(2).filter(|w| w[0].key == w[1].key) {
        let (a, b) = (&pair[0], &pair[1]);
        assert!(a.position < b.position, "key {}: {} took effect after {}: {a:?} {b:?}", a.key, b.position, a.position);
        if a.committed != b.committed {
            assert!(b.polled > a.committed, "key {}: polled by two transactions at once: {a:?} {b:?}", a.key);
        }
    }

    // In parallel: several consumers did work, and different keys' transactions overlapped.
    let consumers: std::collections::BTreeSet<i32> = effects.iter().map(|e| e.consumer).collect();
    assert!(consumers.len() >= 2, "only consumers {consumers:?} did work: {work:?}");
    let overlapping = effects
        .iter()
        .any(|a| effects.iter().any(|b| a.consumer != b.consumer && a.polled < b.committed && b.polled < a.committed));
    assert!(overlapping, "no two transactions held keys at the same time: {work:?}");
    assert!(work[0].terminated, "consumer 0's backend was terminated mid-batch: {work:?}");
    assert!(work.iter().map(|w| w.rolled_back_batches).sum::<usize>() > 0, "some batches rolled back: {work:?}");

    let last = published.last().unwrap().0;
    assert_eq!(progress(&mut c, SUB), Progress { position: last, pending: 0, claimed: 0 }, "{work:?}");
    assert_eq!(status(&mut c, SUB, "retrying") + "/" + &status(&mut c, SUB, "parked"), "0/0");
    assert!(work.iter().all(|w| w.deadlocks == 0), "acks of different keys deadlocked (40P01): {work:?}");
}

/// Two transactions holding different keys ack at the same time. The one
/// whose ack moves the processed prefix deletes the key rows below it (here
/// a's, then b's); the other has updated b's row and now updates a's: that
/// must not deadlock (40P01).
#[test]
fn concurrent_acks_of_different_keys_do_not_deadlock() {
    let db = TestDb::new();
    let (mut t1, mut t2, mut s) = (db.connect(), db.connect(), db.connect());
    s.batch_execute("SELECT streams.create_subscription('k', 'orders', after => 0, key => 'order_id')").unwrap();
    let p = publish_orders(&mut s, &["c", "a", "b", "b", "a"]);
    assert_eq!(begin_poll(&mut t1, "k", 1), [p[0]], "T1 holds c, at the front");
    for q in &p[1..3] {
        assert_eq!(begin_poll(&mut s, "k", 1), [*q], "a and b are processed once each, above the front");
        ack_commit(&mut s, "k", Some(q));
    }
    assert_eq!(begin_poll(&mut t2, "k", 50), p[3..], "T2 holds b and a");
    ack(&mut t2, "k", p[3]);

    let t1_pid = backend_pid(&mut t1);
    let (first, second) = std::thread::scope(|scope| {
        let (t1, front) = (&mut t1, p[0]);
        let first = scope.spawn(move || t1.batch_execute(&format!("SELECT streams.ack('k', {front}); COMMIT")));
        wait_until("T1's ack is done or waits", Duration::from_secs(20), || {
            first.is_finished()
                || s.query_one("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", &[&t1_pid])
                    .unwrap()
                    .get::<_, Option<bool>>(0)
                    == Some(true)
        });
        let second = t2.batch_execute(&format!("SELECT streams.ack('k', {}); COMMIT", p[4]));
        (first.join().unwrap(), second)
    });
    for (who, result) in [("T1", first), ("T2", second)] {
        result.unwrap_or_else(|e| panic!("{who}'s ack: {}", error(&e)));
    }
    assert_eq!(progress(&mut s, "k"), Progress { position: p[4], pending: 0, claimed: 0 });
}

// --- one transaction at a time per key ---------------------------------------------

#[test]
fn a_key_polled_by_one_transaction_is_not_handed_to_another_until_it_ends() {
    let db = TestDb::new();
    let (mut a, mut b) = (db.connect(), db.connect());
    a.batch_execute("SELECT streams.create_subscription('k', 'orders', after => 0, key => 'order_id')").unwrap();
    let keys = ["o1", "o2", "o1", "o3", "o1", "o2", "o3", "o1"];
    let p = publish_orders(&mut a, &keys);
    let (o1, others) = (of_key(&p, &keys, "o1", true), of_key(&p, &keys, "o1", false));

    assert_eq!(begin_poll(&mut a, "k", 1), [o1[0]], "A holds o1's first event");
    let got = begin_poll(&mut b, "k", 50);
    assert_eq!(got, others, "B gets the other keys' events, none of o1's");
    ack_commit(&mut b, "k", got.last());
    assert_eq!(peek(&mut b, "k"), NOTHING, "o1 is still held by A: nothing for B");
    assert_eq!(progress(&mut b, "k").pending, 4, "o1's four events are not processed");

    ack_commit(&mut a, "k", Some(&o1[0]));
    let got = begin_poll(&mut b, "k", 50);
    assert_eq!(got, o1[1..], "after A's commit, o1's next events, in order");
    ack_commit(&mut b, "k", got.last());
    assert_eq!(progress(&mut a, "k"), Progress { position: p[7], pending: 0, claimed: 0 });
}

/// A rolled-back transaction lets go of its key: its events come again first.
#[test]
fn a_rolled_back_transaction_lets_go_of_its_key() {
    let db = TestDb::new();
    let (mut a, mut b) = (db.connect(), db.connect());
    a.batch_execute("SELECT streams.create_subscription('k', 'orders', after => 0, key => 'order_id')").unwrap();
    let keys = ["o1", "o2", "o1"];
    let p = publish_orders(&mut a, &keys);
    assert_eq!(begin_poll(&mut a, "k", 1), [p[0]]);
    assert_eq!(begin_poll(&mut b, "k", 50), [p[1]]);
    a.batch_execute("ROLLBACK").unwrap();
    assert_eq!(poll(&mut b, "k", 50), [p[0], p[2]], "B's transaction takes o1 now, from its first event");
    ack_commit(&mut b, "k", Some(&p[2]));
    assert_eq!(peek(&mut a, "k"), NOTHING);
}

// --- nack --------------------------------------------------------------------------

#[test]
fn a_nacked_event_holds_only_its_key() {
    let db = TestDb::new();
    let (mut c, mut d) = (db.connect(), db.connect());
    c.batch_execute("SELECT streams.create_subscription('k', 'orders', after => 0, key => 'order_id')").unwrap();
    let keys = ["o1", "o2", "o1", "o3", "o1", "o2"];
    let p = publish_orders(&mut c, &keys);

    assert_eq!(begin_poll(&mut c, "k", 50), p, "every key is free: all of them");
    c.batch_execute(&format!("SELECT streams.nack('k', {}, retry_after => '1 hour')", p[0])).unwrap();
    ack_commit(&mut c, "k", Some(&p[5]));
    assert_eq!(status(&mut c, "k", "retrying"), "1");
    assert_eq!(progress(&mut c, "k").pending, 3, "o1's events from the nacked one on are not processed");
    assert_eq!(progress(&mut c, "k").position, p[0] - 1, "the processed prefix ends before the nacked event");

    let q = publish_orders(&mut c, &["o1", "o2", "o3"]);
    let got = begin_poll(&mut d, "k", 50);
    assert_eq!(got, q[1..], "the other keys go on; o1 waits for its nacked event");
    ack_commit(&mut d, "k", got.last());
    for client in [&mut c, &mut d] {
        assert_eq!(peek(client, "k"), NOTHING, "nothing of o1 before its nacked event is due");
    }
    assert_eq!(status(&mut c, "k", "retrying"), "1");
    assert_eq!(progress(&mut c, "k").pending, 4);
}

/// A poll ordered per key whose events lie on both sides of a held key's
/// event is one delivery of two ranges, (a, b] and (c, d], and an earlier
/// delivery's segment can span both. The worker read that segment once
/// for the two ranges, so the second range was written from the rows before
/// the first one's rewrite: a duplicate key (23505, every poll of the
/// subscription failed until the nack fell due) or, with other segments,
/// two overlapping counts of one event. Each range now reads what the one
/// before it wrote.
#[test]
fn a_delivery_around_a_held_key_counts_each_event_once() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute("SELECT streams.create_subscription('k', 'orders', after => 0, key => 'order_id')").unwrap();
    let p = publish_orders(&mut c, &["o1", "o2", "o3"]);
    let attempts = |c: &mut Client| -> Vec<(i64, i32)> {
        try_deliveries(c, "k", 10, "0").unwrap().iter().map(|d| (d.position, d.attempt)).collect()
    };
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(attempts(&mut c), [(p[0], 1), (p[1], 1), (p[2], 1)]);
    c.batch_execute("ROLLBACK; BEGIN").unwrap();
    assert_eq!(attempts(&mut c), [(p[0], 2), (p[1], 2), (p[2], 2)], "one segment spans the three");
    c.batch_execute(&format!("SELECT streams.nack('k', {}, retry_after => '1 hour'); COMMIT", p[1])).unwrap();
    for attempt in [3, 4] {
        c.batch_execute("BEGIN").unwrap();
        let got = attempts(&mut c);
        c.batch_execute("COMMIT").unwrap();
        assert_eq!(got, [(p[0], attempt), (p[2], attempt)], "o2 is held; the others come again, counted once");
    }
    let overlapping: i64 = c
        .query_one(
            "SELECT count(*) FROM streams.subscription_deliveries a JOIN streams.subscription_deliveries b
               ON a.subscription = b.subscription AND a.low < b.high AND b.low < a.high AND a.low <> b.low",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(overlapping, 0, "no event has two counts");
}

// --- dead letters --------------------------------------------------------------------

#[test]
fn a_dead_letter_holds_its_key_until_discarded_unless_the_subscription_skips() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute(
        "SELECT streams.create_subscription('held', 'orders', after => 0, key => 'order_id', max_attempts => 1);
         SELECT streams.create_subscription('skipped', 'orders', after => 0, key => 'order_id', max_attempts => 1,
                                            on_dead_letter => 'skip')",
    )
    .unwrap();
    let keys = ["o1", "o2", "o1", "o1", "o2"];
    let p = publish_orders(&mut c, &keys);
    // o1's first event fails its only attempt in both.
    for sub in ["held", "skipped"] {
        assert_eq!(begin_poll(&mut c, sub, 1), [p[0]]);
        c.batch_execute("ROLLBACK").unwrap();
    }

    let got = begin_poll(&mut c, "held", 50);
    assert_eq!(got, [p[1], p[4]], "'hold': o2 goes on, o1 waits behind its dead letter");
    ack_commit(&mut c, "held", got.last());
    assert_eq!(dead_letters(&mut c, "held"), [(p[0], 1)]);
    assert_eq!(peek(&mut c, "held"), NOTHING, "o1 stays held");

    let got = begin_poll(&mut c, "skipped", 50);
    assert_eq!(got, p[1..], "'skip': o1's later events flow right away");
    ack_commit(&mut c, "skipped", got.last());
    assert_eq!(dead_letters(&mut c, "skipped"), [(p[0], 1)], "the dead letter stays for its owner");

    assert_eq!(value(&mut c, &format!("SELECT streams.discard_dead_letter('held', {})", p[0])), "1");
    let got = begin_poll(&mut c, "held", 50);
    assert_eq!(got, [p[2], p[3]], "discarded: o1's later events flow, in order");
    ack_commit(&mut c, "held", got.last());
    assert!(dead_letters(&mut c, "held").is_empty());
    for (sub, parked) in [("held", "0"), ("skipped", "1")] {
        assert_eq!(progress(&mut c, sub), Progress { position: p[4], pending: 0, claimed: 0 }, "{sub}");
        assert_eq!(status(&mut c, sub, "parked"), parked, "{sub}");
    }
}

// --- per stream ----------------------------------------------------------------------

#[test]
fn key_stream_makes_each_stream_of_a_pattern_a_key_of_its_own() {
    let db = TestDb::new();
    let (mut a, mut b) = (db.connect(), db.connect());
    a.batch_execute("SELECT streams.create_subscription('shops', 'shop.*', after => 0, key => '$stream')").unwrap();
    assert_eq!(status(&mut a, "shops", "key"), "$stream");
    let mut p = std::collections::BTreeMap::<&str, Vec<i64>>::new();
    for (n, stream) in ["shop.a", "shop.b", "shop.a", "other", "shop.b", "shop.a"].into_iter().enumerate() {
        p.entry(stream).or_default().push(publish(&mut a, stream, &order("o1", n)));
    }
    wait_for_horizon(&mut a, p.values().flatten().copied().max().unwrap());

    assert_eq!(begin_poll(&mut a, "shops", 1), p["shop.a"][..1], "A holds shop.a");
    let got = begin_poll(&mut b, "shops", 50);
    assert_eq!(got, p["shop.b"], "shop.b goes to B (the same order_id does not matter)");
    ack_commit(&mut b, "shops", got.last());
    assert_eq!(peek(&mut b, "shops"), NOTHING);
    ack_commit(&mut a, "shops", Some(&p["shop.a"][0]));
    let got = begin_poll(&mut b, "shops", 50);
    assert_eq!(got, p["shop.a"][1..], "then shop.a's next events, in order; never 'other'");
    ack_commit(&mut b, "shops", got.last());
    assert_eq!(progress(&mut a, "shops").pending, 0);
}

/// key => '$key': the envelope's key orders the events, whatever their data says.
#[test]
fn key_envelope_orders_by_the_events_own_key() {
    let db = TestDb::new();
    let (mut a, mut b) = (db.connect(), db.connect());
    a.batch_execute("SELECT streams.create_subscription('by_key', 'orders', after => 0, key => '$key')").unwrap();
    assert_eq!(status(&mut a, "by_key", "key"), "$key");
    // The data's order_id is the same for all: only the envelope's key counts.
    let keys = ["acct.1", "acct.2", "acct.1", "acct.2", "acct.1"];
    let p: Vec<i64> = keys
        .iter()
        .enumerate()
        .map(|(n, key)| {
            a.query_one("SELECT streams.publish('orders', $1::text::jsonb, key => $2)", &[&order("o1", n), key])
                .unwrap()
                .get(0)
        })
        .collect();
    wait_for_horizon(&mut a, p[4]);
    assert_eq!(begin_poll(&mut a, "by_key", 1), [p[0]], "A holds acct.1");
    let got = begin_poll(&mut b, "by_key", 50);
    assert_eq!(got, of_key(&p, &keys, "acct.2", true), "B gets acct.2's events, none of acct.1's");
    ack_commit(&mut b, "by_key", got.last());
    ack_commit(&mut a, "by_key", Some(&p[0]));
    let got = begin_poll(&mut b, "by_key", 50);
    assert_eq!(got, [p[2], p[4]], "then acct.1's next events, in order");
    ack_commit(&mut b, "by_key", got.last());
    assert_eq!(progress(&mut a, "by_key").pending, 0);
}

// --- bad input and other roles -------------------------------------------------------

#[test]
fn bad_keys_other_roles_and_leases_are_refused() {
    let db = TestDb::new();
    let (alice, mallory) = (TestRole::new(&db, "alice", ""), TestRole::new(&db, "mallory", ""));
    let mut admin = db.connect();
    admin
        .batch_execute(&format!(
            "SELECT streams.grant('read', 'orders', '{0}'), streams.grant('read', 'orders', '{1}')",
            alice.name, mallory.name
        ))
        .unwrap();
    let mut a = db.connect_as(&alice.name);
    for args in [
        "key => 'a..b'",
        "key => ''",
        "key => 'x->>y'",
        "key => 'data->>x'",
        "key => '$[0]'",
        "key => 'order id'",
        "key => 'order_id', ordered => false",
        "key => 'order_id', on_dead_letter => 'later'",
        "on_dead_letter => 'later'",
    ] {
        fails_with(&mut a, &format!("SELECT streams.create_subscription('bad', 'orders', {args})"), "22023");
    }
    assert!(stored_subscriptions(&mut admin).is_empty(), "nothing created");

    let keys = [("nested", "customer.id"), ("dollar", "$.customer.id"), ("k", "order_id")];
    for (name, key) in keys {
        a.batch_execute(&format!("SELECT streams.create_subscription('{name}', 'orders', after => 0, key => '{key}')"))
            .unwrap_or_else(|e| panic!("key => '{key}': {e}"));
    }
    let p = publish_orders(&mut admin, &["o1", "o2", "o1"]);

    fails_with(&mut a, "SELECT * FROM streams.poll('k', 10, lease => '1 minute')", "0A000");
    let mut m = db.connect_as(&mallory.name);
    for sql in [
        "SELECT * FROM streams.poll('k', 10)".to_owned(),
        format!("SELECT streams.ack('k', {})", p[2]),
        format!("SELECT streams.nack('k', {}, retry_after => '1 hour')", p[0]),
    ] {
        fails_with(&mut m, &sql, "42501");
    }
    let untouched = Progress { position: p[0] - 1, pending: 3, claimed: 0 };
    assert_eq!(progress(&mut admin, "k"), untouched, "nothing changed");
    assert_eq!(consume(&mut a, "k", 50), p, "alice's subscription goes on untouched");
    assert_eq!(status(&mut admin, "k", "retrying"), "0");

    // The view, as the roles see it: alice her keys, mallory nothing.
    assert_eq!(value(&mut m, "SELECT count(*) FROM streams.subscriptions"), "0", "mallory sees no subscription");
    for (name, key) in keys {
        assert_eq!(status(&mut a, name, "key"), key, "alice sees {name}'s key");
    }
}
