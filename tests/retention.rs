//! Opt-in retention (issue 27), against the real server: the worker drops
//! whole partitions that are due, never one a subscription or a webhook has
//! not passed (unless told to override consumers, and then the consumer is
//! marked as having lost events); every reader below the cut gets LS001,
//! never a shortened answer, also while partitions are dropped under it.
#![cfg(feature = "integration")]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::subscriptions::{consume, try_poll};
use common::webhooks::{local_receiver_and_db, Behaviour, SECRET};
use common::*;
use postgres::{Client, Config, IsolationLevel};

/// The worker applies retention with its maintenance, every 5 s.
const WORKER: Duration = Duration::from_secs(90);

fn partitioned(db: &TestDb) -> Client {
    let mut c = db.connect();
    c.batch_execute("SELECT streams.set_partition_size(10000)").unwrap();
    c
}

/// The first retained position as streams.storage and streams.status show it
/// (they must agree).
fn first_position(c: &mut Client) -> Option<i64> {
    let storage: Option<i64> = c.query_one("SELECT first_position FROM streams.storage", &[]).unwrap().get(0);
    let status: Option<i64> = c.query_one("SELECT first_position FROM streams.status", &[]).unwrap().get(0);
    assert_eq!(storage, status, "streams.storage and streams.status agree on first_position");
    storage
}

/// The partitions that hold events, in position order: without
/// `event_log_removed`, the empty place of what retention dropped.
fn kept(c: &mut Client) -> Vec<Partition> {
    partitions(c).into_iter().filter(|p| p.state != "removed").collect()
}

fn names(c: &mut Client) -> Vec<String> {
    kept(c).into_iter().map(|p| p.name).collect()
}

/// Wait until the worker dropped the partitions below `first` (the first
/// position it keeps then).
fn wait_for_cut(c: &mut Client, first: i64) {
    wait_until(&format!("retention cuts the log below {first}"), WORKER, || {
        kept(c).first().is_some_and(|p| p.first_position == Some(first))
    });
    let removed = partitions(c).into_iter().find(|p| p.state == "removed").expect("the removed range is listed");
    assert_eq!((removed.first_position, removed.end_position), (None, first), "it ends where the log starts");
}

/// Wait until the worker finished a whole maintenance pass (retention is
/// its last step) that started after this call: twice, an idempotency key
/// older than any window is inserted and waited for until the worker's
/// maintenance, which forgets such keys before it applies retention,
/// deleted it. The second deletion is by a pass after the one that deleted
/// the first, so that pass's retention has run to its end. What makes a
/// "retention did not drop it" assertion mean something.
fn wait_for_maintenance_pass(c: &mut Client) {
    for round in 0..2 {
        let key = format!("pass-{round}-{}", std::process::id());
        c.execute(
            "INSERT INTO streams.idempotency_keys (stream, key, positions, created_at)
             VALUES ('retention.barrier', $1, '{}', '2000-01-01')",
            &[&key],
        )
        .unwrap();
        wait_until("the worker's maintenance pass forgets a stale idempotency key", WORKER, || {
            c.query_opt("SELECT 1 FROM streams.idempotency_keys WHERE key = $1", &[&key]).unwrap().is_none()
        });
    }
}

/// Positions `after`+1 ..= `through` as replay returns them.
fn replayed(c: &mut Client, after: i64) -> Vec<i64> {
    event_positions(c, &format!("SELECT position FROM streams.replay(after => {after}, max_events => 1000000)"))
}

// --- 1. consumers hold what they have not passed ---------------------------

