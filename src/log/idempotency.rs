//! Idempotent publish: `publish(..., idempotency_key => k)` writes at most
//! one event (or batch) per (stream, key) while the key is remembered,
//! `litebase_streams.idempotency_window` (24 hours by default).
//!
//! Keys live in `streams.idempotency_keys`, one row per (stream, key) with
//! the positions it published, written in the publishing transaction: a
//! rollback forgets the key with the events. A publish takes its positions,
//! then inserts its key (one statement); a second publish conflicts with the
//! row and returns its positions without writing an event; one that runs
//! while the first is still open waits for it, as a unique index makes any
//! inserter wait: the first commits (the second then returns its positions)
//! or rolls back (the second publishes). A row older
//! than the window counts as forgotten at once and is overwritten; the worker
//! deletes such rows in its housekeeping (delivery/maintenance.rs), so the
//! table holds about one window of keys.

use pgrx::pg_sys;

use crate::error::StreamsError;
use crate::gucs;
use crate::log::kept_plan::{spi, KeptPlan};
use crate::log::privileges;

thread_local! {
    static REMEMBERED_PLAN: std::cell::Cell<pg_sys::SPIPlanPtr> = const { std::cell::Cell::new(std::ptr::null_mut()) };
    static REMEMBER_PLAN: std::cell::Cell<pg_sys::SPIPlanPtr> = const { std::cell::Cell::new(std::ptr::null_mut()) };
    static SAME_PLAN: std::cell::Cell<pg_sys::SPIPlanPtr> = const { std::cell::Cell::new(std::ptr::null_mut()) };
}

/// The positions a remembered key published, in order.
static REMEMBERED: KeptPlan<3> = KeptPlan {
    sql: c"SELECT u.p FROM streams.idempotency_keys k, pg_catalog.unnest(k.positions) WITH ORDINALITY AS u(p, o)
           WHERE k.stream = $1 AND k.key = $2 AND k.created_at >= pg_catalog.statement_timestamp() - pg_catalog.make_interval(secs => $3)
           ORDER BY u.o",
    types: [pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::FLOAT8OID],
    plan: REMEMBERED_PLAN,
};

/// Remember a key with its positions, unless a live row has it: then no row
/// comes back. Waits for an open transaction that wrote the key.
static REMEMBER: KeptPlan<4> = KeptPlan {
    sql: c"INSERT INTO streams.idempotency_keys AS k (stream, key, positions, created_at)
           VALUES ($1, $2, $3, pg_catalog.statement_timestamp())
           ON CONFLICT (stream, key) DO UPDATE SET positions = excluded.positions, created_at = excluded.created_at
           WHERE k.created_at < pg_catalog.statement_timestamp() - pg_catalog.make_interval(secs => $4)
           RETURNING 1::bigint",
    types: [pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::INT8ARRAYOID, pg_sys::FLOAT8OID],
    plan: REMEMBER_PLAN,
};

/// Whether the events at positions $1 are the ones asked again: data $2 in
/// order, with type $3, key $4 and headers $5 (jsonb equality: the same
/// JSON value however it is spelled).
static SAME: KeptPlan<5> = KeptPlan {
    sql: c"SELECT coalesce(pg_catalog.array_agg(e.data ORDER BY e.position) = $2
                    AND pg_catalog.bool_and(e.type IS NOT DISTINCT FROM $3 AND e.key IS NOT DISTINCT FROM $4
                                            AND e.headers IS NOT DISTINCT FROM $5), false)
           FROM streams.event_log e WHERE e.position = ANY ($1)",
    types: [pg_sys::INT8ARRAYOID, pg_sys::JSONBARRAYOID, pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::JSONBOID],
    plan: SAME_PLAN,
};

/// What a repeated publish asks, to compare with what the key published.
pub(crate) struct Asked<'a> {
    /// The data of each event (a jsonb[] datum).
    pub data: pg_sys::Datum,
    /// type, key, headers (None: null).
    pub envelope: [Option<pg_sys::Datum>; 3],
    pub stream: &'a str,
    pub key: &'a str,
}

/// `positions`, when the events there are what `asked` asks; 23505 when
/// the key published something else (a key used again for another event).
///
/// # Safety
/// SAFETY: as for [`remembered`]; `asked.data` is a jsonb[] datum and the envelope's datums
/// are text, text and jsonb.
pub(crate) unsafe fn the_same(owner: pg_sys::Oid, positions: Vec<i64>, asked: &Asked<'_>) -> Vec<i64> {
    use pgrx::IntoDatum;
    let array = positions.as_slice().into_datum().expect("an array datum");
    let [type_, key, headers] = asked.envelope;
    let mut values =
        [array, asked.data, type_.unwrap_or(0.into()), key.unwrap_or(0.into()), headers.unwrap_or(0.into())];
    let nulls = [false, false, type_.is_none(), key.is_none(), headers.is_none()];
    let same = privileges::as_owner(owner, || {
        spi::connect();
        SAME.execute_with_nulls(&mut values, Some(nulls), pg_sys::SPI_OK_SELECT);
        let same = spi::first_bool();
        spi::finish();
        same
    });
    if same != Some(true) {
        StreamsError::IdempotencyKeyReused {
            stream: asked.stream.to_owned(),
            key: asked.key.to_owned(),
            position: positions.first().copied().unwrap_or_default(),
        }
        .raise();
    }
    positions
}

fn window() -> pg_sys::Datum {
    pg_sys::Datum::from((gucs::idempotency_window_s() as f64).to_bits() as usize)
}

/// The positions `key` published to `stream`, if it is remembered (a
/// committed publish, or one of this transaction).
///
/// # Safety
/// SAFETY: inside the publishing transaction, `stream` and `key` text datums, `owner` the
/// log's owner (the table is the owner's alone).
pub(crate) unsafe fn remembered(owner: pg_sys::Oid, stream: pg_sys::Datum, key: pg_sys::Datum) -> Option<Vec<i64>> {
    privileges::as_owner(owner, || {
        spi::connect();
        REMEMBERED.execute(&mut [stream, key, window()], pg_sys::SPI_OK_SELECT);
        let positions = spi::int8_column();
        spi::finish();
        (!positions.is_empty()).then_some(positions)
    })
}

/// Remember that `key` published `positions` to `stream`; `Some(original
/// positions)` when another publish has it (it committed while this one
/// waited): this one is then a duplicate and must write nothing.
///
/// # Safety
/// SAFETY: as for [`remembered`].
pub(crate) unsafe fn remember(
    owner: pg_sys::Oid,
    stream: pg_sys::Datum,
    key: pg_sys::Datum,
    positions: &[i64],
) -> Option<Vec<i64>> {
    use pgrx::IntoDatum;
    let array = positions.into_datum().expect("an array datum");
    let inserted = privileges::as_owner(owner, || {
        spi::connect();
        REMEMBER.execute(&mut [stream, key, array, window()], pg_sys::SPI_OK_INSERT_RETURNING);
        let inserted = pg_sys::SPI_processed > 0;
        spi::finish();
        inserted
    });
    if inserted {
        return None;
    }
    // The row that stopped the insert committed: read its positions with a
    // new snapshot (read committed takes one per statement).
    Some(remembered(owner, stream, key).unwrap_or_default())
}
