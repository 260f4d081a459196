//! The publish path: allocate a position, announce it in shared memory, and
//! clear the announcement when the transaction ends.
//!
//! `streams.publish` and `streams.publish_batch` are C-level functions that
//! insert through plans kept per backend, passing the caller's jsonb through
//! untouched. Publishers never NOTIFY and never wait for one another; the
//! worker delivers after commit.
//!
//! The transaction callback is registered once, when the library is preloaded,
//! and does nothing in transactions that did not publish. At commit and abort
//! it only touches atomics and sets the worker's latch: nothing there may fail.

use std::cell::Cell;
use std::ffi::c_void;

use pgrx::prelude::*;
use pgrx::IntoDatum;

use crate::error::{OrRaise, StreamsError};
use crate::notify::validate_stream_name;
use crate::pg_decls;
use crate::shmem::{self, DbEntry, PublisherSlot};

/// This backend's open publishing transaction.
#[derive(Clone, Copy)]
struct Publishing {
    slot: &'static PublisherSlot,
    worker: Option<&'static DbEntry>,
}

thread_local! {
    static PUBLISHING: Cell<Option<Publishing>> = const { Cell::new(None) };
    static WORKER_ENTRY: Cell<Option<&'static DbEntry>> = const { Cell::new(None) };
}

/// Register the transaction callback (preload only: it then lives in every backend).
pub unsafe fn init() {
    pg_sys::RegisterXactCallback(Some(xact_callback), std::ptr::null_mut());
}

/// The sequence that hands out positions, looked up per call so that a dropped
/// and recreated extension is picked up.
fn position_sequence() -> pg_sys::Oid {
    unsafe {
        let schema = pg_sys::get_namespace_oid(c"streams".as_ptr(), false);
        let seq = pg_sys::get_relname_relid(c"position_seq".as_ptr(), schema);
        if seq == pg_sys::InvalidOid {
            error!("sequence streams.position_seq is missing; reinstall litebase_streams");
        }
        seq
    }
}

/// `streams.publish(stream text, data jsonb) → bigint`, declared in
/// sql/streams.sql. A C-level function so that the caller's jsonb datum goes
/// into the INSERT untouched, through a plan prepared once per backend: no
/// parsing or planning per call, no conversion of the payload.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn litebase_streams_publish(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    let stream = pgrx::fcinfo::pg_getarg::<&str>(fcinfo, 0);
    if pgrx::fcinfo::pg_arg_is_null(fcinfo, 1) {
        StreamsError::NullArgument("data").raise();
    }
    checked_stream(stream);
    let position = next_position();
    let stream_datum = pgrx::fcinfo::pg_getarg_datum_raw(fcinfo, 0);
    let data_datum = pgrx::fcinfo::pg_getarg_datum_raw(fcinfo, 1);
    insert_event(position, stream_datum, data_datum);
    pg_sys::Datum::from(position)
}

pg_decls::function_info_v1!(pg_finfo_litebase_streams_publish);

/// `streams._publish_batch(stream text, data jsonb[]) → bigint[]`, behind
/// `streams.publish_batch` (sql/streams.sql): one position per element, in
/// array order, then one INSERT of all rows through a kept plan.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn litebase_streams_publish_batch(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    let stream = pgrx::fcinfo::pg_getarg::<&str>(fcinfo, 0);
    if pgrx::fcinfo::pg_arg_is_null(fcinfo, 1) {
        StreamsError::NullArgument("data").raise();
    }
    let array = pg_sys::pg_detoast_datum(pgrx::fcinfo::pg_getarg_datum_raw(fcinfo, 1).cast_mut_ptr())
        as *mut pg_sys::ArrayType;
    if pg_sys::array_contains_nulls(array) {
        StreamsError::NullArgument("each element of data").raise();
    }
    let dims = (array as *mut u8).add(std::mem::size_of::<pg_sys::ArrayType>()) as *mut i32;
    let count = pg_sys::ArrayGetNItems((*array).ndim, dims);
    checked_stream(stream); // also for an empty array
    let positions: Vec<i64> = (0..count).map(|_| next_position()).collect();
    let positions = positions.into_datum().expect("an array datum");
    let stream = pgrx::fcinfo::pg_getarg_datum_raw(fcinfo, 0);
    run_kept_plan(&INSERT_BATCH, [positions, stream, current_tx(), pg_sys::Datum::from(array)]);
    positions
}

pg_decls::function_info_v1!(pg_finfo_litebase_streams_publish_batch);

/// An INSERT planned once per backend and kept; the plan cache re-plans it
/// when the table changes (even a dropped and recreated extension).
struct KeptInsert {
    sql: &'static std::ffi::CStr,
    types: [pg_sys::Oid; 4],
    plan: std::thread::LocalKey<Cell<pg_sys::SPIPlanPtr>>,
}

thread_local! {
    static INSERT_EVENT_PLAN: Cell<pg_sys::SPIPlanPtr> = const { Cell::new(std::ptr::null_mut()) };
    static INSERT_BATCH_PLAN: Cell<pg_sys::SPIPlanPtr> = const { Cell::new(std::ptr::null_mut()) };
}

