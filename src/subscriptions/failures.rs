//! Failures: events a consumer nacked, waiting for their next attempt, and
//! dead letters, events parked after `max_attempts` attempts
//! (`streams.subscription_failures`; the events stay in the log, untouched).
//!
//! An ordered subscription is processed in position order, so a nacked
//! event at its head holds the subscription until it is due; once its
//! attempts are used up the next poll parks it and moves on. A dead letter
//! put back (`retry_dead_letter`) lies below the position: the token
//! holder delivers it before the next events, out of order, as attempt 1.

use std::time::Duration;

use crate::log::kept_plan::KeptStatements;
use pgrx::datum::{DatumWithOid, Interval};
use pgrx::spi::{SpiClient, SpiResult};

use super::reads::with_latest_snapshot;
use super::{attempts, wait::wait_duration, Subscription};
use crate::error::{OrRaise, StreamsError};

/// The longest `retry_after` and backoff: a nack is a delay, not a parking.
pub(super) const LONGEST_DELAY: Duration = Duration::from_secs(30 * 86_400);

/// What the event at an ordered subscription's head (or a put-back dead
/// letter) calls for.
pub(super) enum Head {
    Deliver,
    /// Parked already (by a nack at its last attempt): move past it.
    Parked,
    /// Its attempts are used up: park it, then move past it.
    Park {
        attempts: i32,
    },
    /// Nacked, or leased: not before this much time.
    Wait(Duration),
}

/// What the event at `position` calls for (its claim held).
pub(super) fn head(client: &mut SpiClient<'_>, sub: &Subscription, position: i64) -> SpiResult<Head> {
    attempts::await_earlier_deliveries(sub.id, &[(position - 1, position)]);
    let args: [DatumWithOid; 2] = [sub.id.into(), position.into()];
    let (attempts, parked, wait_us, leased_us) = with_latest_snapshot(|| {
        let rows = client.select_kept(
            "SELECT d.attempts, f.parked_at IS NOT NULL,
                    (pg_catalog.date_part('epoch', f.retry_at - pg_catalog.clock_timestamp()) * 1e6)::bigint,
                    (pg_catalog.date_part('epoch', d.leased_until - pg_catalog.clock_timestamp()) * 1e6)::bigint
             FROM (SELECT) one
             LEFT JOIN streams.subscription_deliveries d ON d.subscription = $1 AND d.low < $2 AND d.high >= $2
             LEFT JOIN streams.subscription_failures f ON f.subscription = $1 AND f.position = $2",
            None,
            &args,
        )?;
        let row = rows.first();
        Ok::<_, pgrx::spi::Error>((
            row.get::<i32>(1)?.unwrap_or(0),
            row.get::<bool>(2)?.unwrap_or(false),
            row.get::<i64>(3)?.unwrap_or(0),
            row.get::<i64>(4)?.unwrap_or(0),
        ))
    })?;
    Ok(if parked {
        Head::Parked
    } else if leased_us > 0 {
        // Its consumer works on it outside any transaction.
        Head::Wait(Duration::from_micros(leased_us as u64))
    } else if sub.max_attempts.is_some_and(|max| attempts >= max) {
        Head::Park { attempts }
    } else if wait_us > 0 {
        Head::Wait(Duration::from_micros(wait_us as u64))
    } else {
        Head::Deliver
    })
}

