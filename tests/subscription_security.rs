//! Subscriptions and privileges: creating one takes read on every stream of
//! its pattern (and a revoke applies to one that exists); another role
//! cannot use, see, change or stall a subscription (a member of its owner
//! can); types planted in pg_temp never run as the extension's owner.
#![cfg(feature = "integration")]

mod common;

use common::subscriptions::*;
use common::*;
use postgres::Client;

// --- privileges ------------------------------------------------------------------

#[test]
fn a_subscription_needs_read_on_every_stream_of_its_pattern() {
    let db = TestDb::new();
    let (orders_reader, success_reader, payments_reader) = (
        TestRole::new(&db, "orders_reader", ""),
        TestRole::new(&db, "success_reader", ""),
        TestRole::new(&db, "payments_reader", ""),
    );
    let mut owner = db.connect();
    owner
        .batch_execute(&format!(
            "SELECT streams.grant('read', 'orders', '{0}');
             SELECT streams.grant('read', 'payment.success', '{1}');
             SELECT streams.grant('read', 'payment.*', '{2}'), streams.grant('read', 'orders', '{2}')",
            orders_reader.name, success_reader.name, payments_reader.name
        ))
        .unwrap();
    let p = publish_events(&mut owner, "payment.success", 3, 3);

    let mut o = db.connect_as(&orders_reader.name);
    fails_with(&mut o, "SELECT streams.create_subscription('o_pay', 'payment.*')", "42501");
    fails_with(&mut o, "SELECT streams.create_subscription('o_all', '*')", "42501");
    fails_with(
        &mut o,
        "SELECT streams._create_subscription('o_direct', 'payment.*', 0, true, NULL, 'hold', NULL, '1 second', '10 minutes', false, NULL, NULL)",
        "42501",
    );
    o.batch_execute("SELECT streams.create_subscription('o_orders', 'orders')").unwrap();

    let mut s = db.connect_as(&success_reader.name);
    let err = fails_with(&mut s, "SELECT streams.create_subscription('s_pay', 'payment.*')", "42501");
    let message = err.as_db_error().map(|e| e.message().to_owned()).unwrap_or_default();
    assert!(message.contains("payment.*"), "names the pattern: {message}");
    s.batch_execute("SELECT streams.create_subscription('s_success', 'payment.success', after => 0)").unwrap();
    assert_eq!(consume(&mut s, "s_success", 10), p);
    let names: Vec<String> = stored_subscriptions(&mut owner).into_iter().map(|s| s.0).collect();
    assert_eq!(names, ["o_orders", "s_success"], "the refused ones were not created");

    // A revoke applies to a subscription that exists.
    let mut r = db.connect_as(&payments_reader.name);
    r.batch_execute("SELECT streams.create_subscription('r_pay', 'payment.*', after => 0)").unwrap();
    owner.query_one("SELECT streams.revoke('read', 'payment.*', $1::text::regrole)", &[&payments_reader.name]).unwrap();
    r.batch_execute("BEGIN").unwrap();
    let err = try_poll(&mut r, "r_pay", 10).unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "{err}");
    r.batch_execute("ROLLBACK").unwrap();
    assert_eq!(progress(&mut owner, "r_pay"), Progress { position: 0, pending: 3, claimed: 0 });
    owner.batch_execute(&format!("SELECT streams.grant('read', 'payment.*', '{}')", payments_reader.name)).unwrap();
    assert_eq!(consume(&mut r, "r_pay", 10), p, "granted again, it goes on");
}

fn subscription_id(c: &mut Client, sub: &str) -> i32 {
    c.query_one("SELECT id FROM streams.subscription_state WHERE name = $1", &[&sub]).unwrap().get(0)
}

// --- hostile roles -------------------------------------------------------------------

