//! Transactional publish: rollback publishes nothing, commit publishes, `tx`
//! and `time` are the transaction's own, bad input gets a SQLSTATE and writes
//! nothing, and stored events cannot be changed.
#![cfg(feature = "integration")]

mod common;

use common::*;

#[test]
fn rollback_publishes_nothing() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute("BEGIN").unwrap();
    let rolled_back = publish(&mut c, "payment.success", PAYMENT);
    c.batch_execute("ROLLBACK").unwrap();
    let committed = publish(&mut c, "payment.success", PAYMENT);
    wait_for_horizon(&mut c, committed);
    assert_eq!(event_positions(&mut c, "SELECT position FROM streams.events"), vec![committed]);
    assert!(event_positions(&mut c, &format!("SELECT position FROM streams.event_log WHERE position = {rolled_back}"))
        .is_empty());
}

#[test]
fn savepoint_rollback_publishes_nothing() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute("BEGIN").unwrap();
    let kept = publish(&mut c, "orders", r#"{"n":1}"#);
    c.batch_execute("SAVEPOINT s").unwrap();
    publish(&mut c, "orders", r#"{"n":2}"#);
    c.batch_execute("ROLLBACK TO SAVEPOINT s").unwrap();
    let after = publish(&mut c, "orders", r#"{"n":3}"#);
    c.batch_execute("COMMIT").unwrap();
    wait_for_horizon(&mut c, after);
    let seen: Vec<String> = c
        .query("SELECT data->>'n' FROM streams.events ORDER BY position", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(seen, ["1", "3"]);
    assert!(kept < after);
}

#[test]
fn commit_publishes_durably_with_the_returned_position() {
    let db = TestDb::new();
    let mut c = db.connect();
    let position = publish(&mut c, "payment.success", PAYMENT);
    wait_for_horizon(&mut c, position);
    let row = c.query_one("SELECT stream, data::text FROM streams.events WHERE position = $1", &[&position]).unwrap();
    assert_eq!(row.get::<_, String>(0), "payment.success");
    assert_eq!(row.get::<_, String>(1), r#"{"amount": 49.00, "order_id": "ord_123"}"#);
}

#[test]
fn tx_is_the_publishing_transaction_and_matches_row_xmin() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute("CREATE TABLE orders (id text)").unwrap();
    c.batch_execute("BEGIN").unwrap();
    c.batch_execute("INSERT INTO orders VALUES ('ord_123')").unwrap();
    let position = publish(&mut c, "payment.success", PAYMENT);
    let xact: String = c.query_one("SELECT pg_current_xact_id()::text", &[]).unwrap().get(0);
    c.batch_execute("COMMIT").unwrap();
    wait_for_horizon(&mut c, position);
    let tx: String = c.query_one("SELECT tx::text FROM streams.get($1)", &[&position]).unwrap().get(0);
    assert_eq!(tx, xact);
    let joined: String = c
        .query_one(
            "SELECT o.id FROM streams.events e JOIN orders o ON o.xmin = e.tx::xid WHERE e.position = $1",
            &[&position],
        )
        .unwrap()
        .get(0);
    assert_eq!(joined, "ord_123");
}

#[test]
fn time_is_the_commit_time() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute("BEGIN").unwrap();
    let position = publish(&mut c, "payment.success", PAYMENT);
    // Commit a while after the insert: an insert-time `time` would fall outside.
    c.batch_execute("SELECT pg_sleep(0.2)").unwrap();
    let before: String = c.query_one("SELECT clock_timestamp()::text", &[]).unwrap().get(0);
    c.batch_execute("COMMIT").unwrap();
    let after: String = c.query_one("SELECT clock_timestamp()::text", &[]).unwrap().get(0);
    wait_for_horizon(&mut c, position);
    let inside: bool = c
        .query_one(
            "SELECT time BETWEEN $2::text::timestamptz AND $3::text::timestamptz FROM streams.get($1)",
            &[&position, &before, &after],
        )
        .unwrap()
        .get(0);
    assert!(inside, "time lies between clock_timestamp() just before and just after COMMIT");
    // The same value on every read.
    let first: String = c.query_one("SELECT time::text FROM streams.get($1)", &[&position]).unwrap().get(0);
    let again: String = c.query_one("SELECT time::text FROM streams.replay()", &[]).unwrap().get(0);
    assert_eq!(first, again);
}

#[test]
fn publish_batch_appends_in_array_order() {
    let db = TestDb::new();
    let mut c = db.connect();
    let positions: Vec<i64> = c
        .query(r#"SELECT * FROM streams.publish_batch('orders', ARRAY['{"n":1}','{"n":2}','{"n":3}']::jsonb[])"#, &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(positions.len(), 3);
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
    wait_for_horizon(&mut c, positions[2]);
    let ns: Vec<String> = c
        .query("SELECT data->>'n' FROM streams.events ORDER BY position", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(ns, ["1", "2", "3"]);
}

/// Each bad input fails with its SQLSTATE and leaves the log unchanged.
#[test]
fn bad_input_gets_a_sqlstate_and_writes_nothing() {
    let db = TestDb::new();
    let mut c = db.connect();
    publish(&mut c, "seed", "{}");
    let cases = [
        ("SELECT streams.publish('', '{}')", "22023"),
        ("SELECT streams.publish('.hidden', '{}')", "22023"),
        ("SELECT streams.publish('has space', '{}')", "22023"),
        ("SELECT streams.publish(repeat('a', 64), '{}')", "22023"),
        ("SELECT streams.publish('caf\u{e9}', '{}')", "22023"),
        ("SELECT streams.publish(NULL, '{}')", "22004"),
        ("SELECT streams.publish('orders', NULL)", "22004"),
        ("SELECT streams.publish_batch('orders', NULL)", "22004"),
        ("SELECT streams.publish_batch('orders', ARRAY['{}', NULL]::jsonb[])", "22004"),
        ("SELECT streams.publish_batch('bad name', ARRAY['{}']::jsonb[])", "22023"),
        ("SELECT streams.publish_batch('bad name', ARRAY[]::jsonb[])", "22023"),
        ("SELECT streams.publish_batch(NULL, ARRAY['{}']::jsonb[])", "22004"),
        ("SELECT * FROM streams.replay(since => now(), from_tx => '1'::xid8)", "22023"),
        ("SELECT * FROM streams.replay(after => 1, since => now(), from_tx => '1'::xid8)", "22023"),
        ("SELECT * FROM streams.replay(max_events => -1)", "22023"),
        ("SELECT * FROM streams.replay(stream => 'bad name')", "22023"),
        ("SELECT * FROM streams.replay(stream => 'a*b*')", "22023"),
    ];
    let before = count_stored(&mut c);
    for (sql, expected) in cases {
        let err = c.batch_execute(sql).expect_err(sql);
        assert_eq!(sqlstate(&err), expected, "{sql}: {err}");
    }
    assert_eq!(count_stored(&mut c), before, "nothing was written");

    // errmsg names the name, errdetail what is wrong with it, errhint the rule.
    let err = c.batch_execute("SELECT streams.publish('bad name', '{}')").unwrap_err();
    let db_err = err.as_db_error().unwrap();
    assert_eq!(db_err.message(), "invalid stream name \"bad name\"");
    assert!(db_err.detail().is_some_and(|d| d.contains("[A-Za-z0-9_.:-]")), "says what is wrong: {db_err:?}");
    assert!(db_err.hint().is_some_and(|h| h.contains("1 to 63 bytes")), "states the rule: {db_err:?}");
}

#[test]
fn prepare_transaction_after_publish_fails_clearly() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute("BEGIN").unwrap();
    publish(&mut c, "orders", "{}");
    let err = c.batch_execute("PREPARE TRANSACTION 'lbs_test'").unwrap_err();
    assert_eq!(sqlstate(&err), "0A000");
    assert!(err.as_db_error().unwrap().message().contains("PREPARE"));
    assert_eq!(count_stored(&mut c), 0, "the transaction was rolled back");
    // A transaction that did not publish still prepares.
    c.batch_execute(&format!("BEGIN; CREATE TABLE t (); PREPARE TRANSACTION '{}'", db.name)).unwrap();
    c.batch_execute(&format!("ROLLBACK PREPARED '{}'", db.name)).unwrap();
    // And this backend publishes normally afterwards.
    let p = publish(&mut c, "orders", "{}");
    wait_for_horizon(&mut c, p);
}

/// UPDATE, DELETE and TRUNCATE fail for the owner and for another superuser,
/// and change nothing.
#[test]
fn stored_events_are_immutable_for_owner_and_superuser() {
    let db = TestDb::new();
    let mut owner = db.connect();
    let p = publish(&mut owner, "orders", r#"{"n":1}"#);
    wait_for_horizon(&mut owner, p);
    let role = format!("{}_super", db.name);
    admin().batch_execute(&format!("CREATE ROLE {role} SUPERUSER LOGIN")).unwrap();
    let mut other = db.connect_as(&role);
    for client in [&mut owner, &mut other] {
        for sql in [
            "UPDATE streams.event_log SET data = '{\"n\":2}'",
            "DELETE FROM streams.event_log",
            "TRUNCATE streams.event_log",
            "UPDATE streams.commit_times SET last_time = now()",
            "DELETE FROM streams.commit_times",
            "TRUNCATE streams.commit_times",
            "SET session_replication_role = replica; DELETE FROM streams.event_log",
        ] {
            let err = client.batch_execute(sql).expect_err(sql);
            assert_eq!(sqlstate(&err), "55000", "{sql}: {err}");
            client.batch_execute("RESET session_replication_role").unwrap();
        }
    }
    drop(other);
    let data: String = owner.query_one("SELECT data->>'n' FROM streams.get($1)", &[&p]).unwrap().get(0);
    assert_eq!(data, "1");
    assert_eq!(count_stored(&mut owner), 1);
    let _ = admin().batch_execute(&format!("DROP ROLE {role}"));
}

#[test]
fn status_names_the_transaction_that_holds_the_horizon() {
    let db = TestDb::new();
    let mut holder = db.connect();
    let mut other = db.connect();
    holder.batch_execute("BEGIN").unwrap();
    let held = publish(&mut holder, "orders", "{}");
    let holder_pid: i32 = holder.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    let holder_xid: String = holder.query_one("SELECT pg_current_xact_id()::xid::text", &[]).unwrap().get(0);
    let later = publish(&mut other, "orders", "{}");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let row = other
        .query_one(
            "SELECT horizon, newest_position, holder_pid, holder_position, holder_xid::text, holder_age IS NOT NULL, worker_pid IS NOT NULL,
                    holder_waits_for
             FROM streams.status",
            &[],
        )
        .unwrap();
    assert!(row.get::<_, i64>(0) < held, "the open transaction holds the horizon");
    assert_eq!(row.get::<_, i64>(1), later);
    assert_eq!(row.get::<_, Option<i32>>(2), Some(holder_pid));
    assert_eq!(row.get::<_, Option<i64>>(3), Some(held));
    assert_eq!(row.get::<_, Option<String>>(4), Some(holder_xid));
    assert!(row.get::<_, bool>(5) && row.get::<_, bool>(6));
    assert_eq!(row.get::<_, Option<String>>(7).as_deref(), Some("its client: idle in transaction"));
    holder.batch_execute("COMMIT").unwrap();
    wait_for_horizon(&mut other, later);
    let free: Option<i32> = other.query_one("SELECT holder_pid FROM streams.status", &[]).unwrap().get(0);
    assert_eq!(free, None);
}

/// A role granted what docs/reference.md lists can publish and replay without
/// access to the tables underneath; a role without grants cannot publish.
#[test]
fn granted_role_publishes_and_replays_without_table_access() {
    let db = TestDb::new();
    let mut owner = db.connect();
    let app = format!("{}_app", db.name);
    let stranger = format!("{}_stranger", db.name);
    owner
        .batch_execute(&format!(
            "CREATE ROLE {app} LOGIN; CREATE ROLE {stranger} LOGIN;
             GRANT USAGE ON SCHEMA streams TO {stranger};
             GRANT EXECUTE ON FUNCTION streams.publish(text, jsonb, text, text, jsonb, text, bigint) TO {stranger};
             SELECT streams.grant('publish', '*', '{app}'), streams.grant('read', '*', '{app}');"
        ))
        .unwrap();
    let mut c = db.connect_as(&app);
    c.batch_execute("BEGIN").unwrap();
    let p = publish(&mut c, "orders", r#"{"n":1}"#);
    let tx: String = c.query_one("SELECT pg_current_xact_id()::text", &[]).unwrap().get(0);
    c.batch_execute("COMMIT").unwrap();
    wait_for_horizon(&mut owner, p);
    for args in
        ["", "after => 0", "stream => 'orders'", "since => now() - interval '1 hour'", &format!("from_tx => '{tx}'")]
    {
        let got: Vec<i64> = c
            .query(&format!("SELECT position FROM streams.replay({args})"), &[])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(got, vec![p], "replay({args})");
    }
    let err = c.batch_execute("INSERT INTO streams.event_log VALUES (999, 'x', '1', '{}')").unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "no direct writes");

    // EXECUTE on publish alone is not a grant to publish anywhere.
    let mut s = db.connect_as(&stranger);
    let err = s.batch_execute("SELECT streams.publish('orders', '{}')").unwrap_err();
    assert_eq!(sqlstate(&err), "42501");
    drop((c, s));
    owner.batch_execute(&format!("DROP OWNED BY {app}, {stranger}")).unwrap();
    drop(owner);
    let mut admin = admin();
    admin.batch_execute(&format!("DROP DATABASE {} WITH (FORCE)", db.name)).unwrap();
    admin.batch_execute(&format!("DROP ROLE {app}; DROP ROLE {stranger}")).unwrap();
}

/// Publish appends rows without the executor while `streams.event_log` is as
/// the extension made it. An owner who adds a CHECK constraint or an INSERT
/// trigger to it still gets them applied (publish then inserts through SQL),
/// and a value TOASTed in another table is stored whole, not as a pointer.
#[test]
fn a_changed_log_table_still_gets_what_an_insert_does() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute(
        "CREATE TABLE big (d jsonb);
         INSERT INTO big SELECT jsonb_build_object('x', repeat('y', 1000000))",
    )
    .unwrap();
    let external: bool = c.query_one("SELECT pg_column_size(d) < 100000 FROM big", &[]).unwrap().get(0);
    assert!(external, "the source value is stored compressed (and out of line)");
    let copied: i64 = c.query_one("SELECT streams.publish('orders', d) FROM big", &[]).unwrap().get(0);
    wait_for_horizon(&mut c, copied);
    let same: bool =
        c.query_one("SELECT (SELECT data FROM streams.get($1)) = (SELECT d FROM big)", &[&copied]).unwrap().get(0);
    assert!(same, "the event holds the whole value");

    c.batch_execute("ALTER TABLE streams.event_log ADD CONSTRAINT short_names CHECK (length(stream) <= 8)").unwrap();
    publish(&mut c, "orders", "{}");
    for sql in [
        "SELECT streams.publish('payment.success', '{}')",
        "SELECT streams.publish_batch('payment.success', ARRAY['{}'::jsonb, '{}'])",
    ] {
        let err = c.batch_execute(sql).expect_err(sql);
        assert_eq!(sqlstate(&err), "23514", "{sql}: {err}");
    }
    c.batch_execute(
        "ALTER TABLE streams.event_log DROP CONSTRAINT short_names;
         CREATE TABLE audit (position bigint);
         CREATE FUNCTION audit() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN INSERT INTO public.audit VALUES (NEW.position); RETURN NEW; END $$;
         CREATE TRIGGER audit AFTER INSERT ON streams.event_log FOR EACH ROW EXECUTE FUNCTION audit()",
    )
    .unwrap();
    let audited = publish(&mut c, "payment.success", PAYMENT);
    let batch: Vec<i64> = c
        .query("SELECT streams.publish_batch('orders', ARRAY['{}'::jsonb, '{}'])", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let seen = event_positions(&mut c, "SELECT position FROM audit ORDER BY position");
    assert_eq!(seen, [vec![audited], batch].concat(), "the trigger saw every published row");
}
