//! The workers' transaction runtime: each piece of work in a transaction of
//! its own (`attempt`, `in_transaction`), an error caught and handed back as
//! a [`Failure`] (message and SQLSTATE) instead of ending the process, the
//! session settings every worker pins at start, and the warning a failure
//! logs, and what a worker checks before and between its steps (a dropped
//! database, a shutdown). The delivery worker and the webhook worker both
//! run on it.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;

use crate::error::SpiContext;
use crate::shmem::{self, NotifyState};

/// Session settings the worker's correctness depends on, set at session
/// level so that no `ALTER DATABASE/ROLE ... SET` (applied at connect) can
/// change them. In particular:
///
/// * `session_authorization` (the bootstrap superuser, OID 10, as which the
///   worker connected; `DEFAULT` would be the database's setting) and `ROLE
///   NONE`: whatever `session_authorization` or `role` a database owner set
///   for the database.
/// * `exit_on_error = off`: a failed round is retried, never the end of the
///   worker (and of the requests a webhook worker has in flight).
/// * `search_path`: the worker runs as the bootstrap superuser; only
///   pg_catalog may resolve its functions and operators.
/// * read committed, read-write: each round's fresh snapshot must see every
///   commit before it (repeatable read would reuse the transaction's first
///   snapshot and stamp events it cannot see), and the round writes.
/// * timeouts: a lock held on the extension's tables fails a round (retried
///   with backoff) instead of stalling it. 100 ms is well under
///   deadlock_timeout, so when DDL such as DROP EXTENSION and a round lock
///   the tables in opposite orders, the worker gives way rather than the
///   user's statement failing with a deadlock. No statement or idle timeout
///   may end the worker's own session.
/// * `session_replication_role = origin`: the immutability triggers fire.
/// * `synchronous_commit = on`: final means durable. A round's commit is what
///   makes its events final (the horizon it writes), and a synchronous commit
///   flushes the WAL up to its own commit record, so also every publisher's
///   commit record before it (publishers with `synchronous_commit = off`
///   leave theirs in the WAL buffers), and with synchronous replication it
///   waits for the standbys as well: no reader ever sees an event a crash or
///   a failover can take back, whatever the publishers' setting.
// search_path comes first: each statement is analysed only after the ones
// before it ran, and one that resolves a name under the database's
// search_path (a database owner may set it and owns `public`) would run an
// operator planted there as the bootstrap superuser. The one comparison
// below is qualified as well.
const PINNED_SETTINGS: &str = "
    SET search_path = pg_catalog, pg_temp;
    SET exit_on_error = off;
    SELECT pg_catalog.set_config('session_authorization',
                                 (SELECT r.rolname FROM pg_catalog.pg_roles r
                                  WHERE r.oid OPERATOR(pg_catalog.=) 10::pg_catalog.oid)::pg_catalog.text, false);
    SET ROLE NONE;
    SET search_path = pg_catalog, pg_temp;
    SET default_transaction_isolation = 'read committed';
    SET default_transaction_read_only = off;
    SET default_transaction_deferrable = off;
    SET statement_timeout = 0;
    SET lock_timeout = '100ms';
    SET idle_in_transaction_session_timeout = 0;
    SET idle_session_timeout = 0;
    SET session_replication_role = origin;
    SET synchronous_commit = on;
    SET row_security = on;
    SET standard_conforming_strings = on;
    SET transform_null_equals = off;
    SET array_nulls = on;
    SET TimeZone = 'UTC';
    SET DateStyle = 'ISO, YMD';
    SET IntervalStyle = 'postgres';
    SET extra_float_digits = 1;
    SET max_parallel_workers_per_gather = 0;
    SET jit = off;
    SET plan_cache_mode = auto;
    SET default_tablespace = '';
    SET default_table_access_method = heap;
    SET client_min_messages = warning";

pub(crate) fn pin_session_settings() {
    Spi::run(PINNED_SETTINGS).context("pinning the worker's session settings");
}

