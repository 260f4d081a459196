#![cfg(feature = "integration")]
//! Hostile tests of retries on unordered subscriptions (competing consumers
//! with nack, max_attempts and dead letters) and of the poll that reads its
//! claimed ranges itself and asks `streams._attempt` per event.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::subscriptions::*;
use common::*;
use postgres::Client;
use rand::Rng;

/// A poll in the caller's transaction (no wait).
fn deliveries(c: &mut Client, sub: &str, max: i32) -> Result<Vec<Delivery>, postgres::Error> {
    try_deliveries(c, sub, max, "0")
}

fn count(c: &mut Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).unwrap_or_else(|e| panic!("{sql}: {e}")).get(0)
}

/// Four competing consumers, each on its own connection, nack the last
/// event of some batches (retry_after 0: it comes again at once, as a
/// put-back), roll some transactions back (and nack the last event after
/// that from the same session), and now and then get their backend
/// terminated. Once everything settles every event took effect exactly
/// once or is a dead letter (never both), nothing is left pending, no
/// event was handed out past max_attempts, and each event's attempts
/// strictly increase (nothing delivered twice as the same attempt).
#[test]
fn competing_consumers_with_nacks_rollbacks_and_kills_settle_every_event_exactly_once() {
    const EVENTS: usize = 8000;
    const MAX_ATTEMPTS: i32 = 3;
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute(&format!(
        "CREATE TABLE public.effects (position bigint NOT NULL, attempt int NOT NULL, consumer int NOT NULL);
         SELECT streams.create_subscription('pool', 'jobs', after => 0, ordered => false,
                                            max_attempts => {MAX_ATTEMPTS})"
    ))
    .unwrap();
    let events = publish_events(&mut c, "jobs", EVENTS, 500);
    let seen: Arc<Mutex<Vec<(i64, i32, usize)>>> = Arc::default();
    let unexpected: Arc<Mutex<Vec<String>>> = Arc::default();
    let pids: Arc<Mutex<Vec<i32>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let config = db.config();
    let mut threads = Vec::new();
    for consumer in 0..4usize {
        let (config, seen, unexpected, pids, stop) =
            (config.clone(), seen.clone(), unexpected.clone(), pids.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut rng = rand::thread_rng();
            let mut c: Option<Client> = None;
            while !stop.load(Ordering::Relaxed) {
                let client = c.get_or_insert_with(|| {
                    let mut client = connect_retrying(&config);
                    let pid = backend_pid(&mut client);
                    pids.lock().unwrap().push(pid);
                    client
                });
                let result = (|| -> Result<bool, postgres::Error> {
                    client.batch_execute("BEGIN")?;
                    let got = deliveries(client, "pool", rng.gen_range(1..40))?;
                    seen.lock().unwrap().extend(got.iter().map(|d| (d.position, d.attempt, consumer)));
                    let Some(last) = got.last().copied() else {
                        client.batch_execute("COMMIT")?;
                        return Ok(false);
                    };
                    let nack_last = rng.gen_bool(0.2);
                    for d in &got {
                        if nack_last && d.position == last.position {
                            client.batch_execute(&format!(
                                "SELECT streams.nack('pool', {}, retry_after => '0', reason => 'c{consumer}')",
                                d.position
                            ))?;
                        } else {
                            client.batch_execute(&format!(
                                "INSERT INTO public.effects VALUES ({}, {}, {consumer})",
                                d.position, d.attempt
                            ))?;
                        }
                    }
                    if rng.gen_bool(0.15) {
                        client.batch_execute("ROLLBACK")?;
                        if rng.gen_bool(0.5) {
                            // After the failed transaction, from the same
                            // session: 55000 if another consumer has it now.
                            if let Err(e) = client.batch_execute(&format!(
                                "SELECT streams.nack('pool', {}, retry_after => '0', reason => 'late')",
                                last.position
                            )) {
                                if sqlstate(&e) != "55000" {
                                    return Err(e);
                                }
                            }
                        }
                        return Ok(true);
                    }
                    client.batch_execute(&format!("SELECT streams.ack('pool', {}); COMMIT", last.position))?;
                    Ok(true)
                })();
                match result {
                    Ok(true) => {}
                    Ok(false) => std::thread::sleep(Duration::from_millis(5)),
                    Err(e) => {
                        let state = e.code().map(|s| s.code().to_owned());
                        // Terminated by the killer: reconnect.
                        if !(state.as_deref() == Some("57P01") || e.is_closed() || state.is_none()) {
                            unexpected.lock().unwrap().push(format!("consumer {consumer}: {e:?}"));
                        }
                        c = None;
                    }
                }
            }
        }));
    }
    let killer = {
        let (pids, stop) = (pids.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut admin = admin();
            let mut rng = rand::thread_rng();
            let mut kills = 0;
            while !stop.load(Ordering::Relaxed) && kills < 15 {
                std::thread::sleep(Duration::from_millis(rng.gen_range(50..300)));
                let pid = {
                    let pids = pids.lock().unwrap();
                    pids[rng.gen_range(0..pids.len())]
                };
                admin.execute("SELECT pg_terminate_backend($1)", &[&pid]).unwrap();
                kills += 1;
            }
        })
    };
    let total = events.len() as i64;
    let settled = |c: &mut Client| {
        count(c, "SELECT count(DISTINCT position) FROM public.effects")
            + count(c, "SELECT count(*) FROM streams.dead_letters WHERE subscription = 'pool'")
    };
    let deadline = Instant::now() + Duration::from_secs(45);
    while settled(&mut c) < total && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    killer.join().unwrap();
    assert_eq!(*unexpected.lock().unwrap(), Vec::<String>::new(), "errors other than the kills");

    let duplicates: Vec<(i64, i64)> = c
        .query("SELECT position, count(*) FROM public.effects GROUP BY position HAVING count(*) > 1 ORDER BY 1", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    if !duplicates.is_empty() {
        let (position, _) = duplicates[0];
        let rows: Vec<(i32, i32)> = c
            .query("SELECT attempt, consumer FROM public.effects WHERE position = $1", &[&position])
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let delivered: Vec<_> = seen.lock().unwrap().iter().filter(|d| d.0 == position).copied().collect();
        panic!(
            "events that took effect more than once (position, times): {duplicates:?}; \
             {position}: effects (attempt, consumer) {rows:?}, deliveries (position, attempt, consumer) {delivered:?}"
        );
    }
    let both = count(
        &mut c,
        "SELECT count(*) FROM public.effects e JOIN streams.dead_letters d
         ON d.position = e.position AND d.subscription = 'pool'",
    );
    assert_eq!(both, 0, "events that took effect and are dead letters too");
    let lost: Vec<i64> = c
        .query(
            "SELECT p FROM unnest($1::bigint[]) p
             WHERE NOT EXISTS (SELECT FROM public.effects e WHERE e.position = p)
               AND NOT EXISTS (SELECT FROM streams.dead_letters d WHERE d.position = p AND d.subscription = 'pool')",
            &[&events],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(lost, Vec::<i64>::new(), "events neither processed nor parked");
    let mut attempts: BTreeMap<i64, Vec<(i32, usize)>> = BTreeMap::new();
    for &(position, attempt, consumer) in seen.lock().unwrap().iter() {
        attempts.entry(position).or_default().push((attempt, consumer));
    }
    let bad: Vec<_> = attempts
        .iter()
        .filter(|(_, a)| {
            a.windows(2).any(|w| w[1].0 <= w[0].0) || a.iter().any(|&(n, _)| !(1..=MAX_ATTEMPTS).contains(&n))
        })
        .take(10)
        .collect();
    assert!(bad.is_empty(), "attempts (attempt, consumer) repeated, out of order or past max_attempts: {bad:?}");
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(deliveries(&mut c, "pool", 100).unwrap(), NOTHING, "nothing left to deliver");
    c.batch_execute("COMMIT").unwrap();
    assert_eq!(
        count(&mut c, "SELECT count(*) FROM streams.subscription_failures WHERE parked_at IS NULL"),
        0,
        "no failure waiting for a retry"
    );
}

/// Several events of one batch fail: a consumer nacks each of them (as the
/// competing-consumers example of docs/subscriptions.md does, `SELECT
/// streams.nack(...) FROM batch WHERE fails`) and acks the batch. Every nack is accepted, the good
/// events take effect, and each failed event comes again as its second
/// attempt.
#[test]
fn a_consumer_nacks_two_failing_events_of_one_unordered_batch() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute("SELECT streams.create_subscription('mailer', 'jobs', after => 0, ordered => false)").unwrap();
    let p = publish_events(&mut c, "jobs", 5, 5);
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(deliveries(&mut c, "mailer", 10).unwrap().len(), 5);
    c.batch_execute(&format!("SELECT streams.nack('mailer', {}, retry_after => '0')", p[1])).unwrap();
    let second = c.batch_execute(&format!("SELECT streams.nack('mailer', {}, retry_after => '0')", p[3]));
    assert!(second.is_ok(), "the second nack of the batch: {second:?}");
    ack(&mut c, "mailer", p[4]);
    c.batch_execute("COMMIT").unwrap();
    let mut again = Vec::new();
    wait_until("both failed events come again", Duration::from_secs(10), || {
        c.batch_execute("BEGIN").unwrap();
        let got = deliveries(&mut c, "mailer", 10).unwrap();
        if let Some(last) = got.last() {
            ack(&mut c, "mailer", last.position);
        }
        c.batch_execute("COMMIT").unwrap();
        again.extend(got);
        again.len() >= 2
    });
    assert_eq!(again, [at(p[1], 2), at(p[3], 2)], "the two nacked events, as their second attempt");
}

