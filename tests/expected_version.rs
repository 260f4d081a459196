//! Expected version: publish(..., expected_prev => p) appends only while the
//! stream's newest event, counting uncommitted ones, is at p (40001
//! otherwise, nothing written); of concurrent appenders with the same p
//! exactly one commits; an event-sourcing loop loses no append; publishers
//! without expected_prev never wait for it.
#![cfg(feature = "integration")]

mod common;

use std::sync::{Arc, Barrier};

use common::*;
use rand::Rng;

fn head(c: &mut postgres::Client, stream: &str) -> i64 {
    c.query_one("SELECT streams.stream_head($1)", &[&stream]).unwrap().get(0)
}

fn append(c: &mut postgres::Client, stream: &str, data: &str, expected: i64) -> Result<i64, postgres::Error> {
    c.query_one("SELECT streams.publish($1, $2::text::jsonb, expected_prev => $3)", &[&stream, &data, &expected])
        .map(|r| r.get(0))
}

#[test]
fn of_sixteen_appenders_expecting_one_position_exactly_one_commits() {
    let db = TestDb::new();
    const SESSIONS: usize = 16;
    let mut c = db.connect();
    let mut expected = 0;
    for round in 0..5 {
        let barrier = Arc::new(Barrier::new(SESSIONS));
        let threads: Vec<_> = (0..SESSIONS)
            .map(|i| {
                let (config, barrier) = (db.config(), barrier.clone());
                std::thread::spawn(move || {
                    let mut c = config.connect(postgres::NoTls).unwrap();
                    let mut rng = rand::thread_rng();
                    let commit = i == 0 || rng.gen_bool(0.5);
                    barrier.wait();
                    c.batch_execute("BEGIN").unwrap();
                    match append(&mut c, "account.1", &format!(r#"{{"by":{i}}}"#), expected) {
                        Ok(position) => {
                            std::thread::sleep(std::time::Duration::from_millis(rng.gen_range(0..10)));
                            c.batch_execute(if commit { "COMMIT" } else { "ROLLBACK" }).unwrap();
                            Ok((commit, position))
                        }
                        Err(err) => {
                            c.batch_execute("ROLLBACK").unwrap();
                            Err(sqlstate(&err))
                        }
                    }
                })
            })
            .collect();
        let results: Vec<Result<(bool, i64), String>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let committed: Vec<i64> =
            results.iter().filter_map(|r| r.as_ref().ok().filter(|(c, _)| *c).map(|(_, p)| *p)).collect();
        assert!(
            results.iter().all(|r| r.as_ref().map_or_else(|s| s == "40001", |_| true)),
            "round {round}: {results:?}"
        );
        let events: Vec<i64> = c
            .query("SELECT position FROM streams.event_log WHERE stream = 'account.1' AND position > $1", &[&expected])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert!(
            committed.len() <= 1 && events == committed,
            "round {round}: {committed:?} vs {events:?} ({results:?})"
        );
        if let Some(&p) = committed.first() {
            wait_for_horizon(&mut c, p);
            expected = p;
        }
        assert_eq!(head(&mut c, "account.1"), expected);
    }
    assert!(expected > 0, "session 0 commits when it wins; some round had a winner that committed");
}

#[test]
fn an_event_sourcing_loop_loses_no_append() {
    let db = TestDb::new();
    const WRITERS: i64 = 8;
    const EACH: i64 = 15;
    let threads: Vec<_> = (0..WRITERS)
        .map(|w| {
            let config = db.config();
            std::thread::spawn(move || {
                let mut c = config.connect(postgres::NoTls).unwrap();
                let mut conflicts = 0;
                for n in 0..EACH {
                    loop {
                        // Read the state (its version and how many events it has), then append.
                        let row = c
                            .query_one(
                                "SELECT streams.stream_head('cart.9'), (SELECT count(*) FROM streams.events WHERE stream = 'cart.9')",
                                &[],
                            )
                            .unwrap();
                        let (version, count): (i64, i64) = (row.get(0), row.get(1));
                        let data = format!(r#"{{"writer":{w},"n":{n},"seq":{count}}}"#);
                        match append(&mut c, "cart.9", &data, version) {
                            Ok(_) => break,
                            Err(err) if sqlstate(&err) == "40001" => conflicts += 1,
                            Err(err) => panic!("writer {w}: {err}"),
                        }
                    }
                }
                conflicts
            })
        })
        .collect();
    let conflicts: i64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let mut c = db.connect();
    let seqs: Vec<(i64, i64, i64)> = c
        .query(
            "SELECT (data->>'seq')::bigint, (data->>'writer')::bigint, (data->>'n')::bigint
             FROM streams.event_log WHERE stream = 'cart.9' ORDER BY position",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(seqs.len() as i64, WRITERS * EACH, "every append is there once ({conflicts} conflicts retried)");
    assert!(seqs.iter().enumerate().all(|(i, (seq, _, _))| *seq == i as i64), "a gapless sequence: {seqs:?}");
    let mut appends: Vec<(i64, i64)> = seqs.iter().map(|(_, w, n)| (*w, *n)).collect();
    appends.sort_unstable();
    appends.dedup();
    assert_eq!(appends.len() as i64, WRITERS * EACH, "no append twice");
}

#[test]
fn uncommitted_publishes_count_and_plain_publishers_never_wait() {
    let db = TestDb::new();
    let mut c = db.connect();
    assert_eq!(head(&mut c, "s"), 0);
    let err = append(&mut c, "s", "{}", 5).unwrap_err();
    assert_eq!(sqlstate(&err), "40001", "expected 5, the stream has none");
    let first = append(&mut c, "s", "{}", 0).unwrap();
    wait_for_horizon(&mut c, first);
    assert_eq!(head(&mut c, "s"), first);

    // An open transaction's publish without expected_prev counts.
    let mut open = db.connect();
    open.batch_execute("BEGIN").unwrap();
    let pending = publish(&mut open, "s", "{}");
    let err = append(&mut c, "s", "{}", first).unwrap_err();
    assert_eq!(sqlstate(&err), "40001");
    let detail = err.as_db_error().and_then(|e| e.detail()).unwrap_or_default().to_owned();
    assert!(detail.contains(&pending.to_string()), "the detail names the newest position: {detail}");
    open.batch_execute("ROLLBACK").unwrap();
    let second = append(&mut c, "s", "{}", first).unwrap();

    // An appender holding the stream does not stop publishers without expected_prev.
    open.batch_execute("BEGIN").unwrap();
    append(&mut open, "s", "{}", second).unwrap();
    let mut plain = db.connect();
    plain.batch_execute("SET lock_timeout = '200ms'").unwrap();
    plain
        .batch_execute("SELECT streams.publish('s', '{}')")
        .expect("a publisher without expected_prev takes no stream lock");
    open.batch_execute("COMMIT").unwrap();

    // A batch is checked before its first event, and nothing of a refused one is written.
    let stored = count_stored(&mut c);
    let err = c
        .batch_execute(&format!(
            "SELECT streams.publish_batch('s', ARRAY['{{}}', '{{}}']::jsonb[], expected_prev => {second})"
        ))
        .unwrap_err();
    assert_eq!(sqlstate(&err), "40001");
    assert_eq!(count_stored(&mut c), stored);
}

#[test]
fn a_role_without_the_publish_privilege_cannot_take_or_wait_for_the_stream() {
    let db = TestDb::new();
    let mut owner = db.connect();
    let first = append(&mut owner, "ledger", "{}", 0).unwrap();
    let stranger = TestRole::new(&db, "stranger", "IN ROLE pg_write_all_data");
    owner.batch_execute(&format!("SELECT streams.grant('publish', 'other', '{}')", stranger.name)).unwrap();
    // The owner's appender holds the stream until it commits.
    owner.batch_execute("BEGIN").unwrap();
    append(&mut owner, "ledger", "{}", first).unwrap();
    let mut s = db.connect_as(&stranger.name);
    s.batch_execute("SET lock_timeout = '200ms'").unwrap();
    let err = append(&mut s, "ledger", "{}", first).unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "refused before it could wait for (or take) the stream: {err}");
    // Advisory locks of every key the SQL functions can name do not touch the stream's lock.
    s.batch_execute("SELECT pg_advisory_lock(k) FROM generate_series(0, 100) k").unwrap();
    owner.batch_execute("COMMIT").unwrap();
    let mut other = db.connect();
    other.batch_execute("SET lock_timeout = '2s'").unwrap();
    let head: i64 =
        other.query_one("SELECT max(position) FROM streams.event_log WHERE stream = 'ledger'", &[]).unwrap().get(0);
    append(&mut other, "ledger", "{}", head).expect("the stranger's advisory locks hold nothing of ours");
}
