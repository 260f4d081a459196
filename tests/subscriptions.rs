//! Subscriptions: durable consumers that resume where they stopped, share
//! work (`ordered => false`) or take turns in position order, and commit
//! their progress (`ack`) in the same transaction as the work it caused, so
//! every event takes effect exactly once, also through PgBouncer in
//! transaction pooling mode.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use common::pgbouncer::{column, rows, Pgbouncer};
use common::*;
use postgres::{Client, Config};
use rand::{Rng, SeedableRng};

// --- helpers -----------------------------------------------------------------

/// Publish `count` events to `stream`, `per_tx` to a transaction, and wait
/// until they are final. Their positions, in order.
fn publish_events(c: &mut Client, stream: &str, count: usize, per_tx: usize) -> Vec<i64> {
    let mut positions = Vec::new();
    while positions.len() < count {
        let n = per_tx.min(count - positions.len()) as i32;
        let batch = c
            .query(
                "SELECT p FROM streams.publish_batch($1,
                     ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(1, $2) g)) p",
                &[&stream, &n],
            )
            .unwrap();
        positions.extend(batch.iter().map(|r| r.get::<_, i64>(0)));
    }
    wait_for_horizon(c, *positions.last().unwrap());
    positions
}

/// The positions a poll returns (the simple protocol: works through pgbouncer too).
fn try_poll(c: &mut Client, sub: &str, max: i32) -> Result<Vec<i64>, postgres::Error> {
    column(c, &format!("SELECT position FROM streams.poll('{sub}', {max})"))
}

fn poll(c: &mut Client, sub: &str, max: i32) -> Vec<i64> {
    try_poll(c, sub, max).unwrap_or_else(|e| panic!("poll of {sub}: {e}"))
}

fn try_ack(c: &mut Client, sub: &str, through: i64) -> Result<(), postgres::Error> {
    c.batch_execute(&format!("SELECT streams.ack('{sub}', {through})"))
}

fn ack(c: &mut Client, sub: &str, through: i64) {
    try_ack(c, sub, through).unwrap_or_else(|e| panic!("ack of {sub} through {through}: {e}"));
}

/// Poll (at most `max`), ack everything polled and commit: the positions.
fn consume(c: &mut Client, sub: &str, max: i32) -> Vec<i64> {
    c.batch_execute("BEGIN").unwrap();
    let got = poll(c, sub, max);
    if let Some(&last) = got.last() {
        ack(c, sub, last);
    }
    c.batch_execute("COMMIT").unwrap();
    got
}

/// A subscription's row of `streams.subscriptions`, as `c` sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Progress {
    position: i64,
    pending: i64,
    claimed: i64,
}

fn progress(c: &mut Client, sub: &str) -> Progress {
    let row = rows(c, &format!("SELECT position, pending, claimed FROM streams.subscriptions WHERE name = '{sub}'"))
        .unwrap()
        .pop()
        .unwrap_or_else(|| panic!("no row for {sub} in streams.subscriptions"));
    let num = |i: usize| row[i].as_deref().expect("not null").parse::<i64>().unwrap();
    Progress { position: num(0), pending: num(1), claimed: num(2) }
}

