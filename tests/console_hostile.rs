//! Issue 30 attacked: what a role that can connect, or a client with a low
//! role's token or none, tries against streams.streams, streams.metrics(),
//! the gateway's /metrics and the console (/console, /v1/console/*). Each
//! test names the defence it depends on; a test that is red is a hole (see
//! /tmp/helpers/hostile-findings.md while issue 30 is open).
#![cfg(feature = "integration")]

mod common;

use std::time::Duration;

use common::gateway::{header, raw_head, token, Gateway, Setup};
use common::{admin, publish, wait_for_horizon, wait_until, TestRole};
use serde_json::Value;

const MOVES: Duration = Duration::from_secs(30);

/// A request with `token` as Bearer; (status, body text).
fn call_text(gw: &Gateway, method: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
    gw.request(method, path, &headers, "")
}

/// The same, the body as JSON (Null when it is none).
fn call(gw: &Gateway, method: &str, path: &str, token: Option<&str>) -> (u16, Value) {
    let (status, body) = call_text(gw, method, path, token);
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// A role with a name no identifier rule allows unquoted, dropped (with
/// what it owns in the database) at the end.
struct OddRole {
    name: String,
    db: String,
}

impl OddRole {
    fn new(db: &str, name: String, attributes: &str) -> OddRole {
        let mut admin = admin();
        let quoted: String = admin.query_one("SELECT quote_ident($1)", &[&name]).unwrap().get(0);
        admin.batch_execute(&format!("CREATE ROLE {quoted} {attributes}")).expect("CREATE ROLE");
        OddRole { name, db: db.to_owned() }
    }

    fn quoted(&self) -> String {
        format!("\"{}\"", self.name.replace('"', "\"\""))
    }
}

impl Drop for OddRole {
    fn drop(&mut self) {
        let mut config = common::base_config();
        config.dbname(&self.db);
        if let Ok(mut c) = config.connect(postgres::NoTls) {
            let _ = c.batch_execute(&format!("DROP OWNED BY {}", self.quoted()));
        }
        if let Ok(mut admin) = common::base_config().connect(postgres::NoTls) {
            let _ = admin.batch_execute(&format!("DROP ROLE IF EXISTS {}", self.quoted()));
        }
    }
}

// --- the Prometheus text ---------------------------------------------------

/// A sample line: metric name, label pairs (unescaped), value text.
type StrictSample = (String, Vec<(String, String)>, String);

/// One sample line of the text format (0.0.4) read exactly as the spec
/// says (and Prometheus's own parser does): name, label pairs with values
/// in double quotes where only `\\`, `\"` and `\n` are escapes, a value.
/// None when the line is not one.
fn strict_sample(line: &str) -> Option<StrictSample> {
    let mut chars = line.chars().peekable();
    let mut name = String::new();
    while let Some(&c) = chars.peek() {
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            name.push(c);
            chars.next();
        } else {
            break;
        }
    }
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let mut labels = Vec::new();
    if chars.peek() == Some(&'{') {
        chars.next();
        loop {
            if chars.peek() == Some(&'}') {
                chars.next();
                break;
            }
            let mut label = String::new();
            while let Some(&c) = chars.peek() {
                if c.is_ascii_alphanumeric() || c == '_' {
                    label.push(c);
                    chars.next();
                } else {
                    break;
                }
            }
            if label.is_empty() || chars.next() != Some('=') || chars.next() != Some('"') {
                return None;
            }
            let mut value = String::new();
            loop {
                match chars.next()? {
                    '\\' => match chars.next()? {
                        '\\' => value.push('\\'),
                        '"' => value.push('"'),
                        'n' => value.push('\n'),
                        _ => return None,
                    },
                    '"' => break,
                    '\n' => return None,
                    c => value.push(c),
                }
            }
            labels.push((label, value));
            match chars.next()? {
                ',' => {}
                '}' => break,
                _ => return None,
            }
        }
    }
    if chars.next() != Some(' ') {
        return None;
    }
    let value: String = chars.collect();
    let ok = value == "NaN" || value == "+Inf" || value == "-Inf" || value.parse::<f64>().is_ok();
    ok.then_some((name, labels, value))
}

/// Every line of `body` as the spec reads it; panics at one that is not.
fn strict_parse(body: &str) -> Vec<StrictSample> {
    let mut samples = Vec::new();
    for line in body.lines() {
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let mut words = rest.splitn(3, ' ');
            let (keyword, metric) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
            assert!(["HELP", "TYPE"].contains(&keyword), "a comment line that is neither HELP nor TYPE: {line:?}");
            assert!(strict_sample(&format!("{metric} 0")).is_some_and(|s| s.1.is_empty()), "{line:?}");
            continue;
        }
        assert!(!line.starts_with('#'), "{line:?}");
        samples.push(strict_sample(line).unwrap_or_else(|| panic!("a line that is not the text format: {line:?}")));
    }
    samples
}

/// Role names a role's creator may choose, each made to break a naive
/// writer or reader of the text format (the suffix goes after the test's
/// database name, under 63 bytes in all).
const HOSTILE_OWNERS: [&str; 5] =
    ["_b}r 7", "_c,database=pwned", "_n\nlitebase_streams_injected 1", "_s\\\"#x", "_h=\"1\"} 9 #"];

/// The `--metrics-token` of the hostile owners' gateway (its scrapes show
/// the database's numbers only with it).
const HOSTILE_METRICS_TOKEN: &str = "the metrics secret of console_hostile";

/// A gateway whose poller reads streams.metrics() as pg_monitor every
/// second, and roles with HOSTILE_OWNERS names that each own a subscription
/// `hs` and a webhook `wh` on pay.a.
fn hostile_owners() -> (Setup, Vec<OddRole>) {
    let s = Setup::publishing(&[
        "--metrics-interval",
        "1",
        "--metrics-role",
        "pg_monitor",
        "--metrics-token",
        HOSTILE_METRICS_TOKEN,
    ]);
    let mut c = s.db.connect();
    c.batch_execute(&format!("GRANT pg_monitor TO {}", s.login.name)).unwrap();
    let roles: Vec<OddRole> = HOSTILE_OWNERS
        .iter()
        .map(|suffix| OddRole::new(&s.db.name, format!("{}{suffix}", s.db.name), "NOLOGIN"))
        .collect();
    for role in &roles {
        let q = role.quoted();
        c.batch_execute(&format!(
            "SELECT streams.grant('read', 'pay.*', '{r}');
             GRANT EXECUTE ON FUNCTION
                 streams.create_webhook(text, text, text, bigint, text, integer, text[], jsonb) TO {q};
             SET ROLE {q};
             SELECT streams.create_subscription('hs', 'pay.a', after => 0);
             SELECT streams.create_webhook('wh', 'pay.a', 'https://hostile.invalid/hook');
             RESET ROLE;",
            r = q.replace('\'', "''"),
        ))
        .unwrap();
    }
    let position = publish(&mut c, "pay.a", "{}");
    wait_for_horizon(&mut c, position);
    (s, roles)
}

