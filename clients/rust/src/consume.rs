//! `consume`: a durable consumer of a subscription. Each batch is one
//! transaction: `streams.poll` (a long poll), the handler once per event,
//! in the transaction, then `streams.ack`; commit. The handler's writes and
//! the ack commit together, so an event's effect in the database happens
//! exactly once; a crash, a lost connection or a rollback returns the
//! claims and the events come again.
//!
//! A handler error rolls back to a savepoint taken before that event (its
//! writes go, the batch's other work stays), nacks the event with the
//! error's text (`streams.nack`, part of the same transaction), and
//! commits. In an ordered subscription (one sequence, or per key) the batch
//! stops there: the events after it come again after the nacked one. In an
//! unordered one the batch goes on.
//!
//! Every statement is unnamed or a simple query, and the transaction keeps
//! one server connection, so it works through PgBouncer in transaction
//! pooling mode.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use litebase_streams_core::backoff::backoff;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, NoTls, Transaction};

use crate::event::EVENT_COLUMNS;
use crate::subscribe::ErrorHook;
use crate::{Error, Event};

/// What a handler fails with: its text becomes the nack's reason.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;

/// The future a handler returns (`Box::pin(async move { ... })`).
pub type HandlerFuture<'a> = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send + 'a>>;

/// How to consume.
pub struct ConsumeOptions {
    /// Events per poll (1 to 10,000; default 100).
    pub max_events: i32,
    /// How long a poll waits for events when there are none (default 10 s).
    pub wait: Duration,
    /// When it resolves, `consume` finishes the batch in hand, commits it
    /// and returns (a poll waiting for events is cancelled). None: run
    /// until an error.
    pub shutdown: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    /// Called with each error `consume` recovers from by itself (a lost
    /// connection, a serialization failure, no worker for a moment) before
    /// it tries again.
    pub on_retry: Option<ErrorHook>,
}

impl Default for ConsumeOptions {
    fn default() -> Self {
        ConsumeOptions { max_events: 100, wait: Duration::from_secs(10), shutdown: None, on_retry: None }
    }
}

impl std::fmt::Debug for ConsumeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumeOptions")
            .field("max_events", &self.max_events)
            .field("wait", &self.wait)
            .field("shutdown", &self.shutdown.is_some())
            .finish()
    }
}

impl ConsumeOptions {
    /// These options, stopping gracefully when `signal` resolves.
    ///
    /// ```
    /// use litebase_streams_client::ConsumeOptions;
    ///
    /// let options = ConsumeOptions::default().until(async {
    ///     let _ = tokio::signal::ctrl_c().await;
    /// });
    /// # let _ = options;
    /// ```
    pub fn until(mut self, signal: impl Future<Output = ()> + Send + 'static) -> Self {
        self.shutdown = Some(Box::pin(signal));
        self
    }
}

/// What a `consume` that stopped gracefully did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConsumeReport {
    /// Events the handler processed (committed with their ack).
    pub processed: u64,
    /// Events the handler failed on (nacked).
    pub failed: u64,
}

/// Consume the subscription `subscription` (created with
/// `streams.create_subscription`) on the database `config` connects to,
/// calling `handler` for each event inside the batch's transaction, until
/// `options.shutdown` resolves or an error `consume` cannot recover from.
///
/// Run several (separate connections, tasks or processes) on an unordered
/// or per-key subscription to share the work.
///
/// ```no_run
/// use litebase_streams_client::{consume, ConsumeOptions};
///
/// # async fn run() -> Result<(), litebase_streams_client::Error> {
/// let config: tokio_postgres::Config = "host=localhost dbname=app user=app".parse().unwrap();
/// consume(config, "billing", |tx, event| Box::pin(async move {
///     tx.execute("INSERT INTO payments_processed (position) VALUES ($1)", &[&event.position]).await?;
///     Ok(())
/// }), ConsumeOptions::default()).await?;
/// # Ok(())
/// # }
/// ```
pub async fn consume<H>(
    config: tokio_postgres::Config,
    subscription: &str,
    mut handler: H,
    mut options: ConsumeOptions,
) -> Result<ConsumeReport, Error>
where
    H: for<'a> FnMut(&'a Transaction<'a>, &'a Event) -> HandlerFuture<'a>,
{
    let mut shutdown: Pin<Box<dyn Future<Output = ()> + Send>> =
        options.shutdown.take().unwrap_or_else(|| Box::pin(std::future::pending()));
    // The rest of the options, without the (not Sync) shutdown future.
    let batch = Batch { max_events: options.max_events.clamp(1, 10_000), wait: options.wait };
    let mut report = ConsumeReport::default();
    let mut failures = 0u32;
    loop {
        let error = match session(&config, subscription, &mut handler, &batch, &mut shutdown, &mut report).await {
            Ok(()) => return Ok(report),
            Err(e) => e,
        };
        if !(error.is_connection_error() || matches!(error.sqlstate(), Some("40001" | "55000"))) {
            return Err(error);
        }
        if let Some(hook) = &options.on_retry {
            (hook.0)(&error);
        }
        failures += 1;
        tokio::select! {
            _ = tokio::time::sleep(backoff(failures).max(Duration::from_millis(50))) => {}
            _ = shutdown.as_mut() => return Ok(report),
        }
    }
}

