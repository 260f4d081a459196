//! Subscriptions' claims: consumers share work (`ordered => false`) or take
//! turns in position order, and commit their progress (`ack`) in the same
//! transaction as the work it caused, so every event takes effect exactly
//! once, also through PgBouncer in transaction pooling mode and with
//! rollbacks and a consumer terminated mid-batch. Savepoints return or keep
//! claims, PREPARE TRANSACTION is refused while they are held, and one
//! transaction holds at most 64 chunks.
#![cfg(feature = "integration")]

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::pgbouncer::{column, Pgbouncer};
use common::subscriptions::*;
use common::*;
use postgres::{Client, Config};

// --- consumers that write effects --------------------------------------------

/// `count` events of `stream`, `per_tx` per transaction, with 500 events of
/// another stream after each transaction: the events spread over many chunks
/// of 1,024 positions, so that consumers finish chunks (and fold them into
/// the position) while others poll.
fn publish_spread(c: &mut Client, stream: &str, count: usize, per_tx: usize) -> Vec<i64> {
    let mut positions = Vec::new();
    for _ in 0..count / per_tx {
        positions.extend(publish_events(c, stream, per_tx, per_tx));
        publish_events(c, "noise", 500, 500);
    }
    positions
}

/// The consumers' side effects: one row per processed event; the unique key
/// makes a second effect of an event fail.
const EFFECTS: &str = "CREATE TABLE public.effects (
    id       bigserial PRIMARY KEY,
    position bigint NOT NULL UNIQUE,
    consumer integer NOT NULL)";

/// What the consumers of a run did.
#[derive(Debug, Default)]
struct Tally {
    committed: usize,
    rolled_back: usize,
    killed: usize,
}

/// Shared between the consumer threads and the test.
#[derive(Clone)]
struct Run {
    sub: String,
    stop: Arc<AtomicBool>,
    /// The victim's backend was terminated in the middle of a batch.
    killed: Arc<AtomicBool>,
    /// Anything unexpected a consumer saw (a double effect, an error).
    problems: Arc<Mutex<Vec<String>>>,
}

impl Run {
    fn new(sub: &str) -> Run {
        Run { sub: sub.into(), stop: Arc::default(), killed: Arc::default(), problems: Arc::default() }
    }

    fn problem(&self, text: String) {
        self.problems.lock().unwrap().push(text);
    }

    fn assert_no_problem(&self) {
        let problems = self.problems.lock().unwrap();
        assert!(problems.is_empty(), "consumers saw: {problems:#?}");
    }

    /// Start consumer `id` on connections from `config` (direct or through
    /// pgbouncer: it speaks the simple protocol). A victim (`killer` given)
    /// has its backend terminated (pg_terminate_backend from the direct
    /// connection `killer`) in the middle of its first batch, after writing
    /// its effects and before its ack.
    fn spawn(&self, id: i32, config: Config, killer: Option<Config>) -> std::thread::JoinHandle<Tally> {
        let run = self.clone();
        std::thread::spawn(move || run.consume(id, config, killer))
    }

    fn consume(&self, id: i32, config: Config, mut killer: Option<Config>) -> Tally {
        let mut tally = Tally::default();
        let mut c = connect_retrying(&config);
        while !self.stop.load(Ordering::SeqCst) {
            // A tenth of the batches that got events, each consumer's second
            // one first: drawn at random (and per poll, empty ones too), a run
            // of fifteen batches had no rollback at all one time in five.
            let rollback = (tally.committed + tally.rolled_back) % 10 == 1;
            let mut terminated = false;
            match self.batch(&mut c, id, rollback, killer.as_ref(), &mut terminated) {
                Ok(0) => {}
                Ok(_) if rollback => tally.rolled_back += 1,
                Ok(_) => tally.committed += 1,
                Err(_) if terminated => {
                    // Its claims went with its session; a new session goes on.
                    tally.killed += 1;
                    killer = None;
                    self.killed.store(true, Ordering::SeqCst);
                    c = connect_retrying(&config);
                }
                Err(e) => {
                    self.problem(format!("consumer {id}: {e} (SQLSTATE {})", sqlstate(&e)));
                    if c.batch_execute("ROLLBACK").is_err() {
                        return tally;
                    }
                }
            }
        }
        tally
    }

