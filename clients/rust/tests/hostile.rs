//! Hostile review: what a publisher, or any role that can connect, can do
//! to a subscriber or a consumer. Each test failed before its fix.
#![cfg(feature = "integration")]

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{publish, wait_until, TestDb};
use futures_util::StreamExt;
use litebase_streams_client::{consume, subscribe, ConsumeOptions, Event, SubscribeOptions, TestHooks};
use serde_json::Value;

/// Deeper than serde_json parses (128 levels), well within jsonb's limit.
fn deep() -> String {
    format!("{}{}", "[".repeat(3000), "]".repeat(3000))
}

/// A publisher's event nested deeper than serde_json parses used to end
/// every subscription of the stream with a decode error, again at each
/// restart from the saved cursor (a poison pill). Now its data arrives as
/// a JSON string of its text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeply_nested_data_does_not_end_a_subscription() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let first = publish(&client, "orders", &deep()).await;
    let mut events = subscribe(db.config(), "orders", SubscribeOptions::default());
    let next = publish(&client, "orders", r#"{"n": 2}"#).await;
    let live = publish(&client, "orders", &deep()).await;
    let mut got: Vec<Event> = Vec::new();
    while got.len() < 3 {
        let event = tokio::time::timeout(Duration::from_secs(20), events.next())
            .await
            .expect("events come")
            .expect("the subscription goes on")
            .expect("no error");
        got.push(event);
    }
    assert_eq!(got.iter().map(|e| e.position).collect::<Vec<_>>(), vec![first, next, live]);
    for event in [&got[0], &got[2]] {
        let Value::String(text) = &event.data else { panic!("the JSON text: {:?}", event.data) };
        assert_eq!(text.replace(' ', ""), deep());
    }
    assert_eq!(got[1].data["n"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeply_nested_data_does_not_stop_a_consumer() {
    let db = TestDb::new().await;
    let client = db.client().await;
    client.batch_execute("SELECT streams.create_subscription('deep', 'orders')").await.unwrap();
    let position = publish(&client, "orders", &deep()).await;
    client.execute("SELECT streams.wait($1, '10s')", &[&position]).await.unwrap();
    let seen: Arc<Mutex<Vec<Event>>> = Arc::default();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let stop = Arc::new(Mutex::new(Some(stop)));
    let options = ConsumeOptions { wait: Duration::from_millis(200), ..Default::default() }.until(async move {
        let _ = stopped.await;
    });
    let handler_seen = seen.clone();
    let report = tokio::time::timeout(
        Duration::from_secs(30),
        consume(
            db.config(),
            "deep",
            move |_tx, event| {
                handler_seen.lock().unwrap().push(event.clone());
                if let Some(stop) = stop.lock().unwrap().take() {
                    let _ = stop.send(());
                }
                Box::pin(async { Ok(()) })
            },
            options,
        ),
    )
    .await
    .expect("consume returns")
    .expect("no error");
    assert_eq!(report.processed, 1);
    assert!(matches!(&seen.lock().unwrap()[0].data, Value::String(_)));
}

/// A handler that ignores an SQL error of its own leaves its savepoint
/// aborted: that used to end `consume` with 25P02 at that event, every time
/// it was started again. Now the event is nacked like any failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_swallows_an_sql_error_is_a_failure_not_the_end() {
    let db = TestDb::new().await;
    let client = db.client().await;
    client.batch_execute("SELECT streams.create_subscription('swallow', 'orders')").await.unwrap();
    let bad = publish(&client, "orders", r#"{"bad": true}"#).await;
    client.execute("SELECT streams.wait($1, '10s')", &[&bad]).await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let stop = Arc::new(Mutex::new(Some(stop)));
    let options = ConsumeOptions { wait: Duration::from_millis(200), ..Default::default() }.until(async move {
        let _ = stopped.await;
    });
    let report = tokio::time::timeout(
        Duration::from_secs(30),
        consume(
            db.config(),
            "swallow",
            move |tx, _event| {
                let stop = stop.clone();
                Box::pin(async move {
                    let _ = tx.batch_execute("SELECT 1/0").await; // ignored
                    if let Some(stop) = stop.lock().unwrap().take() {
                        let _ = stop.send(());
                    }
                    Ok(())
                })
            },
            options,
        ),
    )
    .await
    .expect("consume returns")
    .expect("no error");
    assert_eq!((report.processed, report.failed), (0, 1));
}

/// Each batch of forged notifications used to cost a read of the worker's
/// pid and a replay: a role that can connect turned each pg_notify into
/// two queries of every subscriber. Now forced replays (and pid re-reads)
/// are at most one per poll interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_forged_notifications_costs_a_bounded_number_of_queries() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let queries = Arc::new(AtomicU64::new(0));
    let options = SubscribeOptions {
        poll_interval: Duration::from_millis(200),
        test_hooks: TestHooks { queries: Some(queries.clone()), ..Default::default() },
        ..Default::default()
    };
    let mut events = subscribe(db.config(), "orders", options);
    let first = publish(&client, "orders", r#"{"n": 1}"#).await;
    let event = tokio::time::timeout(Duration::from_secs(20), events.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(event.position, first);
    let collected: Arc<Mutex<Vec<i64>>> = Arc::default();
    let sink = collected.clone();
    let reader = tokio::spawn(async move {
        while let Some(Ok(event)) = events.next().await {
            sink.lock().unwrap().push(event.position);
        }
    });
    let before = queries.load(Ordering::SeqCst);
    for i in 0..300 {
        // One notification per transaction: a batch each.
        let payload = format!(r#"{{"position":{},"stream":"orders","prev":{first}}}"#, first + 1 + i);
        client.execute("SELECT pg_notify('orders', $1)", &[&payload]).await.unwrap();
    }
    let marker = publish(&client, "orders", r#"{"n": 2}"#).await;
    wait_until("the event after the flood", Duration::from_secs(20), || async {
        collected.lock().unwrap().last() == Some(&marker)
    })
    .await;
    let spent = queries.load(Ordering::SeqCst) - before;
    assert!(spent < 40, "{spent} queries for 300 forged notifications");
    assert_eq!(*collected.lock().unwrap(), vec![marker]);
    reader.abort();
}