#[test]
fn retention_never_cuts_below_a_subscription_or_a_webhook() {
    let (receiver, db) = local_receiver_and_db(&[("/hook", Behaviour::signed(SECRET))]);
    let mut c = partitioned(&db);
    let orders = publish_many(&mut c, "orders", 38_000, 5000);
    assert_eq!((orders[0], orders[37_999]), (1, 38_000), "positions 1..38,000");
    // A subscription stopped at 25,000 (third partition) and a webhook at
    // 15,000 (second), paused before the worker could deliver anything.
    c.batch_execute(&format!(
        "SELECT streams.create_subscription('slow', 'orders', after => 25000);
         BEGIN;
         SELECT streams.create_webhook('hook', 'hooked', '{}', after => 15000, secret => '{SECRET}');
         SELECT streams.pause_webhook('hook');
         COMMIT;",
        receiver.url("/hook")
    ))
    .unwrap();
    let hooked = publish(&mut c, "hooked", PAYMENT);
    wait_for_horizon(&mut c, hooked);
    assert_eq!(first_position(&mut c), None, "nothing cut yet");
    wait_until("the worker makes the partition after the active one", WORKER, || {
        partitions(&mut c).iter().any(|p| p.first_position == Some(40000))
    });
    let before = names(&mut c);

    c.batch_execute("SELECT streams.set_retention(max_age => '0 seconds')").unwrap();
    let settings: (Option<String>, Option<i64>, bool) = c
        .query_one(
            "SELECT retention_max_age::text, retention_max_size, retention_overrides_consumers FROM streams.storage",
            &[],
        )
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .unwrap();
    assert_eq!(settings, (Some("00:00:00".into()), None, false));

    // The first partition goes; the webhook's holds.
    wait_for_cut(&mut c, 10000);
    wait_for_maintenance_pass(&mut c);
    assert_eq!(names(&mut c), before[1..], "only the first partition was dropped (the webhook holds the second)");
    assert_eq!(first_position(&mut c), Some(10000));
    let cut_at: Option<String> = c.query_one("SELECT cut_at::text FROM streams.storage", &[]).unwrap().get(0);
    assert!(cut_at.is_some(), "cut_at is set");
    assert_eq!(replayed(&mut c, 9999), orders[9999..].iter().copied().chain([hooked]).collect::<Vec<_>>());

    // The webhook delivers its event and so passes the second partition;
    // the subscription holds the third.
    c.batch_execute("SELECT streams.resume_webhook('hook')").unwrap();
    wait_until("the webhook delivers", WORKER, || {
        c.query_one("SELECT position FROM streams.webhooks WHERE name = 'hook'", &[]).unwrap().get::<_, i64>(0)
            >= hooked
    });
    wait_for_cut(&mut c, 20000);
    wait_for_maintenance_pass(&mut c);
    assert_eq!(names(&mut c), before[2..], "the subscription holds the third partition");
    assert_eq!(first_position(&mut c), Some(20000));

    // The subscription goes on through 30,000: the third goes too, never the
    // active one.
    let got = consume(&mut c, "slow", 5000);
    assert_eq!(got, orders[25_000..30_000]);
    wait_for_cut(&mut c, 30000);
    wait_for_maintenance_pass(&mut c);
    let left = kept(&mut c);
    assert_eq!(left[0].state, "active", "{left:?}");
    assert_eq!(left.iter().map(|p| p.name.clone()).collect::<Vec<_>>(), before[3..]);
    assert_eq!(first_position(&mut c), Some(30000));
    assert_eq!(consume(&mut c, "slow", 10_000), orders[30_000..], "the subscription reads on");
}

/// Subscription `parked` from after 5000, one attempt per event: its first
/// event (`first`, 5001) fails once and is parked as a dead letter.
fn park_after_5000(c: &mut Client, first: i64) {
    c.batch_execute("SELECT streams.create_subscription('parked', 'orders', after => 5000, max_attempts => 1)")
        .unwrap();
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(try_poll(c, "parked", 1).unwrap(), [first]);
    c.batch_execute(&format!("SELECT streams.nack('parked', {first})")).unwrap();
    c.batch_execute("COMMIT").unwrap();
}

/// A dead letter holds its partition until it is discarded, also when its
/// subscription has gone past it.
#[test]
fn a_dead_letter_holds_its_partition() {
    let db = TestDb::new();
    let mut c = partitioned(&db);
    let orders = publish_many(&mut c, "orders", 25_000, 5000);
    // Event 5001 fails once and is parked; the subscription goes on past it.
    park_after_5000(&mut c, orders[5000]);
    let parked: i64 = c
        .query_one("SELECT count(*) FROM streams.subscription_failures WHERE position = $1", &[&orders[5000]])
        .unwrap()
        .get(0);
    assert_eq!(parked, 1, "parked as a dead letter");
    c.batch_execute("SELECT streams.seek('parked', after => 24000)").unwrap();

    c.batch_execute("SELECT streams.set_retention(max_age => '0 seconds')").unwrap();
    wait_for_maintenance_pass(&mut c);
    assert_eq!(first_position(&mut c), None, "the dead letter at {} holds the first partition", orders[5000]);
    c.batch_execute(&format!("SELECT streams.discard_dead_letter('parked', {})", orders[5000])).unwrap();
    wait_for_cut(&mut c, 20000);
}

