//! Hostile tests: an ordinary role that can connect tries to become a
//! superuser through the extension, to forge what listeners trust, and to
//! get around the limits that protect other sessions; each attempt fails.
//! (Per-stream read and publish privileges: tests/privileges.rs.)
#![cfg(feature = "integration")]

mod common;

use std::time::Duration;

use common::*;
use postgres::fallible_iterator::FallibleIterator;
use postgres::Client;

fn is_superuser(role: &str) -> bool {
    admin().query_one("SELECT rolsuper FROM pg_roles WHERE rolname = $1", &[&role]).unwrap().get(0)
}

/// SQL for a function that makes `role` a superuser when a superuser runs it,
/// and operator functions that call it for each `(operator, left, right, result)`.
fn booby_traps(schema: &str, role: &str, operators: &[(&str, &str, &str, &str)]) -> String {
    let mut sql = format!(
        "CREATE FUNCTION {schema}.escalate() RETURNS boolean LANGUAGE plpgsql AS $$
         BEGIN
             IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
                 EXECUTE 'ALTER ROLE {role} SUPERUSER';
             END IF;
             RETURN true;
         END $$;"
    );
    for (i, (op, left, right, result)) in operators.iter().enumerate() {
        sql.push_str(&format!(
            "CREATE FUNCTION {schema}.trap{i}(a {left}, b {right}) RETURNS {result} LANGUAGE plpgsql AS $$
             BEGIN PERFORM {schema}.escalate(); RETURN a::{result} OPERATOR(pg_catalog.{op}) b::{result}; END $$;
             CREATE OPERATOR {schema}.{op} (LEFTARG = {left}, RIGHTARG = {right}, FUNCTION = {schema}.trap{i});"
        ));
    }
    sql
}

/// A role with CREATE on `public` plants operators there, the inexact ones the
/// worker's statements could fall back to and, with the database's
/// search_path putting `public` first, exact ones too. The worker runs as the
/// bootstrap superuser, before and after it planned its statements, and
/// after a restart under the hostile setting: the role stays unprivileged.
#[test]
fn worker_never_runs_operators_planted_in_its_search_path() {
    let db = TestDb::new();
    let attacker = TestRole::new(&db, "attacker", "");
    let mut owner = db.connect();
    owner.batch_execute(&format!("GRANT CREATE ON SCHEMA public TO {}", attacker.name)).unwrap();
    let first = publish(&mut owner, "orders", "{}");
    wait_for_horizon(&mut owner, first); // the worker has planned its statements

    let mut evil = db.connect_as(&attacker.name);
    let inexact = [
        ("*", "numeric", "integer", "numeric"),
        ("-", "bigint", "integer", "bigint"),
        ("+", "bigint", "integer", "bigint"),
    ];
    evil.batch_execute(&booby_traps("public", &attacker.name, &inexact)).unwrap();
    let second = publish(&mut owner, "orders", r#"{"n":2}"#);
    wait_for_horizon(&mut owner, second);
    assert!(
        !is_superuser(&attacker.name),
        "operators planted after the worker planned its statements ran as superuser"
    );

    // Now exact matches for what a round compares, with public searched first.
    let exact = [
        ("=", "bigint", "bigint", "bigint"),
        ("<=", "bigint", "bigint", "bigint"),
        (">", "bigint", "bigint", "bigint"),
        ("<", "bigint", "bigint", "bigint"),
    ];
    let exact_sql = booby_traps("public", &attacker.name, &exact)
        .replace("public.escalate()", "public.escalate2()")
        .replace("public.trap", "public.exact_trap")
        .replace("RETURNS bigint LANGUAGE", "RETURNS boolean LANGUAGE")
        .replace("a::bigint OPERATOR", "a OPERATOR")
        .replace("b::bigint;", "b;");
    evil.batch_execute(&exact_sql).unwrap();
    owner.batch_execute(&format!("ALTER DATABASE {} SET search_path = public, pg_catalog", db.name)).unwrap();
    let old_worker = db.wait_for_worker();
    admin().execute("SELECT pg_terminate_backend($1)", &[&old_worker]).unwrap();
    wait_until("a new worker replaces the terminated one", Duration::from_secs(20), || {
        db.wait_for_worker() != old_worker
    });

    let mut safe = db.connect();
    safe.batch_execute("SET search_path = pg_catalog, pg_temp").unwrap();
    let third: i64 = safe.query_one("SELECT streams.publish('orders', '{\"n\":3}')", &[]).unwrap().get(0);
    wait_until("the restarted worker makes the event final", Duration::from_secs(20), || {
        safe.query_one("SELECT streams.horizon()", &[]).unwrap().get::<_, i64>(0) >= third
    });
    assert!(!is_superuser(&attacker.name), "the worker resolved an operator through the database's search_path");
    safe.batch_execute(&format!("ALTER DATABASE {} RESET search_path", db.name)).unwrap();
}

/// A role with the operators' grants plants `-(bigint, integer)` in its own
/// schema, puts that schema first and reads `streams.status` (whose helpers
/// run as the owner) in a database where nothing was published yet.
#[test]
fn status_functions_ignore_the_callers_search_path() {
    let db = TestDb::new();
    let ops = TestRole::new(&db, "ops", "");
    let mut owner = db.connect();
    owner
        .batch_execute(&format!(
            "CREATE SCHEMA mine AUTHORIZATION {0};
             GRANT USAGE ON SCHEMA streams TO {0};
             GRANT SELECT ON streams.status TO {0};
             GRANT EXECUTE ON FUNCTION streams._worker_status() TO {0};",
            ops.name
        ))
        .unwrap();
    let mut evil = db.connect_as(&ops.name);
    evil.batch_execute(&booby_traps(
        "mine",
        &ops.name,
        &[("-", "bigint", "integer", "bigint"), ("-", "bigint", "bigint", "bigint")],
    ))
    .unwrap();
    evil.batch_execute("SET search_path = mine, pg_catalog").unwrap();
    let row = evil.query_one("SELECT newest_position, horizon FROM streams.status", &[]).unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (0, 0));
    evil.query_one("SELECT streams.horizon()", &[]).expect_err("horizon() needs a read grant");
    assert!(!is_superuser(&ops.name), "a SECURITY DEFINER helper resolved the caller's operator");
}