static INSERT_EVENT: KeptInsert = KeptInsert {
    sql: c"INSERT INTO streams.event_log (position, stream, tx, data) VALUES ($1, $2, $3, $4)",
    types: [pg_sys::INT8OID, pg_sys::TEXTOID, pg_sys::XID8OID, pg_sys::JSONBOID],
    plan: INSERT_EVENT_PLAN,
};

static INSERT_BATCH: KeptInsert = KeptInsert {
    sql: c"INSERT INTO streams.event_log (position, stream, tx, data)
           SELECT u.position, $2, $3, u.data FROM unnest($1, $4) AS u(position, data)",
    types: [pg_sys::INT8ARRAYOID, pg_sys::TEXTOID, pg_sys::XID8OID, pg_sys::JSONBARRAYOID],
    plan: INSERT_BATCH_PLAN,
};

/// The publishing transaction's xid8 (assigning one if needed).
fn current_tx() -> pg_sys::Datum {
    pg_sys::Datum::from(unsafe { pg_sys::GetTopFullTransactionId() }.value)
}

unsafe fn insert_event(position: i64, stream: pg_sys::Datum, data: pg_sys::Datum) {
    run_kept_plan(&INSERT_EVENT, [pg_sys::Datum::from(position), stream, current_tx(), data]);
}

unsafe fn run_kept_plan(insert: &'static KeptInsert, mut values: [pg_sys::Datum; 4]) {
    if pg_sys::SPI_connect() != pg_sys::SPI_OK_CONNECT as i32 {
        error!("litebase_streams: SPI_connect failed");
    }
    let mut plan = insert.plan.with(|p| p.get());
    if plan.is_null() {
        let mut types = insert.types;
        plan = pg_sys::SPI_prepare(insert.sql.as_ptr(), types.len() as i32, types.as_mut_ptr());
        if plan.is_null() || pg_sys::SPI_keepplan(plan) != 0 {
            error!("litebase_streams: cannot prepare the event insert");
        }
        insert.plan.with(|p| p.set(plan));
    }
    let status = pg_sys::SPI_execute_plan(plan, values.as_mut_ptr(), std::ptr::null(), false, 0);
    if status != pg_sys::SPI_OK_INSERT as i32 {
        error!("litebase_streams: event insert failed (SPI status {status})");
    }
    pg_sys::SPI_finish();
}

/// The stream argument, checked: not null (22004), follows the naming rule
/// (22023); and the server is set up for publishing.
fn checked_stream(stream: Option<&str>) -> &str {
    let stream = stream.ok_or(StreamsError::NullArgument("stream")).or_raise();
    validate_stream_name(stream).or_raise();
    crate::require_preload().or_raise();
    stream
}

/// Allocate a position, announcing the transaction as an open publisher first.
fn next_position() -> i64 {
    let first = PUBLISHING.with(|p| p.get()).is_none();
    if first {
        announce();
    }
    let position = pg_decls::nextval(position_sequence());
    if first {
        PUBLISHING.with(|p| p.get()).expect("announced above").slot.hold(position as u64);
    }
    position
}

/// Mark this backend's slot as allocating *before* the first position is
/// taken, so no worker can compute a horizon past it, and remember it so the
/// transaction's end clears it, even if the allocation itself fails.
fn announce() {
    let (db, procno) = unsafe { (pg_sys::MyDatabaseId, (*pg_sys::MyProc).pgprocno) };
    let slot = shmem::my_slot(procno).ok_or(StreamsError::NoPublisherSlot(procno)).or_raise();
    // The database's entry never moves while this backend is connected to it.
    let worker = WORKER_ENTRY.with(|cached| {
        cached.get().or_else(|| {
            let entry = shmem::find_db(db).or_else(|| shmem::claim_db(db));
            cached.set(entry);
            entry
        })
    });
    slot.begin(db);
    PUBLISHING.with(|p| p.set(Some(Publishing { slot, worker })));
}

/// Clear the slot and wake the worker. Atomics and `SetLatch` only.
fn finish() {
    if let Some(Publishing { slot, worker }) = PUBLISHING.with(|p| p.take()) {
        slot.release();
        if let Some(worker) = worker {
            worker.wake_worker();
        }
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn xact_callback(event: pg_sys::XactEvent::Type, _arg: *mut c_void) {
    use pg_sys::XactEvent::*;
    match event {
        // The last moment an error can still stop the PREPARE.
        XACT_EVENT_PRE_PREPARE if PUBLISHING.with(|p| p.get()).is_some() => {
            StreamsError::PreparedPublish.raise()
        }
        XACT_EVENT_COMMIT | XACT_EVENT_PARALLEL_COMMIT | XACT_EVENT_ABORT
        | XACT_EVENT_PARALLEL_ABORT | XACT_EVENT_PREPARE => finish(),
        _ => {}
    }
}