/// The stored state of every subscription (name, stream, ordered, position), as a superuser.
fn stored_subscriptions(c: &mut Client) -> Vec<(String, String, bool, i64)> {
    c.query("SELECT name, stream, ordered, position FROM streams.subscription_state ORDER BY name", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
}

fn subscription_id(c: &mut Client, sub: &str) -> i32 {
    c.query_one("SELECT id FROM streams.subscription_state WHERE name = $1", &[&sub]).unwrap().get(0)
}

/// `sql` fails with `state` (the statement runs alone, in its own transaction
/// unless one is open).
fn fails_with(c: &mut Client, sql: &str, state: &str) -> postgres::Error {
    match c.batch_execute(sql) {
        Ok(()) => panic!("{sql} succeeded; expected SQLSTATE {state}"),
        Err(e) => {
            assert_eq!(sqlstate(&e), state, "{sql}: {e}");
            e
        }
    }
}

fn backend_pid(c: &mut Client) -> i32 {
    column(c, "SELECT pg_backend_pid()").unwrap()[0]
}

/// Whether backend `pid` sleeps in a long poll (an extension wait event).
fn in_long_poll(admin: &mut Client, pid: i32) -> bool {
    admin
        .query_opt(
            "SELECT wait_event_type = 'Extension' FROM pg_stat_activity WHERE pid = $1 AND state = 'active'",
            &[&pid],
        )
        .unwrap()
        .is_some_and(|r| r.get::<_, Option<bool>>(0) == Some(true))
}

fn backend_exists(admin: &mut Client, pid: i32) -> bool {
    admin.query_opt("SELECT 1 FROM pg_stat_activity WHERE pid = $1", &[&pid]).unwrap().is_some()
}

/// CPU time (user + system) process `pid` used so far.
fn cpu_time(pid: i32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/<pid>/stat");
    // Fields after the parenthesised command name start with field 3 (state);
    // utime and stime are fields 14 and 15, in clock ticks.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let out = std::process::Command::new("getconf").arg("CLK_TCK").output().expect("getconf runs");
    let per_second: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(100);
    Duration::from_micros(ticks * 1_000_000 / per_second)
}

/// A long poll running in a thread of its own, in a transaction, on a
/// connection from `config`: `setup` runs in the transaction first, then
/// the poll, which the thread reports with its duration.
struct LongPoll {
    pid: i32,
    cancel: postgres::CancelToken,
    thread: std::thread::JoinHandle<(Result<Vec<i64>, postgres::Error>, Duration)>,
}

impl LongPoll {
    fn start(config: &Config, sub: &str, wait: &str, setup: &str) -> LongPoll {
        let (config, sql, setup) =
            (config.clone(), format!("SELECT position FROM streams.poll('{sub}', 10, '{wait}')"), setup.to_owned());
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            let mut c = connect_retrying(&config);
            c.batch_execute("BEGIN").unwrap();
            if !setup.is_empty() {
                c.batch_execute(&setup).unwrap();
            }
            tx.send((backend_pid(&mut c), c.cancel_token())).unwrap();
            let started = Instant::now();
            let result = column(&mut c, &sql);
            let took = started.elapsed();
            let _ = c.batch_execute("ROLLBACK");
            (result, took)
        });
        let (pid, cancel) = rx.recv_timeout(Duration::from_secs(30)).expect("the long poll's backend pid");
        LongPoll { pid, cancel, thread }
    }

    /// Wait until it sleeps in the poll.
    fn wait_until_sleeping(&self, admin: &mut Client) {
        wait_until("the poll sleeps", Duration::from_secs(20), || in_long_poll(admin, self.pid));
    }

    fn join(self) -> (Result<Vec<i64>, postgres::Error>, Duration) {
        self.thread.join().expect("the polling thread")
    }
}

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
        let mut rng = rand::rngs::StdRng::seed_from_u64(id as u64);
        let mut tally = Tally::default();
        let mut c = connect_retrying(&config);
        while !self.stop.load(Ordering::SeqCst) {
            let rollback = rng.gen_bool(0.1);
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

// --- resuming ----------------------------------------------------------------

#[test]
fn a_subscription_resumes_where_its_consumer_stopped_after_reconnecting() {
    let db = TestDb::new();
    let mut owner = db.connect();
    owner.batch_execute("SELECT streams.create_subscription('billing', 'orders', after => 0)").unwrap();
    let p = publish_events(&mut owner, "orders", 10, 3);

    let mut first = db.connect();
    assert_eq!(consume(&mut first, "billing", 4), p[..4]);
    drop(first);
    assert_eq!(progress(&mut owner, "billing").position, p[3]);

    // A consumer that polls and disconnects without committing: its events
    // come back once its session is gone.
    let mut lost = db.connect();
    let lost_pid = backend_pid(&mut lost);
    lost.batch_execute("BEGIN").unwrap();
    assert_eq!(poll(&mut lost, "billing", 3), p[4..7]);
    assert_eq!(progress(&mut owner, "billing").claimed, 3);
    drop(lost);
    wait_until("the lost session ends", Duration::from_secs(20), || !backend_exists(&mut owner, lost_pid));

    let mut again = db.connect();
    assert_eq!(consume(&mut again, "billing", 100), p[4..], "resumes after the last ack, with what was lost");
    assert_eq!(progress(&mut owner, "billing"), Progress { position: p[9], pending: 0, claimed: 0 });
    assert!(consume(&mut db.connect(), "billing", 100).is_empty(), "nothing twice");

    let later = publish_events(&mut owner, "orders", 2, 2);
    assert_eq!(consume(&mut db.connect(), "billing", 100), later);
}

/// Acks survive a crash (immediate stop) and a clean restart; claims of a
/// transaction open during the crash do not, so those events come again.
#[test]
fn a_subscription_resumes_after_a_server_restart() {
    let cluster = ScratchCluster::start(
        "subscriptions-restart",
        &["shared_preload_libraries = 'litebase_streams'", "track_commit_timestamp = on", "fsync = off"],
    );
    cluster.connect("postgres").batch_execute("CREATE DATABASE app").unwrap();
    let mut c = cluster.connect("app");
    c.batch_execute("CREATE EXTENSION litebase_streams").unwrap();
    cluster.wait_for_worker("app");
    c.batch_execute(
        "SELECT streams.create_subscription('in_order', 'orders', after => 0);
         SELECT streams.create_subscription('any_order', 'orders', after => 0, ordered => false)",
    )
    .unwrap();
    let p = publish_events(&mut c, "orders", 10, 2);
    let mut open = cluster.connect("app");
    open.batch_execute("BEGIN").unwrap();
    for sub in ["in_order", "any_order"] {
        assert_eq!(consume(&mut c, sub, 3), p[..3], "{sub}");
        assert_eq!(poll(&mut open, sub, 3), p[3..6], "{sub}: claimed by the transaction open in the crash");
    }

    cluster.restart("immediate");
    assert!(open.batch_execute("SELECT 1").is_err(), "the open transaction died with the server");
    let mut c = cluster.connect("app");
    cluster.wait_for_worker("app");
    wait_for_horizon(&mut c, p[9]);
    for sub in ["in_order", "any_order"] {
        assert_eq!(progress(&mut c, sub).position, p[2], "{sub}: the committed ack survived the crash");
        let mut tx = cluster.connect("app");
        tx.batch_execute("BEGIN").unwrap();
        assert_eq!(poll(&mut tx, sub, 100), p[3..], "{sub}: resumes after the ack, with the lost claims");
        ack(&mut tx, sub, p[6]);
        tx.batch_execute("COMMIT").unwrap();
    }

    cluster.restart("fast");
    let mut c = cluster.connect("app");
    cluster.wait_for_worker("app");
    for sub in ["in_order", "any_order"] {
        assert_eq!(consume(&mut c, sub, 100), p[7..], "{sub}: after a clean restart");
        // The horizon may have passed positions the crash took from the
        // sequence (no event has them): at or after the last event.
        let after = progress(&mut c, sub);
        assert!(after.position >= p[9] && after.pending == 0 && after.claimed == 0, "{sub}: {after:?}");
    }
}

fn seek_rewinds_to_reprocess_and_skips_ahead(ordered: bool) {
    let db = TestDb::new();
    let mut c = db.connect();
    // Five transactions of two events each.
    let p = publish_events(&mut c, "orders", 10, 2);
    let time_of_5th: String =
        c.query_one("SELECT time::text FROM streams.events WHERE position = $1", &[&p[4]]).unwrap().get(0);
    let tx_of_7th: String =
        c.query_one("SELECT tx::text FROM streams.events WHERE position = $1", &[&p[6]]).unwrap().get(0);
    c.batch_execute(&format!("SELECT streams.create_subscription('s', 'orders', after => 0, ordered => {ordered})"))
        .unwrap();
    assert_eq!(consume(&mut c, "s", 100), p);
    assert_eq!(progress(&mut c, "s").position, p[9]);

    let cases: [(String, &[i64]); 5] = [
        (format!("after => {}", p[2]), &p[3..]),
        (format!("after => {}", p[7]), &p[8..]),
        (format!("since => '{time_of_5th}'"), &p[4..]),
        (format!("from_tx => '{tx_of_7th}'"), &p[6..]),
        ("after => 0".into(), &p[..]),
    ];
    for (to, expected) in cases {
        c.batch_execute(&format!("SELECT streams.seek('s', {to})")).unwrap();
        assert_eq!(progress(&mut c, "s").pending, expected.len() as i64, "seek({to})");
        assert_eq!(consume(&mut c, "s", 100), expected, "after seek({to})");
    }
    // Rewind, then skip ahead before anything was consumed.
    c.batch_execute(&format!("SELECT streams.seek('s', after => 0); SELECT streams.seek('s', after => {})", p[8]))
        .unwrap();
    assert_eq!(consume(&mut c, "s", 100), [p[9]], "skipped ahead");

    // No argument: to the current horizon, skipping everything there is.
    c.batch_execute("SELECT streams.seek('s', after => 0); SELECT streams.seek('s')").unwrap();
    assert_eq!(progress(&mut c, "s"), Progress { position: p[9], pending: 0, claimed: 0 });
    assert!(consume(&mut c, "s", 100).is_empty(), "seek() skips to the horizon");
    let more = publish_events(&mut c, "orders", 1, 1);
    assert_eq!(consume(&mut c, "s", 100), more, "then new events only");
}

#[test]
fn seek_rewinds_to_reprocess_and_skips_ahead_in_order() {
    seek_rewinds_to_reprocess_and_skips_ahead(true);
}

#[test]
fn seek_rewinds_to_reprocess_and_skips_ahead_in_any_order() {
    seek_rewinds_to_reprocess_and_skips_ahead(false);
}

/// A rewind that runs while a consumer holds claims: once both are done,
/// every event is delivered again, also those the consumer acked after the
/// seek returned (an ordered subscription's seek waits for the holder).
fn a_rewind_reprocesses_events_a_consumer_acks_during_it(ordered: bool) {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute(&format!("SELECT streams.create_subscription('s', 'orders', after => 0, ordered => {ordered})"))
        .unwrap();
    let p = publish_events(&mut c, "orders", 10, 10);
    let mut consumer = db.connect();
    consumer.batch_execute("BEGIN").unwrap();
    assert_eq!(poll(&mut consumer, "s", 5), p[..5]);

    let mut seeker = db.connect();
    let seeker_pid = backend_pid(&mut seeker);
    let seek = std::thread::spawn(move || seeker.batch_execute("SELECT streams.seek('s', after => 0)"));
    wait_until("the seek is done or waits for the consumer", Duration::from_secs(20), || {
        seek.is_finished()
            || c.query_one("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", &[&seeker_pid])
                .unwrap()
                .get::<_, Option<bool>>(0)
                == Some(true)
    });
    ack(&mut consumer, "s", p[4]);
    consumer.batch_execute("COMMIT").unwrap();
    seek.join().unwrap().unwrap();

    assert_eq!(consume(&mut c, "s", 100), p, "seek(after => 0) returned: everything is delivered again");
}

#[test]
fn a_rewind_reprocesses_events_a_consumer_acks_during_it_in_order() {
    a_rewind_reprocesses_events_a_consumer_acks_during_it(true);
}

#[test]
fn a_rewind_reprocesses_events_a_consumer_acks_during_it_in_any_order() {
    a_rewind_reprocesses_events_a_consumer_acks_during_it(false);
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

// --- long polls ------------------------------------------------------------------

fn long_poll_returns_an_event_published_while_it_waits(config: &Config, db: &TestDb) {
    let mut admin = db.connect();
    admin.batch_execute("SELECT streams.create_subscription('waiting', 'orders')").unwrap();
    publish_events(&mut admin, "other", 1, 1); // not for it: it keeps waiting
    let poller = LongPoll::start(config, "waiting", "10s", "");
    poller.wait_until_sleeping(&mut admin);
    let published_at = Instant::now();
    let position = publish(&mut admin, "orders", "{}");
    let (got, _) = poller.join();
    assert_eq!(got.unwrap(), [position]);
    assert!(
        published_at.elapsed() < Duration::from_secs(5),
        "returned {:?} after the publish: woken, not at the end of its wait",
        published_at.elapsed()
    );
}

#[test]
fn a_long_poll_returns_an_event_published_while_it_waits() {
    let db = TestDb::new();
    long_poll_returns_an_event_published_while_it_waits(&db.config(), &db);
}

#[test]
fn a_long_poll_through_pgbouncer_returns_an_event_published_while_it_waits() {
    let db = TestDb::new();
    let bouncer = Pgbouncer::start();
    long_poll_returns_an_event_published_while_it_waits(&bouncer.config(&db.name), &db);
}

#[test]
fn a_long_poll_costs_no_cpu_while_it_waits() {
    let db = TestDb::new();
    let bouncer = Pgbouncer::start();
    let mut admin = db.connect();
    admin.batch_execute("SELECT streams.create_subscription('idle', 'orders')").unwrap();
    let poller = LongPoll::start(&bouncer.config(&db.name), "idle", "8s", "");
    poller.wait_until_sleeping(&mut admin);
    let pid = poller.pid;
    let (cpu_before, started) = (cpu_time(pid), Instant::now());
    let (got, took) = poller.join();
    let waited = started.elapsed();
    assert!(got.unwrap().is_empty());
    // Most of the wait is measured (a loaded machine may take a moment to get here).
    assert!(took >= Duration::from_secs(8) && waited >= Duration::from_secs(4), "it waited: {took:?}, {waited:?}");
    let used = cpu_time(pid) - cpu_before;
    assert!(used < Duration::from_millis(200), "{used:?} of CPU in a {waited:?} wait");
}

/// statement_timeout, pg_cancel_backend, the client's cancel request and
/// pg_terminate_backend end a long poll at once, directly and through pgbouncer.
#[test]
fn a_long_poll_ends_at_once_on_timeout_cancel_or_terminate() {
    let db = TestDb::new();
    let bouncer = Pgbouncer::start();
    let mut admin = db.connect();
    admin.batch_execute("SELECT streams.create_subscription('interrupted', 'orders')").unwrap();
    for (via, config) in [("direct", db.config()), ("pgbouncer", bouncer.config(&db.name))] {
        let poller = LongPoll::start(&config, "interrupted", "30s", "SET LOCAL statement_timeout = '300ms'");
        let (got, took) = poller.join();
        let err = got.expect_err("statement_timeout ends the poll");
        assert_eq!(sqlstate(&err), "57014", "{via}: {err}");
        assert!(took < Duration::from_secs(5), "{via}: statement_timeout ended it after {took:?}");

        let poller = LongPoll::start(&config, "interrupted", "30s", "");
        poller.wait_until_sleeping(&mut admin);
        admin.execute("SELECT pg_cancel_backend($1)", &[&poller.pid]).unwrap();
        let (got, took) = poller.join();
        let err = got.expect_err("a cancel ends the poll");
        assert_eq!(sqlstate(&err), "57014", "{via}: {err}");
        assert!(took < Duration::from_secs(10), "{via}: the cancel ended it after {took:?}");

        // The client's own cancel request. Not through pgbouncer: tokio-postgres
        // closes the cancel connection right after writing the request, and
        // pgbouncer 1.18 then drops it ("client unexpected eof"), for any
        // query (libpq waits for the close and gets through).
        if via == "direct" {
            let poller = LongPoll::start(&config, "interrupted", "30s", "");
            poller.wait_until_sleeping(&mut admin);
            poller.cancel.cancel_query(postgres::NoTls).unwrap();
            let (got, took) = poller.join();
            let err =
                got.map(|events| panic!("{via}: the cancel request did not end the poll ({events:?})")).unwrap_err();
            assert_eq!(sqlstate(&err), "57014", "{via}: {err}");
            assert!(took < Duration::from_secs(10), "{via}: the client's cancel ended it after {took:?}");
        }

        let poller = LongPoll::start(&config, "interrupted", "30s", "");
        poller.wait_until_sleeping(&mut admin);
        let gone: bool = admin.query_one("SELECT pg_terminate_backend($1, 10000)", &[&poller.pid]).unwrap().get(0);
        assert!(gone, "{via}: the polling backend exits when terminated");
        let (got, took) = poller.join();
        assert!(got.is_err(), "{via}: the client learns its poll died");
        assert!(took < Duration::from_secs(10), "{via}: terminate ended it after {took:?}");
    }
    // The subscription still works.
    let p = publish(&mut admin, "orders", "{}");
    wait_for_horizon(&mut admin, p);
    assert_eq!(consume(&mut admin, "interrupted", 10), [p]);
}

#[test]
fn a_fast_shutdown_is_not_held_up_by_a_long_poll() {
    let cluster = ScratchCluster::start(
        "subscriptions-shutdown",
        &["shared_preload_libraries = 'litebase_streams'", "track_commit_timestamp = on", "fsync = off"],
    );
    cluster.connect("postgres").batch_execute("CREATE DATABASE app").unwrap();
    let mut admin = cluster.connect("app");
    admin
        .batch_execute("CREATE EXTENSION litebase_streams; SELECT streams.create_subscription('s', 'orders')")
        .unwrap();
    cluster.wait_for_worker("app");
    let poller = LongPoll::start(&cluster.config("app"), "s", "60s", "");
    poller.wait_until_sleeping(&mut admin);
    drop(admin);

    let started = Instant::now();
    cluster.pg_ctl(&["-m", "fast", "stop"]);
    let stopped_in = started.elapsed();
    let (got, _) = poller.join();
    assert!(got.is_err(), "the polling client gets an error when the server shuts down");
    assert!(stopped_in < Duration::from_secs(30), "the fast shutdown took {stopped_in:?}");
}

// --- streams and privileges ------------------------------------------------------

#[test]
fn a_prefix_subscription_returns_only_its_streams() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute(
        "SELECT streams.create_subscription('payments', 'payment.*', after => 0);
         SELECT streams.create_subscription('payments_any_order', 'payment.*', after => 0, ordered => false);
         SELECT streams.create_subscription('just_orders', 'orders', after => 0);
         SELECT streams.create_subscription('everything', after => 0)",
    )
    .unwrap();
    let mut expected = Vec::new();
    let mut all = Vec::new();
    for round in 0..3 {
        for stream in ["payment.success", "orders", "payment", "paymentx", "payment.failed", "payment.eu.card", "pay"] {
            let position = publish(&mut c, stream, &format!(r#"{{"round":{round}}}"#));
            all.push(position);
            if stream.starts_with("payment.") {
                expected.push(position);
            }
        }
    }
    wait_for_horizon(&mut c, *all.last().unwrap());
    for sub in ["payments", "payments_any_order"] {
        assert_eq!(progress(&mut c, sub).pending, expected.len() as i64, "{sub}");
        c.batch_execute("BEGIN").unwrap();
        let got: Vec<(i64, String)> =
            rows(&mut c, &format!("SELECT position, stream FROM streams.poll('{sub}', 1000)"))
                .unwrap()
                .into_iter()
                .map(|r| (r[0].as_deref().unwrap().parse().unwrap(), r[1].clone().unwrap()))
                .collect();
        assert!(got.iter().all(|(_, s)| s.starts_with("payment.")), "{sub} returned {got:?}");
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), expected, "{sub}");
        ack(&mut c, sub, *expected.last().unwrap());
        c.batch_execute("COMMIT").unwrap();
        assert_eq!(progress(&mut c, sub).pending, 0, "{sub}: other streams are not pending");
    }
    let orders: Vec<i64> = all.iter().copied().skip(1).step_by(7).collect();
    assert_eq!(consume(&mut c, "just_orders", 1000), orders);
    assert_eq!(consume(&mut c, "everything", 1000), all);
}

#[test]
fn a_subscription_needs_read_on_every_stream_of_its_pattern() {
    let db = TestDb::new();
    let (orders_reader, success_reader, payments_reader) = (
        TestRole::new(&db, "orders_reader", ""),
        TestRole::new(&db, "success_reader", ""),
        TestRole::new(&db, "payments_reader", ""),
    );
    let mut owner = db.connect();
    owner
        .batch_execute(&format!(
            "SELECT streams.grant('read', 'orders', '{0}');
             SELECT streams.grant('read', 'payment.success', '{1}');
             SELECT streams.grant('read', 'payment.*', '{2}'), streams.grant('read', 'orders', '{2}')",
            orders_reader.name, success_reader.name, payments_reader.name
        ))
        .unwrap();
    let p = publish_events(&mut owner, "payment.success", 3, 3);

    let mut o = db.connect_as(&orders_reader.name);
    fails_with(&mut o, "SELECT streams.create_subscription('o_pay', 'payment.*')", "42501");
    fails_with(&mut o, "SELECT streams.create_subscription('o_all', '*')", "42501");
    fails_with(&mut o, "SELECT streams._create_subscription('o_direct', 'payment.*', 0, true)", "42501");
    o.batch_execute("SELECT streams.create_subscription('o_orders', 'orders')").unwrap();

    let mut s = db.connect_as(&success_reader.name);
    let err = fails_with(&mut s, "SELECT streams.create_subscription('s_pay', 'payment.*')", "42501");
    let message = err.as_db_error().map(|e| e.message().to_owned()).unwrap_or_default();
    assert!(message.contains("payment.*"), "names the pattern: {message}");
    s.batch_execute("SELECT streams.create_subscription('s_success', 'payment.success', after => 0)").unwrap();
    assert_eq!(consume(&mut s, "s_success", 10), p);
    let names: Vec<String> = stored_subscriptions(&mut owner).into_iter().map(|s| s.0).collect();
    assert_eq!(names, ["o_orders", "s_success"], "the refused ones were not created");

    // A revoke applies to a subscription that exists.
    let mut r = db.connect_as(&payments_reader.name);
    r.batch_execute("SELECT streams.create_subscription('r_pay', 'payment.*', after => 0)").unwrap();
    owner.query_one("SELECT streams.revoke('read', 'payment.*', $1::text::regrole)", &[&payments_reader.name]).unwrap();
    r.batch_execute("BEGIN").unwrap();
    let err = try_poll(&mut r, "r_pay", 10).unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "{err}");
    r.batch_execute("ROLLBACK").unwrap();
    assert_eq!(progress(&mut owner, "r_pay"), Progress { position: 0, pending: 3, claimed: 0 });
    owner.batch_execute(&format!("SELECT streams.grant('read', 'payment.*', '{}')", payments_reader.name)).unwrap();
    assert_eq!(consume(&mut r, "r_pay", 10), p, "granted again, it goes on");
}

