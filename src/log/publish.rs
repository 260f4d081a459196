//! The publish path: check the stream and the privilege, take positions,
//! and append the rows as the log's owner.
//!
//! `streams.publish` and `streams.publish_batch` are C-level functions that
//! append the rows directly (append.rs), passing the caller's jsonb through
//! untouched, or through INSERT plans kept per backend when the table was
//! changed. Publishers never NOTIFY and never wait for one another; the
//! worker delivers after commit.
//!
//! They run as the caller (not SECURITY DEFINER), check the caller's publish
//! privilege on the stream (privileges.rs), and then write as the owner of
//! the log, the way a SECURITY DEFINER function would; the INSERT plans are
//! prepared and run under a pinned search_path (kept_plan.rs).
//!
//! Taking a position announces the transaction first (announce.rs).

use std::cell::Cell;

use pgrx::prelude::*;
use pgrx::IntoDatum;

use crate::error::{OrRaise, StreamsError};
use crate::ffi;
use crate::gucs;
use crate::log::announce::next_position;
use crate::log::append::{Appender, Row};
use crate::log::envelope::Envelope;
use crate::log::kept_plan::{spi, KeptPlan};
use crate::log::partitions;
use crate::log::privileges;
use crate::log::{expected, idempotency};
use litebase_streams_core::envelope;
use litebase_streams_core::names::validate_stream_name;

/// The sequence that hands out positions, looked up per call so that a dropped
/// and recreated extension is picked up. It also names the log: a re-created
/// log has a new one (privileges.rs keys its cached answers by it).
pub(crate) fn position_sequence() -> pg_sys::Oid {
    // SAFETY: catalog lookups inside the publishing transaction, with static C strings; pgrx's FFI
    // guard turns an ERROR (no streams schema) into a Rust panic.
    unsafe {
        let schema = pg_sys::get_namespace_oid(c"streams".as_ptr(), false);
        let seq = pg_sys::get_relname_relid(c"position_seq".as_ptr(), schema);
        if seq == pg_sys::InvalidOid {
            StreamsError::MissingObject("sequence streams.position_seq").raise();
        }
        seq
    }
}

/// `streams.publish(stream, data, type, key, headers, idempotency_key,
/// expected_prev) → bigint`, declared in sql/streams.sql. A C-level
/// function so that the caller's jsonb datum goes into the row untouched:
/// no parsing or planning per call, no conversion of the payload. Also
/// called with the two arguments of 0.2.0's declaration (a backend that
/// loaded the new library before `ALTER EXTENSION ... UPDATE`).
///
/// # Safety
/// SAFETY: only fmgr calls it, as `streams.publish`, so `fcinfo` is valid and holds its
/// arguments; each is read only after its null check.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn litebase_streams_publish(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    let stream = pgrx::fcinfo::pg_getarg::<&str>(fcinfo, 0);
    if pgrx::fcinfo::pg_arg_is_null(fcinfo, 1) {
        StreamsError::NullArgument("data").raise();
    }
    let data = pgrx::fcinfo::pg_getarg_datum_raw(fcinfo, 1);
    check_size(data);
    let request = Request::from_args(fcinfo, 2);
    let sequence = checked_stream(stream);
    let stream_datum = pgrx::fcinfo::pg_getarg_datum_raw(fcinfo, 0);
    let one = || one_element_array(data);
    let written = request.write(sequence, stream.unwrap_or_default(), stream_datum, 1, one, |positions| {
        let tx = current_tx();
        let row = request.row(positions[0], stream_datum, tx, data);
        write_as_owner(sequence, std::iter::once(row), || {
            insert_through_spi(&INSERT_EVENT, &INSERT_EVENT_ENVELOPE, row)
        });
    });
    PUBLISH_RESULT.with(|r| r.set(Some(written.duplicate)));
    pg_sys::Datum::from(written.positions[0])
}

ffi::function_info_v1!(pg_finfo_litebase_streams_publish);