/// A role with read privileges of its own cannot use, see, change or stall
/// another role's subscriptions; a member of the owner can use them.
#[test]
fn another_role_cannot_use_see_or_stall_a_subscription() {
    let db = TestDb::new();
    let (alice, mallory, alices_group_member) =
        (TestRole::new(&db, "alice", ""), TestRole::new(&db, "mallory", ""), TestRole::new(&db, "alice_team", ""));
    let mut owner = db.connect();
    owner
        .batch_execute(&format!(
            "SELECT streams.grant('read', 'orders', '{0}'), streams.grant('read', '*', '{1}'),
                    streams.grant('read', 'orders', '{2}');
             GRANT {0} TO {2}",
            alice.name, mallory.name, alices_group_member.name
        ))
        .unwrap();
    let mut a = db.connect_as(&alice.name);
    a.batch_execute(
        "SELECT streams.create_subscription('alice_sub', 'orders', after => 0);
         SELECT streams.create_subscription('alice_pool', 'orders', after => 0, ordered => false)",
    )
    .unwrap();
    let p = publish_events(&mut owner, "orders", 6, 3);
    let before = stored_subscriptions(&mut owner);

    let mut m = db.connect_as(&mallory.name);
    for sql in [
        "SELECT * FROM streams.poll('alice_sub')",
        "SELECT * FROM streams.poll('alice_pool')",
        "SELECT streams.ack('alice_sub', 1)",
        "SELECT streams.seek('alice_sub', after => 0)",
        "SELECT streams.seek('alice_sub')",
        "SELECT streams.drop_subscription('alice_sub')",
        "SELECT * FROM streams._claim('alice_sub', 10, '0', NULL)",
        "SELECT streams._seek_subscription('alice_sub', 0)",
        "SELECT * FROM streams.subscription_state",
        "SELECT * FROM streams.subscription_progress",
        "UPDATE streams.subscription_state SET position = 0",
        "DELETE FROM streams.subscription_state",
        "INSERT INTO streams.subscription_progress VALUES (1, 0, 1000000, now())",
        "SELECT nextval('streams.subscription_ids')",
    ] {
        fails_with(&mut m, sql, "42501");
    }
    let visible: i64 = m.query_one("SELECT count(*) FROM streams.subscriptions", &[]).unwrap().get(0);
    assert_eq!(visible, 0, "mallory sees no row of alice's subscriptions");
    assert_eq!(stored_subscriptions(&mut owner), before, "nothing changed");

    // Every advisory lock mallory can take on keys derived from the
    // subscriptions' ids, session- and transaction-level, exclusive and shared.
    let ids = [subscription_id(&mut owner, "alice_sub"), subscription_id(&mut owner, "alice_pool")];
    let db_oid: i64 =
        owner.query_one("SELECT oid::bigint FROM pg_database WHERE datname = current_database()", &[]).unwrap().get(0);
    m.batch_execute("BEGIN").unwrap();
    for id in ids {
        let id = id as i64;
        let mut keys =
            vec![format!("{id}"), format!("{db_oid}"), format!("{}", ((db_oid as u64) << 32 | id as u64) as i64)];
        for k in 0..4i64 {
            keys.push(format!("{id}, {k}"));
            keys.push(format!("{k}, {id}"));
            keys.push(format!("{}", (id << 32) | k));
            keys.push(format!("{}", (k << 32) | id));
        }
        keys.push(format!("{}, {id}", db_oid as i32));
        keys.push(format!("{id}, {}", 0x4C42));
        keys.push(format!("{id}, {}", 0x4C43));
        for key in keys {
            m.batch_execute(&format!(
                "SELECT pg_advisory_lock({key}), pg_advisory_xact_lock_shared({key});
                 SELECT pg_try_advisory_xact_lock({key})"
            ))
            .unwrap_or_else(|e| panic!("mallory locks ({key}): {e}"));
        }
    }

    let alice_pid = backend_pid(&mut a);
    a.batch_execute("BEGIN").unwrap();
    assert_eq!(poll(&mut a, "alice_sub", 2), p[..2], "alice polls while mallory holds the locks");
    assert_eq!(poll(&mut a, "alice_pool", 2), p[..2], "also the unordered one");
    let claims: Vec<(i64, i64, i32)> = owner
        .query(
            "SELECT classid::bigint, objid::bigint, objsubid::int FROM pg_locks
             WHERE locktype = 'advisory' AND pid = $1 AND granted ORDER BY objsubid, classid",
            &[&alice_pid],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        claims,
        [(ids[0] as i64, 0, 19522), (ids[1] as i64, 0, 19522), (ids[1] as i64, 0, 19523)],
        "pg_locks shows alice's claims: each subscription's token, and the unordered one's chunk"
    );
    ack(&mut a, "alice_sub", p[1]);
    ack(&mut a, "alice_pool", p[1]);
    a.batch_execute("COMMIT").unwrap();
    m.batch_execute("COMMIT; SELECT pg_advisory_unlock_all()").unwrap();
    assert_eq!(progress(&mut a, "alice_sub").position, p[1]);

    // A member of alice's role uses it as alice does.
    let mut team = db.connect_as(&alices_group_member.name);
    assert_eq!(consume(&mut team, "alice_sub", 10), p[2..]);
    let visible: i64 = team.query_one("SELECT count(*) FROM streams.subscriptions", &[]).unwrap().get(0);
    assert_eq!(visible, 2);
    assert!(team.query_one("SELECT streams.drop_subscription('alice_sub')", &[]).unwrap().get::<_, bool>(0));
}

