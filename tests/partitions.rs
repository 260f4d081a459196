//! The partitioned log (issue 27), against the real server: partitions of
//! the size set, contiguous, made ahead of need by the worker; replay and
//! get the same across them; every partition as immutable as the log (also
//! one an operator attaches, also to superusers); the predefined data roles
//! read and forge nothing through a partition; archive to a tablespace the
//! test makes, row for row unchanged; pg_dump and pg_restore of a
//! partitioned log. Retention is in tests/retention.rs.
#![cfg(feature = "integration")]

mod common;

use std::time::{Duration, SystemTime};

use common::*;
use postgres::Client;

/// The worker acts with its maintenance, every 5 s.
const WORKER: Duration = Duration::from_secs(60);

/// Partitions of 10,000 positions (the smallest size allowed), set before
/// the first publish makes the first one.
fn partitioned_db() -> (TestDb, Client) {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute("SELECT streams.set_partition_size(10000)").unwrap();
    (db, c)
}

/// Wait until the worker made a partition ahead of the active one.
fn wait_for_ahead(c: &mut Client) -> Vec<Partition> {
    let mut seen = Vec::new();
    wait_until("the worker makes a partition ahead", WORKER, || {
        seen = partitions(c);
        seen.iter().any(|p| p.state == "ahead")
    });
    seen
}

