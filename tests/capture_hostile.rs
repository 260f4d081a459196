//! Table capture against hostile and careless use (a review of src/capture/):
//! roles without privileges, owners' code in casts, DDL after the capture,
//! large rows, and every statement shape, each against the real server.

#![cfg(feature = "integration")]

mod common;

use common::*;
use postgres::Client;

/// (type, key, data) of a stream's final events, in position order.
fn events(client: &mut Client, stream: &str) -> Vec<(String, Option<String>, serde_json::Value)> {
    client
        .query("SELECT type, key, data::text FROM streams.events WHERE stream = $1 ORDER BY position", &[&stream])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), serde_json::from_str(r.get::<_, &str>(2)).unwrap()))
        .collect()
}

fn settle(client: &mut Client) {
    let last: i64 = client.query_one("SELECT coalesce(max(position), 0) FROM streams.event_log", &[]).unwrap().get(0);
    wait_for_horizon(client, last);
}

/// Replays insert/update/delete events onto a map id -> v (what a consumer does).
fn replay(events: &[(String, Option<String>, serde_json::Value)]) -> std::collections::BTreeMap<i64, i64> {
    let mut table = std::collections::BTreeMap::new();
    for (kind, _, data) in events {
        match kind.as_str() {
            "insert" | "update" => {
                if let Some(old) = data.get("old") {
                    table.remove(&old["id"].as_i64().unwrap());
                }
                table.insert(data["new"]["id"].as_i64().unwrap(), data["new"]["v"].as_i64().unwrap());
            }
            "delete" => {
                table.remove(&data["old"]["id"].as_i64().unwrap());
            }
            _ => table.clear(),
        }
    }
    table
}

/// capture() and uncapture() check ownership before they lock the table:
/// otherwise any role with USAGE on schema streams could queue a lock
/// behind an open writer, and every later writer of that table (or of
/// streams.event_log: every publisher) behind it.
#[test]
fn unprivileged_capture_call_does_not_block_writers() {
    let db = TestDb::new();
    let attacker = TestRole::new(&db, "atk", "");
    let mut c = db.connect();
    c.batch_execute(&format!(
        "GRANT USAGE ON SCHEMA streams TO {a}; CREATE TABLE victim (id int PRIMARY KEY);",
        a = attacker.name
    ))
    .unwrap();
    for (target, hold, write) in [
        ("victim", "INSERT INTO victim VALUES (1)", "INSERT INTO victim VALUES (2)"),
        ("streams.event_log", "SELECT streams.publish('a.b', '{}')", "SELECT streams.publish('c.d', '{}')"),
    ] {
        let mut holder = db.connect();
        holder.batch_execute(&format!("BEGIN; {hold}")).unwrap();
        let mut atk = db.connect_as(&attacker.name);
        // Refused at once: a capture that waited for its lock would end in 55P03 here.
        let refused = atk.batch_execute(&format!("SET lock_timeout = '2s'; SELECT streams.capture('{target}')"));
        assert_eq!(sqlstate(&refused.unwrap_err()), "42501", "capture('{target}') by a non-owner");
        let refused = atk.batch_execute(&format!("SELECT streams.uncapture('{target}')"));
        assert_eq!(sqlstate(&refused.unwrap_err()), "42501", "uncapture('{target}') by a non-owner");
        let mut writer = db.connect();
        writer.batch_execute(&format!("SET lock_timeout = '1s'; {write}")).unwrap();
        holder.batch_execute("COMMIT").unwrap();
    }
}

