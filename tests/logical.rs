//! Feeding a distributed log: events leave through PostgreSQL logical
//! decoding, read by a real consumer (`pg_recvlogical` with the `wal2json`
//! output plugin, as Debezium or a Kafka Connect source would read them).
//! Every committed event arrives with its position, nothing rolled back
//! arrives, and across a consumer restart nothing is lost: the consumer may
//! see the last unacknowledged changes again, and drops them by position.
//!
//! Changes arrive in commit order, not position order. The worker's updates
//! of `streams.horizon_state` travel in the same stream, and each comes after
//! every event at or below its horizon (the worker commits after them): a
//! consumer that holds events back until the horizon passes them and then
//! releases them by position gets position order.
//!
//! A cluster of its own: logical decoding needs `wal_level = logical`.
#![cfg(feature = "integration")]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use common::*;

/// `pg_recvlogical --start` writing wal2json (format 2, one JSON document per
/// change) of the schema `streams` to `out`: the log's rows arrive as rows of
/// its partitions (`streams.event_log_<first position>`; wal2json names the
/// table a row is stored in, and tables can be listed only by name or as
/// `schema.*`).
/// pg_recvlogical, killed on drop (also when a test fails: it would
/// otherwise keep reconnecting to the stopped scratch server).
struct Consumer(Child);

impl Drop for Consumer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_consumer(cluster: &ScratchCluster, out: &Path) -> Consumer {
    let bindir = std::env::var("LITEBASE_STREAMS_PG_BINDIR").unwrap();
    let mut args = cluster.libpq_args();
    args.extend(
        [
            "-d",
            "app",
            "--slot",
            "events",
            "--start",
            "--status-interval",
            "1",
            "--fsync-interval",
            "1",
            "-o",
            "format-version=2",
            "-o",
            "add-tables=streams.*",
            "-o",
            "include-xids=1",
            "-f",
        ]
        .map(String::from),
    );
    args.push(out.to_str().unwrap().to_owned());
    Consumer(Command::new(format!("{bindir}/pg_recvlogical")).args(&args).spawn().expect("pg_recvlogical starts"))
}

/// A change the consumer read, in arrival order.
enum Change {
    Event { position: i64, stream: String },
    Horizon(i64),
}

fn changes(out: &Path) -> Vec<Change> {
    let mut found = Vec::new();
    for line in std::fs::read_to_string(out).unwrap_or_default().lines() {
        let Ok(change) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let column = |name: &str| change["columns"].as_array().unwrap().iter().find(|c| c["name"] == name).cloned();
        match (change["action"].as_str(), change["table"].as_str()) {
            (Some("I"), Some(table)) if table.starts_with("event_log_") => found.push(Change::Event {
                position: column("position").and_then(|c| c["value"].as_i64()).expect("a change carries its position"),
                stream: column("stream").and_then(|c| c["value"].as_str().map(str::to_owned)).unwrap(),
            }),
            (Some("I" | "U"), Some("horizon_state")) => {
                found.push(Change::Horizon(column("horizon").and_then(|c| c["value"].as_i64()).unwrap()))
            }
            _ => {}
        }
    }
    found
}

/// position -> (stream, how many times it arrived).
fn received(out: &Path) -> BTreeMap<i64, (String, usize)> {
    let mut events = BTreeMap::new();
    for change in changes(out) {
        if let Change::Event { position, stream } = change {
            events.entry(position).or_insert((stream, 0)).1 += 1;
        }
    }
    events
}

/// What a consumer that releases events once the horizon passes them, in
/// position order and once each, hands downstream.
fn released_in_position_order(changes: &[Change]) -> Vec<i64> {
    let (mut held, mut released) = (BTreeSet::new(), Vec::new());
    let mut last = 0;
    for change in changes {
        match change {
            Change::Event { position, .. } if *position > last => {
                held.insert(*position);
            }
            Change::Event { .. } => {}
            Change::Horizon(horizon) => {
                while let Some(&p) = held.first().filter(|&&p| p <= *horizon) {
                    held.remove(&p);
                    released.push(p);
                    last = p;
                }
            }
        }
    }
    released
}

