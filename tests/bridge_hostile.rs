#![cfg(feature = "integration")]
//! The bridge (`litebase-streams-bridge`) against hostile publishers, roles
//! and settings: what a publisher (or the bridge's own role) controls must
//! not let it steer JetStream, stall or crash the bridge, duplicate or lose
//! events, or change what the bridge's session does.
//!
//! Each test was seen to fail against a bridge without the protection it
//! names (the review that wrote them found five of them missing).

mod common;

use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::gateway::dsn;
use common::nats::{Bridge, Nats, Stored};
use common::service::{free_port, workspace_binary};
use common::{sqlstate, wait_until, TestDb, TestRole};
use postgres::Client;

const JS_STREAM: &str = "LITEBASE_STREAMS";

fn log_id(client: &mut Client) -> String {
    client.query_one("SELECT streams.log_id()::text", &[]).unwrap().get(0)
}

/// Wait until `stream` holds at least `count` messages; false after `timeout`.
fn stored_within(nats: &Nats, stream: &str, count: u64, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if nats.count(stream) >= count {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// One event larger than NATS's max_payload (1 MiB by default; the
/// extension has no size limit unless litebase_streams.max_event_size is
/// set) would be a poison pill: nats-server answers it with `Maximum
/// Payload Violation` and closes the connection, for ever. It goes as a
/// stand-in instead (its message id and Litebase-* headers, no data,
/// `Litebase-Truncated`), in its place, and the events after it follow.
#[test]
fn an_event_over_nats_max_payload_goes_as_a_stand_in_and_the_events_after_it_follow() {
    let db = TestDb::new();
    let mut admin = db.connect();
    admin
        .batch_execute(
            r#"SELECT streams.publish('orders.a', '{"n":1}');
               SELECT streams.publish('orders.a', jsonb_build_object('pad', repeat('x', 1200000)));
               SELECT streams.publish('orders.a', jsonb_build_object('n', g)) FROM generate_series(3, 30) g;"#,
        )
        .unwrap();
    let nats = Nats::start();
    let bridge = Bridge::start(
        &dsn(&db.name, "postgres"),
        &nats.urls(),
        &[
            "--pattern",
            "orders.*",
            "--start",
            "beginning",
            "--max-hold-secs",
            "2",
            "--duplicate-window-secs",
            "30",
            "--ack-timeout-ms",
            "1000",
        ],
    );
    let last = |nats: &Nats| nats.messages(JS_STREAM).iter().any(|m| m.payload.replace(' ', "") == r#"{"n":30}"#);
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline && !last(&nats) {
        thread::sleep(Duration::from_millis(250));
    }
    let stored: Vec<i64> = nats.messages(JS_STREAM).iter().map(|m| m.position).collect();
    let pending: i64 =
        admin.query_one("SELECT pending FROM streams.subscriptions WHERE name = 'nats_bridge'", &[]).unwrap().get(0);
    assert!(
        last(&nats),
        "after 20 s the last of 30 events (the 2nd is 1.2 MB) is not in JetStream, which holds positions \
         {stored:?}; the subscription has {pending} pending; bridge log:\n{}",
        tail(&bridge.log_text(), 6)
    );
    assert_eq!(stored, (1..=30).collect::<Vec<i64>>(), "every event once, in order");
    let messages = nats.messages(JS_STREAM);
    let big = &messages[1];
    assert!(
        big.payload.is_empty()
            && big.header("Litebase-Truncated").is_some_and(|b| b.parse::<u64>().unwrap() > 1_200_000)
    );
    assert_eq!(bridge.metric("litebase_streams_bridge_truncated_total"), 1.0);
}

/// A window the sink fails on for good (here an event on a subject no
/// JetStream stream takes: the stream was made for `orders.a` only) keeps
/// what was stored before the failure: it is acked before the rest is given
/// back, and never published again, however long the failure lasts (the
/// duplicate window is 2 s, the test watches 8 s of retries).
#[test]
fn a_window_the_sink_fails_on_acks_what_was_stored_and_never_stores_it_again() {
    let db = TestDb::new();
    let mut admin = db.connect();
    admin
        .batch_execute(
            r#"SELECT streams.publish('orders.a', '{"n":1}');
               SELECT streams.publish('orders.b', '{"n":2}');"#,
        )
        .unwrap();
    let nats = Nats::start();
    let bridge = Bridge::start(
        &dsn(&db.name, "postgres"),
        &nats.urls(),
        &[
            "--pattern",
            "orders.*",
            "--subjects",
            "orders.a",
            "--start",
            "beginning",
            "--max-hold-secs",
            "1",
            "--duplicate-window-secs",
            "2",
            "--ack-timeout-ms",
            "500",
        ],
    );
    wait_until("the first event is acked", Duration::from_secs(15), || {
        let row =
            admin.query_opt("SELECT position FROM streams.subscriptions WHERE name = 'nats_bridge'", &[]).unwrap();
        row.is_some_and(|r| r.get::<_, i64>(0) >= 1)
    });
    let failures_then = bridge.metric("litebase_streams_bridge_publish_failures_total");
    let watch = Instant::now();
    while watch.elapsed() < Duration::from_secs(8) {
        let copies = nats.messages(JS_STREAM).len();
        assert!(
            copies <= 1,
            "JetStream stored the first event {copies} times; bridge log:\n{}",
            tail(&bridge.log_text(), 8)
        );
        thread::sleep(Duration::from_millis(250));
    }
    assert!(bridge.metric("litebase_streams_bridge_publish_failures_total") > failures_then, "it kept retrying");
}

/// nats-server (2.9.x, which `make setup` installs, up to the fix of
/// nats-server#7065) looks for `Nats-Msg-Id` at its first occurrence in the
/// header block, and ignores the message id when that occurrence is not a
/// header line of its own, and headers go out in HashMap order: an event
/// whose envelope mentioned `Nats-Msg-Id` anywhere (a header name, kept in
/// Litebase-Headers, a header value, the key, the type) would have its
/// message id ignored about half the time, and a window published again
/// (after a crash, an ack timeout, a rollback) stored twice. No value the
/// bridge copies holds the text (`headers::defused`). A second bridge on
/// another subscription publishes everything again into the same stream
/// (the "skip what the stream holds" check does not apply to another
/// subscription's messages): JetStream must still hold each event once.
/// The plain events show the method works.
#[test]
fn a_header_mentioning_nats_msg_id_does_not_switch_off_deduplication() {
    let db = TestDb::new();
    let mut admin = db.connect();
    admin
        .batch_execute(
            r#"SELECT streams.publish('orders.a', jsonb_build_object('n', g), headers => '{"Nats-Msg-Id":"forged"}')
                 FROM generate_series(1, 8) g;
               SELECT streams.publish('orders.a', jsonb_build_object('n', g), headers => '{"note":"see Nats-Msg-Id"}')
                 FROM generate_series(9, 16) g;
               SELECT streams.publish('orders.a', jsonb_build_object('n', g), key => 'Nats-Msg-Id')
                 FROM generate_series(17, 24) g;
               SELECT streams.publish('orders.plain', jsonb_build_object('n', g)) FROM generate_series(25, 32) g;"#,
        )
        .unwrap();
    let nats = Nats::start();
    let mut bridge =
        Bridge::start(&dsn(&db.name, "postgres"), &nats.urls(), &["--pattern", "orders.*", "--start", "beginning"]);
    assert!(stored_within(&nats, JS_STREAM, 32, Duration::from_secs(30)), "{}", bridge.log_text());
    bridge.kill();
    // Everything again, by a bridge on another subscription into the same
    // JetStream stream: the stream's newest message is not its own, so only
    // the message ids keep JetStream from storing the events twice.
    let again = Bridge::start(
        &dsn(&db.name, "postgres"),
        &nats.urls(),
        &["--pattern", "orders.*", "--start", "beginning", "--subscription", "nats_bridge_again"],
    );
    wait_until("the second bridge published everything again", Duration::from_secs(30), || {
        again.metric("litebase_streams_bridge_events_total") + again.metric("litebase_streams_bridge_duplicates_total")
            >= 32.0
    });
    let stored = nats.messages(JS_STREAM);
    let mut seen = std::collections::HashMap::<i64, usize>::new();
    for m in &stored {
        *seen.entry(m.position).or_default() += 1;
    }
    let plain_twice = stored.iter().filter(|m| m.subject == "orders.plain" && seen[&m.position] > 1).count();
    assert_eq!(plain_twice, 0, "the method: plain events are deduplicated");
    let mut twice: Vec<i64> = seen.iter().filter(|(_, &n)| n > 1).map(|(&p, _)| p).collect();
    twice.sort_unstable();
    assert!(
        twice.is_empty(),
        "JetStream stored {} messages for 32 events: events {twice:?} twice (their Nats-Msg-Id was ignored); \
         log id {}",
        stored.len(),
        log_id(&mut admin)
    );
}

/// Without --subject-prefix a pattern whose subjects start with a
/// wildcard (`*.*` maps to `*.>`) is refused like `*`: a JetStream stream on
/// `*.>` would capture every subject of two tokens or more, `$JS.API.>` and
/// the `_INBOX.<id>.<n>` replies included (nats-server 2.9 accepts it), and
/// break JetStream for the whole account.
#[test]
fn a_pattern_mapping_to_a_wildcard_first_token_is_refused_without_a_subject_prefix() {
    let db = TestDb::new();
    let nats = Nats::start();
    let log = std::env::temp_dir().join(format!("litebase-bridge-hostile-{}-{}.log", std::process::id(), free_port()));
    let mut child = Command::new(workspace_binary(
        "litebase-streams-bridge",
        "LITEBASE_STREAMS_BRIDGE_BIN",
        "litebase-streams-bridge",
    ))
    .args([
        "--database-url",
        &dsn(&db.name, "postgres"),
        "--nats-url",
        &nats.urls(),
        "--listen",
        &format!("127.0.0.1:{}", free_port()),
        "--pattern",
        "*.*",
        "--start",
        "beginning",
    ])
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(&log).unwrap())
    .spawn()
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut status = None;
    while Instant::now() < deadline && status.is_none() {
        status = child.try_wait().unwrap();
        thread::sleep(Duration::from_millis(50));
    }
    // What the JetStream stream holds, from the monitoring endpoint (a
    // JetStream API request would itself be captured by a stream on `*.>`).
    let held = || -> u64 {
        let jsz = nats.servers[0].monitor("/jsz?streams=1").unwrap_or_default();
        jsz["account_details"][0]["stream_detail"][0]["state"]["messages"].as_u64().unwrap_or(0)
    };
    let mut evidence = String::new();
    if status.is_none() {
        let mut admin = db.connect();
        admin.batch_execute(r#"SELECT streams.publish('orders.a', '{"n":1}')"#).unwrap();
        wait_until("the bridge stored the event", Duration::from_secs(10), || held() >= 1);
        // A JetStream API request of anyone on the account, as a client makes it.
        let api = nats.count(JS_STREAM);
        thread::sleep(Duration::from_millis(500));
        evidence = format!(
            "its JetStream stream (on `*.>`) holds {} messages for 1 event, and a $JS.API.STREAM.INFO request \
             answered {api} messages (it was stored in the stream instead of being answered)",
            held()
        );
    }
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    assert!(
        status.is_some_and(|s| s.code() == Some(2)),
        "the bridge ran with --pattern '*.*' and no prefix: {evidence}; log:\n{}",
        tail(&text, 3)
    );
}

/// Hostile settings of the bridge's role (ALTER ROLE ... IN DATABASE ... SET)
/// do not reach its session: a search_path that puts a schema with its own
/// `to_char` first, read-only transactions, a 50 ms statement_timeout and a
/// 20 ms idle_in_transaction_session_timeout. The role's own session shows
/// them in effect (the controls); the bridge's stores every event with the
/// real commit time, acks them, and its long polls (500 ms) run without a
/// reconnect. Then a revoked grant stops what it publishes.
///
/// Checked to fail without the protection (bridge binaries built with one
/// SET of source.rs's SESSION removed, via LITEBASE_STREAMS_BRIDGE_BIN):
/// without `SET search_path` Litebase-Time is `HACKED`; without
/// `default_transaction_read_only = off` nothing is stored (create_subscription
/// raises 25006, again and again); without the bridge's statement_timeout
/// the idle long polls are cancelled and the session reconnects. Each control proves the setting
/// is live for a session of the role; without `SET search_path` the bridge's
/// unqualified `to_char` resolves to evil.to_char (shown by the control
/// query) and Litebase-Time would be `HACKED`; without
/// `default_transaction_read_only = off` streams.ack raises 25006 and no
/// window is ever acked (pending stays 3); without its statement_timeout
/// the long poll is cancelled after 50 ms (57014) and every idle poll
/// reconnects.
#[test]
fn hostile_role_settings_and_a_shadowing_function_do_not_reach_the_bridge_session() {
    let db = TestDb::new();
    let role = TestRole::new(&db, "bridge", "");
    let mut admin = db.connect();
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA evil;
             CREATE FUNCTION evil.to_char(timestamptz, text) RETURNS text LANGUAGE sql AS $$ SELECT 'HACKED'::text $$;
             GRANT USAGE ON SCHEMA evil TO {r};
             SELECT streams.grant('read', 'orders.*', '{r}');
             ALTER ROLE {r} IN DATABASE {d} SET search_path = evil, pg_catalog;
             ALTER ROLE {r} IN DATABASE {d} SET default_transaction_read_only = on;
             ALTER ROLE {r} IN DATABASE {d} SET statement_timeout = '50ms';
             ALTER ROLE {r} IN DATABASE {d} SET idle_in_transaction_session_timeout = '20ms';
             ALTER ROLE {r} IN DATABASE {d} SET lock_timeout = '1ms';",
            r = role.name,
            d = db.name
        ))
        .unwrap();
    // The controls: the settings are live for a session of the role.
    let mut as_role = db.connect_as(&role.name);
    let shadowed: String = as_role.query_one("SELECT to_char(now(), 'YYYY')", &[]).unwrap().get(0);
    assert_eq!(shadowed, "HACKED", "control: the role's search_path shadows to_char");
    let ro: String = as_role.query_one("SHOW default_transaction_read_only", &[]).unwrap().get(0);
    assert_eq!(ro, "on", "control: the role's transactions are read-only");
    let err = as_role.batch_execute("SELECT pg_sleep(0.2)").unwrap_err();
    assert_eq!(sqlstate(&err), "57014", "control: statement_timeout is 50 ms");
    drop(as_role);

    let nats = Nats::start();
    let bridge = Bridge::start(
        &dsn(&db.name, &role.name),
        &nats.urls(),
        &["--pattern", "orders.*", "--start", "beginning", "--poll-wait-ms", "500"],
    );
    admin
        .batch_execute(
            r#"SELECT streams.publish('orders.a', jsonb_build_object('n', g), headers => '{"traceparent":"00-x-y-01"}')
               FROM generate_series(1, 3) g"#,
        )
        .unwrap();
    assert!(stored_within(&nats, JS_STREAM, 3, Duration::from_secs(30)), "{}", bridge.log_text());
    let stored: Vec<Stored> = nats.messages(JS_STREAM);
    for m in &stored {
        let time = m.header("Litebase-Time").unwrap_or_default();
        assert!(
            time.len() == 27 && time.ends_with('Z') && time.as_bytes()[10] == b'T',
            "Litebase-Time {time:?}: the bridge's session resolved to_char through the role's search_path"
        );
    }
    wait_until("the role's subscription is acked", Duration::from_secs(10), || {
        admin
            .query_one("SELECT pending FROM streams.subscriptions WHERE name = 'nats_bridge'", &[])
            .map(|r| r.get::<_, i64>(0) == 0)
            .unwrap_or(false)
    });
    // Five idle long polls of 500 ms, with the role's 50 ms statement_timeout.
    thread::sleep(Duration::from_millis(2500));
    let log = bridge.log_text();
    assert_eq!(
        bridge.metric("litebase_streams_bridge_reconnects_total{target=\"database\"}"),
        0.0,
        "the bridge's session reconnected:\n{}",
        tail(&log, 10)
    );
    assert!(!log.contains("57014") && !log.contains("25006") && !log.contains("25P03"), "{}", tail(&log, 10));

    // A revoked grant: what comes after it does not reach JetStream.
    admin.batch_execute(&format!("SELECT streams.revoke('read', 'orders.*', '{}')", role.name)).unwrap();
    admin.batch_execute(r#"SELECT streams.publish('orders.a', '{"after":"revoke"}')"#).unwrap();
    thread::sleep(Duration::from_secs(3));
    assert!(
        nats.messages(JS_STREAM).iter().all(|m| !m.payload.contains("revoke")),
        "an event published after the role lost its grant reached JetStream"
    );
}

/// --max-in-flight-bytes holds when a publisher switches from small events
/// to 300 kB ones: the first row of a window carries every event's size, so
/// the bridge fetches what fits in 1 MiB, not a window's worth (100 events,
/// 30 MB) sized by the small events before.
#[test]
fn larger_events_after_small_ones_stay_within_the_in_flight_bound() {
    let db = TestDb::new();
    let mut admin = db.connect();
    let nats = Nats::start();
    let bound = 1024 * 1024;
    let bridge = Bridge::start(
        &dsn(&db.name, "postgres"),
        &nats.urls(),
        &["--pattern", "big.*", "--start", "beginning", "--max-in-flight-bytes", &bound.to_string()],
    );
    admin
        .batch_execute("SELECT streams.publish('big.a', jsonb_build_object('i', g)) FROM generate_series(1, 20) g")
        .unwrap();
    assert!(stored_within(&nats, JS_STREAM, 20, Duration::from_secs(30)), "{}", bridge.log_text());
    let before = bridge.memory_kb("VmHWM");
    admin
        .batch_execute(
            "SELECT streams.publish('big.a', jsonb_build_object('i', g, 'pad', repeat('x', 300 * 1024))) \
             FROM generate_series(1, 100) g",
        )
        .unwrap();
    assert!(stored_within(&nats, JS_STREAM, 120, Duration::from_secs(60)), "{}", bridge.log_text());
    let after = bridge.memory_kb("VmHWM");
    assert!(
        after < before + 8 * 1024,
        "peak RSS went from {before} kB to {after} kB for a bound of 1 MiB: the bridge read the whole 30 MB window"
    );
}

/// Header injection and odd headers: CR/LF in a value, `Nats-*` and
/// `Litebase-*` names in any case, names with a space or a colon, tabs,
/// control bytes and non-ASCII in values, 64 headers: the message is stored
/// with the bridge's own Nats-Msg-Id and Litebase-* values, only the
/// harmless headers are carried, and the event after it goes through. The
/// extension refuses control characters in type and key, non-string header
/// values and a 65th header.
///
/// Checked to fail without the protection (a bridge binary whose carries()
/// lacks the CR/LF and prefix tests: JetStream held 2 of the 3 messages).
/// Without carries()'s CR/LF test
/// `multi` would be carried (as `line`, with an injected
/// `Nats-Expected-Last-Sequence` line after it, a header the allow-list
/// below refuses); without the `Nats-`/`Litebase-` tests the forged
/// `nats-expected-stream`, `LITEBASE-POSITION` would be stored.
#[test]
fn header_injection_and_odd_headers_are_not_carried_and_do_not_stall_the_bridge() {
    let db = TestDb::new();
    let mut admin = db.connect();
    for (sql, what) in [
        ("SELECT streams.publish('orders.a', '{}', type => E'a\\r\\nNats-Msg-Id: x')", "CR/LF in type"),
        ("SELECT streams.publish('orders.a', '{}', key => E'k\\nNats-Msg-Id: x')", "LF in key"),
        ("SELECT streams.publish('orders.a', '{}', headers => '{\"n\": 1}')", "a number as a header value"),
        ("SELECT streams.publish('orders.a', '{}', headers => '{\"a\\rb\": \"x\"}')", "CR in a header name"),
        (
            "SELECT streams.publish('orders.a', '{}', headers => (SELECT jsonb_object_agg('h' || g, 'v'::text) \
             FROM generate_series(1, 65) g))",
            "65 headers",
        ),
    ] {
        let err = admin.batch_execute(sql).expect_err(what);
        assert_eq!(sqlstate(&err), "22023", "{what}: {err}");
    }
    let headers = serde_json::json!({
        "multi": "line\r\nNats-Expected-Last-Sequence: 1",
        "lf": "a\nb",
        "Nats-Msg-Id": "forged",
        "nats-expected-stream": "OTHER",
        "NATS-ROLLUP": "all",
        "LITEBASE-POSITION": "999",
        "Litebase-Stream": "secret.x",
        "a b": "space",
        "a:b": "colon",
        "tab": "a\tb",
        "ctl": "x\u{1}\u{7f}y",
        "utf": "ü€😀",
        "empty": "",
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    });
    let mut many = serde_json::Map::new();
    for i in 0..64 {
        many.insert(format!("h{i}"), serde_json::Value::String(format!("v{i}")));
    }
    admin
        .execute(
            "SELECT streams.publish('orders.a', '{\"n\":1}', type => 'ü t', key => 'k e y', headers => $1::text::jsonb)",
            &[&headers.to_string()],
        )
        .unwrap();
    admin
        .execute(
            "SELECT streams.publish('orders.a', '{\"n\":2}', headers => $1::text::jsonb)",
            &[&serde_json::Value::Object(many).to_string()],
        )
        .unwrap();
    admin.batch_execute(r#"SELECT streams.publish('orders.a', '{"n":3}')"#).unwrap();
    let nats = Nats::start();
    let bridge =
        Bridge::start(&dsn(&db.name, "postgres"), &nats.urls(), &["--pattern", "orders.*", "--start", "beginning"]);
    assert!(
        stored_within(&nats, JS_STREAM, 3, Duration::from_secs(30)),
        "the events after odd headers did not go through: {}",
        tail(&bridge.log_text(), 10)
    );
    let stored = nats.messages(JS_STREAM);
    assert_eq!(stored.len(), 3);
    let id = log_id(&mut admin);
    let m = &stored[0];
    assert_eq!(m.msg_id, format!("{id}:{}", m.position));
    assert_eq!(m.header("Litebase-Stream"), Some("orders.a"));
    assert_eq!(m.header("Litebase-Position").map(str::to_owned), Some(m.position.to_string()));
    assert_eq!(m.header("Litebase-Type"), Some("ü t"));
    assert_eq!(m.header("Litebase-Key"), Some("k e y"));
    let carried = ["tab", "ctl", "utf", "empty", "traceparent"];
    for (name, value) in &m.headers {
        let ok = ["Nats-Msg-Id", "Nats-Expected-Last-Msg-Id"].contains(&name.as_str())
            || carried.contains(&name.as_str())
            || {
                [
                    "Litebase-Log-Id",
                    "Litebase-Position",
                    "Litebase-Subscription",
                    "Litebase-Stream",
                    "Litebase-Time",
                    "Litebase-Tx",
                ]
                .contains(&name.as_str())
                    || ["Litebase-Type", "Litebase-Key", "Litebase-Headers"].contains(&name.as_str())
            };
        assert!(ok, "header {name:?}: {value:?} reached JetStream");
        if carried.contains(&name.as_str()) {
            // NATS trims a value's surrounding whitespace; the rest is as published.
            assert_eq!(value.trim(), headers[name].as_str().unwrap().trim(), "{name}");
        }
    }
    let full: serde_json::Value = serde_json::from_str(m.header("Litebase-Headers").unwrap()).unwrap();
    assert_eq!(full, headers, "every header is kept in Litebase-Headers");
    assert_eq!(stored[1].headers.iter().filter(|(k, _)| k.starts_with('h')).count(), 64);
}

/// Stream names a publisher may use map to plain subjects inside the
/// bridge's mapping: empty segments become `~`, `:`, `-` and `_` stay; a
/// name with a NATS wildcard, whitespace, `~`, `$` or a leading `.` is
/// refused by the extension (22023), so no event can land on a wildcard,
/// an empty token or a subject outside `orders.>`.
///
/// Checked to fail without the protection (a bridge binary with an empty
/// EMPTY_SEGMENT: "no stream found for given subject", retried forever); the refused names are each
/// asserted to fail with 22023 (the naming rule of core/src/names.rs); a
/// subjects.rs without the `~` mapping would publish `orders..x` to an
/// invalid subject, which nats-server drops (no ack: the count stays below 3).
#[test]
fn stream_names_map_to_plain_subjects_inside_the_mapping() {
    let db = TestDb::new();
    let mut admin = db.connect();
    for name in
        ["orders.*", "orders.>", "orders.a*b", "orders. x", "orders.\tx", "orders.~", "orders.$x", ".orders", ""]
    {
        let err = admin.execute("SELECT streams.publish($1, '{}')", &[&name]).expect_err(name);
        assert_eq!(sqlstate(&err), "22023", "{name:?}: {err}");
    }
    admin
        .batch_execute(
            r#"SELECT streams.publish('orders..x', '{"n":1}');
               SELECT streams.publish('orders.x.', '{"n":2}');
               SELECT streams.publish('orders.a:b-c_D9', '{"n":3}');"#,
        )
        .unwrap();
    let nats = Nats::start();
    let bridge =
        Bridge::start(&dsn(&db.name, "postgres"), &nats.urls(), &["--pattern", "orders.*", "--start", "beginning"]);
    assert!(stored_within(&nats, JS_STREAM, 3, Duration::from_secs(30)), "{}", tail(&bridge.log_text(), 10));
    let subjects: Vec<String> = nats.messages(JS_STREAM).into_iter().map(|m| m.subject).collect();
    assert_eq!(subjects, ["orders.~.x", "orders.x.~", "orders.a:b-c_D9"]);
    for s in &subjects {
        assert!(s.split('.').all(|t| !t.is_empty() && !t.contains(['*', '>']) && !t.contains(char::is_whitespace)));
    }
}
