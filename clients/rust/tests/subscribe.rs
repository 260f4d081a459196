//! subscribe: every committed event exactly once, in position order, across
//! the faults the client rule exists for.
#![cfg(feature = "integration")]

mod common;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{publish, wait_until, TestDb};
use futures_util::StreamExt;
use litebase_streams_client::{subscribe, Cursor, Error, Event, SubscribeOptions, Subscription, TestHooks};
use serde_json::{json, Value};

/// The events a subscription hands out, collected by a task.
struct Collected {
    events: Arc<Mutex<Vec<Event>>>,
    errors: Arc<Mutex<Vec<Error>>>,
    task: tokio::task::JoinHandle<()>,
}

fn collect(mut subscription: Subscription) -> Collected {
    let events = Arc::new(Mutex::new(Vec::new()));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let (e, r) = (events.clone(), errors.clone());
    let task = tokio::spawn(async move {
        while let Some(item) = subscription.next().await {
            match item {
                Ok(event) => e.lock().unwrap().push(event),
                Err(error) => r.lock().unwrap().push(error),
            }
        }
    });
    Collected { events, errors, task }
}

impl Collected {
    async fn wait_for(&self, what: &str, position: i64) {
        wait_until(what, Duration::from_secs(30), || async {
            assert!(self.errors.lock().unwrap().is_empty(), "errors: {:?}", self.errors.lock().unwrap());
            self.events.lock().unwrap().last().is_some_and(|e| e.position >= position)
        })
        .await;
    }

    fn positions_and_data(&self) -> Vec<(i64, String)> {
        self.events.lock().unwrap().iter().map(|e| (e.position, summary(&e.data))).collect()
    }
}