pub(crate) fn extension_installed() -> bool {
    // SAFETY: a catalog lookup (missing_ok, static C string), only called through in_transaction.
    unsafe { pg_sys::get_extension_oid(c"litebase_streams".as_ptr(), true) != pg_sys::InvalidOid }
}

/// A failed round.
pub(crate) struct Failure {
    pub message: String,
    pub sqlstate: String,
}

impl Failure {
    pub(crate) fn notify_state(&self) -> NotifyState {
        if self.sqlstate == "54000" {
            NotifyState::QueueFull
        } else {
            NotifyState::Failing
        }
    }
}

pub(crate) fn warn_failed(what: &str, failure: &Failure, backoff: Duration) {
    ereport!(
        PgLogLevel::WARNING,
        PgSqlErrorCode::ERRCODE_WARNING,
        format!(
            "litebase_streams: {what} failed, retrying in {} ms: {} (SQLSTATE {})",
            backoff.as_millis(),
            failure.message,
            failure.sqlstate
        ),
        "Publishers are not affected; events are delivered once the round succeeds."
    );
}

/// Run `body` in a transaction of its own; an error aborts the transaction
/// and comes back as a [`Failure`] instead of ending the worker.
pub(crate) fn attempt<R>(body: impl FnOnce() -> R) -> Result<R, Failure> {
    PgTryBuilder::new(AssertUnwindSafe(|| Ok(in_transaction(body))))
        .catch_others(|error| {
            // SAFETY: the error left in_transaction's transaction open at the worker's top level;
            // aborting it is the recovery PostgresMain's error path does too.
            unsafe { pg_sys::AbortCurrentTransaction() };
            Err(describe(error))
        })
        .execute()
}

/// Run `body` in a transaction of its own, with a snapshot, and commit.
pub(crate) fn in_transaction<R>(body: impl FnOnce() -> R) -> R {
    // SAFETY: called only from the worker's top level, never inside a transaction, so this starts a
    // fresh one; pgrx's FFI guard turns an ERROR into a Rust panic.
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    let result = body();
    // SAFETY: commits the transaction started above, popping its snapshot if `body` left it
    // active; an ERROR becomes a panic, then round/summarize abort it or the worker exits.
    unsafe {
        if pg_sys::ActiveSnapshotSet() {
            pg_sys::PopActiveSnapshot();
        }
        pg_sys::CommitTransactionCommand();
    }
    result
}

fn describe(error: CaughtError) -> Failure {
    match error {
        CaughtError::PostgresError(report)
        | CaughtError::ErrorReport(report)
        | CaughtError::RustPanic { ereport: report, .. } => {
            Failure { message: report.message().to_owned(), sqlstate: sqlstate(report.sql_error_code() as i32) }
        }
    }
}

/// The five-character form of a packed SQLSTATE (PGUNSIXBIT in elog.h).
fn sqlstate(code: i32) -> String {
    (0..5).map(|i| char::from(b'0' + ((code >> (6 * i)) & 0x3f) as u8)).collect()
}

/// Whether this worker, restarted by the postmaster after its database was
/// dropped, leaves (exit code 0, never restarted) instead of failing to
/// connect (exit code 1, restarted every second). See
/// [`shmem::remember_dropped`].
pub(crate) fn left_for_a_dropped_database(db: pg_sys::Oid, which: &str) -> bool {
    let dropped = shmem::was_dropped(db);
    if dropped {
        log!("litebase_streams {which} for database {}: the database was dropped; not restarting", db.to_u32());
    }
    dropped
}

/// Whether SIGTERM asked this worker to exit.
pub(crate) fn shutdown_requested() -> bool {
    // SAFETY: a sig_atomic_t set only by the SIGTERM handler, read volatile through a raw pointer.
    unsafe { std::ptr::read_volatile(&raw const pg_sys::ShutdownRequestPending) != 0 }
}
