//! `subscribe`: every event of a stream or pattern, exactly once and in
//! position order, from a cursor on, across worker restarts, lost
//! connections and re-created logs (which end it with
//! [`Error::LogChanged`]).
//!
//! A task of the subscription runs the client rule (docs/security.md) on a
//! connection of its own ([`session`]); the [`Subscription`] stream reads
//! what it hands out through a bounded channel, so a slow reader holds the
//! task back instead of piling events up in memory, and remembers the
//! cursor of the last event it returned.

mod decide;
mod session;

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use tokio::sync::mpsc;

use crate::{Cursor, Error, Event};

/// Called with every error the subscription recovers from by itself (a lost
/// connection, before it reconnects): for logs and metrics.
#[derive(Clone)]
pub struct ErrorHook(pub Arc<dyn Fn(&Error) + Send + Sync>);

impl std::fmt::Debug for ErrorHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ErrorHook(..)")
    }
}

impl ErrorHook {
    /// A hook calling `f`.
    pub fn new(f: impl Fn(&Error) + Send + Sync + 'static) -> ErrorHook {
        ErrorHook(Arc::new(f))
    }
}

/// How to subscribe. Build it with struct update syntax:
///
/// ```
/// use litebase_streams_client::{Cursor, SubscribeOptions};
///
/// let options = SubscribeOptions {
///     after: Some(Cursor { log_id: "0b6e…".into(), position: 41 }),
///     types: Some(vec!["order.paid".into()]),
///     filter: Some(serde_json::json!({"currency": "EUR"})),
///     ..Default::default()
/// };
/// # let _ = options;
/// ```
#[derive(Clone, Debug)]
pub struct SubscribeOptions {
    /// Resume after this cursor (None: from the first event of the log).
    /// When its `log_id` is not the database's, the subscription ends with
    /// [`Error::LogChanged`].
    pub after: Option<Cursor>,
    /// Only events whose `type` is one of these (as `streams.replay(types => ...)`).
    pub types: Option<Vec<String>>,
    /// Only events whose `data` contains this JSON object (`data @> filter`).
    pub filter: Option<serde_json::Value>,
    /// Events per replay query (1 to 10,000; default 1,000).
    pub page_size: i32,
    /// How often the subscription replays without being notified (default
    /// 1 s, doubling up to 10 s while nothing comes): how it finds the
    /// first events of streams a pattern had not met (their channels are
    /// listened to from then on), and a safety net for lost notifications.
    pub poll_interval: Duration,
    /// Called with each error the subscription recovers from (a lost
    /// connection), before it reconnects.
    pub on_connection_lost: Option<ErrorHook>,
    #[doc(hidden)]
    pub test_hooks: TestHooks,
}

impl Default for SubscribeOptions {
    fn default() -> Self {
        SubscribeOptions {
            after: None,
            types: None,
            filter: None,
            page_size: 1000,
            poll_interval: Duration::from_secs(1),
            on_connection_lost: None,
            test_hooks: TestHooks::default(),
        }
    }
}

/// Fault injection for the library's own tests; not part of the API.
#[doc(hidden)]
#[derive(Clone, Default)]
pub struct TestHooks {
    /// Called with the position of each notification the worker sent; true
    /// makes the subscription ignore it, as if it had been lost.
    pub lose_notification: Option<Arc<dyn Fn(i64) -> bool + Send + Sync>>,
    /// Counts the subscription's reads of the worker's pid and replay pages.
    pub queries: Option<Arc<std::sync::atomic::AtomicU64>>,
}

impl std::fmt::Debug for TestHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TestHooks")
    }
}

/// The events of a subscription, a [`Stream`] of `Result<Event, Error>`.
///
/// Errors the subscription recovers from (a lost connection, a worker
/// restart) never come out of it; an `Err` is final (a permission denied,
/// [`Error::LogChanged`]) and the stream ends after it. Dropping it stops
/// the subscription and closes its connection.
pub struct Subscription {
    receiver: mpsc::Receiver<Result<(String, Event), Error>>,
    cursor: Option<Cursor>,
    task: tokio::task::JoinHandle<()>,
}

impl Subscription {
    /// The cursor after the last event this stream returned (or the one it
    /// started after): what to persist with the work that event caused.
    pub fn cursor(&self) -> Option<&Cursor> {
        self.cursor.as_ref()
    }
}

impl Stream for Subscription {
    type Item = Result<Event, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.receiver.poll_recv(cx) {
            Poll::Ready(Some(Ok((log_id, event)))) => {
                self.cursor = Some(Cursor { log_id, position: event.position });
                Poll::Ready(Some(Ok(event)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Subscribe to `pattern` (a stream name, `"order.*"`, `"order.*.failed"`
/// or `"*"`) on the database `config` connects to: the events after
/// `options.after`, then new ones as they commit, each exactly once, in
/// position order, until the stream is dropped.
///
/// It LISTENs first, reads `streams.worker_pid()` and `streams.log_id()`,
/// catches up with `streams.replay` in pages, then follows notifications,
/// trusting only those of the worker, dropping positions seen, replaying on
/// a gap (`prev`), fetching truncated and private events with
/// `streams.get`. Each batch of notifications that arrived together costs
/// one query (the worker's pid and the log id, read after they arrived): a
/// worker may keep its pid across `DROP EXTENSION` and `CREATE EXTENSION`,
/// and that read is what keeps an event of a new log from passing for the
/// next one of the old; after a lost connection it reconnects (with a growing
/// backoff, up to 10 s) and catches up again. A pattern has no single
/// channel: it listens on the channels of the streams it matches, replays
/// on their notifications, and replays every `poll_interval` to find new
/// streams. Must be called inside a tokio runtime (it spawns the task).
///
/// ```no_run
/// use futures_util::StreamExt;
/// use litebase_streams_client::{subscribe, SubscribeOptions};
///
/// # async fn run() -> Result<(), litebase_streams_client::Error> {
/// let config: tokio_postgres::Config = "host=localhost dbname=app user=app".parse().unwrap();
/// let mut events = subscribe(config, "payment.*", SubscribeOptions::default());
/// while let Some(event) = events.next().await {
///     let event = event?;
///     println!("{} {} {}", event.position, event.stream, event.data);
///     let cursor = events.cursor(); // persist it with your work
///     # let _ = cursor;
/// }
/// # Ok(())
/// # }
/// ```
pub fn subscribe(config: tokio_postgres::Config, pattern: &str, options: SubscribeOptions) -> Subscription {
    let capacity = usize::try_from(options.page_size).unwrap_or(1).clamp(1, 10_000);
    let (sender, receiver) = mpsc::channel(capacity);
    let cursor = options.after.clone();
    let pattern = pattern.to_owned();
    let task = tokio::spawn(async move {
        match session::Follower::new(config, &pattern, options, sender.clone()) {
            Ok(follower) => follower.run().await,
            Err(e) => {
                let _ = sender.send(Err(e)).await;
            }
        }
    });
    Subscription { receiver, cursor, task }
}