/// `streams._publish_batch(stream, data jsonb[], type, key, headers,
/// idempotency_key, expected_prev) → bigint[]`, behind
/// `streams.publish_batch` (sql/streams.sql): one position per element, in
/// array order, then every row appended (or one INSERT of all of them). The
/// envelope, idempotency key and expected version are the batch's: every
/// event gets the same type, key and headers; the key makes the whole batch
/// idempotent; and the stream must be at `expected_prev` before its first
/// event.
///
/// # Safety
/// SAFETY: only fmgr calls it, as `streams._publish_batch`, so `fcinfo` is valid and argument 1
/// is a jsonb[] datum, read after its null check and detoasted before use.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn litebase_streams_publish_batch(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    let stream = pgrx::fcinfo::pg_getarg::<&str>(fcinfo, 0);
    if pgrx::fcinfo::pg_arg_is_null(fcinfo, 1) {
        StreamsError::NullArgument("data").raise();
    }
    let array =
        pg_sys::pg_detoast_datum(pgrx::fcinfo::pg_getarg_datum_raw(fcinfo, 1).cast_mut_ptr()) as *mut pg_sys::ArrayType;
    if pg_sys::array_contains_nulls(array) {
        StreamsError::NullArgument("each element of data").raise();
    }
    let request = Request::from_args(fcinfo, 2);
    let sequence = checked_stream(stream); // also for an empty array
    let elements = array_elements(array);
    for &element in &elements {
        check_size(element);
    }
    let stream_datum = pgrx::fcinfo::pg_getarg_datum_raw(fcinfo, 0);
    let all = || pg_sys::Datum::from(array);
    let written = request.write(sequence, stream.unwrap_or_default(), stream_datum, elements.len(), all, |positions| {
        let tx = current_tx();
        let rows =
            positions.iter().zip(&elements).map(|(&position, &data)| request.row(position, stream_datum, tx, data));
        // INSERT_BATCH's arguments: the positions and the data as arrays, in a row's places.
        let positions = positions.into_datum().expect("an array datum");
        let mut arrays = request.row(0, stream_datum, tx, pg_sys::Datum::from(array));
        arrays[0] = Some(positions);
        write_as_owner(sequence, rows, || insert_through_spi(&INSERT_BATCH, &INSERT_BATCH_ENVELOPE, arrays));
    });
    PUBLISH_RESULT.with(|r| r.set(Some(written.duplicate)));
    written.positions.as_slice().into_datum().expect("an array datum")
}

ffi::function_info_v1!(pg_finfo_litebase_streams_publish_batch);

/// One event of a captured change (capture/trigger.rs): its type, key
/// (null for a table without one) and data, as datums of the current
/// memory context.
#[derive(Clone, Copy)]
pub(crate) struct Change {
    pub type_: pg_sys::Datum,
    pub key: Option<pg_sys::Datum>,
    pub data: pg_sys::Datum,
}

/// The stream of a captured table, checked as [`checked_stream`] checks a
/// publisher's, but for `publisher`, the table's owner: whoever changes the
/// table publishes with its owner's privilege. Returns the position sequence.
pub(crate) fn checked_stream_for(stream: &str, publisher: pg_sys::Oid) -> pg_sys::Oid {
    validate_stream_name(stream).or_raise();
    crate::require_preload().or_raise();
    let sequence = position_sequence();
    lock_log_first(sequence);
    privileges::as_owner(publisher, || privileges::check_publish(stream, sequence));
    sequence
}

/// Append `changes` to `stream` (checked by [`checked_stream_for`]), one
/// position each, in order, in the caller's transaction.
///
/// # Safety
/// SAFETY: inside the changing transaction, `stream_datum` the text datum of the checked stream
/// and every datum of `changes` valid until this returns.
pub(crate) unsafe fn append_changes(sequence: pg_sys::Oid, stream_datum: pg_sys::Datum, changes: &[Change]) {
    if changes.is_empty() {
        return;
    }
    for change in changes {
        check_size(change.data);
    }
    let tx = current_tx();
    let rows: Vec<Row> = changes
        .iter()
        .map(|change| {
            let position = next_position(sequence);
            let position = Some(pg_sys::Datum::from(position));
            [position, Some(stream_datum), Some(tx), Some(change.data), Some(change.type_), change.key, None]
        })
        .collect();
    write_as_owner(sequence, rows.iter().copied(), || {
        for &row in &rows {
            insert_through_spi(&INSERT_EVENT, &INSERT_EVENT_ENVELOPE, row);
        }
    });
}