/// A captured table cannot become a partition or join an inheritance tree
/// afterwards (changes made through the parent would publish nothing): the
/// DDL is refused (0A000), or, should it pass, the changes are published.
#[test]
fn captured_table_cannot_silently_join_a_partition_or_inheritance_tree() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute(
        "CREATE TABLE c1 (id int PRIMARY KEY, v int); SELECT streams.capture('c1');
         CREATE TABLE par (id int PRIMARY KEY, v int) PARTITION BY RANGE (id);
         CREATE TABLE c2 (id int PRIMARY KEY, v int); SELECT streams.capture('c2');
         INSERT INTO c2 VALUES (1, 1);
         CREATE TABLE base (id int, v int);",
    )
    .unwrap();
    for ddl in [
        "ALTER TABLE par ATTACH PARTITION c1 FOR VALUES FROM (0) TO (1000)",
        "ALTER TABLE c2 INHERIT base",
        "CREATE TABLE kid () INHERITS (c2)",
        "CREATE TABLE kid2 (LIKE c2) ; ALTER TABLE kid2 INHERIT c2",
    ] {
        let refused = c.batch_execute(ddl).map_err(|e| sqlstate(&e));
        assert_eq!(refused, Err("0A000".into()), "{ddl}");
    }
    // Other tables' DDL is not touched; an uncaptured table may join.
    c.batch_execute(
        "CREATE TABLE kid3 () INHERITS (base);
         SELECT streams.uncapture('c1');
         ALTER TABLE par ATTACH PARTITION c1 FOR VALUES FROM (0) TO (1000);",
    )
    .unwrap();
}

/// streams.captures says a capture is enabled only when all four triggers
/// fire in a normal session: not with one ENABLE REPLICA, disabled or
/// dropped (a table with a dropped trigger stays listed).
#[test]
fn captures_view_tells_whether_changes_are_captured() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute(
        "CREATE TABLE r (id int PRIMARY KEY, v int); SELECT streams.capture('r');
         ALTER TABLE r ENABLE REPLICA TRIGGER streams_capture_insert;
         INSERT INTO r VALUES (1, 1);
         CREATE TABLE d (id int PRIMARY KEY, v int); SELECT streams.capture('d');
         ALTER TABLE d DISABLE TRIGGER streams_capture_update;
         INSERT INTO d VALUES (1, 1); UPDATE d SET v = 2;
         CREATE TABLE h (id int PRIMARY KEY, v int); SELECT streams.capture('h');
         INSERT INTO h VALUES (1, 1);
         DROP TRIGGER streams_capture_insert ON h;
         UPDATE h SET v = 2;",
    )
    .unwrap();
    settle(&mut c);
    let enabled = |c: &mut Client, t: &str| -> Option<bool> {
        c.query_opt("SELECT enabled FROM streams.captures WHERE \"table\" = $1::text::regclass", &[&t])
            .unwrap()
            .map(|r| r.get(0))
    };
    let mut wrong = Vec::new();
    if enabled(&mut c, "r") == Some(true) && events(&mut c, "public.r").is_empty() {
        wrong.push("r: enabled = true, yet its INSERT published nothing (ENABLE REPLICA)");
    }
    if enabled(&mut c, "d") == Some(true) && events(&mut c, "public.d").len() != 2 {
        wrong.push("d: enabled = true, yet its UPDATE published nothing (update trigger disabled)");
    }
    if enabled(&mut c, "h").is_none() && events(&mut c, "public.h").len() == 2 {
        wrong.push("h: not in streams.captures, yet its UPDATE was published");
    }
    assert!(wrong.is_empty(), "{wrong:?}");
}

/// A statement's chunk is bounded by bytes as well as rows: with 1,000-row
/// chunks, 150 rows of 1 MB under REPLICA IDENTITY FULL grew the backend
/// by over 1 GB. Reads /proc of the backend (the server runs here).
#[test]
fn memory_of_a_statement_over_large_rows_is_bounded() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute(
        "CREATE TABLE big (id int PRIMARY KEY, v text);
         ALTER TABLE big REPLICA IDENTITY FULL;
         INSERT INTO big SELECT g, repeat('x', 1000000) || g FROM generate_series(1, 150) g;
         SELECT streams.capture('big');",
    )
    .unwrap();
    let pid: i32 = c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    let hwm = || -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the backend on this machine");
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    let before = hwm();
    c.batch_execute("UPDATE big SET v = v || ''").unwrap();
    let grown_mb = (hwm() - before) / 1024;
    assert!(grown_mb < 300, "one UPDATE of 150 rows of 1 MB grew the backend by {grown_mb} MB");
}