// --- 2. overriding consumers ----------------------------------------------

#[test]
fn overriding_consumers_marks_them_lost_and_a_seek_past_the_cut_resumes() {
    let db = TestDb::new();
    let mut c = partitioned(&db);
    let orders = publish_many(&mut c, "orders", 25_000, 5000);
    c.batch_execute(
        "SELECT streams.create_subscription('behind', 'orders', after => 5000);
         SELECT streams.create_subscription('ahead', 'orders', after => 21000);",
    )
    .unwrap();
    c.batch_execute("SELECT streams.set_retention(max_age => '0 seconds', overrides_consumers => true)").unwrap();
    wait_for_cut(&mut c, 20000);
    assert_eq!(first_position(&mut c), Some(20000));
    let lost = |c: &mut Client, name: &str| -> Option<i64> {
        c.query_one("SELECT lost_before FROM streams.subscriptions WHERE name = $1", &[&name]).unwrap().get(0)
    };
    assert_eq!(lost(&mut c, "behind"), Some(20000), "the subscription retention cut below is marked");
    assert_eq!(lost(&mut c, "ahead"), None);

    // Its poll says so, every time, with the first kept position.
    for _ in 0..2 {
        let err = try_poll(&mut c, "behind", 10).unwrap_err();
        assert_eq!(sqlstate(&err), "LS001", "{err}");
        let db_error = err.as_db_error().unwrap();
        let text = format!("{} {:?} {:?}", db_error.message(), db_error.detail(), db_error.hint());
        assert!(text.contains("20000"), "names the first kept position: {text}");
    }
    assert_eq!(consume(&mut c, "ahead", 10_000), orders[21_000..], "the other reads on");

    // A seek below the cut is refused; to the cut's edge it clears the mark.
    let err = c.batch_execute("SELECT streams.seek('behind', after => 19998)").unwrap_err();
    assert_eq!(sqlstate(&err), "LS001", "{err}");
    assert_eq!(lost(&mut c, "behind"), Some(20000));
    c.batch_execute("SELECT streams.seek('behind', after => 19999)").unwrap();
    assert_eq!(lost(&mut c, "behind"), None, "seek clears lost_before");
    assert_eq!(consume(&mut c, "behind", 10_000), orders[19_999..], "polls again, from the first kept position");
}

// --- 3. readers racing the drops -------------------------------------------

/// One reader's loop: read the first kept position, replay `span` events
/// from it (READ COMMITTED, or REPEATABLE READ with the snapshot taken
/// before the replay), check the answer is the whole range or LS001.
/// Returns (complete answers, LS001 answers).
fn read_oldest_range(config: Config, repeatable: bool, span: i64, newest: i64, stop: Arc<AtomicBool>) -> (u64, u64) {
    let mut c = connect_retrying(&config);
    let (mut complete, mut refused) = (0, 0);
    while !stop.load(Ordering::Relaxed) {
        let mut tx = if repeatable {
            c.build_transaction().isolation_level(IsolationLevel::RepeatableRead).start().unwrap()
        } else {
            c.transaction().unwrap()
        };
        let first: Option<i64> = tx.query_one("SELECT first_position FROM streams.storage", &[]).unwrap().get(0);
        let after = first.map_or(0, |f| f - 1);
        let answer = tx.query(
            "SELECT position FROM streams.replay(after => $1, max_events => $2::bigint::integer)",
            &[&after, &span],
        );
        match answer {
            Ok(rows) => {
                let got: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
                let expected: Vec<i64> = (after + 1..=(after + span).min(newest)).collect();
                assert!(
                    got == expected,
                    "replay(after => {after}) returned {} events, {:?}..{:?}, not {}..={} (repeatable: {repeatable})",
                    got.len(),
                    got.first(),
                    got.last(),
                    after + 1,
                    (after + span).min(newest)
                );
                complete += 1;
            }
            Err(e) => {
                assert_eq!(sqlstate(&e), "LS001", "replay(after => {after}): {e}");
                refused += 1;
            }
        }
        drop(tx);
        // Paced, so that the worker's lock on the log finds a gap.
        std::thread::sleep(Duration::from_millis(20));
    }
    (complete, refused)
}