/// One connection's batches; Ok when shut down.
async fn session<H>(
    config: &tokio_postgres::Config,
    subscription: &str,
    handler: &mut H,
    options: &Batch,
    shutdown: &mut Pin<Box<dyn Future<Output = ()> + Send>>,
    report: &mut ConsumeReport,
) -> Result<(), Error>
where
    H: for<'a> FnMut(&'a Transaction<'a>, &'a Event) -> HandlerFuture<'a>,
{
    let (mut client, connection) = tokio::select! {
        connected = config.connect(NoTls) => connected?,
        _ = shutdown.as_mut() => return Ok(()),
    };
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    let _stop = AbortOnDrop(driver);
    let ordered = ordered(&client, subscription).await?;
    let cancel = client.cancel_token();
    loop {
        let mut tx = client.transaction().await?;
        let polled = tokio::select! {
            polled = poll(&tx, subscription, options) => polled?,
            _ = shutdown.as_mut() => {
                // End a poll that waits; its transaction rolls back.
                let _ = cancel.cancel_query(NoTls).await;
                return Ok(());
            }
        };
        let mut through = None;
        for event in &polled {
            let savepoint = tx.savepoint("litebase_streams_event").await?;
            let outcome = match handler(&savepoint, event).await {
                // A handler that ignored an SQL error of its own leaves the
                // savepoint aborted: RELEASE fails (25P02) and the savepoint
                // stays, so roll back to it and nack, as for any failure.
                Ok(()) => match savepoint.commit().await {
                    Ok(()) => Ok(()),
                    Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::IN_FAILED_SQL_TRANSACTION) => {
                        tx.batch_execute("ROLLBACK TO SAVEPOINT litebase_streams_event").await?;
                        Err(HandlerError::from(format!("the handler left its transaction aborted: {e}")))
                    }
                    Err(e) => return Err(e.into()),
                },
                Err(failure) => {
                    savepoint.rollback().await?;
                    Err(failure)
                }
            };
            match outcome {
                Ok(()) => {
                    report.processed += 1;
                    through = Some(event.position);
                }
                Err(failure) => {
                    nack(&tx, subscription, event.position, &failure.to_string()).await?;
                    report.failed += 1;
                    if ordered {
                        break;
                    }
                    // Unordered: the ack goes on past the nacked event.
                    through = Some(event.position);
                }
            }
        }
        if let Some(through) = through {
            tx.query_typed("SELECT streams.ack($1, $2)", &[(&subscription, Type::TEXT), (&through, Type::INT8)])
                .await?;
        }
        tx.commit().await?;
    }
}

/// What each poll asks for.
struct Batch {
    max_events: i32,
    wait: Duration,
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Whether the subscription keeps an order (one sequence or per key): then
/// a batch stops at its first failure. When the view does not say (several
/// roles' subscriptions of that name), ordered: the safe answer.
async fn ordered(client: &Client, subscription: &str) -> Result<bool, Error> {
    let rows = client
        .query_typed("SELECT ordered FROM streams.subscriptions WHERE name = $1", &[(&subscription, Type::TEXT)])
        .await?;
    Ok(match rows.as_slice() {
        [row] => row.try_get::<_, Option<bool>>(0)?.unwrap_or(true),
        _ => true,
    })
}

async fn poll(tx: &Transaction<'_>, subscription: &str, options: &Batch) -> Result<Vec<Event>, Error> {
    let wait = format!("{} milliseconds", options.wait.as_millis());
    let rows = tx
        .query_typed(
            &format!("SELECT {EVENT_COLUMNS} FROM streams.poll($1, max_events => $2, wait => $3::text::interval) e"),
            &[(&subscription, Type::TEXT), (&options.max_events, Type::INT4), (&wait, Type::TEXT)],
        )
        .await?;
    let mut events = Vec::with_capacity(rows.len());
    for row in &rows {
        if let Some(event) = Event::from_row(row, 0)? {
            events.push(event);
        }
    }
    Ok(events)
}

/// The most bytes of a nack's reason.
const MAX_REASON_BYTES: usize = 1000;

async fn nack(tx: &Transaction<'_>, subscription: &str, position: i64, reason: &str) -> Result<(), Error> {
    let reason = truncate(reason, MAX_REASON_BYTES);
    tx.query_typed(
        "SELECT streams.nack($1, $2, reason => $3)",
        &[(&subscription, Type::TEXT), (&position, Type::INT8), (&reason, Type::TEXT)],
    )
    .await?;
    Ok(())
}

/// At most `max` bytes of `text`, cut at a character boundary.
fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    #[test]
    fn reasons_are_cut_at_a_character_boundary() {
        assert_eq!(super::truncate("abc", 10), "abc");
        let long = "é".repeat(600);
        let cut = super::truncate(&long, 1000);
        assert_eq!(cut.len(), 1000);
        assert_eq!(super::truncate("aé", 2), "a");
    }
}
