//! Expected version: `publish(..., expected_prev => p)` appends only while
//! the stream's newest event, counting other transactions' uncommitted
//! publishes to it, is at position `p` (0: the stream has none).
//!
//! Such publishers of one stream take a transaction-scoped lock of the
//! stream (an advisory lock tag of the extension's own, named by 64 bits of
//! the SHA-256 of the name: a publisher cannot pick a name of its own whose
//! lock is another stream's, as it could with a 32-bit FNV hash), then read
//! the newest position of the stream through its (stream, position) index
//! with a dirty snapshot, which sees committed and still-open inserts alike,
//! and take their positions while holding the lock: of concurrent appenders
//! that expect the same `p`, the first one commits and every later one finds
//! its event. Publishers without `expected_prev` take no such lock.

use pgrx::pg_sys;

use crate::error::{SpiContext, StreamsError};
use crate::log::partitions;
use litebase_streams_core::keys::stream_lock_name;

/// `locktag_field4` of stream locks: none of PostgreSQL's advisory lock
/// functions (1 and 2) nor of the subscriptions' claims.
const STREAM_TAG: u16 = 0x5354; // "ST"

/// Lock `stream` for appending with an expected version, until the
/// transaction ends. The wait obeys lock_timeout, cancel and deadlock
/// detection.
fn lock_stream(stream: &str) {
    let [high, low] = stream_lock_name(stream);
    let tag = pg_sys::LOCKTAG {
        // SAFETY: MyDatabaseId is set once the backend connected; a plain read.
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.to_u32(),
        locktag_field2: high,
        locktag_field3: low,
        locktag_field4: STREAM_TAG,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    };
    // SAFETY: a transaction-scoped lock on a tag of our own; a wait raises on
    // interrupts through pgrx's FFI guard.
    unsafe { pg_sys::LockAcquire(&tag, pg_sys::ExclusiveLock as pg_sys::LOCKMODE, false, false) };
}