/// A put-back (a nacked event due again) that one consumer polls, processes
/// and acks is not handed to a second consumer whose poll listed the due
/// put-backs before that ack committed and takes the event's chunk lock
/// after it: the second poll must look again once it holds the lock.
/// The interleaving is made deterministic by holding the failure row of an
/// earlier put-back (one the second poll parks) locked meanwhile.
#[test]
fn a_put_back_acked_by_one_consumer_is_not_delivered_again_to_another() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute(
        "CREATE TABLE public.effects (position bigint NOT NULL, attempt int NOT NULL);
         SELECT streams.create_subscription('race', 'jobs', after => 0, ordered => false)",
    )
    .unwrap();
    // Two events of the subscription in different chunks.
    let waiting = publish_events(&mut c, "jobs", 1, 1)[0];
    publish_events(&mut c, "other", 1100, 550);
    let dup = publish_events(&mut c, "jobs", 1, 1)[0];
    assert_ne!(waiting / 1024, dup / 1024, "in different chunks");
    // `waiting`: two attempts, due again a little later.
    for (attempt, retry) in [(1, "0"), (2, "1.5 seconds")] {
        c.batch_execute("BEGIN").unwrap();
        let got = deliveries(&mut c, "race", 1).unwrap();
        assert_eq!(got, [at(waiting, attempt)]);
        c.batch_execute(&format!(
            "SELECT streams.nack('race', {waiting}, retry_after => '{retry}'); SELECT streams.ack('race', {waiting}); COMMIT"
        ))
        .unwrap();
    }
    c.batch_execute("SELECT streams.alter_subscription('race', max_attempts => 2)").unwrap();
    // `dup`: nacked once, now due.
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(deliveries(&mut c, "race", 1).unwrap(), [at(dup, 1)]);
    c.batch_execute(&format!(
        "SELECT streams.nack('race', {dup}, retry_after => '0'); SELECT streams.ack('race', {dup}); COMMIT"
    ))
    .unwrap();
    // Consumer A takes `dup` (its second attempt); `waiting` is not due yet.
    let mut a = db.connect();
    a.batch_execute("BEGIN").unwrap();
    assert_eq!(deliveries(&mut a, "race", 10).unwrap(), [at(dup, 2)]);
    wait_until("`waiting` is due", Duration::from_secs(10), || {
        holds(
            &mut c,
            &format!(
                "SELECT retry_at <= clock_timestamp() FROM streams.subscription_failures WHERE position = {waiting}"
            ),
        )
    });
    // Hold `waiting`'s failure row: consumer B's poll parks it (its attempts
    // are used up) and waits there, after it listed both put-backs.
    let mut holder = db.connect();
    holder
        .batch_execute(&format!(
            "BEGIN; SELECT FROM streams.subscription_failures WHERE position = {waiting} FOR UPDATE"
        ))
        .unwrap();
    let config = db.config();
    let b = std::thread::spawn(move || {
        let mut b = connect_retrying(&config);
        b.batch_execute("BEGIN").unwrap();
        let got = deliveries(&mut b, "race", 10);
        let _ = b.batch_execute("ROLLBACK");
        got
    });
    wait_until("B's poll waits for the failure row", Duration::from_secs(10), || {
        holds(
            &mut c,
            "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE query LIKE '%streams.poll(''race''%'
                                                          AND wait_event_type = 'Lock')",
        )
    });
    // A processes `dup` and commits, then B goes on.
    a.batch_execute(&format!(
        "INSERT INTO public.effects VALUES ({dup}, 2); SELECT streams.ack('race', {dup}); COMMIT"
    ))
    .unwrap();
    holder.batch_execute("ROLLBACK").unwrap();
    let got = b.join().unwrap().unwrap();
    assert!(!got.iter().any(|d| d.position == dup), "B got {got:?}: event {dup} again, after A processed and acked it");
}