/// What a publish asks beside its data: the envelope, an idempotency key
/// and an expected version.
struct Request {
    fcinfo: pg_sys::FunctionCallInfo,
    /// The argument number of `type`.
    first: usize,
    envelope: Envelope,
    idempotency_key: Option<pg_sys::Datum>,
    expected_prev: Option<i64>,
}

/// What [`Request::write`] did: the positions of the events, and whether
/// they were published before (nothing was written).
struct Written {
    positions: Vec<i64>,
    duplicate: bool,
}

impl Request {
    /// Arguments `first..first + 5` of the call, checked (22023): type, key,
    /// headers, idempotency_key, expected_prev. Arguments past the call's
    /// own count are null (0.2.0's declarations pass two).
    ///
    /// # Safety
    /// SAFETY: `fcinfo` is a valid call whose arguments from `first` on have the declared types.
    unsafe fn from_args(fcinfo: pg_sys::FunctionCallInfo, first: usize) -> Request {
        if ((*fcinfo).nargs as usize) < first + 5 {
            return Request {
                fcinfo,
                first,
                envelope: Envelope::default(),
                idempotency_key: None,
                expected_prev: None,
            };
        }
        let envelope = Envelope::from_args(fcinfo, first);
        let idempotency_key = (!pgrx::fcinfo::pg_arg_is_null(fcinfo, first + 3)).then(|| {
            let key = pgrx::fcinfo::pg_getarg::<&str>(fcinfo, first + 3).unwrap_or_default();
            envelope::check_idempotency_key(key).map_err(crate::log::envelope::invalid).or_raise();
            pgrx::fcinfo::pg_getarg_datum_raw(fcinfo, first + 3)
        });
        let expected_prev = pgrx::fcinfo::pg_getarg::<i64>(fcinfo, first + 4);
        if let Some(value) = expected_prev.filter(|&p| p < 0) {
            StreamsError::NegativeArgument { argument: "expected_prev", value }.raise();
        }
        Request { fcinfo, first, envelope, idempotency_key, expected_prev }
    }

    /// A row of the log for one event of this request.
    fn row(&self, position: i64, stream: pg_sys::Datum, tx: pg_sys::Datum, data: pg_sys::Datum) -> Row {
        let [type_, key, headers] = self.envelope.columns();
        [Some(pg_sys::Datum::from(position)), Some(stream), Some(tx), Some(data), type_, key, headers]
    }

    /// Take `count` positions and `append` them, unless the idempotency key
    /// is remembered; with an expected version, only when the stream is at
    /// it (40001 otherwise).
    ///
    /// # Safety
    /// SAFETY: inside the publishing transaction, after [`checked_stream`]; `stream_datum` is the
    /// text datum of `stream`.
    unsafe fn write(
        &self,
        sequence: pg_sys::Oid,
        stream: &str,
        stream_datum: pg_sys::Datum,
        count: usize,
        data_array: impl Fn() -> pg_sys::Datum,
        append: impl FnOnce(&[i64]),
    ) -> Written {
        let (owner, log) = log_owner_and_table(sequence);
        let duplicate = |positions: Vec<i64>| {
            let key = pgrx::fcinfo::pg_getarg::<&str>(self.fcinfo, self.first + 3).unwrap_or_default();
            let asked = idempotency::Asked { data: data_array(), envelope: self.envelope.columns(), stream, key };
            Written { positions: idempotency::the_same(owner, positions, &asked), duplicate: true }
        };
        if let Some(expected) = self.expected_prev {
            // A retry of the append that moved the stream (committed while
            // this one waited for the stream) is a duplicate, not a conflict.
            let retried = || self.idempotency_key.and_then(|key| idempotency::remembered(owner, stream_datum, key));
            if let Some(positions) = expected::check(log, owner, stream, stream_datum, expected, retried) {
                return duplicate(positions);
            }
        }
        if count == 0 {
            // An empty batch publishes nothing, so there is nothing to
            // remember: a key remembered with no positions would read as
            // forgotten, and its retry would fail as a key used for another event.
            return Written { positions: Vec::new(), duplicate: false };
        }
        // The positions first, then the key: a fresh publish (the common
        // case) costs one statement; a repeat wastes the positions it took
        // (gaps, as a rollback leaves).
        let positions: Vec<i64> = (0..count).map(|_| next_position(sequence)).collect();
        if let Some(key) = self.idempotency_key {
            if let Some(original) = idempotency::remember(owner, stream_datum, key, &positions) {
                return duplicate(original);
            }
        }
        append(&positions);
        Written { positions, duplicate: false }
    }
}

