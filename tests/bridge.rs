#![cfg(feature = "integration")]
//! The bridge (bridge/, `litebase-streams-bridge`) against a real
//! nats-server with JetStream: every committed event exactly once, in
//! position order, through crashes of the bridge, of nats-server and of
//! PostgreSQL, and a JetStream leader's death; memory bounded while NATS is
//! down; and nothing its role may not read.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::gateway::dsn;
use common::nats::{Bridge, Nats, Stored};
use common::{wait_until, ScratchCluster, TestDb, TestRole};
use postgres::{Client, Config, NoTls};
use rand::Rng;

const JS_STREAM: &str = "LITEBASE_STREAMS";

/// Writers publishing one event per transaction on their own stream, a
/// fifth of the transactions rolled back, reconnecting after errors (the
/// server may be restarting). What committed is read from the database.
struct Writers {
    threads: Vec<thread::JoinHandle<()>>,
}

impl Writers {
    fn start(config: Config, streams: &[&str], each: usize) -> Writers {
        let threads = streams
            .iter()
            .map(|stream| {
                let (config, stream) = (config.clone(), stream.to_string());
                thread::spawn(move || {
                    let mut rng = rand::thread_rng();
                    let mut client: Option<Client> = None;
                    let mut n = 0;
                    while n < each {
                        let c = match client.as_mut() {
                            Some(c) => c,
                            None => match config.connect(NoTls) {
                                Ok(c) => client.insert(c),
                                Err(_) => {
                                    thread::sleep(Duration::from_millis(50));
                                    continue;
                                }
                            },
                        };
                        let end = if rng.gen_bool(0.2) { "ROLLBACK" } else { "COMMIT" };
                        let sql = format!(
                            "BEGIN; SELECT streams.publish('{stream}', jsonb_build_object('n', {n}, 'end', '{end}')); {end}"
                        );
                        match c.batch_execute(&sql) {
                            Ok(()) => n += 1,
                            Err(_) => client = None,
                        }
                    }
                })
            })
            .collect();
        Writers { threads }
    }

    fn join(self) {
        for t in self.threads {
            t.join().unwrap();
        }
    }
}

/// The committed events' positions, streams and data, in position order,
/// once the horizon passed every event the log holds.
fn committed(client: &mut Client, pattern: &str) -> Vec<(i64, String, String)> {
    wait_until("the horizon passes every event", Duration::from_secs(60), || {
        client
            .query_one("SELECT streams.horizon() >= coalesce((SELECT max(position) FROM streams.event_log), 0)", &[])
            .unwrap()
            .get(0)
    });
    client
        .query(
            "SELECT position, stream, data::text FROM streams.replay(stream => $1, after => 0, max_events => 1000000)",
            &[&pattern],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// JetStream holds exactly the committed events: each once, in position
/// order (sequence order is position order, overall and so per subject),
/// under its stream's subject and its own message id, with its data.
fn assert_exactly_the_committed(stored: &[Stored], committed: &[(i64, String, String)], log_id: &str, what: &str) {
    let positions: Vec<i64> = stored.iter().map(|m| m.position).collect();
    let expected: Vec<i64> = committed.iter().map(|e| e.0).collect();
    assert!(stored.windows(2).all(|w| w[0].sequence < w[1].sequence), "{what}: read in sequence order");
    if positions != expected {
        let mut seen = std::collections::HashSet::new();
        let dup = positions.iter().find(|p| !seen.insert(**p));
        let missing = expected.iter().find(|p| !positions.contains(p));
        let disorder = positions.windows(2).find(|w| w[0] >= w[1]);
        panic!(
            "{what}: JetStream holds {} messages for {} committed events; first duplicate {dup:?}, first missing \
             {missing:?}, first out of order {disorder:?}",
            positions.len(),
            expected.len()
        );
    }
    for (m, (position, stream, data)) in stored.iter().zip(committed) {
        assert_eq!(&m.subject, stream, "{what}: subject of {position}");
        assert_eq!(m.msg_id, format!("{log_id}:{position}"), "{what}: message id of {position}: {:?}", m.headers);
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&m.payload).unwrap(),
            serde_json::from_str::<serde_json::Value>(data).unwrap(),
            "{what}: data of {position}"
        );
        assert!(!m.payload.contains("ROLLBACK"), "{what}: a rolled-back event reached JetStream");
    }
}

