//! The ProcessUtility hook: gets a database's workers out of the way of
//! `DROP DATABASE`, which refuses to drop a database anyone is connected to,
//! and frees the database's shared entry once it is gone; and refuses `LOCK`
//! of the extension's relations to roles that do not own them.
//!
//! Every other statement passes straight to the next hook, through a frame
//! that holds nothing to drop and converts no errors.
//!
//! Why LOCK: it needs only UPDATE or DELETE on a table, and
//! pg_write_all_data grants those on every table, row-level security or
//! not. `LOCK TABLE streams.event_log IN ACCESS EXCLUSIVE MODE` held open
//! would stall every publisher, reader, consumer and the worker. Nobody but
//! the extension's owner (its update scripts) has a reason to lock them.
//!
//! The worker is stopped only for a caller who may drop the database (its
//! owner or a superuser), so a role that may not cannot stop anyone's
//! delivery. The drop itself runs behind pgrx's FFI guard, so when it fails
//! (the database is in use, say) its ERROR comes back here as a panic and the
//! worker is started again before the error goes on to the caller.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;

use pgrx::prelude::*;

use crate::delivery::launcher;
use crate::ffi::unguarded;
use crate::shmem;

static mut PREV_PROCESS_UTILITY: pg_sys::ProcessUtility_hook_type = None;

/// Install the hook. Call only from `_PG_init` during preload.
///
/// # Safety
/// SAFETY: call only from `_PG_init` during shared_preload_libraries: the postmaster is then
/// single-threaded, so the `static mut` hook slot has no concurrent reader.
pub unsafe fn init() {
    PREV_PROCESS_UTILITY = pg_sys::ProcessUtility_hook;
    pg_sys::ProcessUtility_hook = Some(process_utility);
}

/// The arguments of ProcessUtility, passed along unchanged.
#[derive(Clone, Copy)]
#[repr(C)]
struct Call {
    pstmt: *mut pg_sys::PlannedStmt,
    query: *const std::ffi::c_char,
    read_only_tree: bool,
    context: pg_sys::ProcessUtilityContext::Type,
    params: pg_sys::ParamListInfo,
    query_env: *mut pg_sys::QueryEnvironment,
    dest: *mut pg_sys::DestReceiver,
    qc: *mut pg_sys::QueryCompletion,
}

impl Call {
    /// # Safety
    /// SAFETY: `self` holds the arguments ProcessUtility passed to the hook, unchanged; an ERROR
    /// longjmps through this frame, which is sound because it owns nothing to drop.
    unsafe fn next(self) {
        let Call { pstmt, query, read_only_tree, context, params, query_env, dest, qc } = self;
        match PREV_PROCESS_UTILITY {
            Some(prev) => prev(pstmt, query, read_only_tree, context, params, query_env, dest, qc),
            None => {
                unguarded::standard_ProcessUtility(pstmt, query, read_only_tree, context, params, query_env, dest, qc)
            }
        }
    }

    /// Whether this is a LOCK statement.
    ///
    /// # Safety
    /// SAFETY: as in dropped_database.
    unsafe fn is_lock(self) -> bool {
        let stmt = (*self.pstmt).utilityStmt;
        !stmt.is_null() && (*stmt).type_ == pg_sys::NodeTag::T_LockStmt
    }

    /// The database a DROP DATABASE names, if this is one and it exists.
    ///
    /// # Safety
    /// SAFETY: `self.pstmt` is the valid PlannedStmt ProcessUtility passed; the utility statement's
    /// node tag is checked before the cast.
    unsafe fn dropped_database(self) -> Option<pg_sys::Oid> {
        let stmt = (*self.pstmt).utilityStmt;
        if stmt.is_null() || (*stmt).type_ != pg_sys::NodeTag::T_DropdbStmt {
            return None;
        }
        let name = (*(stmt as *mut pg_sys::DropdbStmt)).dbname;
        // A catalog lookup, errors impossible with missing_ok.
        let db = pg_sys::get_database_oid(name, true);
        (db != pg_sys::InvalidOid).then_some(db)
    }
}

/// # Safety
/// SAFETY: installed as ProcessUtility_hook, so PostgreSQL calls it with valid arguments. Not
/// guarded: an ERROR of the next hook longjmps through it, sound as it owns nothing to drop.
#[allow(clippy::too_many_arguments)]
unsafe extern "C-unwind" fn process_utility(
    pstmt: *mut pg_sys::PlannedStmt,
    query: *const std::ffi::c_char,
    read_only_tree: bool,
    context: pg_sys::ProcessUtilityContext::Type,
    params: pg_sys::ParamListInfo,
    query_env: *mut pg_sys::QueryEnvironment,
    dest: *mut pg_sys::DestReceiver,
    qc: *mut pg_sys::QueryCompletion,
) {
    let call = Call { pstmt, query, read_only_tree, context, params, query_env, dest, qc };
    if call.is_lock() {
        refuse_locks_of_streams(&call);
    }
    let attached = super::partitions::check((*pstmt).utilityStmt);
    match call.dropped_database() {
        Some(db) => drop_database(&call, db),
        None => call.next(),
    }
    if !attached.is_null() {
        super::partitions::after_attach(attached);
    }
}

