//! Probes of what held (issue 21, point 8), kept so that it stays held:
//! each test is an attack an unprivileged role (or a database owner that is
//! not a superuser) tried, with the exact outcome it got. Only the classes
//! the other files do not cover are here: settings a database owner gives
//! its database; special role names; URL forms of webhooks and names that
//! resolve to loopback; publish grants at the edges of their names. COPY,
//! EXPLAIN, the planner's statistics and pg_read_all_data are in
//! tests/probes_reading.rs.
#![cfg(feature = "integration")]

mod common;

use std::time::Duration;

use common::*;
use postgres::Client;

// --- helpers -----------------------------------------------------------------

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
/// public addresses); tests/webhooks.rs and tests/webhook_delivery.rs allow
/// 127.0.0.1 server-wide while they run, so this binary must not run at the
/// same time as either of them.
fn require_default_address_policy() {
    wait_until(
        "litebase_streams.webhook_allowed_hosts is empty (no webhook test binary running)",
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
             WHERE p.oid IN ('streams.publish(text,jsonb,text,text,jsonb,text,bigint)'::regprocedure, 'streams.replay(text,bigint,timestamptz,xid8,integer,text[],jsonb,bigint)'::regprocedure,
                             'streams.get(bigint)'::regprocedure, 'streams._replay_start(timestamptz,xid8)'::regprocedure,
                             'streams.transaction_events(xid8)'::regprocedure)
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
             GRANT EXECUTE ON FUNCTION streams.create_webhook TO {0}",
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
        "SELECT streams._publish_batch('payXment', ARRAY['{}'::jsonb], NULL, NULL, NULL, NULL, NULL)",
        "SELECT streams._publish_batch('orders.eu', ARRAY['{}'::jsonb, '{}'], NULL, NULL, NULL, NULL, NULL)",
    ] {
        assert_eq!(sqlstate(&a.batch_execute(sql).unwrap_err()), "42501", "{sql}");
    }
    assert_eq!(count_stored(&mut owner), stored, "refused publishes wrote nothing");
    for sql in [
        "SELECT streams.publish('pay_ment', '{}')",
        "SELECT streams.publish('orders.eu.x', '{}')",
        "SELECT streams._publish_batch('orders.eu.y', ARRAY['{}'::jsonb], NULL, NULL, NULL, NULL, NULL)",
    ] {
        a.batch_execute(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    assert_eq!(count_stored(&mut owner), stored + 3);
    let mut r = db.connect_as(&reader.name);
    for sql in [
        "SELECT streams.publish('orders', '{}')",
        "SELECT streams._publish_batch('orders', ARRAY['{}'::jsonb], NULL, NULL, NULL, NULL, NULL)",
    ] {
        assert_eq!(sqlstate(&r.batch_execute(sql).unwrap_err()), "42501", "reader: {sql}");
    }
}
