//! Catalog lookups of the extension's own objects, shared by the worker's
//! round, its maintenance and the webhook worker: which schema version the
//! database has, its `streams.event_log` (verified to be the extension's),
//! and whether the database is a template.

use pgrx::prelude::*;

/// Which extension schema the database has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Schema {
    V0_1,
    Current,
}

/// The version of the extension installed in this database, if any, and the
/// OID of its `streams.event_log` (which log the positions belong to), locked
/// for the rest of the round (see [`extension_log`]).
pub(crate) fn installed_schema() -> Option<(Schema, pg_sys::Oid)> {
    let log = extension_log()?;
    // SAFETY: syscache lookups by name in the round's transaction; missing_ok,
    // and the C strings are static.
    let is_0_1 = unsafe {
        let schema = pg_sys::get_namespace_oid(c"streams".as_ptr(), true);
        pg_sys::get_relname_relid(c"private_streams".as_ptr(), schema) == pg_sys::InvalidOid
    };
    Some((if is_0_1 { Schema::V0_1 } else { Schema::Current }, log))
}

/// Whether the log `log` has the event envelope's columns (`type`, `key`,
/// `headers`): from 0.3.0 on. Between installing a newer library and
/// `ALTER EXTENSION litebase_streams UPDATE` the workers serve an older
/// schema, so they read the columns only when this finds them (once per
/// round; a syscache lookup).
pub(crate) fn log_has_envelope(log: pg_sys::Oid) -> bool {
    // SAFETY: a syscache lookup (no ERROR for a missing or dropped column)
    // inside the caller's transaction, with a static C string.
    unsafe { pg_sys::get_attnum(log, c"headers".as_ptr()) != 0 }
}

/// The extension's `streams.event_log` as [`extension_log`] returns it, when
/// the schema keeps commit times by position (not 0.1.0's).
pub(crate) fn log_with_commit_times() -> Option<pg_sys::Oid> {
    installed_schema().filter(|(schema, _)| *schema == Schema::Current).map(|(_, log)| log)
}

thread_local! {
    /// The last `streams.event_log` found to belong to the extension.
    static VERIFIED_LOG: std::cell::Cell<pg_sys::Oid> = const { std::cell::Cell::new(pg_sys::InvalidOid) };
}

/// The extension's `streams.event_log`, locked (ACCESS SHARE) until the
/// worker's transaction ends, or `None` when the extension is not installed.
///
/// The worker runs its statements as a superuser, by name: a `streams`
/// schema that is not the extension's (one a role with CREATE on the
/// database made after the extension was dropped) must never be taken for
/// it, or that role's triggers and functions would run as superuser. So the
/// table's membership in the extension is checked (once per table: a scan of
/// `pg_depend`, where the rest are syscache lookups), and the lock keeps the
/// table, and with it the extension, from being dropped while the
/// transaction uses them.
pub(crate) fn extension_log() -> Option<pg_sys::Oid> {
    // SAFETY: catalog lookups (missing_ok, static C strings) and a relation
    // lock inside the worker's transaction; pgrx's FFI guard turns an ERROR
    // into a Rust panic.
    unsafe {
        let lookup = || {
            let schema = pg_sys::get_namespace_oid(c"streams".as_ptr(), true);
            pg_sys::get_relname_relid(c"event_log".as_ptr(), schema)
        };
        let mut log = lookup();
        // Taking the lock reads the invalidations: a drop that committed
        // before it shows now, and so does a log made anew under the name
        // (the 0.3.0 update makes the partitioned log and attaches the old
        // table to it), whose lock is then taken in turn.
        for _ in 0..3 {
            if log == pg_sys::InvalidOid {
                return None;
            }
            pg_sys::LockRelationOid(log, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
            let now = lookup();
            if now == log {
                break;
            }
            log = now;
        }
        if lookup() != log {
            return None;
        }
        if VERIFIED_LOG.with(|v| v.get()) != log {
            let extension = pg_sys::get_extension_oid(c"litebase_streams".as_ptr(), true);
            if extension == pg_sys::InvalidOid
                || pg_sys::getExtensionOfObject(pg_sys::RelationRelationId, log) != extension
            {
                return None;
            }
            VERIFIED_LOG.with(|v| v.set(log));
        }
        Some(log)
    }
}

/// Whether this backend's database is a template (`datistemplate`). No
/// worker stays connected to one: `CREATE DATABASE` refuses to copy a
/// database others are connected to. The databases created from it get
/// workers of their own (the launcher starts one at their first publish).
pub(crate) fn database_is_template() -> bool {
    // SAFETY: a syscache lookup of our own database, only called through
    // in_transaction; the tuple is released before returning, and the form
    // is read while it is pinned.
    unsafe {
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::DATABASEOID as i32,
            pg_sys::Datum::from(pg_sys::MyDatabaseId),
        );
        if tuple.is_null() {
            return false;
        }
        let data = (*tuple).t_data;
        let form = (data as *const u8).add((*data).t_hoff as usize) as *const pg_sys::FormData_pg_database;
        let template = (*form).datistemplate;
        pg_sys::ReleaseSysCache(tuple);
        template
    }
}

/// Take, in this order, the locks a reader of `streams.events` takes:
/// the view, the log, the horizon (ACCESS SHARE). Code that reads the log
/// or the horizon directly calls this first, so that every reader takes
/// them in one order, the one an `ALTER EXTENSION ... UPDATE` step takes
/// them in too: it then waits behind the step instead of deadlocking with
/// it (a poll reading the horizon, then the log; the webhook worker reading
/// the log, then the view). Missing objects are skipped (0.1.0, a dropped
/// extension: the statements that follow report it).
pub(crate) fn lock_for_reading() {
    // SAFETY: catalog lookups (missing_ok, static C strings) and relation
    // locks inside the caller's transaction; pgrx's FFI guard turns an
    // ERROR (a lock timeout, a cancel) into a Rust panic.
    unsafe {
        let schema = pg_sys::get_namespace_oid(c"streams".as_ptr(), true);
        if schema == pg_sys::InvalidOid {
            return;
        }
        for name in [c"events", c"event_log", c"horizon_state"] {
            let relation = pg_sys::get_relname_relid(name.as_ptr(), schema);
            if relation != pg_sys::InvalidOid {
                pg_sys::LockRelationOid(relation, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
            }
        }
    }
}