/// Run the INSERT of `row` (its values in column order) through SPI: the
/// plan of the four columns of 0.2.0 when the envelope is null, so that a
/// table someone changed need not have the envelope's columns for events
/// without one, else the plan of all seven.
///
/// # Safety
/// SAFETY: between SPI's connect and finish (as `write_as_owner` calls it), with the datums of
/// the plans' types.
unsafe fn insert_through_spi(plain: &'static KeptPlan<4>, enveloped: &'static KeptPlan<7>, row: Row) {
    let mut values = row.map(|value| value.unwrap_or(pg_sys::Datum::from(0)));
    if row[4..].iter().all(Option::is_none) {
        let mut four = [values[0], values[1], values[2], values[3]];
        plain.execute(&mut four, pg_sys::SPI_OK_INSERT)
    } else {
        enveloped.execute_with_nulls(&mut values, Some(row.map(|value| value.is_none())), pg_sys::SPI_OK_INSERT)
    }
}

thread_local! {
    /// Whether this backend's last publish was a duplicate (for
    /// `streams.publish_once`).
    static PUBLISH_RESULT: Cell<Option<bool>> = const { Cell::new(None) };
}

/// `streams._last_publish_duplicate() → boolean`: whether this session's
/// last publish found its idempotency key remembered (null before any).
#[pg_extern(sql = false)]
fn _last_publish_duplicate() -> Option<bool> {
    PUBLISH_RESULT.with(|r| r.get())
}

/// A jsonb[] of one element, `data`.
fn one_element_array(data: pg_sys::Datum) -> pg_sys::Datum {
    let mut element = data;
    // SAFETY: one jsonb datum; construct_array copies it into a new array in the current memory
    // context, and raises (through pgrx's FFI guard) when out of memory.
    let array = unsafe {
        pg_sys::construct_array(&mut element, 1, pg_sys::JSONBOID, -1, false, pg_sys::TYPALIGN_INT as std::ffi::c_char)
    };
    pg_sys::Datum::from(array)
}

/// The elements of a jsonb array without nulls (checked by the caller).
///
/// # Safety
/// SAFETY: `array` must be a detoasted jsonb[] without nulls (no nulls array is passed to
/// deconstruct_array); the datums point into it, in the current memory context.
unsafe fn array_elements(array: *mut pg_sys::ArrayType) -> Vec<pg_sys::Datum> {
    let (mut values, mut count) = (std::ptr::null_mut(), 0);
    pg_sys::deconstruct_array(
        array,
        pg_sys::JSONBOID,
        -1,
        false,
        pg_sys::TYPALIGN_INT as std::ffi::c_char,
        &mut values,
        std::ptr::null_mut(),
        &mut count,
    );
    (0..count as usize).map(|i| *values.add(i)).collect()
}