/// Park the event at `position` after `attempts` attempts (`reason`: the
/// last nack's): a dead letter, settled for the attempt count.
pub(super) fn park(
    client: &mut SpiClient<'_>,
    sub: i32,
    position: i64,
    attempts: i32,
    reason: Option<&str>,
) -> SpiResult<()> {
    let args: [DatumWithOid; 4] = [sub.into(), position.into(), attempts.into(), reason.into()];
    client.update_kept(
        "INSERT INTO streams.subscription_failures AS f
             (subscription, position, attempts, first_error, last_error, first_failed_at, last_failed_at, parked_at)
         VALUES ($1, $2, $3, $4, $4, CASE WHEN $4 IS NOT NULL THEN pg_catalog.now() END,
                 CASE WHEN $4 IS NOT NULL THEN pg_catalog.now() END, pg_catalog.now())
         ON CONFLICT (subscription, position) DO UPDATE
         SET attempts = excluded.attempts, parked_at = excluded.parked_at, retry_at = NULL,
             first_error = coalesce(f.first_error, excluded.first_error),
             last_error = coalesce(excluded.last_error, f.last_error),
             first_failed_at = coalesce(f.first_failed_at, excluded.first_failed_at),
             last_failed_at = coalesce(excluded.last_failed_at, f.last_failed_at)",
        None,
        &args,
    )?;
    attempts::settle(client, sub, position - 1, position, &[])
}

/// The first event in `(after, through]` with a failure (waiting for its
/// retry, or parked): a delivery of an ordered subscription stops before
/// it, so that it is never handed out early, and never out of order (an
/// unordered one's run of a chunk too, and moves past it at its head).
pub(super) fn first_failing(client: &mut SpiClient<'_>, sub: i32, after: i64, through: i64) -> SpiResult<Option<i64>> {
    let args: [DatumWithOid; 3] = [sub.into(), after.into(), through.into()];
    with_latest_snapshot(|| {
        let rows = client.select_kept(
            "SELECT pg_catalog.min(f.position) FROM streams.subscription_failures f
             WHERE f.subscription = $1 AND f.position > $2 AND f.position <= $3
               AND (f.parked_at IS NOT NULL OR f.retry_at > pg_catalog.clock_timestamp())",
            None,
            &args,
        )?;
        rows.first().get::<i64>(1)
    })
}

/// Forget the discarded dead letters the subscription has moved past.
pub(super) fn forget_discarded(client: &mut SpiClient<'_>, sub: i32, through: i64) -> SpiResult<()> {
    client.update_kept(
        "DELETE FROM streams.subscription_failures f WHERE f.subscription = $1 AND f.position <= $2 AND f.discarded",
        None,
        &[sub.into(), through.into()],
    )?;
    Ok(())
}

/// The lowest put-back dead letter at or below `position` that is due.
pub(super) fn due_put_back(client: &mut SpiClient<'_>, sub: i32, position: i64) -> SpiResult<Option<i64>> {
    let args: [DatumWithOid; 2] = [sub.into(), position.into()];
    with_latest_snapshot(|| {
        let rows = client.select_kept(
            "SELECT f.position FROM streams.subscription_failures f
             WHERE f.subscription = $1 AND f.parked_at IS NULL AND f.position <= $2
               AND (f.retry_at IS NULL OR f.retry_at <= pg_catalog.clock_timestamp())
             ORDER BY f.position LIMIT 1",
            None,
            &args,
        )?;
        super::reads::first_value(rows)
    })
}

/// Up to `limit` failed events of an unordered subscription that are due
/// and that an ack moved past (below the position, or in the processed
/// part of their chunk): nacked ones, and dead letters put back.
pub(super) fn due_unordered(client: &mut SpiClient<'_>, sub: i32, limit: i64) -> SpiResult<Vec<i64>> {
    let args: [DatumWithOid; 2] = [sub.into(), limit.into()];
    with_latest_snapshot(|| {
        client
            .select_kept(
                "SELECT f.position FROM streams.subscription_failures f
                 JOIN streams.subscription_state s ON s.id = f.subscription
                 LEFT JOIN streams.subscription_progress p
                        ON p.subscription = f.subscription AND p.chunk = streams._chunk(f.position)
                 WHERE f.subscription = $1 AND f.parked_at IS NULL AND NOT f.discarded
                   AND (f.retry_at IS NULL OR f.retry_at <= pg_catalog.clock_timestamp())
                   AND (f.position <= s.position OR f.position <= p.done_through)
                 ORDER BY f.position LIMIT $2",
                None,
                &args,
            )?
            .map(|row| row.get::<i64>(1).map(|p| p.unwrap_or(0)))
            .collect()
    })
}