#[test]
fn readers_racing_the_drops_get_whole_ranges_or_ls001() {
    let db = TestDb::new();
    let mut c = partitioned(&db);
    let orders = publish_many(&mut c, "orders", 65_000, 5000);
    let newest = *orders.last().unwrap();
    assert_eq!(orders, (1..=newest).collect::<Vec<i64>>(), "positions without gaps");

    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..6)
        .map(|i| {
            let (config, stop) = (db.config(), stop.clone());
            // Spans of 12,000: each read crosses a partition boundary.
            std::thread::spawn(move || read_oldest_range(config, i >= 4, 12_000, newest, stop))
        })
        .collect();
    c.batch_execute("SELECT streams.set_retention(max_age => '0 seconds')").unwrap();
    let cut = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| wait_for_cut(&mut c, 60000)));
    stop.store(true, Ordering::Relaxed);
    let counts: Vec<(u64, u64)> = readers.into_iter().map(|r| r.join().expect("a reader's answers")).collect();
    if let Err(panic) = cut {
        std::panic::resume_unwind(panic);
    }
    let (complete, refused) = counts.iter().fold((0, 0), |(a, b), (c, d)| (a + c, b + d));
    eprintln!("readers: {complete} complete answers, {refused} LS001 ({counts:?})");
    assert!(counts.iter().all(|(complete, _)| *complete > 0), "every reader had answers: {counts:?}");
    assert_eq!(replayed(&mut c, 59_999), orders[59_999..], "what is kept reads whole");
}

// --- 4. every reader below the cut ---------------------------------------

#[test]
fn reads_below_the_cut_fail_with_ls001_naming_the_first_kept_position() {
    let db = TestDb::new();
    let mut c = partitioned(&db);
    // Five transactions of 5,000: 1..5000, ..., 20001..25000.
    let orders = publish_many(&mut c, "orders", 25_000, 5000);
    assert_eq!(orders, (1..=25_000).collect::<Vec<i64>>());
    let time_of = |c: &mut Client, p: i64| -> String {
        c.query_one("SELECT time::text FROM streams.events WHERE position = $1", &[&p]).unwrap().get(0)
    };
    let tx_of = |c: &mut Client, p: i64| -> String {
        c.query_one("SELECT tx::text FROM streams.events WHERE position = $1", &[&p]).unwrap().get(0)
    };
    let (t5000, t15000, t20000, t20001) =
        (time_of(&mut c, 5000), time_of(&mut c, 15000), time_of(&mut c, 20000), time_of(&mut c, 20001));
    let (x5000, x20000, x20001) = (tx_of(&mut c, 5000), tx_of(&mut c, 20000), tx_of(&mut c, 20001));
    let ok_before = c.query("SELECT * FROM streams.replay(since => $1::text::timestamptz)", &[&t5000]);
    assert!(ok_before.is_ok(), "no cut yet");
    assert_eq!(first_position(&mut c), None);

    c.batch_execute("SELECT streams.set_retention(max_age => '0 seconds')").unwrap();
    wait_for_cut(&mut c, 20000);
    assert_eq!(first_position(&mut c), Some(20000));
    let stored: i64 = c.query_one("SELECT count(*) FROM streams.event_log", &[]).unwrap().get(0);
    assert_eq!(stored, 5001, "positions 20,000..25,000 are kept");

    let reader = TestRole::new(&db, "reader", "");
    c.batch_execute(&format!("SELECT streams.grant('read', 'orders', '{}')", reader.name)).unwrap();
    let mut r = db.connect_as(&reader.name);
    for client in [&mut c, &mut r] {
        for (read, why) in [
            ("SELECT * FROM streams.replay()".to_owned(), "from the start"),
            ("SELECT * FROM streams.replay(after => 0)".to_owned(), "after 0"),
            ("SELECT * FROM streams.replay('orders', after => 19998)".to_owned(), "one below the first kept"),
            (format!("SELECT * FROM streams.replay(since => '{t5000}')"), "since a removed event's time"),
            (format!("SELECT * FROM streams.replay(since => '{t15000}')"), "since a removed event's time"),
            (format!("SELECT * FROM streams.replay(since => '{t20000}')"), "since the newest removed event's time"),
            (format!("SELECT * FROM streams.replay(from_tx => '{x5000}')"), "from a removed transaction"),
            (format!("SELECT * FROM streams.replay(from_tx => '{x20000}')"), "from a transaction cut in two"),
            ("SELECT * FROM streams.get(19999)".to_owned(), "get below the cut"),
            ("SELECT * FROM streams.get(1)".to_owned(), "get of the first"),
        ] {
            let err = client.query(&read, &[]).expect_err(&read);
            assert_eq!(sqlstate(&err), "LS001", "{why}: {read}: {err}");
            let db_error = err.as_db_error().unwrap();
            let text = format!("{} {:?}", db_error.message(), db_error.detail());
            assert!(text.contains("20000"), "{why}: names the first kept position: {text}");
        }
        for (read, first) in [
            ("SELECT position FROM streams.replay(after => 19999)".to_owned(), 20000),
            (format!("SELECT position FROM streams.replay(since => '{t20001}')"), 20001),
            (format!("SELECT position FROM streams.replay(from_tx => '{x20001}')"), 20001),
            ("SELECT position FROM streams.get(20000)".to_owned(), 20000),
            ("SELECT position FROM streams.get(25000)".to_owned(), 25000),
        ] {
            let got: Vec<i64> =
                client.query(&read, &[]).unwrap_or_else(|e| panic!("{read}: {e}")).iter().map(|r| r.get(0)).collect();
            assert_eq!(got.first(), Some(&first), "{read}");
        }
    }
    let cut_at: Option<String> = c.query_one("SELECT cut_at::text FROM streams.storage", &[]).unwrap().get(0);
    assert!(cut_at.is_some());

    // A subscription cannot start below the cut either (it would read on
    // from the first kept position as if nothing were missing).
    for (args, why) in [
        ("after => 0".to_owned(), "from the start"),
        ("after => 19998".to_owned(), "one below the first kept"),
        (format!("since => '{t15000}'"), "since a removed event's time"),
        (format!("from_tx => '{x5000}'"), "from a removed transaction"),
    ] {
        let err = r
            .batch_execute(&format!("SELECT streams.create_subscription('below', 'orders', {args})"))
            .expect_err(&args);
        assert_eq!(sqlstate(&err), "LS001", "create_subscription {why}: {err}");
    }
    let none: i64 = c.query_one("SELECT count(*) FROM streams.subscriptions WHERE name = 'below'", &[]).unwrap().get(0);
    assert_eq!(none, 0, "nothing created");
    r.batch_execute("SELECT streams.create_subscription('kept', 'orders', after => 19999)").unwrap();
    assert_eq!(consume(&mut r, "kept", 3), [20000, 20001, 20002]);
    r.batch_execute("SELECT streams.create_subscription('now', 'orders')").unwrap();
}