/// An excluded column stays out of the key too, also after the primary key
/// is changed to include it.
#[test]
fn excluded_column_never_appears_even_after_the_key_changes() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute(
        "CREATE TABLE k (id int PRIMARY KEY, card text);
         SELECT streams.capture('k', exclude => '{card}');
         ALTER TABLE k DROP CONSTRAINT k_pkey, ADD PRIMARY KEY (id, card);
         INSERT INTO k VALUES (1, '4111');",
    )
    .unwrap();
    settle(&mut c);
    let leaked: Vec<String> = c
        .query(
            "SELECT coalesce(key, '') || ' ' || data::text FROM streams.event_log
             WHERE stream = 'public.k' AND (key LIKE '%4111%' OR data::text LIKE '%4111%')",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(leaked.is_empty(), "the excluded column leaked: {leaked:?}");
}

/// The owner's json cast runs as the owner (not the writer, not the
/// extension's owner), as a security-restricted operation: it cannot read
/// the log, SET ROLE, or leave a search_path in the writer's session; a
/// cast that raises fails the write with its SQLSTATE and publishes nothing.
#[test]
fn owner_code_in_the_conversion_runs_as_the_owner() {
    let db = TestDb::new();
    let evil = TestRole::new(&db, "evil", "");
    let mut c = db.connect();
    c.batch_execute(&format!(
        "GRANT USAGE ON SCHEMA streams TO {e}; GRANT CREATE ON SCHEMA public TO {e};
         SELECT streams.grant('publish', 'public.evil_t', '{e}');
         CREATE TABLE public.seen (who text, note text); GRANT ALL ON public.seen TO PUBLIC;",
        e = evil.name
    ))
    .unwrap();
    let mut as_evil = db.connect_as(&evil.name);
    as_evil
        .batch_execute(
            "CREATE TYPE public.mood AS ENUM ('ok', 'boom');
             CREATE FUNCTION public.mood_json(m public.mood) RETURNS json LANGUAGE plpgsql AS $$
             DECLARE n text;
             BEGIN
               IF m = 'boom' THEN RAISE EXCEPTION 'boom' USING ERRCODE = '22012'; END IF;
               BEGIN PERFORM count(*) FROM streams.event_log; n := 'read'; EXCEPTION WHEN others THEN n := SQLSTATE; END;
               INSERT INTO public.seen VALUES (current_user, 'log ' || n);
               BEGIN SET ROLE postgres; n := 'ok'; EXCEPTION WHEN others THEN n := SQLSTATE; END;
               INSERT INTO public.seen VALUES (current_user, 'role ' || n);
               PERFORM set_config('search_path', 'evilpath', false);
               RETURN '\"x\"'::json;
             END $$;
             CREATE CAST (public.mood AS json) WITH FUNCTION public.mood_json(public.mood);
             CREATE TABLE public.evil_t (id int PRIMARY KEY, m public.mood);
             SELECT streams.capture('public.evil_t');
             GRANT INSERT ON public.evil_t TO PUBLIC;",
        )
        .unwrap();
    let path_before: String = c.query_one("SHOW search_path", &[]).unwrap().get(0);
    c.batch_execute("INSERT INTO evil_t VALUES (1, 'ok')").unwrap();
    let path_after: String = c.query_one("SHOW search_path", &[]).unwrap().get(0);
    assert_eq!(path_after, path_before, "the owner's cast changed the writer's search_path");
    let seen: Vec<(String, String)> =
        c.query("SELECT who, note FROM public.seen", &[]).unwrap().iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(seen, vec![(evil.name.clone(), "log 42501".into()), (evil.name.clone(), "role 42501".into())]);
    let err = c.batch_execute("INSERT INTO evil_t VALUES (2, 'boom')").unwrap_err();
    assert_eq!(sqlstate(&err), "22012");
    settle(&mut c);
    assert_eq!(events(&mut c, "public.evil_t").len(), 1);
}