/// Whether the failed event at `position` still waits to come again and is
/// due, seen now: a put-back is listed before its lock is taken, and the
/// consumer that held it may have processed it in between.
pub(super) fn still_due(client: &mut SpiClient<'_>, sub: i32, position: i64) -> SpiResult<bool> {
    let args: [DatumWithOid; 2] = [sub.into(), position.into()];
    with_latest_snapshot(|| {
        let rows = client.select_kept(
            "SELECT EXISTS (SELECT FROM streams.subscription_failures f
                            WHERE f.subscription = $1 AND f.position = $2 AND f.parked_at IS NULL AND NOT f.discarded
                              AND (f.retry_at IS NULL OR f.retry_at <= pg_catalog.clock_timestamp()))",
            None,
            &args,
        )?;
        Ok(super::reads::first_value::<bool>(rows)?.unwrap_or(false))
    })
}

/// How long until the next failed event of the subscription is due (one
/// due already waits for its chunk's holder, whose end wakes the pollers).
pub(super) fn next_retry(client: &mut SpiClient<'_>, sub: i32) -> SpiResult<Option<Duration>> {
    with_latest_snapshot(|| {
        let rows = client.select_kept(
            "SELECT (pg_catalog.date_part('epoch', pg_catalog.min(f.retry_at) - pg_catalog.clock_timestamp()) * 1e6)::bigint
             FROM streams.subscription_failures f
             WHERE f.subscription = $1 AND f.parked_at IS NULL AND f.retry_at > pg_catalog.clock_timestamp()",
            None,
            &[sub.into()],
        )?;
        Ok(rows.first().get::<i64>(1)?.map(|us| Duration::from_micros(us.max(1) as u64)))
    })
}

/// How long until the first put-back dead letter at or below `position`
/// that is not yet due becomes due.
pub(super) fn next_put_back(client: &mut SpiClient<'_>, sub: i32, position: i64) -> SpiResult<Option<Duration>> {
    let args: [DatumWithOid; 2] = [sub.into(), position.into()];
    with_latest_snapshot(|| {
        let rows = client.select_kept(
            "SELECT (pg_catalog.date_part('epoch', pg_catalog.min(f.retry_at) - pg_catalog.clock_timestamp()) * 1e6)::bigint
             FROM streams.subscription_failures f
             WHERE f.subscription = $1 AND f.parked_at IS NULL AND f.position <= $2",
            None,
            &args,
        )?;
        Ok(rows.first().get::<i64>(1)?.map(|us| Duration::from_micros(us.max(1) as u64)))
    })
}

/// The events in `(after, through]` succeeded (all but `keep`): forget
/// their failures.
pub(super) fn forget(client: &mut SpiClient<'_>, sub: i32, after: i64, through: i64, keep: &[i64]) -> SpiResult<()> {
    let args: [DatumWithOid; 4] = [sub.into(), after.into(), through.into(), keep.to_vec().into()];
    client.update_kept(
        "DELETE FROM streams.subscription_failures f
         WHERE f.subscription = $1 AND f.position > $2 AND f.position <= $3 AND f.parked_at IS NULL
           AND f.position <> ALL ($4::bigint[])",
        None,
        &args,
    )?;
    Ok(())
}

/// Forget the failures that are not dead letters (a seek starts afresh).
pub(super) fn forget_pending(client: &mut SpiClient<'_>, sub: i32) -> SpiResult<()> {
    client.update_kept(
        "DELETE FROM streams.subscription_failures f WHERE f.subscription = $1 AND f.parked_at IS NULL",
        None,
        &[sub.into()],
    )?;
    Ok(())
}

/// An interval argument of at most [`LONGEST_DELAY`]; 22023 otherwise.
pub(super) fn delay(interval: &Interval, argument: &'static str) -> Duration {
    let delay = wait_duration(interval, argument).or_raise();
    if delay > LONGEST_DELAY {
        StreamsError::IntervalOutOfRange { argument }.raise();
    }
    delay
}
