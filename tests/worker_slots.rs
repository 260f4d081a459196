//! Every database with the extension needs a background worker slot. When
//! none is free the failure is loud (CREATE EXTENSION and publish warn with
//! SQLSTATE 53000, `streams.status` says `no worker slot`), and the launcher
//! keeps trying: the database gets its worker as soon as a slot frees up.
//!
//! A test binary of its own: it takes every worker slot of the cluster.
#![cfg(feature = "integration")]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use postgres::Client;

/// A client on `db` that keeps the SQLSTATEs of the warnings it receives.
fn connect_collecting_warnings(db: &TestDb) -> (Client, Arc<Mutex<Vec<String>>>) {
    let warnings = Arc::new(Mutex::new(Vec::new()));
    let sink = warnings.clone();
    let mut config = db.config();
    config.notice_callback(move |notice| sink.lock().unwrap().push(notice.code().code().to_owned()));
    (config.connect(postgres::NoTls).expect("connect"), warnings)
}

#[test]
fn a_database_without_a_worker_slot_says_so_and_gets_one_when_a_slot_frees() {
    // Take every slot: databases with the extension, until one finds none.
    let mut holders = Vec::new();
    let (starved, mut client, warnings) = loop {
        let db = TestDb::without_extension();
        let (mut c, warnings) = connect_collecting_warnings(&db);
        c.batch_execute("CREATE EXTENSION litebase_streams").unwrap();
        if warnings.lock().unwrap().iter().any(|code| code == "53000") {
            break (db, c, warnings);
        }
        db.wait_for_worker();
        holders.push(db);
        assert!(holders.len() < 64, "never ran out of worker slots");
    };
    warnings.lock().unwrap().clear();
    let position = publish(&mut client, "orders", "{}");
    assert!(
        warnings.lock().unwrap().iter().any(|code| code == "53000"),
        "publish warns that no worker serves the database"
    );
    let state: String = client.query_one("SELECT worker_state FROM streams.status", &[]).unwrap().get(0);
    assert_eq!(state, "no worker slot");

    // One slot frees up: the launcher starts the worker, the event becomes visible.
    drop(holders.pop());
    wait_until("the starved database gets its worker", Duration::from_secs(30), || {
        client.query_one("SELECT worker_pid FROM streams.status", &[]).unwrap().get::<_, Option<i32>>(0).is_some()
    });
    wait_for_horizon(&mut client, position);
    warnings.lock().unwrap().clear();
    publish(&mut client, "orders", "{}");
    assert!(warnings.lock().unwrap().is_empty(), "no warning once a worker runs");
    drop(starved);
}

/// DROP EXTENSION gives the database's shared-memory entry back (issue 22).
/// A server has one entry per `max_worker_processes`; each database whose
/// extension was created and dropped used to keep one for good, so after a
/// few such databases a new one found the table full and got no worker
/// while slots were free, and the log blamed `max_worker_processes`.
#[test]
fn dropping_the_extension_frees_the_database_entry_for_another_database() {
    // Four entries: three databases created and dropped would take them all
    // (the fourth goes to the first database that still has the extension).
    let cluster = ScratchCluster::start(
        "entries",
        &["shared_preload_libraries = 'litebase_streams'", "track_commit_timestamp = on", "max_worker_processes = 4"],
    );
    let mut admin = cluster.connect("postgres");
    for i in 0..6 {
        let name = format!("dropped_{i}");
        admin.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
        let mut client = cluster.connect(&name);
        client.batch_execute("CREATE EXTENSION litebase_streams").unwrap();
        let position = publish(&mut client, "orders", "{}");
        wait_for_horizon(&mut client, position);
        client.batch_execute("DROP EXTENSION litebase_streams").unwrap();
        wait_until(&format!("the worker of {name} leaves"), Duration::from_secs(20), || {
            admin
                .query("SELECT FROM pg_stat_activity WHERE backend_type = 'litebase_streams worker'", &[])
                .unwrap()
                .is_empty()
        });
    }
    admin.batch_execute("CREATE DATABASE fresh").unwrap();
    let mut client = cluster.connect("fresh");
    client.batch_execute("CREATE EXTENSION litebase_streams").unwrap();
    let position = publish(&mut client, "orders", "{}");
    wait_for_horizon(&mut client, position);
    let state: String = client.query_one("SELECT worker_state FROM streams.status", &[]).unwrap().get(0);
    assert_ne!(state, "no worker slot");
    assert!(
        !cluster.server_log().contains("more databases with the extension than max_worker_processes"),
        "the log blames max_worker_processes although slots are free"
    );
}
