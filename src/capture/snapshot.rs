//! `streams.snapshot()`: which events a REPEATABLE READ transaction's
//! tables already hold.
//!
//! The transaction's snapshot sees the worker's last horizon commit it can
//! see, and with it every transaction that ended before that commit: every
//! event at or below that horizon is in what the transaction reads (or was
//! rolled back). Above it, the transactions the snapshot sees committed
//! are the events listed in `also_visible`; every other event above the
//! horizon belongs to a transaction the snapshot does not see, and will
//! appear later above the horizon. So a consumer that copies the tables,
//! then applies the events after `position` that are not in
//! `also_visible`, applies every change exactly once.
//!
//! `also_visible` holds the events committed but not yet final when the
//! snapshot was taken (the worker's lag, or those held back by an open
//! publishing transaction), of the streams the caller may read, narrowed
//! by `stream`.

use pgrx::prelude::*;

use crate::error::{OrRaise, SpiContext, StreamsError};
use crate::log::{privileges, publish};
use litebase_streams_core::names::parse_stream_selector;

/// `streams.snapshot(stream text) → (position, also_visible, snapshot_id)`.
#[pg_extern(sql = false)]
fn snapshot(
    stream: Option<&str>,
) -> TableIterator<'static, (name!(position, i64), name!(also_visible, Vec<i64>), name!(snapshot_id, String))> {
    // SAFETY: backend globals of the current transaction, only read.
    let (isolation, xid) = unsafe { (pg_sys::XactIsoLevel, pg_sys::GetTopTransactionIdIfAny()) };
    if isolation < pg_sys::XACT_REPEATABLE_READ as i32 {
        StreamsError::SnapshotNeedsRepeatableRead.raise();
    }
    if xid != pg_sys::InvalidTransactionId {
        StreamsError::SnapshotAfterWrites.raise();
    }
    if let Some(pattern) = stream {
        parse_stream_selector(pattern).or_raise();
    }
    let sequence = publish::position_sequence();
    let owner = publish::log_owner(sequence);
    let answer = Spi::connect(|client| {
        let row = client
            .select(
                "SELECT streams._reads_all(), streams._read_patterns(), pg_catalog.pg_export_snapshot()",
                Some(1),
                &[],
            )?
            .first();
        let (all, patterns, id) = (
            row.get::<bool>(1)?.unwrap_or(false),
            row.get::<Vec<String>>(2)?.unwrap_or_default(),
            row.get::<String>(3)?,
        );
        // As the owner: the log's row security hides events above the horizon.
        privileges::as_owner(owner, || {
            let row = client
                .select(
                    "SELECT streams.horizon(),
                            (SELECT coalesce(pg_catalog.array_agg(e.position ORDER BY e.position), '{}')
                             FROM streams.event_log e
                             WHERE e.position > streams.horizon()
                               AND ($1 OR streams._stream_matches(e.stream, $2))
                               AND ($3::text IS NULL OR streams._stream_matches(e.stream, ARRAY[$3::text])))",
                    Some(1),
                    &[all.into(), patterns.into(), stream.into()],
                )?
                .first();
            Ok::<_, pgrx::spi::Error>((
                row.get::<i64>(1)?.unwrap_or(0),
                row.get::<Vec<i64>>(2)?.unwrap_or_default(),
                id,
            ))
        })
    });
    let (position, also_visible, id) = answer.context("taking the snapshot");
    TableIterator::once((position, also_visible, id.unwrap_or_default()))
}