// --- 5. the gateway ------------------------------------------------------------

/// The gateway's catch-up below the cut answers HTTP 410 with LS001 and the
/// first kept position, never a shorter page; from that position on it
/// reads as before.
#[test]
fn the_gateways_catch_up_below_the_cut_is_410_with_ls001() {
    let s = common::gateway::Setup::new(&[]);
    let mut c = s.db.connect();
    c.batch_execute("SELECT streams.set_partition_size(10000)").unwrap();
    let pay = publish_many(&mut c, "pay.a", 25_000, 5000);
    c.batch_execute("SELECT streams.set_retention(max_age => '0 seconds')").unwrap();
    wait_for_cut(&mut c, 20000);
    let auth = format!("Bearer {}", common::gateway::token(&s.reader.name));
    let headers = [("Authorization", auth.as_str())];
    for path in ["/v1/streams/pay.*/events?after=0", "/v1/streams/pay.a/events?after=19998&max_events=10"] {
        let (status, text) = s.gateway.request("GET", path, &headers, "");
        assert_eq!(status, 410, "{path}: {text}");
        let error: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(error["sqlstate"], "LS001", "{path}: {error}");
        assert!(error["error"].as_str().unwrap().contains("20000"), "{path}: names the first kept position: {error}");
    }
    let path = "/v1/streams/pay.a/events?after=19999&max_events=10";
    let (status, text) = s.gateway.request("GET", path, &headers, "");
    assert_eq!(status, 200, "{path}: {text}");
    let page: serde_json::Value = serde_json::from_str(&text).unwrap();
    let positions: Vec<i64> = page.as_array().unwrap().iter().map(|e| e["position"].as_i64().unwrap()).collect();
    assert_eq!(positions, pay[19_999..20_009], "{path}");
}

// --- 6. never silently -------------------------------------------------------

