//! The loop: claim a window in the database, store it in the sink, and ack
//! it in the same transaction only through what the sink stored.
//!
//! While the sink fails, the window's transaction keeps its events (nobody
//! else gets them, and nothing new is read: memory stays at one batch) and
//! the batch is published again from its first unstored message, for at most
//! --max-hold. Then the window is rolled back and the session reconnects.
//! Whatever ends a window early (a crash of the bridge, a lost session, a
//! server restart) gives its events back; they come again and the sink's
//! duplicate detection (JetStream's `Nats-Msg-Id`) drops the ones it stored.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tracing::{error, info, warn};

use crate::config::Config;
use crate::metrics;
use crate::sink::{Message, Sink};
use crate::source::{self, DbError, Source};

/// Run until a fatal error (bad configuration, missing privileges) or until
/// `stop` is set: then the window in hand is finished and committed.
pub async fn run<S: Sink>(cfg: &Config, sink: &mut S, stop: &AtomicBool) -> Result<(), String> {
    let mut failures = 0u32;
    loop {
        let mut source = match Source::connect(cfg).await {
            Ok(s) => {
                metrics::set_database_up(true);
                s
            }
            Err(e) if e.fatal => return Err(e.message),
            Err(e) => {
                failures += 1;
                metrics::get().database_reconnects.increment(1);
                warn!("database: {e}; reconnecting");
                tokio::time::sleep(source::backoff(failures)).await;
                continue;
            }
        };
        loop {
            if stop.load(Ordering::Relaxed) {
                return source.settle_now().await.map_err(|e| e.message);
            }
            match window(cfg, &mut source, sink).await {
                Ok(_) => failures = 0,
                Err(e) if e.fatal => return Err(e.message),
                Err(e) => {
                    failures += 1;
                    warn!("{e}; reconnecting");
                    break;
                }
            }
        }
        source.abandon().await;
        metrics::set_database_up(false);
        metrics::get().database_reconnects.increment(1);
        tokio::time::sleep(source::backoff(failures)).await;
    }
}

/// One window: how many events it stored.
async fn window<S: Sink>(cfg: &Config, source: &mut Source, sink: &mut S) -> Result<usize, DbError> {
    let m = metrics::get();
    let mut fetched = source.open_window(cfg.max_in_flight_bytes).await?;
    let mut total = 0usize;
    let mut through = None;
    while !fetched.messages.is_empty() {
        m.in_flight_events.set(fetched.messages.len() as f64);
        m.in_flight_bytes.set(fetched.bytes as f64);
        store(cfg, sink, &fetched.messages).await.inspect_err(|_| {
            m.in_flight_events.set(0.0);
            m.in_flight_bytes.set(0.0);
        })?;
        total += fetched.messages.len();
        through = fetched.messages.last().map(|e| e.position);
        let done = fetched.messages.len() < fetched.asked || total >= cfg.window as usize;
        m.in_flight_events.set(0.0);
        m.in_flight_bytes.set(0.0);
        if done {
            break;
        }
        fetched = source.fetch(cfg.max_in_flight_bytes).await?;
    }
    source.settle(through);
    if through.is_some() {
        m.windows.increment(1);
    }
    Ok(total)
}

/// Store `batch` in the sink, retrying from its first unstored message while
/// the window may be held.
async fn store<S: Sink>(cfg: &Config, sink: &mut S, batch: &[Message]) -> Result<(), DbError> {
    let m = metrics::get();
    let started = Instant::now();
    let mut from = 0;
    let mut attempt = 0u32;
    loop {
        let outcome = sink.store(&batch[from..]).await;
        m.bridged.increment((outcome.stored - outcome.duplicates) as u64);
        m.duplicates.increment(outcome.duplicates as u64);
        from += outcome.stored;
        if from == batch.len() {
            if attempt > 0 {
                info!(attempts = attempt + 1, "the sink stored the batch");
            }
            return Ok(());
        }
        m.publish_failures.increment(1);
        let why = outcome.error.unwrap_or_else(|| "stopped".into());
        if started.elapsed() >= cfg.max_hold() {
            error!("the sink failed for --max-hold ({} s): {why}; giving the window back", cfg.max_hold_secs);
            return Err(DbError { message: format!("sink: {why}"), fatal: false });
        }
        attempt += 1;
        warn!(position = batch[from].position, attempt, "the sink failed: {why}; publishing again");
        // Wait for the connection before publishing again (a disconnected
        // client would only queue the batch a second time).
        let wait = crate::jetstream::backoff(attempt);
        tokio::time::sleep(wait.min(cfg.max_hold().saturating_sub(started.elapsed()))).await;
        while !sink.connected() && started.elapsed() < cfg.max_hold() {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}
