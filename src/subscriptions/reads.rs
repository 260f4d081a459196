//! Reads with a snapshot taken now: after taking a claim's lock, a poll
//! must see the last holder's ack, and after the worker wrote a delivery
//! down, its segments.

use crate::log::kept_plan::KeptStatements;
use pgrx::prelude::*;
use pgrx::spi::{SpiClient, SpiResult, SpiTupleTable};

use super::wait;
use crate::error::StreamsError;

/// The position as committed now (a dropped subscription: raise).
pub(super) fn read_position(client: &mut SpiClient<'_>, id: i32) -> SpiResult<i64> {
    let rows = with_latest_snapshot(|| {
        client.select_kept("SELECT s.position FROM streams.subscription_state s WHERE s.id = $1", None, &[id.into()])
    })?;
    if rows.is_empty() {
        StreamsError::UnknownSubscription(format!("(id {id})")).raise();
    }
    Ok(rows.first().get::<i64>(1)?.unwrap_or(0))
}

/// Run reads with a snapshot taken now, not the calling statement's: after
/// taking a claim's lock, the last holder's ack must be seen. (Once the
/// transaction has written, SPI takes a fresh snapshot per statement under
/// read committed anyway; unordered polls refuse snapshot isolation.)
pub(super) fn with_latest_snapshot<R>(body: impl FnOnce() -> R) -> R {
    // SAFETY: a plain call that returns a snapshot owned by the snapshot manager.
    wait::with_active_snapshot(unsafe { pg_sys::GetLatestSnapshot() }, body)
}

/// The first column of the first row, None when there is no row (a
/// statement that found or changed nothing).
pub(super) fn first_value<T: FromDatum + IntoDatum>(rows: SpiTupleTable<'_>) -> SpiResult<Option<T>> {
    if rows.is_empty() {
        Ok(None)
    } else {
        rows.first().get::<T>(1)
    }
}