/// The newest position of `stream` in `log`, committed or not (0: none),
/// read through `index`, the log's (stream, position) index.
///
/// # Safety
/// SAFETY: inside a transaction that holds a lock on `log`; `stream` is a text datum.
unsafe fn newest_position(log: pg_sys::Oid, index: pg_sys::Oid, stream: pg_sys::Datum) -> i64 {
    let heap = pg_sys::table_open(log, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
    let irel = pg_sys::index_open(index, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
    let mut snapshot: pg_sys::SnapshotData = std::mem::zeroed();
    snapshot.snapshot_type = pg_sys::SnapshotType::SNAPSHOT_DIRTY;
    let scan = pg_sys::index_beginscan(heap, irel, &mut snapshot, 1, 0);
    let mut key: pg_sys::ScanKeyData = std::mem::zeroed();
    pg_sys::ScanKeyEntryInitialize(
        &mut key,
        0,
        1,
        pg_sys::BTEqualStrategyNumber as u16,
        pg_sys::InvalidOid,
        *(*irel).rd_indcollation,
        pg_sys::Oid::from(pg_sys::F_TEXTEQ),
        stream,
    );
    pg_sys::index_rescan(scan, &mut key, 1, std::ptr::null_mut(), 0);
    let slot = pg_sys::table_slot_create(heap, std::ptr::null_mut());
    let mut newest = 0;
    if pg_sys::index_getnext_slot(scan, pg_sys::ScanDirection::BackwardScanDirection, slot) {
        let mut is_null = false;
        let datum = pg_sys::slot_getattr(slot, 1, &mut is_null);
        if !is_null {
            newest = datum.value() as i64;
        }
    }
    pg_sys::ExecDropSingleTupleTableSlot(slot);
    pg_sys::index_endscan(scan);
    pg_sys::index_close(irel, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
    pg_sys::table_close(heap, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
    newest
}

/// Lock `stream` and check that its newest event is at `expected`: 40001
/// naming the actual one otherwise, unless `duplicate` finds the publish
/// already done (an idempotent retry of the append that moved the stream):
/// then its positions.
///
/// # Safety
/// SAFETY: inside the publishing transaction, after the publish privilege check; `stream_datum`
/// is the text datum of `stream`.
pub(crate) unsafe fn check(
    log: pg_sys::Oid,
    owner: pg_sys::Oid,
    stream: &str,
    stream_datum: pg_sys::Datum,
    expected: i64,
    duplicate: impl FnOnce() -> Option<Vec<i64>>,
) -> Option<Vec<i64>> {
    lock_stream(stream);
    let actual = match newest_in_log(log, stream_datum) {
        0 => removed_head(owner, stream),
        newest => newest,
    };
    if actual == expected {
        return None;
    }
    if let Some(positions) = duplicate() {
        return Some(positions);
    }
    StreamsError::UnexpectedPrev { stream: stream.to_owned(), expected, actual }.raise()
}

/// The newest position of a stream with no event in the log, when
/// retention removed every one it had (0: none, or nothing removed): the
/// worker's count of final events (streams.stream_stats) still holds it.
/// So a stream with history is never taken for a new one (expected_prev
/// => 0), and the expected position names its last event, removed or not.
fn removed_head(owner: pg_sys::Oid, stream: &str) -> i64 {
    if partitions::first_kept().is_none() {
        return 0;
    }
    crate::log::privileges::as_owner(owner, || {
        pgrx::Spi::get_one_with_args::<i64>(
            // One row always (null: not counted), as get_one needs.
            "SELECT (SELECT s.last_position FROM streams.stream_stats s WHERE s.stream OPERATOR(pg_catalog.=) $1)",
            &[stream.into()],
        )
    })
    .context("reading the stream's count")
    .unwrap_or(0)
}

/// The newest position of `stream` in the log `log`, committed or not
/// (0: none): in a partitioned log, from the highest partition down, each
/// through its own (stream, position) index, stopping at the first that
/// has one.
///
/// # Safety
/// SAFETY: as [`newest_position`].
unsafe fn newest_in_log(log: pg_sys::Oid, stream: pg_sys::Datum) -> i64 {
    if !partitions::is_partitioned(log) {
        return newest_position(log, stream_index(log), stream);
    }
    for partition in partitions::of_table(log).iter().rev() {
        let Some(index) = stream_index_of(partition.oid) else { continue };
        let newest = newest_position(partition.oid, index, stream);
        if newest != 0 {
            return newest;
        }
    }
    0
}

/// The OID of `streams.event_log_stream_position` (a 0.2.0 log, not
/// partitioned yet).
///
/// # Safety
/// SAFETY: a catalog lookup inside a transaction.
unsafe fn stream_index(log: pg_sys::Oid) -> pg_sys::Oid {
    let schema = pg_sys::get_rel_namespace(log);
    let index = pg_sys::get_relname_relid(c"event_log_stream_position".as_ptr(), schema);
    if index == pg_sys::InvalidOid {
        StreamsError::MissingObject("index streams.event_log_stream_position").raise();
    }
    index
}

/// The btree index on (stream, position) of the partition `table`, if it
/// has one (a partition an operator attached may not).
///
/// # Safety
/// SAFETY: inside a transaction that holds a lock on `table`'s parent.
unsafe fn stream_index_of(table: pg_sys::Oid) -> Option<pg_sys::Oid> {
    let rel = pg_sys::table_open(table, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
    let indexes = pgrx::PgList::<std::ffi::c_void>::from_pg(pg_sys::RelationGetIndexList(rel));
    let mut found = None;
    for i in 0..indexes.len() {
        let index = pg_sys::Oid::from(indexes.get_oid(i).map_or(0, u32::from));
        let irel = pg_sys::index_open(index, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let form = &*(*irel).rd_index;
        let keys = form.indkey.values.as_slice(form.indnkeyatts as usize);
        let btree = (*(*irel).rd_rel).relam == pg_sys::BTREE_AM_OID;
        pg_sys::index_close(irel, pg_sys::NoLock as pg_sys::LOCKMODE);
        // Both key columns plain (an expression's attnum is 0).
        if btree && keys == [2, 1] {
            found = Some(index);
            break;
        }
    }
    pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
    found
}