fn log_id(client: &mut Client) -> String {
    client.query_one("SELECT streams.log_id()::text", &[]).unwrap().get(0)
}

/// Wait until JetStream stream `stream` holds `count` messages (or more: the
/// assertions after say what is wrong).
fn wait_for_stored(nats: &Nats, stream: &str, count: usize, what: &str, bridge: &Bridge) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let held = nats.count(stream);
        if held >= count as u64 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: JetStream holds {held} of {count}; bridge log:\n{}",
            bridge.log_text()
        );
        thread::sleep(Duration::from_millis(200));
    }
}

/// The issue's main case: 6 writers, a fifth rolled back, and in the middle
/// the bridge killed with SIGKILL, nats-server killed and restarted on its
/// store, and PostgreSQL stopped with `-m immediate` and started.
#[test]
fn every_committed_event_reaches_jetstream_once_in_order_through_three_crashes() {
    let cluster = ScratchCluster::start(
        "bridge",
        &["shared_preload_libraries = 'litebase_streams'", "track_commit_timestamp = on", "fsync = off"],
    );
    cluster.connect("postgres").batch_execute("CREATE DATABASE app").unwrap();
    cluster.connect("app").batch_execute("CREATE EXTENSION litebase_streams").unwrap();
    cluster.wait_for_worker("app");
    let mut nats = Nats::start();
    let url = format!("host=127.0.0.1 port={} user=postgres dbname=app", cluster.port);
    let mut bridge = Bridge::start(&url, &nats.urls(), &["--pattern", "orders.*", "--start", "beginning"]);
    let streams = ["orders.w1", "orders.w2", "orders.w3", "orders.w4", "orders.w5", "orders.w6"];
    let writers = Writers::start(cluster.config("app"), &streams, 20_000 / streams.len());
    let mut admin = cluster.connect("app");
    let published =
        |admin: &mut Client| -> i64 { admin.query_one("SELECT count(*) FROM streams.events", &[]).unwrap().get(0) };

    wait_until("2,000 events committed", Duration::from_secs(120), || published(&mut admin) >= 2_000);
    bridge.restart();
    wait_until("5,000 events committed", Duration::from_secs(120), || published(&mut admin) >= 5_000);
    nats.servers[0].kill();
    wait_until("the bridge notices NATS is gone", Duration::from_secs(30), || {
        bridge.metric("litebase_streams_bridge_up{target=\"nats\"}") == 0.0
    });
    nats.servers[0].start();
    wait_until("8,000 events committed", Duration::from_secs(120), || published(&mut admin) >= 8_000);
    cluster.restart("immediate");
    writers.join();

    let mut admin = cluster.connect("app");
    let committed = committed(&mut admin, "orders.*");
    assert!(committed.len() > 12_000, "about 16,000 of 20,000 transactions commit, got {}", committed.len());
    wait_for_stored(&nats, JS_STREAM, committed.len(), "after three crashes", &bridge);
    let stored = nats.messages(JS_STREAM);
    assert_exactly_the_committed(&stored, &committed, &log_id(&mut admin), "after three crashes");
}

