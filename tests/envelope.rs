//! The event envelope on the SQL side: type, key and headers go in with
//! publish and publish_batch and come back from every SQL reader (events,
//! replay, get, poll); events without one read back null; bad values get
//! 22023 and write nothing.
#![cfg(feature = "integration")]

mod common;

use common::*;

/// (position, type, key, headers as text) of one event.
type Enveloped = (i64, Option<String>, Option<String>, Option<String>);

/// The envelopes of `query`'s rows.
fn envelopes(c: &mut postgres::Client, query: &str) -> Vec<Enveloped> {
    c.query(query, &[]).unwrap().iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))).collect()
}

const TRACE: &str = r#"{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}"#;

#[test]
fn the_envelope_comes_back_from_every_sql_reader() {
    let db = TestDb::new();
    let mut c = db.connect();
    let plain = publish(&mut c, "orders", r#"{"n":1}"#);
    let full: i64 = c
        .query_one(
            "SELECT streams.publish('orders', '{\"n\":2}', type => 'order.created', key => 'ord_1', headers => $1::text::jsonb)",
            &[&TRACE],
        )
        .unwrap()
        .get(0);
    let batch: Vec<i64> = c
        .query(
            "SELECT streams.publish_batch('orders', ARRAY['{\"n\":3}', '{\"n\":4}']::jsonb[], type => 'order.paid', key => 'ord_2')",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    wait_for_horizon(&mut c, batch[1]);

    let trace = Some(json(TRACE).to_string());
    let expected = vec![
        (plain, None, None, None),
        (full, Some("order.created".to_owned()), Some("ord_1".to_owned()), trace.clone()),
        (batch[0], Some("order.paid".to_owned()), Some("ord_2".to_owned()), None),
        (batch[1], Some("order.paid".to_owned()), Some("ord_2".to_owned()), None),
    ];
    let normalized = |rows: Vec<Enveloped>| {
        rows.into_iter().map(|(p, t, k, h)| (p, t, k, h.map(|h| json(&h).to_string()))).collect::<Vec<_>>()
    };
    for query in [
        "SELECT position, type, key, headers::text FROM streams.events ORDER BY position",
        "SELECT position, type, key, headers::text FROM streams.replay('orders')",
        "SELECT position, type, key, headers::text FROM streams.replay('*')",
    ] {
        assert_eq!(normalized(envelopes(&mut c, query)), expected, "{query}");
    }
    let got = envelopes(&mut c, &format!("SELECT position, type, key, headers::text FROM streams.get({full})"));
    assert_eq!(normalized(got), vec![expected[1].clone()]);

    c.batch_execute("SELECT streams.create_subscription('s', 'orders', after => 0)").unwrap();
    c.batch_execute("BEGIN").unwrap();
    let polled = envelopes(&mut c, "SELECT position, type, key, headers::text FROM streams.poll('s', 10)");
    c.batch_execute("ROLLBACK").unwrap();
    assert_eq!(normalized(polled), expected);
}

#[test]
fn an_empty_headers_object_is_stored_as_none() {
    let db = TestDb::new();
    let mut c = db.connect();
    let p: i64 = c.query_one("SELECT streams.publish('a', '{}', headers => '{}')", &[]).unwrap().get(0);
    let headers: Option<String> =
        c.query_one("SELECT headers::text FROM streams.event_log WHERE position = $1", &[&p]).unwrap().get(0);
    assert_eq!(headers, None);
}

#[test]
fn bad_envelopes_fail_with_22023_and_write_nothing() {
    let db = TestDb::new();
    let mut c = db.connect();
    let long_type = "t".repeat(256);
    let long_key = "k".repeat(1025);
    let many: String = format!("{{{}}}", (0..65).map(|i| format!("\"h{i}\": \"v\"")).collect::<Vec<_>>().join(", "));
    let huge = format!("{{\"big\": \"{}\"}}", "x".repeat(9000));
    let cases = [
        ("SELECT streams.publish('a', '{}', type => '')".to_owned(), "22023"),
        (format!("SELECT streams.publish('a', '{{}}', type => '{long_type}')"), "22023"),
        ("SELECT streams.publish('a', '{}', type => E'a\\nb')".to_owned(), "22023"),
        ("SELECT streams.publish('a', '{}', key => '')".to_owned(), "22023"),
        (format!("SELECT streams.publish('a', '{{}}', key => '{long_key}')"), "22023"),
        ("SELECT streams.publish('a', '{}', headers => '[]')".to_owned(), "22023"),
        ("SELECT streams.publish('a', '{}', headers => '\"x\"')".to_owned(), "22023"),
        ("SELECT streams.publish('a', '{}', headers => '{\"n\": 1}')".to_owned(), "22023"),
        ("SELECT streams.publish('a', '{}', headers => '{\"n\": {\"x\": \"y\"}}')".to_owned(), "22023"),
        ("SELECT streams.publish('a', '{}', headers => '{\"\": \"y\"}')".to_owned(), "22023"),
        (format!("SELECT streams.publish('a', '{{}}', headers => '{many}')"), "22023"),
        (format!("SELECT streams.publish('a', '{{}}', headers => '{huge}')"), "22023"),
        ("SELECT streams.publish('a', '{}', idempotency_key => '')".to_owned(), "22023"),
        ("SELECT streams.publish('a', '{}', expected_prev => -1)".to_owned(), "22023"),
        ("SELECT streams.publish_batch('a', ARRAY['{}']::jsonb[], headers => '{\"n\": true}')".to_owned(), "22023"),
        ("SELECT * FROM streams.publish_once('a', '{}', NULL)".to_owned(), "22004"),
    ];
    for (sql, state) in &cases {
        let err = c.batch_execute(sql).unwrap_err();
        assert_eq!(sqlstate(&err), *state, "{sql}: {err}");
    }
    assert_eq!(count_stored(&mut c), 0, "a refused publish writes nothing");
    // The limits themselves pass.
    c.batch_execute(&format!(
        "SELECT streams.publish('a', '{{}}', type => '{}', key => '{}')",
        "t".repeat(255),
        "k".repeat(1024)
    ))
    .unwrap();
}

/// A log someone changed (an INSERT trigger) is written through SQL
/// INSERTs instead of the direct append: the envelope goes in there too.
#[test]
fn a_changed_log_still_stores_the_envelope() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute(
        "CREATE FUNCTION public.noop() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END';
         CREATE TRIGGER noop BEFORE INSERT ON streams.event_log FOR EACH ROW EXECUTE FUNCTION public.noop();
         SELECT streams.publish('a', '{\"n\":1}');
         SELECT streams.publish('a', '{\"n\":2}', type => 't', key => 'k', headers => '{\"h\":\"v\"}');
         SELECT streams.publish_batch('a', ARRAY['{\"n\":3}']::jsonb[], type => 'b', headers => '{\"x\":\"y\"}');",
    )
    .unwrap();
    let got = envelopes(&mut c, "SELECT position, type, key, headers::text FROM streams.event_log ORDER BY position");
    let (h, x) = (Some(json(r#"{"h":"v"}"#).to_string()), Some(json(r#"{"x":"y"}"#).to_string()));
    let got: Vec<Enveloped> =
        got.into_iter().map(|(p, t, k, hd)| (p, t, k, hd.map(|hd| json(&hd).to_string()))).collect();
    assert_eq!(
        got.iter().map(|e| (e.1.clone(), e.2.clone(), e.3.clone())).collect::<Vec<_>>(),
        vec![(None, None, None), (Some("t".into()), Some("k".into()), h), (Some("b".into()), None, x)]
    );
}
