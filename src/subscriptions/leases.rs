//! Leases: events claimed for a duration instead of for a transaction, for
//! jobs that take minutes. `poll(..., lease => '5 minutes')` writes the
//! delivery down with a lease id and an expiry (attempts.rs) and lets go of
//! the subscription's token once that is committed; the consumer works
//! outside any transaction and settles each event from any session
//! (through PgBouncer too) with `ack(subscription, through, lease)` or
//! `nack(..., lease => ...)`, or keeps it with `extend_lease`. While a lease
//! is live the ordered subscription waits behind it; once it expired, the
//! next poll delivers its events again, with the next attempt number, and
//! the old lease settles nothing.
//!
//! Ack, nack and extend take the token exclusively, as a poll does, so
//! that a lease is never settled while a poll hands its events out again.

use std::time::Duration;

use crate::log::kept_plan::KeptStatements;
use pgrx::datum::{DatumWithOid, Interval, TimestampWithTimeZone};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

use super::claims;
use super::{as_owner, attempts, failures, open, refuse_webhook, Subscription};
use crate::error::{OrRaise, StreamsError};

/// The longest lease one call takes (`extend_lease` keeps it longer).
const LONGEST_LEASE: Duration = Duration::from_secs(86_400);

/// A lease duration argument: more than zero, at most [`LONGEST_LEASE`].
pub(super) fn duration(interval: &Interval) -> Duration {
    let lease = super::wait::wait_duration(interval, "lease").or_raise();
    if lease.is_zero() || lease > LONGEST_LEASE {
        StreamsError::IntervalOutOfRange { argument: "lease" }.raise();
    }
    lease
}

/// A new lease id: random, positive, never 0.
pub(super) fn new_id() -> i64 {
    let mut bytes = [0u8; 8];
    // SAFETY: writes 8 bytes into a local buffer of that size.
    if !unsafe { pg_sys::pg_strong_random(bytes.as_mut_ptr().cast(), bytes.len()) } {
        StreamsError::NoRandomSource.raise();
    }
    (i64::from_le_bytes(bytes) & i64::MAX).max(1)
}

/// The live segments of `lease`: `(first after, last through)`; raises
/// when it expired or was taken over.
fn live(client: &mut SpiClient<'_>, sub: &Subscription, lease: i64) -> (i64, i64) {
    let args: [DatumWithOid; 2] = [sub.id.into(), lease.into()];
    let rows = client
        .select_kept(
            "SELECT pg_catalog.min(d.low), pg_catalog.max(d.high) FROM streams.subscription_deliveries d
             WHERE d.subscription = $1 AND d.lease = $2 AND d.leased_until > pg_catalog.clock_timestamp()",
            None,
            &args,
        )
        .and_then(|rows| {
            let row = rows.first();
            Ok((row.get::<i64>(1)?, row.get::<i64>(2)?))
        })
        .unwrap_or((None, None));
    match rows {
        (Some(low), Some(high)) => (low, high),
        _ => StreamsError::LeaseGone { subscription: sub.name.clone(), lease }.raise(),
    }
}

/// Open the subscription for a lease operation and hold its token.
fn open_leased(name: Option<&str>) -> Subscription {
    crate::log::catalog::lock_for_reading();
    let name = name.ok_or(StreamsError::NullArgument("subscription")).or_raise();
    let sub = open(name);
    refuse_webhook(&sub);
    if !sub.ordered || sub.key_path.is_some() {
        StreamsError::NeedsOrdered { function: "a lease", subscription: sub.name.clone() }.raise();
    }
    // Waits for a transaction that polls it now (a poll is short).
    claims::lock_exclusively(sub.id);
    sub
}

/// `streams.ack(subscription, through, lease)`: the leased events up to
/// `through` are processed, as part of the caller's transaction.
#[pg_extern(sql = false)]
fn _ack_lease(subscription: Option<&str>, through: Option<i64>, lease: Option<i64>) {
    let through = through.ok_or(StreamsError::NullArgument("through")).or_raise();
    let lease = lease.ok_or(StreamsError::NullArgument("lease")).or_raise();
    let sub = open_leased(subscription);
    as_owner(|client| {
        let (low, high) = live(client, &sub, lease);
        if through > high {
            StreamsError::AckNotPolled { subscription: sub.name.clone(), through, polled_through: Some(high) }.raise();
        }
        client.update_kept(
            "UPDATE streams.subscription_state
             SET position = GREATEST(position, $2), last_ack_at = pg_catalog.now() WHERE id = $1",
            None,
            &[sub.id.into(), through.into()],
        )?;
        attempts::settle(client, sub.id, low, through, &[])?;
        failures::forget(client, sub.id, low, through, &[])
    });
}

/// `streams.extend_lease(subscription, lease, duration)`: keep the lease's
/// events for `duration` from now; the new expiry.
#[pg_extern(sql = false)]
fn _extend_lease(
    subscription: Option<&str>,
    lease: Option<i64>,
    duration: Option<Interval>,
) -> Option<TimestampWithTimeZone> {
    let lease = lease.ok_or(StreamsError::NullArgument("lease")).or_raise();
    let duration = self::duration(&duration.ok_or(StreamsError::NullArgument("duration")).or_raise());
    let sub = open_leased(subscription);
    as_owner(|client| {
        live(client, &sub, lease);
        let args: [DatumWithOid; 3] = [sub.id.into(), lease.into(), (duration.as_micros() as i64).into()];
        let rows = client.update_kept(
            "UPDATE streams.subscription_deliveries d
             SET leased_until = pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => $3::double precision / 1e6)
             WHERE d.subscription = $1 AND d.lease = $2 RETURNING d.leased_until",
            None,
            &args,
        )?;
        super::reads::first_value(rows)
    })
}

/// For `streams.nack(..., lease)`: hold the token and check that `lease`
/// is live and holds `position`.
pub(super) fn check_nack(sub: &Subscription, position: i64, lease: i64) {
    claims::lock_exclusively(sub.id);
    as_owner(|client| {
        let (low, high) = live(client, sub, lease);
        if position <= low || position > high {
            StreamsError::NackNotDelivered {
                subscription: sub.name.clone(),
                position,
                reason: "is not one of that lease's events",
            }
            .raise();
        }
        Ok(())
    });
}

/// A nack ends the lease: its events not yet acked come again (the nacked
/// one once it is due).
pub(super) fn end(client: &mut SpiClient<'_>, sub: i32, lease: i64) -> pgrx::spi::SpiResult<()> {
    client.update_kept(
        "UPDATE streams.subscription_deliveries d SET lease = NULL, leased_until = NULL
         WHERE d.subscription = $1 AND d.lease = $2",
        None,
        &[sub.into(), lease.into()],
    )?;
    Ok(())
}
