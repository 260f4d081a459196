//! What consumers and owners say of single events outside a poll's ack:
//! `nack` (this event failed: later, or parked at its last attempt), and
//! putting dead letters back (`retry_dead_letter`) or away
//! (`discard_dead_letter`). failures.rs holds the state they change.

use std::time::Duration;

use crate::log::kept_plan::KeptStatements;
use pgrx::datum::{DatumWithOid, Interval};
use pgrx::prelude::*;

use super::claims::{self, Hold, Key};
use super::failures::{delay, park};
use super::{as_owner, attempts, open, refuse_webhook};
use crate::error::{OrRaise, StreamsError};

/// The most bytes of a nack's reason that are kept.
const REASON_LIMIT: usize = 1000;

/// `streams.nack(subscription, position, retry_after, reason)`.
#[pg_extern(sql = false)]
fn _nack(
    subscription: Option<&str>,
    position: Option<i64>,
    retry_after: Option<Interval>,
    reason: Option<&str>,
    lease: Option<i64>,
) {
    // The readers' lock order first: an upgrade step takes it too.
    crate::log::catalog::lock_for_reading();
    let name = subscription.ok_or(StreamsError::NullArgument("subscription")).or_raise();
    let position = position.ok_or(StreamsError::NullArgument("position")).or_raise();
    let retry_after = retry_after.map(|r| delay(&r, "retry_after"));
    if reason.is_some_and(|r| r.len() > REASON_LIMIT) {
        StreamsError::TextTooLong { argument: "reason", limit: REASON_LIMIT }.raise();
    }
    let sub = open(name);
    refuse_webhook(&sub);
    let refuse =
        |why: &'static str| StreamsError::NackNotDelivered { subscription: sub.name.clone(), position, reason: why };
    if let Some(lease) = lease {
        super::leases::check_nack(&sub, position, lease);
    }
    let polled_here = claims::of(sub.id).iter().any(|c| c.low < position && position <= c.high);
    let in_one_sequence = sub.ordered && sub.key_path.is_none();
    if polled_here && in_one_sequence && claims::nacked(sub.id).iter().any(|&n| n < position) {
        // After an event this transaction nacked: it comes again after
        // that one, untried (its delivery was taken back). Nothing to do.
        return;
    }
    if lease.is_none() && !polled_here {
        // After the consuming transaction failed: take what a poll of the
        // event takes. Its consumer holds it now: this session's attempt is over.
        let locked = briefly(|| {
            if sub.key_path.is_some() {
                claims::try_lock(sub.id, Key::Token, Hold::Shared)
                    && as_owner(|client| super::keyed::lock_key_of(client, &sub, position)).is_some()
            } else if !sub.ordered {
                claims::try_lock(sub.id, Key::Token, Hold::Shared)
                    && claims::try_lock(sub.id, Key::Chunk(claims::chunk_of(position)), Hold::Exclusive)
            } else {
                claims::try_lock(sub.id, Key::Token, Hold::Exclusive)
            }
        });
        if !locked {
            refuse("is being delivered to another transaction").raise();
        }
        // A poll that took the event after that transaction and was
        // ended while the worker wrote its delivery down: counted first,
        // the event is that poll's now.
        attempts::await_earlier_deliveries(sub.id, &[(position - 1, position)]);
    }
    as_owner(|client| {
        let Some(segment) = attempts::at(client, sub.id, position)? else {
            refuse("was not delivered, or is settled").raise()
        };
        if lease.is_none() && !polled_here && !segment.delivered_to_me() {
            refuse("was delivered to another session").raise();
        }
        if !super::poll::is_event_of(client, &sub, position)? {
            refuse("is not an event of the subscription").raise();
        }
        if let Some(lease) = lease {
            super::leases::end(client, sub.id, lease)?;
        }
        if in_one_sequence {
            // In one sequence, the events after it were not tried (competing
            // consumers go on with theirs, and per key they come again
            // after it anyway).
            attempts::not_attempted(client, sub.id, position, &segment)?;
        }
        if sub.max_attempts.is_some_and(|max| segment.attempts >= max) {
            return park(client, sub.id, position, segment.attempts, reason);
        }
        let delay = retry_after.unwrap_or_else(|| {
            // SAFETY: the backend's own PRNG state, seeded at backend start.
            let unit = unsafe { pg_sys::pg_prng_double(&raw mut pg_sys::pg_global_prng_state) };
            Duration::from_micros(litebase_streams_core::backoff::retry_delay_us(
                segment.attempts,
                sub.backoff_min_us,
                sub.backoff_max_us,
                unit,
            ) as u64)
        });
        let args: [DatumWithOid; 5] =
            [sub.id.into(), position.into(), segment.attempts.into(), reason.into(), (delay.as_micros() as i64).into()];
        client.update_kept(
            "INSERT INTO streams.subscription_failures AS f
                 (subscription, position, attempts, first_error, last_error, first_failed_at, last_failed_at, retry_at)
             VALUES ($1, $2, $3, $4, $4, pg_catalog.now(), pg_catalog.now(),
                     pg_catalog.now() + pg_catalog.make_interval(secs => $5::double precision / 1e6))
             ON CONFLICT (subscription, position) DO UPDATE
             SET attempts = excluded.attempts, last_error = excluded.last_error,
                 first_error = coalesce(f.first_error, excluded.first_error),
                 last_failed_at = excluded.last_failed_at, retry_at = excluded.retry_at, parked_at = NULL",
            None,
            &args,
        )?;
        Ok(())
    });
    if polled_here {
        claims::note_nacked(sub.id, position);
    }
}

