//! Webhooks: what they refuse and what bounds them. Bad arguments, addresses
//! the policy refuses (also when the worker connects), other roles that try
//! to create, see, steer or widen them, DROP EXTENSION and DROP DATABASE
//! with requests in flight, and a hostile webhook owner's hanging endpoints,
//! locks, many webhooks in one transaction and database settings. The
//! endpoint is tests/webhook_receiver.py, a real HTTP server on 127.0.0.1
//! (tests/common/webhooks.rs); delivery itself is in tests/webhook_delivery.rs.
#![cfg(feature = "integration")]

mod common;

use std::time::Duration;

use common::webhooks::*;
use common::*;
use postgres::Client;

/// How many webhook workers `db` has.
fn webhook_workers(db: &TestDb) -> i64 {
    admin()
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'litebase_streams webhooks' AND datname = $1",
            &[&db.name],
        )
        .unwrap()
        .get(0)
}

// --- refusals ----------------------------------------------------------------

/// Bad URLs, refused hosts, bad secrets and names: each its SQLSTATE, and
/// nothing created.
#[test]
fn bad_arguments_fail_with_their_sqlstate_and_create_nothing() {
    let _settings = local_endpoints();
    let db = TestDb::new();
    let mut c = db.connect();
    let create = |c: &mut Client, name: &str, url: &str, secret: Option<&str>, batch: i32| {
        c.query_one(
            "SELECT streams.create_webhook($1, 'orders', $2, secret => $3, batch => $4)",
            &[&name, &url, &secret, &batch],
        )
        .map(drop)
    };
    for (url, why) in [
        ("http://10.0.0.1/hook", "a private address"),
        ("http://169.254.169.254/latest/meta-data", "the cloud metadata address"),
        ("http://[::1]:8080/", "IPv6 loopback"),
        ("http://localhost:8080/", "a local name"),
        ("http://127.0.0.2:8080/", "loopback, but not the allowed address"),
        ("ftp://127.0.0.1/", "not http"),
        ("javascript:alert(1)", "not http"),
        ("not a url", "malformed"),
        ("https://user:pw@example.com/", "credentials"),
        ("", "empty"),
    ] {
        let error = create(&mut c, "w", url, None, 1).expect_err(url);
        assert_eq!(sqlstate(&error), "22023", "{url} ({why}): {error:?}");
    }
    for (secret, batch, code) in
        [(Some("abc"), 1, "22023"), (Some("whsec_c2hvcnQ="), 1, "22023"), (None, 0, "22023"), (None, 1001, "22023")]
    {
        let error = create(&mut c, "w", "http://127.0.0.1:9/", secret, batch).expect_err("bad secret or batch");
        assert_eq!(sqlstate(&error), code, "{secret:?} {batch}");
    }
    let error = create(&mut c, "bad name", "http://127.0.0.1:9/", None, 1).unwrap_err();
    assert_eq!(sqlstate(&error), "22023");
    for (sql, code) in [
        ("SELECT streams.create_webhook('w', 'bad pattern', 'http://127.0.0.1:9/')", "22023"),
        ("SELECT streams.create_webhook('w', 'orders', NULL)", "22004"),
        ("SELECT streams.pause_webhook('nope')", "42704"),
        ("SELECT streams.resume_webhook('nope')", "42704"),
    ] {
        assert_eq!(sqlstate(&c.batch_execute(sql).unwrap_err()), code, "{sql}");
    }
    let dropped: bool = c.query_one("SELECT streams.drop_webhook('nope')", &[]).unwrap().get(0);
    assert!(!dropped);
    let counts: (i64, i64) = {
        let row = c
            .query_one(
                "SELECT (SELECT count(*) FROM streams.webhooks), (SELECT count(*) FROM streams.subscription_state)",
                &[],
            )
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(counts, (0, 0), "nothing created");

    create(&mut c, "w", "http://127.0.0.1:9/", None, 1).unwrap();
    assert_eq!(sqlstate(&create(&mut c, "w", "http://127.0.0.1:9/", None, 1).unwrap_err()), "42710");
}

/// The address policy also holds when the worker connects: with loopback
/// no longer allowed, a webhook to a name that resolves to loopback gets no
/// request through. Its owner learns that the address is not allowed, not
/// which address the name resolves to (how internal names resolve is for the
/// server's operator, who finds it in the server log).
#[test]
fn the_worker_refuses_an_address_the_policy_no_longer_allows() {
    let receiver = Receiver::answering(&[("/late", Behaviour::signed(SECRET))]);
    let (cluster, mut c) = scratch_cluster(
        "webhooks-policy",
        &["litebase_streams.webhook_allowed_hosts = 'localhost'", "litebase_streams.webhook_retry_min = 50"],
    );
    let url = receiver.url("/late").replace("127.0.0.1", "localhost");
    create_webhook(&mut c, "late", "orders", &url);
    c.batch_execute("ALTER SYSTEM SET litebase_streams.webhook_allowed_hosts = ''").unwrap();
    c.batch_execute("SELECT pg_reload_conf()").unwrap();
    wait_until("the setting is reloaded", Duration::from_secs(10), || {
        let value: String =
            cluster.connect("app").query_one("SHOW litebase_streams.webhook_allowed_hosts", &[]).unwrap().get(0);
        value.is_empty()
    });
    publish_each(&mut c, "orders", 1);
    let refused = wait_for_state(&mut c, "late", "refused at connection", |s| s.attempts >= 2);
    let error = refused.last_error.clone().unwrap_or_default();
    assert!(error.contains("is not allowed"), "{refused:?}");
    assert!(!error.contains("127.0.0.1") && !error.contains("::1"), "last_error names no resolved address: {error}");
    assert!(receiver.requests("/late").is_empty(), "no request reached loopback");
    wait_until("the server log names the refused address", Duration::from_secs(10), || {
        cluster.server_log().contains("address policy refused a request: localhost resolves to")
    });
}

// --- privileges --------------------------------------------------------------

/// Creating a webhook takes EXECUTE on create_webhook and read on every
/// stream of its pattern. Another role cannot see the secret or the
/// webhook, manage it, poll its subscription, or widen the host list; and
/// when its owner loses the read privilege, delivery stops.
#[test]
fn other_roles_cannot_create_see_steer_or_widen_webhooks() {
    let (receiver, db) = local_receiver_and_db(&[("/alice", Behaviour::signed(SECRET))]);
    let mut owner = db.connect();
    let alice = TestRole::new(&db, "alice", "");
    let mallory = TestRole::new(&db, "mallory", "");
    owner
        .batch_execute(&format!(
            "SELECT streams.grant('read', 'orders.*', '{a}');
             SELECT streams.grant('read', '*', '{m}');
             GRANT EXECUTE ON FUNCTION streams.create_webhook TO {a};",
            a = alice.name,
            m = mallory.name
        ))
        .unwrap();
    let mut a = db.connect_as(&alice.name);
    let mut m = db.connect_as(&mallory.name);

    let denied = m.batch_execute("SELECT streams.create_webhook('m', '*', 'https://example.com/')").unwrap_err();
    assert_eq!(sqlstate(&denied), "42501", "no EXECUTE on create_webhook");
    let uncovered = a.batch_execute("SELECT streams.create_webhook('a', '*', 'https://example.com/')").unwrap_err();
    assert_eq!(sqlstate(&uncovered), "42501", "read on orders.* does not cover *");
    create_webhook(&mut a, "alice", "orders.*", &receiver.url("/alice"));

    for sql in [
        "SELECT secret FROM streams.webhook_state",
        "SELECT streams.pause_webhook('alice')",
        "SELECT streams.resume_webhook('alice')",
        "SELECT streams.drop_webhook('alice')",
        "SELECT streams.seek('alice', after => 0)",
        "SELECT * FROM streams.poll('alice')",
        "ALTER SYSTEM SET litebase_streams.webhook_allowed_hosts = '0.0.0.0/0'",
    ] {
        assert_eq!(sqlstate(&m.batch_execute(sql).unwrap_err()), "42501", "mallory: {sql}");
    }
    assert_eq!(
        sqlstate(&m.batch_execute("SET litebase_streams.webhook_allowed_hosts = '0.0.0.0/0'").unwrap_err()),
        "55P02",
        "a server-wide setting"
    );
    let seen: i64 = m.query_one("SELECT count(*) FROM streams.webhooks", &[]).unwrap().get(0);
    assert_eq!(seen, 0, "mallory sees no webhook of alice's");
    for sql in ["SELECT * FROM streams.poll('alice')", "SELECT streams.drop_subscription('alice')"] {
        assert_eq!(sqlstate(&a.batch_execute(sql).unwrap_err()), "42809", "alice: {sql}");
    }
    let columns: Vec<String> = a
        .query(
            "SELECT attname::text FROM pg_attribute WHERE attrelid = 'streams.webhooks'::regclass AND attnum > 0",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(!columns.iter().any(|c| c.contains("secret")), "the view never shows the secret: {columns:?}");

    let first = publish_each(&mut owner, "orders.eu", 2);
    assert_eq!(receiver.wait_for_delivered("/alice", 2, Duration::from_secs(30)), first);
    owner.batch_execute(&format!("SELECT streams.revoke('read', 'orders.*', '{}')", alice.name)).unwrap();
    publish_each(&mut owner, "orders.eu", 2);
    let disabled = wait_for_state(&mut owner, "alice", "disabled once alice may not read", |s| s.state == "disabled");
    let error = disabled.last_error.unwrap_or_default();
    assert!(error.contains("may no longer read") || error.contains("permission denied"), "{error}");
    assert_eq!(receiver.delivered("/alice"), first, "nothing after the revoke reached alice's endpoint");
}

// --- lifecycle ---------------------------------------------------------------

/// DROP EXTENSION and DROP DATABASE go through while the webhook worker
/// runs with a request in flight, and the worker leaves.
#[test]
fn drop_extension_and_drop_database_work_with_webhooks_in_flight() {
    let (receiver, db) = local_receiver_and_db(&[("/hang", Behaviour { sleep: 30.0, ..Behaviour::default() })]);
    let mut c = db.connect();
    for round in 0..2 {
        create_webhook(&mut c, "hang", "orders", &receiver.url("/hang"));
        publish_each(&mut c, "orders", 1);
        wait_until("a request is in flight", Duration::from_secs(30), || receiver.requests("/hang").len() == round + 1);
        assert_eq!(webhook_workers(&db), 1);
        if round == 0 {
            c.batch_execute("DROP EXTENSION litebase_streams").unwrap();
            wait_until("the webhook worker left", Duration::from_secs(30), || webhook_workers(&db) == 0);
            c.batch_execute("CREATE EXTENSION litebase_streams").unwrap();
            db.wait_for_worker();
        }
    }
    drop(c);
    admin().batch_execute(&format!("DROP DATABASE {}", db.name)).unwrap();
    assert_eq!(webhook_workers(&db), 0);
}

// --- bounds against a hostile webhook owner ------------------------------------

/// However many webhooks hang, the worker has at most
/// `webhook_max_concurrency` requests (threads) in flight; the rest wait
/// their turn and are delivered once the hanging ones end.
#[test]
fn requests_in_flight_are_bounded_by_webhook_max_concurrency() {
    let receiver = Receiver::answering(&[("/hang", Behaviour { sleep: 6.0, ..Behaviour::default() })]);
    let (_cluster, mut c) = scratch_cluster(
        "webhooks-concurrency",
        &["litebase_streams.webhook_allowed_hosts = '127.0.0.1'", "litebase_streams.webhook_max_concurrency = 2"],
    );
    for n in 0..6 {
        create_webhook(&mut c, &format!("hang{n}"), "orders", &receiver.url("/hang"));
    }
    publish_each(&mut c, "orders", 1);
    wait_until("two requests hang", Duration::from_secs(30), || receiver.requests("/hang").len() == 2);
    let pid: i32 = c
        .query_one("SELECT pid FROM pg_stat_activity WHERE backend_type = 'litebase_streams webhooks'", &[])
        .unwrap()
        .get(0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let threads: usize = status.lines().find_map(|l| l.strip_prefix("Threads:")).unwrap().trim().parse().unwrap();
    assert!(threads <= 3, "the main thread and at most 2 request threads: {threads}");
    assert_eq!(receiver.requests("/hang").len(), 2, "the other four wait for a free slot");
    wait_until("all six are delivered", Duration::from_secs(60), || receiver.delivered("/hang").len() == 6);
}

/// A webhook owner that keeps its webhook's rows locked (pause_webhook in
/// a transaction left open) delays only that webhook: another owner's
/// webhook goes on being delivered.
#[test]
fn a_webhook_locked_by_its_owner_does_not_stall_the_others() {
    let (receiver, db) = local_receiver_and_db(&[
        ("/locked", Behaviour { sleep: 0.5, ..Behaviour::default() }),
        ("/other", Behaviour::default()),
    ]);
    let mut c = db.connect();
    create_webhook(&mut c, "locked", "a", &receiver.url("/locked"));
    create_webhook(&mut c, "other", "b", &receiver.url("/other"));
    publish_each(&mut c, "a", 1);
    wait_until("the locked webhook's request is in flight", Duration::from_secs(30), || {
        receiver.requests("/locked").len() == 1
    });
    let mut holder = db.connect();
    holder.batch_execute("BEGIN; SELECT streams.pause_webhook('locked')").unwrap();
    let positions = publish_each(&mut c, "b", 5);
    assert_eq!(receiver.wait_for_delivered("/other", 5, Duration::from_secs(30)), positions);
    holder.batch_execute("ROLLBACK").unwrap();
    wait_for_state(&mut c, "locked", "its outcome recorded once the lock is gone", |s| s.pending == 0);
}

/// A transaction that creates many webhooks starts no background worker
/// itself (it could fill every slot while it stays open); after it commits,
/// one webhook worker serves them all.
#[test]
fn creating_many_webhooks_in_one_transaction_starts_one_worker_after_commit() {
    let (receiver, db) = local_receiver_and_db(&[("/many", Behaviour::default())]);
    let mut c = db.connect();
    let mut tx = db.connect();
    tx.batch_execute("BEGIN").unwrap();
    tx.query(
        "SELECT streams.create_webhook('many' || n, 'orders', $1) FROM generate_series(1, 40) n",
        &[&receiver.url("/many")],
    )
    .unwrap();
    assert_eq!(webhook_workers(&db), 0, "no worker started for an open transaction");
    tx.batch_execute("COMMIT").unwrap();
    wait_until("the webhook worker started", Duration::from_secs(30), || webhook_workers(&db) == 1);
    publish_each(&mut c, "orders", 1);
    wait_until("all 40 webhooks delivered", Duration::from_secs(60), || receiver.delivered("/many").len() == 40);
    assert_eq!(webhook_workers(&db), 1);
}

/// Settings a database owner may give its database (`session_authorization`,
/// `exit_on_error`, a read-only default) do not stop the workers.
#[test]
fn database_settings_do_not_stop_the_workers() {
    let (receiver, db) = local_receiver_and_db(&[("/settings", Behaviour::signed(SECRET))]);
    let nobody = TestRole::new(&db, "nobody", "");
    let mut c = db.connect();
    create_webhook(&mut c, "settings", "orders", &receiver.url("/settings"));
    let first = publish_each(&mut c, "orders", 1);
    receiver.wait_for_delivered("/settings", 1, Duration::from_secs(30));
    // Recorded too, or the terminated worker rightly sends it once more.
    wait_for_state(&mut c, "settings", "the first event recorded", |s| s.pending == 0);
    admin()
        .batch_execute(&format!(
            "ALTER DATABASE {db} SET session_authorization = '{role}';
             ALTER DATABASE {db} SET exit_on_error = on;
             ALTER DATABASE {db} SET default_transaction_read_only = on;
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = '{db}' AND backend_type IN ('litebase_streams worker', 'litebase_streams webhooks')",
            db = db.name,
            role = nobody.name
        ))
        .unwrap();
    let mut c = db.connect();
    c.batch_execute("SET default_transaction_read_only = off; RESET session_authorization").unwrap();
    let later: Vec<i64> = (0..3).map(|n| publish(&mut c, "orders", &format!(r#"{{"n": {n}}}"#))).collect();
    wait_for_horizon(&mut c, *later.last().unwrap());
    let all: Vec<i64> = first.iter().chain(&later).copied().collect();
    assert_eq!(receiver.wait_for_delivered("/settings", 4, Duration::from_secs(30)), all);
    admin().batch_execute(&format!("ALTER DATABASE {} RESET ALL", db.name)).unwrap();
}