/// A JetStream cluster of three with replicas 3: the stream's leader is
/// killed mid-run; nothing is lost or stored twice. Meanwhile two bridges
/// share one subscription (ordered: one holds it, the other waits) and a
/// third bridges a disjoint pattern into a JetStream stream of its own.
#[test]
fn a_three_node_jetstream_cluster_loses_and_duplicates_nothing_when_the_stream_leader_dies() {
    let db = TestDb::new();
    let mut nats = Nats::cluster();
    let orders = ["--pattern", "orders.*", "--start", "beginning", "--replicas", "3", "--ack-timeout-ms", "2000"];
    let bridge = Bridge::start(&dsn(&db.name, "postgres"), &nats.urls(), &orders);
    let mut twin = Bridge::start(&dsn(&db.name, "postgres"), &nats.urls(), &orders);
    let mut payments = Bridge::start(
        &dsn(&db.name, "postgres"),
        &nats.urls(),
        &[
            "--pattern",
            "payments.*",
            "--subscription",
            "payments_bridge",
            "--jetstream-stream",
            "PAYMENTS",
            "--start",
            "beginning",
            "--replicas",
            "3",
            "--ack-timeout-ms",
            "2000",
        ],
    );
    let streams = ["orders.a", "orders.b", "orders.c", "payments.a"];
    let writers = Writers::start(db.config(), &streams, 2_500);
    let mut admin = db.connect();
    wait_until("JetStream stored 1,000 orders", Duration::from_secs(120), || nats.count(JS_STREAM) >= 1_000);
    let leader = nats.leader_of(JS_STREAM).expect("the stream has a leader");
    nats.servers[leader].kill();
    writers.join();
    let log_id = log_id(&mut admin);
    for (js_stream, pattern) in [(JS_STREAM, "orders.*"), ("PAYMENTS", "payments.*")] {
        let committed = committed(&mut admin, pattern);
        wait_for_stored(&nats, js_stream, committed.len(), "after the leader died", &bridge);
        let stored = nats.messages(js_stream);
        assert_exactly_the_committed(&stored, &committed, &log_id, &format!("{js_stream} after the leader died"));
    }
    assert!(twin.exited().is_none() && payments.exited().is_none(), "{}", twin.log_text());
}