/// The statement `streams.poll` reads a claimed range `(after, through]`
/// with (taken from the installed function: `branch` 0 for a subscription
/// to one stream, 1 for a prefix or '*'), prepared with the claim's values
/// as parameters and run under a generic plan: the shared buffers it
/// touched, and whether the plan sorts.
fn generic_read(
    c: &mut Client,
    branch: usize,
    stream: Option<&str>,
    prefix: Option<&str>,
    (after, through): (i64, i64),
) -> (i64, bool) {
    let source: String = c
        .query_one(
            "SELECT prosrc FROM pg_proc WHERE oid = 'streams.poll(text, integer, interval, interval)'::regprocedure",
            &[],
        )
        .unwrap()
        .get(0);
    let reads: Vec<&str> = source.split("RETURN QUERY").skip(1).collect();
    assert_eq!(reads.len(), 2, "streams.poll reads with two statements");
    let read = &reads[branch][..reads[branch].find(';').expect("the end of the read")];
    let read = read
        .replace("claimed.stream", "$1::text")
        .replace("claimed.prefix", "$2::text")
        .replace("claimed.afters[i]", "$3::bigint")
        .replace("claimed.throughs[i]", "$4::bigint")
        .replace("claimed.lease", "NULL::bigint")
        // No wildcard and no filters: the plain reads.
        .replace("claimed.pattern", "NULL::text")
        .replace("claimed.types", "NULL::text[]")
        .replace("claimed.filter", "NULL::jsonb");
    c.batch_execute(&format!(
        "SET plan_cache_mode = force_generic_plan; DEALLOCATE ALL; PREPARE poll_read(text, text, bigint, bigint) AS {read}"
    ))
    .unwrap();
    let text_or_null = |v: Option<&str>| v.map_or("NULL".to_owned(), |v| format!("'{v}'"));
    let explain = format!(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE poll_read({}, {}, {after}, {through})",
        text_or_null(stream),
        text_or_null(prefix),
    );
    let text = value(c, &explain).expect("a plan");
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    c.batch_execute("RESET plan_cache_mode").unwrap();
    let top = &json[0]["Plan"];
    let sorts = text.contains("\"Sort\"");
    (top["Shared Hit Blocks"].as_i64().unwrap() + top["Shared Read Blocks"].as_i64().unwrap(), sorts)
}

