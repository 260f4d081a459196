//! An event's `time` is its transaction's commit time, or marked as not
//! exact: across a restore into another cluster (whose transaction ids repeat
//! the restored ones), and when the commit timestamps were truncated before
//! the worker recorded them.
//!
//! Each test makes clusters of its own: they stop a worker with SIGSTOP and
//! VACUUM FREEZE every database, which the shared test cluster must not see.
#![cfg(feature = "integration")]

mod common;

use std::process::Command;
use std::time::{Duration, SystemTime};

use common::*;
use postgres::Client;

/// Settings for a throwaway cluster that commits fast.
/// Autovacuum is off so that nothing else takes transaction ids.
const FAST: [&str; 5] = [
    "shared_preload_libraries = 'litebase_streams'",
    "track_commit_timestamp = on",
    "fsync = off",
    "synchronous_commit = off",
    "autovacuum = off",
];

/// Commit `count` transactions that each take a transaction id.
fn burn_transaction_ids(client: &mut Client, count: i64) {
    client
        .batch_execute(&format!(
            "DO $$ BEGIN FOR i IN 1..{count} LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP; END $$"
        ))
        .unwrap();
}

/// The id the next transaction will get (nothing else takes ids meanwhile).
fn next_transaction_id(client: &mut Client) -> i64 {
    client.query_one("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint", &[]).unwrap().get(0)
}

