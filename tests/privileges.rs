//! Per-stream privileges: `streams.grant` / `streams.revoke` decide who reads
//! and publishes which streams, everywhere (the view, replay, get, publish,
//! publish_batch), and private streams keep their data out of NOTIFY.
#![cfg(feature = "integration")]

mod common;

use std::time::Duration;

use common::*;
use postgres::Client;

/// Publish one event to each stream as the owner and wait until all are final.
fn seed(owner: &mut Client, streams: &[&str]) -> Vec<i64> {
    let positions: Vec<i64> =
        streams.iter().map(|s| publish(owner, s, &format!(r#"{{"stream":"{s}","secret":"s3cr3t-{s}"}}"#))).collect();
    wait_for_horizon(owner, *positions.last().unwrap());
    positions
}

fn streams_seen(client: &mut Client, query: &str) -> Vec<String> {
    client.query(query, &[]).unwrap().iter().map(|r| r.get(0)).collect()
}

#[test]
fn readers_see_only_the_streams_granted_to_them() {
    let db = TestDb::new();
    let (reader, exact, stranger) =
        (TestRole::new(&db, "reader", ""), TestRole::new(&db, "exact", ""), TestRole::new(&db, "stranger", ""));
    let mut owner = db.connect();
    owner
        .batch_execute(&format!(
            "SELECT streams.grant('read', 'payment.*', '{0}'), streams.grant('read', 'orders', '{0}'),
                    streams.grant('read', 'internal.secret', '{1}');
             GRANT USAGE ON SCHEMA streams TO {2}",
            reader.name, exact.name, stranger.name
        ))
        .unwrap();
    let p = seed(&mut owner, &["payment.ok", "internal.secret", "orders", "payment.fail", "ordersx"]);

    let mut r = db.connect_as(&reader.name);
    let expected = ["payment.ok", "orders", "payment.fail"];
    assert_eq!(streams_seen(&mut r, "SELECT stream FROM streams.events ORDER BY position"), expected);
    assert_eq!(streams_seen(&mut r, "SELECT stream FROM streams.replay()"), expected);
    assert_eq!(streams_seen(&mut r, "SELECT stream FROM streams.replay(after => 0, max_events => 10)"), expected);
    assert!(streams_seen(&mut r, "SELECT stream FROM streams.replay(stream => 'internal.*')").is_empty());
    assert!(streams_seen(&mut r, "SELECT stream FROM streams.replay(since => now() - interval '1 hour')")
        .iter()
        .all(|s| expected.contains(&s.as_str())));
    let hidden: Option<String> = r.query_one("SELECT (streams.get($1)).stream", &[&p[1]]).unwrap().get(0);
    assert_eq!(hidden, None, "get() of a stream the caller may not read returns nothing");
    let missing: Option<String> = r.query_one("SELECT (streams.get(999999)).stream", &[]).unwrap().get(0);
    assert_eq!(missing, None, "the same as for an event that does not exist");
    let n: i64 = r.query_one("SELECT count(*) FROM streams.events WHERE stream LIKE 'internal%'", &[]).unwrap().get(0);
    assert_eq!(n, 0);

    let mut e = db.connect_as(&exact.name);
    assert_eq!(streams_seen(&mut e, "SELECT stream FROM streams.events"), ["internal.secret"]);

    let mut s = db.connect_as(&stranger.name);
    for sql in ["SELECT * FROM streams.events", "SELECT * FROM streams.replay()", "SELECT streams.get(1)"] {
        let err = s.query(sql, &[]).unwrap_err();
        assert_eq!(sqlstate(&err), "42501", "{sql}");
    }

    // The owner reads everything; a revoke takes effect at once.
    assert_eq!(streams_seen(&mut owner, "SELECT stream FROM streams.events").len(), 5);
    let revoked: bool =
        owner.query_one("SELECT streams.revoke('read', 'orders', $1::text::regrole)", &[&reader.name]).unwrap().get(0);
    assert!(revoked);
    assert_eq!(
        streams_seen(&mut r, "SELECT stream FROM streams.events ORDER BY position"),
        ["payment.ok", "payment.fail"]
    );
    owner.query_one("SELECT streams.revoke('read', 'payment.*', $1::text::regrole)", &[&reader.name]).unwrap();
    let err = r.query("SELECT * FROM streams.events", &[]).unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "no read grant left: no access to the view");
}

/// A function in the reader's own WHERE clause (cheap, so the planner would
/// like to run it first) sees only rows the reader may read.
#[test]
fn a_function_in_the_callers_query_never_sees_hidden_events() {
    let db = TestDb::new();
    let reader = TestRole::new(&db, "reader", "");
    let mut owner = db.connect();
    owner
        .batch_execute(&format!(
            "SELECT streams.grant('read', 'public.*', '{0}'); GRANT CREATE ON SCHEMA public TO {0}",
            reader.name
        ))
        .unwrap();
    seed(&mut owner, &["public.news", "internal.secret"]);
    let mut r = db.connect_as(&reader.name);
    r.batch_execute(
        "CREATE TABLE public.seen (data jsonb);
         CREATE FUNCTION public.peek(d jsonb) RETURNS boolean LANGUAGE plpgsql COST 0.0000001 AS
             $$ BEGIN INSERT INTO public.seen VALUES (d); RETURN true; END $$;",
    )
    .unwrap();
    r.batch_execute("SELECT * FROM streams.events WHERE public.peek(data)").unwrap();
    r.batch_execute("SELECT * FROM streams.replay() WHERE public.peek(data)").unwrap();
    let leaked: i64 =
        r.query_one("SELECT count(*) FROM public.seen WHERE data::text LIKE '%internal%'", &[]).unwrap().get(0);
    assert_eq!(leaked, 0, "the reader's function saw events of a stream it may not read");
    let seen: i64 = r.query_one("SELECT count(*) FROM public.seen", &[]).unwrap().get(0);
    assert!(seen > 0, "it did run on the readable ones");
}

#[test]
fn publishers_publish_only_where_granted_and_revokes_apply_at_once() {
    let db = TestDb::new();
    let (app, group, member) =
        (TestRole::new(&db, "app", ""), TestRole::new(&db, "writers", "NOLOGIN"), TestRole::new(&db, "member", ""));
    let mut owner = db.connect();
    owner
        .batch_execute(&format!(
            "SELECT streams.grant('publish', 'payment.*', '{0}'), streams.grant('publish', 'audit', '{1}');
             GRANT {1} TO {2}",
            app.name, group.name, member.name
        ))
        .unwrap();
    let mut a = db.connect_as(&app.name);
    publish(&mut a, "payment.success", "{}");
    let stored = count_stored(&mut owner);
    for sql in [
        "SELECT streams.publish('orders', '{}')",
        "SELECT streams.publish('paymentx', '{}')",
        "SELECT * FROM streams.publish_batch('orders', ARRAY['{}'::jsonb, '{}'])",
        "SELECT streams.publish('audit', '{}')",
    ] {
        let err = a.batch_execute(sql).unwrap_err();
        assert_eq!(sqlstate(&err), "42501", "{sql}");
    }
    assert_eq!(count_stored(&mut owner), stored, "refused publishes wrote nothing");

    // Through a group role, and for the same session after a revoke.
    let mut m = db.connect_as(&member.name);
    publish(&mut m, "audit", "{}");
    owner.batch_execute(&format!("REVOKE {} FROM {}", group.name, member.name)).unwrap();
    let err = m.batch_execute("SELECT streams.publish('audit', '{}')").unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "leaving the group takes the privilege away at once");

    owner.query_one("SELECT streams.revoke('publish', 'payment.*', $1::text::regrole)", &[&app.name]).unwrap();
    let err = a.batch_execute("SELECT streams.publish('payment.success', '{}')").unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "a revoke applies to the publisher's open session");

    // A revoke that commits while the publisher's repeatable-read transaction
    // still sees the grant: after that transaction, the grant is gone.
    owner
        .batch_execute(&format!(
            "SELECT streams.grant('publish', 'orders', '{0}'), streams.grant('publish', 'other', '{0}')",
            app.name
        ))
        .unwrap();
    a.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1").unwrap();
    owner.query_one("SELECT streams.revoke('publish', 'orders', $1::text::regrole)", &[&app.name]).unwrap();
    a.batch_execute("SELECT streams.publish('orders', '{}'); COMMIT").unwrap();
    let err = a.batch_execute("SELECT streams.publish('orders', '{}')").unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "an answer read under the old snapshot was not kept");
    publish(&mut a, "other", "{}");
}

