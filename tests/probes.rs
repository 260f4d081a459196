//! Probes of what held (issue 21, point 8), kept so that it stays held:
//! each test is an attack an unprivileged role (or a database owner that is
//! not a superuser) tried, with the exact outcome it got. Only the classes
//! the other files do not cover are here: COPY; EXPLAIN and the planner's
//! statistics; pg_read_all_data; settings a database owner gives its
//! database; special role names; URL forms of webhooks and names that
//! resolve to loopback; publish grants at the edges of their names.

mod common;

use std::io::Read;
use std::net::ToSocketAddrs;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::webhooks::{Behaviour, Receiver, SECRET};
use common::*;
use postgres::Client;

// --- helpers -----------------------------------------------------------------

/// Publish each `(stream, data)` in a transaction of its own as `owner` and
/// wait until all are final; their positions.
fn seed(owner: &mut Client, events: &[(&str, &str)]) -> Vec<i64> {
    let positions: Vec<i64> = events.iter().map(|(stream, data)| publish(owner, stream, data)).collect();
    wait_for_horizon(owner, *positions.last().unwrap());
    positions
}

/// Everything `COPY ... TO STDOUT` sends.
fn copy_out(client: &mut Client, sql: &str) -> Result<Vec<u8>, postgres::Error> {
    let mut out = Vec::new();
    client.copy_out(sql)?.read_to_end(&mut out).expect("reading COPY data");
    Ok(out)
}

/// The numbers that start the lines of COPY's text or CSV output (a header
/// line starts with none).
fn leading_positions(text: &str) -> Vec<i64> {
    text.lines().filter_map(|line| line.split(['\t', ',']).next()?.parse().ok()).collect()
}

/// A client on `db` as `role` whose notices (RAISE NOTICE included) are
/// collected, message and detail, in the returned list.
fn with_notices(db: &TestDb, role: &str) -> (Client, Arc<Mutex<Vec<String>>>) {
    let notices = Arc::new(Mutex::new(Vec::new()));
    let sink = notices.clone();
    let mut config = db.config();
    config.user(role);
    config.notice_callback(move |n| {
        sink.lock().unwrap().push(format!("{} {}", n.message(), n.detail().unwrap_or("")));
    });
    (connect_retrying(&config), notices)
}

/// The text of every row a statement returns (EXPLAIN's plan lines).
fn simple_rows(client: &mut Client, sql: &str) -> Result<Vec<String>, postgres::Error> {
    Ok(client
        .simple_query(sql)?
        .into_iter()
        .filter_map(|m| match m {
            postgres::SimpleQueryMessage::Row(row) => Some(row.get(0).unwrap_or("").to_owned()),
            _ => None,
        })
        .collect())
}

