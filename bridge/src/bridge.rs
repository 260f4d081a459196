//! The loop: claim a window in the database, store it in the sink, and ack
//! it in the same transaction only through what the sink stored.
//!
//! While the sink fails, the window's transaction keeps its events (nobody
//! else gets them, and nothing new is read: memory stays at one batch) and
//! the batch is published again from its first unstored message, for at most
//! --max-hold-secs. Then what the sink stored is acked, the rest rolled back,
//! and the session reconnects. Whatever ends a window early (a crash of the
//! bridge, a lost session, a server restart) gives its events back; they come
//! again, the bridge skips what the sink says it holds ([`Sink::last_stored`])
//! and the sink's duplicate detection (JetStream's `Nats-Msg-Id`) drops the
//! rest it stored.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tracing::{error, info, warn};

use crate::config::Config;
use crate::metrics;
use crate::sink::{Message, Sink};
use crate::source::{DbError, Source};

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
                tokio::time::sleep(crate::jetstream::backoff(failures)).await;
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
        tokio::time::sleep(crate::jetstream::backoff(failures)).await;
    }
}

/// One window: how many events it stored. A window that was delivered
/// before (given back by a crash, a rollback, a lost session) or that the
/// sink failed on first asks the sink what it already holds, and does not
/// publish that again: no duplicate even past JetStream's duplicate window.
/// When the sink fails for good (past --max-hold-secs), what it stored is
/// acked and committed before the rest is given back.
async fn window<S: Sink>(cfg: &Config, source: &mut Source, sink: &mut S) -> Result<usize, DbError> {
    let m = metrics::get();
    let started = Instant::now();
    let mut fetched = source.open_window().await?;
    let mut total = 0usize;
    let mut through = None;
    let mut held_through = None;
    if fetched.redelivered {
        held_through = sink.last_stored(&source.log_id).await;
    }
    loop {
        let mut batch = &fetched.messages[..];
        if let Some(held) = held_through {
            let skip = batch.iter().take_while(|e| e.position <= held).count();
            if skip > 0 {
                info!(through = held, events = skip, "the sink already holds them; not publishing them again");
                m.duplicates.increment(skip as u64);
                through = Some(batch[skip - 1].position);
                total += skip;
                batch = &batch[skip..];
            }
        }
        m.in_flight_events.set(batch.len() as f64);
        m.in_flight_bytes.set(fetched.bytes as f64);
        let outcome = store(cfg, sink, batch, &source.log_id, started).await;
        m.in_flight_events.set(0.0);
        m.in_flight_bytes.set(0.0);
        total += outcome.stored;
        if outcome.stored > 0 {
            through = Some(batch[outcome.stored - 1].position);
        }
        if let Err(e) = outcome.failed {
            // Keep what the sink stored: ack it, then give the rest back.
            if through.is_some() {
                source.settle(through);
                let _ = source.settle_now().await;
                m.windows.increment(1);
            }
            return Err(e);
        }
        match source.fetch(cfg.max_in_flight_bytes).await? {
            Some(next) if !next.messages.is_empty() => fetched = next,
            _ => break,
        }
        if fetched.redelivered && held_through.is_none() {
            held_through = sink.last_stored(&source.log_id).await;
        }
    }
    source.settle(through);
    if through.is_some() {
        m.windows.increment(1);
    }
    Ok(total)
}

/// What [`store`] did with a batch.
struct Outcome {
    /// Messages, from the first, the sink stored for sure.
    stored: usize,
    failed: Result<(), DbError>,
}

/// Store `batch` in the sink, retrying from its first unstored message while
/// the window (opened at `started`) may be held; each retry first asks the
/// sink what it holds.
async fn store<S: Sink>(cfg: &Config, sink: &mut S, batch: &[Message], log_id: &str, started: Instant) -> Outcome {
    let m = metrics::get();
    let mut from = 0;
    let mut attempt = 0u32;
    while from < batch.len() {
        if attempt > 0 {
            if let Some(held) = sink.last_stored(log_id).await {
                let skip = batch[from..].iter().take_while(|e| e.position <= held).count();
                m.duplicates.increment(skip as u64);
                from += skip;
                if from == batch.len() {
                    break;
                }
            }
        }
        let outcome = sink.store(&batch[from..]).await;
        m.bridged.increment((outcome.stored - outcome.duplicates) as u64);
        m.duplicates.increment(outcome.duplicates as u64);
        from += outcome.stored;
        if from == batch.len() {
            break;
        }
        m.publish_failures.increment(1);
        let why = outcome.error.unwrap_or_else(|| "stopped".into());
        if started.elapsed() >= cfg.max_hold() {
            error!("the sink failed for --max-hold-secs ({} s): {why}; giving the window back", cfg.max_hold_secs);
            return Outcome { stored: from, failed: Err(DbError { message: format!("sink: {why}"), fatal: false }) };
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
    if attempt > 0 {
        info!(attempts = attempt + 1, "the sink stored the batch");
    }
    Outcome { stored: from, failed: Ok(()) }
}