/// ALTER TABLE OWNER moves the publish privilege with the table: a
/// new owner without it makes writes fail (42501), none slip through.
#[test]
fn new_owner_without_publish_makes_writes_fail() {
    let db = TestDb::new();
    let other = TestRole::new(&db, "newowner", "");
    let mut c = db.connect();
    c.batch_execute(&format!(
        "CREATE TABLE o (id int PRIMARY KEY); SELECT streams.capture('o'); ALTER TABLE o OWNER TO {}",
        other.name
    ))
    .unwrap();
    assert_eq!(sqlstate(&c.batch_execute("INSERT INTO o VALUES (1)").unwrap_err()), "42501");
}

/// Statement shapes (ON CONFLICT, MERGE, writable CTEs, COPY, key
/// change over > 1,000 rows) replay to the table's contents.
#[test]
fn statement_shapes_replay_to_the_table() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute(
        "CREATE TABLE m (id int PRIMARY KEY, v int); SELECT streams.capture('m');
         INSERT INTO m VALUES (1, 1), (2, 2);
         INSERT INTO m VALUES (2, 20), (3, 3) ON CONFLICT (id) DO UPDATE SET v = excluded.v;
         MERGE INTO m USING (VALUES (1, 0), (3, 30), (4, 4)) s(id, v) ON m.id = s.id
           WHEN MATCHED AND s.v = 0 THEN DELETE
           WHEN MATCHED THEN UPDATE SET v = s.v
           WHEN NOT MATCHED THEN INSERT VALUES (s.id, s.v);
         WITH d AS (DELETE FROM m WHERE id = 2 RETURNING *) INSERT INTO m SELECT id, 200 FROM d;
         WITH u AS (UPDATE m SET v = 31 WHERE id = 3 RETURNING 1) UPDATE m SET v = 41 WHERE id = 4;
         COPY m FROM PROGRAM 'seq 10 2600 | sed \"s/$/\\t7/\"';
         UPDATE m SET id = id + 10000 WHERE id >= 10;
         BEGIN; SAVEPOINT s; DELETE FROM m; ROLLBACK TO s; DELETE FROM m WHERE id = 10010; COMMIT;",
    )
    .unwrap();
    settle(&mut c);
    let table: std::collections::BTreeMap<i64, i64> =
        c.query("SELECT id::int8, v::int8 FROM m", &[]).unwrap().iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(replay(&events(&mut c, "public.m")), table);
}

/// The capture guard (an event trigger on every CREATE and ALTER TABLE of
/// the database) runs as whoever runs the DDL: it must not need anything of
/// the schema streams. It named `streams._capture()` through a regprocedure
/// cast, which checks USAGE on the schema, and so every CREATE TABLE of a
/// role without it failed with 42501 (found by the console's hostile review).
#[test]
fn a_role_without_streams_grants_creates_and_alters_tables_in_its_own_schema() {
    let db = TestDb::new();
    let plain = TestRole::new(&db, "plain", "NOLOGIN");
    let mut c = db.connect();
    c.batch_execute(&format!("CREATE SCHEMA app_{p} AUTHORIZATION {p}; SET ROLE {p}", p = plain.name)).unwrap();
    for ddl in [
        format!("CREATE TABLE app_{}.orders (id integer)", plain.name),
        format!("ALTER TABLE app_{}.orders ADD COLUMN total numeric", plain.name),
        format!("CREATE TABLE app_{0}.orders_child () INHERITS (app_{0}.orders)", plain.name),
    ] {
        let done = c.batch_execute(&ddl);
        assert!(done.is_ok(), "{ddl}: {:?}", done.err().and_then(|e| e.as_db_error().map(|d| d.message().to_owned())));
    }
}