/// NATS down while 20 MB of events are published: the bridge reads no more
/// than its in-flight bound (its memory stays flat, the subscription's lag
/// shows the backlog), and it catches up once NATS is back.
#[test]
fn while_nats_is_down_the_bridge_holds_its_memory_and_catches_up_after() {
    let db = TestDb::new();
    let mut nats = Nats::start();
    let bound = 1024 * 1024;
    let bridge = Bridge::start(
        &dsn(&db.name, "postgres"),
        &nats.urls(),
        &["--pattern", "big.*", "--start", "beginning", "--max-in-flight-bytes", &bound.to_string()],
    );
    let mut admin = db.connect();
    let publish = |admin: &mut Client, count: i32| {
        admin
            .execute(
                "SELECT streams.publish('big.blob', jsonb_build_object('i', g, 'pad', repeat('x', 64 * 1024))) \
                 FROM generate_series(1, $1) g",
                &[&count],
            )
            .unwrap();
    };
    publish(&mut admin, 20);
    wait_until("the first events are bridged", Duration::from_secs(30), || {
        bridge.metric("litebase_streams_bridge_events_total") >= 20.0
    });
    let before = bridge.memory_kb("VmRSS");

    nats.servers[0].kill();
    let down = Instant::now();
    for _ in 0..10 {
        publish(&mut admin, 30);
    }
    // Ten seconds down, watching: the bridge never holds more than its bound.
    let mut peak = 0;
    let mut peak_in_flight = 0.0f64;
    while down.elapsed() < Duration::from_secs(10) {
        peak = peak.max(bridge.memory_kb("VmRSS"));
        peak_in_flight = peak_in_flight.max(bridge.metric("litebase_streams_bridge_in_flight_bytes"));
        thread::sleep(Duration::from_millis(100));
    }
    wait_until("the lag shows the backlog", Duration::from_secs(10), || {
        bridge.metric("litebase_streams_bridge_lag_events") >= 250.0
    });
    assert!(
        peak_in_flight <= (bound + 70 * 1024) as f64,
        "in flight {peak_in_flight} bytes with a bound of {bound} (one event may overshoot it)"
    );
    // 19 MB were published; a bridge that kept reading would hold them.
    assert!(peak < before + 8 * 1024, "VmRSS went from {before} kB to {peak} kB while NATS was down");
    wait_until("/healthz says NATS is down", Duration::from_secs(10), || {
        bridge.get("/healthz") == (503, r#"{"database":"up","nats":"down"}"#.to_owned())
    });

    nats.servers[0].start();
    wait_until("/healthz is 200 again", Duration::from_secs(30), || bridge.get("/healthz").0 == 200);
    let committed = committed(&mut admin, "big.*");
    wait_for_stored(&nats, JS_STREAM, committed.len(), "after NATS came back", &bridge);
    let stored = nats.messages(JS_STREAM);
    assert_exactly_the_committed(&stored, &committed, &log_id(&mut admin), "after NATS came back");
    assert!(bridge.metric("litebase_streams_bridge_reconnects_total{target=\"nats\"}") >= 1.0);
}

/// The bridge's role reads only what its grants allow: a private stream
/// inside them goes through with its data, one outside them does not go
/// through at all (the bridge refuses to start, 42501), and headers a
/// publisher sets cannot steer JetStream (`Nats-*`).
#[test]
fn the_bridge_reads_only_what_its_role_may_read_and_publishers_cannot_steer_jetstream() {
    let db = TestDb::new();
    let role = TestRole::new(&db, "bridge", "");
    let mut admin = db.connect();
    admin
        .batch_execute(&format!(
            "SELECT streams.grant('read', 'orders.*', '{0}'); SELECT streams.set_private('orders.vip'); \
             SELECT streams.set_private('secret.*');",
            role.name
        ))
        .unwrap();
    let nats = Nats::start();
    let bridge =
        Bridge::start(&dsn(&db.name, &role.name), &nats.urls(), &["--pattern", "orders.*", "--start", "beginning"]);
    admin
        .batch_execute(
            r#"SELECT streams.publish('orders.eu', '{"o":1}');
               SELECT streams.publish('secret.keys', '{"key":"hunter2"}');
               SELECT streams.publish('orders.vip', '{"o":2,"card":"4242"}');
               SELECT streams.publish('orders.eu', '{"o":3}', headers => '{"Nats-Expected-Last-Sequence":"1","Nats-Msg-Id":"forged","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}');
               SELECT streams.publish('orders.us', '{"o":4}');"#,
        )
        .unwrap();
    let committed = committed(&mut admin, "orders.*");
    assert_eq!(committed.len(), 4);
    wait_for_stored(&nats, JS_STREAM, 4, "orders", &bridge);
    let stored = nats.messages(JS_STREAM);
    assert_exactly_the_committed(&stored, &committed, &log_id(&mut admin), "the role's streams");
    assert!(stored.iter().all(|m| !m.payload.contains("hunter2")));
    assert!(stored.iter().any(|m| m.payload.contains("4242")), "the private stream the role may read goes through");
    let with_headers = &stored[2];
    assert_eq!(with_headers.header("traceparent"), Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
    assert_eq!(with_headers.header("Nats-Expected-Last-Sequence"), None);
    assert!(with_headers.header("Litebase-Headers").unwrap().contains("forged"), "every header is kept");

    // A bridge for streams the role may not read does not start.
    let mut denied = Bridge::start(
        &dsn(&db.name, &role.name),
        &nats.urls(),
        &[
            "--pattern",
            "secret.*",
            "--subscription",
            "secrets",
            "--jetstream-stream",
            "SECRETS",
            "--start",
            "beginning",
        ],
    );
    wait_until("the bridge for secret.* exits", Duration::from_secs(30), || denied.exited().is_some());
    assert!(!denied.exited().unwrap().success());
    assert!(denied.log_text().contains("42501"), "{}", denied.log_text());
    assert!(nats.messages("SECRETS").is_empty());
}