/// The owner of a database (not a superuser) creates schema `streams` with a
/// look-alike `publish(text, text)`; CREATE EXTENSION by a superuser refuses
/// the schema instead of adopting it, and installs nothing.
#[test]
fn create_extension_refuses_a_schema_it_did_not_create() {
    let db = TestDb::without_extension();
    let squatter = TestRole::new(&db, "squatter", "");
    let mut admin_client = db.connect();
    admin_client.batch_execute(&format!("ALTER DATABASE {} OWNER TO {}", db.name, squatter.name)).unwrap();
    let mut evil = db.connect_as(&squatter.name);
    evil.batch_execute(&format!(
        "CREATE SCHEMA streams;
         CREATE FUNCTION streams.publish(stream text, data text) RETURNS bigint LANGUAGE sql AS
             $$ ALTER ROLE {} SUPERUSER; SELECT 1::bigint $$;",
        squatter.name
    ))
    .unwrap();
    let err = admin_client.batch_execute("CREATE EXTENSION litebase_streams").unwrap_err();
    assert_eq!(sqlstate(&err), "42P06", "{err}");
    let installed: bool = admin_client
        .query_one("SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'litebase_streams')", &[])
        .unwrap()
        .get(0);
    assert!(!installed, "nothing is installed");
    admin_client.batch_execute("DROP SCHEMA streams CASCADE").unwrap();
    assert!(!is_superuser(&squatter.name));

    // An empty schema of another owner is refused too.
    evil.batch_execute("CREATE SCHEMA streams").unwrap();
    let err = admin_client.batch_execute("CREATE EXTENSION litebase_streams").unwrap_err();
    assert_eq!(sqlstate(&err), "42P06");
    // The role can be dropped only once it owns no database.
    admin_client.batch_execute(&format!("ALTER DATABASE {} OWNER TO CURRENT_USER", db.name)).unwrap();
}