/// A scrape once the poller has read the hostile owners' subscriptions.
fn scrape_with_owners(s: &Setup) -> String {
    let mut body = String::new();
    wait_until("the database's metrics name the subscriptions", MOVES, || {
        body = s
            .gateway
            .request("GET", "/metrics", &[("Authorization", &format!("Bearer {HOSTILE_METRICS_TOKEN}"))], "")
            .1;
        body.matches("litebase_streams_subscription_pending{").count() >= HOSTILE_OWNERS.len()
    });
    body
}

/// The owner label of each sample of `metric` (strictly parsed).
fn owners_of(samples: &[StrictSample], metric: &str) -> Vec<String> {
    let mut owners: Vec<String> = samples
        .iter()
        .filter(|(name, _, _)| name == metric)
        .filter_map(|(_, labels, _)| labels.iter().find(|(l, _)| l == "owner").map(|(_, v)| v.clone()))
        .collect();
    owners.sort();
    owners
}

/// Defence: metrics/text.rs escape_label_value (backslash, quote, line
/// feed). Without it the newline owner starts a sample line of its own
/// and the quote owner ends its label early.
#[test]
fn hostile_owner_names_keep_every_metrics_line_in_the_text_format() {
    let (s, roles) = hostile_owners();
    let body = scrape_with_owners(&s);
    let samples = strict_parse(&body);
    assert!(!samples.iter().any(|(name, _, _)| name == "litebase_streams_injected"), "an injected sample: {body}");
    for (_, labels, _) in &samples {
        let databases: Vec<&String> = labels.iter().filter(|(l, _)| l == "database").map(|(_, v)| v).collect();
        assert!(databases.iter().all(|d| *d == &s.db.name), "an injected database label: {labels:?}");
    }
    // Each owner is named exactly as PostgreSQL writes the role (regrole).
    let mut expected: Vec<String> = roles.iter().map(OddRole::quoted).collect();
    expected.sort();
    let subscription_owners = owners_of(&samples, "litebase_streams_subscription_pending");
    for owner in &expected {
        assert!(subscription_owners.contains(owner), "{owner:?} not in {subscription_owners:?}");
    }
    let webhook_owners = owners_of(&samples, "litebase_streams_webhook_pending");
    for owner in &expected {
        assert!(webhook_owners.contains(owner), "{owner:?} not in {webhook_owners:?}");
    }
    assert!(!body.contains("hostile.invalid"), "a webhook URL in /metrics");
}

/// The same scrape through Prometheus's own parser (`promtool check
/// metrics`, Debian's prometheus package): it reads role names with `}`,
/// `,`, `=`, quotes and newlines in label values as the text format says.
/// (prometheus-parse, which the metrics tests also use, does not: its
/// sample regex stops at the first `}` and it splits labels at every `,`
/// and `=`, also inside quoted values; the text here is right, and the
/// strict reader above reads every owner back.)
#[test]
fn hostile_owner_names_pass_prometheus_own_parser() {
    use std::io::Write;
    let (s, _roles) = hostile_owners();
    let body = scrape_with_owners(&s);
    let mut promtool = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool runs (Debian package prometheus; make setup installs it)");
    promtool.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let out = promtool.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool check metrics: {said}\n--- the scrape:\n{body}");
}

// --- streams.streams, streams.metrics() and their tables, in SQL ------------

