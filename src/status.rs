//! The shared-memory half of `streams.status`: the worker and whatever holds
//! the horizon back. The view (sql/streams.sql) adds the persisted horizon
//! and the holder's transaction from `pg_stat_activity`.

use std::sync::atomic::Ordering;

use pgrx::prelude::*;

use crate::error::OrRaise;
use crate::horizon;
use crate::shmem::{self, WorkerState};

#[pg_extern(volatile, security_definer)]
#[allow(clippy::type_complexity)]
fn _worker_status() -> TableIterator<
    'static,
    (
        name!(newest_position, i64),
        name!(worker_pid, Option<i32>),
        name!(worker_state, String),
        name!(delivered_position, Option<i64>),
        name!(holder_pid, Option<i32>),
        name!(holder_position, Option<i64>),
    ),
> {
    crate::require_preload().or_raise();
    let newest = Spi::get_one::<i64>("SELECT streams._newest_position()")
        .unwrap_or_else(|e| error!("reading streams.position_seq: {e}"))
        .unwrap_or(0);
    let db = unsafe { pg_sys::MyDatabaseId };
    let entry = shmem::find_db(db);
    let pid = entry.map(|e| e.worker_pid.load(Ordering::Acquire)).filter(|&p| p != 0);
    let state = match (entry, pid) {
        (Some(e), Some(_)) => WorkerState::name(e.state.load(Ordering::Relaxed)),
        _ => "not running",
    };
    let delivered = entry.filter(|_| pid.is_some()).map(|e| e.horizon.load(Ordering::Relaxed) as i64);
    let holder = horizon::holder(newest.max(0) as u64, shmem::held_positions(db));
    TableIterator::once((
        newest,
        pid,
        state.to_string(),
        delivered,
        holder.map(|(procno, _)| shmem::pid_of(procno)),
        holder.map(|(_, low)| low as i64),
    ))
}