/// Transactions commit out of position order: a partition's newest commit
/// need not be its highest position's. The cut's time is the latest commit
/// among the dropped events, so a replay since a time between the two
/// commits gets LS001, not the kept events alone.
#[test]
fn a_replay_since_a_late_commit_below_the_cut_gets_ls001() {
    let db = TestDb::new();
    let mut c = partitioned(&db);
    let mut late = db.connect();
    late.batch_execute("BEGIN").unwrap();
    let held = publish(&mut late, "orders", r#"{"late":true}"#);
    // The rest of the first partition and a little of the second, committed
    // first (not waited for: the held transaction holds the horizon).
    let newest = *publish_batches(&mut c, "orders", 10_500, 5000, "jsonb_build_object('n', g)").last().unwrap();
    std::thread::sleep(Duration::from_millis(20)); // two distinct commit times
    late.batch_execute("COMMIT").unwrap();
    wait_for_horizon(&mut c, newest);
    let t_late: String =
        c.query_one("SELECT time::text FROM streams.events WHERE position = $1", &[&held]).unwrap().get(0);
    let t_high: String =
        c.query_one("SELECT time::text FROM streams.events WHERE position = 9999", &[]).unwrap().get(0);
    assert!(t_late > t_high, "the held event committed last ({t_late} after {t_high})");
    c.batch_execute("SELECT streams.set_retention(max_age => '0 seconds')").unwrap();
    wait_for_cut(&mut c, 10000);
    let err = c.query("SELECT * FROM streams.replay(since => $1::text::timestamptz)", &[&t_late]).expect_err("LS001");
    assert_eq!(sqlstate(&err), "LS001", "{err}");
}

/// With overrides_consumers, a subscription whose dead letters were in a
/// dropped partition is marked (its position is past the cut): its polls
/// fail with LS001 until a seek, as for events it had not processed.
#[test]
fn dropped_dead_letters_mark_their_subscription_lost() {
    let db = TestDb::new();
    let mut c = partitioned(&db);
    let orders = publish_many(&mut c, "orders", 25_000, 5000);
    park_after_5000(&mut c, orders[5000]);
    c.batch_execute("SELECT streams.seek('parked', after => 24000)").unwrap();
    c.batch_execute("SELECT streams.set_retention(max_age => '0 seconds', overrides_consumers => true)").unwrap();
    wait_for_cut(&mut c, 20000);
    let lost: Option<i64> =
        c.query_one("SELECT lost_before FROM streams.subscriptions WHERE name = 'parked'", &[]).unwrap().get(0);
    assert_eq!(lost, Some(20000), "its dead letter went with the partition");
    let err = try_poll(&mut c, "parked", 10).unwrap_err();
    assert_eq!(sqlstate(&err), "LS001", "{err}");
    c.batch_execute("SELECT streams.seek('parked', after => 24000)").unwrap();
    assert_eq!(consume(&mut c, "parked", 10), orders[24_000..24_010]);
}

/// A webhook that holds no partition (disabled after failing for days) and
/// is left below the cut is marked and, resumed, disabled again with the
/// reason: never a delivery that skips what retention removed.
#[test]
fn a_disabled_webhook_left_below_the_cut_is_not_resumed_across_the_gap() {
    let (receiver, db) = local_receiver_and_db(&[("/hook", Behaviour::signed(SECRET))]);
    let mut c = partitioned(&db);
    publish_many(&mut c, "orders", 25_000, 5000);
    c.batch_execute(&format!(
        "SELECT streams.create_webhook('hook', 'orders', '{}', after => 5000, secret => '{SECRET}');
         SELECT streams.pause_webhook('hook');
         -- What the webhook worker does after days of failures.
         UPDATE streams.webhook_state w SET disabled_at = now()
         FROM streams.subscription_state s WHERE s.id = w.subscription AND s.name = 'hook';",
        receiver.url("/hook")
    ))
    .unwrap();
    c.batch_execute("SELECT streams.set_retention(max_age => '0 seconds')").unwrap();
    wait_for_cut(&mut c, 20000);
    c.batch_execute("SELECT streams.resume_webhook('hook')").unwrap();
    wait_until("the webhook worker disables it with the reason", WORKER, || {
        let row = c.query_one("SELECT state, last_error FROM streams.webhooks WHERE name = 'hook'", &[]).unwrap();
        let (state, error): (String, Option<String>) = (row.get(0), row.get(1));
        state == "disabled" && error.is_some_and(|e| e.contains("retention removed") && e.contains("20000"))
    });
    assert_eq!(receiver.requests("/hook").len(), 0, "nothing was delivered across the gap");
}

/// The position sequence moved far ahead (`setval`, which pg_write_all_data
/// may run): the worker's count per stream crosses the gap in one step
/// instead of walking it 50,000 positions at a time (it would take days),
/// and retention, which drops only what the count has passed, then keeps
/// the head of a stream whose events it removed: stream_head names its last
/// event and expected_prev => 0 fails.
#[test]
fn a_sequence_moved_far_ahead_is_counted_across_the_gap() {
    let db = TestDb::new();
    let mut c = partitioned(&db);
    publish(&mut c, "es.before", "{}");
    c.batch_execute("SELECT setval('streams.position_seq', 1000000000000)").unwrap();
    let head = [publish(&mut c, "es.after", "{}"), publish(&mut c, "es.after", "{}")][1];
    assert!(head > 1_000_000_000_000, "{head}");
    publish_many(&mut c, "orders", 25_000, 5000);
    wait_until("the worker counts es.after, past the gap", WORKER, || {
        c.query_opt("SELECT last_position FROM streams.streams WHERE stream = 'es.after'", &[])
            .unwrap()
            .is_some_and(|r| r.get::<_, i64>(0) == head)
    });
    c.batch_execute("SELECT streams.set_retention(max_age => '0 seconds')").unwrap();
    // streams.storage alone: first_position() compares it with streams.status,
    // which a drop between the two reads would fail.
    wait_until("retention cuts above es.after's events", WORKER, || {
        c.query_one("SELECT first_position FROM streams.storage", &[]).unwrap().get::<_, Option<i64>>(0) > Some(head)
    });
    let now: i64 = c.query_one("SELECT streams.stream_head('es.after')", &[]).unwrap().get(0);
    assert_eq!(now, head, "the head of a stream retention emptied, across the gap");
    let err = c.query_one("SELECT streams.publish('es.after', '{}', expected_prev => 0)", &[]).expect_err("not new");
    assert_eq!(sqlstate(&err), "40001", "{err}");
}

/// A stream whose every event retention removed still has a head: an
/// append that expects it to be new (expected_prev => 0) fails with 40001
/// naming its last event, and one that expects that event goes in.
#[test]
fn a_stream_whose_events_were_all_removed_is_not_new() {
    let db = TestDb::new();
    let mut c = partitioned(&db);
    let gone: Vec<i64> = (0..3).map(|i| publish(&mut c, "gone.s", &format!("{{\"i\":{i}}}"))).collect();
    publish_many(&mut c, "orders", 25_000, 5000);
    wait_until("the worker counts gone.s", WORKER, || {
        c.query_opt("SELECT last_position FROM streams.streams WHERE stream = 'gone.s'", &[])
            .unwrap()
            .is_some_and(|r| r.get::<_, i64>(0) == gone[2])
    });
    c.batch_execute("SELECT streams.set_retention(max_age => '0 seconds')").unwrap();
    wait_for_cut(&mut c, 20000);
    let err = c.query_one("SELECT streams.publish('gone.s', '{}', expected_prev => 0)", &[]).expect_err("not new");
    assert_eq!(sqlstate(&err), "40001", "{err}");
    let detail = err.as_db_error().and_then(|e| e.detail()).unwrap_or_default().to_owned();
    assert!(detail.contains(&gone[2].to_string()), "names its last event: {detail}");
    // stream_head says so too, and a writer that appends from it succeeds.
    let head: i64 = c.query_one("SELECT streams.stream_head('gone.s')", &[]).unwrap().get(0);
    assert_eq!(head, gone[2], "the head of a stream retention emptied is its last event");
    let p: i64 = c
        .query_one("SELECT streams.publish('gone.s', '{}', expected_prev => streams.stream_head('gone.s'))", &[])
        .unwrap()
        .get(0);
    assert!(p > 25_000);
    wait_for_horizon(&mut c, p);
    let head: i64 = c.query_one("SELECT streams.stream_head('gone.s')", &[]).unwrap().get(0);
    assert_eq!(head, p, "then its new event, once final");
    // A stream that never had an event is new, after the cut as before.
    c.query_one("SELECT streams.publish('fresh.s', '{}', expected_prev => 0)", &[]).unwrap();
}
