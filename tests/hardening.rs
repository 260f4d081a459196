//! Hostile-user findings against 0.2.0 (issue 21), each held here by a test
//! that failed before its fix: no fresh install of a version with known
//! holes; the predefined roles pg_read_all_data and pg_write_all_data can
//! neither read secrets nor write the extension's internal tables or move
//! its position sequence under readers; a template database keeps no worker
//! connected; subscription and webhook names are per owning role.
#![cfg(feature = "integration")]

mod common;

use std::time::Duration;

use common::*;
use postgres::Client;

const WAIT: Duration = Duration::from_secs(20);

/// A role holding both predefined data roles (and nothing of the
/// extension's), connected to `db`.
fn all_data_role(db: &TestDb, suffix: &str) -> (TestRole, Client) {
    let role = TestRole::new(db, suffix, "");
    admin().batch_execute(&format!("GRANT pg_read_all_data, pg_write_all_data TO {}", role.name)).unwrap();
    let client = db.connect_as(&role.name);
    (role, client)
}

// --- 1. versions with known holes cannot be installed ---------------------

/// `CREATE EXTENSION ... VERSION '0.1.0'` let a database owner who had
/// squatted the schema (or owned `public`) become superuser. No earlier
/// version can be installed afresh; only the current one is available (the
/// upgrade steps need no install script of the old version).
#[test]
fn versions_with_known_holes_cannot_be_installed() {
    let db = TestDb::without_extension();
    let mut c = db.connect();
    for old in ["0.1.0", "0.2.0"] {
        let err = c
            .batch_execute(&format!("CREATE EXTENSION litebase_streams VERSION '{old}'"))
            .expect_err("an old version is not installable");
        assert_eq!(sqlstate(&err), "22023", "CREATE EXTENSION VERSION '{old}': {err}");
    }
    let available: Vec<String> = c
        .query("SELECT version FROM pg_available_extension_versions WHERE name = 'litebase_streams'", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let default: String = c
        .query_one("SELECT default_version FROM pg_available_extensions WHERE name = 'litebase_streams'", &[])
        .unwrap()
        .get(0);
    assert_eq!(available, vec![default], "only the current version can be installed");
}

// --- 2. the predefined data roles -------------------------------------------

/// pg_write_all_data bypasses table privileges, not row-level security: it
/// can insert no commit time, move no horizon, touch no other role's
/// subscription or webhook; pg_read_all_data reads no webhook secret.
#[test]
fn predefined_data_roles_cannot_touch_internal_tables() {
    let db = TestDb::new();
    let owner = TestRole::new(&db, "owner", "");
    let mut admin_c = db.connect();
    admin_c
        .batch_execute(&format!(
            "SELECT streams.grant('read', '*', '{0}');
             GRANT EXECUTE ON FUNCTION streams.create_webhook TO {0};",
            owner.name
        ))
        .unwrap();
    let mut owner_c = db.connect_as(&owner.name);
    owner_c.batch_execute("SELECT streams.create_subscription('theirs', 'orders', after => 0)").unwrap();
    let secret: String = owner_c
        .query_one("SELECT streams.create_webhook('hook', 'orders', 'https://example.com/hook')", &[])
        .unwrap()
        .get(0);
    let p1 = publish(&mut admin_c, "orders", PAYMENT);
    let p2 = publish(&mut admin_c, "orders", PAYMENT);
    wait_for_horizon(&mut admin_c, p2);
    let times_before = admin_c
        .query_one("SELECT array_agg(time::text ORDER BY position)::text FROM streams.events", &[])
        .unwrap()
        .get::<_, String>(0);

    let (_attacker, mut a) = all_data_role(&db, "all_data");
    // Writes: an INSERT fails the row-level security check; UPDATE and
    // DELETE see no row.
    let err = a
        .batch_execute(&format!(
            "INSERT INTO streams.commit_times (first_position, times, last_time)
             VALUES ({p1}, ARRAY['1999-01-01'::timestamptz], '1999-01-01')"
        ))
        .expect_err("pg_write_all_data inserts no commit time");
    assert_eq!(sqlstate(&err), "42501", "{err}");
    let err = a
        .batch_execute("INSERT INTO streams.event_log VALUES (999999, 'orders', '1', '{}')")
        .expect_err("pg_write_all_data forges no event");
    assert_eq!(sqlstate(&err), "42501", "{err}");
    for (what, statement) in [
        ("the horizon", "UPDATE streams.horizon_state SET horizon = horizon + 1000"),
        ("another role's subscription", "UPDATE streams.subscription_state SET position = 0, stream = '*'"),
        ("a webhook's url", "UPDATE streams.webhook_state SET url = 'https://attacker.example/'"),
        ("the log's identity", "UPDATE streams.log_info SET log_id = gen_random_uuid()"),
        ("private streams", "DELETE FROM streams.private_streams"),
        ("subscriptions", "DELETE FROM streams.subscription_state"),
    ] {
        let changed = a.execute(statement, &[]).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(changed, 0, "pg_write_all_data changed {what}");
    }
    // Reads: no secret, no URL, no subscription of another role.
    let secrets: i64 = a.query_one("SELECT count(*) FROM streams.webhook_state", &[]).unwrap().get(0);
    assert_eq!(secrets, 0, "pg_read_all_data reads no webhook row");
    let subs: i64 = a.query_one("SELECT count(*) FROM streams.subscription_state", &[]).unwrap().get(0);
    assert_eq!(subs, 0, "pg_read_all_data reads no subscription row");

    // Nothing changed, as the owner sees it.
    let times_after = admin_c
        .query_one("SELECT array_agg(time::text ORDER BY position)::text FROM streams.events", &[])
        .unwrap()
        .get::<_, String>(0);
    assert_eq!(times_before, times_after, "commit times unchanged");
    assert_eq!(horizon(&mut admin_c), p2, "the horizon is the worker's");
    let (url, stored): (String, String) =
        admin_c.query_one("SELECT url, secret FROM streams.webhook_state", &[]).map(|r| (r.get(0), r.get(1))).unwrap();
    assert_eq!((url.as_str(), stored.as_str()), ("https://example.com/hook", secret.as_str()));
    let (position, stream): (i64, String) = admin_c
        .query_one("SELECT position, stream FROM streams.subscription_state WHERE name = 'theirs'", &[])
        .map(|r| (r.get(0), r.get(1)))
        .unwrap();
    assert_eq!((position, stream.as_str()), (0, "orders"));
}

/// `setval` needs only UPDATE on a sequence, which pg_write_all_data has on
/// every one: moving streams.position_seq back would make the next publish
/// land below positions readers have passed. Publish refuses such a position
/// (55000), so no event ever appears below the horizon.
#[test]
fn a_position_sequence_moved_back_publishes_nothing_below_the_horizon() {
    let db = TestDb::new();
    let mut admin_c = db.connect();
    // A gap below the horizon: a rolled-back publish leaves its position unused.
    publish(&mut admin_c, "orders", PAYMENT);
    admin_c.batch_execute("BEGIN").unwrap();
    let gap = publish(&mut admin_c, "orders", PAYMENT);
    admin_c.batch_execute("ROLLBACK").unwrap();
    let top = publish(&mut admin_c, "orders", PAYMENT);
    wait_for_horizon(&mut admin_c, top);

    let (_attacker, mut a) = all_data_role(&db, "seq");
    a.query_one("SELECT setval('streams.position_seq', $1)", &[&(gap - 1)]).expect("pg_write_all_data may setval");
    let err = admin_c
        .query_one("SELECT streams.publish('orders', '{}')", &[])
        .expect_err("a position at or below the horizon is refused");
    assert_eq!(sqlstate(&err), "55000", "{err}");
    let below: i64 =
        admin_c.query_one("SELECT count(*) FROM streams.event_log WHERE position <= $1", &[&top]).unwrap().get(0);
    assert_eq!(below, 2, "only the two committed events are at or below the horizon (the gap stays empty)");
}

// --- 3. template databases ---------------------------------------------------

/// A worker connected to a template made every CREATE DATABASE from it
/// fail ("being accessed by other users"). No worker stays in a template,
/// and a database created from it gets a working worker of its own.
#[test]
fn a_template_keeps_no_worker_and_its_copies_get_one() {
    let template = TestDb::new();
    let mut admin_c = admin();
    admin_c.batch_execute(&format!("ALTER DATABASE {} IS_TEMPLATE true", template.name)).unwrap();
    wait_until("no backend of the extension is connected to the template", WAIT, || {
        admin_c
            .query_one("SELECT count(*) FROM pg_stat_activity WHERE datname = $1", &[&template.name])
            .unwrap()
            .get::<_, i64>(0)
            == 0
    });
    let copy = format!("{}_copy", template.name);
    let created = admin_c.batch_execute(&format!("CREATE DATABASE {copy} TEMPLATE {}", template.name));
    let copied = TemplateCopy(copy.clone());
    created.expect("CREATE DATABASE from the template succeeds");
    admin_c.batch_execute(&format!("ALTER DATABASE {} IS_TEMPLATE false", template.name)).unwrap();

    let mut config = base_config();
    config.dbname(&copy);
    let mut c = connect_retrying(&config);
    let p = publish(&mut c, "orders", PAYMENT);
    wait_for_horizon(&mut c, p);
    wait_for_worker(&mut admin_c, &copy);
    drop(copied);
}

/// Drops a database made by CREATE DATABASE ... TEMPLATE.
struct TemplateCopy(String);

impl Drop for TemplateCopy {
    fn drop(&mut self) {
        let _ = admin().batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.0));
    }
}