/// A caller's temporary schema is searched first for types: a role that
/// plants `pg_temp.oid`, `pg_temp.int8`, ... (domains whose check runs its
/// own function) must never get that function run as the extension's owner
/// by any subscription function or the view, which act as the owner inside.
#[test]
fn types_planted_in_pg_temp_never_run_as_the_extension_owner() {
    let db = TestDb::new();
    let mallory = TestRole::new(&db, "mallory", "");
    let mut owner = db.connect();
    owner.batch_execute(&format!("SELECT streams.grant('read', 'pub.*', '{}')", mallory.name)).unwrap();
    let p = publish_events(&mut owner, "pub.a", 3, 1);
    let mut m = db.connect_as(&mallory.name);
    let mut plant = format!(
        "CREATE FUNCTION pg_temp.evil(anyelement) RETURNS boolean LANGUAGE plpgsql AS $$
         BEGIN
             IF current_user <> '{0}' THEN
                 RAISE EXCEPTION 'escalated: ran as %', current_user;
             END IF;
             RETURN true;
         END $$;",
        mallory.name
    );
    for ty in ["oid", "int2", "int4", "int8", "text", "bool", "regrole", "timestamptz", "interval", "name", "xid8"] {
        plant.push_str(&format!("CREATE DOMAIN pg_temp.{ty} AS pg_catalog.{ty} CHECK (pg_temp.evil(VALUE));"));
    }
    m.batch_execute(&plant).unwrap();
    let second = p[1];
    let flow = [
        "SELECT streams.create_subscription('m_ordered', 'pub.*', after => 0)".to_owned(),
        "SELECT streams.create_subscription('m_pool', 'pub.*', after => 0, ordered => false)".to_owned(),
        "BEGIN".to_owned(),
        "SELECT * FROM streams.poll('m_ordered', 2)".to_owned(),
        "SELECT * FROM streams.poll('m_pool', 2)".to_owned(),
        "SELECT * FROM streams.subscriptions".to_owned(),
        "SELECT * FROM streams._claims()".to_owned(),
        format!("SELECT streams.ack('m_ordered', {second})"),
        format!("SELECT streams.ack('m_pool', {second})"),
        "COMMIT".to_owned(),
        "SELECT streams.seek('m_pool', after => 0)".to_owned(),
        format!("SELECT streams.wait({second}, '1s')"),
        "SELECT streams.drop_subscription('m_pool')".to_owned(),
    ];
    for sql in flow {
        m.batch_execute(&sql).unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    }

    // A cheap function of mallory's in a query on the view never sees a row
    // of another role's subscription (the view is a security barrier).
    owner.batch_execute("SELECT streams.create_subscription('owners_secret', 'pub.*')").unwrap();
    m.batch_execute(
        "CREATE TEMP TABLE seen (name text);
         CREATE FUNCTION pg_temp.leak(text) RETURNS boolean LANGUAGE plpgsql COST 0.0000001 AS $$
         BEGIN INSERT INTO pg_temp.seen VALUES ($1); RETURN true; END $$;
         SELECT count(*) FROM streams.subscriptions WHERE pg_temp.leak(name)",
    )
    .unwrap();
    let seen: Vec<String> =
        m.query("SELECT name FROM pg_temp.seen ORDER BY 1", &[]).unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(seen, ["m_ordered"], "mallory's function saw only mallory's subscriptions");
}
