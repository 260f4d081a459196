//! consume: every event's effect exactly once, with three consumers through
//! PgBouncer in transaction pooling mode, failing handlers and a consumer
//! killed mid-batch.
#![cfg(feature = "integration")]

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::pgbouncer::Pgbouncer;
use common::{wait_until, TestDb};
use litebase_streams_client::{consume, publish_batch, ConsumeOptions, ConsumeReport, HandlerError, PublishOptions};
use serde_json::json;
use tokio::sync::{oneshot, Notify};

const EVENTS: i64 = 300;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_consumers_through_pgbouncer_apply_every_event_once() {
    let db = TestDb::new().await;
    let bouncer = Pgbouncer::start().await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE TABLE effects (position bigint NOT NULL, consumer int NOT NULL);
             SELECT streams.create_subscription('work', 'job.*', after => 0, key => 'account');",
        )
        .await
        .unwrap();

    // 10% of the events fail once, after writing their effect (which the
    // savepoint must take back).
    let failed_once: Arc<Mutex<HashSet<i64>>> = Arc::default();
    // Consumer 2 stops in the middle of a batch: its backend is terminated then.
    let stuck_backend: Arc<Mutex<Option<i32>>> = Arc::default();
    let stuck = Arc::new(Notify::new());

    let mut stops = Vec::new();
    let mut consumers = Vec::new();
    for consumer in 0..3 {
        let (stop, stopped) = oneshot::channel::<()>();
        stops.push(stop);
        let (failed_once, stuck_backend, stuck) = (failed_once.clone(), stuck_backend.clone(), stuck.clone());
        let handled = Arc::new(Mutex::new(0u32));
        let config = bouncer.config(&db.name);
        let options = ConsumeOptions { max_events: 10, wait: Duration::from_millis(500), ..Default::default() }.until(
            async move {
                let _ = stopped.await;
            },
        );
        consumers.push(tokio::spawn(async move {
            consume(
                config,
                "work",
                move |tx, event| {
                    let (failed_once, stuck_backend, stuck, handled) =
                        (failed_once.clone(), stuck_backend.clone(), stuck.clone(), handled.clone());
                    Box::pin(async move {
                        tx.execute("INSERT INTO effects VALUES ($1, $2)", &[&event.position, &consumer]).await?;
                        if event.position % 10 == 3 && failed_once.lock().unwrap().insert(event.position) {
                            return Err(HandlerError::from(format!("event {} fails once", event.position)));
                        }
                        let count = {
                            let mut handled = handled.lock().unwrap();
                            *handled += 1;
                            *handled
                        };
                        if consumer == 2 && count == 5 {
                            let pid: i32 = tx.query_one("SELECT pg_backend_pid()", &[]).await?.get(0);
                            *stuck_backend.lock().unwrap() = Some(pid);
                            stuck.notify_one();
                            std::future::pending::<()>().await;
                        }
                        Ok(())
                    })
                },
                options,
            )
            .await
        }));
    }

    // Publish while they run: 8 accounts.
    for chunk in 0..(EVENTS / 30) {
        let data: Vec<_> = (0..30).map(|i| json!({"account": format!("acc{}", (chunk * 30 + i) % 8)})).collect();
        publish_batch(&client, &format!("job.{}", chunk % 3), &data, PublishOptions::default()).await.unwrap();
    }

    // Consumer 2 is dropped mid-batch: its task aborted, its backend terminated.
    // (The backend first: a client leaving pgbouncer mid-transaction makes it
    // close the server connection itself.)
    stuck.notified().await;
    let pid = stuck_backend.lock().unwrap().expect("consumer 2 noted its backend");
    let killed: bool = client.query_one("SELECT pg_terminate_backend($1)", &[&pid]).await.unwrap().get(0);
    assert!(killed);
    consumers[2].abort();

    wait_until("every event has its effect", Duration::from_secs(90), || async {
        let n: i64 = client.query_one("SELECT count(DISTINCT position) FROM effects", &[]).await.unwrap().get(0);
        n == EVENTS
    })
    .await;
    let mut reports = Vec::new();
    for (i, (stop, consumer)) in stops.into_iter().zip(consumers).enumerate() {
        let _ = stop.send(());
        match consumer.await {
            Ok(report) => reports.push(report.expect("consume ends cleanly")),
            Err(e) => assert!(i == 2 && e.is_cancelled(), "consumer {i}: {e}"),
        }
    }
    let row = client
        .query_one(
            "SELECT count(*), count(DISTINCT position), min(position), max(position),
                    count(DISTINCT consumer) FILTER (WHERE consumer <> 2)
             FROM effects",
            &[],
        )
        .await
        .unwrap();
    let (rows, distinct): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!((rows, distinct), (EVENTS, EVENTS), "each event's effect exactly once");
    assert_eq!((row.get::<_, i64>(2), row.get::<_, i64>(3)), (1, EVENTS));
    assert_eq!(row.get::<_, i64>(4), 2, "both remaining consumers did work");
    // Every tenth event failed once (and then succeeded: its effect is there once).
    assert_eq!(failed_once.lock().unwrap().len() as i64, EVENTS / 10);
    let failed: u64 = reports.iter().map(|r: &ConsumeReport| r.failed).sum();
    assert!(failed > 0 && failed <= (EVENTS / 10) as u64, "the survivors' nacks: {failed}");
    let pending: i64 =
        client.query_one("SELECT pending FROM streams.subscriptions WHERE name = 'work'", &[]).await.unwrap().get(0);
    assert_eq!(pending, 0);
    let parked: i64 = client.query_one("SELECT count(*) FROM streams.dead_letters", &[]).await.unwrap().get(0);
    assert_eq!(parked, 0);
    let reasons: i64 = client
        .query_one("SELECT count(*) FROM streams.subscriptions WHERE name = 'work' AND retrying = 0", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(reasons, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_a_waiting_poll_at_once_and_a_failure_is_nacked_with_its_text() {
    let db = TestDb::new().await;
    let client = db.client().await;
    client
        .batch_execute(
            "SELECT streams.create_subscription('mail', 'mail', after => 0, max_attempts => 1);
             SELECT streams.publish('mail', '{\"to\": \"nobody\"}');",
        )
        .await
        .unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let options = ConsumeOptions { wait: Duration::from_secs(60), ..Default::default() }.until(async move {
        let _ = stopped.await;
    });
    let consumer = tokio::spawn(consume(
        db.config(),
        "mail",
        |_tx, event| {
            let position = event.position;
            Box::pin(async move { Err(HandlerError::from(format!("no mailbox for event {position}"))) })
        },
        options,
    ));
    // The failure is parked (max_attempts 1) with the handler's text as its reason.
    wait_until("the failure is a dead letter", Duration::from_secs(20), || async {
        let rows = client.query("SELECT last_error FROM streams.dead_letters", &[]).await.unwrap();
        rows.first().is_some_and(|r| r.get::<_, Option<String>>(0).as_deref() == Some("no mailbox for event 1"))
    })
    .await;
    // Now it waits in a 60 s poll: shutdown ends it at once.
    let asked = std::time::Instant::now();
    stop.send(()).unwrap();
    let report = tokio::time::timeout(Duration::from_secs(5), consumer).await.expect("ends promptly").unwrap().unwrap();
    assert!(asked.elapsed() < Duration::from_secs(5));
    assert_eq!(report, ConsumeReport { processed: 0, failed: 1 });
}