/// The check `make test` keeps: every SECURITY DEFINER function of the
/// extension pins search_path, and none is executable by PUBLIC.
#[test]
fn security_definer_functions_pin_search_path_and_are_not_public() {
    let db = TestDb::new();
    let mut c = db.connect();
    let unpinned: Vec<String> = c
        .query(
            "SELECT p.oid::regprocedure::text FROM pg_proc p
             WHERE p.pronamespace = 'streams'::regnamespace AND p.prosecdef
               AND NOT coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false)
             ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(unpinned.is_empty(), "SECURITY DEFINER without a pinned search_path: {unpinned:?}");
    let public: Vec<String> = c
        .query(
            "SELECT p.oid::regprocedure::text FROM pg_proc p
             WHERE p.pronamespace = 'streams'::regnamespace AND p.prosecdef
               AND (p.proacl IS NULL OR EXISTS (SELECT FROM aclexplode(p.proacl) a WHERE a.grantee = 0))
               -- Public on purpose, revealing nothing streams.storage (PUBLIC) does not
               -- show: the storage settings, and whether a read reaches below the
               -- first position retention kept (LS001), which every reader must learn.
               AND p.oid NOT IN ('streams._storage()'::regprocedure,
                                 'streams._retained(bigint, timestamptz, xid8)'::regprocedure)
             ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(public.is_empty(), "SECURITY DEFINER functions executable by PUBLIC: {public:?}");
    // Functions that are not SECURITY DEFINER but act as the extension's
    // owner inside (publish, subscriptions) are just as exposed to what the
    // caller plants in pg_temp: every function that can run SQL pins its
    // search_path, except these, each for the reason given.
    let allowed = [
        "streams._acl_changed()",                    // sets a backend flag, runs no SQL
        "streams._launch_worker()",                  // shared memory only
        "streams._require_preload()",                // reads settings only
        "streams.worker_pid()",                      // shared memory only
        "streams._refuse_change()",                  // trigger: raises, runs no SQL
        "streams._stream_matches_support(internal)", // planner support: no SQL
        "streams.get(bigint)",                       // runs as the caller, inlined into its query
        "streams.replay(text,bigint,timestamp with time zone,xid8,integer,text[],jsonb,bigint)", // as the caller, inlined
        "streams.transaction_events(xid8)", // as the caller, inlined
        "streams.publish(text,jsonb,text,text,jsonb,text,bigint)", // kept plans pinned in Rust (kept_plan.rs)
        "streams._publish_batch(text,jsonb[],text,text,jsonb,text,bigint)", // same
        "streams._last_publish_duplicate()", // a backend flag, runs no SQL
        "streams._commit_time(bigint)",     // a kept plan pinned in Rust, run as the caller
        "streams._attempt(bigint)",         // per event: answers from backend memory, runs no SQL
        "streams._await_delivery()",        // waits on shared memory, runs no SQL
        "streams._capture()",               // trigger: its SQL is kept plans pinned in Rust (kept_plan.rs)
        "streams._first_position()",        // catalog and relation cache lookups, runs no SQL
        "streams._partition_bounds()",      // the same
    ];
    let unpinned: Vec<String> = c
        .query(
            "SELECT p.oid::regprocedure::text FROM pg_proc p
             WHERE p.pronamespace = 'streams'::regnamespace AND p.provolatile <> 'i'
               AND NOT coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false)
             ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get::<_, String>(0))
        .filter(|f| !allowed.contains(&f.as_str()))
        .collect();
    assert!(unpinned.is_empty(), "functions that may run SQL without a pinned search_path: {unpinned:?}");
    // And what PUBLIC may run reveals nothing: a role with schema usage only
    // cannot look up transactions.
    let nobody = TestRole::new(&db, "nobody", "");
    c.batch_execute(&format!("GRANT USAGE ON SCHEMA streams TO {}", nobody.name)).unwrap();
    let err = db.connect_as(&nobody.name).query_one("SELECT streams._replay_start(now(), NULL)", &[]).unwrap_err();
    assert_eq!(sqlstate(&err), "42501");
}