/// In a busy log (200,000 events of another stream, 200 of the
/// subscription's interleaved) the poll's read of a claimed range stays an
/// index scan of that range under a generic plan, in the index's order: a
/// few buffers per event, not a scan of the log, and no sort, for a sparse
/// stream's subscription and for one to every stream ('*') alike.
#[test]
fn the_poll_reads_its_ranges_by_index_in_a_busy_log_under_a_generic_plan() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute(
        "DO $$ BEGIN FOR i IN 1..200 LOOP
             PERFORM streams.publish_batch('noise', ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(1, 1000) g));
             PERFORM streams.publish('rare', jsonb_build_object('i', i));
         END LOOP; END $$;
         ANALYZE streams.event_log",
    )
    .unwrap();
    let last: i64 = c.query_one("SELECT max(position) FROM streams.event_log", &[]).unwrap().get(0);
    wait_for_horizon(&mut c, last);
    c.batch_execute(
        "SELECT streams.create_subscription('rare_u', 'rare', after => 0, ordered => false);
         SELECT streams.create_subscription('rare_o', 'rare', after => 0);
         SELECT streams.create_subscription('all_o', '*', after => 100000)",
    )
    .unwrap();
    // What the polls claim and read, end to end.
    for (sub, max, expected) in [("rare_u", 100, 16), ("rare_o", 100, 100), ("all_o", 100, 100)] {
        c.batch_execute("BEGIN").unwrap();
        assert_eq!(deliveries(&mut c, sub, max).unwrap().len(), expected, "{sub}");
        c.batch_execute("ROLLBACK").unwrap();
    }
    // The read itself under a generic plan: the sparse stream over 100,000
    // positions (one range), and every stream over the next 100 positions.
    // Neither sorts: the index's order is the poll's.
    let (sparse, sorts) = generic_read(&mut c, 0, Some("rare"), None, (0, 100_100));
    assert!(sparse < 300, "100 events of a sparse stream read with {sparse} buffers");
    assert!(!sorts, "the read of one stream sorts");
    let (everything, sorts) = generic_read(&mut c, 1, None, None, (100_000, 100_100));
    assert!(everything < 100, "100 events of '*' read with {everything} buffers (a scan of the whole index?)");
    assert!(!sorts, "the read of '*' sorts");
}