/// What the leaf partitions of the log are, as PostgreSQL sees them.
fn leaf_partitions(c: &mut Client) -> Vec<String> {
    c.query("SELECT relid::text FROM pg_partition_tree('streams.event_log') WHERE isleaf ORDER BY relid::text", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

// --- 1. partitions ----------------------------------------------------------

#[test]
fn the_log_is_split_into_contiguous_partitions_the_worker_makes_ahead() {
    let db = TestDb::new();
    let mut c = db.connect();
    assert!(partitions(&mut c).is_empty(), "a fresh CREATE EXTENSION has no partition");
    let size: i64 = c.query_one("SELECT partition_size FROM streams.storage", &[]).unwrap().get(0);
    assert_eq!(size, 1_000_000, "the default partition size");
    for bad in ["9999", "0", "-1", "NULL"] {
        let err = c.batch_execute(&format!("SELECT streams.set_partition_size({bad})")).unwrap_err();
        assert_eq!(sqlstate(&err), "22023", "set_partition_size({bad}): {err}");
    }
    c.batch_execute("SELECT streams.set_partition_size(10000)").unwrap();
    let size: i64 = c.query_one("SELECT partition_size FROM streams.storage", &[]).unwrap().get(0);
    assert_eq!(size, 10000);

    // 25,000 events: two full partitions and the active third, past its half.
    let mut positions = publish_many(&mut c, "orders", 12_000, 4000);
    positions.extend(publish_many(&mut c, "payments", 13_000, 4000));
    let newest = *positions.last().unwrap();
    let seen = wait_for_ahead(&mut c);

    // Contiguous ranges of 10,000 from the start, named by their lower bound.
    assert_eq!(seen[0].first_position, None, "the first partition starts at MINVALUE: {seen:?}");
    assert_eq!(seen[0].name, "streams.event_log_0");
    assert_eq!(seen[0].end_position, 10000);
    for pair in seen.windows(2) {
        let (below, above) = (&pair[0], &pair[1]);
        assert_eq!(above.first_position, Some(below.end_position), "contiguous: {seen:?}");
        assert_eq!(above.end_position - below.end_position, 10000, "each 10,000 wide: {seen:?}");
        assert_eq!(above.name, format!("streams.event_log_{}", below.end_position));
    }
    // States: full below the newest position, active holding it, ahead above.
    for p in &seen {
        let holds_newest = p.first_position.unwrap_or(i64::MIN) <= newest && newest < p.end_position;
        let expected = if holds_newest {
            "active"
        } else if p.end_position <= newest {
            "full"
        } else {
            "ahead"
        };
        assert_eq!(p.state, expected, "{p:?} (newest position {newest})");
        assert_eq!(p.tablespace, None, "{p:?}");
        assert!(p.size > 0, "{p:?}");
    }
    assert_eq!(seen.iter().filter(|p| p.state == "full").count(), 2, "{seen:?}");
    assert_eq!(seen.iter().filter(|p| p.state == "active").count(), 1, "{seen:?}");
    let full_size = seen[0].size;
    let ahead_size = seen.iter().find(|p| p.state == "ahead").unwrap().size;
    assert!(full_size > ahead_size, "a full partition is larger than an empty one: {seen:?}");
    let (oldest, newest_time): (Option<String>, Option<String>) = c
        .query_one(
            "SELECT oldest_time::text, newest_time::text FROM streams.partitions WHERE first_position IS NULL",
            &[],
        )
        .map(|r| (r.get(0), r.get(1)))
        .unwrap();
    let times: (String, String) = c
        .query_one("SELECT min(time)::text, max(time)::text FROM streams.events WHERE position < 10000", &[])
        .map(|r| (r.get(0), r.get(1)))
        .unwrap();
    assert_eq!((oldest, newest_time), (Some(times.0), Some(times.1)), "commit times of its first and last events");

    // The view names what PostgreSQL has, and every row is in its range.
    let mut names: Vec<String> = seen.iter().map(|p| p.name.clone()).collect();
    names.sort();
    assert_eq!(leaf_partitions(&mut c), names);
    let misplaced: i64 = c
        .query_one(
            "SELECT count(*) FROM streams.event_log e JOIN streams.partitions p ON p.partition = e.tableoid::regclass
             WHERE e.position < coalesce(p.first_position, 0) OR e.position >= p.end_position",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(misplaced, 0);
    let used: i64 = c.query_one("SELECT count(DISTINCT tableoid) FROM streams.event_log", &[]).unwrap().get(0);
    assert_eq!(used, 3, "the events are spread over three partitions");

    // Replay returns every position once, in order, across the partitions;
    // a stream's replay and get too.
    let replayed = event_positions(&mut c, "SELECT position FROM streams.replay(after => 0, max_events => 100000)");
    assert_eq!(replayed, positions);
    let payments =
        event_positions(&mut c, "SELECT position FROM streams.replay('payments', after => 0, max_events => 100000)");
    assert_eq!(payments, positions[12_000..]);
    let paged = event_positions(&mut c, "SELECT position FROM streams.replay(after => 9990, max_events => 20)");
    let expected: Vec<i64> = positions.iter().copied().filter(|&p| p > 9990).take(20).collect();
    assert_eq!(paged, expected, "a page across a partition boundary");
    for p in around_boundaries(&positions, &[10000, 20000]) {
        let got: Option<i64> = c.query_one("SELECT (streams.get($1)).position", &[&p]).unwrap().get(0);
        assert_eq!(got, Some(p), "get({p})");
    }

    // Publishing on into the partition made ahead: the worker makes the next.
    let ahead = seen.iter().find(|p| p.state == "ahead").unwrap().clone();
    let more = publish_many(&mut c, "orders", (ahead.first_position.unwrap() + 6000 - newest) as usize, 4000);
    wait_until("the worker makes the partition after the one it made ahead", WORKER, || {
        partitions(&mut c).iter().any(|p| p.first_position == Some(ahead.end_position) && p.state == "ahead")
    });
    let now = partitions(&mut c);
    let active = now.iter().find(|p| p.state == "active").unwrap();
    assert_eq!(active.name, ahead.name, "{now:?}");
    let last = *more.last().unwrap();
    let got: Option<i64> = c.query_one("SELECT (streams.get($1)).position", &[&last]).unwrap().get(0);
    assert_eq!(got, Some(last));
}

/// A replay from a time or a transaction finds its start position once per
/// query, when it runs: not once per partition while it is planned (the
/// planner estimates with a stable expression's value, so a start written as
/// one ran its lookup for every partition of the log, 40 ms at 50
/// partitions), and its answer is the same as on one partition.
#[test]
fn a_replay_from_a_time_or_a_transaction_looks_its_start_up_once() {
    let (_db, mut c) = partitioned_db();
    let early = publish_many(&mut c, "orders", 25_000, 5000);
    // A transaction of 5,000 events: its first one is where both start.
    let row = c.query_one("SELECT time, tx::text FROM streams.events WHERE position = $1", &[&early[12_345]]).unwrap();
    let (since, tx): (SystemTime, String) = (row.get(0), row.get(1));
    let late = publish_many(&mut c, "orders", 10_000, 5000);
    wait_for_horizon(&mut c, *late.last().unwrap());
    assert!(leaf_partitions(&mut c).len() >= 4, "{:?}", leaf_partitions(&mut c));
    // Counted in this transaction's function statistics.
    c.batch_execute("BEGIN; SET LOCAL track_functions = 'all'").unwrap();
    let lookups = |c: &mut Client| -> i64 {
        c.query_one(
            "SELECT coalesce(pg_stat_get_xact_function_calls('streams._replay_start(timestamptz, xid8)'::regprocedure), 0)",
            &[],
        )
        .unwrap()
        .get(0)
    };
    let first = early[10_000];
    let since: String = c.query_one("SELECT $1::timestamptz::text", &[&since]).unwrap().get(0);
    for (start, arg) in [("since => $1::text::timestamptz", since), ("from_tx => $1::text::xid8", tx)] {
        let before = lookups(&mut c);
        c.query(&format!("EXPLAIN SELECT * FROM streams.replay({start}, max_events => 10)"), &[&arg]).unwrap();
        assert_eq!(lookups(&mut c), before, "planning {start} looks nothing up");
        let got: Vec<i64> = c
            .query(&format!("SELECT position FROM streams.replay({start}, max_events => 3)"), &[&arg])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(lookups(&mut c), before + 1, "running {start} looks its start up once");
        assert_eq!(got.first(), Some(&first), "{start}: {got:?}");
        assert_eq!(got.len(), 3);
    }
    c.batch_execute("COMMIT").unwrap();
}

/// The first and last of `positions` and those on either side of each of `boundaries`.
fn around_boundaries(positions: &[i64], boundaries: &[i64]) -> Vec<i64> {
    let mut picked = vec![positions[0], *positions.last().unwrap()];
    for &boundary in boundaries {
        picked.extend(positions.iter().copied().rfind(|&p| p < boundary));
        picked.extend(positions.iter().copied().find(|&p| p >= boundary));
    }
    picked
}

// --- 2. immutability -------------------------------------------------------

/// `sql` fails with 55000 (the immutability error).
fn refused(c: &mut Client, sql: &str) {
    match c.batch_execute(sql) {
        Ok(()) => panic!("{sql} succeeded; the log is immutable"),
        Err(e) => assert_eq!(sqlstate(&e), "55000", "{sql}: {e}"),
    }
    let _ = c.batch_execute("ROLLBACK");
}

#[test]
fn every_partition_refuses_changes_also_to_superusers() {
    let (_db, mut c) = partitioned_db();
    publish_many(&mut c, "orders", 15_000, 5000);
    let before = event_rows(&mut c, &format!("SELECT {EVENT_COLUMNS} FROM streams.events ORDER BY position"));
    for partition in ["streams.event_log_0", "streams.event_log_10000"] {
        for change in [
            format!("UPDATE {partition} SET data = '{{\"forged\": true}}'"),
            format!("DELETE FROM {partition}"),
            format!("DELETE FROM {partition} WHERE position = (SELECT max(position) FROM {partition})"),
            format!("TRUNCATE {partition}"),
            format!("TRUNCATE streams.event_log, {partition}"),
        ] {
            refused(&mut c, &change);
            // Triggers "ENABLE ALWAYS" and the hook: also for replication.
            refused(&mut c, &format!("BEGIN; SET LOCAL session_replication_role = replica; {change}"));
        }
        refused(&mut c, &format!("DROP TABLE {partition}"));
        refused(&mut c, &format!("DROP TABLE IF EXISTS {partition} CASCADE"));
        refused(&mut c, &format!("ALTER TABLE streams.event_log DETACH PARTITION {partition}"));
        refused(&mut c, &format!("ALTER TABLE streams.event_log DETACH PARTITION {partition} CONCURRENTLY"));
        refused(&mut c, &format!("BEGIN; SET LOCAL session_replication_role = replica; DROP TABLE {partition}"));
    }
    let after = event_rows(&mut c, &format!("SELECT {EVENT_COLUMNS} FROM streams.events ORDER BY position"));
    assert_eq!(after.len(), 15_000);
    assert!(after == before, "the events changed");
    let mut names: Vec<String> = partitions(&mut c).iter().map(|p| p.name.clone()).collect();
    names.sort();
    assert_eq!(leaf_partitions(&mut c), names, "no partition dropped or detached");
}

/// A table an operator attaches (a range far above the log's, which the
/// worker never makes) gets row-level security and the immutability of the
/// others.
#[test]
fn a_partition_an_operator_attaches_is_immutable_and_row_secured() {
    let (_db, mut c) = partitioned_db();
    publish_many(&mut c, "orders", 100, 100);
    c.batch_execute(
        "CREATE TABLE streams.event_log_operator (position bigint NOT NULL, stream text COLLATE \"C\" NOT NULL,
                                                 tx xid8 NOT NULL, data jsonb NOT NULL, type text COLLATE \"C\",
                                                 key text COLLATE \"C\", headers jsonb);
         ALTER TABLE streams.event_log ATTACH PARTITION streams.event_log_operator
             FOR VALUES FROM (1000000000000) TO (1000000010000)",
    )
    .unwrap();
    let secured: bool = c
        .query_one("SELECT relrowsecurity FROM pg_class WHERE oid = 'streams.event_log_operator'::regclass", &[])
        .unwrap()
        .get(0);
    assert!(secured, "row-level security is enabled on the attached partition");
    let listed = partitions(&mut c);
    let operator = listed.iter().find(|p| p.name == "streams.event_log_operator").expect("listed");
    assert_eq!((operator.first_position, operator.end_position), (Some(1_000_000_000_000), 1_000_000_010_000));
    assert_eq!(operator.state, "ahead", "{listed:?}");

    // A row in it (never committed: it is no event), then each change.
    let row = "INSERT INTO streams.event_log_operator VALUES (1000000000001, 'orders', '1', '{}')";
    for change in [
        "UPDATE streams.event_log_operator SET data = '{\"forged\": true}'",
        "DELETE FROM streams.event_log_operator",
        "UPDATE streams.event_log SET data = '{\"forged\": true}' WHERE position = 1000000000001",
    ] {
        refused(&mut c, &format!("BEGIN; {row}; {change}"));
        refused(&mut c, &format!("BEGIN; SET LOCAL session_replication_role = replica; {row}; {change}"));
    }
    refused(&mut c, "TRUNCATE streams.event_log_operator");
    refused(&mut c, "DROP TABLE streams.event_log_operator");
    refused(&mut c, "ALTER TABLE streams.event_log DETACH PARTITION streams.event_log_operator");
    let ranges =
        |ps: &[Partition]| ps.iter().map(|p| (p.name.clone(), p.end_position, p.state.clone())).collect::<Vec<_>>();
    assert_eq!(ranges(&partitions(&mut c)), ranges(&listed), "still attached, nothing else changed");
}

// --- 3. hostile roles ------------------------------------------------------

#[test]
fn data_roles_read_and_forge_nothing_through_a_partition_and_plain_roles_set_nothing() {
    let (db, mut c) = partitioned_db();
    c.batch_execute("SELECT streams.set_private('patient.*')").unwrap();
    let public = publish_many(&mut c, "orders", 10, 10);
    let private = publish_many(&mut c, "patient.4711", 10, 10);
    let reader = TestRole::new(&db, "reader", "IN ROLE pg_read_all_data");
    let writer = TestRole::new(&db, "writer", "IN ROLE pg_read_all_data, pg_write_all_data");
    // A reader of the extension's (USAGE on its schema through the grant).
    let plain = TestRole::new(&db, "plain", "");
    c.batch_execute(&format!("SELECT streams.grant('read', 'orders', '{}')", plain.name)).unwrap();
    let before = event_rows(&mut c, &format!("SELECT {EVENT_COLUMNS} FROM streams.events ORDER BY position"));
    assert_eq!(before.len(), public.len() + private.len());

    // Reading a partition directly: row-level security with no policy.
    for role in [&reader, &writer] {
        let mut as_role = db.connect_as(&role.name);
        let seen: i64 = as_role.query_one("SELECT count(*) FROM streams.event_log_0", &[]).unwrap().get(0);
        assert_eq!(seen, 0, "{} reads events of a partition directly", role.name);
        let leaked: i64 = as_role
            .query_one("SELECT count(*) FROM streams.event_log WHERE stream LIKE 'patient%'", &[])
            .unwrap()
            .get(0);
        assert_eq!(leaked, 0, "{} reads a private stream's events", role.name);
    }

    // Writing one: no forged event, no change of the settings the worker obeys.
    let mut w = db.connect_as(&writer.name);
    for forge in [
        "INSERT INTO streams.event_log_0 VALUES (50, 'orders', '1', '{\"forged\": true}')",
        "INSERT INTO streams.event_log_0 (position, stream, tx, data) VALUES (9000, 'orders', '1', '{}')",
        "INSERT INTO streams.event_log (position, stream, tx, data) VALUES (9001, 'orders', '1', '{}')",
        "INSERT INTO streams.storage_settings (retention_max_age) VALUES ('0 seconds')",
    ] {
        let err = w.batch_execute(forge).expect_err(forge);
        assert_eq!(sqlstate(&err), "42501", "{forge}: {err}");
    }
    for change in [
        "UPDATE streams.event_log_0 SET data = '{\"forged\": true}'",
        "DELETE FROM streams.event_log_0",
        "UPDATE streams.storage_settings SET retention_max_age = '0 seconds', retention_overrides_consumers = true",
        "DELETE FROM streams.storage_settings",
    ] {
        // Row security shows the writer no row to change (or it is refused).
        match w.execute(change, &[]) {
            Ok(changed) => assert_eq!(changed, 0, "{change}"),
            Err(e) => assert!(["42501", "55000"].contains(&sqlstate(&e).as_str()), "{change}: {e}"),
        }
    }
    for ddl in [
        "TRUNCATE streams.event_log_0",
        "DROP TABLE streams.event_log_0",
        "ALTER TABLE streams.event_log DETACH PARTITION streams.event_log_0",
        "ALTER TABLE streams.event_log_0 DISABLE ROW LEVEL SECURITY",
        "CREATE TABLE streams.event_log_mine (LIKE streams.event_log)",
    ] {
        let err = w.batch_execute(ddl).expect_err(ddl);
        assert!(["42501", "55000"].contains(&sqlstate(&err).as_str()), "{ddl}: {err}");
    }

    // The storage settings: the extension owner's alone.
    for role in [&plain, &reader, &writer] {
        let mut as_role = db.connect_as(&role.name);
        for call in [
            "SELECT streams.set_partition_size(20000)",
            "SELECT streams.set_retention(max_age => '0 seconds')",
            "SELECT streams.set_retention(max_size => 1, overrides_consumers => true)",
            "SELECT streams.set_retention()",
            "SELECT streams.archive(before_position => 100000, tablespace => 'pg_default')",
            "SELECT streams.archive(older_than => '0 seconds', tablespace => 'pg_default')",
        ] {
            let err = as_role.batch_execute(call).expect_err(call);
            assert_eq!(sqlstate(&err), "42501", "{} {call}: {err}", role.name);
        }
        // The partitions' sizes and newest times are for monitoring roles
        // (pg_monitor), not for readers, pg_read_all_data included.
        let err = as_role.query_one("SELECT count(*) FROM streams.partitions", &[]).expect_err("partitions");
        assert_eq!(sqlstate(&err), "42501", "{} lists the partitions: {err}", role.name);
        // What everyone may read: where the log starts, no stream named.
        let size: i64 = as_role.query_one("SELECT partition_size FROM streams.storage", &[]).unwrap().get(0);
        assert_eq!(size, 10000);
    }
    let storage: (i64, Option<String>, Option<i64>, bool) = c
        .query_one(
            "SELECT partition_size, retention_max_age::text, retention_max_size, retention_overrides_consumers
             FROM streams.storage",
            &[],
        )
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .unwrap();
    assert_eq!(storage, (10000, None, None, false), "the settings are as the owner set them");
    let after = event_rows(&mut c, &format!("SELECT {EVENT_COLUMNS} FROM streams.events ORDER BY position"));
    assert!(after == before, "the events changed");
    let stored: i64 = c.query_one("SELECT count(*) FROM streams.event_log", &[]).unwrap().get(0);
    assert_eq!(stored as usize, before.len(), "no forged row in the log");
}

// --- 4. archive ------------------------------------------------------------

/// A tablespace in a directory of the scratch directory, made for one test
/// (owned by the server's OS user) and dropped, with the directory, at the
/// end: declare it before the database that uses it, so it drops after.
struct Tablespace {
    name: String,
    dir: std::path::PathBuf,
}

impl Tablespace {
    fn new(suffix: &str) -> Tablespace {
        let name = format!("lbs_ts_{}_{suffix}", std::process::id());
        let dir = std::path::PathBuf::from(env("LITEBASE_STREAMS_SCRATCH_DIR")).join(&name);
        let _ = std::fs::remove_dir_all(&dir);
        let made = as_server_user("mkdir").arg("-p").arg(&dir).status().expect("mkdir runs");
        assert!(made.success(), "mkdir {}", dir.display());
        admin()
            .batch_execute(&format!("CREATE TABLESPACE {name} LOCATION '{}'", dir.display()))
            .expect("CREATE TABLESPACE");
        Tablespace { name, dir }
    }
}

impl Drop for Tablespace {
    fn drop(&mut self) {
        if let Ok(mut admin) = base_config().connect(postgres::NoTls) {
            let _ = admin.batch_execute(&format!("DROP TABLESPACE IF EXISTS {}", self.name));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What a reader reads, row for row: a whole replay, one stream's, and get
/// of the first and last position of each partition.
fn everything(c: &mut Client) -> Vec<(i64, String, String, String, String)> {
    let mut rows =
        event_rows(c, &format!("SELECT {EVENT_COLUMNS} FROM streams.replay(after => 0, max_events => 100000)"));
    rows.extend(event_rows(
        c,
        &format!("SELECT {EVENT_COLUMNS} FROM streams.replay('payments', after => 0, max_events => 100000)"),
    ));
    rows.extend(event_rows(
        c,
        &format!(
            "SELECT {EVENT_COLUMNS}
             FROM (SELECT p FROM generate_series(1, 40001) p WHERE p % 10000 IN (0, 1, 9999)) s, streams.get(s.p) e
             WHERE e.position IS NOT NULL"
        ),
    ));
    rows
}

/// The tablespaces of a partition and of its indexes (0: the default).
fn tablespaces_of(c: &mut Client, partition: &str) -> Vec<String> {
    c.query(
        "SELECT coalesce(t.spcname, 'default')::text FROM pg_class r
             LEFT JOIN pg_tablespace t ON t.oid = r.reltablespace
         WHERE r.oid = $1::text::regclass
            OR r.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = $1::text::regclass)",
        &[&partition],
    )
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

#[test]
fn archived_partitions_read_as_before_row_for_row() {
    let ts = Tablespace::new("archive");
    let (_db, mut c) = partitioned_db();
    publish_many(&mut c, "orders", 17_000, 5000);
    publish_many(&mut c, "payments", 18_000, 6000);
    let before = everything(&mut c);
    assert!(before.len() > 35_000, "{}", before.len());

    let err = c.batch_execute("SELECT streams.archive(25000, 'no_such_tablespace')").unwrap_err();
    assert_eq!(sqlstate(&err), "42704", "{err}");

    // Full partitions entirely at or below 25,000: the first two.
    let moved: i32 = c.query_one("SELECT streams.archive(25000, $1)", &[&ts.name]).unwrap().get(0);
    assert_eq!(moved, 2);
    let listed = partitions(&mut c);
    for p in &listed[..2] {
        assert_eq!((p.tablespace.as_deref(), p.state.as_str()), (Some(ts.name.as_str()), "archived"), "{listed:?}");
        assert!(tablespaces_of(&mut c, &p.name).iter().all(|t| *t == ts.name), "{}: table and indexes", p.name);
    }
    assert_eq!((listed[2].tablespace.as_deref(), listed[2].state.as_str()), (None, "full"), "{listed:?}");
    assert!(tablespaces_of(&mut c, &listed[2].name).iter().all(|t| t == "default"));
    assert!(everything(&mut c) == before, "replay and get read the archived partitions as before");
    let again: i32 = c.query_one("SELECT streams.archive(25000, $1)", &[&ts.name]).unwrap().get(0);
    assert_eq!(again, 0, "moved already");

    // Far past the newest position: the third full one, never the active one.
    let moved: i32 = c.query_one("SELECT streams.archive(1000000, $1)", &[&ts.name]).unwrap().get(0);
    assert_eq!(moved, 1);
    let listed = partitions(&mut c);
    let states: Vec<&str> = listed.iter().map(|p| p.state.as_str()).collect();
    assert_eq!(&states[..4], ["archived", "archived", "archived", "active"], "{listed:?}");
    assert_eq!(listed[3].tablespace, None);
    assert!(everything(&mut c) == before, "unchanged after the third");

    // By age, back to the default tablespace (which frees the test's).
    let moved: i32 = c
        .query_one("SELECT streams.archive(older_than => '0 seconds', tablespace => 'pg_default')", &[])
        .unwrap()
        .get(0);
    assert_eq!(moved, 3);
    let listed = partitions(&mut c);
    assert!(listed.iter().all(|p| p.tablespace.is_none() && p.state != "archived"), "{listed:?}");
    assert!(everything(&mut c) == before, "unchanged after moving back");
    let later: i32 =
        c.query_one("SELECT streams.archive(older_than => '1 day', tablespace => $1)", &[&ts.name]).unwrap().get(0);
    assert_eq!(later, 0, "nothing is a day old");
}

// --- 5. dump and restore ---------------------------------------------------

#[test]
fn dump_and_restore_bring_back_every_event_of_every_partition() {
    let (db, mut c) = partitioned_db();
    publish_many(&mut c, "orders", 12_000, 4000);
    let last = *publish_many(&mut c, "payments", 13_000, 4000).last().unwrap();
    let listed = wait_for_ahead(&mut c);
    let all = format!("SELECT {EVENT_COLUMNS} FROM streams.events ORDER BY position");
    let before = event_rows(&mut c, &all);
    assert_eq!(before.len(), 25_000);

    let dump = std::path::PathBuf::from(env("LITEBASE_STREAMS_SCRATCH_DIR")).join(format!("{}.dump", db.name));
    let dump = dump.to_str().unwrap().to_owned();
    run_pg_tool("pg_dump", &["-Fc", "-f", &dump, "-d", &db.name]);
    let restored = TestDb::without_extension();
    run_pg_tool("pg_restore", &["--exit-on-error", "-d", &restored.name, &dump]);
    let _ = std::fs::remove_file(&dump);

    let mut r = restored.connect();
    restored.wait_for_worker();
    wait_for_horizon(&mut r, last);
    assert!(event_rows(&mut r, &all) == before, "the restored database has every event, row for row");
    let names =
        |ps: &[Partition]| ps.iter().map(|p| (p.name.clone(), p.first_position, p.end_position)).collect::<Vec<_>>();
    let restored_partitions = partitions(&mut r);
    assert_eq!(names(&restored_partitions[..listed.len()]), names(&listed), "the same partitions");
    let size: i64 = r.query_one("SELECT partition_size FROM streams.storage", &[]).unwrap().get(0);
    assert_eq!(size, 10000, "the partition size is restored");
    let secured: i64 = r
        .query_one(
            "SELECT count(*) FROM pg_partition_tree('streams.event_log') t JOIN pg_class c ON c.oid = t.relid
             WHERE t.isleaf AND NOT c.relrowsecurity",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(secured, 0, "every restored partition has row-level security");
    refused(&mut r, "UPDATE streams.event_log_0 SET data = '{}'");
    refused(&mut r, "DROP TABLE streams.event_log_10000");

    // Publishing goes on above the restored positions.
    let p = publish(&mut r, "orders", PAYMENT);
    assert!(p > last, "{p} > {last}");
    wait_for_horizon(&mut r, p);
    let got: Option<i64> = r.query_one("SELECT (streams.get($1)).position", &[&p]).unwrap().get(0);
    assert_eq!(got, Some(p));
}

// --- 5. what others may plant or move ------------------------------------------

/// The hook that refuses TRUNCATE and DROP of a partition looks the parent
/// up with SQL, as whoever runs the statement (a superuser, say), under the
/// session's search_path: an `=` on oids planted in `public` (a database
/// owner owns it and may set the database's search_path) must not run.
#[test]
fn the_partition_hook_never_runs_an_operator_planted_in_the_search_path() {
    let (_db, mut c) = partitioned_db();
    publish_many(&mut c, "orders", 10, 10);
    c.batch_execute(
        "CREATE TABLE public.trap_calls (n int);
         CREATE FUNCTION public.trap(oid, oid) RETURNS boolean LANGUAGE plpgsql AS
             $$ BEGIN INSERT INTO public.trap_calls VALUES (1); RETURN $1::int8 = $2::int8; END $$;
         CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = oid, FUNCTION = public.trap);",
    )
    .unwrap();
    c.batch_execute("SET search_path = public, pg_catalog").unwrap();
    for ddl in ["TRUNCATE streams.event_log_0", "DROP TABLE streams.event_log_0"] {
        let err = c.batch_execute(ddl).expect_err(ddl);
        assert_eq!(sqlstate(&err), "55000", "{ddl}: {err}");
    }
    c.batch_execute("RESET search_path").unwrap();
    let calls: i64 = c.query_one("SELECT count(*) FROM public.trap_calls", &[]).unwrap().get(0);
    assert_eq!(calls, 0, "the planted operator ran as the superuser");
}

/// A sequence moved far ahead (setval, which pg_write_all_data may do) makes
/// the worker span the gap with one partition, not one per partition size:
/// thousands of them in one transaction would fill the lock table.
#[test]
fn a_sequence_moved_far_ahead_gets_one_partition_across_the_gap() {
    let (_db, mut c) = partitioned_db();
    publish_many(&mut c, "orders", 10, 10);
    let before = partitions(&mut c).len();
    // 300 partition sizes: few enough that making one each would succeed (and
    // take the worker a while), so the assertion below tells the two apart.
    c.batch_execute("SELECT setval('streams.position_seq', 3000000)").unwrap();
    let p = publish(&mut c, "orders", "{}");
    assert_eq!(p, 3_000_001);
    wait_for_horizon(&mut c, p);
    let after = partitions(&mut c);
    assert!(after.len() <= before + 3, "{} partitions for a gap of 300 partition sizes: {after:?}", after.len());
    let holding: Vec<&Partition> =
        after.iter().filter(|x| x.first_position.is_none_or(|f| f <= p) && p < x.end_position).collect();
    assert_eq!(holding.len(), 1, "one partition holds the new position: {after:?}");
    assert_eq!(event_positions(&mut c, "SELECT position FROM streams.replay(after => 10)"), [p]);
}