/// `streams.replay` runs as its caller: a function planted in the caller's
/// search_path (an exact-type overload of a VARIADIC "any" built-in the
/// extension calls) must not be what it runs, even for a superuser caller.
#[test]
fn replay_ignores_functions_planted_in_the_callers_search_path() {
    let db = TestDb::new();
    let attacker = TestRole::new(&db, "attacker", "");
    let mut owner = db.connect();
    owner.batch_execute(&format!("GRANT CREATE ON SCHEMA public TO {}", attacker.name)).unwrap();
    let mut evil = db.connect_as(&attacker.name);
    evil.batch_execute(&booby_traps("public", &attacker.name, &[])).unwrap();
    evil.batch_execute(
        "CREATE FUNCTION public.num_nonnulls(bigint, timestamptz, xid8) RETURNS integer LANGUAGE plpgsql AS
         $$ BEGIN PERFORM public.escalate(); RETURN 0; END $$",
    )
    .unwrap();
    let p = publish(&mut owner, "orders", "{}");
    wait_for_horizon(&mut owner, p);
    owner.batch_execute(r#"SET search_path = "$user", public"#).unwrap();
    for args in ["after => 0", "since => now() - interval '1 hour'", ""] {
        owner.query(&format!("SELECT * FROM streams.replay({args})"), &[]).unwrap();
    }
    assert!(!is_superuser(&attacker.name), "replay ran a function from the caller's search_path");
}

/// Default privileges of the installing role (ALTER DEFAULT PRIVILEGES) do
/// not reach the extension's objects: nobody gets the tables underneath.
#[test]
fn default_privileges_do_not_reach_the_log() {
    let db = TestDb::without_extension();
    let reporting = TestRole::new(&db, "reporting", "");
    let mut c = db.connect();
    c.batch_execute(&format!(
        "ALTER DEFAULT PRIVILEGES GRANT ALL ON TABLES TO {0};
         ALTER DEFAULT PRIVILEGES GRANT ALL ON SEQUENCES TO {0};
         ALTER DEFAULT PRIVILEGES GRANT ALL ON SCHEMAS TO {0};
         CREATE EXTENSION litebase_streams;",
        reporting.name
    ))
    .unwrap();
    let leaks = |c: &mut Client| -> Vec<String> {
        c.query(
            "SELECT c.oid::regclass::text FROM pg_class c
             WHERE c.relnamespace = 'streams'::regnamespace AND c.relkind IN ('r', 'S', 'v')
               AND (has_table_privilege($1, c.oid, 'SELECT') OR has_table_privilege($1, c.oid, 'UPDATE')
                    OR has_table_privilege($1, c.oid, 'DELETE'))
               -- Readable by everyone on purpose; each role sees only its own rows.
               AND c.oid NOT IN ('streams.stream_grants'::regclass, 'streams.subscriptions'::regclass,
                                 'streams.webhooks'::regclass, 'streams.dead_letters'::regclass,
                                 -- The streams the caller may read, with their counts.
                                 'streams.streams'::regclass,
                                 -- pg_trigger, which it reads, is readable by everyone too.
                                 'streams.captures'::regclass,
                                 -- The storage settings and where the log starts: every reader's to know.
                                 'streams.storage'::regclass)",
            &[&reporting.name],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
    };
    assert_eq!(leaks(&mut c), Vec::<String>::new(), "default privileges reached these");
    // Nor the partitions the worker makes as the log grows (the installing
    // role's default privileges apply to them too, unless revoked).
    c.batch_execute("SELECT streams.set_partition_size(10000)").unwrap();
    c.query_one("SELECT count(*) FROM streams.publish_batch('orders', array_fill('{}'::jsonb, ARRAY[15000]))", &[])
        .unwrap();
    let partitions: i64 = c
        .query_one("SELECT count(*) FROM pg_inherits WHERE inhparent = 'streams.event_log'::regclass", &[])
        .unwrap()
        .get(0);
    assert!(partitions >= 2, "the log has partitions: {partitions}");
    assert_eq!(leaks(&mut c), Vec::<String>::new(), "default privileges reached these partitions");
    let create: bool =
        c.query_one("SELECT has_schema_privilege($1, 'streams', 'CREATE')", &[&reporting.name]).unwrap().get(0);
    assert!(!create, "nobody else may create objects in schema streams");
    c.batch_execute(&format!("ALTER DEFAULT PRIVILEGES REVOKE ALL ON TABLES FROM {0}; ALTER DEFAULT PRIVILEGES REVOKE ALL ON SEQUENCES FROM {0}; ALTER DEFAULT PRIVILEGES REVOKE ALL ON SCHEMAS FROM {0}", reporting.name)).unwrap();
}

/// The next notification with its sender's pid.
fn next_with_pid(listener: &mut Listener, timeout: Duration) -> Option<(i32, serde_json::Value)> {
    let mut notifications = listener.client.notifications();
    let next = notifications.timeout_iter(timeout).next().unwrap();
    next.map(|n| (n.process_id(), serde_json::from_str(n.payload()).unwrap_or(serde_json::Value::Null)))
}

/// Any role can pg_notify on a stream's channel. A client following the
/// documented rule (trust a notification only when its sender is
/// `streams.worker_pid()`, and never move the cursor on anything else) keeps
/// its cursor on the real event.
#[test]
fn forged_notifications_are_told_apart_by_the_sender_pid() {
    let db = TestDb::new();
    let reader = TestRole::new(&db, "reader", "");
    let forger = TestRole::new(&db, "forger", "");
    let mut owner = db.connect();
    owner.batch_execute(&format!("SELECT streams.grant('read', 'payment.*', '{}')", reader.name)).unwrap();

    let mut reader_client = db.connect_as(&reader.name);
    let worker_pid: i32 = reader_client.query_one("SELECT streams.worker_pid()", &[]).unwrap().get(0);
    assert_eq!(worker_pid, db.wait_for_worker(), "worker_pid() names the worker");
    let mut listener = Listener::from_client(reader_client);
    listener.client.batch_execute("LISTEN \"payment.success\"").unwrap();

    db.connect_as(&forger.name)
        .batch_execute(r#"SELECT pg_notify('payment.success', '{"position":9223372036854775807,"stream":"payment.success","data":{}}')"#)
        .unwrap();
    let real = publish(&mut owner, "payment.success", PAYMENT);

    let mut last_seen = 0i64;
    let mut forged_seen = 0;
    for _ in 0..2 {
        let (pid, event) = next_with_pid(&mut listener, Duration::from_secs(10)).expect("two notifications");
        if pid == worker_pid {
            last_seen = last_seen.max(event["position"].as_i64().unwrap());
        } else {
            forged_seen += 1;
        }
    }
    assert_eq!(forged_seen, 1, "the forged notification came from another pid");
    assert_eq!(last_seen, real, "the cursor follows only the worker's notifications");
}

/// `litebase_streams.hold_timeout`, set for the database by a superuser,
/// ends a publishing transaction that stays open, even one whose session
/// turned off idle_in_transaction_session_timeout; the role cannot lift it.
#[test]
fn hold_timeout_ends_a_transaction_that_holds_the_horizon() {
    let db = TestDb::new();
    let app = TestRole::new(&db, "app", "");
    let mut owner = db.connect();
    owner
        .batch_execute(&format!(
            "ALTER DATABASE {} SET litebase_streams.hold_timeout = '1s';
             ALTER DATABASE {0} SET idle_in_transaction_session_timeout = '1h';
             SELECT streams.grant('publish', '*', '{}')",
            db.name, app.name
        ))
        .unwrap();
    let mut holder = db.connect_as(&app.name);
    let err = holder.batch_execute("SET litebase_streams.hold_timeout = 0").unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "only a superuser sets hold_timeout");
    holder.batch_execute("SET idle_in_transaction_session_timeout = 0; BEGIN").unwrap();
    let held: i64 = holder.query_one("SELECT streams.publish('orders', '{\"held\":true}')", &[]).unwrap().get(0);

    let later = publish(&mut owner, "orders", r#"{"later":true}"#);
    wait_until("the horizon passes the held transaction", Duration::from_secs(20), || horizon(&mut owner) >= later);
    assert!(holder.is_closed() || holder.batch_execute("SELECT 1").is_err(), "the holder's session was ended");
    let visible: Vec<i64> = event_positions(&mut owner, "SELECT position FROM streams.events ORDER BY position");
    assert_eq!(visible, vec![later], "the held event never existed, the later one is final (held was {held})");

    // RESET takes effect without restarting the worker.
    owner.batch_execute(&format!("ALTER DATABASE {} RESET litebase_streams.hold_timeout", db.name)).unwrap();
    let mut holder = db.connect_as(&app.name);
    holder.batch_execute("BEGIN").unwrap();
    holder.query_one("SELECT streams.publish('orders', '{}')", &[]).unwrap();
    wait_until("the new holder has held the horizon for 3 s", Duration::from_secs(20), || {
        owner
            .query_one("SELECT coalesce(extract(epoch FROM holder_age), 0) > 3 FROM streams.status", &[])
            .unwrap()
            .get::<_, bool>(0)
    });
    holder.batch_execute("COMMIT").expect("with hold_timeout reset, the session lives on");
    owner.batch_execute(&format!("ALTER DATABASE {} RESET ALL", db.name)).unwrap();
}

/// A 64 MB event costs the worker nothing: it never reads data that cannot
/// fit a notification (the listener gets it truncated), so its peak memory
/// hardly moves. `max_event_size` refuses larger events when set, and only
/// a superuser sets it.
#[test]
fn huge_events_do_not_grow_the_worker_and_can_be_refused() {
    let db = TestDb::new();
    let worker = db.wait_for_worker();
    let peak = || -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{worker}/status")).expect("the worker's /proc status");
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() // kB
    };
    let mut c = db.connect();
    let mut listener = Listener::new(&db, &["big"]);
    let before = peak();
    let position: i64 = c
        .query_one("SELECT streams.publish('big', jsonb_build_object('blob', repeat(md5('x'), 2 * 1024 * 1024)))", &[])
        .unwrap()
        .get(0);
    let got = listener.collect(1, Duration::from_secs(30));
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["position"].as_i64(), Some(position));
    assert_eq!(got[0]["truncated"], serde_json::Value::Bool(true));
    let grown_kb = peak().saturating_sub(before);
    assert!(grown_kb < 16 * 1024, "the worker's peak memory grew by {grown_kb} kB for a 64 MB event");

    // Small when stored, huge when printed: 200 numerics of 131,072 digits.
    let before = peak();
    let bomb: i64 = c
        .query_one(
            "SELECT streams.publish('big', (SELECT jsonb_agg(('1' || repeat('0', 131071))::numeric) FROM generate_series(1, 200)))",
            &[],
        )
        .unwrap()
        .get(0);
    let got = listener.collect(1, Duration::from_secs(30));
    assert_eq!((got[0]["position"].as_i64(), &got[0]["truncated"]), (Some(bomb), &serde_json::Value::Bool(true)));
    let grown_kb = peak().saturating_sub(before);
    assert!(grown_kb < 16 * 1024, "the worker's peak memory grew by {grown_kb} kB for 26 MB of printed numbers");

    let app = TestRole::new(&db, "app", "");
    c.batch_execute(&format!("SELECT streams.grant('publish', '*', '{}')", app.name)).unwrap();
    let mut app_client = db.connect_as(&app.name);
    let err = app_client.batch_execute("SET litebase_streams.max_event_size = 0").unwrap_err();
    assert_eq!(sqlstate(&err), "42501");
    c.batch_execute("SET litebase_streams.max_event_size = '1kB'").unwrap();
    let stored = count_stored(&mut c);
    let err =
        c.batch_execute("SELECT streams.publish('big', jsonb_build_object('blob', repeat('y', 2000)))").unwrap_err();
    assert_eq!(sqlstate(&err), "54000", "{err}");
    let err = c
        .batch_execute(
            "SELECT streams.publish_batch('big', ARRAY['{}', jsonb_build_object('blob', repeat('y', 2000))])",
        )
        .unwrap_err();
    assert_eq!(sqlstate(&err), "54000");
    assert_eq!(count_stored(&mut c), stored, "nothing written");
    publish(&mut c, "big", r#"{"small":true}"#);
}

/// Running as `client`, the statements of docs/reference.md's recipes work.
fn run_all(client: &mut Client, statements: &[&str]) {
    for sql in statements {
        client.batch_execute(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

/// The grant recipes of docs/reference.md, run as the roles they are for.
#[test]
fn readme_grant_recipes_work_for_their_roles() {
    let db = TestDb::new();
    let (app, reader, ops) =
        (TestRole::new(&db, "app", ""), TestRole::new(&db, "reader", ""), TestRole::new(&db, "ops", ""));
    let mut owner = db.connect();
    run_all(
        &mut owner,
        &[
            &format!("SELECT streams.grant('publish', '*', '{}')", app.name),
            &format!("SELECT streams.grant('read', 'payment.*', '{}')", reader.name),
            &format!(
                "GRANT USAGE ON SCHEMA streams TO {0}; GRANT SELECT ON streams.status TO {0};
                 GRANT EXECUTE ON FUNCTION streams._worker_status() TO {0};",
                ops.name
            ),
        ],
    );
    let p = publish(&mut db.connect_as(&app.name), "payment.success", PAYMENT);
    wait_for_horizon(&mut owner, p);
    run_all(
        &mut db.connect_as(&app.name),
        &["SELECT * FROM streams.publish_batch('payment.success', ARRAY['{}'::jsonb])"],
    );
    run_all(
        &mut db.connect_as(&reader.name),
        &[
            "SELECT streams.horizon(), streams.worker_pid(), streams.log_id()",
            "SELECT * FROM streams.events WHERE position > 0 ORDER BY position LIMIT 10",
            "SELECT * FROM streams.replay(stream => 'payment.*', after => 0)",
            "SELECT * FROM streams.replay(since => now() - interval '1 hour')",
            "SELECT * FROM streams.get(1)",
        ],
    );
    let mut ops_client = db.connect_as(&ops.name);
    let row = ops_client.query_one("SELECT worker_pid, horizon, log_id IS NOT NULL FROM streams.status", &[]).unwrap();
    assert_eq!(row.get::<_, Option<i32>>(0), Some(db.wait_for_worker()));
}

/// The extension's schema is dropped and, in the same transaction, the database's
/// owner (not a superuser) creates a look-alike `streams` schema whose
/// `horizon_state` has a trigger. The worker runs as a superuser and by
/// name: it must see that these tables are not the extension's and leave,
/// never running the trigger.
#[test]
fn the_worker_never_serves_a_look_alike_schema() {
    let db = TestDb::new();
    let squatter = TestRole::new(&db, "squatter", "");
    let mut admin_client = db.connect();
    publish(&mut admin_client, "orders", "{}");
    db.wait_for_worker();
    admin_client
        .batch_execute(&format!(
            "ALTER DATABASE {db} OWNER TO {role};
             CREATE TABLE public.evidence (who text);
             GRANT INSERT ON public.evidence TO PUBLIC;
             BEGIN;
             DROP SCHEMA streams CASCADE;
             SET ROLE {role};
             CREATE SCHEMA streams;
             CREATE TABLE streams.event_log (position bigint, stream text, tx xid8, data jsonb);
             CREATE TABLE streams.private_streams (stream text);
             CREATE TABLE streams.position_seq (last_value bigint, is_called boolean);
             INSERT INTO streams.position_seq VALUES (10, true);
             CREATE TABLE streams.horizon_state (id boolean PRIMARY KEY, horizon bigint, delivered bigint,
                                                 system_identifier bigint, era_bounds bigint[]);
             INSERT INTO streams.horizon_state VALUES (true, 5, NULL, NULL, NULL);
             CREATE TABLE streams.commit_times (first_position bigint, times timestamptz[], last_time timestamptz,
                                                inexact bigint[]);
             CREATE FUNCTION public.pwn() RETURNS trigger LANGUAGE plpgsql AS
                 $$ BEGIN INSERT INTO public.evidence VALUES (current_user); RETURN NEW; END $$;
             CREATE TRIGGER pwn BEFORE INSERT OR UPDATE ON streams.horizon_state
                 FOR EACH ROW EXECUTE FUNCTION public.pwn();
             CREATE TRIGGER pwn BEFORE INSERT OR UPDATE ON streams.commit_times
                 FOR EACH ROW EXECUTE FUNCTION public.pwn();
             RESET ROLE;
             COMMIT;",
            db = db.name,
            role = squatter.name
        ))
        .unwrap();
    wait_until("the worker leaves the database", Duration::from_secs(20), || {
        let workers: i64 = admin_client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND backend_type = 'litebase_streams worker'",
                &[],
            )
            .unwrap()
            .get(0);
        workers == 0
    });
    let ran: Vec<String> =
        admin_client.query("SELECT who FROM public.evidence", &[]).unwrap().iter().map(|r| r.get(0)).collect();
    assert!(ran.is_empty(), "the worker ran the look-alike's trigger as {ran:?}");
    assert!(!is_superuser(&squatter.name));
    admin_client.batch_execute(&format!("ALTER DATABASE {} OWNER TO CURRENT_USER", db.name)).unwrap();
}