/// A database with events on pay.a (readable by `reader`), secret.x and
/// private.y; the positions, once the counts have caught up.
fn published(s: &Setup) -> i64 {
    let mut c = s.db.connect();
    let mut last = 0;
    for stream in ["pay.a", "secret.x", "secret.x", "private.y"] {
        last = publish(&mut c, stream, r#"{"pin": 1234}"#);
    }
    wait_for_horizon(&mut c, last);
    wait_until("the worker counts every event", MOVES, || {
        let counted: i64 =
            c.query_one("SELECT coalesce(sum(events), 0)::bigint FROM streams.streams", &[]).unwrap().get(0);
        counted == 4
    });
    last
}

/// pg_read_all_data gives SELECT on every table, yet the statistics
/// tables keep their rows from it and streams.streams lists only granted
/// streams; pg_write_all_data cannot forge the counts. Defences: row-level
/// security without a policy on stream_stats and stream_stats_state
/// (sql/metrics.sql); the view's `readable` predicate.
#[test]
fn read_all_and_write_all_data_roles_neither_read_nor_forge_the_counts() {
    let s = Setup::new(&[]);
    published(&s);
    let bulk = TestRole::new(&s.db, "bulk", "NOLOGIN");
    let mut c = s.db.connect();
    c.batch_execute(&format!(
        "GRANT pg_read_all_data, pg_write_all_data TO {b}; SELECT streams.grant('read', 'pay.*', '{b}');",
        b = bulk.name
    ))
    .unwrap();
    c.batch_execute("SELECT streams.create_webhook('hook', 'pay.*', 'https://bulk.invalid/hook')").unwrap();
    let secrets: i64 = c
        .query_one("SELECT count(*) FROM streams.webhook_state t WHERE to_jsonb(t)::text ~ 'whsec_'", &[])
        .unwrap_or_else(|_| c.query_one("SELECT 1::bigint", &[]).unwrap())
        .get(0);
    assert!(secrets > 0, "the owner sees the signing secret (the check below is not vacuous)");
    c.batch_execute(&format!("SET ROLE {}", bulk.name)).unwrap();
    for table in ["streams.stream_stats", "streams.stream_stats_state"] {
        let n: i64 = c.query_one(&format!("SELECT count(*) FROM {table}"), &[]).unwrap().get(0);
        assert_eq!(n, 0, "{table} shows rows to pg_read_all_data");
    }
    // No internal table of the extension shows pg_read_all_data a row
    // (the log only the events of its read grant).
    let tables: Vec<String> = c
        .query("SELECT c.oid::regclass::text FROM pg_class c WHERE c.relnamespace = 'streams'::regnamespace AND c.relkind IN ('r', 'p')", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut showing = Vec::new();
    for table in &tables {
        let hidden: i64 = c
            .query_one(
                &format!("SELECT count(*) FROM {table} t WHERE to_jsonb(t)::text ~ '(secret\\.x|private\\.y|whsec_)'"),
                &[],
            )
            .unwrap()
            .get(0);
        if hidden > 0 {
            showing.push(table.clone());
        }
    }
    assert!(showing.is_empty(), "pg_read_all_data reads hidden streams or secrets in {showing:?}");
    let listed: Vec<String> =
        c.query("SELECT stream FROM streams.streams ORDER BY 1", &[]).unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(listed, ["pay.a"]);
    let forged = c.execute("UPDATE streams.stream_stats SET events = 1000000", &[]).unwrap_or(0);
    assert_eq!(forged, 0);
    let inserted = c.execute("INSERT INTO streams.stream_stats VALUES ('pay.forged', 1000000, 1, 1, now())", &[]);
    assert!(inserted.is_err(), "pg_write_all_data inserted a count");
    assert_eq!(c.execute("UPDATE streams.stream_stats_state SET counted_through = 0", &[]).unwrap_or(0), 0);
    assert_eq!(c.execute("DELETE FROM streams.stream_stats", &[]).unwrap_or(0), 0);
    // Neither role is pg_monitor: no streams.metrics().
    let refused = c.query("SELECT * FROM streams.metrics()", &[]).unwrap_err();
    assert_eq!(common::sqlstate(&refused), "42501");
    c.batch_execute("RESET ROLE").unwrap();
    let events: i64 = c.query_one("SELECT sum(events)::bigint FROM streams.stream_stats", &[]).unwrap().get(0);
    assert_eq!(events, 4, "the counts are the worker's");
}

/// A role without any grant calls what it can: streams.streams is empty for
/// it, streams.metrics() and the helper it reads are refused. Defences:
/// the view's predicate; no EXECUTE for PUBLIC on streams.metrics and
/// streams._worker_counters (finish.sql's REVOKE ... FROM PUBLIC).
#[test]
fn a_role_without_grants_sees_no_stream_and_no_metrics() {
    let s = Setup::new(&[]);
    published(&s);
    let stranger = TestRole::new(&s.db, "stranger", "NOLOGIN");
    let mut c = s.db.connect();
    c.batch_execute(&format!("GRANT USAGE ON SCHEMA streams TO {0}; SET ROLE {0}", stranger.name)).unwrap();
    let n: i64 = c.query_one("SELECT count(*) FROM streams.streams", &[]).unwrap().get(0);
    assert_eq!(n, 0);
    for call in [
        "SELECT * FROM streams.metrics()",
        "SELECT * FROM streams.metrics(10000, 10000)",
        "SELECT * FROM streams._worker_counters()",
    ] {
        let e = c.query(call, &[]).unwrap_err();
        assert_eq!(common::sqlstate(&e), "42501", "{call}");
    }
}

/// A reader's own function in a WHERE clause on streams.streams, cheap so
/// the planner would run it first, never sees a stream the reader may not
/// read. Defence: the view's security_barrier.
#[test]
fn a_leaky_function_on_streams_streams_sees_only_readable_streams() {
    let s = Setup::new(&[]);
    published(&s);
    let leaker = TestRole::new(&s.db, "leaker", "NOLOGIN");
    let mut c = s.db.connect();
    c.batch_execute(&format!(
        "CREATE SCHEMA {l} AUTHORIZATION {l};
         SELECT streams.grant('read', 'pay.*', '{l}');
         SET ROLE {l};
         CREATE TABLE {l}.seen (stream text);
         CREATE FUNCTION {l}.leak(text) RETURNS boolean LANGUAGE plpgsql COST 0.0000001 AS
             $f$ BEGIN INSERT INTO {l}.seen VALUES ($1); RETURN true; END $f$;",
        l = leaker.name
    ))
    .unwrap();
    let n: i64 = c
        .query_one(&format!("SELECT count(*) FROM streams.streams WHERE {}.leak(stream)", leaker.name), &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    let seen: Vec<String> = c
        .query(&format!("SELECT DISTINCT stream FROM {}.seen ORDER BY 1", leaker.name), &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(seen, ["pay.a"], "the leaky function saw hidden streams");
}

/// A monitoring role that owns a schema puts it first in its search_path
/// with operators and functions named like the unqualified ones
/// streams.metrics() uses; calling it (SECURITY DEFINER, as the extension's
/// owner) must never run them. Defence: `SET search_path = pg_catalog,
/// pg_temp` on streams.metrics (without it `evil.=(text, text)` wins over
/// pg_catalog's, being first and an exact match).
#[test]
fn streams_metrics_never_runs_objects_planted_in_the_callers_search_path() {
    let s = Setup::new(&[]);
    published(&s);
    let monitor = TestRole::new(&s.db, "monitor", "NOLOGIN");
    let m = &monitor.name;
    let mut c = s.db.connect();
    c.batch_execute(&format!(
        "GRANT pg_monitor TO {m}; CREATE SCHEMA evil_{m} AUTHORIZATION {m};
         SET ROLE {m};
         CREATE TABLE evil_{m}.ran (who text);
         GRANT INSERT ON evil_{m}.ran TO PUBLIC;
         CREATE FUNCTION evil_{m}.eq(text, text) RETURNS boolean LANGUAGE plpgsql AS
             $f$ BEGIN INSERT INTO evil_{m}.ran VALUES (current_user); RETURN $1 OPERATOR(pg_catalog.=) $2; END $f$;
         CREATE OPERATOR evil_{m}.= (FUNCTION = evil_{m}.eq, LEFTARG = text, RIGHTARG = text);
         CREATE FUNCTION evil_{m}.le(bigint, bigint) RETURNS boolean LANGUAGE plpgsql AS
             $f$ BEGIN INSERT INTO evil_{m}.ran VALUES (current_user); RETURN $1 OPERATOR(pg_catalog.<=) $2; END $f$;
         CREATE OPERATOR evil_{m}.<= (FUNCTION = evil_{m}.le, LEFTARG = bigint, RIGHTARG = bigint);
         CREATE FUNCTION evil_{m}.cat(jsonb, jsonb) RETURNS jsonb LANGUAGE plpgsql AS
             $f$ BEGIN INSERT INTO evil_{m}.ran VALUES (current_user); RETURN $1 OPERATOR(pg_catalog.||) $2; END $f$;
         CREATE OPERATOR evil_{m}.|| (FUNCTION = evil_{m}.cat, LEFTARG = jsonb, RIGHTARG = jsonb);
         CREATE FUNCTION evil_{m}.current_database() RETURNS name LANGUAGE sql AS $f$ SELECT 'hijacked'::name $f$;
         CREATE FUNCTION evil_{m}.now() RETURNS timestamptz LANGUAGE sql AS $f$ SELECT 'epoch'::timestamptz $f$;
         SET search_path = evil_{m}, pg_catalog, public;"
    ))
    .unwrap();
    // The planted operator works for the caller's own queries...
    c.query_one("SELECT 'a'::text = 'a'::text", &[]).unwrap();
    let own: i64 = c.query_one(&format!("SELECT count(*) FROM evil_{m}.ran"), &[]).unwrap().get(0);
    assert_eq!(own, 1, "the planted operator is in the caller's path");
    // ...but not inside streams.metrics().
    let rows = c.query("SELECT metric, labels::text FROM streams.metrics()", &[]).unwrap();
    assert!(rows.len() > 10);
    for row in &rows {
        let labels: String = row.get(1);
        assert!(!labels.contains("hijacked"), "{labels}");
    }
    let ran: i64 = c.query_one(&format!("SELECT count(*) FROM evil_{m}.ran"), &[]).unwrap().get(0);
    assert_eq!(ran, 1, "streams.metrics() ran a planted operator");
    // Nor in the view (its operators are bound when it is created).
    c.query("SELECT * FROM streams.streams", &[]).unwrap();
    let ran: i64 = c.query_one(&format!("SELECT count(*) FROM evil_{m}.ran"), &[]).unwrap().get(0);
    assert_eq!(ran, 1, "streams.streams ran a planted operator");
    c.batch_execute("RESET ROLE; RESET search_path").unwrap();
}

/// Every SECURITY DEFINER function issue 30 adds pins its search_path.
/// Defence: the SET clauses of sql/metrics.sql.
#[test]
fn every_security_definer_function_of_the_metrics_pins_its_search_path() {
    let s = Setup::new(&[]);
    let mut c = s.db.connect();
    let rows = c
        .query(
            "SELECT p.oid::regprocedure::text, coalesce(p.proconfig, '{}')::text
             FROM pg_proc p JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid
             JOIN pg_extension x ON d.refobjid = x.oid AND x.extname = 'litebase_streams'
             WHERE p.prosecdef AND p.prolang <> 'c'::regproc::oid",
            &[],
        )
        .unwrap_or_default();
    let rows = if rows.is_empty() {
        c.query(
            "SELECT p.oid::regprocedure::text, coalesce(p.proconfig, '{}')::text FROM pg_proc p
             WHERE p.pronamespace = 'streams'::regnamespace AND p.prosecdef",
            &[],
        )
        .unwrap()
    } else {
        rows
    };
    let mut checked = Vec::new();
    for row in &rows {
        let (function, config): (String, String) = (row.get(0), row.get(1));
        checked.push(function.clone());
        assert!(config.contains("search_path=pg_catalog, pg_temp"), "{function}: {config}");
    }
    assert!(checked.iter().any(|f| f.starts_with("streams.metrics(")), "{checked:?}");
    // Nothing new is executable by PUBLIC that reveals something.
    let public: bool = c
        .query_one("SELECT has_function_privilege('public', 'streams.metrics(integer, integer)', 'EXECUTE')", &[])
        .unwrap()
        .get(0);
    assert!(!public);
}

// --- the console API ---------------------------------------------------------

/// Limits and positions that are not what the routes take answer 400
/// 22023 (or 404): no panic, no 500, nothing the database error text
/// would say beyond its message. Defences: api.rs page_limit, after_name,
/// position; the routes' parameters bound, never spliced into SQL.
#[test]
fn odd_limits_positions_and_names_in_console_paths_are_refused_cleanly() {
    let s = Setup::new(&[]);
    published(&s);
    let gw = &s.gateway;
    let t = token(&s.reader.name);
    for query in [
        "limit=0",
        "limit=-1",
        "limit=501",
        "limit=99999999999999999999999",
        "limit=1e9",
        "limit=%00",
        "limit=1;DROP%20TABLE%20streams.event_log",
        "after=pay.a'%20OR%20'1'='1",
        "after=%22%3B--",
        "after=..%2F..%2F",
        "after=%E2%80%AE",
    ] {
        let (status, body) = call(gw, "GET", &format!("/v1/console/streams?{query}"), Some(&t));
        assert_eq!((status, body["sqlstate"].as_str()), (400, Some("22023")), "{query}: {body}");
    }
    let long = "a".repeat(10_000);
    for path in [
        "/v1/console/events/-1".to_owned(),
        "/v1/console/events/0".to_owned(),
        "/v1/console/events/9223372036854775807".to_owned(),
    ] {
        let (status, body) = call(gw, "GET", &path, Some(&t));
        assert_eq!(status, 404, "{path}: {body}");
    }
    for path in [
        "/v1/console/events/1%20OR%201=1".to_owned(),
        "/v1/console/events/9223372036854775808".to_owned(),
        "/v1/console/events/1.5".to_owned(),
        format!("/v1/console/events/{long}"),
    ] {
        let (status, body) = call(gw, "GET", &path, Some(&t));
        assert!(status == 400 || status == 414 || status == 431, "{path}: {status} {body}");
        if status == 400 {
            assert_eq!(body["sqlstate"], "22023", "{path}: {body}");
        }
    }
    // Owner and name path segments are data: SQL in them finds nothing.
    for (owner, name) in [
        ("x'%20OR%20'1'='1", "dl"),
        ("%22%3B%20RESET%20ROLE%3B--", "dl"),
        ("none", "dl"),
        ("public", "dl"),
        ("current_user", "dl"),
        ("session_user", "dl"),
        (&s.login.name, "dl'%20OR%201=1--"),
        (&long, "dl"),
    ] {
        for (method, path) in [
            ("GET", format!("/v1/console/subscriptions/{owner}/{name}/dead-letters")),
            ("POST", format!("/v1/console/subscriptions/{owner}/{name}/dead-letters/1/retry")),
            ("POST", format!("/v1/console/webhooks/{owner}/{name}/pause")),
        ] {
            let (status, body) = call(gw, method, &path, Some(&t));
            assert!([403, 404, 414, 431].contains(&status), "{method} {path}: {status} {body}");
            if status == 403 || status == 404 {
                assert!(body["sqlstate"].is_string(), "{method} {path}: {body}");
            }
        }
    }
    // The login role the reader's token is run through is no owner it may act for.
    let login = &s.login.name;
    let (status, body) = call(gw, "GET", &format!("/v1/console/subscriptions/{login}/dl/dead-letters"), Some(&t));
    assert_eq!(status, 403, "{body}");
}

/// A role whose name carries quotes, a slash and a semicolon owns a
/// subscription with a dead letter and settles it from the console; a
/// member of pg_write_all_data (and of pg_read_all_data) cannot. Defences:
/// act_for's membership test and set_config('role', $1) with the name as a
/// parameter (no identifier splicing).
#[test]
fn a_role_named_with_quotes_acts_for_itself_and_bulk_data_roles_act_for_nobody() {
    let s = Setup::new(&[]);
    let odd = OddRole::new(&s.db.name, format!("{}_o'\"/;x", s.db.name), "NOLOGIN");
    let bulk = TestRole::new(&s.db, "bulk", "NOLOGIN");
    let mut c = s.db.connect();
    let q = odd.quoted();
    c.batch_execute(&format!(
        "SELECT streams.grant('read', 'pay.*', '{r}');
         GRANT {q} TO {login};
         GRANT pg_read_all_data, pg_write_all_data TO {b}; GRANT {b} TO {login};
         SELECT streams.grant('read', 'pay.*', '{b}');
         GRANT EXECUTE ON FUNCTION
             streams.create_webhook(text, text, text, bigint, text, integer, text[], jsonb) TO {q};
         SET ROLE {q}; SELECT streams.create_subscription('dl', 'pay.a', after => 0, max_attempts => 1);
         SELECT streams.create_webhook('wh', 'pay.a', 'https://odd.invalid/hook?token=s3cr3t'); RESET ROLE;",
        r = q.replace('\'', "''"),
        login = s.login.name,
        b = bulk.name
    ))
    .unwrap();
    let position = publish(&mut c, "pay.a", "{}");
    wait_for_horizon(&mut c, position);
    c.batch_execute(&format!(
        "SET ROLE {q}; BEGIN; SELECT * FROM streams.poll('dl', 1);
         SELECT streams.nack('dl', {position}, reason => 'bad'); COMMIT; RESET ROLE"
    ))
    .unwrap();
    let encoded: String = odd
        .name
        .bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b == b'_' { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect();
    let gw = &s.gateway;
    let base = format!("/v1/console/subscriptions/{encoded}/dl/dead-letters");

    let (status, body) = call(gw, "GET", "/v1/console/subscriptions", Some(&token(&bulk.name)));
    assert_eq!(status, 200, "{body}");
    assert!(!body.to_string().contains("\"dl\""), "pg_read_all_data lists another's subscription: {body}");
    for (method, path) in [("GET", base.clone()), ("POST", format!("{base}/{position}/discard"))] {
        let (status, body) = call(gw, method, &path, Some(&token(&bulk.name)));
        assert_eq!((status, body["sqlstate"].as_str()), (403, Some("42501")), "{method} {path}: {body}");
    }
    let parked = |c: &mut postgres::Client| -> i64 {
        c.query_one("SELECT count(*) FROM streams.dead_letters WHERE subscription = 'dl'", &[]).unwrap().get(0)
    };
    assert_eq!(parked(&mut c), 1);
    // Nor another's webhook, its URL or a stream it has no read grant on.
    let (status, body) =
        call(gw, "POST", &format!("/v1/console/webhooks/{encoded}/wh/pause"), Some(&token(&bulk.name)));
    assert_eq!((status, body["sqlstate"].as_str()), (403, Some("42501")), "{body}");
    let (status, body) = call_text(gw, "GET", "/v1/console/webhooks", Some(&token(&bulk.name)));
    assert!(status == 200 && !body.contains("s3cr3t") && !body.contains("odd.invalid"), "{status} {body}");
    let hidden = publish(&mut c, "secret.x", r#"{"pin": 1234}"#);
    wait_for_horizon(&mut c, hidden);
    let (status, body) = call_text(gw, "GET", &format!("/v1/console/events/{hidden}"), Some(&token(&bulk.name)));
    assert!(status == 404 && !body.contains("1234"), "pg_read_all_data reads an event it has no grant on: {body}");
    let state: String = c.query_one("SELECT state FROM streams.webhooks WHERE name = 'wh'", &[]).unwrap().get(0);
    assert_ne!(state, "paused");

    let (status, body) = call(gw, "GET", &base, Some(&token(&odd.name)));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["dead_letters"][0]["owner"], odd.name.as_str(), "{body}");
    let (status, body) = call(gw, "POST", &format!("{base}/{position}/discard"), Some(&token(&odd.name)));
    assert_eq!((status, body["changed"].as_i64()), (200, Some(1)), "{body}");
    assert_eq!(parked(&mut c), 0);
}

/// A role that may read one event of a big transaction asks for it: the
/// answer lists at most 1000 of the transaction's events (and says it
/// stopped), never another stream's. Defence: streams.rs
/// MAX_TRANSACTION_EVENTS and --max-page-bytes; transaction_events as the
/// role (row-level security).
#[test]
fn a_huge_transaction_is_listed_in_part_and_only_what_the_role_reads() {
    let s = Setup::new(&[]);
    let mut c = s.db.connect();
    let mut tx = c.transaction().unwrap();
    let first: i64 = tx.query_one("SELECT streams.publish('pay.a', '{}'::jsonb)", &[]).unwrap().get(0);
    tx.batch_execute(
        "SELECT streams.publish(CASE WHEN n % 2 = 0 THEN 'pay.b' ELSE 'secret.x' END,
                                jsonb_build_object('n', n, 'pad', repeat('x', 200)))
         FROM generate_series(1, 3000) n",
    )
    .unwrap();
    tx.commit().unwrap();
    let last = publish(&mut c, "pay.a", "{}");
    wait_for_horizon(&mut c, last);
    let (status, body) =
        call_text(&s.gateway, "GET", &format!("/v1/console/events/{first}"), Some(&token(&s.reader.name)));
    assert_eq!(status, 200, "{}", &body[..body.len().min(500)]);
    assert!(!body.contains("secret.x"), "another stream's event in the transaction list");
    let detail: Value = serde_json::from_str(&body).unwrap();
    let listed = detail["transaction"].as_array().unwrap().len();
    assert!((1..=1000).contains(&listed), "{listed}");
    assert_eq!(detail["transaction_truncated"], true);
}

// --- the console's files -----------------------------------------------------

/// Every answer under /console carries the policy and the other headers,
/// whatever the method, path or length. Defences: console/mod.rs `asset`
/// (the headers on files and 404s) — and for the others, whatever layer
/// puts them on every answer of the /console routes.
#[test]
fn every_console_answer_carries_the_security_headers() {
    let s = Setup::new(&[]);
    let port = s.gateway.port;
    let long = format!("/console/{}", "a/".repeat(4000));
    let cases: Vec<(&str, String)> = vec![
        ("GET", "/console".into()),
        ("GET", "/console/".into()),
        ("GET", "/console/console.js".into()),
        ("GET", "/console/nope.js".into()),
        ("GET", "/console/%2e%2e/%2e%2e/etc/passwd".into()),
        ("GET", "/console/..%252f..%252fetc%252fpasswd".into()),
        ("GET", "/console/%ff%fe".into()),
        ("GET", "/console/index.html?x=%3Cscript%3Ealert(1)%3C/script%3E".into()),
        ("GET", long),
        ("HEAD", "/console/".into()),
        ("POST", "/console/".into()),
        ("PUT", "/console/index.html".into()),
        ("DELETE", "/console".into()),
    ];
    let mut missing = Vec::new();
    for (method, path) in &cases {
        let (status, headers) = raw_head(port, method, path);
        let shown = &path[..path.len().min(60)];
        if *method == "GET" && path.contains("passwd") {
            assert_eq!(status, 404, "{shown}");
        }
        let policy = header(&headers, "content-security-policy").unwrap_or_default();
        let ok = policy.contains("default-src 'self'")
            && policy.contains("frame-ancestors 'none'")
            && header(&headers, "x-content-type-options") == Some("nosniff")
            && header(&headers, "referrer-policy") == Some("no-referrer");
        if !ok {
            missing.push(format!("{method} {shown} -> {status}"));
        }
    }
    assert!(missing.is_empty(), "answers without the console's headers: {missing:?}");
}

/// The console's JavaScript never turns server data into markup or code:
/// no innerHTML and friends, no eval, no string handlers, no javascript:
/// URLs, and the one element builder sets attributes with setAttribute and
/// children as text nodes. Read from the files the gateway serves.
/// Defence: gateway/console/dom.js `h`/`append` and the pages using only them.
#[test]
fn the_console_scripts_never_render_server_data_as_markup() {
    let s = Setup::new(&[]);
    let (status, index) = s.gateway.get("/console/");
    assert_eq!(status, 200);
    assert!(!index.contains("<script>") && !index.contains(" on"), "inline script in index.html");
    // Every module the page loads, followed through its imports.
    let mut queue: Vec<String> = vec!["console.js".into()];
    let mut seen = std::collections::BTreeSet::new();
    while let Some(file) = queue.pop() {
        if !seen.insert(file.clone()) {
            continue;
        }
        let (status, text) = s.gateway.get(&format!("/console/{file}"));
        assert_eq!(status, 200, "{file}");
        if file.starts_with("vendor/") {
            continue;
        }
        for forbidden in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
            "new Function",
            "javascript:",
            "srcdoc",
            "createContextualFragment",
            "DOMParser",
        ] {
            // dom.js says in a comment that nothing uses innerHTML.
            let uses = text.lines().filter(|l| !l.trim_start().starts_with("//")).any(|l| l.contains(forbidden));
            assert!(!uses, "{file} uses {forbidden}");
        }
        let dir = file.rsplit_once('/').map(|(d, _)| format!("{d}/")).unwrap_or_default();
        for line in text.lines() {
            if let Some(spec) = line.split("from \"").nth(1).and_then(|r| r.split('"').next()) {
                let mut parts: Vec<&str> = dir.split('/').filter(|p| !p.is_empty()).collect();
                for part in spec.split('/') {
                    match part {
                        "." => {}
                        ".." => {
                            parts.pop();
                        }
                        p => parts.push(p),
                    }
                }
                queue.push(parts.join("/"));
            }
        }
    }
    assert!(seen.len() > 5, "{seen:?}");
    assert!(seen.contains("dom.js"), "{seen:?}");
}

/// A client without a token loads the files but no data, and a token in
/// the query string of the API is refused (it would end in logs).
/// Defences: api.rs `identity`.
#[test]
fn without_a_token_the_files_load_and_nothing_else() {
    let s = Setup::new(&[]);
    published(&s);
    let gw = &s.gateway;
    assert_eq!(gw.get("/console/").0, 200);
    for path in ["/v1/console/streams", "/v1/console/events/1", "/v1/console/subscriptions", "/v1/console/webhooks"] {
        let (status, body) = call_text(gw, "GET", path, None);
        assert_eq!(status, 401, "{path}: {body}");
        assert!(!body.contains("pay.a") && !body.contains("1234"), "{path}: {body}");
    }
    let (status, _) =
        call_text(gw, "GET", &format!("/v1/console/streams?access_token={}", token(&s.reader.name)), None);
    assert_eq!(status, 401);
}

// --- the console in a browser ------------------------------------------------

/// Markup that runs script if it ever becomes markup.
const XSS: &str = r#"<img src=x onerror="window.pwned=1"><script>window.pwned=2</script>"#;

/// Records CSP violations and uncaught errors before the page's scripts run.
const RECORDER: &str = "window.__hostile = {violations: [], errors: []};
document.addEventListener('securitypolicyviolation', e => window.__hostile.violations.push(e.violatedDirective + ' ' + e.blockedURI));
window.addEventListener('error', e => window.__hostile.errors.push(String(e.message)));";

/// An event whose type and key, and a dead letter whose error, carry
/// markup, and a pattern made of markup in the address: the console shows
/// each as text, makes no element of it and runs nothing. Defences:
/// gateway/console/dom.js (text nodes, setAttribute) and the CSP.
#[test]
fn markup_in_event_envelopes_dead_letter_errors_and_patterns_renders_as_text() {
    use common::browser::Browser;
    use serde_json::json;

    let s = Setup::publishing(&[]);
    let mut owner = s.db.connect();
    let role = &s.reader.name;
    let data = serde_json::to_string(&json!({ "note": XSS })).unwrap();
    let typed: Result<postgres::Row, _> =
        owner.query_one("SELECT streams.publish('pay.a', $1::text::jsonb, type => $2, key => $2)", &[&data, &XSS]);
    let p: i64 = match typed {
        Ok(row) => row.get(0),
        // A type or key with markup is refused: the data carries it alone.
        Err(_) => publish(&mut owner, "pay.a", &data),
    };
    wait_for_horizon(&mut owner, p);
    let reason = XSS.replace('\'', "''");
    for sql in [
        format!("SET ROLE {role}"),
        "SELECT streams.create_subscription('dl', 'pay.*', after => 0, max_attempts => 1)".to_owned(),
        "BEGIN".to_owned(),
        "SELECT count(*) FROM streams.poll('dl', 1)".to_owned(),
        format!("SELECT streams.nack('dl', {p}, reason => '{reason}')"),
        "COMMIT".to_owned(),
        "RESET ROLE".to_owned(),
    ] {
        owner.batch_execute(&sql).unwrap();
    }

    let mut browser = Browser::open("about:blank");
    browser.command("Page.enable", json!({}));
    browser.command("Page.addScriptToEvaluateOnNewDocument", json!({ "source": RECORDER }));
    browser.viewport(1280, 800);
    let base = format!("http://127.0.0.1:{}/console", s.gateway.port);
    browser.navigate(&format!("{base}#token={}", token(role)));
    browser.wait_for("#streams-list");
    let clean = |browser: &mut Browser, what: &str| {
        assert_eq!(browser.eval("document.querySelectorAll('main img, main script').length"), json!(0), "{what}");
        assert_eq!(browser.eval("window.pwned === undefined"), json!(true), "{what}: script ran");
        assert_eq!(browser.eval("window.__hostile.violations"), json!([]), "{what}: CSP violations");
    };

    browser.eval(&format!("location.hash = {}", json!(format!("#/events/{p}"))));
    browser.wait_for_text("#event-data", "onerror");
    assert!(browser.text("main").unwrap_or_default().contains("<img src=x"), "the data as text");
    clean(&mut browser, "event detail");

    browser.eval("location.hash = '#/subscriptions'");
    browser.wait_for_text("#subscriptions-list", "dl");
    browser.click("[data-action=\"dead-letters\"][data-subscription=\"dl\"]");
    browser.wait_for(&format!(".dead-letter[data-position=\"{p}\"]"));
    assert!(browser.text("main").unwrap_or_default().contains("<script>window.pwned=2</script>"), "the error as text");
    clean(&mut browser, "dead letters");

    let pattern = "pay.<img src=x onerror=\"window.pwned=3\">";
    browser.eval(&format!("location.hash = '#/streams/' + encodeURIComponent({})", json!(pattern)));
    browser.wait("the refusal is shown", |b| {
        b.text("main").is_some_and(|t| t.contains("invalid") || t.contains("not") || t.contains("error"))
    });
    clean(&mut browser, "a pattern of markup");
    assert_eq!(browser.eval("window.__hostile.errors"), json!([]), "uncaught errors");
}

/// A client with no token at all scrapes /metrics on the gateway's one
/// listener (the same as /v1 and /console): it must not learn what only
/// pg_monitor may see in SQL — stream names and their event counts,
/// subscription and webhook names, their owners' role names — nor the
/// topic patterns other clients subscribed to (finding F4). Without
/// --metrics-token /metrics is open but shows the gateway's own counters
/// only; with it, only a scrape that sends it gets an answer (not a token
/// of a role, not a wrong secret), and that one gets the names.
#[test]
fn a_client_without_a_token_learns_no_names_from_metrics() {
    const METRICS_TOKEN: &str = "the metrics secret of console_hostile";
    let watched = ["--metrics-interval", "1", "--metrics-role", "pg_monitor"];
    let s = Setup::new(&watched);
    let mut c = s.db.connect();
    c.batch_execute(&format!("GRANT pg_monitor TO {}", s.login.name)).unwrap();
    let payroll = s.role("payroll", "SELECT streams.grant('read', 'hr.*', '{r}');");
    c.batch_execute(&format!(
        "SET ROLE {}; SELECT streams.create_subscription('salaries_export', 'hr.salaries', after => 0); RESET ROLE",
        payroll.name
    ))
    .unwrap();
    let position = publish(&mut c, "hr.salaries", r#"{"ceo": 1}"#);
    wait_for_horizon(&mut c, position);
    let guarded = Gateway::start(&s.db, &s.login.name, &[&watched[..], &["--metrics-token", METRICS_TOKEN]].concat());
    // A client of payroll on each gateway: its pattern would show in topic_clients.
    let payroll_token = token(&payroll.name);
    let clients = [
        s.gateway.sse("/v1/streams/hr.*/events", Some(&payroll_token), None),
        guarded.sse("/v1/streams/hr.*/events", Some(&payroll_token), None),
    ];
    assert!(clients.iter().all(|c| c.status == 200));
    let names = ["hr.salaries", "salaries_export", payroll.name.as_str(), "hr.*"];

    // With the token, the right bearer gets the names (the witness that the
    // database block and the topic clients are there to be shown).
    let mut body = String::new();
    wait_until("the database's numbers are in the guarded /metrics", MOVES, || {
        let (status, text) = call_text(&guarded, "GET", "/metrics", Some(METRICS_TOKEN));
        assert_eq!(status, 200, "{text}");
        body = text;
        body.contains("litebase_streams_horizon{")
            && body.contains("litebase_streams_subscription_pending{")
            && body.lines().any(|l| l.starts_with("litebase_streams_events_total{") && !l.ends_with(" 0"))
            && body.contains("litebase_streams_gateway_topic_clients{pattern=\"hr.*\"} 1")
    });
    for name in names {
        assert!(body.contains(name), "the metrics token's scrape shows {name:?}: {body}");
    }
    // Anything else gets 401, as the gateway's JSON error, and nothing of the rest.
    for sent in [None, Some("the metrics secret of console_hostil"), Some(payroll_token.as_str()), Some("")] {
        let (status, text) = call_text(&guarded, "GET", "/metrics", sent);
        assert_eq!(status, 401, "{sent:?}: {text}");
        let error: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
        assert!(error["error"].is_string() && error["sqlstate"].is_null(), "{error}");
        assert!(!text.contains("litebase_streams_"), "{sent:?}: {text}");
        assert!(!text.contains(METRICS_TOKEN), "{text}");
    }

    // Without the token: open, with the gateway's own counters (its client
    // counted) and no names.
    wait_until("the open /metrics counts its SSE client", MOVES, || {
        s.gateway.get("/metrics").1.contains("litebase_streams_gateway_connections{transport=\"sse\"} 1")
    });
    let (status, body) = s.gateway.get("/metrics");
    assert_eq!(status, 200, "{body}");
    let leaked: Vec<&str> = names.into_iter().filter(|name| body.contains(name)).collect();
    assert!(leaked.is_empty(), "an anonymous scrape names {leaked:?}: {body}");
    let database_numbers: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("litebase_streams_") && !l.starts_with("litebase_streams_gateway_"))
        .collect();
    assert!(database_numbers.is_empty(), "the database's numbers without the metrics token: {database_numbers:?}");
    assert!(!body.contains("litebase_streams_gateway_topic_clients"), "{body}");
    assert!(!body.contains("litebase_streams_gateway_database_metrics_"), "no poller, no up or age: {body}");
    // The operator is told once how to have the rest.
    assert_eq!(s.gateway.log_text().matches("no --metrics-token").count(), 1, "{}", s.gateway.log_text());
    assert!(!guarded.log_text().contains("no --metrics-token"), "{}", guarded.log_text());
}

/// The rows of `table` one streams.metrics(0, 0) call reads: the
/// difference of pg_stat_xact_all_tables (what this backend fetched,
/// SECURITY DEFINER bodies included) around the call. A difference,
/// because PostgreSQL 15 keeps counts of earlier transactions there until
/// it flushes them (at most once a second), e.g. of the test's last
/// `SELECT count(*) FROM streams.streams`.
fn rows_read_by_metrics(c: &mut postgres::Client, table: &str) -> i64 {
    let mut tx = c.transaction().unwrap();
    let read = |tx: &mut postgres::Transaction| -> i64 {
        tx.query_one(
            "SELECT coalesce(sum(seq_tup_read + coalesce(idx_tup_fetch, 0)), 0)::bigint
             FROM pg_stat_xact_all_tables WHERE relid = $1::text::regclass",
            &[&table],
        )
        .unwrap()
        .get(0)
    };
    let before = read(&mut tx);
    tx.query("SELECT * FROM streams.metrics(0, 0)", &[]).unwrap();
    let after = read(&mut tx);
    tx.rollback().unwrap();
    after - before
}

/// The log rows one streams.metrics(0, 0) call reads.
fn log_rows_read_by_metrics(c: &mut postgres::Client) -> i64 {
    rows_read_by_metrics(c, "streams.event_log")
}

/// A reader (no privilege but its read grant; create_subscription is
/// PUBLIC) creates subscriptions by the thousand in a second. The work of
/// one streams.metrics() call — which the gateway runs every interval and
/// postgres_exporter at every scrape — must not grow with them beyond the
/// labelled max_subscriptions: with max_subscriptions 0 it still reads up
/// to 1,000 log rows for every subscription (10,000 subscriptions: ~10M
/// rows, about 5 s, the whole default interval). Red (finding F5). Counted
/// in rows read, not timed.
#[test]
fn subscriptions_by_the_thousand_do_not_multiply_the_work_of_one_metrics_call() {
    let s = Setup::new(&[]);
    let mut c = s.db.connect();
    c.batch_execute(
        "SELECT count(streams.publish('pay.a', jsonb_build_object('n', n))) FROM generate_series(1, 1000) n",
    )
    .unwrap();
    let last = publish(&mut c, "pay.a", "{}");
    wait_for_horizon(&mut c, last);
    let subscribe = |c: &mut postgres::Client, from: i32, to: i32| {
        c.batch_execute(&format!(
            "SET ROLE {}; SELECT count(streams.create_subscription('s' || n, 'pay.a', after => 0))
             FROM generate_series({from}, {to}) n; RESET ROLE",
            s.reader.name
        ))
        .unwrap();
    };
    subscribe(&mut c, 1, 10);
    let few = log_rows_read_by_metrics(&mut c);
    subscribe(&mut c, 11, 1000);
    let many = log_rows_read_by_metrics(&mut c);
    eprintln!("log rows read by streams.metrics(0, 0): {few} with 10 subscriptions, {many} with 1000");
    assert!(many <= 10 * few.max(1000), "{many} log rows for 1000 subscriptions vs {few} for 10");
}

/// The rows of streams.stream_stats one streams.metrics(0, 0) call reads.
fn stats_rows_read_by_metrics(c: &mut postgres::Client) -> i64 {
    rows_read_by_metrics(c, "streams.stream_stats")
}

/// A publisher (a grant on `order.*`, or just an event-sourced application
/// with one stream per aggregate) makes streams by the million. One
/// streams.metrics() call reads every row of stream_stats to sum the
/// streams beyond max_streams into "(other)" (measured: 300,000 streams,
/// 0.9 s per call, also with max_streams 0). Its work must not grow with
/// the number of streams beyond the labelled ones. Red (finding F6).
/// Counted in rows read, not timed.
#[test]
fn streams_by_the_thousand_do_not_multiply_the_work_of_one_metrics_call() {
    let s = Setup::new(&[]);
    let mut c = s.db.connect();
    let count = |c: &mut postgres::Client, from: i32, to: i32| {
        c.batch_execute(&format!(
            "SELECT count(streams.publish('order.' || n, '{{}}'::jsonb)) FROM generate_series({from}, {to}) n"
        ))
        .unwrap();
        let last = publish(c, "order.last", "{}");
        wait_for_horizon(c, last);
        let streams = (to + 1) as i64;
        wait_until("the worker counts every stream", MOVES, || {
            let n: i64 = c.query_one("SELECT count(*) FROM streams.streams", &[]).unwrap().get(0);
            n == streams
        });
        stats_rows_read_by_metrics(c)
    };
    let few = count(&mut c, 1, 19);
    let many = count(&mut c, 20, 4999);
    eprintln!("stream_stats rows read by streams.metrics(0, 0): {few} with 20 streams, {many} with 5000");
    assert!(many <= 10 * few.max(100), "{many} rows for 5000 streams vs {few} for 20");
}

/// A database owner sets the database's search_path to a schema of its own
/// holding an operator `+(bigint, bigint)` (the stats pass adds counts with
/// `+`), and gets the worker restarted. The worker, the bootstrap
/// superuser, must never run it. Defence: src/delivery/runtime.rs
/// PINNED_SETTINGS (search_path first) for the stats pass of
/// src/delivery/stream_stats.rs.
#[test]
fn the_stats_pass_never_runs_an_operator_a_database_owner_planted() {
    let db = common::TestDb::new();
    let owner = TestRole::new(&db, "dbowner", "NOLOGIN");
    let o = &owner.name;
    let mut c = db.connect();
    let first = publish(&mut c, "pay.a", "{}");
    wait_for_horizon(&mut c, first);
    c.batch_execute(&format!(
        "CREATE SCHEMA evil_{o} AUTHORIZATION {o};
         GRANT USAGE ON SCHEMA streams TO {o};
         SET ROLE {o};
         CREATE TABLE evil_{o}.ran (pid integer, who text);
         GRANT INSERT ON evil_{o}.ran TO PUBLIC;
         GRANT USAGE ON SCHEMA evil_{o} TO PUBLIC;
         CREATE FUNCTION evil_{o}.plus(bigint, bigint) RETURNS bigint LANGUAGE plpgsql AS
             $f$ BEGIN INSERT INTO evil_{o}.ran VALUES (pg_catalog.pg_backend_pid(), current_user::text);
                 RETURN $1 OPERATOR(pg_catalog.+) $2; END $f$;
         CREATE OPERATOR evil_{o}.+ (FUNCTION = evil_{o}.plus, LEFTARG = bigint, RIGHTARG = bigint);
         RESET ROLE;
         ALTER DATABASE {d} SET search_path = evil_{o}, pg_catalog;",
        d = db.name
    ))
    .unwrap();
    // The worker starts again and reads the database's settings.
    let old = db.wait_for_worker();
    admin().query_one("SELECT pg_terminate_backend($1)", &[&old]).unwrap();
    let mut worker = old;
    wait_until("a new worker", MOVES, || {
        let rows = admin()
            .query(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'litebase_streams worker' AND datname = $1",
                &[&db.name],
            )
            .unwrap();
        worker = rows.first().map_or(old, |r| r.get(0));
        worker != old
    });
    let mut c = db.connect();
    // A new session does resolve `+` to the planted operator: the trap is live.
    c.query_one("SELECT 1::bigint + 1::bigint", &[]).unwrap();
    let own: i64 = c
        .query_one(&format!("SELECT count(*) FROM evil_{o}.ran WHERE pid = pg_catalog.pg_backend_pid()"), &[])
        .unwrap()
        .get(0);
    assert_eq!(own, 1, "the database's search_path plants the operator for new sessions");
    for _ in 0..3 {
        publish(&mut c, "pay.a", "{}");
    }
    let last = publish(&mut c, "pay.a", "{}");
    wait_for_horizon(&mut c, last);
    wait_until("the stats pass adds to pay.a", MOVES, || {
        let n: Option<i64> = c
            .query_opt("SELECT events FROM streams.stream_stats WHERE stream = 'pay.a'", &[])
            .unwrap()
            .map(|r| r.get(0));
        n == Some(5)
    });
    let ran: Vec<(i32, String)> = c
        .query(&format!("SELECT pid, who FROM evil_{o}.ran"), &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert!(!ran.iter().any(|(pid, _)| *pid == worker), "the worker ran the planted operator: {ran:?}");
    admin().batch_execute(&format!("ALTER DATABASE {} RESET search_path", db.name)).unwrap();
}