/// 42501 when a LOCK names a relation of schema `streams` that the caller
/// does not own (superusers own everything).
///
/// # Safety
/// SAFETY: `call` points at process_utility's `Call`, whose statement is a LockStmt; #[pg_guard]
/// turns any panic into an ERROR before it reaches PostgreSQL.
#[pg_guard]
unsafe extern "C-unwind" fn refuse_locks_of_streams(call: *const Call) {
    let stmt = (*(*call).pstmt).utilityStmt as *mut pg_sys::LockStmt;
    let schema = pg_sys::get_namespace_oid(c"streams".as_ptr(), true);
    if schema == pg_sys::InvalidOid {
        return;
    }
    let relations = pgrx::PgList::<pg_sys::RangeVar>::from_pg((*stmt).relations);
    for relation in relations.iter_ptr() {
        // Looked up without a lock: a name that resolves to nothing, or to
        // another schema's relation, is LOCK's own business.
        let relid = pg_sys::RangeVarGetRelidExtended(
            relation,
            pg_sys::NoLock as pg_sys::LOCKMODE,
            pg_sys::RVROption::RVR_MISSING_OK,
            None,
            std::ptr::null_mut(),
        );
        if relid == pg_sys::InvalidOid || pg_sys::get_rel_namespace(relid) != schema {
            continue;
        }
        if !pg_sys::pg_class_ownercheck(relid, pg_sys::GetUserId()) {
            let name = std::ffi::CStr::from_ptr((*relation).relname).to_string_lossy().into_owned();
            crate::error::StreamsError::LockReserved(name).raise();
        }
    }
}

/// Stop the worker, drop, and restart the worker if the drop failed.
///
/// # Safety
/// SAFETY: `call` points at process_utility's `Call`, valid for this call; #[pg_guard] turns
/// any panic into an ERROR before it reaches PostgreSQL.
#[pg_guard]
unsafe extern "C-unwind" fn drop_database(call: *const Call, db: pg_sys::Oid) {
    let call = *call;
    // SAFETY (both calls below): the FFI guard turns an ERROR of the drop
    // into a Rust panic, which PgTryBuilder catches or #[pg_guard] re-raises;
    // nothing in this frame needs dropping.
    // Only for a caller who may drop the database (inside this guarded frame:
    // the ownership check raises if the database vanished meanwhile).
    if !(pg_sys::superuser() || pg_sys::pg_database_ownercheck(db, pg_sys::GetUserId())) {
        // SAFETY: as above; the drop fails with PostgreSQL's own error.
        return unsafe { pg_sys::ffi::pg_guard_ffi_boundary(|| call.next()) };
    }
    let was_running = running(db);
    // A cancel while waiting for the worker to leave, or a failed drop, both
    // bring the worker back.
    PgTryBuilder::new(AssertUnwindSafe(|| {
        // Remembered before the drop, not after it: a worker the postmaster
        // restarts while the drop runs (its checkpoint can take seconds)
        // then leaves for good instead of connecting to a database that is
        // gone by the time it asks (after_drop forgets it if the drop fails).
        shmem::remember_dropped(db);
        stop_for_drop(db);
        // SAFETY: as above: an ERROR comes back as a panic caught below.
        unsafe { pg_sys::ffi::pg_guard_ffi_boundary(|| call.next()) }
    }))
    .catch_others(|error| {
        after_drop(db, false, was_running);
        error.rethrow()
    })
    .execute();
    after_drop(db, true, was_running);
}

/// Whether a worker serves database `db`.
fn running(db: pg_sys::Oid) -> bool {
    shmem::find_db(db).is_some_and(|entry| entry.worker_pid.load(Ordering::Acquire) != 0)
}

/// Make the worker of database `db` leave for good and wait until it has, so
/// that DROP DATABASE does not find it connected.
fn stop_for_drop(db: pg_sys::Oid) {
    let Some(entry) = shmem::request_stop(db) else { return };
    entry.wake_webhook_worker();
    wait_for_exit(&entry.webhook_pid);
    entry.wake_worker();
    wait_for_exit(&entry.worker_pid);
}

/// Wait (up to 10 s) until the worker whose pid `pid` holds has left.
fn wait_for_exit(pid: &std::sync::atomic::AtomicI32) {
    for _ in 0..1000 {
        if pid.load(Ordering::Acquire) == 0 {
            break;
        }
        // SAFETY: in the DROP DATABASE backend's ProcessUtility hook, inside its transaction; an
        // ERROR from CHECK_FOR_INTERRUPTS (a cancel) becomes a panic that drop_database re-raises.
        unsafe {
            pg_sys::pg_usleep(10_000);
            pg_sys::check_for_interrupts!();
        }
    }
}

/// After DROP DATABASE: on success, free the database's entry (its OID may be
/// reused); on failure, forget that it was dropped, clear the stop request
/// and start the worker again.
fn after_drop(db: pg_sys::Oid, dropped: bool, was_running: bool) {
    if !dropped {
        shmem::forget_dropped(db);
    }
    if let Some(entry) = shmem::find_db(db) {
        entry.stop.store(false, Ordering::Release);
        if dropped {
            entry.forget();
        }
    }
    if !dropped && was_running {
        launcher::launch(db, None);
    }
}
