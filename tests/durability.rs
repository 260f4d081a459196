//! Final means durable (issue 22): an event becomes final (visible,
//! notified) only once its commit record is flushed, so a crash never takes
//! back an event a reader received, and no position a reader saw ever names
//! another event. Publishers with `synchronous_commit = off` are where it
//! used to break: the worker finalised their events before the WAL writer
//! flushed their commits.
#![cfg(feature = "integration")]

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use postgres::fallible_iterator::FallibleIterator;
use serde_json::Value;

/// A server whose publishers commit asynchronously and whose WAL writer
/// waits as long as it may: an asynchronous commit stays in the WAL buffers,
/// lost by a crash, for up to 10 s unless something flushes it.
const ASYNC: [&str; 5] = [
    "shared_preload_libraries = 'litebase_streams'",
    "track_commit_timestamp = on",
    "synchronous_commit = off",
    "wal_writer_delay = '10s'",
    "autovacuum = off",
];

/// Kill the server (`-m immediate`: every process exits at once, the WAL
/// buffers are not written) while four asynchronous publishers run and a
/// listener takes notifications; after recovery, every event the listener
/// received is there, with the data it received. Three rounds.
#[test]
fn an_async_commit_crash_takes_back_no_event_a_listener_received() {
    let cluster = ScratchCluster::start("async-crash", &ASYNC);
    cluster.connect("postgres").batch_execute("CREATE DATABASE app").unwrap();
    cluster.connect("app").batch_execute("CREATE EXTENSION litebase_streams").unwrap();
    let mut received: BTreeMap<i64, Value> = BTreeMap::new();
    for round in 0..3 {
        cluster.wait_for_worker("app");
        let got: Arc<Mutex<BTreeMap<i64, Value>>> = Arc::default();
        let listening = Arc::new(AtomicBool::new(false));
        let listener = {
            let (config, got, listening) = (cluster.config("app"), got.clone(), listening.clone());
            std::thread::spawn(move || {
                let mut client = connect_retrying(&config);
                client.batch_execute("LISTEN orders").unwrap();
                listening.store(true, Ordering::Release);
                let mut notifications = client.notifications();
                let mut it = notifications.blocking_iter();
                while let Ok(Some(n)) = it.next() {
                    let event: Value = serde_json::from_str(n.payload()).unwrap();
                    got.lock().unwrap().insert(event["position"].as_i64().unwrap(), event["data"].clone());
                }
            })
        };
        wait_until("the listener listens", Duration::from_secs(10), || listening.load(Ordering::Acquire));
        let publishers: Vec<_> = (0..4)
            .map(|p| {
                let config = cluster.config("app");
                std::thread::spawn(move || {
                    let mut client = connect_retrying(&config);
                    for n in 0.. {
                        let data = format!(r#"{{"round":{round},"publisher":{p},"n":{n}}}"#);
                        if client.execute("SELECT streams.publish('orders', $1::text::jsonb)", &[&data]).is_err() {
                            return; // the server went away
                        }
                    }
                })
            })
            .collect();
        wait_until("the listener received events", Duration::from_secs(20), || got.lock().unwrap().len() >= 2000);
        cluster.restart("immediate");
        for publisher in publishers {
            publisher.join().unwrap();
        }
        listener.join().unwrap();
        received.append(&mut got.lock().unwrap());

        let mut c = cluster.connect("app");
        let stored: BTreeMap<i64, Value> = c
            .query("SELECT position, data::text FROM streams.event_log", &[])
            .unwrap()
            .iter()
            .map(|r| (r.get(0), serde_json::from_str(r.get::<_, &str>(1)).unwrap()))
            .collect();
        let missing: Vec<i64> = received.keys().filter(|p| !stored.contains_key(p)).copied().collect();
        assert!(missing.is_empty(), "round {round}: received events gone after the crash: {missing:?}");
        let replaced: Vec<i64> =
            received.iter().filter(|(p, data)| stored.get(p) != Some(data)).map(|(p, _)| *p).collect();
        assert!(replaced.is_empty(), "round {round}: received positions that now hold other events: {replaced:?}");
    }
}

/// With synchronous replication configured and its standby absent, a
/// publishing commit waits for the standby after its commit record is
/// written. `hold_timeout` used to terminate it (its client then saw the
/// connection break after "already committed locally", and a retry published
/// twice). It is never terminated now, and its event becomes final only once
/// replication is satisfied (here: once the operator stops requiring it).
#[test]
fn hold_timeout_never_terminates_a_commit_waiting_for_synchronous_replication() {
    let cluster = ScratchCluster::start(
        "sync-rep",
        &[
            "shared_preload_libraries = 'litebase_streams'",
            "track_commit_timestamp = on",
            "litebase_streams.hold_timeout = '500ms'",
        ],
    );
    let mut admin_c = cluster.connect("postgres");
    admin_c.batch_execute("CREATE DATABASE app").unwrap();
    let mut app = cluster.connect("app");
    app.batch_execute("CREATE EXTENSION litebase_streams").unwrap();
    cluster.wait_for_worker("app");
    let first = publish(&mut app, "orders", PAYMENT);
    wait_for_horizon(&mut app, first);
    let before = horizon(&mut app);
    // Now require a standby that is not there.
    admin_c.batch_execute("ALTER SYSTEM SET synchronous_standby_names = 'absent_standby'").unwrap();
    admin_c.batch_execute("SELECT pg_reload_conf()").unwrap();
    wait_until("the setting is reloaded", Duration::from_secs(10), || {
        let value: String = app.query_one("SHOW synchronous_standby_names", &[]).unwrap().get(0);
        value == "absent_standby"
    });

    let config = cluster.config("app");
    let publisher = std::thread::spawn(move || {
        let mut c = connect_retrying(&config);
        let pid: i32 = c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
        let committed = c.batch_execute("BEGIN; SELECT streams.publish('orders', '{\"n\":1}'); COMMIT");
        (pid, committed.map_err(|e| e.to_string()))
    });
    // The commit waits for the standby, well past hold_timeout, while the
    // worker keeps running rounds.
    let rounds =
        |c: &mut postgres::Client| -> i64 { c.query_one("SELECT rounds FROM streams.status", &[]).unwrap().get(0) };
    let mut waiting_since_rounds = None;
    wait_until("the publishing commit waits for synchronous replication for 3 s", Duration::from_secs(20), || {
        let waiting = app
            .query_opt(
                "SELECT now() - state_change > '3s' FROM pg_stat_activity
                 WHERE datname = 'app' AND wait_event = 'SyncRep' AND backend_type = 'client backend'",
                &[],
            )
            .unwrap()
            .map(|r| r.get::<_, bool>(0));
        if waiting.is_some() && waiting_since_rounds.is_none() {
            waiting_since_rounds = Some(rounds(&mut app));
        }
        waiting == Some(true)
    });
    let rounds_since = rounds(&mut app) - waiting_since_rounds.unwrap();
    assert!(rounds_since > 0, "the worker ran rounds while the commit waited");
    assert_eq!(horizon(&mut app), before, "the event is not final before it is replicated");
    assert!(!cluster.server_log().contains("terminating process"), "hold_timeout terminated nobody");
    let waits_for: Option<String> = app.query_one("SELECT holder_waits_for FROM streams.status", &[]).unwrap().get(0);
    assert!(
        waits_for.as_deref().is_some_and(|w| w.starts_with("synchronous replication")),
        "status names why the holder waits: {waits_for:?}"
    );

    // The operator stops requiring the standby: the commit returns, the
    // client learns it committed, and the event becomes final.
    admin_c.batch_execute("ALTER SYSTEM SET synchronous_standby_names = ''").unwrap();
    admin_c.batch_execute("SELECT pg_reload_conf()").unwrap();
    let (_, committed) = publisher.join().unwrap();
    committed.expect("the publishing transaction commits and its client is told so");
    wait_until("the event becomes final", Duration::from_secs(20), || horizon(&mut app) > before);
}
