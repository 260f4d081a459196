//! Probes of what held (issue 21, point 8), kept so that it stays held:
//! each test is an attack an unprivileged role tried, with the exact outcome
//! it got. This file: reading around the privileges. COPY; EXPLAIN and
//! leaky functions; the planner's statistics; pg_read_all_data. The other
//! probes are in tests/probes.rs.
#![cfg(feature = "integration")]

mod common;

use std::io::Read;
use std::sync::{Arc, Mutex};

use common::webhooks::SECRET;
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

// --- reading -----------------------------------------------------------------

/// A reader of `public.*` copies the log (by query: COPY of the partitioned
/// log by name is refused, 42809), the view, replay and get with COPY in
/// every format: it gets the final events of its streams only, not
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
    // The log is partitioned: COPY of it by name is refused (PostgreSQL
    // would copy only the parent for a role under row security: nothing).
    for sql in [
        "COPY streams.event_log TO STDOUT",
        "COPY streams.event_log (position, stream, data) TO STDOUT",
        "COPY streams.event_log TO STDOUT (FORMAT csv, HEADER)",
    ] {
        let err = copy_out(&mut db.connect_as(&reader.name), sql).unwrap_err();
        assert_eq!(sqlstate(&err), "42809", "{sql}: {err}");
    }
    let text_forms = [
        "COPY (SELECT * FROM streams.event_log) TO STDOUT".to_owned(),
        "COPY (SELECT position, stream, data FROM streams.event_log) TO STDOUT (FORMAT csv, HEADER)".to_owned(),
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
    let binary = copy_out(&mut r, "COPY (SELECT * FROM streams.event_log) TO STDOUT (FORMAT binary)").unwrap();
    let contains = |needle: &[u8]| binary.windows(needle.len()).any(|w| w == needle);
    assert!(contains(b"visible-news"), "the binary copy has the readable event");
    assert!(!contains(b"s3cr3t") && !contains(b"not-final-yet"), "the binary copy leaked a hidden event");

    for sql in ["COPY streams.event_log TO STDOUT", "COPY (SELECT * FROM streams.events) TO STDOUT"] {
        let err = copy_out(&mut db.connect_as(&stranger.name), sql).unwrap_err();
        assert_eq!(sqlstate(&err), "42501", "stranger: {sql}");
    }
    let err = db.connect_as(&reader.name).batch_execute("COPY streams.event_log FROM STDIN").unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "a reader cannot append to the log with COPY FROM");
    for sql in [
        "COPY streams.event_log TO '/tmp/lbs_probe_copy'",
        "COPY (SELECT * FROM streams.events) TO '/tmp/lbs_probe_copy'",
    ] {
        let err = db.connect_as(&reader.name).batch_execute(sql).unwrap_err();
        assert!(["42501", "42809"].contains(&sqlstate(&err).as_str()), "nor write it to a server file: {sql}: {err}");
    }
    assert!(!std::path::Path::new("/tmp/lbs_probe_copy").exists(), "no server file written");

    // Once the held transaction commits, both are final and copied.
    holder.batch_execute("COMMIT").unwrap();
    wait_for_horizon(&mut owner, late);
    let text =
        String::from_utf8(copy_out(&mut r, "COPY (SELECT * FROM streams.event_log) TO STDOUT").unwrap()).unwrap();
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
    for relation in ["streams.webhook_state", "streams.subscription_state"] {
        let text = String::from_utf8(copy_out(&mut s, &format!("COPY {relation} TO STDOUT")).unwrap()).unwrap();
        assert_eq!(text, "", "COPY {relation}");
    }
    // The log is partitioned: COPY of it by name is refused; by query, row security.
    let err = copy_out(&mut s, "COPY streams.event_log TO STDOUT").unwrap_err();
    assert_eq!(sqlstate(&err), "42809", "COPY streams.event_log: {err}");
    let text =
        String::from_utf8(copy_out(&mut s, "COPY (SELECT * FROM streams.event_log) TO STDOUT").unwrap()).unwrap();
    assert_eq!(text, "", "COPY (SELECT * FROM streams.event_log)");
    let read = read.join("\n");
    assert!(!read.contains("s3cr3t") && !read.contains(key), "pg_read_all_data read:\n{read}");
}