thread_local! {
    static INSERT_EVENT_PLAN: Cell<pg_sys::SPIPlanPtr> = const { Cell::new(std::ptr::null_mut()) };
    static INSERT_BATCH_PLAN: Cell<pg_sys::SPIPlanPtr> = const { Cell::new(std::ptr::null_mut()) };
    static INSERT_EVENT_ENVELOPE_PLAN: Cell<pg_sys::SPIPlanPtr> = const { Cell::new(std::ptr::null_mut()) };
    static INSERT_BATCH_ENVELOPE_PLAN: Cell<pg_sys::SPIPlanPtr> = const { Cell::new(std::ptr::null_mut()) };
    /// (sequence, owner of the log, `streams.event_log`) of the last publish.
    static LOG: Cell<(pg_sys::Oid, pg_sys::Oid, pg_sys::Oid)> =
        const { Cell::new((pg_sys::InvalidOid, pg_sys::InvalidOid, pg_sys::InvalidOid)) };
}

static INSERT_EVENT: KeptPlan<4> = KeptPlan {
    sql: c"INSERT INTO streams.event_log (position, stream, tx, data) VALUES ($1, $2, $3, $4)",
    types: [pg_sys::INT8OID, pg_sys::TEXTOID, pg_sys::XID8OID, pg_sys::JSONBOID],
    plan: INSERT_EVENT_PLAN,
};

static INSERT_EVENT_ENVELOPE: KeptPlan<7> = KeptPlan {
    sql: c"INSERT INTO streams.event_log (position, stream, tx, data, type, key, headers)
           VALUES ($1, $2, $3, $4, $5, $6, $7)",
    types: [
        pg_sys::INT8OID,
        pg_sys::TEXTOID,
        pg_sys::XID8OID,
        pg_sys::JSONBOID,
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
        pg_sys::JSONBOID,
    ],
    plan: INSERT_EVENT_ENVELOPE_PLAN,
};

static INSERT_BATCH_ENVELOPE: KeptPlan<7> = KeptPlan {
    sql: c"INSERT INTO streams.event_log (position, stream, tx, data, type, key, headers)
           SELECT u.position, $2, $3, u.data, $5, $6, $7
           FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($4)) AS u(position, data)",
    types: [
        pg_sys::INT8ARRAYOID,
        pg_sys::TEXTOID,
        pg_sys::XID8OID,
        pg_sys::JSONBARRAYOID,
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
        pg_sys::JSONBOID,
    ],
    plan: INSERT_BATCH_ENVELOPE_PLAN,
};

static INSERT_BATCH: KeptPlan<4> = KeptPlan {
    sql: c"INSERT INTO streams.event_log (position, stream, tx, data)
           SELECT u.position, $2, $3, u.data
           FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($4)) AS u(position, data)",
    types: [pg_sys::INT8ARRAYOID, pg_sys::TEXTOID, pg_sys::XID8OID, pg_sys::JSONBARRAYOID],
    plan: INSERT_BATCH_PLAN,
};

/// The publishing transaction's xid8 (assigning one if needed).
fn current_tx() -> pg_sys::Datum {
    // SAFETY: called during a publish, inside the caller's transaction; pgrx's FFI guard turns an
    // ERROR (say, a read-only transaction) into a Rust panic.
    pg_sys::Datum::from(unsafe { pg_sys::GetTopFullTransactionId() }.value)
}

/// Write `rows` (position, stream, tx, data; none null) as the owner of the
/// log, the caller's privilege to publish checked before: appended directly
/// (append.rs), or through `insert`, an INSERT of the same rows through SPI,
/// when the table is not as the extension made it.
///
/// # Safety
/// SAFETY: call inside a transaction; `insert` runs between SPI's connect and finish, and an
/// ERROR's (sub)transaction abort restores the user id, SPI and what the appender opened.
unsafe fn write_as_owner(sequence: pg_sys::Oid, rows: impl Iterator<Item = Row>, insert: impl FnOnce()) {
    let (owner, log) = log_owner_and_table(sequence);
    let rows: Vec<Row> = rows.collect();
    let positions = rows.iter().filter_map(|row| row[0]).map(|p| p.value() as i64);
    let (low, high) = positions.fold((i64::MAX, i64::MIN), |(low, high), p| (low.min(p), high.max(p)));
    if low > high {
        return;
    }
    privileges::as_owner(owner, || {
        if partitions::is_partitioned(log) {
            partitions::ensure_holding(log, low, high);
        }
        match Appender::open(log, low, high) {
            Some(mut appender) => {
                if !appender.has_envelope() && rows.iter().any(|row| row[4..].iter().any(Option::is_some)) {
                    appender.close();
                    StreamsError::MissingObject(
                        "the envelope columns of streams.event_log (ALTER EXTENSION litebase_streams UPDATE)",
                    )
                    .raise();
                }
                for row in rows {
                    appender.append(row);
                }
                appender.close();
            }
            None => {
                spi::connect();
                insert();
                spi::finish();
            }
        }
    });
}

