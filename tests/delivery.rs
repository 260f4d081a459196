//! Live delivery: what LISTENers receive after publishing transactions end,
//! under concurrency, worker restarts, new and dropped databases, and the
//! reconnect-and-catch-up pattern.
//!
//! Every test uses its own database (common::TestDb), so tests running in
//! parallel never see each other's events.
#![cfg(feature = "integration")]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::{admin, horizon, json, publish, wait_for_horizon, Listener, TestDb, PAYMENT};
use postgres::{Client, NoTls};
use rand::Rng;
use serde_json::Value;

/// A received notification, its payload parsed.
#[derive(Debug, Clone)]
struct Delivered {
    channel: String,
    raw: String,
    json: Value,
    position: i64,
}

impl Delivered {
    fn parse(channel: String, raw: String) -> Delivered {
        let json: Value = serde_json::from_str(&raw).unwrap_or_else(|e| panic!("payload is not JSON ({e}): {raw}"));
        let position = json["position"].as_i64().unwrap_or_else(|| panic!("payload has no integer position: {raw}"));
        Delivered { channel, raw, json, position }
    }

    fn stream(&self) -> &str {
        self.json["stream"].as_str().unwrap_or_else(|| panic!("payload has no stream: {}", self.raw))
    }
}

fn next_delivered(listener: &mut Listener, timeout: Duration) -> Option<Delivered> {
    listener.next(timeout).map(|(channel, raw)| Delivered::parse(channel, raw))
}

/// Receive notifications until every position of `expected` (once it is set)
/// has arrived, then keep listening for `linger` to catch extras and
/// duplicates; give up after `silence` without any notification.
fn follow(
    mut listener: Listener,
    expected: Arc<Mutex<Option<BTreeSet<i64>>>>,
    silence: Duration,
    linger: Duration,
) -> Vec<Delivered> {
    let mut got = Vec::new();
    let mut seen = BTreeSet::new();
    let mut last_arrival = Instant::now();
    let mut complete_since: Option<Instant> = None;
    loop {
        if complete_since.is_none() {
            if let Some(expected) = expected.lock().unwrap().as_ref() {
                if expected.is_subset(&seen) {
                    complete_since = Some(Instant::now());
                }
            }
        }
        if let Some(since) = complete_since {
            if since.elapsed() >= linger {
                return got;
            }
        }
        match next_delivered(&mut listener, Duration::from_millis(100)) {
            Some(d) => {
                seen.insert(d.position);
                got.push(d);
                last_arrival = Instant::now();
            }
            None if last_arrival.elapsed() >= silence => return got,
            None => {}
        }
    }
}

/// Received positions must be strictly increasing (which also rules out
/// duplicates) and equal the committed set exactly.
fn assert_exactly_in_order(received: &[i64], committed: &BTreeSet<i64>) {
    let dupes: Vec<i64> = {
        let mut counts = BTreeMap::new();
        for p in received {
            *counts.entry(*p).or_insert(0usize) += 1;
        }
        counts.into_iter().filter(|(_, n)| *n > 1).map(|(p, _)| p).collect()
    };
    assert!(dupes.is_empty(), "positions delivered more than once: {dupes:?}");
    let out_of_order: Vec<(i64, i64)> = received.windows(2).filter(|w| w[0] >= w[1]).map(|w| (w[0], w[1])).collect();
    assert!(out_of_order.is_empty(), "positions out of order (earlier, later): {out_of_order:?}");
    let received_set: BTreeSet<i64> = received.iter().copied().collect();
    let missing: Vec<i64> = committed.difference(&received_set).copied().collect();
    let extra: Vec<i64> = received_set.difference(committed).copied().collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "delivered set differs from the committed set: {} missing {:?}, {} never committed {:?} \
         ({} committed, {} received)",
        missing.len(),
        &missing[..missing.len().min(20)],
        extra.len(),
        &extra[..extra.len().min(20)],
        committed.len(),
        received.len()
    );
}

/// An event as `streams.get` returns it, with time and tx formatted as the
/// payload carries them.
#[derive(Debug)]
struct Stored {
    position: i64,
    stream: String,
    tx: i64,
    time: String,
    data: String,
}

