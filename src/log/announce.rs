//! A publishing transaction in shared memory: it announces itself before
//! it takes its first position (so no worker computes a horizon past it),
//! holds its lowest position, and leaves at commit or abort.
//!
//! The transaction callback is registered once, when the library is
//! preloaded, and does nothing in transactions that did not publish. At
//! commit and abort it only touches atomics and sets the worker's latch:
//! nothing there may fail. Before the first position, a publisher waits
//! while the worker is more than `litebase_streams.max_backlog` behind.

use std::cell::Cell;
use std::ffi::c_void;

use pgrx::prelude::*;

use crate::error::{OrRaise, StreamsError};
use crate::ffi;
use crate::gucs;
use crate::log::privileges;
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
///
/// # Safety
/// SAFETY: call only from `_PG_init` during shared_preload_libraries, in the single-threaded
/// postmaster, so every backend it forks inherits the registration.
pub unsafe fn init() {
    pg_sys::RegisterXactCallback(Some(xact_callback), std::ptr::null_mut());
}

/// Allocate a position, announcing the transaction as an open publisher first.
///
/// When taking the first position fails (a read-only transaction, a lock
/// timeout, a cancel), the announcement is withdrawn before the error goes
/// on: a `ROLLBACK TO SAVEPOINT` does not end the transaction, and a slot left
/// "allocating" would hold the horizon with no position to show for it.
pub(crate) fn next_position(sequence: pg_sys::Oid) -> i64 {
    if PUBLISHING.with(|p| p.get()).is_some() {
        return took(above_horizon(ffi::nextval(sequence), sequence));
    }
    wait_for_backlog();
    announce();
    let position = PgTryBuilder::new(|| above_horizon(ffi::nextval(sequence), sequence))
        .catch_others(|error| {
            finish();
            error.rethrow()
        })
        .execute();
    PUBLISHING.with(|p| p.get()).expect("announced above").slot.hold(position as u64);
    took(position)
}

/// `position`, checked to be above the horizon (55000 otherwise). A
/// position the sequence hands out always is (the transaction announced
/// itself before taking it), unless the sequence was moved back with
/// `setval`, which needs only UPDATE on it, and `pg_write_all_data` has that
/// on every sequence: an event there would appear below positions readers
/// have passed.
///
/// Only against the horizon of this log: right after `DROP EXTENSION` and
/// `CREATE EXTENSION` the entry still holds the old log's horizon until the
/// worker's next round, and the new log's first positions are below it.
fn above_horizon(position: i64, sequence: pg_sys::Oid) -> i64 {
    use std::sync::atomic::Ordering;
    if let Some(entry) = cached_entry() {
        // The sequence first: the worker stores it after the horizon.
        if entry.log_sequence.load(Ordering::Acquire) != sequence.to_u32() {
            return position;
        }
        let horizon = entry.horizon.load(Ordering::Acquire);
        if position as u64 <= horizon {
            StreamsError::PositionBelowHorizon { position, horizon }.raise();
        }
    }
    position
}

/// This database's entry as cached at the transaction's first publish,
/// while it is still this database's (entries are freed after DROP
/// EXTENSION and reused).
fn cached_entry() -> Option<&'static DbEntry> {
    // SAFETY: MyDatabaseId is set once at connection and only read here.
    let db = unsafe { pg_sys::MyDatabaseId };
    WORKER_ENTRY.with(|w| w.get()).filter(|entry| entry.is_for(db))
}

/// Note the newest position taken, for [`wait_for_backlog`].
fn took(position: i64) -> i64 {
    if let Some(entry) = cached_entry() {
        entry.newest.fetch_max(position as u64, std::sync::atomic::Ordering::Relaxed);
    }
    position
}

