//! The shared-memory half of `streams.status`, `streams.worker_pid()` and
//! the worker counters of `streams.metrics()`:
//! the worker and whatever holds the horizon back. The view (sql/status.sql)
//! adds the persisted horizon, the log's identity and the holder's
//! transaction from `pg_stat_activity`.
//!
//! Nothing here assigns a transaction id or writes, so `streams.status` works
//! in read-only transactions and on hot standbys.

use std::sync::atomic::Ordering;

use pgrx::prelude::*;

use crate::error::{OrRaise, SpiContext};
use crate::shmem::{self, NotifyState, WorkerState};
use litebase_streams_core::horizon;

/// The newest allocated position (0 before the first publish), read from the
/// sequence without taking a transaction id.
fn newest_position() -> i64 {
    Spi::connect(|client| client.select("SELECT streams._newest_position()", Some(1), &[])?.first().get_one::<i64>())
        .context("reading streams.position_seq")
        .unwrap_or(0)
}

#[pg_extern(volatile, security_definer)]
#[search_path(pg_catalog, pg_temp)]
#[allow(clippy::type_complexity)]
pub(crate) fn _worker_status() -> TableIterator<
    'static,
    (
        name!(newest_position, i64),
        name!(worker_pid, Option<i32>),
        name!(worker_state, String),
        name!(delivered_position, Option<i64>),
        name!(holder_pid, Option<i32>),
        name!(holder_position, Option<i64>),
        name!(notify_state, Option<String>),
        name!(rounds, Option<i64>),
    ),
> {
    crate::require_preload().or_raise();
    let newest = newest_position();
    // SAFETY: MyDatabaseId is set once at connection and only read here.
    let db = unsafe { pg_sys::MyDatabaseId };
    let entry = shmem::find_db(db);
    let pid = entry.map(|e| e.worker_pid.load(Ordering::Acquire)).filter(|&p| p != 0);
    let running = entry.filter(|_| pid.is_some());
    let state = match running {
        Some(e) => WorkerState::name(e.state.load(Ordering::Relaxed)),
        // SAFETY: reads shared recovery state; callable from any connected backend.
        None if unsafe { pg_sys::RecoveryInProgress() } => "standby",
        None if entry.is_some_and(|e| e.no_slot.load(Ordering::Acquire)) => "no worker slot",
        None => "not running",
    };
    let delivered = running.map(|e| e.delivered.load(Ordering::Relaxed) as i64);
    let notify = running.map(|e| NotifyState::name(e.notify_state.load(Ordering::Relaxed)).to_owned());
    let holder = horizon::holder(newest.max(0) as u64, shmem::held_positions(db));
    TableIterator::once((
        newest,
        pid,
        state.to_string(),
        delivered,
        holder.map(|(procno, _)| shmem::pid_of(procno)),
        holder.map(|(_, low)| low as i64),
        notify,
        entry.map(|e| e.rounds.load(Ordering::Relaxed) as i64),
    ))
}

/// `streams.worker_pid()`: the pid of this database's worker, the only
/// process whose notifications a client should trust (compare it with the
/// notification's sender pid); null when no worker runs.
#[pg_extern(stable, parallel_safe)]
pub(crate) fn worker_pid() -> Option<i32> {
    if !shmem::available() {
        return None;
    }
    // SAFETY: MyDatabaseId is set once at connection and only read here.
    let entry = shmem::find_db(unsafe { pg_sys::MyDatabaseId })?;
    Some(entry.worker_pid.load(Ordering::Acquire)).filter(|&pid| pid != 0)
}

/// `streams._worker_counters()`: the worker counters `streams.metrics()`
/// reports beside `_worker_status`: how often a worker started for this
/// database, how often sending notifications failed, and why they fail now
/// (`ok`, `queue_full` or `failing`). Zeros and `ok` before any worker ran.
#[pg_extern(volatile)]
#[search_path(pg_catalog, pg_temp)]
pub(crate) fn _worker_counters(
) -> TableIterator<'static, (name!(worker_starts, i64), name!(notification_failures, i64), name!(notify_reason, String))>
{
    crate::require_preload().or_raise();
    // SAFETY: MyDatabaseId is set once at connection and only read here.
    let entry = shmem::find_db(unsafe { pg_sys::MyDatabaseId });
    let count = |counter: Option<&std::sync::atomic::AtomicU64>| {
        counter.map_or(0, |c| i64::try_from(c.load(Ordering::Relaxed)).unwrap_or(i64::MAX))
    };
    let reason = match entry.map(|e| e.notify_state.load(Ordering::Relaxed)) {
        Some(raw) if raw == NotifyState::QueueFull as u32 => "queue_full",
        Some(raw) if raw == NotifyState::Failing as u32 => "failing",
        _ => "ok",
    };
    TableIterator::once((
        count(entry.map(|e| &e.worker_starts)),
        count(entry.map(|e| &e.notification_failures)),
        reason.to_owned(),
    ))
}