fn get_event(client: &mut Client, position: i64) -> Stored {
    let row = client
        .query_one(
            r#"SELECT position, stream, tx::text::bigint,
                      to_char(time AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                      data::text
               FROM streams.get($1)"#,
            &[&position],
        )
        .expect("streams.get");
    let position_found: Option<i64> = row.get(0);
    assert_eq!(position_found, Some(position), "streams.get({position}) returned no event");
    Stored { position, stream: row.get(1), tx: row.get(2), time: row.get(3), data: row.get(4) }
}

fn keys(value: &Value) -> BTreeSet<String> {
    value.as_object().expect("payload is a JSON object").keys().cloned().collect()
}

fn set(keys: &[&str]) -> BTreeSet<String> {
    keys.iter().map(|k| k.to_string()).collect()
}

/// Each payload names the previous event of its stream (`prev`), across
/// streams interleaved on the timeline and across a worker restart, so a
/// listener that saw another last position on a stream knows it missed one.
#[test]
fn each_payload_names_the_previous_event_of_its_stream() {
    let db = TestDb::new();
    let mut listener = Listener::new(&db, &["a", "b"]);
    let mut c = db.connect();
    let a1 = publish(&mut c, "a", "{}");
    let b1 = publish(&mut c, "b", "{}");
    let a2 = publish(&mut c, "a", "{}");
    let prevs = |listener: &mut Listener, n: usize| -> Vec<(i64, i64)> {
        listener
            .collect(n, Duration::from_secs(10))
            .iter()
            .map(|e| (e["position"].as_i64().unwrap(), e["prev"].as_i64().unwrap()))
            .collect()
    };
    assert_eq!(prevs(&mut listener, 3), vec![(a1, 0), (b1, 0), (a2, a1)]);

    let worker = db.wait_for_worker();
    admin().execute("SELECT pg_terminate_backend($1)", &[&worker]).unwrap();
    common::wait_until("a new worker", Duration::from_secs(20), || db.wait_for_worker() != worker);
    let b2 = publish(&mut c, "b", "{}");
    let a3 = publish(&mut c, "a", "{}");
    assert_eq!(prevs(&mut listener, 2), vec![(b2, b1), (a3, a2)], "after a restart, from the log");
}

#[test]
fn commit_delivers_the_exact_payload() {
    let db = TestDb::new();
    let mut listener = Listener::new(&db, &["payment.success"]);
    let mut client = db.connect();

    let position = publish(&mut client, "payment.success", PAYMENT); // autocommit

    let (channel, raw) = listener.next(Duration::from_secs(10)).expect("no notification within 10 s of the commit");
    assert_eq!(channel, "payment.success");
    let payload = json(&raw);
    let stored = get_event(&mut client, position);

    assert_eq!(keys(&payload), set(&["position", "stream", "time", "tx", "prev", "data"]), "payload: {raw}");
    assert_eq!(payload["prev"].as_i64(), Some(0), "the stream's first event: {raw}");
    assert_eq!(payload["position"].as_i64(), Some(stored.position), "payload: {raw}");
    assert_eq!(payload["stream"].as_str(), Some(stored.stream.as_str()), "payload: {raw}");
    assert_eq!(stored.stream, "payment.success");
    assert_eq!(payload["tx"].as_i64(), Some(stored.tx), "payload: {raw}");
    assert_eq!(payload["time"].as_str(), Some(stored.time.as_str()), "payload: {raw}");
    assert_eq!(payload["data"], json(&stored.data), "payload: {raw}");
    assert_eq!(payload["data"], json(PAYMENT), "payload: {raw}");
    // Numbers keep their exact text: 49.00, not 49.0 or 49.
    assert!(raw.contains(r#""amount":49.00"#), "payload does not carry \"amount\":49.00 verbatim: {raw}");
    // Compact JSON: no whitespace outside strings.
    assert!(!raw.contains(": ") && !raw.contains(", "), "payload is not compact: {raw}");

    assert!(listener.next(Duration::from_millis(500)).is_none(), "a second notification arrived for a single event");
}

#[test]
fn rollback_delivers_nothing() {
    let db = TestDb::new();
    let mut listener = Listener::new(&db, &["payment.success", "payment.marker"]);
    let mut client = db.connect();

    let rolled_back = {
        let mut tx = client.transaction().unwrap();
        let a: i64 =
            tx.query_one("SELECT streams.publish('payment.success', $1::text::jsonb)", &[&PAYMENT]).unwrap().get(0);
        let b: i64 =
            tx.query_one("SELECT streams.publish('payment.marker', '{\"rolled_back\":true}')", &[]).unwrap().get(0);
        tx.rollback().unwrap();
        [a, b]
    };
    let marker = publish(&mut client, "payment.marker", r#"{"marker":true}"#);
    assert!(marker > rolled_back[1], "positions are handed out in order");

    let first =
        next_delivered(&mut listener, Duration::from_secs(10)).expect("the marker was not delivered within 10 s");
    assert_eq!(first.position, marker, "first notification is not the marker: {}", first.raw);
    assert_eq!(first.channel, "payment.marker");
    assert_eq!(first.json["data"], json(r#"{"marker":true}"#));
    if let Some(extra) = next_delivered(&mut listener, Duration::from_millis(500)) {
        panic!("unexpected notification after the marker: {}", extra.raw);
    }
    for p in rolled_back {
        let gone: bool = client.query_one("SELECT streams.get($1) IS NULL", &[&p]).unwrap().get(0);
        assert!(gone, "rolled-back position {p} is visible through streams.get");
    }
    let visible: i64 = client
        .query_one("SELECT count(*) FROM streams.events WHERE position = ANY($1)", &[&rolled_back.to_vec()])
        .unwrap()
        .get(0);
    assert_eq!(visible, 0, "rolled-back events are visible in streams.events");
}

#[test]
fn large_event_arrives_truncated_and_get_returns_it_whole() {
    let db = TestDb::new();
    let mut listener = Listener::new(&db, &["files.uploaded"]);
    let mut client = db.connect();

    let blob: String = (0..20_000).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
    let data = format!(r#"{{"name":"report.pdf","size":20000,"blob":"{blob}","tags":["x", "y"]}}"#);
    assert!(data.len() > 20_000);
    let position = publish(&mut client, "files.uploaded", &data);

    let d =
        next_delivered(&mut listener, Duration::from_secs(10)).expect("the large event was not delivered within 10 s");
    assert_eq!(d.position, position);
    assert_eq!(d.channel, "files.uploaded");
    assert!(d.raw.len() <= 7999, "payload is {} bytes, over the 7999-byte limit", d.raw.len());
    assert_eq!(d.json["truncated"], Value::Bool(true), "payload: {}", d.raw);
    assert!(d.json.get("data").is_none(), "truncated payload still has data: {}", d.raw);
    assert_eq!(keys(&d.json), set(&["position", "stream", "time", "tx", "prev", "truncated"]), "payload: {}", d.raw);

    let stored = get_event(&mut client, position);
    assert_eq!(d.json["stream"].as_str(), Some("files.uploaded"));
    assert_eq!(d.json["tx"].as_i64(), Some(stored.tx));
    assert_eq!(d.json["time"].as_str(), Some(stored.time.as_str()));
    let full = json(&stored.data);
    assert_eq!(full, json(&data), "streams.get does not return the published data");
    assert_eq!(full["blob"].as_str().map(str::len), Some(20_000));
    assert_eq!(full["blob"].as_str(), Some(blob.as_str()));
}

#[test]
fn concurrent_writers_deliver_exactly_the_committed_set_in_order() {
    const WRITERS: usize = 6;
    const RUN_FOR: Duration = Duration::from_secs(4);
    let db = TestDb::new();
    let expected = Arc::new(Mutex::new(None));
    let listener = Listener::new(&db, &["stress.a", "stress.b"]);
    let follower = {
        let expected = Arc::clone(&expected);
        thread::spawn(move || follow(listener, expected, Duration::from_secs(10), Duration::from_millis(500)))
    };

    let end = Instant::now() + RUN_FOR;
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let config = db.config();
            thread::spawn(move || {
                let mut client = config.connect(NoTls).expect("writer connects");
                let mut rng = rand::thread_rng();
                let (mut committed, mut rolled_back) = (Vec::new(), Vec::new());
                let mut seq = 0u64;
                while Instant::now() < end {
                    let mut tx = client.transaction().unwrap();
                    let mut batch: Vec<(i64, &'static str, String)> = Vec::new();
                    for _ in 0..rng.gen_range(1..=3) {
                        let stream = if rng.gen_bool(0.5) { "stress.a" } else { "stress.b" };
                        let data = format!(r#"{{"writer":{w},"seq":{seq}}}"#);
                        seq += 1;
                        let position: i64 = tx
                            .query_one("SELECT streams.publish($1, $2::text::jsonb)", &[&stream, &data])
                            .unwrap()
                            .get(0);
                        if let Some((last, _, _)) = batch.last() {
                            assert!(position > *last, "positions within a transaction increase");
                        }
                        batch.push((position, stream, data));
                    }
                    thread::sleep(Duration::from_millis(rng.gen_range(0..=5)));
                    if rng.gen_bool(0.2) {
                        tx.rollback().unwrap();
                        rolled_back.extend(batch.into_iter().map(|(p, _, _)| p));
                    } else {
                        tx.commit().unwrap();
                        committed.extend(batch);
                    }
                }
                (committed, rolled_back)
            })
        })
        .collect();

    let mut committed: BTreeMap<i64, (&'static str, String)> = BTreeMap::new();
    let mut rolled_back = 0usize;
    for writer in writers {
        let (c, r) = writer.join().expect("writer thread");
        rolled_back += r.len();
        committed.extend(c.into_iter().map(|(p, s, d)| (p, (s, d))));
    }
    let committed_set: BTreeSet<i64> = committed.keys().copied().collect();
    *expected.lock().unwrap() = Some(committed_set.clone());
    let delivered = follower.join().expect("listener thread");

    assert!(committed.len() >= 100, "only {} events committed: the load is too light to mean much", committed.len());
    assert!(rolled_back > 0, "no transaction rolled back");
    let positions: Vec<i64> = delivered.iter().map(|d| d.position).collect();
    assert_exactly_in_order(&positions, &committed_set);
    for d in &delivered {
        let (stream, data) = &committed[&d.position];
        assert_eq!(d.channel, *stream, "channel of position {}", d.position);
        assert_eq!(d.stream(), *stream, "stream of position {}", d.position);
        assert_eq!(d.json["data"], json(data), "data of position {}", d.position);
    }
    eprintln!("{} events committed, {} rolled back, {} delivered", committed.len(), rolled_back, delivered.len());
}

/// Poll pg_stat_activity until this database's worker has a pid other than `old`.
fn wait_for_new_worker(db: &TestDb, old: i32) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pid = db.wait_for_worker();
        if pid != old {
            return pid;
        }
        assert!(Instant::now() < deadline, "the worker (pid {old}) was not replaced within 20 s");
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn worker_terminated_mid_stream_loses_and_repeats_nothing() {
    const KILLS: usize = 3;
    let db = TestDb::new();
    let expected = Arc::new(Mutex::new(None));
    let listener = Listener::new(&db, &["orders.placed"]);
    let follower = {
        let expected = Arc::clone(&expected);
        thread::spawn(move || follow(listener, expected, Duration::from_secs(10), Duration::from_millis(1000)))
    };

    let killing_done = Arc::new(AtomicBool::new(false));
    let publisher = {
        let config = db.config();
        let killing_done = Arc::clone(&killing_done);
        thread::spawn(move || {
            let mut client = config.connect(NoTls).expect("publisher connects");
            let mut rng = rand::thread_rng();
            let mut committed = Vec::new();
            // About 300 events, and in any case until the last restart is over.
            while committed.len() < 300 || !killing_done.load(Ordering::Acquire) {
                let n = committed.len();
                committed.push(publish(&mut client, "orders.placed", &format!(r#"{{"n":{n}}}"#)));
                thread::sleep(Duration::from_millis(rng.gen_range(2..=15)));
            }
            committed
        })
    };

    let mut control = db.connect();
    let mut pid = db.wait_for_worker();
    let mut pids = vec![pid];
    for _ in 0..KILLS {
        thread::sleep(Duration::from_millis(300));
        let terminated: Vec<bool> = control
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE backend_type = 'litebase_streams worker' AND datname = current_database()",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(terminated, vec![true], "expected to terminate exactly one worker (pid {pid})");
        pid = wait_for_new_worker(&db, pid);
        pids.push(pid);
    }
    killing_done.store(true, Ordering::Release);
    let committed = publisher.join().expect("publisher thread");
    let committed_set: BTreeSet<i64> = committed.iter().copied().collect();
    *expected.lock().unwrap() = Some(committed_set.clone());
    let delivered = follower.join().expect("listener thread");

    let distinct: BTreeSet<i32> = pids.iter().copied().collect();
    assert_eq!(distinct.len(), KILLS + 1, "worker pids: {pids:?}");
    let positions: Vec<i64> = delivered.iter().map(|d| d.position).collect();
    assert_exactly_in_order(&positions, &committed_set);
    for d in &delivered {
        let n = committed.iter().position(|p| *p == d.position).unwrap();
        assert_eq!(d.json["data"], json(&format!(r#"{{"n":{n}}}"#)), "data of position {}", d.position);
    }
    let h = horizon(&mut control);
    assert!(h >= *committed.last().unwrap(), "horizon {h} did not pass the last event");
    eprintln!("{} events across worker pids {pids:?}", committed.len());
}

#[test]
fn new_database_gets_delivery_without_restart() {
    let started: String = admin().query_one("SELECT pg_postmaster_start_time()::text", &[]).unwrap().get(0);
    let db = TestDb::new(); // CREATE DATABASE + CREATE EXTENSION, long after server start
    let mut listener = Listener::new(&db, &["signup.completed"]);
    let mut client = db.connect();
    let position = publish(&mut client, "signup.completed", r#"{"user":"u_1"}"#);

    let d = next_delivered(&mut listener, Duration::from_secs(10))
        .expect("no delivery within 10 s in a database created after server start");
    assert_eq!(d.position, position);
    assert_eq!(d.json["data"], json(r#"{"user":"u_1"}"#));
    let still: String = admin().query_one("SELECT pg_postmaster_start_time()::text", &[]).unwrap().get(0);
    assert_eq!(started, still, "the server restarted");
}

#[test]
fn drop_database_with_the_extension_succeeds() {
    let db = TestDb::new();
    {
        let mut client = db.connect();
        let mut listener = Listener::new(&db, &["audit.log"]);
        let position = publish(&mut client, "audit.log", r#"{"a":1}"#);
        let d = next_delivered(&mut listener, Duration::from_secs(10)).expect("worker delivers before the drop");
        assert_eq!(d.position, position);
        wait_for_horizon(&mut client, position);
    } // our connections to the database close here
    let pid = db.wait_for_worker();

    let mut admin = admin();
    admin
        .batch_execute(&format!("DROP DATABASE {}", db.name))
        .unwrap_or_else(|e| panic!("DROP DATABASE {} (worker pid {pid}) failed: {e:?}", db.name));

    let exists: bool =
        admin.query_one("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", &[&db.name]).unwrap().get(0);
    assert!(!exists, "database still listed in pg_database");
    // No worker, and none coming back (the postmaster restarts a worker 1 s after exit code 1).
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        let workers: Vec<i32> = admin
            .query(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'litebase_streams worker' \
                 AND (datname = $1 OR pid = $2)",
                &[&db.name, &pid],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert!(workers.is_empty(), "worker(s) {workers:?} still running after DROP DATABASE");
        thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn reconnect_catch_up_has_no_gap_and_no_duplicate() {
    const STREAM: &str = "orders.created";
    let db = TestDb::new();
    let mut publisher = db.connect();
    let mut committed = Vec::new();
    fn publish_n(client: &mut Client, committed: &mut Vec<i64>, n: usize) -> i64 {
        for _ in 0..n {
            let k = committed.len();
            committed.push(publish(client, STREAM, &format!(r#"{{"k":{k}}}"#)));
        }
        *committed.last().unwrap()
    }

    // A client follows the stream, then disconnects.
    let mut first = Listener::new(&db, &[STREAM]);
    publish_n(&mut publisher, &mut committed, 5);
    let seen: Vec<i64> = first.positions(5, Duration::from_secs(10));
    assert_eq!(seen, committed, "the first session did not receive the first five events");
    let p = *seen.last().unwrap();
    drop(first);

    // Published while nobody listens.
    let last = publish_n(&mut publisher, &mut committed, 5);
    wait_for_horizon(&mut publisher, last);

    // Reconnect: LISTEN first...
    let mut second = Listener::new(&db, &[STREAM]);
    // ...events that become final after LISTEN but before the replay: both
    // notified and replayed...
    let last = publish_n(&mut publisher, &mut committed, 3);
    wait_for_horizon(&mut publisher, last);
    // ...then replay after the last position seen...
    let replayed: Vec<i64> = second
        .client
        .query("SELECT position FROM streams.replay(stream => $1, after => $2)", &[&STREAM, &p])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut combined = replayed.clone();
    let mut last_seen = replayed.last().copied().unwrap_or(p);
    // ...and events published after the replay arrive only as notifications.
    publish_n(&mut publisher, &mut committed, 4);

    let expected: Vec<i64> = committed.iter().copied().filter(|q| *q > p).collect();
    let mut dropped = Vec::new();
    let mut complete_since: Option<Instant> = None;
    loop {
        if complete_since.is_none() && combined.len() >= expected.len() {
            complete_since = Some(Instant::now());
        }
        let timeout = match complete_since {
            Some(since) => match Duration::from_millis(500).checked_sub(since.elapsed()) {
                Some(rest) => rest,
                None => break,
            },
            None => Duration::from_secs(10),
        };
        match next_delivered(&mut second, timeout) {
            Some(d) if d.position <= last_seen => dropped.push(d.position),
            Some(d) => {
                last_seen = d.position;
                combined.push(d.position);
            }
            None if complete_since.is_some() => break,
            None => break, // 10 s of silence
        }
    }

    assert_eq!(combined, expected, "catch-up sequence (replayed {replayed:?}, then notified)");
    // The overlap really happened: the three events published between LISTEN
    // and replay were notified too, and the pattern dropped exactly those.
    assert_eq!(dropped, committed[10..13].to_vec(), "notifications dropped as already seen");
}

/// A transaction whose events land on both sides of a horizon gets its commit
/// time recorded once, and its later events carry the same time, even when a
/// restarted worker (which remembers nothing) delivers them.
#[test]
fn straddling_transaction_keeps_its_commit_time_across_a_worker_restart() {
    let db = TestDb::new();
    let mut listener = Listener::new(&db, &["split"]);
    let mut t = db.connect();
    let mut u = db.connect();
    let mut observer = db.connect();

    t.batch_execute("BEGIN").unwrap();
    let first = publish(&mut t, "split", r#"{"t":1}"#);
    u.batch_execute("BEGIN").unwrap();
    let held = publish(&mut u, "split", r#"{"u":1}"#);
    let second = publish(&mut t, "split", r#"{"t":2}"#);
    t.batch_execute("COMMIT").unwrap();
    // U holds the horizon between T's two events: only T's first is final.
    wait_for_horizon(&mut observer, first);
    let early = listener.collect(1, Duration::from_secs(10));
    assert_eq!(early.len(), 1);
    assert_eq!(early[0]["position"].as_i64(), Some(first));
    assert_eq!(horizon(&mut observer), first, "U holds the rest back");

    let old_pid = db.wait_for_worker();
    admin().execute("SELECT pg_terminate_backend($1)", &[&old_pid]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while db.wait_for_worker() == old_pid {
        assert!(Instant::now() < deadline, "the worker comes back");
        thread::sleep(Duration::from_millis(50));
    }
    u.batch_execute("COMMIT").unwrap();

    let rest = listener.collect(2, Duration::from_secs(10));
    let positions: Vec<i64> = rest.iter().map(|e| e["position"].as_i64().unwrap()).collect();
    assert_eq!(positions, vec![held, second]);
    assert_eq!(rest[1]["time"], early[0]["time"], "one transaction, one commit time");
    assert_eq!(rest[1]["tx"], early[0]["tx"]);
    let times: i64 = observer
        .query_one(
            "SELECT count(DISTINCT time) FROM streams.events WHERE tx = (SELECT tx FROM streams.get($1))",
            &[&first],
        )
        .unwrap()
        .get(0);
    assert_eq!(times, 1, "every event of the transaction has its one commit time");
    assert!(listener.next(Duration::from_millis(300)).is_none(), "nothing twice");
}
