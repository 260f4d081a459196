//! Filters and wildcards wherever a pattern is accepted (issue 25): a `*`
//! segment anywhere in a pattern (`order.*.failed`), and `types` / `filter`
//! (data containment) on replay and subscriptions. Every reader returns
//! exactly the matching events, a filter never reveals a stream the caller
//! may not read, one-stream filtered replays still use the (stream,
//! position) index, and bad patterns and filters fail with 22023. The
//! gateway's filters are in tests/gateway_filters.rs.
#![cfg(feature = "integration")]

mod common;

use common::subscriptions::*;
use common::*;
use postgres::Client;

/// The events every test reads: (stream, type, data). Positions follow
/// in this order.
const EVENTS: &[(&str, &str, &str)] = &[
    ("order.eu.failed", "order.failed", r#"{"status":"failed","amount":10,"region":"eu"}"#),
    ("order.eu.paid", "order.paid", r#"{"status":"paid","amount":20,"region":"eu"}"#),
    ("order.us.failed", "order.failed", r#"{"status":"failed","amount":30,"region":"us"}"#),
    ("order.us.x.failed", "order.failed", r#"{"status":"failed","amount":40,"region":"us"}"#),
    ("order.failed", "order.failed", r#"{"status":"failed","amount":50}"#),
    ("orders.eu.failed", "order.failed", r#"{"status":"failed","amount":60}"#),
    ("order.eu.failed", "order.retried", r#"{"status":"failed","amount":70,"region":"eu"}"#),
    ("payment.eu.failed", "payment.failed", r#"{"status":"failed","amount":80,"secret":"s3cr3t"}"#),
];

/// Publish [`EVENTS`] as the owner and wait until they are final; their positions.
fn seed(owner: &mut Client) -> Vec<i64> {
    let positions: Vec<i64> = EVENTS
        .iter()
        .map(|(stream, ty, data)| {
            owner
                .query_one("SELECT streams.publish($1, $2::text::jsonb, type => $3)", &[stream, data, ty])
                .unwrap()
                .get(0)
        })
        .collect();
    wait_for_horizon(owner, *positions.last().unwrap());
    positions
}

/// The positions of the seeded events at these indexes.
fn at(p: &[i64], indexes: &[usize]) -> Vec<i64> {
    indexes.iter().map(|&i| p[i]).collect()
}

#[test]
fn replay_returns_exactly_the_events_of_the_types_and_filter() {
    let db = TestDb::new();
    let mut owner = db.connect();
    let p = seed(&mut owner);
    let q = |c: &mut Client, args: &str| event_positions(c, &format!("SELECT position FROM streams.replay({args})"));
    assert_eq!(q(&mut owner, "types => ARRAY['order.paid']"), at(&p, &[1]));
    assert_eq!(q(&mut owner, "types => ARRAY['order.paid', 'order.retried']"), at(&p, &[1, 6]));
    assert_eq!(q(&mut owner, r#"filter => '{"region":"us"}'"#), at(&p, &[2, 3]));
    assert_eq!(q(&mut owner, r#"stream => 'order.eu.failed', filter => '{"status":"failed"}'"#), at(&p, &[0, 6]));
    assert_eq!(
        q(&mut owner, r#"stream => 'order.eu.failed', types => ARRAY['order.failed'], filter => '{"amount":10}'"#),
        at(&p, &[0])
    );
    assert_eq!(
        q(&mut owner, r#"stream => 'order.*', types => ARRAY['order.failed'], filter => '{"region":"eu"}'"#),
        at(&p, &[0])
    );
    assert_eq!(q(&mut owner, r#"filter => '{"status":"nope"}'"#), Vec::<i64>::new());
    // Paging with a filter continues after the last match.
    let page = format!(r#"after => {}, filter => '{{"status":"failed"}}', max_events => 2"#, p[0]);
    assert_eq!(q(&mut owner, &page), at(&p, &[2, 3]));
    // Events without a type never match a types list.
    let untyped = publish(&mut owner, "order.eu.failed", r#"{"status":"failed"}"#);
    wait_for_horizon(&mut owner, untyped);
    assert_eq!(q(&mut owner, "stream => 'order.eu.failed', types => ARRAY['order.failed']"), at(&p, &[0]));
}

#[test]
fn a_filtered_one_stream_replay_scans_the_stream_index() {
    let db = TestDb::new();
    let reader = TestRole::new(&db, "reader", "");
    let mut owner = db.connect();
    owner.batch_execute(&format!("SELECT streams.grant('read', 'order.*', '{}')", reader.name)).unwrap();
    // Enough other events that a scan of the whole log would cost more.
    owner
        .batch_execute(
            "SELECT streams.publish_batch('noise', ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(1, 5000) g));
             ANALYZE streams.event_log",
        )
        .unwrap();
    seed(&mut owner);
    let mut r = db.connect_as(&reader.name);
    for (what, args, index_cond) in [
        (
            "one stream",
            r#"stream => 'order.eu.failed', types => ARRAY['order.failed'], filter => '{"status":"failed"}'"#,
            "stream = 'order.eu.failed'",
        ),
        ("a wildcard", r#"stream => 'order.*.failed', filter => '{"status":"failed"}'"#, "stream >= 'order.'"),
    ] {
        let plan: Vec<String> = r
            .query(&format!("EXPLAIN SELECT * FROM streams.replay({args})"), &[])
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        let plan = plan.join("\n");
        assert!(
            plan.contains("_stream_position on event_log_") && plan.contains(index_cond) && !plan.contains("Seq Scan"),
            "{what}: a filtered replay scans the (stream, position) index:\n{plan}"
        );
    }
}

#[test]
fn a_middle_star_selects_one_whole_segment_in_replay_grants_and_subscriptions() {
    let db = TestDb::new();
    let failures = TestRole::new(&db, "failures", "");
    let mut owner = db.connect();
    owner.batch_execute(&format!("SELECT streams.grant('read', 'order.*.failed', '{}')", failures.name)).unwrap();
    let p = seed(&mut owner);
    let one_segment = at(&p, &[0, 2, 6]);
    assert_eq!(event_positions(&mut owner, "SELECT position FROM streams.replay('order.*.failed')"), one_segment);
    assert_eq!(
        event_positions(&mut owner, "SELECT position FROM streams.replay('*.eu.failed')"),
        at(&p, &[0, 5, 6, 7])
    );
    assert_eq!(
        event_positions(&mut owner, "SELECT position FROM streams.replay('order.*.*')"),
        at(&p, &[0, 1, 2, 3, 6])
    );
    // A trailing star still means any suffix.
    assert_eq!(
        event_positions(&mut owner, "SELECT position FROM streams.replay('order.*')"),
        at(&p, &[0, 1, 2, 3, 4, 6])
    );

    // The grant: exactly the one-segment failures, wherever the role reads.
    let mut f = db.connect_as(&failures.name);
    assert_eq!(event_positions(&mut f, "SELECT position FROM streams.events ORDER BY position"), one_segment);
    assert_eq!(event_positions(&mut f, "SELECT position FROM streams.replay()"), one_segment);
    assert_eq!(event_positions(&mut f, "SELECT position FROM streams.replay('order.*')"), one_segment);
    // A subscription needs a grant that covers its whole pattern.
    fails_with(&mut f, "SELECT streams.create_subscription('all_orders', 'order.*', after => 0)", "42501");
    fails_with(&mut f, "SELECT streams.create_subscription('eu', 'order.eu.*', after => 0)", "42501");
    f.batch_execute("SELECT streams.create_subscription('fails', 'order.*.failed', after => 0)").unwrap();
    f.batch_execute("SELECT streams.create_subscription('eu_fails', 'order.eu.failed', after => 0)").unwrap();
    assert_eq!(consume(&mut f, "fails", 100), one_segment);
    assert_eq!(consume(&mut f, "eu_fails", 100), at(&p, &[0, 6]));
    // Unordered, as the owner: the same events.
    owner
        .batch_execute("SELECT streams.create_subscription('u', 'order.*.failed', after => 0, ordered => false)")
        .unwrap();
    assert_eq!(consume(&mut owner, "u", 100), one_segment);
    assert_eq!(progress(&mut owner, "u").pending, 0);
}

#[test]
fn subscriptions_poll_only_matching_events_and_ack_past_the_others() {
    let db = TestDb::new();
    let mut c = db.connect();
    let p = seed(&mut c);
    for (name, ordered) in [("ordered", true), ("unordered", false)] {
        c.batch_execute(&format!(
            r#"SELECT streams.create_subscription('{name}', 'order.*', after => 0, ordered => {ordered},
                   types => ARRAY['order.failed'], filter => '{{"region":"eu"}}')"#
        ))
        .unwrap();
    }
    c.batch_execute(
        r#"SELECT streams.create_subscription('keyed', '*', after => 0, key => 'region', filter => '{"status":"failed"}')"#,
    )
    .unwrap();
    for name in ["ordered", "unordered"] {
        assert_eq!(progress(&mut c, name).pending, 1, "{name}: only the matching event is pending");
        assert_eq!(consume(&mut c, name, 100), at(&p, &[0]), "{name}");
        let after = progress(&mut c, name);
        assert_eq!((after.pending, after.position), (0, *p.last().unwrap()), "{name}: the skipped events are passed");
        assert_eq!(consume(&mut c, name, 100), Vec::<i64>::new(), "{name}: nothing more");
    }
    let mut keyed: Vec<i64> = Vec::new();
    for _ in 0..10 {
        keyed.extend(consume(&mut c, "keyed", 100));
    }
    keyed.sort_unstable();
    assert_eq!(keyed, at(&p, &[0, 2, 3, 4, 5, 6, 7]), "per key: exactly the failed events");

    // Later events: non-matching ones never block the matching ones behind them.
    let mut later = Vec::new();
    for (stream, ty, data) in [
        ("order.eu.failed", "order.paid", r#"{"region":"eu"}"#),
        ("order.us.failed", "order.failed", r#"{"region":"us"}"#),
        ("order.eu.failed", "order.failed", r#"{"region":"eu","n":1}"#),
        ("order.eu.failed", "order.failed", r#"{"region":"us"}"#),
    ] {
        later.push(
            c.query_one("SELECT streams.publish($1, $2::text::jsonb, type => $3)", &[&stream, &data, &ty])
                .unwrap()
                .get::<_, i64>(0),
        );
    }
    wait_for_horizon(&mut c, *later.last().unwrap());
    for name in ["ordered", "unordered"] {
        assert_eq!(consume(&mut c, name, 1), vec![later[2]], "{name}");
        assert_eq!(progress(&mut c, name).pending, 0, "{name}");
        assert_eq!(consume(&mut c, name, 100), Vec::<i64>::new(), "{name}");
    }
}

#[test]
fn if_not_exists_compares_the_filters() {
    let db = TestDb::new();
    let mut c = db.connect();
    c.batch_execute(
        r#"SELECT streams.create_subscription('s', 'order.*.failed', types => ARRAY['a', 'b'], filter => '{"x": 1}')"#,
    )
    .unwrap();
    // The same filters, written another way: accepted.
    c.batch_execute(
        r#"SELECT streams.create_subscription('s', 'order.*.failed', types => ARRAY['b', 'a'], filter => '{ "x":1 }',
                                               if_not_exists => true)"#,
    )
    .unwrap();
    for other in [
        r#"types => ARRAY['a'], filter => '{"x": 1}'"#,
        r#"types => ARRAY['a', 'b'], filter => '{"x": 2}'"#,
        r#"types => ARRAY['a', 'b']"#,
        r#"filter => '{"x": 1}'"#,
    ] {
        let e = fails_with(
            &mut c,
            &format!("SELECT streams.create_subscription('s', 'order.*.failed', {other}, if_not_exists => true)"),
            "42710",
        );
        let message = e.as_db_error().map(|d| d.message().to_owned()).unwrap_or_default();
        assert!(message.contains("another filter"), "{other}: {message}");
    }
    let stored = value(&mut c, "SELECT types::text || ' ' || filter::text FROM streams.subscriptions WHERE name = 's'");
    assert_eq!(stored.as_deref(), Some(r#"{a,b} {"x": 1}"#));
}

#[test]
fn a_filter_never_reveals_events_of_a_stream_the_role_may_not_read() {
    let db = TestDb::new();
    let eu = TestRole::new(&db, "eu", "");
    let mut owner = db.connect();
    owner.batch_execute(&format!("SELECT streams.grant('read', 'order.eu.failed', '{}')", eu.name)).unwrap();
    let p = seed(&mut owner);
    let mut r = db.connect_as(&eu.name);
    // Filters that match only hidden events find nothing, whichever way they are asked.
    for args in [
        r#"filter => '{"secret":"s3cr3t"}'"#,
        r#"stream => 'payment.eu.failed', filter => '{"status":"failed"}'"#,
        r#"stream => '*.eu.failed', types => ARRAY['payment.failed']"#,
        r#"stream => 'order.*.failed', filter => '{"region":"us"}'"#,
    ] {
        assert_eq!(
            event_positions(&mut r, &format!("SELECT position FROM streams.replay({args})")),
            Vec::<i64>::new(),
            "{args}"
        );
    }
    // What it may read, it reads filtered.
    assert_eq!(
        event_positions(
            &mut r,
            r#"SELECT position FROM streams.replay('*.eu.failed', filter => '{"status":"failed"}')"#
        ),
        at(&p, &[0, 6])
    );
    assert_eq!(
        event_positions(&mut r, "SELECT position FROM streams.replay(types => ARRAY['order.retried'])"),
        at(&p, &[6])
    );
    // A subscription with a filter still needs the whole pattern.
    fails_with(
        &mut r,
        r#"SELECT streams.create_subscription('peek', '*', after => 0, filter => '{"secret":"s3cr3t"}')"#,
        "42501",
    );
    fails_with(
        &mut r,
        r#"SELECT streams.create_subscription('peek', '*.eu.failed', after => 0, types => ARRAY['payment.failed'])"#,
        "42501",
    );
}

#[test]
fn bad_patterns_and_filters_fail_with_22023() {
    let db = TestDb::new();
    let role = TestRole::new(&db, "r", "");
    let mut c = db.connect();
    for pattern in ["order.*x", "**", "order.**", "order..*", "order.*..failed", "*x", "order.*.", "a*.b"] {
        fails_with(&mut c, &format!("SELECT * FROM streams.replay('{pattern}')"), "22023");
        fails_with(&mut c, &format!("SELECT streams.create_subscription('s', '{pattern}')"), "22023");
        fails_with(&mut c, &format!("SELECT streams.grant('read', '{pattern}', '{}')", role.name), "22023");
    }
    let big = format!(r#"{{"k":"{}"}}"#, "x".repeat(4100));
    for (args, what) in [
        ("filter => '[1]'", "an array"),
        ("filter => '\"x\"'", "a string"),
        ("filter => 'null'", "JSON null"),
        (&format!("filter => '{big}'") as &str, "more than 4 kB"),
        ("types => '{}'", "no types"),
        ("types => ARRAY['a', NULL]", "a null type"),
        ("types => ARRAY['']", "an empty type"),
    ] {
        let e = fails_with(&mut c, &format!("SELECT * FROM streams.replay('x', {args})"), "22023");
        let message = e.as_db_error().map(|d| d.message().to_owned()).unwrap_or_default();
        assert!(message.starts_with("invalid types") || message.starts_with("invalid filter"), "{what}: {message}");
        fails_with(&mut c, &format!("SELECT streams.create_subscription('s', 'x', {args})"), "22023");
    }
    let made: i64 = c.query_one("SELECT count(*) FROM streams.subscriptions", &[]).unwrap().get(0);
    assert_eq!(made, 0, "no bad subscription was created");
}