// --- bad input ---------------------------------------------------------------------

#[test]
fn bad_arguments_fail_with_their_sqlstate_and_change_nothing() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute("SELECT streams.create_subscription('s', 'orders', after => 0)").unwrap();
    let p = publish_events(&mut c, "orders", 5, 5);
    let before = stored_subscriptions(&mut c);

    for (sql, state) in [
        ("SELECT * FROM streams.poll('nope')", "42704"),
        ("SELECT streams.ack('nope', 1)", "42704"),
        ("SELECT streams.seek('nope', after => 0)", "42704"),
        ("SELECT streams.create_subscription('s')", "42710"),
        ("SELECT streams.create_subscription('s', 'payment.*', after => 0)", "42710"),
        ("SELECT streams.create_subscription('t', 'pay*ment*')", "22023"),
        ("SELECT streams.create_subscription('t', 'a b')", "22023"),
        ("SELECT streams.create_subscription('t', '')", "22023"),
        ("SELECT streams.create_subscription('bad name', 'orders')", "22023"),
        ("SELECT streams.create_subscription('', 'orders')", "22023"),
        ("SELECT streams.create_subscription('t', 'orders', after => -1)", "22023"),
        ("SELECT streams.create_subscription('t', 'orders', after => 0, since => now())", "22023"),
        ("SELECT streams.create_subscription(NULL, 'orders')", "22004"),
        ("SELECT streams.create_subscription('t', NULL)", "22004"),
        ("SELECT streams.create_subscription('t', 'orders', ordered => NULL)", "22004"),
        ("SELECT * FROM streams.poll('s', 0)", "22023"),
        ("SELECT * FROM streams.poll('s', -1)", "22023"),
        ("SELECT * FROM streams.poll('s', 10001)", "22023"),
        ("SELECT * FROM streams.poll('s', 10, '-1 second')", "22023"),
        ("SELECT * FROM streams.poll('s', 10, '-1 day 1 hour')", "22023"),
        ("SELECT * FROM streams.poll(NULL)", "22004"),
        ("SELECT * FROM streams.poll('s', NULL)", "22004"),
        ("SELECT * FROM streams.poll('s', 10, NULL)", "22004"),
        ("SELECT streams.ack('s', NULL)", "22004"),
        ("SELECT streams.ack('s', 1)", "22023"),
        ("SELECT streams.seek('s', after => -1)", "22023"),
        ("SELECT streams.seek('s', after => 1, from_tx => '1')", "22023"),
    ] {
        fails_with(&mut c, sql, state);
    }
    assert!(!c.query_one("SELECT streams.drop_subscription('nope')", &[]).unwrap().get::<_, bool>(0));
    assert_eq!(stored_subscriptions(&mut c), before, "nothing created, changed or moved");

    // An ack beyond what the transaction polled, or with nothing polled.
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(poll(&mut c, "s", 3), p[..3]);
    fails_with(&mut c, &format!("SELECT streams.ack('s', {})", p[3]), "22023");
    c.batch_execute("ROLLBACK").unwrap();
    c.batch_execute("BEGIN").unwrap();
    fails_with(&mut c, &format!("SELECT streams.ack('s', {})", p[0]), "22023");
    c.batch_execute("ROLLBACK").unwrap();
    // Polled in one transaction, acked in the next.
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(poll(&mut c, "s", 3), p[..3]);
    c.batch_execute("COMMIT; BEGIN").unwrap();
    fails_with(&mut c, &format!("SELECT streams.ack('s', {})", p[0]), "22023");
    c.batch_execute("ROLLBACK").unwrap();
    assert_eq!(stored_subscriptions(&mut c), before, "the position did not move");
    assert_eq!(progress(&mut c, "s"), Progress { position: 0, pending: 5, claimed: 0 });
    assert_eq!(consume(&mut c, "s", 10), p, "every event is still there");
}