fn is_superuser(role: &str) -> bool {
    admin().query_one("SELECT rolsuper FROM pg_roles WHERE rolname = $1", &[&role]).unwrap().get(0)
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `db` owned by `role` for the test; on drop its settings are reset and a
/// superuser owns it again (before the role is dropped: declare it after).
struct OwnedBy(String);

impl OwnedBy {
    fn new(db: &TestDb, role: &str) -> OwnedBy {
        admin().batch_execute(&format!("ALTER DATABASE {} OWNER TO {role}", db.name)).unwrap();
        OwnedBy(db.name.clone())
    }
}

impl Drop for OwnedBy {
    fn drop(&mut self) {
        if let Ok(mut admin) = base_config().connect(postgres::NoTls) {
            let _ = admin.batch_execute(&format!(
                "ALTER DATABASE {0} RESET ALL; ALTER DATABASE {0} OWNER TO CURRENT_USER",
                self.0
            ));
        }
    }
}

/// A role whose name needs quoting (created LOGIN, dropped with what it
/// owns or was granted in `db`).
struct QuotedRole {
    name: String,
    db: String,
}

impl QuotedRole {
    fn new(db: &TestDb, name: &str) -> QuotedRole {
        assert!(name.len() <= 63, "{name:?} is longer than a role name may be");
        let mut admin = admin();
        admin.batch_execute(&format!("DROP ROLE IF EXISTS {0}; CREATE ROLE {0} LOGIN", quote_ident(name))).unwrap();
        QuotedRole { name: name.to_owned(), db: db.name.clone() }
    }
}

impl Drop for QuotedRole {
    fn drop(&mut self) {
        let mut config = base_config();
        config.dbname(&self.db);
        if let Ok(mut c) = config.connect(postgres::NoTls) {
            let _ = c.batch_execute(&format!("DROP OWNED BY {}", quote_ident(&self.name)));
        }
        if let Ok(mut admin) = base_config().connect(postgres::NoTls) {
            let _ = admin
                .execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", &[&self.name]);
            let _ = admin.batch_execute(&format!("DROP ROLE IF EXISTS {}", quote_ident(&self.name)));
        }
    }
}

/// The webhook tests here need the default address policy (nothing but
/// public addresses); tests/webhooks.rs allows 127.0.0.1 server-wide while
/// it runs, so the two binaries must not run at the same time.
fn require_default_address_policy() {
    wait_until(
        "litebase_streams.webhook_allowed_hosts is empty (tests/webhooks.rs not running)",
        Duration::from_secs(60),
        || {
            admin()
                .query_one("SHOW litebase_streams.webhook_allowed_hosts", &[])
                .unwrap()
                .get::<_, String>(0)
                .is_empty()
        },
    );
}

/// Statements that give a session of ours back the defaults, whatever a
/// database owner set for the database.
const PLAIN_SESSION: &str = "SET ROLE NONE; SET search_path = pg_catalog, pg_temp;
    SET default_transaction_read_only = off; SET default_transaction_isolation = 'read committed';
    SET default_transaction_deferrable = off; SET statement_timeout = 0; SET lock_timeout = 0;
    SET idle_in_transaction_session_timeout = 0; SET idle_session_timeout = 0; SET exit_on_error = off;
    SET row_security = on; SET standard_conforming_strings = on; SET transform_null_equals = off;
    SET array_nulls = on; SET force_parallel_mode = off; SET client_min_messages = notice";

// --- reading -----------------------------------------------------------------

/// A reader of `public.*` copies the log, the view, replay and get with
/// COPY in every format: it gets the final events of its streams only, not
/// another stream's, nor a committed event that is not final yet. A role
/// with schema usage only gets 42501, and nobody writes the log with COPY.
#[test]
fn copy_returns_only_the_final_events_of_granted_streams() {
    let db = TestDb::new();
    let reader = TestRole::new(&db, "reader", "");
    let stranger = TestRole::new(&db, "stranger", "");
    let mut owner = db.connect();
    owner
        .batch_execute(&format!(
            "SELECT streams.grant('read', 'public.*', '{0}'); GRANT USAGE ON SCHEMA streams TO {1}",
            reader.name, stranger.name
        ))
        .unwrap();
    let p = seed(
        &mut owner,
        &[("public.news", r#"{"m":"visible-news"}"#), ("internal.secret", r#"{"m":"s3cr3t-internal"}"#)],
    );
    // A committed event behind an open transaction's: not final yet.
    let mut holder = db.connect();
    holder.batch_execute("BEGIN").unwrap();
    let held: i64 = holder.query_one("SELECT streams.publish('public.held', '{\"m\":\"held\"}')", &[]).unwrap().get(0);
    let late = publish(&mut owner, "public.late", r#"{"m":"not-final-yet"}"#);
    assert!(horizon(&mut owner) < held, "the open transaction holds the horizon");

    let mut r = db.connect_as(&reader.name);
    let text_forms = [
        "COPY streams.event_log TO STDOUT".to_owned(),
        "COPY streams.event_log (position, stream, data) TO STDOUT".to_owned(),
        "COPY streams.event_log TO STDOUT (FORMAT csv, HEADER)".to_owned(),
        "COPY (SELECT * FROM streams.event_log) TO STDOUT".to_owned(),
        "COPY (SELECT * FROM streams.event_log WHERE stream LIKE 'internal%' OR true) TO STDOUT".to_owned(),
        "COPY (SELECT position, stream, data FROM streams.events) TO STDOUT".to_owned(),
        "COPY (SELECT position, stream, data FROM streams.replay(after => 0)) TO STDOUT".to_owned(),
        "COPY (SELECT position, stream, data FROM streams.replay(stream => 'internal.*')) TO STDOUT (FORMAT csv)"
            .to_owned(),
        format!("COPY (SELECT g.* FROM unnest(ARRAY[{}, {}, {late}]) n, streams.get(n) g) TO STDOUT", p[0], p[1]),
    ];
    let copy_all = |r: &mut Client| -> Vec<(String, Vec<i64>, String)> {
        text_forms
            .iter()
            .map(|sql| {
                let text = String::from_utf8(copy_out(r, sql).unwrap_or_else(|e| panic!("{sql}: {e}"))).unwrap();
                (sql.clone(), leading_positions(&text), text)
            })
            .collect()
    };
    for (sql, positions, text) in copy_all(&mut r) {
        let expected = if sql.contains("'internal.*'") { vec![] } else { vec![p[0]] };
        assert_eq!(positions, expected, "{sql}:\n{text}");
        assert!(!text.contains("s3cr3t") && !text.contains("not-final-yet"), "{sql} leaked:\n{text}");
    }
    let binary = copy_out(&mut r, "COPY streams.event_log TO STDOUT (FORMAT binary)").unwrap();
    let contains = |needle: &[u8]| binary.windows(needle.len()).any(|w| w == needle);
    assert!(contains(b"visible-news"), "the binary copy has the readable event");
    assert!(!contains(b"s3cr3t") && !contains(b"not-final-yet"), "the binary copy leaked a hidden event");

    for sql in ["COPY streams.event_log TO STDOUT", "COPY (SELECT * FROM streams.events) TO STDOUT"] {
        let err = copy_out(&mut db.connect_as(&stranger.name), sql).unwrap_err();
        assert_eq!(sqlstate(&err), "42501", "stranger: {sql}");
    }
    let err = db.connect_as(&reader.name).batch_execute("COPY streams.event_log FROM STDIN").unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "a reader cannot append to the log with COPY FROM");
    let err = db.connect_as(&reader.name).batch_execute("COPY streams.event_log TO '/tmp/lbs_probe_copy'").unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "nor write it to a server file");

    // Once the held transaction commits, both are final and copied.
    holder.batch_execute("COMMIT").unwrap();
    wait_for_horizon(&mut owner, late);
    let text = String::from_utf8(copy_out(&mut r, "COPY streams.event_log TO STDOUT").unwrap()).unwrap();
    let mut copied = leading_positions(&text);
    copied.sort_unstable();
    assert_eq!(copied, vec![p[0], held, late], "{text}");
}

/// A cheap function that RAISEs a NOTICE with its arguments, in the reader's
/// WHERE clause, joins, sub-selects and ORDER BY, run plainly and under
/// EXPLAIN (ANALYZE, VERBOSE, ...), and casts that fail on the hidden rows'
/// values: neither a notice, a plan line nor an error names a hidden event.
#[test]
fn explain_analyze_and_leaky_functions_never_see_hidden_events() {
    let db = TestDb::new();
    let reader = TestRole::new(&db, "reader", "");
    let mut owner = db.connect();
    owner
        .batch_execute(&format!(
            "SELECT streams.grant('read', 'public.*', '{0}'); GRANT CREATE ON SCHEMA public TO {0}",
            reader.name
        ))
        .unwrap();
    // The hidden events' "n" is not a number: a cast that reached them would fail, naming it.
    seed(
        &mut owner,
        &[
            ("public.news", r#"{"n": 1, "m": "visible-news"}"#),
            ("internal.secret", r#"{"n": "s3cr3t-n", "m": "s3cr3t-internal"}"#),
            ("internal.secret", r#"{"n": "s3cr3t-n2", "m": "s3cr3t-internal2"}"#),
            ("public.other", r#"{"n": 2, "m": "visible-other"}"#),
        ],
    );
    let (mut r, notices) = with_notices(&db, &reader.name);
    r.batch_execute(
        "CREATE FUNCTION public.leak(s text, d jsonb) RETURNS boolean LANGUAGE plpgsql COST 0.0000001 AS
         $$ BEGIN RAISE NOTICE 'leak % %', s, d; RETURN true; END $$",
    )
    .unwrap();
    let err = r.batch_execute("ALTER FUNCTION public.leak(text, jsonb) LEAKPROOF").unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "only a superuser marks a function leakproof");

    // No casts in the arguments: the call costs next to nothing, so the
    // planner would run it before any ordinary condition.
    let leak = "public.leak(e.stream, e.data)";
    let queries = [
        format!("SELECT * FROM streams.event_log e WHERE {leak}"),
        format!("SELECT * FROM streams.event_log e WHERE e.position > 0 AND {leak} ORDER BY e.position"),
        format!("SELECT * FROM streams.event_log e WHERE e.stream >= 'a' AND e.stream < 'z' AND {leak}"),
        format!("SELECT * FROM streams.event_log e WHERE {leak} OR e.position < 0"),
        format!("SELECT count(*) FILTER (WHERE {leak}) FROM streams.event_log e"),
        format!("SELECT * FROM streams.event_log e JOIN LATERAL (SELECT 1 WHERE {leak}) l ON true"),
        format!("SELECT * FROM streams.event_log e WHERE EXISTS (SELECT 1 WHERE {leak})"),
        format!("SELECT * FROM streams.event_log e, streams.event_log f WHERE e.position = f.position AND {leak}"),
        format!("SELECT * FROM streams.event_log e ORDER BY {leak}"),
        format!("SELECT * FROM streams.events e WHERE {leak}"),
        format!("SELECT * FROM streams.events e WHERE e.tx IS NOT NULL AND {leak}"),
        format!("SELECT * FROM streams.replay(after => 0) e WHERE {leak}"),
        format!("SELECT * FROM streams.replay(stream => 'internal.*') e WHERE {leak}"),
    ];
    let mut plans = Vec::new();
    for query in &queries {
        for explain in
            ["", "EXPLAIN (ANALYZE) ", "EXPLAIN (ANALYZE, VERBOSE, BUFFERS, SETTINGS) ", "EXPLAIN (VERBOSE) "]
        {
            let sql = format!("{explain}{query}");
            let rows = simple_rows(&mut r, &sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
            if !explain.is_empty() {
                plans.extend(rows);
            }
        }
    }
    for query in [
        "SELECT count(*) FROM streams.event_log e WHERE (e.data->>'n')::int > 0",
        "SELECT count(*) FROM streams.events e WHERE (e.data->>'n')::int > 0",
        "SELECT count(*) FROM streams.replay() e WHERE (e.data->>'n')::int > 0",
        "EXPLAIN ANALYZE SELECT * FROM streams.event_log e WHERE (e.data->>'n')::numeric > 0",
        "SELECT * FROM streams.event_log e ORDER BY (e.data->>'n')::int",
    ] {
        simple_rows(&mut r, query).unwrap_or_else(|e| panic!("a cast reached a hidden event ({query}): {e}"));
    }
    let notices = notices.lock().unwrap().clone();
    let seen = format!("{}\n{}", notices.join("\n"), plans.join("\n"));
    assert!(!seen.contains("s3cr3t") && !seen.contains("internal.secret"), "a hidden event leaked:\n{seen}");
    assert!(notices.iter().any(|n| n.contains("visible-news")), "the function did run on readable events: {notices:?}");
}

/// The planner runs an operator's function on a column's statistics (most
/// common values, histogram) to estimate a condition. A reader's operators
/// with a NOTICE in their function, on the log's columns, see none of them,
/// and pg_stats shows the reader no row of the log; on a table of its own
/// the same operators do see the statistics (so the probe would notice).
#[test]
fn planner_statistics_reveal_no_hidden_stream_or_data() {
    let db = TestDb::new();
    let reader = TestRole::new(&db, "reader", "");
    let mut owner = db.connect();
    owner
        .batch_execute(&format!(
            "SELECT streams.grant('read', 'public.*', '{0}'); GRANT CREATE ON SCHEMA public TO {0}",
            reader.name
        ))
        .unwrap();
    let last: i64 = owner
        .query_one(
            "SELECT max(p) FROM (
                 SELECT streams.publish('internal.s3cr3t-' || (i % 3), jsonb_build_object('k', 's3cr3t-data-' || (i % 3))) p
                 FROM generate_series(1, 300) i
                 UNION ALL
                 SELECT streams.publish('internal.s3cr3t-h' || i, jsonb_build_object('k', 's3cr3t-h' || i))
                 FROM generate_series(1, 200) i
                 UNION ALL
                 SELECT streams.publish('public.news', '{\"k\": \"visible\"}') FROM generate_series(1, 20)) s",
            &[],
        )
        .unwrap()
        .get(0);
    wait_for_horizon(&mut owner, last);
    owner.batch_execute("ANALYZE streams.event_log").unwrap();
    let stats: i64 = owner
        .query_one("SELECT count(*) FROM pg_stats WHERE schemaname = 'streams' AND tablename = 'event_log'", &[])
        .unwrap()
        .get(0);
    assert!(stats > 0, "the log has statistics");

    let (mut r, notices) = with_notices(&db, &reader.name);
    r.batch_execute(
        "CREATE FUNCTION public.peek(a text, b text) RETURNS boolean LANGUAGE plpgsql AS
             $$ BEGIN RAISE NOTICE 'peek % %', a, b; RETURN a < b; END $$;
         CREATE OPERATOR public.<<< (LEFTARG = text, RIGHTARG = text, FUNCTION = public.peek, RESTRICT = scalarltsel);
         CREATE OPERATOR public.=== (LEFTARG = text, RIGHTARG = text, FUNCTION = public.peek,
                                     RESTRICT = eqsel, JOIN = eqjoinsel);
         CREATE FUNCTION public.jpeek(a jsonb, b jsonb) RETURNS boolean LANGUAGE plpgsql AS
             $$ BEGIN RAISE NOTICE 'jpeek % %', a, b; RETURN a = b; END $$;
         CREATE OPERATOR public.=== (LEFTARG = jsonb, RIGHTARG = jsonb, FUNCTION = public.jpeek,
                                     RESTRICT = eqsel, JOIN = eqjoinsel);
         CREATE TABLE public.mine AS
             SELECT 'mine-' || (i % 3) AS stream, jsonb_build_object('k', 'mine-' || (i % 3)) AS data
             FROM generate_series(1, 300) i;
         ANALYZE public.mine;",
    )
    .unwrap();
    let probes = |table: &str| {
        [
            format!("EXPLAIN SELECT * FROM {table} e WHERE e.stream OPERATOR(public.<<<) 'm'"),
            format!("EXPLAIN SELECT * FROM {table} e WHERE e.stream OPERATOR(public.===) 'x'"),
            format!("EXPLAIN SELECT * FROM {table} e WHERE e.data OPERATOR(public.===) '{{}}'"),
            format!("EXPLAIN SELECT * FROM {table} a JOIN {table} b ON a.stream OPERATOR(public.===) b.stream"),
        ]
    };
    for sql in probes("public.mine") {
        r.batch_execute(&sql).unwrap();
    }
    let control = std::mem::take(&mut *notices.lock().unwrap());
    assert!(
        control.iter().any(|n| n.contains("mine-")),
        "on an unprotected table the planner runs the operators on its statistics: {control:?}"
    );
    for table in ["streams.event_log", "streams.events"] {
        for sql in probes(table) {
            let plan = simple_rows(&mut r, &sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
            assert!(!plan.join("\n").contains("s3cr3t"), "{sql}: {plan:?}");
        }
    }
    let leaked = notices.lock().unwrap().clone();
    assert!(leaked.is_empty(), "the planner ran the reader's operator on the log's statistics: {leaked:?}");
    let visible: i64 = r
        .query_one("SELECT count(*) FROM pg_stats WHERE schemaname = 'streams' AND tablename = 'event_log'", &[])
        .unwrap()
        .get(0);
    assert_eq!(visible, 0, "pg_stats shows the reader none of the log's statistics");
}

/// A member of pg_read_all_data (SELECT on every table and view) reads
/// every relation of schema `streams`, plainly and with COPY: no event
/// data, no webhook secret or URL.
#[test]
fn pg_read_all_data_reads_no_event_data_secret_or_webhook_url() {
    let db = TestDb::new();
    let snoop = TestRole::new(&db, "snoop", "");
    let mut owner = db.connect();
    owner.batch_execute(&format!("GRANT pg_read_all_data TO {}", snoop.name)).unwrap();
    // Paused in the transaction that creates it: no request is ever made.
    owner
        .batch_execute(&format!(
            "BEGIN;
             SELECT streams.create_webhook('hook', 'internal.*', 'https://example.com/hook?token=u-r-l-s3cr3t',
                                           secret => '{SECRET}');
             SELECT streams.pause_webhook('hook');
             SELECT streams.create_subscription('sub', 'internal.*', after => 0);
             COMMIT"
        ))
        .unwrap();
    seed(&mut owner, &[("internal.secret", r#"{"m":"s3cr3t-internal"}"#)]);
    let key = SECRET.trim_start_matches("whsec_");

    let relations: Vec<String> = owner
        .query(
            "SELECT c.oid::regclass::text FROM pg_class c
             WHERE c.relnamespace = 'streams'::regnamespace AND c.relkind IN ('r', 'v', 'm', 'p') ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(relations.iter().any(|r| r == "streams.webhook_state"), "{relations:?}");
    let mut s = db.connect_as(&snoop.name);
    let mut read = Vec::new();
    for relation in &relations {
        match simple_rows(&mut s, &format!("SELECT t::text FROM {relation} t")) {
            Ok(rows) => read.extend(rows.into_iter().map(|row| format!("{relation}: {row}"))),
            // A view may call a function pg_read_all_data may not execute.
            Err(e) => assert_eq!(sqlstate(&e), "42501", "{relation}: {e}"),
        }
    }
    for relation in ["streams.event_log", "streams.webhook_state", "streams.subscription_state"] {
        let text = String::from_utf8(copy_out(&mut s, &format!("COPY {relation} TO STDOUT")).unwrap()).unwrap();
        assert_eq!(text, "", "COPY {relation}");
    }
    let read = read.join("\n");
    assert!(!read.contains("s3cr3t") && !read.contains(key), "pg_read_all_data read:\n{read}");
}

// --- settings a database owner gives its database -------------------------

/// The owner of a database (not a superuser) plants exact-type operators
/// in schema public (which it owns) and puts public before pg_catalog in
/// the database's search_path. A superuser then installs the extension, the
/// worker restarts and the webhook worker starts: none of them ever runs
/// the owner's code, and the owner stays unprivileged.
#[test]
fn a_database_owner_cannot_run_code_in_the_workers_through_search_path() {
    let db = TestDb::without_extension();
    let attacker = TestRole::new(&db, "dbowner", "");
    let _owned = OwnedBy::new(&db, &attacker.name);
    let mut evil = db.connect_as(&attacker.name);
    let mut traps = format!(
        "CREATE TABLE public.evidence (who text, backend text);
         GRANT INSERT ON public.evidence TO PUBLIC;
         CREATE FUNCTION public.escalate() RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
         BEGIN
             INSERT INTO public.evidence VALUES (current_user::text,
                 (SELECT a.backend_type FROM pg_catalog.pg_stat_activity a
                  WHERE a.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()));
             IF (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) current_user) THEN
                 EXECUTE 'ALTER ROLE {} SUPERUSER';
             END IF;
         END $$;",
        attacker.name
    );
    let types = "oid,integer oid,oid name,name name,text text,text integer,integer bigint,bigint bigint,integer \
                 integer,bigint boolean,boolean";
    for (i, (left, right)) in types.split_whitespace().filter_map(|pair| pair.split_once(',')).enumerate() {
        for (j, op) in ["=", "<>", "<", "<=", ">", ">="].iter().enumerate() {
            traps.push_str(&format!(
                "CREATE FUNCTION public.trap_{i}_{j}(a {left}, b {right}) RETURNS boolean LANGUAGE plpgsql
                     SET search_path = pg_catalog, pg_temp AS
                     $$ BEGIN PERFORM public.escalate(); RETURN a OPERATOR(pg_catalog.{op}) b; END $$;
                 CREATE OPERATOR public.{op} (LEFTARG = {left}, RIGHTARG = {right}, FUNCTION = public.trap_{i}_{j});"
            ));
        }
    }
    evil.batch_execute(&traps).unwrap();
    evil.batch_execute(&format!("ALTER DATABASE {} SET search_path = public, pg_catalog", db.name)).unwrap();
    drop(evil);

    let mut c = db.connect();
    c.batch_execute(PLAIN_SESSION).unwrap();
    let check = |c: &mut Client, when: &str| {
        let p: i64 = c.query_one("SELECT streams.publish('orders', '{}')", &[]).unwrap().get(0);
        wait_for_horizon(c, p);
        let ran: Vec<(Option<String>, Option<String>)> = c
            .query("SELECT who, backend FROM public.evidence", &[])
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        assert!(ran.is_empty(), "{when}: the database owner's operators ran as (role, process) {ran:?}");
        assert!(!is_superuser(&attacker.name), "{when}: the database owner became a superuser");
    };
    c.batch_execute("CREATE EXTENSION litebase_streams").unwrap();
    let first = db.wait_for_worker();
    check(&mut c, "after CREATE EXTENSION");

    admin().execute("SELECT pg_terminate_backend($1)", &[&first]).unwrap();
    wait_until("a new worker replaces the terminated one", Duration::from_secs(20), || db.wait_for_worker() != first);
    // A webhook to a name that never resolves: its first attempt shows the
    // webhook worker has started (and pinned its settings) and done a turn.
    c.batch_execute("SELECT streams.create_webhook('probe', 'orders', 'http://webhook-probe.invalid/', after => 0)")
        .unwrap();
    wait_until("the webhook worker tried the webhook", Duration::from_secs(60), || {
        c.query_one("SELECT attempts FROM streams.webhooks WHERE name = 'probe'", &[]).unwrap().get::<_, i32>(0) >= 1
    });
    check(&mut c, "after a worker restart and the webhook worker's start");
}

/// The owner of a database (not a superuser) cannot set the extension's
/// settings for it (42501 for superuser settings, 55P02 for server-wide
/// ones), nor the bootstrap superuser's settings in it. What it may set
/// (role, read-only and serializable transactions, timeouts,
/// exit_on_error, row_security, date and number formats, parallel query,
/// ...) leaves the worker delivering every event with the same payloads,
/// without restarting.
#[test]
fn database_settings_of_its_owner_do_not_change_what_the_worker_does() {
    let db = TestDb::new();
    let dbowner = TestRole::new(&db, "dbowner", "");
    let _owned = OwnedBy::new(&db, &dbowner.name);
    let mut evil = db.connect_as(&dbowner.name);
    let settings: Vec<(String, String)> = evil
        .query("SELECT name, context FROM pg_settings WHERE name LIKE 'litebase\\_streams.%' ORDER BY name", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert!(settings.len() >= 10, "{settings:?}");
    for (name, context) in
        settings.iter().map(|(n, c)| (n.as_str(), c.as_str())).chain([("litebase_streams.no_such", "superuser")])
    {
        let expected = match context {
            "superuser" => "42501",
            "sighup" | "postmaster" => "55P02",
            other => panic!("{name} is a {other} setting: a database owner could set it for the worker"),
        };
        let err = evil.batch_execute(&format!("ALTER DATABASE {} SET {name} = '1'", db.name)).unwrap_err();
        assert_eq!(sqlstate(&err), expected, "ALTER DATABASE SET {name}: {err}");
    }
    let bootstrap: String = evil.query_one("SELECT rolname::text FROM pg_roles WHERE oid = 10", &[]).unwrap().get(0);
    let err = evil
        .batch_execute(&format!("ALTER ROLE {bootstrap} IN DATABASE {} SET search_path = public", db.name))
        .unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "the worker's own role's settings");

    // Before: a payload to compare with.
    let mut c = db.connect();
    let mut listener = Listener::on(db.connect(), &["orders"]);
    let shape = |event: &serde_json::Value| -> String {
        let time = event["time"].as_str().unwrap_or_else(|| panic!("a time: {event}"));
        time.chars().map(|ch| if ch.is_ascii_digit() { '0' } else { ch }).collect()
    };
    let data = r#"{"f": 0.1, "n": 12345678901234567890, "s": "a\\b"}"#;
    let before = publish(&mut c, "orders", data);
    let got = listener.collect(1, Duration::from_secs(10));
    assert_eq!(got[0]["position"].as_i64(), Some(before));
    let time_shape = shape(&got[0]);
    let expected_data: serde_json::Value = serde_json::from_str(data).unwrap();

    let hostile = [
        ("role", dbowner.name.as_str()),
        ("default_transaction_read_only", "on"),
        ("default_transaction_isolation", "serializable"),
        ("default_transaction_deferrable", "on"),
        ("lock_timeout", "1ms"),
        ("exit_on_error", "on"),
        ("row_security", "off"),
        ("transform_null_equals", "on"),
        ("standard_conforming_strings", "off"),
        ("array_nulls", "off"),
        ("DateStyle", "SQL, DMY"),
        ("TimeZone", "Pacific/Chatham"),
        ("IntervalStyle", "sql_standard"),
        ("extra_float_digits", "-15"),
        ("plan_cache_mode", "force_generic_plan"),
        ("max_parallel_workers_per_gather", "4"),
        ("force_parallel_mode", "on"),
        ("search_path", "public"),
        ("client_min_messages", "error"),
        ("work_mem", "64kB"),
    ];
    for (name, value) in hostile {
        evil.batch_execute(&format!("ALTER DATABASE {} SET {name} = '{value}'", db.name))
            .unwrap_or_else(|e| panic!("the owner sets {name}: {e}"));
    }
    drop(evil);
    let old = db.wait_for_worker();
    admin().execute("SELECT pg_terminate_backend($1)", &[&old]).unwrap();
    wait_until("a new worker replaces the terminated one", Duration::from_secs(20), || db.wait_for_worker() != old);
    let worker = db.wait_for_worker();

    let mut c = db.connect();
    c.batch_execute(PLAIN_SESSION).unwrap();
    let mut listen = db.connect();
    listen.batch_execute(PLAIN_SESSION).unwrap();
    let mut listener = Listener::on(listen, &["orders"]);
    let after: Vec<i64> = (0..3).map(|_| publish(&mut c, "orders", data)).collect();
    wait_for_horizon(&mut c, after[2]);
    let got = listener.collect(3, Duration::from_secs(20));
    assert_eq!(got.iter().map(|e| e["position"].as_i64().unwrap()).collect::<Vec<_>>(), after);
    for event in &got {
        assert_eq!(shape(event), time_shape, "the time is written as before: {event}");
        assert_eq!(event["data"], expected_data, "the data as published: {event}");
    }
    assert_eq!(db.wait_for_worker(), worker, "the worker did not restart meanwhile");
}

/// Roles whose names need quoting (a quote, spaces, upper case, a comma
/// list, a double quote, "Public", non-ASCII, 63 bytes) are granted, read,
/// publish, subscribe and are revoked exactly as named: no grant reaches
/// PUBLIC or another role.
#[test]
fn special_role_names_are_granted_exactly_and_inject_nothing() {
    let db = TestDb::new();
    let bystander = TestRole::new(&db, "bystander", "");
    let d = &db.name;
    let long = format!("{d}_{}", "x".repeat(62 - d.len()));
    let names = [
        format!("{d}_o'hara"),
        format!("{d} spaced name"),
        format!("{d}_MixedCase"),
        format!("{d}_a, public"),
        format!("{d}_q\", public, \"x"),
        format!("{d}_x');GRANT pg_read_all_data TO public--"),
        "Public".to_owned(),
        format!("{d}_ünï-cødé"),
        format!("{d} "),
        long,
    ];
    let roles: Vec<QuotedRole> = names.iter().map(|n| QuotedRole::new(&db, n)).collect();
    let mut owner = db.connect();
    let mut oids = Vec::new();
    for (i, role) in roles.iter().enumerate() {
        let oid: u32 = owner.query_one("SELECT oid FROM pg_roles WHERE rolname = $1", &[&role.name]).unwrap().get(0);
        oids.push(oid);
        let stream = format!("special.s{i}");
        // By OID, and by the quoted name as text.
        let quoted = quote_ident(&role.name);
        for privilege in ["read", "publish"] {
            let granted = if i % 2 == 0 {
                owner.execute(&format!("SELECT streams.grant('{privilege}', $1, $2::oid::regrole)"), &[&stream, &oid])
            } else {
                owner.execute(
                    &format!("SELECT streams.grant('{privilege}', $1, $2::text::regrole)"),
                    &[&stream, &quoted],
                )
            };
            granted.unwrap_or_else(|e| panic!("grant {privilege} to {:?}: {e}", role.name));
        }
    }
    let grants: Vec<(u32, String, String)> = owner
        .query("SELECT grantee::oid, privilege, stream FROM streams.stream_grants ORDER BY stream, privilege", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let mut expected: Vec<(u32, String, String)> = oids
        .iter()
        .enumerate()
        .flat_map(|(i, oid)| ["publish", "read"].map(|p| (*oid, p.to_owned(), format!("special.s{i}"))))
        .collect();
    expected.sort_by(|a, b| (&a.2, &a.1).cmp(&(&b.2, &b.1)));
    assert_eq!(grants, expected, "each grant names its role");
    let public_acl: Vec<String> = owner
        .query(
            "SELECT c.oid::regclass::text FROM pg_class c, aclexplode(c.relacl) a
             WHERE c.relnamespace = 'streams'::regnamespace AND a.grantee = 0 AND a.privilege_type <> 'SELECT'
             UNION ALL
             SELECT c.oid::regclass::text FROM pg_class c, aclexplode(c.relacl) a
             WHERE c.oid IN ('streams.event_log'::regclass, 'streams.events'::regclass) AND a.grantee = 0
             UNION ALL
             SELECT p.oid::regprocedure::text FROM pg_proc p, aclexplode(p.proacl) a
             WHERE p.oid IN ('streams.publish(text,jsonb)'::regprocedure, 'streams.replay(text,bigint,timestamptz,xid8,integer)'::regprocedure,
                             'streams.get(bigint)'::regprocedure, 'streams._replay_start(timestamptz,xid8)'::regprocedure)
               AND a.grantee = 0",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(public_acl.is_empty(), "PUBLIC was granted {public_acl:?}");
    let mut ours: Vec<String> = roles.iter().map(|r| r.name.clone()).collect();
    ours.push(bystander.name.clone());
    let members: Vec<String> = owner
        .query(
            "SELECT r.rolname::text FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.member
             WHERE m.roleid = 'pg_read_all_data'::regrole AND r.rolname = ANY($1)",
            &[&ours],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(members.is_empty(), "granted pg_read_all_data: {members:?}");

    let p: Vec<i64> =
        (0..roles.len()).map(|i| publish(&mut owner, &format!("special.s{i}"), &format!(r#"{{"i":{i}}}"#))).collect();
    wait_for_horizon(&mut owner, *p.last().unwrap());
    for (i, role) in roles.iter().enumerate() {
        let mut c = db.connect_as(&role.name);
        let seen: Vec<String> = c
            .query("SELECT stream FROM streams.events ORDER BY position", &[])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(seen, [format!("special.s{i}")], "{:?} reads its stream only", role.name);
        c.query_one("SELECT streams.publish($1, '{}')", &[&format!("special.s{i}")]).unwrap();
        let other = format!("special.s{}", (i + 1) % roles.len());
        let err = c.query_one("SELECT streams.publish($1, '{}')", &[&other]).unwrap_err();
        assert_eq!(sqlstate(&err), "42501", "{:?} publishes to {other}", role.name);
        c.batch_execute(&format!("SELECT streams.create_subscription('sub_{i}', 'special.s{i}', after => 0)")).unwrap();
        c.batch_execute("BEGIN").unwrap();
        let polled: Vec<i64> = c
            .query(&format!("SELECT position FROM streams.poll('sub_{i}')"), &[])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        c.batch_execute("COMMIT").unwrap();
        assert_eq!(polled.first(), Some(&p[i]), "{:?} polls its subscription", role.name);
        let subs: Vec<String> =
            c.query("SELECT name FROM streams.subscriptions", &[]).unwrap().iter().map(|r| r.get(0)).collect();
        assert_eq!(subs, [format!("sub_{i}")], "{:?} sees its own subscription only", role.name);
    }
    let mut b = db.connect_as(&bystander.name);
    for sql in [
        "SELECT * FROM streams.event_log",
        "SELECT * FROM streams.events",
        "SELECT streams.publish('special.s0', '{}')",
    ] {
        assert_eq!(sqlstate(&b.batch_execute(sql).unwrap_err()), "42501", "bystander: {sql}");
    }
    for (i, role) in roles.iter().enumerate() {
        let removed: bool = owner
            .query_one("SELECT streams.revoke('read', $1, $2::oid::regrole)", &[&format!("special.s{i}"), &oids[i]])
            .unwrap()
            .get(0);
        assert!(removed, "revoke from {:?}", role.name);
        let err = db.connect_as(&role.name).batch_execute("SELECT * FROM streams.events").unwrap_err();
        assert_eq!(sqlstate(&err), "42501", "{:?} after the revoke", role.name);
    }
}

// --- webhook addresses -------------------------------------------------------

/// URL forms of non-public addresses, separated by whitespace.
const NON_PUBLIC_URLS: &str = r"
    http://127.0.0.1/ http://127.0.0.1:5432/ https://127.0.0.1:443/ HTTP://127.0.0.1/ http://127.1/
    http://127.0.0.1./ http://0x7f000001/ http://0x7f.0x0.0x0.0x1/ http://2130706433/ http://0177.0.0.1/
    http://017700000001/ http://%31%32%37.0.0.1/ http://①②⑦.0.0.1/ http://127。0。0。1/ http://0/
    http://0.0.0.0:8080/ http://[::]/ http://[::1]/ http://[0:0:0:0:0:0:0:1]/ http://[::ffff:127.0.0.1]/
    http://[::ffff:7f00:1]/ http://[0:0:0:0:0:ffff:127.0.0.1]/ http://[::127.0.0.1]/ http://[64:ff9b::7f00:1]/
    http://[2002:7f00:1::]/ http://localhost/ http://LOCALHOST/ http://localhost./ http://api.localhost/
    http://ｌｏｃａｌｈｏｓｔ/ http://169.254.169.254/latest/meta-data/ http://0xa9fea9fe/ http://2852039166/
    http://0251.0376.0251.0376/ http://169.254.43518/ http://[::ffff:169.254.169.254]/ http://[fd00:ec2::254]/
    http://10.0.0.1/ http://10.255.255.255/ http://172.16.0.1/ http://172.31.255.255/ http://192.168.0.1/
    http://100.64.0.1/ http://198.18.0.1/ http://192.0.0.170/ http://192.0.2.1/ http://224.0.0.1/
    http://255.255.255.255/ http://240.0.0.1/ http://[fc00::1]/ http://[fd12:3456::1]/ http://[fe80::1]/
    http://[fe80::1%25eth0]/ http://[fec0::1]/ http://[ff02::1]/ http://[2001:db8::1]/ http://user@127.0.0.1/
    http://example.com@127.0.0.1/ http://127.0.0.1:80@example.com/ http://127.0.0.1#@example.com/
    http://127.0.0.1\@example.com/ http:127.0.0.1/ http:/127.0.0.1/ http:///127.0.0.1/ //127.0.0.1/
    http://127.0.0.1%00.example.com/ http://127.0.0.1:99999/ file:///etc/passwd gopher://127.0.0.1:6379/_INFO
    dict://127.0.0.1:11211/ ws://127.0.0.1/ ftp://127.0.0.1/
";

/// A role that may create webhooks tries the forms of loopback, private,
/// link-local, metadata and other non-public addresses a URL can spell
/// (numeric and octal IPv4, IPv4 in IPv6, trailing dots, IDNA digits,
/// percent-encoding, credentials, backslashes, schemes): each is refused
/// with 22023 and nothing is created; a public host is accepted.
#[test]
fn ssrf_url_forms_are_refused_when_a_webhook_is_created() {
    require_default_address_policy();
    let db = TestDb::new();
    let app = TestRole::new(&db, "app", "");
    db.connect()
        .batch_execute(&format!(
            "SELECT streams.grant('read', 'orders', '{0}');
             GRANT EXECUTE ON FUNCTION streams.create_webhook(text, text, text, bigint, text, integer) TO {0}",
            app.name
        ))
        .unwrap();
    let mut a = db.connect_as(&app.name);
    // And two the URL parser trims: a leading space, a tab inside.
    let forms = NON_PUBLIC_URLS.split_whitespace().chain([" http://127.0.0.1/", "http://127.0.0.1\t/"]);
    let mut accepted = Vec::new();
    for url in forms {
        match a.query_one("SELECT streams.create_webhook('w', 'orders', $1)", &[&url]) {
            Ok(_) => {
                accepted.push(url);
                a.batch_execute("SELECT streams.drop_webhook('w')").unwrap();
            }
            Err(e) => assert_eq!(sqlstate(&e), "22023", "{url}: {e}"),
        }
    }
    assert!(accepted.is_empty(), "accepted: {accepted:?}");
    let n: i64 = a.query_one("SELECT count(*) FROM streams.webhooks", &[]).unwrap().get(0);
    assert_eq!(n, 0, "nothing created");
    // A public host is accepted (in a transaction rolled back: no worker starts).
    a.batch_execute("BEGIN").unwrap();
    for url in
        ["https://example.com/hook", "http://93.184.216.34:8080/", "http://[2606:2800:220:1:248:1893:25c8:1946]/"]
    {
        a.query_one("SELECT streams.create_webhook($1, 'orders', $2)", &[&format!("ok{}", url.len()), &url])
            .unwrap_or_else(|e| panic!("{url} is public: {e}"));
    }
    a.batch_execute("ROLLBACK").unwrap();
}

/// Publish grants match names literally (`_` is no wildcard, case counts,
/// an exact grant covers no sub-stream, `a.b.*` does not cover `a.b`) at
/// every entry point, `_publish_batch` included; a read grant does not let
/// a role publish.
#[test]
fn publish_grants_match_names_literally_at_every_entry_point() {
    let db = TestDb::new();
    let (app, reader) = (TestRole::new(&db, "app", ""), TestRole::new(&db, "reader", ""));
    let mut owner = db.connect();
    owner
        .batch_execute(&format!(
            "SELECT streams.grant('publish', 'pay_ment', '{0}'), streams.grant('publish', 'orders.eu.*', '{0}');
             SELECT streams.grant('read', '*', '{1}')",
            app.name, reader.name
        ))
        .unwrap();
    let mut a = db.connect_as(&app.name);
    let stored = count_stored(&mut owner);
    for sql in [
        "SELECT streams.publish('payXment', '{}')",
        "SELECT streams.publish('pay-ment', '{}')",
        "SELECT streams.publish('Pay_ment', '{}')",
        "SELECT streams.publish('PAY_MENT', '{}')",
        "SELECT streams.publish('pay_ment.x', '{}')",
        "SELECT streams.publish('pay_ment_', '{}')",
        "SELECT streams.publish('orders.eu', '{}')",
        "SELECT streams.publish('orders.eux', '{}')",
        "SELECT streams.publish('orders.EU.x', '{}')",
        "SELECT streams.publish('orders.', '{}')",
        "SELECT * FROM streams.publish_batch('payXment', ARRAY['{}'::jsonb])",
        "SELECT streams._publish_batch('payXment', ARRAY['{}'::jsonb])",
        "SELECT streams._publish_batch('orders.eu', ARRAY['{}'::jsonb, '{}'])",
    ] {
        assert_eq!(sqlstate(&a.batch_execute(sql).unwrap_err()), "42501", "{sql}");
    }
    assert_eq!(count_stored(&mut owner), stored, "refused publishes wrote nothing");
    for sql in [
        "SELECT streams.publish('pay_ment', '{}')",
        "SELECT streams.publish('orders.eu.x', '{}')",
        "SELECT streams._publish_batch('orders.eu.y', ARRAY['{}'::jsonb])",
    ] {
        a.batch_execute(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    assert_eq!(count_stored(&mut owner), stored + 3);
    let mut r = db.connect_as(&reader.name);
    for sql in ["SELECT streams.publish('orders', '{}')", "SELECT streams._publish_batch('orders', ARRAY['{}'::jsonb])"]
    {
        assert_eq!(sqlstate(&r.batch_execute(sql).unwrap_err()), "42501", "reader: {sql}");
    }
}