/// How long a nack after a failed transaction tries for the event's claim
/// before it refuses: a client may see another transaction's statement fail
/// before that transaction has let go of its locks.
const LOCK_PATIENCE: Duration = Duration::from_millis(200);

/// Whether `take` (non-blocking lock attempts) succeeds within
/// [`LOCK_PATIENCE`]; a cancel ends the wait with an ERROR.
fn briefly(mut take: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + LOCK_PATIENCE;
    loop {
        if take() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        crate::shmem::nap_on_latch(2);
    }
}

/// `streams.retry_dead_letter(subscription, position)`: put one dead
/// letter (or, position NULL, all) back; how many.
#[pg_extern(sql = false)]
fn _retry_dead_letter(subscription: Option<&str>, position: Option<i64>) -> i64 {
    settle_dead_letters(
        subscription,
        position,
        // Delivered again as attempt 1: its old attempts are in the row only.
        "UPDATE streams.subscription_failures f SET parked_at = NULL, retry_at = NULL
         WHERE f.subscription = $1 AND f.parked_at IS NOT NULL AND NOT f.discarded
           AND ($2::bigint IS NULL OR f.position = $2)
         RETURNING f.position",
        false,
    )
}

/// `streams.discard_dead_letter(subscription, position)`: drop one dead
/// letter (or all); how many. The event stays in the log. One the
/// subscription has not yet moved past is kept, marked, until it has (a
/// poll skips it as it skips a dead letter).
#[pg_extern(sql = false)]
fn _discard_dead_letter(subscription: Option<&str>, position: Option<i64>) -> i64 {
    settle_dead_letters(
        subscription,
        position,
        "WITH gone AS (
             UPDATE streams.subscription_failures f SET discarded = true
             WHERE f.subscription = $1 AND f.parked_at IS NOT NULL AND NOT f.discarded
               AND ($2::bigint IS NULL OR f.position = $2)
             RETURNING f.subscription, f.position
         ), passed AS (
             DELETE FROM streams.subscription_failures f USING gone, streams.subscription_state s
             WHERE f.subscription = gone.subscription AND f.position = gone.position
               AND s.id = f.subscription AND f.position <= s.position AND s.key_path IS NULL
         )
         SELECT gone.position FROM gone",
        true,
    )
}

fn settle_dead_letters(subscription: Option<&str>, position: Option<i64>, statement: &str, discard: bool) -> i64 {
    crate::log::catalog::lock_for_reading();
    let name = subscription.ok_or(StreamsError::NullArgument("subscription")).or_raise();
    let sub = open(name);
    refuse_webhook(&sub);
    let changed = as_owner(|client| {
        let args: [DatumWithOid; 2] = [sub.id.into(), position.into()];
        let settled: Vec<i64> = client
            .update_kept(statement, None, &args)?
            .map(|row| row.get::<i64>(1).map(|p| p.unwrap_or(0)))
            .collect::<Result<_, _>>()?;
        if discard && sub.key_path.is_some() && !sub.skip_dead_letters {
            // They held their keys: the keys go on after them.
            super::keyed::discarded(client, &sub, &settled)?;
        }
        Ok(settled.len() as i64)
    });
    if let (Some(position), 0) = (position, changed) {
        StreamsError::NotADeadLetter { subscription: sub.name, position }.raise();
    }
    changed
}
