//! litebase_streams: real-time, append-only, replayable event streams inside
//! PostgreSQL. The pure logic (stream names, payloads, the horizon arithmetic,
//! retry schedules) lives in core/ (litebase-streams-core); this crate is
//! what runs inside the server.
//!
//! * publish.rs: the publish path and its transaction callback;
//! * shmem.rs: the state publishers and workers share;
//! * worker.rs, delivery.rs: the background workers and their delivery round;
//! * catalog.rs: lookups of the extension's own objects (schema version, the log, templates);
//! * privileges.rs: per-stream publish checks, running as the log's owner;
//! * kept_plan.rs: statements planned once per backend under a pinned search_path;
//! * hold.rs: `litebase_streams.hold_timeout`;
//! * replay.rs, status.rs: SQL helpers behind `streams.replay` and `streams.status`;
//! * subscriptions/: durable consumers (`poll`, `ack`, `seek`), their claims, and
//!   sleeping until the horizon moves (`wait.rs`: `streams.wait`, long polls);
//! * webhooks/: events POSTed to HTTP endpoints, signed, by a worker of their own;
//! * utility.rs: keeps DROP DATABASE working;
//! * sql/: the tables, views and SQL functions users see (streams.sql, subscriptions.sql,
//!   webhooks.sql, capture.sql, redaction.sql, metrics.sql, storage.sql, then finish.sql: privileges and
//!   the worker).

use std::sync::atomic::{AtomicBool, Ordering};

use pgrx::prelude::*;

mod capture;
mod delivery;
mod error;
mod ffi;
mod gucs;
mod hooks;
mod log;
mod shmem;
mod subscriptions;
mod webhooks;

use error::{OrRaise, StreamsError};

::pgrx::pg_module_magic!();

extension_sql_file!("../sql/bootstrap.sql", name = "bootstrap", bootstrap);
extension_sql_file!(
    "../sql/streams.sql",
    name = "streams_schema",
    requires = [
        _require_preload,
        log::privileges::_acl_changed,
        log::privileges::_stream_matches,
        log::replay::_stream_exact,
        log::replay::_stream_prefix_low,
        log::replay::_stream_prefix_high,
        log::replay::_replay_limit,
        delivery::status::_worker_status,
        delivery::status::worker_pid
    ]
);
extension_sql_file!("../sql/subscriptions.sql", name = "subscriptions", requires = ["streams_schema"]);
extension_sql_file!("../sql/webhooks.sql", name = "webhooks", requires = ["subscriptions"]);
extension_sql_file!("../sql/capture.sql", name = "capture", requires = ["webhooks"]);
extension_sql_file!("../sql/redaction.sql", name = "redaction", requires = ["capture"]);
extension_sql_file!(
    "../sql/metrics.sql",
    name = "metrics",
    requires = ["redaction", delivery::status::_worker_counters]
);
extension_sql_file!("../sql/storage.sql", name = "storage", requires = ["metrics"]);
extension_sql_file!("../sql/finish.sql", name = "finish", finalize);

/// Set when `_PG_init` ran from `shared_preload_libraries` (inherited by every
/// backend the postmaster forks).
static PRELOADED: AtomicBool = AtomicBool::new(false);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    gucs::init();
    // SAFETY: a backend-global flag set around shared_preload_libraries; only read here.
    if !unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        return; // CREATE EXTENSION reports what is missing (require_preload)
    }
    PRELOADED.store(true, Ordering::Relaxed);
    // No Rust backtrace ever reaches a user's error DETAIL, whatever
    // RUST_BACKTRACE the server was started with (set before any backend or
    // worker is forked, while the postmaster is single-threaded).
    std::env::set_var("RUST_LIB_BACKTRACE", "0");
    // SAFETY: in the postmaster during shared_preload_libraries (checked above), as these init
    // functions require: single-threaded, before any backend or worker is forked.
    unsafe {
        shmem::init();
        log::announce::init();
        hooks::drop_database::init();
    }
    delivery::launcher::init();
}

/// Everything the extension needs from the server's configuration.
pub fn require_preload() -> Result<(), StreamsError> {
    let preloaded = PRELOADED.load(Ordering::Relaxed) && shmem::available();
    // SAFETY: a PGC_POSTMASTER setting, fixed at server start and only read here.
    let commit_timestamps = unsafe { pg_sys::track_commit_timestamp };
    if preloaded && commit_timestamps {
        Ok(())
    } else {
        Err(StreamsError::NotPreloaded { preloaded, commit_timestamps })
    }
}

/// Fails unless the library is preloaded, commit timestamps are on and the
/// database is UTF-8; the extension script calls it first, so CREATE
/// EXTENSION says what to fix.
#[pg_extern(volatile)]
fn _require_preload() {
    require_preload().or_raise();
    // SAFETY: a plain read of the database encoding, fixed once this backend connected.
    if unsafe { pg_sys::GetDatabaseEncoding() } != pg_sys::pg_enc::PG_UTF8 as i32 {
        StreamsError::NotUtf8.raise();
    }
}

/// Start this database's worker once the calling transaction (CREATE
/// EXTENSION) ends. Warns when no background worker slot is free.
#[pg_extern(volatile)]
fn _launch_worker() -> bool {
    require_preload().or_raise();
    // SAFETY: MyDatabaseId is set once at connection and only read here; a SQL function runs in a
    // transaction, and the FFI guard turns GetTopTransactionId's ERROR (read-only) into a panic.
    let (db, xid) = unsafe { (pg_sys::MyDatabaseId, pg_sys::GetTopTransactionId()) };
    shmem::claim_db(db);
    // This database exists: an earlier one dropped under its OID is history.
    shmem::forget_dropped(db);
    let launched = delivery::launcher::launch(db, Some(xid.into_inner()));
    if !launched {
        shmem::wake_launcher();
        ereport!(
            PgLogLevel::WARNING,
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_RESOURCES,
            "litebase_streams: no free background worker slot; events are stored but stay invisible until a worker runs",
            "Raise max_worker_processes and restart the server. The launcher retries every second."
        );
    }
    launched
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    #[pg_test]
    fn publish_returns_increasing_positions() {
        let a = Spi::get_one::<i64>("SELECT streams.publish('t.a', '{\"n\":1}')").unwrap().unwrap();
        let b = Spi::get_one::<i64>("SELECT streams.publish('t.a', '{\"n\":2}')").unwrap().unwrap();
        assert!(b > a);
    }

    // errmsg alone; the reason is its errdetail, the rule its errhint.
    #[pg_test(error = "invalid stream name \"bad name\"")]
    fn publish_rejects_a_bad_stream_name() {
        Spi::run("SELECT streams.publish('bad name', '{}')").unwrap();
    }

    #[pg_test(error = "streams: stored events are immutable; DELETE on streams.event_log is not allowed")]
    fn stored_events_cannot_be_deleted() {
        Spi::run("SELECT streams.publish('t.a', '{}')").unwrap();
        Spi::run("DELETE FROM streams.event_log").unwrap();
    }
}

/// Used by `cargo pgrx test`: the server it starts needs the same settings as
/// production.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec!["shared_preload_libraries = 'litebase_streams'", "track_commit_timestamp = on"]
    }
}
