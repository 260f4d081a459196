//! Redaction, against the real server: who may redact, what a redacted
//! event looks like to every reader, the audit record, and that every
//! other change of a stored event is still refused.

#![cfg(feature = "integration")]

mod common;

use common::*;
use postgres::Client;

fn settle(client: &mut Client) {
    let last: i64 = client.query_one("SELECT coalesce(max(position), 0) FROM streams.event_log", &[]).unwrap().get(0);
    wait_for_horizon(client, last);
}

/// (position, stream, type, key, data, headers, tx, time) of one event, as text.
fn row(client: &mut Client, query: &str, position: i64) -> Vec<Option<String>> {
    let r = client.query_one(query, &[&position]).unwrap();
    (0..r.len()).map(|i| r.get::<_, Option<String>>(i)).collect()
}

const EVENT: &str = "SELECT position::text, stream, type, key, data::text, headers::text, tx::text, time::text
                     FROM streams.events WHERE position = $1";

#[test]
fn only_a_redact_grant_redacts_and_every_reader_sees_the_tombstone() {
    let db = TestDb::new();
    let reader = TestRole::new(&db, "reader", "");
    let publisher = TestRole::new(&db, "publisher", "");
    let eraser = TestRole::new(&db, "eraser", "");
    let mut c = db.connect();
    c.batch_execute(&format!(
        "SELECT streams.grant('read', 'customer.*', '{r}');
         SELECT streams.grant('publish', 'customer.*', '{p}');
         SELECT streams.grant('read', 'customer.*', '{e}');
         SELECT streams.grant('redact', 'customer.*', '{e}');
         SELECT streams.create_subscription('follower', 'customer.*');",
        r = reader.name,
        p = publisher.name,
        e = eraser.name
    ))
    .unwrap();
    let position = publish_with(&mut c, "customer.signup", r#"{"email": "ann@example.com"}"#, "ann");
    let kept = publish_with(&mut c, "customer.signup", r#"{"email": "bob@example.com"}"#, "bob");
    settle(&mut c);
    let before = row(&mut c, EVENT, position);

    // Readers, publishers, pg_read_all_data / pg_write_all_data and the
    // extension's owner (a superuser) without the grant: 42501.
    let mut as_reader = db.connect_as(&reader.name);
    let mut as_publisher = db.connect_as(&publisher.name);
    let redact = format!("SELECT streams.redact({position}, 'gdpr request 17')");
    for client in [&mut as_reader, &mut as_publisher, &mut c] {
        assert_eq!(sqlstate(&client.batch_execute(&redact).unwrap_err()), "42501");
        let matching = "SELECT streams.redact_matching('customer.signup', 'x', key => 'ann')";
        assert_eq!(sqlstate(&client.batch_execute(matching).unwrap_err()), "42501");
    }
    let data_roles = TestRole::new(&db, "dataroles", "");
    c.batch_execute(&format!("GRANT pg_read_all_data, pg_write_all_data TO {}", data_roles.name)).unwrap();
    let mut as_data_roles = db.connect_as(&data_roles.name);
    assert_eq!(sqlstate(&as_data_roles.batch_execute(&redact).unwrap_err()), "42501");
    let update = "UPDATE streams.event_log SET data = '{\"redacted\": true}'";
    assert_eq!(sqlstate(&as_data_roles.batch_execute(update).unwrap_err()), "55000");
    assert_eq!(row(&mut c, EVENT, position), before, "nothing changed");

    // The granted role redacts: once.
    let mut as_eraser = db.connect_as(&eraser.name);
    let first: bool = as_eraser.query_one("SELECT streams.redact($1, 'gdpr request 17')", &[&position]).unwrap().get(0);
    let again: bool = as_eraser.query_one("SELECT streams.redact($1, 'again')", &[&position]).unwrap().get(0);
    assert!(first && !again);

    // The tombstone: data and headers gone, everything else as it was.
    let after = row(&mut c, EVENT, position);
    assert_eq!(after[4].as_deref(), Some(r#"{"redacted": true}"#));
    assert_eq!(after[5], None);
    let unchanged =
        |r: &[Option<String>]| [r[0].clone(), r[1].clone(), r[2].clone(), r[3].clone(), r[6].clone(), r[7].clone()];
    assert_eq!(unchanged(&after), unchanged(&before));
    assert!(row(&mut c, EVENT, kept)[4].as_deref().unwrap().contains("bob@example.com"));
    // Through every reader: replay, get, a reader's view, a subscription.
    for query in [
        "SELECT data::text FROM streams.replay('customer.*', after => $1::bigint - 1, max_events => 1)",
        "SELECT data::text FROM streams.get($1)",
    ] {
        let data: String = as_reader.query_one(query, &[&position]).unwrap().get(0);
        assert_eq!(data, r#"{"redacted": true}"#, "{query}");
    }
    let polled: Vec<String> =
        c.query("SELECT data::text FROM streams.poll('follower', 10)", &[]).unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(polled[0], r#"{"redacted": true}"#);
    assert!(polled[1].contains("bob@example.com"));
    let leaked: i64 = c
        .query_one("SELECT count(*) FROM streams.event_log WHERE data::text LIKE '%ann@example.com%'", &[])
        .unwrap()
        .get(0);
    assert_eq!(leaked, 0);

    // The record: for the redactor, not for a reader.
    let audit =
        as_eraser.query_one("SELECT position, stream, redacted_by::text, reason FROM streams.redactions", &[]).unwrap();
    assert_eq!(audit.get::<_, i64>(0), position);
    assert_eq!(audit.get::<_, String>(1), "customer.signup");
    assert_eq!(audit.get::<_, String>(2), eraser.name);
    assert_eq!(audit.get::<_, String>(3), "gdpr request 17");
    assert_eq!(sqlstate(&as_reader.query("SELECT * FROM streams.redactions", &[]).unwrap_err()), "42501");
    let seen_by_data_roles: i64 =
        as_data_roles.query_one("SELECT count(*) FROM streams.redactions", &[]).unwrap().get(0);
    assert_eq!(seen_by_data_roles, 0);

    // Every other change is still refused, to the redactor and to a superuser.
    for client in [&mut as_eraser, &mut c] {
        for change in [
            "UPDATE streams.event_log SET data = '{\"mine\": 1}'",
            "UPDATE streams.event_log SET data = '{\"redacted\": true}'",
            "DELETE FROM streams.event_log",
            "TRUNCATE streams.event_log",
        ] {
            let refused = client.batch_execute(change).map_err(|e| sqlstate(&e));
            assert!(refused == Err("55000".into()) || refused == Err("42501".into()), "{change}: {refused:?}");
        }
    }
    c.batch_execute("BEGIN; SET LOCAL session_replication_role = replica").unwrap();
    assert_eq!(sqlstate(&c.batch_execute("UPDATE streams.event_log SET data = '{}'").unwrap_err()), "55000");
    c.batch_execute("ROLLBACK").unwrap();
}

fn publish_with(c: &mut Client, stream: &str, data: &str, key: &str) -> i64 {
    c.query_one(
        "SELECT streams.publish($1, $2::text::jsonb, type => 'signup', key => $3,
                                headers => '{\"traceparent\": \"00-ab-cd-01\"}')",
        &[&stream, &data, &key],
    )
    .unwrap()
    .get(0)
}

#[test]
fn redact_matching_by_filter_or_key_and_bad_input() {
    let db = TestDb::new();
    let eraser = TestRole::new(&db, "eraser2", "");
    let mut c = db.connect();
    c.batch_execute(&format!("SELECT streams.grant('redact', 'orders', '{}')", eraser.name)).unwrap();
    for (data, key) in [
        (r#"{"customer": "c1", "n": 1}"#, "o1"),
        (r#"{"customer": "c2", "n": 2}"#, "o2"),
        (r#"{"customer": "c1", "n": 3}"#, "o3"),
    ] {
        c.query_one("SELECT streams.publish('orders', $1::text::jsonb, key => $2)", &[&data, &key]).unwrap();
    }
    c.query_one("SELECT streams.publish('other', '{\"customer\": \"c1\"}')", &[]).unwrap();
    settle(&mut c);
    let mut e = db.connect_as(&eraser.name);
    let n: i64 = e
        .query_one(
            "SELECT streams.redact_matching('orders', 'customer c1 erased', filter => '{\"customer\": \"c1\"}')",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(n, 2);
    let n: i64 = e.query_one("SELECT streams.redact_matching('orders', 'order o2', key => 'o2')", &[]).unwrap().get(0);
    assert_eq!(n, 1);
    let n: i64 = e.query_one("SELECT streams.redact_matching('orders', 'again', filter => '{}')", &[]).unwrap().get(0);
    assert_eq!(n, 0, "already redacted");
    let left: Vec<String> = c
        .query("SELECT stream || ' ' || data::text FROM streams.event_log ORDER BY position", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        left,
        [
            r#"orders {"redacted": true}"#,
            r#"orders {"redacted": true}"#,
            r#"orders {"redacted": true}"#,
            r#"other {"customer": "c1"}"#
        ]
    );
    let records: i64 = e.query_one("SELECT count(*) FROM streams.redactions", &[]).unwrap().get(0);
    assert_eq!(records, 3);
    // The other stream is not the eraser's; bad input has its SQLSTATE.
    for (call, state) in [
        ("SELECT streams.redact_matching('other', 'x', filter => '{}')", "42501"),
        ("SELECT streams.redact_matching('orders', 'x')", "22023"),
        ("SELECT streams.redact_matching('orders', '  ', key => 'o1')", "22023"),
        ("SELECT streams.redact_matching('orders', NULL, key => 'o1')", "22004"),
        ("SELECT streams.redact_matching('bad name!', 'x', key => 'o1')", "22023"),
        ("SELECT streams.redact(999999, 'x')", "42704"),
        ("SELECT streams.redact(NULL, 'x')", "22004"),
    ] {
        assert_eq!(sqlstate(&e.batch_execute(call).unwrap_err()), state, "{call}");
    }
    assert_eq!(sqlstate(&c.batch_execute("SELECT streams.grant('erase', 'orders', 'postgres')").unwrap_err()), "22023");
}

/// An event published with data equal to the tombstone but personal data in
/// its headers is still redacted (headers gone, recorded): "redacted
/// already" is decided by the record, not by the data (a review found it).
#[test]
fn an_event_whose_data_looks_like_the_tombstone_still_loses_its_headers() {
    let db = TestDb::new();
    let eraser = TestRole::new(&db, "eraser", "");
    let mut c = db.connect();
    c.batch_execute(&format!("SELECT streams.grant('redact', 'customer.*', '{}')", eraser.name)).unwrap();
    let position: i64 = c
        .query_one(
            r#"SELECT streams.publish('customer.x', '{"redacted": true}', headers => '{"email": "ann@example.com"}')"#,
            &[],
        )
        .unwrap()
        .get(0);
    wait_for_horizon(&mut c, position);
    let mut as_eraser = db.connect_as(&eraser.name);
    let redacted: bool = as_eraser.query_one("SELECT streams.redact($1, 'gdpr')", &[&position]).unwrap().get(0);
    let headers: Option<String> =
        c.query_one("SELECT headers::text FROM streams.event_log WHERE position = $1", &[&position]).unwrap().get(0);
    let recorded: i64 =
        c.query_one("SELECT count(*) FROM streams.redactions WHERE position = $1", &[&position]).unwrap().get(0);
    assert_eq!(headers, None, "the headers' personal data is still there (redact returned {redacted})");
    assert_eq!(recorded, 1, "the redaction is recorded");
}

/// A role holding redact on 'a.*' learns nothing through streams.redact's
/// errors about events of other streams: not whether a position exists, not
/// its stream's name (a review found both leaking).
#[test]
fn redact_does_not_reveal_other_streams_events() {
    let db = TestDb::new();
    let eraser = TestRole::new(&db, "eraser", "");
    let mut c = db.connect();
    c.batch_execute(&format!(
        "SELECT streams.grant('redact', 'a.*', '{e}'); SELECT streams.grant('read', 'a.*', '{e}');",
        e = eraser.name
    ))
    .unwrap();
    let secret = publish(&mut c, "patient-4711:diagnosis", r#"{"x": "1"}"#);
    wait_for_horizon(&mut c, secret);
    let mut as_eraser = db.connect_as(&eraser.name);
    let visible: i64 =
        as_eraser.query_one("SELECT count(*) FROM streams.events WHERE position = $1", &[&secret]).unwrap().get(0);
    assert_eq!(visible, 0, "the eraser may not read it");
    let existing = as_eraser.query_one("SELECT streams.redact($1, 'probe')", &[&secret]).unwrap_err();
    let missing = as_eraser.query_one("SELECT streams.redact($1, 'probe')", &[&(secret + 1000)]).unwrap_err();
    let message = existing.as_db_error().map(|e| e.message().to_owned()).unwrap_or_default();
    assert!(!message.contains("patient-4711"), "the stream's name leaks: {message}");
    assert_eq!(sqlstate(&existing), sqlstate(&missing), "existence of the position leaks");
}
