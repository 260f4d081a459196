//! The no-missed-event guarantee: a reader that follows positions sees every
//! committed event exactly once, in position order, whatever the interleaving
//! of concurrent commits and rollbacks, under READ COMMITTED and REPEATABLE READ.
#![cfg(feature = "integration")]

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use postgres::Client;
use rand::Rng;

fn read_after(c: &mut Client, after: i64) -> Vec<i64> {
    c.query("SELECT position FROM streams.replay(after => $1, max_events => 100)", &[&after])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// A publishes (position p) and stays open; B publishes (p + 1) and commits.
/// A reader that read everything it could, then continues after A commits,
/// sees both exactly once. `position > last` on the raw table would skip p.
#[test]
fn late_commit_is_never_skipped() {
    let db = TestDb::new();
    let mut a = db.connect();
    let mut b = db.connect();
    let mut reader = db.connect();

    a.batch_execute("BEGIN").unwrap();
    let pa = publish(&mut a, "orders", r#"{"who":"A"}"#);
    let pb = publish(&mut b, "orders", r#"{"who":"B"}"#);
    assert!(pa < pb);

    // B is committed, but A holds the horizon: the reader sees nothing yet.
    std::thread::sleep(Duration::from_millis(300));
    let mut seen = read_after(&mut reader, 0);
    assert!(seen.is_empty(), "B must not be visible before A finishes: {seen:?}");
    let raw: Vec<i64> = event_positions(&mut reader, "SELECT position FROM streams.event_log ORDER BY position");
    assert_eq!(raw, vec![pb], "(the raw table shows B alone: a naive reader would now skip A)");

    a.batch_execute("COMMIT").unwrap();
    wait_for_horizon(&mut reader, pb);
    let last = seen.last().copied().unwrap_or(0);
    seen.extend(read_after(&mut reader, last));
    assert_eq!(seen, vec![pa, pb]);
}

/// Same, with the reader in one REPEATABLE READ transaction per read: its
/// snapshot's horizon never covers an event its snapshot cannot see.
#[test]
fn repeatable_read_reader_sees_every_event_once() {
    read_while_writing(3, Duration::from_secs(3), |reader, after| {
        let mut tx =
            reader.build_transaction().isolation_level(postgres::IsolationLevel::RepeatableRead).start().unwrap();
        let page = |tx: &mut postgres::Transaction<'_>| -> Vec<i64> {
            tx.query("SELECT position FROM streams.replay(after => $1, max_events => 50)", &[&after])
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect()
        };
        let rows = page(&mut tx);
        assert_eq!(page(&mut tx), rows, "within one snapshot, a second read agrees with the first");
        tx.commit().unwrap();
        rows
    });
}

/// Writers publish 1 to 3 events per transaction, pause randomly before
/// COMMIT and roll back about 20%; a reader pages with `after =>` all along.
/// At the end the reader has seen exactly the committed set, once each, in
/// increasing positions.
#[test]
fn concurrent_writers_and_a_paging_reader_agree_exactly() {
    let committed = read_while_writing(6, Duration::from_secs(5), |reader, after| {
        let page = read_after(reader, after);
        std::thread::sleep(Duration::from_millis(rand::thread_rng().gen_range(0..3)));
        page
    });
    assert!(committed > 200, "the run exercised enough commits ({committed})");
}

/// Run `n` writers for `duration` while `read_page(reader, after)` pages
/// through the events; then read the rest and check the reader saw exactly the
/// committed set. Returns how many events were committed.
fn read_while_writing(n: usize, duration: Duration, mut read_page: impl FnMut(&mut Client, i64) -> Vec<i64>) -> usize {
    let db = TestDb::new();
    let committed = Arc::new(Mutex::new(BTreeSet::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let writers = spawn_writers(&db, n, committed.clone(), stop.clone());
    let mut reader = db.connect();
    let mut seen = Vec::new();
    let deadline = Instant::now() + duration;
    while Instant::now() < deadline {
        let after = seen.last().copied().unwrap_or(0);
        seen.extend(read_page(&mut reader, after));
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    drain(&mut reader, &mut seen, &committed);
    let committed = committed.lock().unwrap();
    check_exactly_committed(&seen, &committed);
    committed.len()
}

fn spawn_writers(
    db: &TestDb,
    n: usize,
    committed: Arc<Mutex<BTreeSet<i64>>>,
    stop: Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..n)
        .map(|w| {
            let mut c = db.connect();
            let committed = committed.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut rng = rand::thread_rng();
                while !stop.load(Ordering::Relaxed) {
                    let mut tx = c.transaction().unwrap();
                    let mut mine = Vec::new();
                    for _ in 0..rng.gen_range(1..=3) {
                        let stream = if rng.gen_bool(0.5) { "stress.a" } else { "stress.b" };
                        let p: i64 = tx
                            .query_one(
                                "SELECT streams.publish($1, jsonb_build_object('w', $2::int))",
                                &[&stream, &(w as i32)],
                            )
                            .unwrap()
                            .get(0);
                        mine.push(p);
                    }
                    std::thread::sleep(Duration::from_micros(rng.gen_range(0..4000)));
                    if rng.gen_bool(0.2) {
                        tx.rollback().unwrap();
                    } else {
                        tx.commit().unwrap();
                        committed.lock().unwrap().extend(mine);
                    }
                }
            })
        })
        .collect()
}

/// Read the rest once every committed event is final.
fn drain(reader: &mut Client, seen: &mut Vec<i64>, committed: &Mutex<BTreeSet<i64>>) {
    let newest = committed.lock().unwrap().iter().next_back().copied().unwrap_or(0);
    wait_for_horizon(reader, newest);
    loop {
        let page = read_after(reader, seen.last().copied().unwrap_or(0));
        if page.is_empty() {
            break;
        }
        seen.extend(page);
    }
}

fn check_exactly_committed(seen: &[i64], committed: &BTreeSet<i64>) {
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "positions strictly increase, no duplicates");
    let seen_set: BTreeSet<i64> = seen.iter().copied().collect();
    let missed: Vec<_> = committed.difference(&seen_set).take(20).collect();
    let phantom: Vec<_> = seen_set.difference(committed).take(20).collect();
    assert!(missed.is_empty(), "reader missed committed events (first 20): {missed:?}");
    assert!(phantom.is_empty(), "reader saw events that were not committed (first 20): {phantom:?}");
}
