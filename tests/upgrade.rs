//! Updating the extension in place: `ALTER EXTENSION litebase_streams UPDATE`
//! from 0.1.0 through every later version keeps every event (position,
//! stream, time, tx, data), keeps the horizon held by a transaction left open
//! across the update, keeps the sequence, delivery and the roles that used
//! 0.1.0's plain SQL grants, and leaves a schema identical to a fresh install
//! that dumps and restores like one. The one shared library also keeps
//! serving a database that was not updated.
//!
//! The update chain is walked generically: every version newer than the
//! installed one that `pg_available_extension_versions` lists, in semver
//! order, ending at the control file's `default_version`.
#![cfg(feature = "integration")]

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use common::*;
use postgres::fallible_iterator::FallibleIterator;
use postgres::Client;
use serde_json::Value;

/// One row of `streams.events` as text: position, stream, time, tx, data.
type EventRow = (i64, String, Option<String>, String, String);

const SNAPSHOT: &str =
    "SELECT position, stream, time::text, tx::text, data::text FROM streams.events ORDER BY position";

const WAIT: Duration = Duration::from_secs(20);

fn events(client: &mut Client) -> Vec<EventRow> {
    client
        .query(SNAPSHOT, &[])
        .expect("SELECT from streams.events")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect()
}

fn extversion(client: &mut Client) -> String {
    client
        .query_one("SELECT extversion FROM pg_extension WHERE extname = 'litebase_streams'", &[])
        .expect("the extension is installed")
        .get(0)
}

/// The version a plain CREATE EXTENSION installs (the control file's).
fn default_version() -> String {
    admin()
        .query_one("SELECT default_version FROM pg_available_extensions WHERE name = 'litebase_streams'", &[])
        .expect("litebase_streams is available")
        .get(0)
}

/// The extension directory of the server the tests run against.
fn extension_dir() -> PathBuf {
    PathBuf::from(pg_config("--sharedir")).join("extension")
}

/// Held while the frozen 0.1.0 script is in the extension directory.
static OLD_SCRIPT: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// CREATE EXTENSION at the frozen first version, and wait for its worker.
/// `make install` does not install that version's script (it has security
/// holes fixed by later steps, so a fresh install of it must be impossible),
/// so the test puts the repository's copy in the extension directory for
/// the CREATE EXTENSION alone and removes it again.
fn install_0_1_0(db: &TestDb) {
    let script = extension_dir().join("litebase_streams--0.1.0.sql");
    {
        let _only_us = OLD_SCRIPT.lock().unwrap_or_else(|e| e.into_inner());
        let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("sql/litebase_streams--0.1.0.sql");
        std::fs::copy(&source, &script).expect("copy the frozen 0.1.0 script into the extension directory");
        let created = db.connect().batch_execute("CREATE EXTENSION litebase_streams VERSION '0.1.0'");
        std::fs::remove_file(&script).expect("remove the frozen 0.1.0 script again");
        created.expect("CREATE EXTENSION litebase_streams VERSION '0.1.0'");
    }
    db.wait_for_worker();
    assert_eq!(extversion(&mut db.connect()), "0.1.0");
}

/// The upgrade steps the repository ships (sql/litebase_streams--A--B.sql), as (A, B).
fn upgrade_steps() -> Vec<(String, String)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("sql");
    let mut steps: Vec<(String, String)> = std::fs::read_dir(dir)
        .expect("read sql/")
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            let versions = name.strip_prefix("litebase_streams--")?.strip_suffix(".sql")?;
            let (from, to) = versions.split_once("--")?;
            Some((from.to_owned(), to.to_owned()))
        })
        .collect();
    steps.sort_by_key(|(from, _)| semver(from));
    steps
}

/// A version as (major, minor, patch, is a release, pre-release tag): a
/// pre-release sorts before its release, as semver says.
fn semver(version: &str) -> (u64, u64, u64, bool, String) {
    let (core, pre) = match version.split_once('-') {
        Some((core, pre)) => (core, pre.to_owned()),
        None => (version, String::new()),
    };
    let core = core.split_once('+').map_or(core, |(c, _)| c);
    let mut parts = core
        .split('.')
        .map(|p| p.parse::<u64>().unwrap_or_else(|_| panic!("extension version {version:?} is not semver")));
    let major = parts.next().unwrap_or(0);
    let minor = parts.next().unwrap_or(0);
    let patch = parts.next().unwrap_or(0);
    (major, minor, patch, pre.is_empty(), pre)
}

/// `ALTER EXTENSION ... UPDATE TO` each version after the installed one,
/// one step at a time along the repository's upgrade steps; returns the
/// versions stepped through. Ends at the default version (what a fresh
/// CREATE EXTENSION installs).
fn update_chain(client: &mut Client) -> Vec<String> {
    let mut at = extversion(client);
    let mut stepped = Vec::new();
    // An update that waits for a lock fails the test instead of hanging it.
    client.batch_execute("SET lock_timeout = '30s'").unwrap();
    while let Some((_, version)) = upgrade_steps().into_iter().find(|(from, _)| *from == at) {
        client
            .batch_execute(&format!("ALTER EXTENSION litebase_streams UPDATE TO '{version}'"))
            .unwrap_or_else(|e| panic!("ALTER EXTENSION litebase_streams UPDATE TO '{version}' failed: {e:?}"));
        assert_eq!(extversion(client), version, "UPDATE TO '{version}' installed that version");
        at = version.clone();
        stepped.push(version);
    }
    client.batch_execute("RESET lock_timeout").unwrap();
    assert!(!stepped.is_empty(), "a step leads from the installed version");
    assert_eq!(extversion(client), default_version(), "the update chain ends at the default version");
    stepped
}

/// A received notification: its position, its sender's pid, its payload.
struct Received {
    position: i64,
    pid: i32,
    payload: Value,
}