impl Drop for Collected {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What `published` says, in order: (position, data).
fn expected(published: &[(i64, Value)]) -> Vec<(i64, String)> {
    published.iter().map(|(p, data)| (*p, summary(data))).collect()
}

/// The data as JSON text, long texts cut (with their length and a checksum).
fn summary(data: &Value) -> String {
    let text = data.to_string();
    if text.len() <= 80 {
        return text;
    }
    let sum = text.bytes().fold(0u64, |a, b| a.wrapping_mul(31).wrapping_add(b as u64));
    format!("{}... ({} bytes, sum {sum})", &text[..40], text.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_stream_exactly_once_in_order_across_faults() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let mut published = Vec::new();

    // Events before the subscription: the catch-up replays them.
    for i in 0..3 {
        let data = json!({"n": i});
        published.push((publish(&client, "orders", &data.to_string()).await, data));
    }
    publish(&client, "other", r#"{"not":"mine"}"#).await;

    let lost = Arc::new(AtomicI64::new(-1));
    let hook_lost = lost.clone();
    let options = SubscribeOptions {
        // A replay timer far away: gaps must be found by `prev`, not by the timer.
        poll_interval: Duration::from_secs(600),
        test_hooks: TestHooks {
            lose_notification: Some(Arc::new(move |position| hook_lost.load(Ordering::SeqCst) == position)),
            ..Default::default()
        },
        ..Default::default()
    };
    let got = collect(subscribe(db.named("lbs-rs-subscriber"), "orders", options));
    got.wait_for("the catch-up", published.last().unwrap().0).await;

    // Live: an ordinary event.
    let data = json!({"n": "live"});
    published.push((publish(&client, "orders", &data.to_string()).await, data));

    // A truncated one (over 8000 bytes: no data in the notification).
    let big = json!({"big": "x".repeat(9000)});
    published.push((publish(&client, "orders", &big.to_string()).await, big));

    // A private one.
    client.execute("SELECT streams.set_private('orders')", &[]).await.unwrap();
    let secret = json!({"secret": 1});
    published.push((publish(&client, "orders", &secret.to_string()).await, secret));
    client.execute("SELECT streams.set_private('orders', false)", &[]).await.unwrap();
    got.wait_for("live, truncated and private events", published.last().unwrap().0).await;

    // A forged notification, claiming the next position with other data.
    let last = published.last().unwrap().0;
    let forged = json!({"position": last + 1, "stream": "orders", "time": "2026-12-03T18:50:10.123456Z",
                        "tx": 1, "prev": last, "data": {"forged": true}});
    client.execute("SELECT pg_notify('orders', $1)", &[&forged.to_string()]).await.unwrap();
    let data = json!({"n": "after forged"});
    published.push((publish(&client, "orders", &data.to_string()).await, data));
    got.wait_for("the event after the forged notification", published.last().unwrap().0).await;

    // A worker restart.
    let old_worker = db.worker_pid().await;
    client.execute("SELECT pg_terminate_backend(streams.worker_pid())", &[]).await.unwrap();
    wait_until("a new worker", Duration::from_secs(20), || async { db.worker_pid().await != old_worker }).await;
    let data = json!({"n": "new worker"});
    published.push((publish(&client, "orders", &data.to_string()).await, data));
    got.wait_for("the new worker's event", published.last().unwrap().0).await;

    // A cut connection: events published meanwhile come with the catch-up.
    assert_eq!(db.terminate("lbs-rs-subscriber").await, 1, "the subscriber's one backend");
    for i in 0..3 {
        let data = json!({"n": format!("while cut {i}")});
        published.push((publish(&client, "orders", &data.to_string()).await, data));
    }
    got.wait_for("the events after the cut", published.last().unwrap().0).await;

    // A lost notification: the next event's prev shows the gap.
    let next = client.query_one("SELECT streams.horizon() + 1", &[]).await.unwrap().get::<_, i64>(0);
    lost.store(next, Ordering::SeqCst);
    let data = json!({"n": "lost"});
    let position = publish(&client, "orders", &data.to_string()).await;
    assert_eq!(position, next, "nothing else publishes in this database");
    published.push((position, data));
    let data = json!({"n": "after the gap"});
    published.push((publish(&client, "orders", &data.to_string()).await, data));
    got.wait_for("the events around the gap", published.last().unwrap().0).await;

    assert_eq!(got.positions_and_data(), expected(&published));
    let events = got.events.lock().unwrap().clone();
    assert!(events.iter().all(|e| e.stream == "orders" && e.tx > 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pattern_gets_its_streams_new_ones_too_and_nothing_else() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let mut published = Vec::new();
    let data = json!({"at": "start"});
    published.push((publish(&client, "order.eu.failed", &data.to_string()).await, data));
    publish(&client, "order.eu.ok", "{}").await;

    let lost = Arc::new(AtomicI64::new(-1));
    let hook_lost = lost.clone();
    let options = SubscribeOptions {
        poll_interval: Duration::from_millis(200),
        test_hooks: TestHooks {
            lose_notification: Some(Arc::new(move |position| hook_lost.load(Ordering::SeqCst) == position)),
            ..Default::default()
        },
        ..Default::default()
    };
    let got = collect(subscribe(db.named("lbs-rs-pattern"), "order.*.failed", options));
    got.wait_for("the catch-up", published[0].0).await;

    // A stream the pattern had not met, one it had, others it does not select.
    for (stream, n) in [("order.us.failed", 1), ("order.eu.failed", 2), ("order.eu.x.failed", 0), ("order.us.ok", 0)] {
        let data = json!({"n": n});
        let position = publish(&client, stream, &data.to_string()).await;
        if n > 0 {
            published.push((position, data));
        }
    }
    // A forged notification on one of its channels.
    client
        .execute(
            "SELECT pg_notify('order.eu.failed', $1)",
            &[&r#"{"position":999,"stream":"order.eu.failed","time":"2026-12-03T18:50:10.123456Z","tx":1,"prev":0,"data":{"forged":true}}"#],
        )
        .await
        .unwrap();
    // A lost notification, and a truncated event.
    let next = client.query_one("SELECT streams.horizon() + 1", &[]).await.unwrap().get::<_, i64>(0);
    lost.store(next, Ordering::SeqCst);
    let big = json!({"big": "y".repeat(9000)});
    published.push((publish(&client, "order.us.failed", &big.to_string()).await, big));
    got.wait_for("the live events", published.last().unwrap().0).await;

    // A cut connection.
    assert_eq!(db.terminate("lbs-rs-pattern").await, 1);
    let data = json!({"n": 3});
    published.push((publish(&client, "order.xx.failed", &data.to_string()).await, data));
    got.wait_for("the event after the cut", published.last().unwrap().0).await;

    assert_eq!(got.positions_and_data(), expected(&published));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_apply_on_every_path() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let pub_typed = |t: &'static str, data: Value| {
        let client = &client;
        async move {
            client
                .query_one("SELECT streams.publish('pay', $1::text::jsonb, type => $2)", &[&data.to_string(), &t])
                .await
                .unwrap()
                .get::<_, i64>(0)
        }
    };
    let first = pub_typed("paid", json!({"cur": "EUR", "n": 1})).await;
    pub_typed("paid", json!({"cur": "USD"})).await;
    pub_typed("refund", json!({"cur": "EUR"})).await;
    let options = SubscribeOptions {
        types: Some(vec!["paid".into()]),
        filter: Some(json!({"cur": "EUR"})),
        ..Default::default()
    };
    let got = collect(subscribe(db.config(), "pay", options));
    got.wait_for("the catch-up", first).await;
    pub_typed("paid", json!({"cur": "USD"})).await;
    pub_typed("refund", json!({"cur": "EUR"})).await;
    let last = pub_typed("paid", json!({"cur": "EUR", "n": 2})).await;
    got.wait_for("the live event", last).await;
    let events = got.events.lock().unwrap().clone();
    assert_eq!(events.iter().map(|e| e.position).collect::<Vec<_>>(), vec![first, last]);
    assert!(events.iter().all(|e| e.event_type.as_deref() == Some("paid")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_log_ends_the_subscription_with_log_changed() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let position = publish(&client, "orders", "{}").await;
    let mut subscription = subscribe(db.config(), "orders", SubscribeOptions::default());
    let event = subscription.next().await.unwrap().unwrap();
    assert_eq!(event.position, position);
    let cursor: Cursor = subscription.cursor().cloned().unwrap();
    assert_eq!(cursor.position, position);

    client.batch_execute("DROP EXTENSION litebase_streams CASCADE; CREATE EXTENSION litebase_streams").await.unwrap();
    db.worker_pid().await;
    let new_log: String = client.query_one("SELECT streams.log_id()::text", &[]).await.unwrap().get(0);
    assert_ne!(new_log, cursor.log_id);
    // Position 1 again, in the new log: never handed out as if it followed the old one.
    publish(&client, "orders", r#"{"new":"log"}"#).await;
    publish(&client, "orders", r#"{"new":"log"}"#).await;
    let item = tokio::time::timeout(Duration::from_secs(30), subscription.next()).await.expect("an answer");
    match item {
        Some(Err(Error::LogChanged { old, new })) => assert_eq!((old, new), (cursor.log_id.clone(), new_log.clone())),
        other => panic!("expected LogChanged, got {other:?}"),
    }
    assert!(subscription.next().await.is_none(), "the stream ends after it");

    // Resuming from the old cursor says so at once; from the new log's start it works.
    let mut old = subscribe(db.config(), "orders", SubscribeOptions { after: Some(cursor), ..Default::default() });
    assert!(matches!(old.next().await, Some(Err(Error::LogChanged { .. }))));
    let mut fresh = subscribe(
        db.config(),
        "orders",
        SubscribeOptions { after: Some(Cursor::start_of(new_log)), ..Default::default() },
    );
    assert_eq!(fresh.next().await.unwrap().unwrap().data, json!({"new": "log"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_and_missing_privileges_are_errors_with_their_sqlstate() {
    let db = TestDb::new().await;
    let mut bad = subscribe(db.config(), "order.*x", SubscribeOptions::default());
    let e = bad.next().await.unwrap().unwrap_err();
    assert_eq!(e.sqlstate(), Some("22023"));
    assert!(bad.next().await.is_none());

    let client = db.client().await;
    let role = format!("{}_reader", db.name);
    client.batch_execute(&format!("CREATE ROLE {role} LOGIN")).await.unwrap();
    let mut config = db.config();
    config.user(&role);
    let mut denied = subscribe(config, "orders", SubscribeOptions::default());
    let e = denied.next().await.unwrap().unwrap_err();
    assert!(matches!(e, Error::PermissionDenied(_)), "{e:?}");
    assert_eq!(e.sqlstate(), Some("42501"));
    drop(denied);
    let _ = client.batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}")).await;
}
