//! The extension installs, its worker runs, and a server that is not set up
//! for it says exactly what to add to postgresql.conf.
#![cfg(feature = "integration")]

mod common;

use std::time::Duration;

use common::*;

#[test]
fn extension_installs_into_the_streams_schema() {
    let db = TestDb::new();
    let mut client = db.connect();
    let row = client
        .query_one(
            "SELECT e.extversion, n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
             WHERE e.extname = 'litebase_streams'",
            &[],
        )
        .unwrap();
    assert_eq!(row.get::<_, String>(1), "streams");
    for object in ["streams.events", "streams.status"] {
        let found: bool = client.query_one("SELECT to_regclass($1) IS NOT NULL", &[&object]).unwrap().get(0);
        assert!(found, "{object} exists");
    }
}

#[test]
fn background_worker_is_visible_in_pg_stat_activity() {
    let db = TestDb::new();
    let pid = db.wait_for_worker();
    let mut client = db.connect();
    let status_pid: Option<i32> = client.query_one("SELECT worker_pid FROM streams.status", &[]).unwrap().get(0);
    assert_eq!(status_pid, Some(pid), "streams.status names the worker that pg_stat_activity shows");
}

/// A second, throwaway cluster without the settings: CREATE EXTENSION fails
/// with SQLSTATE 55000, naming both settings and what to add.
#[test]
fn create_extension_without_preload_says_what_to_configure() {
    let cluster = ScratchCluster::start("preload-check", &[]);
    let result = cluster.connect("postgres").batch_execute("CREATE EXTENSION litebase_streams");
    drop(cluster);

    let err = result.expect_err("CREATE EXTENSION must fail without preload");
    assert_eq!(sqlstate(&err), "55000");
    let db_err = err.as_db_error().unwrap();
    assert!(db_err.message().contains("shared_preload_libraries"), "{}", db_err.message());
    assert!(db_err.message().contains("track_commit_timestamp"), "{}", db_err.message());
    let hint = db_err.hint().expect("a hint says what to add");
    assert!(hint.contains("shared_preload_libraries = 'litebase_streams'"), "{hint}");
    assert!(hint.contains("track_commit_timestamp = on"), "{hint}");
    assert!(hint.contains("postgresql.conf"), "{hint}");
}

/// DROP EXTENSION succeeds while the worker runs; the worker leaves; CREATE
/// EXTENSION again brings delivery back without a restart.
#[test]
fn drop_extension_then_create_again_delivers() {
    let db = TestDb::new();
    let first_worker = db.wait_for_worker();
    let mut c = db.connect();
    publish(&mut c, "orders", "{}");
    c.batch_execute("DROP EXTENSION litebase_streams").expect("DROP EXTENSION succeeds");

    let mut admin = admin();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while admin.query_opt("SELECT 1 FROM pg_stat_activity WHERE pid = $1", &[&first_worker]).unwrap().is_some() {
        assert!(std::time::Instant::now() < deadline, "the worker of a dropped extension leaves");
        std::thread::sleep(Duration::from_millis(50));
    }

    c.batch_execute("CREATE EXTENSION litebase_streams").unwrap();
    db.wait_for_worker();
    let mut listener = Listener::new(&db, &["orders"]);
    let p = publish(&mut c, "orders", r#"{"again":true}"#);
    let got = listener.collect(1, Duration::from_secs(10));
    assert_eq!(got.len(), 1, "delivery works after CREATE EXTENSION");
    assert_eq!(got[0]["position"].as_i64(), Some(p));
}