/// The next notification with its sender's process id (common's Listener
/// returns channel and payload only), or None after `timeout` in silence.
fn next_received(listener: &mut Listener, timeout: Duration) -> Option<Received> {
    let mut notifications = listener.client.notifications();
    let mut it = notifications.timeout_iter(timeout);
    it.next().expect("reading notifications").map(|n| {
        let payload: Value =
            serde_json::from_str(n.payload()).unwrap_or_else(|e| panic!("payload is not JSON ({e}): {}", n.payload()));
        let position =
            payload["position"].as_i64().unwrap_or_else(|| panic!("payload has no integer position: {}", n.payload()));
        Received { position, pid: n.process_id(), payload }
    })
}

fn status_row(client: &mut Client) -> (i64, Option<String>, Option<i64>) {
    let row = client
        .query_one("SELECT newest_position, worker_state, holder_position FROM streams.status", &[])
        .expect("SELECT FROM streams.status");
    (row.get(0), row.get(1), row.get(2))
}

/// A file in the scratch directory, removed at the end.
struct ScratchFile(PathBuf);

impl ScratchFile {
    fn new(name: &str) -> ScratchFile {
        let dir = std::env::var("LITEBASE_STREAMS_SCRATCH_DIR").expect("LITEBASE_STREAMS_SCRATCH_DIR is set");
        let path = PathBuf::from(dir).join(name);
        let _ = std::fs::remove_file(&path);
        ScratchFile(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().expect("a UTF-8 scratch path")
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A database used at 0.1.0 (events, a reader, a publisher and an operator
/// granted the 0.1.0 way, a publishing transaction left open) updates with
/// every event intact, the open transaction still holding the horizon, the
/// sequence continuing, delivery from streams.worker_pid() in order and once,
/// each role still able to do what it did, and a dump that restores it all.
#[test]
fn update_keeps_every_event_and_the_roles_that_used_them() {
    let db = TestDb::without_extension();
    install_0_1_0(&db);
    let reader = TestRole::new(&db, "reader", "");
    let publisher = TestRole::new(&db, "publisher", "");
    let ops = TestRole::new(&db, "ops", "");
    let mut admin_c = db.connect();
    // Privileges the way 0.1.0's comments say to grant them.
    admin_c
        .batch_execute(&format!(
            "GRANT USAGE ON SCHEMA streams TO {reader}, {publisher}, {ops};
             GRANT SELECT ON streams.events TO {reader};
             GRANT EXECUTE ON FUNCTION streams.replay(text, bigint, timestamptz, xid8, integer), streams.get(bigint) TO {reader};
             GRANT EXECUTE ON FUNCTION streams.publish(text, jsonb), streams.publish_batch(text, jsonb[]) TO {publisher};
             GRANT SELECT ON streams.status TO {ops};
             GRANT EXECUTE ON FUNCTION streams._worker_status() TO {ops};",
            reader = reader.name,
            publisher = publisher.name,
            ops = ops.name
        ))
        .expect("0.1.0-style grants");

    // Events at 0.1.0, from the superuser and from the granted publisher.
    let mut before =
        vec![publish(&mut admin_c, "orders", PAYMENT), publish(&mut admin_c, "audit", r#"{"who":"admin"}"#)];
    let mut pub_c = db.connect_as(&publisher.name);
    before.push(publish(&mut pub_c, "orders", r#"{"n":1}"#));
    let batch: Vec<i64> = pub_c
        .query(r#"SELECT * FROM streams.publish_batch('orders', ARRAY['{"n":2}','{"n":3}']::jsonb[])"#, &[])
        .expect("publish_batch as the 0.1.0 publisher")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(batch.len(), 2);
    before.extend(batch);
    drop(pub_c);
    let newest_before = *before.iter().max().unwrap();
    wait_for_horizon(&mut admin_c, newest_before);
    let snapshot = events(&mut admin_c);
    assert_eq!(
        snapshot.iter().map(|e| e.0).collect::<Vec<_>>(),
        before,
        "every event published at 0.1.0 is in streams.events before the update"
    );
    assert!(snapshot.iter().all(|e| e.2.is_some()), "every event has a time: {snapshot:?}");

    let mut listener = Listener::new(&db, &["orders"]);
    // A publishing transaction open when the update starts. 0.2.0 turns on
    // row-level security on the log, which takes an exclusive lock for a
    // moment: the update waits for the transaction, and its event keeps its
    // place on the timeline.
    let mut holder = db.connect();
    holder.batch_execute("BEGIN").unwrap();
    let held = publish(&mut holder, "orders", r#"{"held":true}"#);
    assert!(held > newest_before);
    let config = db.config();
    let updater = std::thread::spawn(move || update_chain(&mut config.connect(postgres::NoTls).unwrap()));
    wait_until("the update waits for the open publishing transaction", WAIT, || {
        admin()
            .query_opt(
                "SELECT 1 FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'
                   AND query LIKE 'ALTER EXTENSION%'",
                &[&db.name],
            )
            .unwrap()
            .is_some()
    });
    // (Nothing reads the extension's tables here: the waiting update holds
    // some of them locked until it gets the log.)
    holder.batch_execute("COMMIT").unwrap();
    updater.join().expect("the update completes once the transaction ends");
    assert_eq!(extversion(&mut admin_c), default_version(), "the update chain ends at the default version");
    wait_for_horizon(&mut admin_c, held);
    let with_held = events(&mut admin_c);
    assert_eq!(
        &with_held[..snapshot.len()],
        &snapshot[..],
        "the update keeps every event: position, stream, time, tx and data"
    );
    assert_eq!(with_held[snapshot.len()..].iter().map(|e| e.0).collect::<Vec<_>>(), vec![held]);

    // After the update, a transaction left open holds the horizon as before.
    let mut holder = db.connect();
    holder.batch_execute("BEGIN").unwrap();
    let held2 = publish(&mut holder, "orders", r#"{"held2":true}"#);
    let mut other = db.connect();
    let later = publish(&mut other, "orders", r#"{"later":true}"#);
    assert!(later > held2 && held2 > held, "the sequence continues across the update");
    let holder_pid: i32 = holder.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    wait_until("streams.status shows the later event allocated", WAIT, || status_row(&mut admin_c).0 >= later);
    wait_until("streams.status names the open transaction as the holder", WAIT, || {
        let row = admin_c.query_one("SELECT holder_pid, holder_position FROM streams.status", &[]).unwrap();
        row.get::<_, Option<i32>>(0) == Some(holder_pid) && row.get::<_, Option<i64>>(1) == Some(held2)
    });
    wait_until("the worker is idle", WAIT, || status_row(&mut admin_c).1.as_deref() == Some("idle"));
    let h = horizon(&mut admin_c);
    assert!(h < held2, "the open transaction holds the horizon: {h} >= {held2}");
    assert_eq!(events(&mut admin_c), with_held, "neither {held2} nor {later} is visible while the transaction is open");

    holder.batch_execute("COMMIT").unwrap();
    wait_for_horizon(&mut admin_c, later);
    let after = events(&mut admin_c);
    assert_eq!(&after[..snapshot.len()], &snapshot[..], "older events unchanged");
    assert_eq!(
        after[snapshot.len()..].iter().map(|e| e.0).collect::<Vec<_>>(),
        vec![held, held2, later],
        "once the transactions commit, their events are visible in position order"
    );
    assert!(after.iter().all(|e| e.2.is_some()), "every event has a time: {after:?}");

    let worker_pid: Option<i32> = admin_c.query_one("SELECT streams.worker_pid()", &[]).unwrap().get(0);
    let worker_pid = worker_pid.expect("streams.worker_pid() names the running worker");
    let mut received = Vec::new();
    while received.len() < 3 {
        match next_received(&mut listener, WAIT) {
            Some(n) => received.push(n),
            None => break,
        }
    }
    assert_eq!(
        received.iter().map(|n| n.position).collect::<Vec<_>>(),
        vec![held, held2, later],
        "the listener receives the held events, then the later one, in order"
    );
    for n in &received {
        assert_eq!(n.pid, worker_pid, "notification {} was sent by streams.worker_pid()", n.payload);
        assert_eq!(n.payload["stream"], "orders");
    }
    assert_eq!(received[0].payload["data"], serde_json::json!({"held": true}));
    assert_eq!(received[1].payload["data"], serde_json::json!({"held2": true}));
    assert_eq!(received[2].payload["data"], serde_json::json!({"later": true}));

    // The roles of 0.1.0 now hold grants on every stream.
    let grants: Vec<(String, String, String)> = admin_c
        .query("SELECT grantee::text, privilege, stream FROM streams.stream_grants ORDER BY 1, 2, 3", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let mut expected_grants = vec![
        (reader.name.clone(), "read".to_owned(), "*".to_owned()),
        (publisher.name.clone(), "publish".to_owned(), "*".to_owned()),
    ];
    expected_grants.sort();
    assert_eq!(grants, expected_grants, "0.1.0's reader and publisher became holders of '*' grants");

    // The publisher still publishes; its event arrives next, after exactly
    // one notification each for the held and the later event.
    let mut pub_c = db.connect_as(&publisher.name);
    let published = publish(&mut pub_c, "orders", r#"{"n":4}"#);
    let batch: Vec<i64> = pub_c
        .query(r#"SELECT * FROM streams.publish_batch('orders', ARRAY['{"n":5}']::jsonb[])"#, &[])
        .expect("publish_batch as the 0.1.0 publisher after the update")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(batch.len(), 1);
    let published_after = [published, batch[0]];
    assert!(published > later);
    drop(pub_c);
    let next: Vec<(i64, i32)> =
        (0..2).map_while(|_| next_received(&mut listener, WAIT)).map(|n| (n.position, n.pid)).collect();
    assert_eq!(
        next,
        published_after.iter().map(|&p| (p, worker_pid)).collect::<Vec<_>>(),
        "after the held and the later event, the next notifications are the publisher's (no duplicates)"
    );
    wait_for_horizon(&mut admin_c, batch[0]);

    // Events of before the update have a null envelope; the publisher
    // publishes one with an envelope now, and the reader reads it.
    let nulls: i64 = admin_c
        .query_one(
            "SELECT count(*) FROM streams.events WHERE position <= $1
               AND type IS NULL AND key IS NULL AND headers IS NULL",
            &[&newest_before],
        )
        .unwrap()
        .get(0);
    assert_eq!(nulls, before.len() as i64, "events published before the update read back with a null envelope");
    let mut pub_c = db.connect_as(&publisher.name);
    let enveloped: i64 = pub_c
        .query_one(
            "SELECT streams.publish('orders', '{\"n\":6}', type => 'order.paid', key => 'ord_6',
                                    headers => '{\"traceparent\":\"00-1-2-01\"}')",
            &[],
        )
        .expect("the 0.1.0 publisher publishes an envelope after the update")
        .get(0);
    drop(pub_c);
    wait_for_horizon(&mut admin_c, enveloped);
    assert_eq!(next_received(&mut listener, WAIT).map(|n| n.position), Some(enveloped));

    // The reader reads.
    let mut read_c = db.connect_as(&reader.name);
    let envelope: (String, String) = read_c
        .query_one("SELECT type, key FROM streams.events WHERE position = $1", &[&enveloped])
        .map(|r| (r.get(0), r.get(1)))
        .expect("the 0.1.0 reader reads the envelope");
    assert_eq!(envelope, ("order.paid".to_owned(), "ord_6".to_owned()));
    let all = events(&mut read_c);
    assert_eq!(all, events(&mut admin_c), "the 0.1.0 reader sees every event in streams.events");
    let replayed: Vec<i64> = read_c
        .query("SELECT position FROM streams.replay(stream => 'orders', after => 0)", &[])
        .expect("the 0.1.0 reader calls streams.replay")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let orders: Vec<i64> = all.iter().filter(|e| e.1 == "orders").map(|e| e.0).collect();
    assert_eq!(replayed, orders, "replay as the reader");
    let got: Option<String> = read_c
        .query_one("SELECT data::text FROM streams.get($1)", &[&held])
        .expect("the 0.1.0 reader calls streams.get")
        .get(0);
    assert_eq!(got.as_deref(), Some(r#"{"held": true}"#));
    let reader_horizon: i64 =
        read_c.query_one("SELECT streams.horizon()", &[]).expect("the 0.1.0 reader calls streams.horizon").get(0);
    assert!(reader_horizon >= batch[0]);
    let err = read_c
        .batch_execute("SELECT streams.publish('orders', '{}')")
        .expect_err("the reader did not become a publisher");
    assert_eq!(sqlstate(&err), "42501", "{err}");

    // The reader subscribes (new in 0.2.0); its progress survives the dump
    // and restore below.
    read_c.batch_execute("SELECT streams.create_subscription('audit', 'orders', after => 0)").unwrap();
    let mut tx = read_c.transaction().unwrap();
    let first: Vec<i64> =
        tx.query("SELECT position FROM streams.poll('audit', 2)", &[]).unwrap().iter().map(|r| r.get(0)).collect();
    tx.execute("SELECT streams.ack('audit', $1)", &[&first[1]]).unwrap();
    tx.commit().unwrap();
    assert_eq!(first, orders[..2], "the subscription starts at the first event");
    drop(read_c);

    // The operator reads the status.
    let mut ops_c = db.connect_as(&ops.name);
    let row =
        ops_c.query_one("SELECT * FROM streams.status", &[]).expect("the 0.1.0 operator selects from streams.status");
    let ops_worker: Option<i32> = row.get("worker_pid");
    assert_eq!(ops_worker, Some(worker_pid), "streams.status as the operator names the worker");
    drop(ops_c);

    // Dump the updated database and restore it into a new one.
    let final_events = events(&mut admin_c);
    let expected: Vec<i64> = before
        .iter()
        .copied()
        .chain([held, held2, later])
        .chain(published_after.iter().copied())
        .chain([enveloped])
        .collect();
    assert_eq!(final_events.iter().map(|e| e.0).collect::<Vec<_>>(), expected);
    assert_eq!(&final_events[..snapshot.len() + 3], &after[..], "the snapshot and the three later events, unchanged");
    let log_id: String = admin_c.query_one("SELECT streams.log_id()::text", &[]).unwrap().get(0);
    let dump = ScratchFile::new(&format!("{}.dump", db.name));
    run_pg_tool("pg_dump", &["-Fc", "-f", dump.path(), "-d", &db.name]);
    let restored = TestDb::without_extension();
    run_pg_tool("pg_restore", &["--exit-on-error", "-d", &restored.name, dump.path()]);
    let mut r = restored.connect();
    assert_eq!(extversion(&mut r), default_version(), "the restore installs the default version");
    let restored_events = events(&mut r);
    assert_eq!(
        &restored_events[..snapshot.len() + 3],
        &after[..],
        "the restored database has the snapshot and the three later events (position, stream, time, tx, data)"
    );
    assert_eq!(restored_events, final_events, "the restored database has every event");
    let restored_type: Option<String> =
        r.query_one("SELECT type FROM streams.events WHERE position = $1", &[&enveloped]).unwrap().get(0);
    assert_eq!(restored_type.as_deref(), Some("order.paid"), "the envelope survives the dump and restore");
    let restored_log_id: String = r.query_one("SELECT streams.log_id()::text", &[]).unwrap().get(0);
    assert_ne!(restored_log_id, log_id, "a restored log has a new log_id");
    restored.wait_for_worker();
    let p = publish(&mut r, "orders", r#"{"restored":true}"#);
    let top = final_events.last().unwrap().0;
    assert!(p > top, "publish in the restored database returns {p}, above every restored position ({top})");
    wait_for_horizon(&mut r, p);
    let restored_after = events(&mut r);
    assert_eq!(&restored_after[..final_events.len()], &final_events[..]);
    assert_eq!(restored_after.last().map(|e| e.0), Some(p), "the new event is visible in the restored database");
    let next: i64 = r.query_one("SELECT position FROM streams.poll('audit', 1)", &[]).unwrap().get(0);
    assert_eq!(next, orders[2], "the restored subscription continues after what was acked");
    drop(r);
}

/// Every object of the extension, described by name (never by oid) as sorted
/// text lines: membership, function definitions and ACLs, relations with
/// their kind, ACL, options and RLS flags, view definitions, columns,
/// indexes, constraints, triggers, policies, sequences, operator families,
/// comments, initial privileges, pg_extension_config_dump settings, the
/// schema, and anything in the schema that is not a member.
const DESCRIBE: &str = r#"
WITH ext AS (
    SELECT x.oid, x.extnamespace, x.extowner, x.extrelocatable, x.extconfig, x.extcondition
    FROM pg_extension x WHERE x.extname = 'litebase_streams'
), members AS (
    SELECT d.classid, d.objid, d.objsubid
    FROM pg_depend d, ext
    WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid AND d.deptype = 'e'
), funcs AS (
    SELECT p.* FROM pg_proc p JOIN members m ON m.classid = 'pg_proc'::regclass AND m.objid = p.oid
), rels AS (
    SELECT c.* FROM pg_class c JOIN members m ON m.classid = 'pg_class'::regclass AND m.objid = c.oid
), opfamilies AS (
    SELECT m.objid AS oid FROM members m WHERE m.classid = 'pg_opfamily'::regclass
    UNION
    SELECT o.opcfamily FROM pg_opclass o JOIN members m ON m.classid = 'pg_opclass'::regclass AND m.objid = o.oid
), lines(line) AS (
    SELECT 'member ' || pg_describe_object(m.classid, m.objid, m.objsubid) FROM members m
    UNION ALL
    SELECT pg_catalog.format('function %s #%s: %s', p.oid::regprocedure, lpad(l.n::text, 4, '0'), l.line)
    FROM funcs p, regexp_split_to_table(pg_get_functiondef(p.oid), E'\n') WITH ORDINALITY AS l(line, n)
    WHERE p.prokind <> 'a'
    UNION ALL
    SELECT pg_catalog.format('function %s: owner=%s acl=%s', p.oid::regprocedure, p.proowner::regrole,
        (SELECT string_agg(a::text, ',' ORDER BY a::text) FROM unnest(coalesce(p.proacl, acldefault('f'::"char", p.proowner))) a))
    FROM funcs p
    UNION ALL
    SELECT pg_catalog.format('relation %s: kind=%s owner=%s persistence=%s rls=%s force_rls=%s options=%s acl=%s',
        c.oid::regclass, c.relkind, c.relowner::regrole, c.relpersistence, c.relrowsecurity, c.relforcerowsecurity,
        (SELECT string_agg(o, ',' ORDER BY o) FROM unnest(c.reloptions) o),
        (SELECT string_agg(a::text, ',' ORDER BY a::text)
         FROM unnest(coalesce(c.relacl, acldefault((CASE c.relkind WHEN 'S' THEN 's' ELSE 'r' END)::"char", c.relowner))) a))
    FROM rels c
    UNION ALL
    SELECT pg_catalog.format('view %s #%s: %s', c.oid::regclass, lpad(l.n::text, 4, '0'), l.line)
    FROM rels c, regexp_split_to_table(pg_get_viewdef(c.oid), E'\n') WITH ORDINALITY AS l(line, n)
    WHERE c.relkind IN ('v', 'm')
    UNION ALL
    SELECT pg_catalog.format('column %s.%s #%s: type=%s notnull=%s default=%s collation=%s acl=%s',
        a.attrelid::regclass, quote_ident(a.attname),
        lpad((row_number() OVER (PARTITION BY a.attrelid ORDER BY a.attnum))::text, 3, '0'),
        format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(ad.adbin, ad.adrelid),
        (SELECT co.collname FROM pg_collation co WHERE co.oid = a.attcollation),
        (SELECT string_agg(x::text, ',' ORDER BY x::text) FROM unnest(a.attacl) x))
    FROM rels c
    JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
    LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
    UNION ALL
    SELECT pg_catalog.format('index %s on %s: %s', i.indexrelid::regclass, i.indrelid::regclass, pg_get_indexdef(i.indexrelid))
    FROM pg_index i JOIN rels c ON c.oid = i.indrelid
    UNION ALL
    SELECT pg_catalog.format('constraint %s on %s: %s', quote_ident(k.conname), k.conrelid::regclass, pg_get_constraintdef(k.oid))
    FROM pg_constraint k JOIN rels c ON c.oid = k.conrelid
    UNION ALL
    SELECT pg_catalog.format('trigger %s on %s: %s enabled=%s', quote_ident(t.tgname), t.tgrelid::regclass,
        pg_get_triggerdef(t.oid), t.tgenabled)
    FROM pg_trigger t JOIN rels c ON c.oid = t.tgrelid
    WHERE NOT t.tgisinternal
    UNION ALL
    SELECT pg_catalog.format('policy %s on %s.%s: permissive=%s roles=%s cmd=%s qual=%s with_check=%s',
        quote_ident(p.policyname), p.schemaname, p.tablename, p.permissive,
        (SELECT string_agg(r::text, ',' ORDER BY r::text) FROM unnest(p.roles) r), p.cmd, p.qual, p.with_check)
    FROM pg_policies p JOIN rels c ON c.relnamespace::regnamespace::text = p.schemaname AND c.relname = p.tablename
    UNION ALL
    SELECT pg_catalog.format('sequence %s: type=%s start=%s increment=%s min=%s max=%s cache=%s cycle=%s',
        s.seqrelid::regclass, s.seqtypid::regtype, s.seqstart, s.seqincrement, s.seqmin, s.seqmax, s.seqcache, s.seqcycle)
    FROM pg_sequence s JOIN rels c ON c.oid = s.seqrelid
    UNION ALL
    SELECT pg_catalog.format('opfamily %s', pg_describe_object('pg_amop'::regclass, o.oid, 0))
    FROM pg_amop o JOIN opfamilies f ON f.oid = o.amopfamily
    UNION ALL
    SELECT pg_catalog.format('opfamily %s', pg_describe_object('pg_amproc'::regclass, o.oid, 0))
    FROM pg_amproc o JOIN opfamilies f ON f.oid = o.amprocfamily
    UNION ALL
    SELECT pg_catalog.format('comment %s: %s', pg_describe_object(d.classoid, d.objoid, d.objsubid), d.description)
    FROM pg_description d JOIN members m ON m.classid = d.classoid AND m.objid = d.objoid
    UNION ALL
    SELECT pg_catalog.format('init_privs %s: type=%s privs=%s', pg_describe_object(i.classoid, i.objoid, i.objsubid), i.privtype,
        (SELECT string_agg(a::text, ',' ORDER BY a::text) FROM unnest(i.initprivs) a))
    FROM pg_init_privs i JOIN members m ON m.classid = i.classoid AND m.objid = i.objoid
    UNION ALL
    SELECT pg_catalog.format('config_dump %s: condition=%L', u.cfg::regclass, u.cond)
    FROM ext, unnest(ext.extconfig, ext.extcondition) AS u(cfg, cond)
    UNION ALL
    SELECT pg_catalog.format('extension: schema=%s owner=%s relocatable=%s', ext.extnamespace::regnamespace,
        ext.extowner::regrole, ext.extrelocatable)
    FROM ext
    UNION ALL
    SELECT pg_catalog.format('schema %s: owner=%s acl=%s', n.nspname, n.nspowner::regrole,
        (SELECT string_agg(a::text, ',' ORDER BY a::text) FROM unnest(coalesce(n.nspacl, acldefault('n'::"char", n.nspowner))) a))
    FROM pg_namespace n JOIN ext ON ext.extnamespace = n.oid
    UNION ALL
    SELECT 'not a member: ' || pg_describe_object(o.cls, o.oid, 0)
    FROM (
        -- Partitions of the log are plain tables on purpose (pg_dump dumps
        -- them with their rows); partitions.rs and upgrade tests look at them.
        SELECT 'pg_class'::regclass AS cls, c.oid FROM pg_class c, ext
        WHERE c.relnamespace = ext.extnamespace AND c.relkind NOT IN ('i', 't', 'I') AND NOT c.relispartition
        UNION ALL
        SELECT 'pg_proc'::regclass, p.oid FROM pg_proc p, ext WHERE p.pronamespace = ext.extnamespace
        UNION ALL
        SELECT 'pg_operator'::regclass, o.oid FROM pg_operator o, ext WHERE o.oprnamespace = ext.extnamespace
        UNION ALL
        SELECT 'pg_type'::regclass, t.oid FROM pg_type t, ext
        WHERE t.typnamespace = ext.extnamespace AND t.typrelid = 0 AND t.typelem = 0
    ) o
    WHERE NOT EXISTS (SELECT FROM members m WHERE m.classid = o.cls AND m.objid = o.oid)
)
SELECT coalesce(line, '<null line>') FROM lines ORDER BY coalesce(line, '<null line>') COLLATE "C"
"#;

fn describe(client: &mut Client) -> Vec<String> {
    let mut lines: Vec<String> =
        client.query(DESCRIBE, &[]).expect("describing the extension's objects").iter().map(|r| r.get(0)).collect();
    lines.sort();
    lines
}

/// The lines of `a` that `b` lacks, counting repeats.
fn missing_from(a: &[String], b: &[String]) -> Vec<String> {
    let mut counts: BTreeMap<&str, i64> = BTreeMap::new();
    for line in b {
        *counts.entry(line).or_default() += 1;
    }
    let mut out = Vec::new();
    for line in a {
        let count = counts.entry(line).or_default();
        if *count > 0 {
            *count -= 1;
        } else {
            out.push(line.clone());
        }
    }
    out
}

/// 0.1.0 updated along the chain has exactly the objects, definitions,
/// privileges and dump settings of a fresh install of the default version.
#[test]
fn schema_after_update_equals_a_fresh_install() {
    let fresh = TestDb::new();
    let updated = TestDb::without_extension();
    install_0_1_0(&updated);
    update_chain(&mut updated.connect());

    let fresh_lines = describe(&mut fresh.connect());
    let updated_lines = describe(&mut updated.connect());
    assert!(
        fresh_lines.iter().any(|l| l.starts_with("function streams.publish(text,jsonb,text,text,jsonb,text,bigint) #"))
            && fresh_lines.iter().any(|l| l.starts_with("relation streams.events:"))
            && fresh_lines.iter().any(|l| l.starts_with("config_dump streams.event_log:")),
        "the description covers the extension's objects:\n{}",
        fresh_lines.join("\n")
    );
    let only_fresh = missing_from(&fresh_lines, &updated_lines);
    let only_updated = missing_from(&updated_lines, &fresh_lines);
    assert!(
        only_fresh.is_empty() && only_updated.is_empty(),
        "the updated schema differs from a fresh install\n--- only in the fresh install ({}):\n{}\n--- only after the update ({}):\n{}",
        only_fresh.len(),
        only_fresh.join("\n"),
        only_updated.len(),
        only_updated.join("\n")
    );
}

/// Publish as the superuser while LISTENing: the notification names the
/// position, and the event shows in streams.events with a time.
fn publish_and_receive(db: &TestDb, stream: &str) {
    let mut c = db.connect();
    let mut listener = Listener::new(db, &[stream]);
    let p = publish(&mut c, stream, r#"{"served":true}"#);
    let got = listener.collect(1, WAIT);
    assert_eq!(got.len(), 1, "{}: a notification arrives for {p}", db.name);
    assert_eq!(got[0]["position"].as_i64(), Some(p), "{}: the notification carries the position", db.name);
    assert_eq!(got[0]["stream"], stream, "{}: the notification names the stream", db.name);
    wait_for_horizon(&mut c, p);
    let row = c
        .query_opt("SELECT stream, time IS NOT NULL, data::text FROM streams.events WHERE position = $1", &[&p])
        .unwrap()
        .unwrap_or_else(|| panic!("{}: event {p} is in streams.events", db.name));
    assert_eq!(row.get::<_, String>(0), stream);
    assert!(row.get::<_, bool>(1), "{}: event {p} has a time", db.name);
    assert_eq!(row.get::<_, String>(2), r#"{"served": true}"#);
}

/// The current library delivers for a database left at 0.1.0 as it does for
/// an updated one on the same server.
#[test]
fn library_serves_a_database_that_did_not_update() {
    let kept = TestDb::without_extension();
    let updated = TestDb::without_extension();
    install_0_1_0(&kept);
    install_0_1_0(&updated);
    update_chain(&mut updated.connect());

    publish_and_receive(&updated, "orders");
    publish_and_receive(&kept, "orders");
    // And once more each, in the other order: the worker of one does not
    // disturb the other's.
    publish_and_receive(&kept, "audit");
    publish_and_receive(&updated, "audit");

    assert_eq!(extversion(&mut kept.connect()), "0.1.0", "the database that did not update stays at 0.1.0");
    assert_eq!(extversion(&mut updated.connect()), default_version(), "the other database updated");
}

/// The update under load (issue 22): publishers, a replay pager, a
/// listener and (from 0.2.0 on) a subscription consumer keep going through
/// the whole chain from 0.1.0. Every step
/// locks the log first, as they do, so they wait behind it; none fails
/// (no deadlock, 40P01), every committed event is there afterwards in
/// position order, and the worker never takes the update for a restore.
#[test]
fn update_under_publish_replay_listen_and_consumers_fails_no_one() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let db = TestDb::without_extension();
    install_0_1_0(&db);
    let log_path = env("LITEBASE_STREAMS_SERVER_LOG");
    let log_before = std::fs::metadata(&log_path).map(|m| m.len()).unwrap_or(0);
    let stop = Arc::new(AtomicBool::new(false));
    let errors: Arc<Mutex<Vec<String>>> = Arc::default();
    let committed: Arc<Mutex<Vec<i64>>> = Arc::default();
    let mut load = Vec::new();
    for p in 0..3 {
        let (config, stop, errors, committed) = (db.config(), stop.clone(), errors.clone(), committed.clone());
        load.push(std::thread::spawn(move || {
            let mut c = config.connect(postgres::NoTls).unwrap();
            let mut n = 0;
            while !stop.load(Ordering::Acquire) {
                n += 1;
                // Two events a transaction: the second publish holds the log already.
                let result = c.transaction().and_then(|mut tx| {
                    let data = format!(r#"{{"p": {p}, "n": {n}}}"#);
                    let a: i64 = tx.query_one("SELECT streams.publish('orders', $1::text::jsonb)", &[&data])?.get(0);
                    let b: i64 = tx.query_one("SELECT streams.publish('orders', $1::text::jsonb)", &[&data])?.get(0);
                    tx.commit()?;
                    Ok([a, b])
                });
                match result {
                    Ok(positions) => committed.lock().unwrap().extend(positions),
                    Err(e) => errors.lock().unwrap().push(format!("publisher: {e:?}")),
                }
            }
        }));
    }
    {
        let (config, stop, errors) = (db.config(), stop.clone(), errors.clone());
        load.push(std::thread::spawn(move || {
            let mut c = config.connect(postgres::NoTls).unwrap();
            let mut after = 0i64;
            while !stop.load(Ordering::Acquire) {
                match c.query(
                    "SELECT position FROM streams.events WHERE position > $1 ORDER BY position LIMIT 100",
                    &[&after],
                ) {
                    Ok(rows) if rows.is_empty() => after = 0, // from the start again
                    Ok(rows) => {
                        let positions: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
                        if positions.windows(2).any(|w| w[0] >= w[1]) || positions[0] <= after {
                            errors.lock().unwrap().push(format!("replay out of order after {after}: {positions:?}"));
                        }
                        after = *positions.last().unwrap();
                    }
                    Err(e) => errors.lock().unwrap().push(format!("replay: {e:?}")),
                }
            }
        }));
    }
    let received: Arc<Mutex<Vec<i64>>> = Arc::default();
    {
        let (mut listener, stop, received) = (Listener::new(&db, &["orders"]), stop.clone(), received.clone());
        load.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                if let Some(got) = next_received(&mut listener, Duration::from_millis(200)) {
                    received.lock().unwrap().push(got.position);
                }
            }
        }));
    }
    wait_until("events flow at 0.1.0", WAIT, || received.lock().unwrap().len() >= 20);
    // The first step under load; then a subscription (0.2.0 has them) whose
    // consumer polls and acks through the rest of the chain.
    let mut admin_c = db.connect();
    admin_c.batch_execute("SET lock_timeout = '30s'; ALTER EXTENSION litebase_streams UPDATE TO '0.2.0'").unwrap();
    admin_c.batch_execute("SELECT streams.create_subscription('upgrade_consumer', 'orders', after => 0)").unwrap();
    // A role that may create webhooks at 0.2.0 (by the old argument list)
    // may create them after the update too, with 0.3.0's filters.
    let hooks = TestRole::new(&db, "hooks", "");
    admin_c
        .batch_execute(&format!(
            "GRANT USAGE ON SCHEMA streams TO {0};
             GRANT EXECUTE ON FUNCTION streams.create_webhook(text, text, text, bigint, text, integer) TO {0}",
            hooks.name
        ))
        .unwrap();
    let consumed: Arc<Mutex<Vec<i64>>> = Arc::default();
    let in_flight: Arc<Mutex<Vec<String>>> = Arc::default();
    {
        let (config, stop, errors, consumed, in_flight) =
            (db.config(), stop.clone(), errors.clone(), consumed.clone(), in_flight.clone());
        load.push(std::thread::spawn(move || {
            let mut c = config.connect(postgres::NoTls).unwrap();
            while !stop.load(Ordering::Acquire) {
                let result = c.transaction().and_then(|mut tx| {
                    let rows =
                        tx.query("SELECT position FROM streams.poll('upgrade_consumer', 100, wait => '50ms')", &[])?;
                    let positions: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
                    if let Some(last) = positions.last() {
                        tx.execute("SELECT streams.ack('upgrade_consumer', $1)", &[last])?;
                    }
                    tx.commit()?;
                    Ok(positions)
                });
                match result {
                    Ok(positions) => consumed.lock().unwrap().extend(positions),
                    // A 0.2.0 poll still running when the update commits
                    // reads the events view with the envelope's columns
                    // it was not compiled for: it fails once (its claims
                    // go back with the rollback) and the next poll is 0.3.0's.
                    Err(e)
                        if sqlstate(&e) == "42804"
                            && format!("{e:?}").contains("streams.poll(text,integer,interval)") =>
                    {
                        in_flight.lock().unwrap().push(format!("{e:?}"))
                    }
                    Err(e) => errors.lock().unwrap().push(format!("consumer: {e:?}")),
                }
            }
        }));
    }
    wait_until("the consumer consumes at 0.2.0", WAIT, || consumed.lock().unwrap().len() >= 20);
    let stepped = update_chain(&mut admin_c);
    let at_update = committed.lock().unwrap().len();
    wait_until("events flow after the update", WAIT, || committed.lock().unwrap().len() >= at_update + 20);
    stop.store(true, Ordering::Release);
    for thread in load {
        thread.join().unwrap();
    }

    assert_eq!(errors.lock().unwrap().clone(), Vec::<String>::new(), "no one failed during {stepped:?}");
    assert!(in_flight.lock().unwrap().len() <= 1, "only the poll in flight at the update failed: {in_flight:?}");
    let mut committed = committed.lock().unwrap().clone();
    committed.sort_unstable();
    let mut c = db.connect();
    wait_for_horizon(&mut c, *committed.last().unwrap());
    let stored: Vec<i64> = c
        .query("SELECT position FROM streams.events WHERE stream = 'orders' ORDER BY position", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(stored, committed, "every committed event, once, in position order");
    let received = received.lock().unwrap().clone();
    assert!(received.windows(2).all(|w| w[0] < w[1]), "notifications in position order");
    // The consumer got each event once, in order; it had no time to drain
    // the last ones (the publishers ran until the end).
    let consumed = consumed.lock().unwrap().clone();
    assert!(consumed.windows(2).all(|w| w[0] < w[1]), "the consumer got each event once, in order");
    assert!(consumed.iter().all(|p| stored.binary_search(p).is_ok()), "the consumer got stored events only");
    assert_eq!(&stored[..consumed.len()], &consumed[..], "and none was skipped");
    let log = std::fs::read(&log_path).unwrap();
    let during = String::from_utf8_lossy(&log[log_before as usize..]);
    assert!(!during.contains("restored from another cluster"), "the worker took the update for a restore");

    // The subscription made at 0.2.0 goes on from its position after the
    // update, and counts attempts now: its next event, rolled back, comes
    // again as attempt 2.
    let next = publish(&mut c, "orders", r#"{"after": "update"}"#);
    wait_for_horizon(&mut c, next);
    let first_pending = stored.get(consumed.len()).copied().unwrap_or(next);
    let mut attempts = Vec::new();
    for _ in 0..2 {
        c.batch_execute("BEGIN").unwrap();
        let row = c.query_one("SELECT position, attempt FROM streams.poll('upgrade_consumer', 1)", &[]).unwrap();
        attempts.push((row.get::<_, i64>(0), row.get::<_, i32>(1)));
        c.batch_execute("ROLLBACK").unwrap();
    }
    assert_eq!(attempts, [(first_pending, 1), (first_pending, 2)], "the first event not consumed, attempt 1 then 2");

    let mut may_create = |role: &str| -> bool {
        c.query_one(
            "SELECT has_function_privilege($1, 'streams.create_webhook(text, text, text, bigint, text, integer, text[], jsonb)', 'EXECUTE')",
            &[&role],
        )
        .unwrap()
        .get(0)
    };
    assert!(may_create(&hooks.name), "the 0.2.0 grant of create_webhook carries over to the new one");
    assert!(!may_create("public"), "and nobody else got it");
}

/// The 0.3.0 step partitions the log without copying it: a 0.2.0 log of
/// 1,000,000 events becomes the first partition, attached as it is: the
/// same data files (relfilenode), every event's position, stream, time, tx
/// and data unchanged, and the log goes on from there.
#[test]
fn update_attaches_the_old_log_as_its_first_partition_without_a_copy() {
    let db = TestDb::without_extension();
    install_0_1_0(&db);
    let mut c = db.connect();
    c.batch_execute("ALTER EXTENSION litebase_streams UPDATE TO '0.2.0'").unwrap();
    for batch in 0..10 {
        c.query_one(
            "SELECT count(*) FROM streams.publish_batch('big', (SELECT pg_catalog.array_agg(pg_catalog.jsonb_build_object('i', g, 'batch', $1::int)) FROM generate_series(1, 100000) g))",
            &[&batch],
        )
        .unwrap();
    }
    let newest: i64 = c.query_one("SELECT max(position) FROM streams.event_log", &[]).unwrap().get(0);
    wait_for_horizon(&mut c, newest);
    const FINGERPRINT: &str = "SELECT count(*), sum(hashtextextended(position::text || stream || time::text || tx::text || data::text, 0))::text FROM streams.events";
    let before: (i64, String) = c.query_one(FINGERPRINT, &[]).map(|r| (r.get(0), r.get(1))).unwrap();
    assert_eq!(before.0, 1_000_000, "the 0.2.0 log holds the million events");
    let file_before: i64 = c
        .query_one("SELECT relfilenode::bigint FROM pg_class WHERE oid = 'streams.event_log'::regclass", &[])
        .map(|r| r.get::<_, i64>(0))
        .unwrap();

    let started = std::time::Instant::now();
    update_chain(&mut c);
    // A figure for docs/operations.md (not a timed assertion: the files
    // are what show that nothing was copied).
    eprintln!("the update of a log of 1,000,000 events took {:.2} s", started.elapsed().as_secs_f64());

    let (file_after, is_partition): (i64, bool) = c
        .query_one(
            "SELECT relfilenode::bigint, relispartition FROM pg_class WHERE oid = 'streams.event_log_0'::regclass",
            &[],
        )
        .map(|r| (r.get(0), r.get(1)))
        .unwrap();
    assert!(is_partition, "the old log is a partition of the new one");
    assert_eq!(file_after, file_before, "attached with its data files as they were: nothing was rewritten");
    let kind: String = c
        .query_one("SELECT relkind::text FROM pg_class WHERE oid = 'streams.event_log'::regclass", &[])
        .unwrap()
        .get(0);
    assert_eq!(kind, "p", "streams.event_log is partitioned");
    let after: (i64, String) = c.query_one(FINGERPRINT, &[]).map(|r| (r.get(0), r.get(1))).unwrap();
    assert_eq!(after, before, "every event reads back unchanged: position, stream, time, tx, data");
    let (first, end): (Option<i64>, i64) = c
        .query_one("SELECT first_position, end_position FROM streams.partitions WHERE partition = 'streams.event_log_0'::regclass", &[])
        .map(|r| (r.get(0), r.get(1)))
        .unwrap();
    assert_eq!(first, None, "the first partition holds everything from the start");
    assert!(end > newest, "and every position handed out so far (ends at {end}, newest {newest})");
    let p = publish(&mut c, "big", r#"{"after":"update"}"#);
    assert_eq!(p, newest + 1, "the timeline goes on");
    wait_for_horizon(&mut c, p);
    let last: i64 = c.query_one("SELECT position FROM streams.replay('big', after => $1)", &[&newest]).unwrap().get(0);
    assert_eq!(last, p);
}