/// (position, tx, time) of every final event.
fn events(client: &mut Client) -> Vec<(i64, i64, SystemTime)> {
    client
        .query("SELECT position, tx::text::bigint, time FROM streams.events ORDER BY position", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

fn publish_in_own_transaction(client: &mut Client, stream: &str) -> (i64, i64) {
    let mut tx = client.transaction().unwrap();
    let row = tx.query_one("SELECT streams.publish($1, '{}'), pg_current_xact_id()::text::bigint", &[&stream]).unwrap();
    tx.commit().unwrap();
    (row.get(0), row.get(1))
}

fn run(program: &str, args: &[String]) {
    let bindir = std::env::var("LITEBASE_STREAMS_PG_BINDIR").unwrap();
    let out = Command::new(format!("{bindir}/{program}")).args(args).output().unwrap();
    assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// pg_dump from one cluster, pg_restore into a fresh one whose transaction
/// counter is lower: a new transaction that gets the id of a restored one
/// gets its own commit time, the restored events keep theirs, `from_tx` and
/// `since` find the new transaction, and an event that was not yet recorded
/// when the dump was taken is marked as having lost its exact time.
#[test]
fn a_restore_into_another_cluster_keeps_each_transactions_commit_time() {
    let source = ScratchCluster::start("restore-source", &FAST);
    source.connect("postgres").batch_execute("CREATE DATABASE app").unwrap();
    let mut src = source.connect("app");
    src.batch_execute("CREATE EXTENSION litebase_streams").unwrap();
    let source_worker = source.wait_for_worker("app");
    // Transaction ids the fresh target cluster will hand out again.
    burn_transaction_ids(&mut src, 2000);
    let published: Vec<(i64, i64)> = (0..200).map(|_| publish_in_own_transaction(&mut src, "orders")).collect();
    let last = published.last().unwrap().0;
    wait_for_horizon(&mut src, last);
    let dump = std::env::temp_dir().join(format!("lbs-restore-{}.dump", std::process::id()));
    let (unrecorded, before) = {
        let _stopped = StoppedWorker::stop(&mut source.connect("postgres"), source_worker);
        let (unrecorded, _) = publish_in_own_transaction(&mut src, "orders");
        let mut args = source.libpq_args();
        args.extend(["-Fc".into(), "-f".into(), dump.to_str().unwrap().into(), "app".into()]);
        run("pg_dump", &args);
        (unrecorded, events(&mut src))
    };
    assert_eq!(before.len(), 200, "the last event is not final in the source while its worker is stopped");

    let target = ScratchCluster::start("restore-target", &FAST);
    target.connect("postgres").batch_execute("CREATE DATABASE app").unwrap();
    let mut args = target.libpq_args();
    args.extend(["-d".into(), "app".into(), dump.to_str().unwrap().into()]);
    run("pg_restore", &args);
    let _ = std::fs::remove_file(&dump);
    let mut dst = target.connect("app");
    let target_worker = target.wait_for_worker("app");
    wait_for_horizon(&mut dst, unrecorded);
    let restored_at = SystemTime::now();

    // The next transaction takes the id of a restored one. The worker is
    // stopped meanwhile: its merge of commit-time rows takes an id too.
    let reused = published[100].1;
    let stopped = StoppedWorker::stop(&mut target.connect("postgres"), target_worker);
    let next = next_transaction_id(&mut dst);
    assert!(next < reused, "the target's counter ({next}) starts below the restored ids ({reused})");
    burn_transaction_ids(&mut dst, reused - next);
    let before_new = SystemTime::now();
    let (position, tx) = publish_in_own_transaction(&mut dst, "orders");
    drop(stopped);
    assert_eq!(tx, reused, "the new transaction reuses the id of a restored one");
    wait_for_horizon(&mut dst, position);

    let after = events(&mut dst);
    assert_eq!(&after[..200], &before[..], "restored events keep their positions, transactions and times");
    let new_time = after.iter().find(|e| e.0 == position).unwrap().2;
    assert!(new_time >= before_new, "the new event has its own commit time, not the restored transaction's");
    let exact: SystemTime =
        dst.query_one("SELECT pg_xact_commit_timestamp($1::text::xid)", &[&tx.to_string()]).unwrap().get(0);
    assert_eq!(new_time, exact);
    let old = before.iter().find(|e| e.1 == tx).unwrap();
    assert_ne!(old.2, new_time, "the restored event with the same id keeps its time");

    let from_tx: Vec<i64> = dst
        .query("SELECT position FROM streams.replay(from_tx => $1::text::xid8)", &[&tx.to_string()])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(from_tx, vec![position], "from_tx names the newest transaction with that id");
    let since: Vec<i64> = dst
        .query("SELECT position FROM streams.replay(since => $1)", &[&before_new])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(since, vec![position], "since finds only what committed after it");

    // The event the source's worker had not recorded: its commit time was
    // the source cluster's, and is gone.
    let row = dst
        .query_one(
            "SELECT NOT EXISTS (SELECT FROM streams.commit_times c WHERE e.position = ANY (c.inexact)), e.time
             FROM streams.events e WHERE e.position = $1",
            &[&unrecorded],
        )
        .unwrap();
    assert!(!row.get::<_, bool>(0), "an event restored before it was recorded is marked as having lost its time");
    assert!(row.get::<_, SystemTime>(1) <= restored_at + Duration::from_secs(1));
    assert!(target.server_log().contains("was lost before it was recorded"), "the worker says so in the log");
}

/// The worker is stopped while events commit, and VACUUM FREEZE of every
/// database truncates the commit timestamps: once back, the worker records
/// the time it recorded them, marks them inexact, and warns.
#[test]
fn commit_times_truncated_before_recording_are_marked_not_exact() {
    let cluster = ScratchCluster::start("commit-ts-truncated", &FAST);
    cluster.connect("postgres").batch_execute("CREATE DATABASE app").unwrap();
    let mut client = cluster.connect("app");
    client.batch_execute("CREATE EXTENSION litebase_streams").unwrap();
    let worker = cluster.wait_for_worker("app");
    let mut admin = cluster.connect("postgres");

    let stopped = StoppedWorker::stop(&mut admin, worker);
    let (lost, tx) = publish_in_own_transaction(&mut client, "orders");
    admin.batch_execute("ALTER DATABASE template0 ALLOW_CONNECTIONS true").unwrap();
    let mut args = cluster.libpq_args();
    args.extend(["--all".into(), "--freeze".into(), "--quiet".into()]);
    run("vacuumdb", &args);
    let truncated: bool =
        client.query_one("SELECT pg_xact_commit_timestamp($1::text::xid) IS NULL", &[&tx.to_string()]).unwrap().get(0);
    assert!(truncated, "VACUUM FREEZE of every database truncated the commit timestamp of {tx}");
    let resumed_at = SystemTime::now();
    drop(stopped);

    wait_for_horizon(&mut client, lost);
    let (position, _) = publish_in_own_transaction(&mut client, "orders");
    wait_for_horizon(&mut client, position);
    let rows = client
        .query(
            "SELECT e.position, e.time,
                    NOT EXISTS (SELECT FROM streams.commit_times c WHERE e.position = ANY (c.inexact))
             FROM streams.events e ORDER BY e.position",
            &[],
        )
        .unwrap();
    let lost_row = rows.iter().find(|r| r.get::<_, i64>(0) == lost).unwrap();
    assert!(!lost_row.get::<_, bool>(2), "the lost commit time is marked");
    assert!(
        lost_row.get::<_, SystemTime>(1) + Duration::from_millis(1) >= resumed_at,
        "it carries the time it was recorded, a bound the commit came before"
    );
    let fine = rows.iter().find(|r| r.get::<_, i64>(0) == position).unwrap();
    assert!(fine.get::<_, bool>(2), "an event recorded in time has its exact commit time");
    let log = cluster.server_log();
    assert!(log.contains("the commit time of 1 event(s) was lost before it was recorded"), "{log}");
}