/// CREATE EXTENSION in a database that already is a template starts no
/// worker that stays.
#[test]
fn create_extension_in_a_template_leaves_no_worker_there() {
    let db = TestDb::without_extension();
    let mut admin_c = admin();
    admin_c.batch_execute(&format!("ALTER DATABASE {} IS_TEMPLATE true", db.name)).unwrap();
    let mut c = db.connect();
    c.batch_execute("CREATE EXTENSION litebase_streams").unwrap();
    publish(&mut c, "orders", PAYMENT);
    drop(c);
    wait_until("no backend is connected to the template", WAIT, || {
        admin_c
            .query_one("SELECT count(*) FROM pg_stat_activity WHERE datname = $1", &[&db.name])
            .unwrap()
            .get::<_, i64>(0)
            == 0
    });
    let copy = format!("{}_copy", db.name);
    let created = admin_c.batch_execute(&format!("CREATE DATABASE {copy} TEMPLATE {}", db.name));
    let _copied = TemplateCopy(copy);
    created.expect("CREATE DATABASE from the template succeeds");
    admin_c.batch_execute(&format!("ALTER DATABASE {} IS_TEMPLATE false", db.name)).unwrap();
}

// --- 4. names per owner ------------------------------------------------------

/// Any role with a read grant could take a subscription name first and so
/// make another team's create_subscription fail with 42710. Names are per
/// owning role: both exist, each role polls its own, and a role that acts
/// for both owners must say which (42P09).
#[test]
fn subscription_names_are_per_owner() {
    let db = TestDb::new();
    let squatter = TestRole::new(&db, "squatter", "");
    let team = TestRole::new(&db, "team", "");
    let mut admin_c = db.connect();
    admin_c
        .batch_execute(&format!(
            "SELECT streams.grant('read', 'pub.*', '{0}'); SELECT streams.grant('read', 'payment.*', '{1}');
             GRANT EXECUTE ON FUNCTION streams.create_webhook TO {0}, {1};",
            squatter.name, team.name
        ))
        .unwrap();
    let mut s = db.connect_as(&squatter.name);
    s.batch_execute("SELECT streams.create_subscription('payments_consumer', 'pub.*', after => 0)").unwrap();
    s.batch_execute("SELECT streams.create_webhook('payments_hook', 'pub.*', 'https://example.com/s')").unwrap();
    let mut t = db.connect_as(&team.name);
    t.batch_execute("SELECT streams.create_subscription('payments_consumer', 'payment.*', after => 0)")
        .expect("another role's subscription of the same name does not block this one");
    t.batch_execute("SELECT streams.create_webhook('payments_hook', 'payment.*', 'https://example.com/t')")
        .expect("nor another role's webhook of the same name");
    let err = t
        .batch_execute("SELECT streams.create_subscription('payments_consumer', 'payment.*')")
        .expect_err("a role's own names stay unique");
    assert_eq!(sqlstate(&err), "42710");

    let pay = publish(&mut admin_c, "payment.success", PAYMENT);
    let other = publish(&mut admin_c, "pub.note", r#"{"n":1}"#);
    wait_for_horizon(&mut admin_c, pay.max(other));
    let polled = |c: &mut Client| -> Vec<(i64, String)> {
        c.query("SELECT position, stream FROM streams.poll('payments_consumer', 10)", &[])
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    };
    t.batch_execute("BEGIN").unwrap();
    assert_eq!(polled(&mut t), vec![(pay, "payment.success".to_owned())], "the team polls its own subscription");
    t.batch_execute(&format!("SELECT streams.ack('payments_consumer', {pay}); COMMIT")).unwrap();
    s.batch_execute("BEGIN").unwrap();
    assert_eq!(polled(&mut s), vec![(other, "pub.note".to_owned())], "the squatter polls its own");
    s.batch_execute("ROLLBACK").unwrap();

    // Each role's views show its own rows.
    let hooks: Vec<(String, String)> =
        t.query("SELECT name, url FROM streams.webhooks", &[]).unwrap().iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(hooks, vec![("payments_hook".to_owned(), "https://example.com/t".to_owned())]);

    // The superuser acts for both owners: the name alone is ambiguous.
    let err = admin_c
        .batch_execute("BEGIN; SELECT * FROM streams.poll('payments_consumer'); ROLLBACK")
        .expect_err("ambiguous for a role that acts for both owners");
    assert_eq!(sqlstate(&err), "42P09", "{err}");
    admin_c.batch_execute("ROLLBACK").unwrap();
    admin_c.batch_execute(&format!("SET ROLE {}", team.name)).unwrap();
    admin_c
        .batch_execute(
            "SELECT streams.drop_webhook('payments_hook'); SELECT streams.drop_subscription('payments_consumer')",
        )
        .expect("as one owner, the name is that owner's");
    admin_c.batch_execute("RESET ROLE").unwrap();
    let left: Vec<String> = admin_c
        .query("SELECT owner::text FROM streams.subscription_state ORDER BY name", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(left, vec![squatter.name.clone(), squatter.name.clone()], "only the team's were dropped");
}