#[test]
fn events_leave_through_logical_decoding_once_each_across_a_consumer_restart() {
    let cluster = ScratchCluster::start(
        "logical",
        &[
            "shared_preload_libraries = 'litebase_streams'",
            "track_commit_timestamp = on",
            "wal_level = logical",
            // This server build lets only listed libraries decode (its own hardening).
            "output_plugin_libraries = 'wal2json'",
            "max_replication_slots = 4",
            "max_wal_senders = 4",
            "fsync = off",
        ],
    );
    cluster.connect("postgres").batch_execute("CREATE DATABASE app").unwrap();
    let mut c = cluster.connect("app");
    c.batch_execute("CREATE EXTENSION litebase_streams").unwrap();
    cluster.wait_for_worker("app");
    c.batch_execute("SELECT pg_create_logical_replication_slot('events', 'wal2json')").unwrap();
    let out = std::env::temp_dir().join(format!("lbs-logical-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&out);

    let consumer = start_consumer(&cluster, &out);
    // Interleaved transactions: positions are taken in one order and
    // committed in another; one transaction rolls back.
    let mut first = cluster.connect("app");
    let mut second = cluster.connect("app");
    first.batch_execute("BEGIN; SELECT streams.publish('orders', '{\"n\":1}')").unwrap();
    second.batch_execute("BEGIN; SELECT streams.publish('payments', '{\"n\":2}')").unwrap();
    first.batch_execute("SELECT streams.publish('orders', '{\"n\":3}')").unwrap();
    second.batch_execute("COMMIT").unwrap();
    first.batch_execute("COMMIT").unwrap();
    c.batch_execute("BEGIN; SELECT streams.publish('orders', '{\"rolled\":\"back\"}'); ROLLBACK").unwrap();
    for i in 0..50 {
        publish(&mut c, if i % 2 == 0 { "orders" } else { "payments" }, "{}");
    }
    let halfway: i64 = c.query_one("SELECT max(position) FROM streams.event_log", &[]).unwrap().get(0);
    wait_until("the consumer receives the first half", Duration::from_secs(30), || {
        received(&out).contains_key(&halfway)
    });

    // The consumer stops (as a crash would) and comes back from the slot.
    drop(consumer);
    for i in 0..50 {
        publish(&mut c, if i % 2 == 0 { "orders" } else { "payments" }, "{}");
    }
    c.batch_execute("SELECT streams.publish_batch('bulk', ARRAY['{}', '{}', '{}']::jsonb[])").unwrap();
    let consumer = start_consumer(&cluster, &out);
    let committed: BTreeMap<i64, String> = c
        .query("SELECT position, stream FROM streams.event_log ORDER BY position", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let last = *committed.keys().last().unwrap();
    wait_until("the restarted consumer receives everything and a horizon past it", Duration::from_secs(30), || {
        released_in_position_order(&changes(&out)).last() == Some(&last)
    });
    drop(consumer);
    let got = received(&out);
    let arrived = changes(&out);
    let _ = std::fs::remove_file(&out);

    let got_streams: BTreeMap<i64, String> = got.iter().map(|(p, (s, _))| (*p, s.clone())).collect();
    assert_eq!(got_streams, committed, "every committed event arrives, with its position and stream");
    assert_eq!(committed.len(), 106, "the rolled-back event never existed");
    let positions: BTreeSet<i64> = got.keys().copied().collect();
    assert_eq!(positions.len(), got.len());
    let twice: Vec<i64> = got.iter().filter(|(_, (_, n))| *n > 1).map(|(p, _)| *p).collect();
    assert!(
        twice.iter().all(|p| *p <= halfway),
        "only changes from before the restart may arrive again (at-least-once), not {twice:?}"
    );
    // Commit order is not position order (the interleaved transactions)...
    let arrival: Vec<i64> = arrived
        .iter()
        .filter_map(|c| if let Change::Event { position, .. } = c { Some(*position) } else { None })
        .collect();
    assert!(arrival.windows(2).any(|w| w[0] > w[1]), "events arrive in commit order");
    // ...but every event arrives before a horizon that covers it, so holding
    // events back until the horizon passes them restores position order.
    let released = released_in_position_order(&arrived);
    let all: Vec<i64> = committed.keys().copied().collect();
    assert_eq!(released, all, "released by the horizon: every event once, in position order");
}