    /// BEGIN; poll up to 20; one effect per event; ack the last; COMMIT (or
    /// ROLLBACK). The number of events polled.
    fn batch(
        &self,
        c: &mut Client,
        id: i32,
        rollback: bool,
        killer: Option<&Config>,
        terminated: &mut bool,
    ) -> Result<usize, postgres::Error> {
        let sub = &self.sub;
        c.batch_execute("BEGIN")?;
        let positions: Vec<i64> = column(c, &format!("SELECT position FROM streams.poll('{sub}', 20, '100ms')"))?;
        let Some(&last) = positions.last() else {
            c.batch_execute("COMMIT")?;
            return Ok(0);
        };
        let values: Vec<String> = positions.iter().map(|p| format!("({p}, {id})")).collect();
        c.batch_execute(&format!("INSERT INTO public.effects (position, consumer) VALUES {}", values.join(", ")))?;
        if let Some(killer) = killer {
            let pid = backend_pid(c);
            let gone: bool =
                connect_retrying(killer).query_one("SELECT pg_terminate_backend($1, 10000)", &[&pid]).unwrap().get(0);
            assert!(gone, "backend {pid} did not exit");
            *terminated = true;
        }
        c.batch_execute(&format!("SELECT streams.ack('{sub}', {last})"))?;
        if *terminated {
            self.problem(format!("consumer {id}: its ack went through after its backend was terminated"));
        }
        c.batch_execute(if rollback { "ROLLBACK" } else { "COMMIT" })?;
        Ok(positions.len())
    }

    /// Wait until the subscription has nothing pending or claimed, then stop
    /// the consumers; what they did.
    fn finish(&self, owner: &mut Client, consumers: Vec<std::thread::JoinHandle<Tally>>) -> Vec<Tally> {
        wait_until("every event is processed", Duration::from_secs(180), || {
            self.assert_no_problem();
            let p = progress(owner, &self.sub);
            p.pending == 0 && p.claimed == 0
        });
        self.stop.store(true, Ordering::SeqCst);
        let tallies: Vec<Tally> = consumers.into_iter().map(|t| t.join().expect("a consumer thread")).collect();
        self.assert_no_problem();
        tallies
    }
}