/// The owner of the position sequence: the role that created the extension,
/// which owns every table of the log (publish and subscriptions write as it).
pub(crate) fn log_owner(sequence: pg_sys::Oid) -> pg_sys::Oid {
    log_owner_and_table(sequence).0
}

/// The owner of the log (see [`log_owner`]) and its `streams.event_log`,
/// looked up once per log (a re-created log has a new sequence).
fn log_owner_and_table(sequence: pg_sys::Oid) -> (pg_sys::Oid, pg_sys::Oid) {
    let (cached_for, owner, log) = LOG.with(|o| o.get());
    if cached_for == sequence {
        return (owner, log);
    }
    // SAFETY: syscache lookups of a relation we just resolved by name and of
    // its schema's table; the tuple is released before returning.
    let (owner, log) = unsafe {
        let tuple = pg_sys::SearchSysCache1(pg_sys::SysCacheIdentifier::RELOID as i32, pg_sys::Datum::from(sequence));
        if tuple.is_null() {
            StreamsError::MissingObject("sequence streams.position_seq").raise();
        }
        let data = (*tuple).t_data;
        let form = (data as *const u8).add((*data).t_hoff as usize) as *const pg_sys::FormData_pg_class;
        let (owner, schema) = ((*form).relowner, (*form).relnamespace);
        pg_sys::ReleaseSysCache(tuple);
        let log = pg_sys::get_relname_relid(c"event_log".as_ptr(), schema);
        if log == pg_sys::InvalidOid {
            StreamsError::MissingObject("table streams.event_log").raise();
        }
        (owner, log)
    };
    LOG.with(|o| o.set((sequence, owner, log)));
    (owner, log)
}

/// Refuse data larger than `litebase_streams.max_event_size` (54000).
fn check_size(data: pg_sys::Datum) {
    let Some(limit) = gucs::max_event_size() else { return };
    // SAFETY: a jsonb datum; the size comes from its (possibly toasted) header.
    let size = unsafe { pg_sys::toast_raw_datum_size(data) };
    if size > limit {
        StreamsError::EventTooLarge { size, limit }.raise();
    }
}

/// The stream argument, checked: not null (22004), follows the naming rule
/// (22023), the server is set up for publishing, and the caller may publish
/// to it (42501). Returns the position sequence.
fn checked_stream(stream: Option<&str>) -> pg_sys::Oid {
    let stream = stream.ok_or(StreamsError::NullArgument("stream")).or_raise();
    validate_stream_name(stream).or_raise();
    crate::require_preload().or_raise();
    let sequence = position_sequence();
    lock_log_first(sequence);
    privileges::check_publish(stream, sequence);
    sequence
}

/// Lock `streams.event_log` before reading anything else of the extension's
/// (the grants): the log comes first in every lock order, the worker's, the
/// readers' and every upgrade step's, so that a publisher waits behind an
/// `ALTER EXTENSION ... UPDATE` instead of deadlocking with it. A lock the
/// transaction already holds costs a local lookup.
fn lock_log_first(sequence: pg_sys::Oid) {
    let (_, log) = log_owner_and_table(sequence);
    // SAFETY: a relation lock inside the publishing transaction; pgrx's FFI guard turns an ERROR
    // (a lock timeout, a cancel) into a Rust panic.
    unsafe { pg_sys::LockRelationOid(log, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE) };
}