#[test]
fn grant_arguments_are_checked() {
    let db = TestDb::new();
    let role = TestRole::new(&db, "someone", "");
    let mut owner = db.connect();
    for (sql, state) in [
        ("SELECT streams.grant('write', 'x', $1::text::regrole)", "22023"),
        ("SELECT streams.grant('read', 'bad name', $1::text::regrole)", "22023"),
        ("SELECT streams.grant('read', 'a*b*', $1::text::regrole)", "22023"),
        ("SELECT streams.grant(NULL, 'x', $1::text::regrole)", "22004"),
        ("SELECT streams.set_private('bad name') FROM (SELECT $1::text) t", "22023"),
    ] {
        let err = owner.query(sql, &[&role.name]).unwrap_err();
        assert_eq!(sqlstate(&err), state, "{sql}");
    }
    let n: i64 = owner.query_one("SELECT count(*) FROM streams.stream_grants", &[]).unwrap().get(0);
    assert_eq!(n, 0, "nothing granted");
    let err = db.connect_as(&role.name).batch_execute("SELECT 1 FROM streams.stream_grants").unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "no schema usage, nothing visible");
}

/// Private streams' notifications carry no data (not even for a superuser
/// listener); readers fetch it with streams.get.
#[test]
fn private_streams_never_send_data_over_notify() {
    let db = TestDb::new();
    let reader = TestRole::new(&db, "reader", "");
    let mut owner = db.connect();
    owner
        .batch_execute(&format!(
            "SELECT streams.set_private('internal.*'); SELECT streams.grant('read', 'internal.*', '{}')",
            reader.name
        ))
        .unwrap();
    let mut listener = Listener::new(&db, &["internal.secret", "public.news"]);
    let secret = publish(&mut owner, "internal.secret", r#"{"card":"visa-4111-1111"}"#);
    let news = publish(&mut owner, "public.news", r#"{"headline":"hi"}"#);
    let mut got = Vec::new();
    while got.len() < 2 {
        let (_, payload) = listener.next(Duration::from_secs(10)).expect("both notifications");
        got.push(payload);
    }
    // The secret has letters, so no position, tx or time can look like it.
    assert!(!got[0].contains("visa-4111"), "private data went over NOTIFY: {}", got[0]);
    let private: serde_json::Value = serde_json::from_str(&got[0]).unwrap();
    let mut keys: Vec<&str> = private.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["position", "prev", "private", "stream", "time", "tx"], "only metadata: {}", got[0]);
    assert_eq!(private["position"].as_i64(), Some(secret));
    assert_eq!(private["private"], serde_json::Value::Bool(true));
    assert!(private["time"].is_string() && private["tx"].is_number());
    let public: serde_json::Value = serde_json::from_str(&got[1]).unwrap();
    assert_eq!((public["position"].as_i64(), &public["data"]["headline"]), (Some(news), &serde_json::json!("hi")));

    let card: String =
        db.connect_as(&reader.name).query_one("SELECT (streams.get($1)).data->>'card'", &[&secret]).unwrap().get(0);
    assert_eq!(card, "visa-4111-1111");

    owner.batch_execute("SELECT streams.set_private('internal.*', false)").unwrap();
    let again = publish(&mut owner, "internal.secret", r#"{"card":"5500"}"#);
    let (_, payload) = listener.next(Duration::from_secs(10)).expect("a notification");
    let value: serde_json::Value = serde_json::from_str(&payload).unwrap();
    assert_eq!((value["position"].as_i64(), &value["data"]["card"]), (Some(again), &serde_json::json!("5500")));
}
