//! `litebase_streams.hold_timeout`: the bound on how long one publishing
//! transaction may hold the horizon back.
//!
//! A session can lift its own `idle_in_transaction_session_timeout`, so that
//! setting cannot protect the other sessions of a database. This one is
//! superuser-only and enforced by the worker, which sees every holder: when
//! the transaction holding the horizon has been open (since its first
//! publish) for longer than the timeout, the worker terminates its session,
//! as `pg_terminate_backend` would, and logs why. The transaction aborts, its
//! events never existed, and the horizon moves on. A transaction whose commit
//! is already written (it waits for synchronous replication) is never
//! terminated: it has committed, and its events become final once the
//! standbys confirm it.
//!
//! The worker reads the database's own value (`ALTER DATABASE ... SET`) from
//! `pg_db_role_setting` at most once a second while a holder exists, so a
//! change takes effect without restarting the worker.

use std::cell::Cell;
use std::time::{Duration, Instant};

use pgrx::prelude::*;

use crate::{gucs, shmem};
use litebase_streams_core::horizon;

thread_local! {
    static LAST_REFRESH: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Terminate the holder of the horizon if it is older than the timeout.
/// Called by the worker inside a round's transaction.
pub fn enforce(max_allocated: u64, held: &[(usize, u64)]) {
    let Some((procno, low)) = horizon::holder(max_allocated, held.iter().copied()) else { return };
    refresh_database_setting();
    let Some(timeout) = gucs::hold_timeout() else { return };
    let Some((pid, since)) = shmem::holder_of(procno, low) else { return };
    // SAFETY: a plain clock read with no preconditions, on the worker's main thread.
    let age = Duration::from_micros(unsafe { pg_sys::GetCurrentTimestamp() }.saturating_sub(since).max(0) as u64);
    if age <= timeout || pid == 0 {
        return;
    }
    if commit_is_written(procno) {
        // Its commit record is written and the transaction is committed:
        // it waits for synchronous replication (or for its commit callback
        // to run). Terminating it now would tell its client the commit
        // failed while it stands, and a retry would publish twice.
        return;
    }
    ereport!(
        PgLogLevel::LOG,
        PgSqlErrorCode::ERRCODE_ADMIN_SHUTDOWN,
        format!(
            "litebase_streams: terminating process {pid}: its publishing transaction held the horizon for {} ms",
            age.as_millis()
        ),
        format!("litebase_streams.hold_timeout is {} ms.", timeout.as_millis())
    );
    let _ = Spi::get_one_with_args::<bool>("SELECT pg_catalog.pg_terminate_backend($1)", &[pid.into()]);
}

/// Whether the transaction of the process at `procno` is already committed
/// in the commit log: PostgreSQL marks it there before it waits for
/// synchronous replication, and only then leaves the proc array.
fn commit_is_written(procno: usize) -> bool {
    // An xid read after the process moved on is its next transaction's, not
    // committed yet: terminated as before.
    let xid = shmem::xid_of(procno);
    // SAFETY: reads the commit log inside the round's transaction; pgrx's
    // guard turns an ERROR into a Rust panic the round catches.
    xid != pg_sys::InvalidTransactionId && unsafe { pg_sys::TransactionIdDidCommit(xid) }
}

/// This database's `litebase_streams.hold_timeout`: its setting if it has
/// one, else the configuration file's, else the default (a RESET takes
/// effect too).
const READ_HOLD_TIMEOUT: &str = "SELECT coalesce(
             (SELECT pg_catalog.split_part(s.setting, '=', 2)
              FROM pg_catalog.pg_db_role_setting d, pg_catalog.unnest(d.setconfig) AS s(setting)
              WHERE d.setdatabase = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())
                AND d.setrole = 0 AND s.setting LIKE 'litebase\\_streams.hold\\_timeout=%'),
             (SELECT f.setting FROM pg_catalog.pg_file_settings f
              WHERE f.name = 'litebase_streams.hold_timeout' AND f.applied ORDER BY f.seqno DESC LIMIT 1),
             '0')";

/// Apply this database's `litebase_streams.hold_timeout` from
/// `ALTER DATABASE ... SET`, at most once a second.
fn refresh_database_setting() {
    let now = Instant::now();
    if LAST_REFRESH.with(|l| l.get()).is_some_and(|last| now.duration_since(last) < Duration::from_secs(1)) {
        return;
    }
    LAST_REFRESH.with(|l| l.set(Some(now)));
    let value = Spi::connect(|client| client.select(READ_HOLD_TIMEOUT, Some(1), &[])?.first().get_one::<String>());
    let value = match value {
        Ok(Some(v)) => v,
        _ => return,
    };
    let Ok(value) = std::ffi::CString::new(value) else { return };
    // SAFETY: sets this worker's own copy of the setting, as ALTER DATABASE
    // would at connect; an invalid value only logs a warning.
    unsafe {
        pg_sys::set_config_option(
            c"litebase_streams.hold_timeout".as_ptr(),
            value.as_ptr(),
            pg_sys::GucContext::PGC_SUSET,
            pg_sys::GucSource::PGC_S_DATABASE,
            pg_sys::GucAction::GUC_ACTION_SET,
            true,
            pg_sys::WARNING as i32,
            false,
        );
    }
}
