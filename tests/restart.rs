//! Tests that stop and start the shared dev cluster or change its settings.
//! Cargo runs test binaries one at a time, but the tests of one binary in
//! parallel: every test here holds SERVER, so two of them never overlap.
#![cfg(feature = "integration")]

mod common;

use std::sync::Mutex;
use std::time::Duration;

use common::{horizon, json, publish, wait_for_horizon, Listener, TestDb};
use postgres::Client;
use serde_json::Value;

static SERVER: Mutex<()> = Mutex::new(());

/// (position, stream, tx, time in UTC with microseconds, data as text)
type Row = (i64, String, i64, String, String);

fn final_events(client: &mut Client) -> Vec<Row> {
    client
        .query(
            r#"SELECT position, stream, tx::text::bigint,
                      to_char(time AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                      data::text
               FROM streams.events ORDER BY position"#,
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect()
}

#[test]
fn immediate_shutdown_keeps_every_committed_event() {
    let _server = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let db = TestDb::new();
    let mut client = db.connect();
    let pid_before = db.wait_for_worker();

    // Committed and final before the crash: 30 transactions of 1 to 3 events.
    let mut published: Vec<(i64, String, String)> = Vec::new();
    for t in 0..30 {
        let mut tx = client.transaction().unwrap();
        for e in 0..(1 + t % 3) {
            let stream = if e % 2 == 0 { "ledger.credit" } else { "ledger.debit" };
            let data = format!(r#"{{"t":{t},"e":{e},"amount":{t}.{e}0}}"#);
            let position: i64 =
                tx.query_one("SELECT streams.publish($1, $2::text::jsonb)", &[&stream, &data]).unwrap().get(0);
            published.push((position, stream.to_owned(), data));
        }
        tx.commit().unwrap();
    }
    let last_final = published.last().unwrap().0;
    wait_for_horizon(&mut client, last_final);
    let before = final_events(&mut client);
    assert_eq!(
        before.iter().map(|r| r.0).collect::<Vec<_>>(),
        published.iter().map(|p| p.0).collect::<Vec<_>>(),
        "streams.events before the crash"
    );

    // An open publishing transaction: lost in the crash. It holds the horizon
    // back, so the events committed after it are committed but not yet final.
    let mut open = db.connect();
    open.batch_execute("BEGIN").unwrap();
    let lost = publish(&mut open, "ledger.credit", r#"{"lost":true}"#);
    let mut held_back: Vec<(i64, String)> = Vec::new();
    for k in 0..5 {
        let data = format!(r#"{{"after_open":{k}}}"#);
        held_back.push((publish(&mut client, "ledger.debit", &data), data));
    }
    std::thread::sleep(Duration::from_millis(300));
    let h = horizon(&mut client);
    assert!(h < lost, "horizon {h} passed the open transaction's position {lost}");
    assert!(h >= last_final);
    let all_committed: Vec<i64> = published.iter().map(|p| p.0).chain(held_back.iter().map(|p| p.0)).collect();
    let highest_before = *all_committed.iter().chain([&lost]).max().unwrap();

    common::pg_ctl(&["stop", "-m", "immediate"]);
    common::pg_ctl(&["start"]);
    drop(open);
    drop(client);

    // The worker comes back by itself (the launcher starts it at server start).
    let mut client = db.connect();
    let pid = db.wait_for_worker();
    assert_ne!(pid, pid_before, "pg_stat_activity still shows the worker from before the crash");
    let last_committed = held_back.last().unwrap().0;
    wait_for_horizon(&mut client, last_committed);

    let after = final_events(&mut client);
    let (kept, rest) = after.split_at(before.len().min(after.len()));
    assert_eq!(kept, &before[..], "events final before the crash changed or went missing");
    let rest_summary: Vec<(i64, String, Value)> = rest.iter().map(|r| (r.0, r.1.clone(), json(&r.4))).collect();
    let expected_rest: Vec<(i64, String, Value)> =
        held_back.iter().map(|(p, d)| (*p, "ledger.debit".to_owned(), json(d))).collect();
    assert_eq!(rest_summary, expected_rest, "events committed behind the open transaction after the crash");
    for (position, _, data) in &published {
        let row = before.iter().find(|r| r.0 == *position).unwrap();
        assert_eq!(json(&row.4), json(data), "data of position {position}");
    }
    let lost_rows: i64 =
        client.query_one("SELECT count(*) FROM streams.event_log WHERE position = $1", &[&lost]).unwrap().get(0);
    assert_eq!(lost_rows, 0, "the uncommitted event at {lost} survived the crash");

    // Publishing goes on above every position handed out before, and is delivered live.
    let mut listener = Listener::new(&db, &["ledger.credit"]);
    let fresh = publish(&mut client, "ledger.credit", r#"{"after_restart":true}"#);
    assert!(fresh > highest_before, "new position {fresh} is not above {highest_before}");
    let (channel, payload) =
        listener.next(Duration::from_secs(10)).expect("no notification for an event published after the restart");
    assert_eq!(channel, "ledger.credit");
    let payload = json(&payload);
    assert_eq!(payload["position"].as_i64(), Some(fresh), "payload: {payload}");
    assert_eq!(payload["data"], json(r#"{"after_restart":true}"#));
    wait_for_horizon(&mut client, fresh);
    let positions: Vec<i64> = final_events(&mut client).iter().map(|r| r.0).collect();
    let expected: Vec<i64> = all_committed.iter().copied().chain([fresh]).collect();
    assert_eq!(positions, expected, "streams.events after the restart");
}

/// Puts a server setting back when the test ends, even if it fails.
struct ResetSetting(&'static str);

impl Drop for ResetSetting {
    fn drop(&mut self) {
        let mut admin = common::admin();
        let _ = admin.batch_execute(&format!("ALTER SYSTEM RESET {}", self.0));
        let _ = admin.batch_execute("SELECT pg_reload_conf()");
    }
}

/// With `litebase_streams.batch_size` far below the backlog, the worker
/// delivers in many rounds, each persisting the horizon at its last event:
/// every event still arrives exactly once, in order.
#[test]
fn small_batches_deliver_everything_once_in_order() {
    let _server = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let mut admin = common::admin();
    admin.batch_execute("ALTER SYSTEM SET litebase_streams.batch_size = 7").unwrap();
    let _reset = ResetSetting("litebase_streams.batch_size");
    admin.batch_execute("SELECT pg_reload_conf()").unwrap();

    let db = TestDb::new();
    let mut listener = Listener::new(&db, &["bulk"]);
    let mut client = db.connect();
    let shown: String = client.query_one("SHOW litebase_streams.batch_size", &[]).unwrap().get(0);
    assert_eq!(shown, "7");
    let mut expected: Vec<i64> = client
        .query("SELECT streams.publish_batch('bulk', array_agg(jsonb_build_object('i', i))) FROM generate_series(1, 100) i", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    expected.push(publish(&mut client, "bulk", r#"{"i":101}"#));

    let received: Vec<i64> = listener.positions(expected.len(), Duration::from_secs(20));
    assert_eq!(received, expected);
    assert!(listener.next(Duration::from_millis(300)).is_none(), "nothing twice");
    assert_eq!(horizon(&mut client), *expected.last().unwrap());
}