/// The effects, in the order they were written: (position, consumer).
fn effects(c: &mut Client) -> Vec<(i64, i32)> {
    c.query("SELECT position, consumer FROM public.effects ORDER BY id", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

// --- competing and ordered consumers -------------------------------------------

/// Four consumers through pgbouncer share an unordered subscription while
/// events arrive; a tenth of their transactions roll back and one consumer's
/// backend is terminated in the middle of a batch. Every event has exactly
/// one effect in the end.
#[test]
fn competing_consumers_through_pgbouncer_process_every_event_exactly_once() {
    let db = TestDb::new();
    let worker = TestRole::new(&db, "worker", "");
    let mut owner = db.connect();
    owner
        .batch_execute(&format!(
            "{EFFECTS};
             SELECT streams.grant('read', 'orders', '{0}');
             GRANT SELECT, INSERT ON public.effects TO {0}; GRANT USAGE ON SEQUENCE public.effects_id_seq TO {0}",
            worker.name
        ))
        .unwrap();
    let bouncer = Pgbouncer::start();
    let mut via_bouncer = bouncer.config(&db.name);
    via_bouncer.user(&worker.name);
    connect_retrying(&via_bouncer)
        .batch_execute("SELECT streams.create_subscription('workers', 'orders', after => 0, ordered => false)")
        .unwrap();

    let mut published = publish_spread(&mut owner, "orders", 2000, 50);
    let run = Run::new("workers");
    let consumers: Vec<_> =
        (0..4).map(|id| run.spawn(id, via_bouncer.clone(), (id == 0).then(|| db.config()))).collect();
    wait_until("consumer 0 is terminated in the middle of a batch", Duration::from_secs(60), || {
        run.assert_no_problem();
        run.killed.load(Ordering::SeqCst)
    });
    published.extend(publish_spread(&mut owner, "orders", 2000, 25));
    let tallies = run.finish(&mut owner, consumers);

    let effects = effects(&mut owner);
    let positions: BTreeSet<i64> = effects.iter().map(|e| e.0).collect();
    assert_eq!(effects.len(), published.len(), "one effect per event (tallies: {tallies:?})");
    assert_eq!(positions, published.iter().copied().collect(), "none missing, none doubled");
    assert_eq!(tallies[0].killed, 1, "consumer 0 was terminated mid-batch: {tallies:?}");
    assert!(tallies.iter().map(|t| t.rolled_back).sum::<usize>() > 0, "some batches rolled back: {tallies:?}");
    let working: BTreeSet<i32> = effects.iter().map(|e| e.1).collect();
    assert!(working.len() >= 2, "the work was shared: only consumers {working:?} wrote effects");
    assert!(progress(&mut owner, "workers").position >= *published.last().unwrap(), "the position passed every event");
}

/// Three consumers of an ordered subscription take turns: the effects are
/// written in position order, each once, though a tenth of the batches roll
/// back.
fn ordered_consumers_apply_every_event_once_in_order(bouncer: Option<&Pgbouncer>) {
    let db = TestDb::new();
    let mut owner = db.connect();
    owner.batch_execute(EFFECTS).unwrap();
    owner.batch_execute("SELECT streams.create_subscription('ledger', 'orders', after => 0)").unwrap();
    let config = bouncer.map_or_else(|| db.config(), |b| b.config(&db.name));

    let mut published = publish_events(&mut owner, "orders", 150, 10);
    let run = Run::new("ledger");
    let consumers: Vec<_> = (0..3).map(|id| run.spawn(id, config.clone(), None)).collect();
    published.extend(publish_events(&mut owner, "orders", 150, 5));
    let tallies = run.finish(&mut owner, consumers);

    let written: Vec<i64> = effects(&mut owner).iter().map(|e| e.0).collect();
    assert_eq!(written, published, "effects in position order, each once (tallies: {tallies:?})");
    assert!(tallies.iter().map(|t| t.rolled_back).sum::<usize>() > 0, "some batches rolled back: {tallies:?}");
}

#[test]
fn ordered_consumers_apply_every_event_once_in_position_order() {
    ordered_consumers_apply_every_event_once_in_order(None);
}

#[test]
fn ordered_consumers_through_pgbouncer_apply_every_event_once_in_position_order() {
    let bouncer = Pgbouncer::start();
    ordered_consumers_apply_every_event_once_in_order(Some(&bouncer));
}

/// While one transaction holds an ordered subscription, another poller gets
/// nothing (or waits), and continues after the holder's ack once it ends.
/// Unordered pollers get disjoint events at the same time.
#[test]
fn an_ordered_subscription_serves_one_transaction_at_a_time() {
    let db = TestDb::new();
    let mut admin = db.connect();
    admin
        .batch_execute(
            "SELECT streams.create_subscription('turns', 'orders', after => 0);
             SELECT streams.create_subscription('shared', 'orders', after => 0, ordered => false)",
        )
        .unwrap();
    // Three chunks' worth of positions (1024 each), so that unordered
    // pollers have something to share.
    let p = publish_events(&mut admin, "orders", 2100, 700);

    let (mut a, mut b) = (db.connect(), db.connect());
    a.batch_execute("BEGIN").unwrap();
    assert_eq!(poll(&mut a, "turns", 5), p[..5]);
    b.batch_execute("BEGIN").unwrap();
    assert!(poll(&mut b, "turns", 5).is_empty(), "a second transaction gets nothing while the first holds it");
    b.batch_execute("COMMIT").unwrap();
    let waiting = LongPoll::start(&db.config(), "turns", "30s", "");
    waiting.wait_until_sleeping(&mut admin);
    ack(&mut a, "turns", p[2]);
    a.batch_execute("COMMIT").unwrap();
    let (got, took) = waiting.join();
    assert_eq!(got.unwrap(), p[3..13], "the waiting poller continues after the ack");
    // Its safety-net sleep is 10 s (src/subscriptions/wait.rs): under 5 s means
    // the holder's commit woke it.
    assert!(took < Duration::from_secs(5), "woken when the holder committed, not at the end of its wait: {took:?}");

    a.batch_execute("BEGIN").unwrap();
    b.batch_execute("BEGIN").unwrap();
    let from_a = poll(&mut a, "shared", 1000);
    let from_b = poll(&mut b, "shared", 1000);
    assert!(!from_a.is_empty() && !from_b.is_empty(), "both unordered pollers got events");
    let (sa, sb): (BTreeSet<i64>, BTreeSet<i64>) = (from_a.iter().copied().collect(), from_b.iter().copied().collect());
    assert!(sa.is_disjoint(&sb), "both got {:?}", sa.intersection(&sb).collect::<Vec<_>>());
    let err = {
        let mut rr = db.connect();
        rr.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ").unwrap();
        try_poll(&mut rr, "shared", 10).unwrap_err()
    };
    assert_eq!(sqlstate(&err), "0A000", "unordered polls refuse repeatable read: {err}");
    let err = {
        let mut rr = db.connect();
        rr.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ").unwrap();
        rr.batch_execute("SELECT * FROM streams.poll('turns', 10, wait => '1s')").unwrap_err()
    };
    assert_eq!(sqlstate(&err), "0A000", "a long poll refuses repeatable read (its snapshot never changes): {err}");
}

// --- savepoints and two-phase commit ------------------------------------------------------

#[test]
fn a_rolled_back_savepoint_returns_its_claims_and_a_released_one_keeps_them() {
    let db = TestDb::new();
    let mut c = db.connect();
    let mut other = db.connect();
    c.batch_execute(
        "SELECT streams.create_subscription('sp', 'orders', after => 0);
         SELECT streams.create_subscription('sp_pool', 'orders', after => 0, ordered => false)",
    )
    .unwrap();
    let p = publish_events(&mut c, "orders", 12, 4);

    for sub in ["sp", "sp_pool"] {
        // The first claim of the transaction, in a savepoint rolled back:
        // another transaction gets those events.
        c.batch_execute("BEGIN; SAVEPOINT a").unwrap();
        assert_eq!(poll(&mut c, sub, 3), p[..3], "{sub}");
        c.batch_execute("ROLLBACK TO SAVEPOINT a").unwrap();
        assert_eq!(progress(&mut other, sub).claimed, 0, "{sub}: no claim left");
        fails_with(&mut c, &format!("SELECT streams.ack('{sub}', {})", p[2]), "22023");
        c.batch_execute("ROLLBACK").unwrap();

        c.batch_execute("BEGIN; SAVEPOINT a").unwrap();
        assert_eq!(poll(&mut c, sub, 3), p[..3], "{sub}");
        c.batch_execute("ROLLBACK TO SAVEPOINT a").unwrap();
        other.batch_execute("BEGIN").unwrap();
        assert_eq!(poll(&mut other, sub, 3), p[..3], "{sub}: another consumer gets them");
        other.batch_execute("ROLLBACK").unwrap();

        // A later claim of the same transaction, rolled back: its next poll
        // gets those events again, and an ack in a rolled-back savepoint is undone.
        assert_eq!(poll(&mut c, sub, 2), p[..2], "{sub}");
        c.batch_execute("SAVEPOINT b").unwrap();
        assert_eq!(poll(&mut c, sub, 3), p[2..5], "{sub}");
        ack(&mut c, sub, p[4]);
        c.batch_execute("ROLLBACK TO SAVEPOINT b").unwrap();
        fails_with(&mut c, &format!("SAVEPOINT c; SELECT streams.ack('{sub}', {})", p[2]), "22023");
        c.batch_execute("ROLLBACK TO SAVEPOINT c").unwrap();
        assert_eq!(poll(&mut c, sub, 3), p[2..5], "{sub}: the same events again");
        // RELEASE keeps the claims: they are the transaction's.
        c.batch_execute("SAVEPOINT d").unwrap();
        assert_eq!(poll(&mut c, sub, 2), p[5..7], "{sub}");
        c.batch_execute("RELEASE SAVEPOINT d").unwrap();
        other.batch_execute("BEGIN").unwrap();
        let elsewhere = poll(&mut other, sub, 20);
        other.batch_execute("ROLLBACK").unwrap();
        assert!(elsewhere.iter().all(|e| *e > p[6]), "{sub}: another consumer got claimed events {elsewhere:?}");
        ack(&mut c, sub, p[6]);
        c.batch_execute("COMMIT").unwrap();
        assert_eq!(progress(&mut other, sub), Progress { position: p[6], pending: 5, claimed: 0 }, "{sub}");
    }
}

#[test]
fn prepare_transaction_after_a_poll_is_refused() {
    let db = TestDb::new();
    let mut c = db.connect();
    let prepared: i32 = c.query_one("SELECT current_setting('max_prepared_transactions')::int", &[]).unwrap().get(0);
    assert!(prepared > 0, "the test cluster needs max_prepared_transactions > 0");
    c.batch_execute(
        "SELECT streams.create_subscription('twopc', 'orders', after => 0);
         SELECT streams.create_subscription('twopc_pool', 'orders', after => 0, ordered => false)",
    )
    .unwrap();
    let p = publish_events(&mut c, "orders", 4, 4);
    let gid = format!("{}_twopc", db.name);

    for sub in ["twopc", "twopc_pool"] {
        c.batch_execute("BEGIN").unwrap();
        assert_eq!(poll(&mut c, sub, 2), p[..2]);
        ack(&mut c, sub, p[1]);
        fails_with(&mut c, &format!("PREPARE TRANSACTION '{gid}'"), "0A000");
        let _ = c.batch_execute("ROLLBACK");
        let left: i64 = c.query_one("SELECT count(*) FROM pg_prepared_xacts WHERE gid = $1", &[&gid]).unwrap().get(0);
        assert_eq!(left, 0, "{sub}: nothing was prepared");
        assert_eq!(
            progress(&mut c, sub),
            Progress { position: 0, pending: 4, claimed: 0 },
            "{sub}: the ack was undone"
        );
        assert_eq!(consume(&mut db.connect(), sub, 10), p, "{sub}: the claims were returned");
    }
    // seek and drop_subscription hold the subscription's token until the
    // transaction ends: a prepared one would stall it for good, invisibly.
    for statement in ["SELECT streams.seek('twopc', after => 0)", "SELECT streams.drop_subscription('twopc_pool')"] {
        c.batch_execute("BEGIN").unwrap();
        c.batch_execute(statement).unwrap();
        fails_with(&mut c, &format!("PREPARE TRANSACTION '{gid}'"), "0A000");
        let _ = c.batch_execute("ROLLBACK");
        let left: i64 = c.query_one("SELECT count(*) FROM pg_prepared_xacts WHERE gid = $1", &[&gid]).unwrap().get(0);
        assert_eq!(left, 0, "{statement}: nothing was prepared");
    }
    // Without claims, two-phase commit works as usual.
    c.batch_execute(&format!("BEGIN; SELECT * FROM streams.poll('twopc'); PREPARE TRANSACTION '{gid}'")).unwrap();
    c.batch_execute(&format!("COMMIT PREPARED '{gid}'")).unwrap();
}

// --- the lock table ------------------------------------------------------------------

/// A transaction that polls an unordered subscription over and over without
/// committing holds a lock per chunk; the lock table is shared by every
/// session, so it stops at 64 chunks with 54000 instead of filling it.
#[test]
fn one_transaction_claims_at_most_64_chunks() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute("SELECT streams.create_subscription('sparse', 'orders', after => 0, ordered => false)").unwrap();
    let mut last = 0;
    for _ in 0..70 {
        last = publish_events(&mut c, "orders", 1, 1)[0];
        publish_events(&mut c, "noise", 1100, 1100); // the next one lands in another chunk
    }
    wait_for_horizon(&mut c, last);
    let mut consumer = db.connect();
    consumer.batch_execute("BEGIN").unwrap();
    let mut polled = 0;
    let err = loop {
        match try_poll(&mut consumer, "sparse", 1) {
            Ok(got) => {
                assert_eq!(got.len(), 1, "each poll gets the next event, in a chunk of its own");
                polled += 1;
            }
            Err(e) => break e,
        }
    };
    assert_eq!(sqlstate(&err), "54000", "{err}");
    assert_eq!(polled, 64, "64 chunks, then the limit");
    consumer.batch_execute("ROLLBACK").unwrap();
    assert_eq!(poll(&mut consumer, "sparse", 10).len(), 10, "the claims came back with the rollback");
}