// --- hostile roles -------------------------------------------------------------------

/// A role with read privileges of its own cannot use, see, change or stall
/// another role's subscriptions; a member of the owner can use them.
#[test]
fn another_role_cannot_use_see_or_stall_a_subscription() {
    let db = TestDb::new();
    let (alice, mallory, alices_group_member) =
        (TestRole::new(&db, "alice", ""), TestRole::new(&db, "mallory", ""), TestRole::new(&db, "alice_team", ""));
    let mut owner = db.connect();
    owner
        .batch_execute(&format!(
            "SELECT streams.grant('read', 'orders', '{0}'), streams.grant('read', '*', '{1}'),
                    streams.grant('read', 'orders', '{2}');
             GRANT {0} TO {2}",
            alice.name, mallory.name, alices_group_member.name
        ))
        .unwrap();
    let mut a = db.connect_as(&alice.name);
    a.batch_execute(
        "SELECT streams.create_subscription('alice_sub', 'orders', after => 0);
         SELECT streams.create_subscription('alice_pool', 'orders', after => 0, ordered => false)",
    )
    .unwrap();
    let p = publish_events(&mut owner, "orders", 6, 3);
    let before = stored_subscriptions(&mut owner);

    let mut m = db.connect_as(&mallory.name);
    for sql in [
        "SELECT * FROM streams.poll('alice_sub')",
        "SELECT * FROM streams.poll('alice_pool')",
        "SELECT streams.ack('alice_sub', 1)",
        "SELECT streams.seek('alice_sub', after => 0)",
        "SELECT streams.seek('alice_sub')",
        "SELECT streams.drop_subscription('alice_sub')",
        "SELECT * FROM streams._poll('alice_sub', 10, '0')",
        "SELECT streams._seek_subscription('alice_sub', 0)",
        "SELECT * FROM streams.subscription_state",
        "SELECT * FROM streams.subscription_progress",
        "UPDATE streams.subscription_state SET position = 0",
        "DELETE FROM streams.subscription_state",
        "INSERT INTO streams.subscription_progress VALUES (1, 0, 1000000, now())",
        "SELECT nextval('streams.subscription_ids')",
    ] {
        fails_with(&mut m, sql, "42501");
    }
    let visible: i64 = m.query_one("SELECT count(*) FROM streams.subscriptions", &[]).unwrap().get(0);
    assert_eq!(visible, 0, "mallory sees no row of alice's subscriptions");
    assert_eq!(stored_subscriptions(&mut owner), before, "nothing changed");

    // Every advisory lock mallory can take on keys derived from the
    // subscriptions' ids, session- and transaction-level, exclusive and shared.
    let ids = [subscription_id(&mut owner, "alice_sub"), subscription_id(&mut owner, "alice_pool")];
    let db_oid: i64 =
        owner.query_one("SELECT oid::bigint FROM pg_database WHERE datname = current_database()", &[]).unwrap().get(0);
    m.batch_execute("BEGIN").unwrap();
    for id in ids {
        let id = id as i64;
        let mut keys =
            vec![format!("{id}"), format!("{db_oid}"), format!("{}", ((db_oid as u64) << 32 | id as u64) as i64)];
        for k in 0..4i64 {
            keys.push(format!("{id}, {k}"));
            keys.push(format!("{k}, {id}"));
            keys.push(format!("{}", (id << 32) | k));
            keys.push(format!("{}", (k << 32) | id));
        }
        keys.push(format!("{}, {id}", db_oid as i32));
        keys.push(format!("{id}, {}", 0x4C42));
        keys.push(format!("{id}, {}", 0x4C43));
        for key in keys {
            m.batch_execute(&format!(
                "SELECT pg_advisory_lock({key}), pg_advisory_xact_lock_shared({key});
                 SELECT pg_try_advisory_xact_lock({key})"
            ))
            .unwrap_or_else(|e| panic!("mallory locks ({key}): {e}"));
        }
    }

    let alice_pid = backend_pid(&mut a);
    a.batch_execute("BEGIN").unwrap();
    assert_eq!(poll(&mut a, "alice_sub", 2), p[..2], "alice polls while mallory holds the locks");
    assert_eq!(poll(&mut a, "alice_pool", 2), p[..2], "also the unordered one");
    let claims: Vec<(i64, i64, i32)> = owner
        .query(
            "SELECT classid::bigint, objid::bigint, objsubid::int FROM pg_locks
             WHERE locktype = 'advisory' AND pid = $1 AND granted ORDER BY objsubid, classid",
            &[&alice_pid],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        claims,
        [(ids[0] as i64, 0, 19522), (ids[1] as i64, 0, 19522), (ids[1] as i64, 0, 19523)],
        "pg_locks shows alice's claims: each subscription's token, and the unordered one's chunk"
    );
    ack(&mut a, "alice_sub", p[1]);
    ack(&mut a, "alice_pool", p[1]);
    a.batch_execute("COMMIT").unwrap();
    m.batch_execute("COMMIT; SELECT pg_advisory_unlock_all()").unwrap();
    assert_eq!(progress(&mut a, "alice_sub").position, p[1]);

    // A member of alice's role uses it as alice does.
    let mut team = db.connect_as(&alices_group_member.name);
    assert_eq!(consume(&mut team, "alice_sub", 10), p[2..]);
    let visible: i64 = team.query_one("SELECT count(*) FROM streams.subscriptions", &[]).unwrap().get(0);
    assert_eq!(visible, 2);
    assert!(team.query_one("SELECT streams.drop_subscription('alice_sub')", &[]).unwrap().get::<_, bool>(0));
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

/// A caller's temporary schema is searched first for types: a role that
/// plants `pg_temp.oid`, `pg_temp.int8`, ... (domains whose check runs its
/// own function) must never get that function run as the extension's owner
/// by any subscription function or the view, which act as the owner inside.
#[test]
fn types_planted_in_pg_temp_never_run_as_the_extension_owner() {
    let db = TestDb::new();
    let mallory = TestRole::new(&db, "mallory", "");
    let mut owner = db.connect();
    owner.batch_execute(&format!("SELECT streams.grant('read', 'pub.*', '{}')", mallory.name)).unwrap();
    let p = publish_events(&mut owner, "pub.a", 3, 1);
    let mut m = db.connect_as(&mallory.name);
    let mut plant = format!(
        "CREATE FUNCTION pg_temp.evil(anyelement) RETURNS boolean LANGUAGE plpgsql AS $$
         BEGIN
             IF current_user <> '{0}' THEN
                 RAISE EXCEPTION 'escalated: ran as %', current_user;
             END IF;
             RETURN true;
         END $$;",
        mallory.name
    );
    for ty in ["oid", "int2", "int4", "int8", "text", "bool", "regrole", "timestamptz", "interval", "name", "xid8"] {
        plant.push_str(&format!("CREATE DOMAIN pg_temp.{ty} AS pg_catalog.{ty} CHECK (pg_temp.evil(VALUE));"));
    }
    m.batch_execute(&plant).unwrap();
    let second = p[1];
    let flow = [
        "SELECT streams.create_subscription('m_ordered', 'pub.*', after => 0)".to_owned(),
        "SELECT streams.create_subscription('m_pool', 'pub.*', after => 0, ordered => false)".to_owned(),
        "BEGIN".to_owned(),
        "SELECT * FROM streams.poll('m_ordered', 2)".to_owned(),
        "SELECT * FROM streams.poll('m_pool', 2)".to_owned(),
        "SELECT * FROM streams.subscriptions".to_owned(),
        "SELECT * FROM streams._claims()".to_owned(),
        format!("SELECT streams.ack('m_ordered', {second})"),
        format!("SELECT streams.ack('m_pool', {second})"),
        "COMMIT".to_owned(),
        "SELECT streams.seek('m_pool', after => 0)".to_owned(),
        format!("SELECT streams.wait({second}, '1s')"),
        "SELECT streams.drop_subscription('m_pool')".to_owned(),
    ];
    for sql in flow {
        m.batch_execute(&sql).unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    }

    // A cheap function of mallory's in a query on the view never sees a row
    // of another role's subscription (the view is a security barrier).
    owner.batch_execute("SELECT streams.create_subscription('owners_secret', 'pub.*')").unwrap();
    m.batch_execute(
        "CREATE TEMP TABLE seen (name text);
         CREATE FUNCTION pg_temp.leak(text) RETURNS boolean LANGUAGE plpgsql COST 0.0000001 AS $$
         BEGIN INSERT INTO pg_temp.seen VALUES ($1); RETURN true; END $$;
         SELECT count(*) FROM streams.subscriptions WHERE pg_temp.leak(name)",
    )
    .unwrap();
    let seen: Vec<String> =
        m.query("SELECT name FROM pg_temp.seen ORDER BY 1", &[]).unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(seen, ["m_ordered"], "mallory's function saw only mallory's subscriptions");
}

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