/// A consumer ended (`pg_terminate_backend`) while its poll waits for the
/// worker to write its delivery down leaves a request that the worker
/// commits after the consumer's claims are gone. The next consumer's poll
/// counts that attempt before it decides: at `max_attempts` it parks the
/// event, and never hands it out once more than allowed. Whether the next
/// consumer's backend takes the terminated one's slot (a new backend gets
/// the slot freed last, the request still in it) or another one.
#[test]
fn a_delivery_written_after_its_poller_was_terminated_counts_before_the_next_poll() {
    for same_slot in [true, false] {
        let db = TestDb::new();
        let mut c = db.connect();
        c.batch_execute(
            "SELECT streams.create_subscription('pool', 'jobs', after => 0, ordered => false, max_attempts => 2)",
        )
        .unwrap();
        let event = publish_events(&mut c, "jobs", 1, 1)[0];
        // Attempt 1: nacked, due again at once.
        c.batch_execute("BEGIN").unwrap();
        assert_eq!(deliveries(&mut c, "pool", 10).unwrap(), [at(event, 1)]);
        c.batch_execute(&format!(
            "SELECT streams.nack('pool', {event}, retry_after => '0'); SELECT streams.ack('pool', {event}); COMMIT"
        ))
        .unwrap();
        let mut admin = admin();
        let worker = StoppedWorker::stop(&mut admin, db.wait_for_worker());
        // Attempt 2: its poller is terminated while the worker is stopped.
        terminate_a_poll_waiting_for_the_worker(&mut admin, &db);
        // The next poll starts while that delivery is still waiting.
        let _slot_taker = (!same_slot).then(|| db.connect());
        let next = poll_in_a_thread(&db);
        wait_for_extension_wait(&mut admin, &db, "streams.poll(''pool''");
        drop(worker);
        let got = next.join().unwrap().unwrap();
        assert_eq!(got, [], "the next poll handed the event out past max_attempts (same slot: {same_slot})");
        assert_eq!(
            count(&mut c, &format!("SELECT attempts::bigint FROM streams.dead_letters WHERE position = {event}")),
            2,
            "parked after its two attempts (same slot: {same_slot})"
        );
    }
}

/// A poll of subscription 'pool' (at most 10 events) in a transaction of
/// its own, on a connection of its own, committed.
fn poll_in_a_thread(db: &TestDb) -> std::thread::JoinHandle<Result<Vec<Delivery>, postgres::Error>> {
    let config = db.config();
    std::thread::spawn(move || {
        let mut c = connect_retrying(&config);
        c.batch_execute("BEGIN").unwrap();
        let got = deliveries(&mut c, "pool", 10)?;
        c.batch_execute("COMMIT").map(|()| got)
    })
}

/// With the worker stopped: a poll of 'pool' waits for it to write its
/// delivery down, and is terminated there (its request stays behind); once
/// its backend is gone.
fn terminate_a_poll_waiting_for_the_worker(admin: &mut Client, db: &TestDb) {
    let doomed = poll_in_a_thread(db);
    let pid = wait_for_extension_wait(admin, db, "streams.poll(''pool''");
    admin.execute("SELECT pg_terminate_backend($1)", &[&pid]).unwrap();
    assert!(doomed.join().unwrap().is_err(), "the terminated poll returned events");
    wait_until("the terminated backend is gone", Duration::from_secs(10), || !backend_exists(admin, pid));
}

/// Wait until a backend of `db` running a statement that contains `query`
/// waits on an extension's wait event (for the worker); its pid.
fn wait_for_extension_wait(admin: &mut Client, db: &TestDb, query: &str) -> i32 {
    let mut pid = None;
    wait_until(&format!("a statement with {query} waits for the worker"), Duration::from_secs(10), || {
        pid = admin
            .query_opt(
                &format!(
                    "SELECT pid FROM pg_stat_activity
                     WHERE datname = $1 AND query LIKE '%{query}%' AND wait_event_type = 'Extension'"
                ),
                &[&db.name],
            )
            .unwrap()
            .map(|r| r.get(0));
        pid.is_some()
    });
    pid.unwrap()
}