/// `litebase_streams.max_backlog`: before a transaction takes its first
/// position, wait while the worker is more than the limit behind: positions
/// above the horizon and below the lowest one an open transaction holds
/// (those above it cannot become visible before that transaction ends,
/// however fast the worker is, so they do not count). Only the first
/// position: a transaction that already holds one would hold the horizon it
/// waits for. Waits on this backend's latch in 1 ms steps, for at most a
/// second (a stuck worker must not stall publishers), and not at all when no
/// worker runs or its rounds fail; a cancel ends the wait.
fn wait_for_backlog() {
    use std::sync::atomic::Ordering;
    let Some(limit) = gucs::max_backlog() else { return };
    let Some(entry) = cached_entry() else { return };
    // SAFETY: MyDatabaseId is set once at connection and only read here.
    let db = unsafe { pg_sys::MyDatabaseId };
    for _ in 0..1000 {
        let horizon = entry.horizon.load(Ordering::Relaxed);
        let newest = entry.newest.load(Ordering::Relaxed);
        let within_limit = |upto: u64| upto.saturating_sub(horizon) <= limit;
        let retrying = entry.state.load(Ordering::Relaxed) == shmem::WorkerState::Retrying as u32;
        if within_limit(newest) || entry.worker_pid.load(Ordering::Acquire) == 0 || retrying {
            return; // within the limit, or no worker that waiting would help
        }
        if shmem::lowest_position_held(db).is_some_and(|low| within_limit(low.saturating_sub(1))) {
            return; // the rest waits for an open transaction, not for the worker
        }
        shmem::nap_on_latch(1);
    }
}

/// Mark this backend's slot as allocating *before* the first position is
/// taken, so no worker can compute a horizon past it, and remember it so the
/// transaction's end clears it, even if the allocation itself fails.
fn announce() {
    // SAFETY: MyDatabaseId is set once at connection and only read here; MyProc is set for every
    // backend once it is connected and points into shared memory.
    let (db, procno) = unsafe { (pg_sys::MyDatabaseId, (*pg_sys::MyProc).pgprocno) };
    let slot = shmem::my_slot(procno).ok_or(StreamsError::NoPublisherSlot(procno)).or_raise();
    // Kept while it stays this database's (see shmem::detach).
    let worker = WORKER_ENTRY.with(|cached| {
        cached.get().filter(|e| e.is_for(db)).or_else(|| {
            let entry = shmem::find_db(db).or_else(|| shmem::claim_db(db));
            cached.set(entry);
            entry
        })
    });
    slot.begin(db);
    PUBLISHING.with(|p| p.set(Some(Publishing { slot, worker })));
    warn_without_worker(worker);
}

/// No worker serves this database: ask the launcher for one, and say so when
/// it is because no background worker slot is free (events are stored but
/// invisible until a worker runs).
fn warn_without_worker(worker: Option<&'static DbEntry>) {
    use std::sync::atomic::Ordering;
    let starved = match worker {
        Some(entry) if entry.worker_pid.load(Ordering::Acquire) == 0 => {
            entry.request_worker();
            shmem::wake_launcher();
            entry.no_slot.load(Ordering::Acquire)
        }
        Some(_) => false,
        None => true, // more databases than worker slots
    };
    if starved {
        ereport!(
            PgLogLevel::WARNING,
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_RESOURCES,
            "litebase_streams: no background worker serves this database, so new events stay invisible",
            "No free background worker slot: raise max_worker_processes and restart the server. The launcher retries every second."
        );
    }
}

/// Clear the slot and wake the worker. Atomics and `SetLatch` only.
fn finish() {
    if let Some(Publishing { slot, worker }) = PUBLISHING.with(|p| p.take()) {
        slot.release();
        // SAFETY: MyDatabaseId is set once at connection and only read here.
        let db = unsafe { pg_sys::MyDatabaseId };
        if let Some(worker) = worker.filter(|entry| entry.is_for(db)) {
            worker.wake_worker();
        }
    }
}

/// # Safety
/// SAFETY: registered by [`init`]; PostgreSQL calls it with a valid event and our null arg. At
/// commit and abort it only touches atomics and sets a latch, so it cannot raise there.
#[pg_guard]
unsafe extern "C-unwind" fn xact_callback(event: pg_sys::XactEvent::Type, _arg: *mut c_void) {
    use pg_sys::XactEvent::*;
    match event {
        // The last moment an error can still stop the PREPARE.
        XACT_EVENT_PRE_PREPARE if PUBLISHING.with(|p| p.get()).is_some() => StreamsError::PreparedPublish.raise(),
        XACT_EVENT_COMMIT | XACT_EVENT_PARALLEL_COMMIT | XACT_EVENT_PREPARE => {
            privileges::at_transaction_end(true);
            finish()
        }
        XACT_EVENT_ABORT | XACT_EVENT_PARALLEL_ABORT => {
            privileges::at_transaction_end(false);
            finish()
        }
        _ => {}
    }
}
