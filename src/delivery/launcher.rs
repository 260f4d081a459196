//! The launcher: makes sure every database with the extension has its worker
//! while the server runs.
//!
//! # Design
//!
//! Each database with the extension gets one worker of its own (a background
//! worker connects to one database for its life, so one worker cannot serve
//! several). Workers take `max_worker_processes` slots, shared with parallel
//! query and other extensions, so a slot may be missing when a worker is
//! due. We keep one worker per database (a pool of workers visiting databases
//! in turn would add a round trip of latency to every delivery) and make a
//! missing slot a loud, temporary state instead of a silent, permanent one:
//!
//! * The launcher, a static worker connected to no database, lists the
//!   databases at server start and keeps trying to start a worker for each
//!   until it got a slot (a worker in a database without the extension exits
//!   at once and frees it).
//! * Afterwards it wakes every second, and when a publisher found no worker in
//!   its database (it sets `needs_worker` and the launcher's latch) and none
//!   attached within a grace period of 3 s (a worker just launched or being
//!   restarted attaches well within it), starts one, retrying until a slot is
//!   free.
//! * While a database has no worker because no slot was free, `publish` warns
//!   (SQLSTATE 53000) and `streams.status` says `worker_state = 'no worker
//!   slot'`: events are stored but not visible until a worker runs.
//! * `CREATE EXTENSION` starts its database's worker directly
//!   (`streams._launch_worker()`), and hands it to the launcher if no slot is
//!   free.

use std::time::{Duration, Instant};

use pgrx::bgworkers::*;
use pgrx::prelude::*;

use crate::shmem;

const LIBRARY: &str = "litebase_streams";
const WORKER_TYPE: &str = "litebase_streams worker";

/// Register the launcher. Call only from `_PG_init` during preload.
pub fn init() {
    BackgroundWorkerBuilder::new("litebase_streams launcher")
        .set_type("litebase_streams launcher")
        .set_library(LIBRARY)
        .set_function("litebase_streams_launcher_main")
        .enable_spi_access()
        .set_restart_time(Some(Duration::from_secs(5)))
        .load();
}

/// Start the worker of database `db`. `after_xid`: wait for this transaction
/// to end before looking for the extension. Returns false when no background
/// worker slot is free (and records that in the database's entry).
pub fn launch(db: pg_sys::Oid, after_xid: Option<u32>) -> bool {
    let started = BackgroundWorkerBuilder::new(&format!("litebase_streams worker for database {}", db.to_u32()))
        .set_type(WORKER_TYPE)
        .set_library(LIBRARY)
        .set_function("litebase_streams_worker_main")
        .enable_spi_access()
        .set_restart_time(Some(Duration::from_secs(1)))
        .set_argument(Some(pg_sys::Datum::from(db.to_u32())))
        .set_extra(&after_xid.map(|x| x.to_string()).unwrap_or_default())
        .load_dynamic()
        .is_ok();
    if let Some(entry) = shmem::find_db(db) {
        entry.no_slot.store(!started, std::sync::atomic::Ordering::Release);
        if !started {
            entry.request_worker();
        }
    }
    started
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn litebase_streams_launcher_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    BackgroundWorker::connect_worker_to_spi(None, None);
    // SAFETY: MyProc is set for every backend, this worker included, once it is connected.
    shmem::set_launcher(unsafe { (*pg_sys::MyProc).pgprocno });
    let mut pending = connectable_databases();
    let mut last_warning: Option<Instant> = None;
    loop {
        let mut starved = Vec::new();
        pending.retain(|&db| {
            let started = launch(db, None);
            if !started {
                starved.push(db);
            }
            !started
        });
        // Never for a template: a worker connected to one makes every
        // CREATE DATABASE from it fail ("being accessed by other users").
        // (A database created from a template that has the extension gets
        // its worker this way too, at its first publish.)
        let needing = shmem::databases_needing_a_worker();
        let connectable = if needing.is_empty() { Vec::new() } else { connectable_databases() };
        for db in needing.into_iter().filter(|db| connectable.contains(db)) {
            if !launch(db, None) {
                starved.push(db);
            }
        }
        if !starved.is_empty() && last_warning.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
            last_warning = Some(Instant::now());
            ereport!(
                PgLogLevel::WARNING,
                PgSqlErrorCode::ERRCODE_INSUFFICIENT_RESOURCES,
                format!(
                    "litebase_streams: no background worker slot for {} database(s) (OIDs {:?}); retrying every second",
                    starved.len(),
                    starved.iter().map(|db| db.to_u32()).collect::<Vec<_>>()
                ),
                "Raise max_worker_processes (and restart the server): each database with the extension needs one."
            );
        }
        if !BackgroundWorker::wait_latch(Some(Duration::from_secs(1))) {
            return;
        }
    }
}

/// Every database that accepts connections and is not a template, read
/// straight from the shared catalog (the launcher is connected to no
/// database, so SQL is not available).
fn connectable_databases() -> Vec<pg_sys::Oid> {
    let mut found = Vec::new();
    // SAFETY: a catalog scan in a transaction of its own, the way autovacuum's
    // launcher lists databases; the form pointer is read while the tuple is
    // pinned by the scan.
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
        let rel = pg_sys::table_open(pg_sys::DatabaseRelationId, pg_sys::AccessShareLock as i32);
        let scan = pg_sys::table_beginscan_catalog(rel, 0, std::ptr::null_mut());
        loop {
            let tuple = pg_sys::heap_getnext(scan, pg_sys::ScanDirection::ForwardScanDirection);
            if tuple.is_null() {
                break;
            }
            let data = (*tuple).t_data;
            let form = (data as *const u8).add((*data).t_hoff as usize) as *const pg_sys::FormData_pg_database;
            if (*form).datallowconn && !(*form).datistemplate {
                found.push((*form).oid);
            }
        }
        pg_sys::table_endscan(scan);
        pg_sys::table_close(rel, pg_sys::AccessShareLock as i32);
        pg_sys::PopActiveSnapshot();
        pg_sys::CommitTransactionCommand();
    }
    found
}