/// A consumer's transaction failed; before it nacks the event from the same
/// session, another consumer polls the event and is terminated while the
/// worker writes that delivery down. The late nack counts that delivery
/// first: the event was delivered to another session since, and the nack is
/// refused (55000) instead of recording a failure from a stale count.
#[test]
fn a_late_nack_counts_a_delivery_still_being_written_first() {
    let db = TestDb::new();
    let mut a = db.connect();
    a.batch_execute("SELECT streams.create_subscription('pool', 'jobs', after => 0, ordered => false)").unwrap();
    let event = publish_events(&mut a, "jobs", 1, 1)[0];
    a.batch_execute("BEGIN").unwrap();
    assert_eq!(deliveries(&mut a, "pool", 10).unwrap(), [at(event, 1)]);
    a.batch_execute("ROLLBACK").unwrap();
    let mut admin = admin();
    let worker = StoppedWorker::stop(&mut admin, db.wait_for_worker());
    terminate_a_poll_waiting_for_the_worker(&mut admin, &db);
    let a_pid = backend_pid(&mut a);
    let nack = std::thread::spawn(move || {
        a.batch_execute(&format!("SELECT streams.nack('pool', {event}, retry_after => '0', reason => 'late')"))
    });
    wait_until("the late nack waits for the worker", Duration::from_secs(10), || in_long_poll(&mut admin, a_pid));
    drop(worker);
    let refused = nack.join().unwrap().expect_err("the late nack was accepted from a stale count");
    assert_eq!(sqlstate(&refused), "55000", "{refused:?}");
    let mut c = db.connect();
    assert_eq!(count(&mut c, "SELECT count(*) FROM streams.subscription_failures"), 0, "the nack recorded nothing");
}

/// The attempts a poll answers with are its transaction's: in the next
/// transaction of the same session (a pooled connection, maybe another
/// role's), `streams._attempt` says nothing of the events it claimed.
#[test]
fn a_polls_attempts_are_not_answered_after_its_transaction() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute("SELECT streams.create_subscription('pool', 'jobs', after => 0, ordered => false)").unwrap();
    let event = publish_events(&mut c, "jobs", 1, 1)[0];
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(deliveries(&mut c, "pool", 10).unwrap(), [at(event, 1)]);
    let inside: Option<i32> = c.query_one("SELECT streams._attempt($1)", &[&event]).unwrap().get(0);
    assert_eq!(inside, Some(1), "in the poll's transaction");
    c.batch_execute("ROLLBACK").unwrap();
    let after: Option<i32> = c.query_one("SELECT streams._attempt($1)", &[&event]).unwrap().get(0);
    assert_eq!(after, None, "the next transaction learns the last poll's claim");
}

/// A poll terminated while the worker writes its delivery down leaves its
/// request behind. A drop of the subscription in a transaction kept open
/// deleted the subscription's row under it: the worker's insert of that
/// delivery (its foreign key check) waited for the drop's transaction,
/// holding up every poller of the database until its lock_timeout, batch
/// after batch. The drop now waits for the deliveries still on their way
/// first; then the worker writes the others' deliveries while the drop's
/// transaction stays open.
#[test]
fn a_drop_waits_for_a_delivery_still_on_its_way() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute(
        "SELECT streams.create_subscription('pool', 'jobs', after => 0, ordered => false);
         SELECT streams.create_subscription('other', 'jobs', after => 0)",
    )
    .unwrap();
    let event = publish_events(&mut c, "jobs", 1, 1)[0];
    let mut admin = admin();
    let worker = StoppedWorker::stop(&mut admin, db.wait_for_worker());
    terminate_a_poll_waiting_for_the_worker(&mut admin, &db);
    let config = db.config();
    let dropper = std::thread::spawn(move || {
        let mut d = connect_retrying(&config);
        d.batch_execute("BEGIN; SELECT streams.drop_subscription('pool')").map(|()| d)
    });
    wait_for_extension_wait(&mut admin, &db, "drop_subscription");
    drop(worker);
    let mut dropping = dropper.join().unwrap().expect("the drop, once the delivery was written");
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(deliveries(&mut c, "other", 10).unwrap(), [at(event, 1)], "written beside the open drop");
    c.batch_execute("COMMIT").unwrap();
    dropping.batch_execute("COMMIT").unwrap();
}
