//! The log's partitions: `streams.event_log` is partitioned by ranges of
//! positions (sql/streams.sql, sql/storage.sql). This module reads their
//! bounds from the relation cache, finds the partition a position goes to
//! for the appender, and makes a missing one, which publish does only when
//! the worker has not made it ahead of need (the first publish of a new log,
//! or a worker that is not running).
//!
//! Bounds come from the partition descriptor PostgreSQL keeps for the parent
//! (what tuple routing uses), read under at least ACCESS SHARE on the parent:
//! a partition is attached or dropped only under a lock that conflicts with
//! it (SHARE UPDATE EXCLUSIVE to attach, ACCESS EXCLUSIVE to drop), so the
//! bounds stay true until the transaction ends.

use pgrx::prelude::*;

use crate::error::{SpiContext, StreamsError};

/// One partition: its OID and bounds, `lower` null for `FROM (MINVALUE)`;
/// it holds the positions in `[lower, upper)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Partition {
    pub oid: pg_sys::Oid,
    pub lower: Option<i64>,
    pub upper: i64,
}

impl Partition {
    pub fn holds(&self, position: i64) -> bool {
        self.lower.is_none_or(|lower| lower <= position) && position < self.upper
    }
}

/// The partitions of the partitioned table `parent`, in position order.
/// Bounds at MAXVALUE (no partition the extension makes has one) end the
/// list: nothing above them is ever routed by the appender.
///
/// # Safety
/// SAFETY: `parent` is open (and locked) in the current transaction; the descriptor belongs to its
/// relcache entry, which stays valid while the relation is open, and is read before returning.
pub(crate) unsafe fn of_relation(parent: pg_sys::Relation) -> Vec<Partition> {
    if (*(*parent).rd_rel).relkind != pg_sys::RELKIND_PARTITIONED_TABLE as std::ffi::c_char {
        return Vec::new();
    }
    let desc = pg_sys::RelationGetPartitionDesc(parent, false);
    if desc.is_null() || (*desc).boundinfo.is_null() {
        return Vec::new();
    }
    let bounds = &*(*desc).boundinfo;
    if bounds.strategy != pg_sys::PARTITION_STRATEGY_RANGE as std::ffi::c_char {
        return Vec::new();
    }
    // Range bounds: datums[j] is the upper bound of partition indexes[j]
    // (-1: no partition ends there, a gap), whose lower bound is datums[j - 1].
    let bound = |j: usize| -> Option<Option<i64>> {
        let kind = **bounds.kind.add(j);
        match kind {
            pg_sys::PartitionRangeDatumKind::PARTITION_RANGE_DATUM_MINVALUE => Some(None),
            pg_sys::PartitionRangeDatumKind::PARTITION_RANGE_DATUM_VALUE => {
                Some(Some((**bounds.datums.add(j)).value() as i64))
            }
            _ => None,
        }
    };
    let mut partitions = Vec::with_capacity((*desc).nparts.max(0) as usize);
    for j in 1..bounds.ndatums.max(0) as usize {
        let index = *bounds.indexes.add(j);
        if index < 0 {
            continue;
        }
        let (Some(lower), Some(Some(upper))) = (bound(j - 1), bound(j)) else { break };
        partitions.push(Partition { oid: *(*desc).oids.add(index as usize), lower, upper });
    }
    partitions
}

/// The partitions of the table `parent`, locked ACCESS SHARE until the
/// transaction ends.
pub(crate) fn of_table(parent: pg_sys::Oid) -> Vec<Partition> {
    // SAFETY: a lock and a relation open inside the caller's transaction; pgrx's FFI guard turns
    // an ERROR (the table is gone, a lock timeout) into a Rust panic.
    unsafe {
        let rel = pg_sys::table_open(parent, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let partitions = of_relation(rel);
        pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        partitions
    }
}

/// Whether the table `log` is partitioned (not a 0.2.0 log before its
/// update).
pub(crate) fn is_partitioned(log: pg_sys::Oid) -> bool {
    // SAFETY: a syscache lookup; 0 for a missing relation.
    unsafe { pg_sys::get_rel_relkind(log) == pg_sys::RELKIND_PARTITIONED_TABLE as std::ffi::c_char }
}

/// The partition of `partitions` that holds `position`.
pub(crate) fn holding(partitions: &[Partition], position: i64) -> Option<Partition> {
    let after = partitions.partition_point(|p| p.upper <= position);
    partitions.get(after).copied().filter(|p| p.holds(position))
}

/// `streams.event_log` of this database, if the extension is installed.
fn log_table() -> Option<pg_sys::Oid> {
    // SAFETY: syscache lookups with missing_ok and static C strings.
    let log = unsafe {
        let schema = pg_sys::get_namespace_oid(c"streams".as_ptr(), true);
        pg_sys::get_relname_relid(c"event_log".as_ptr(), schema)
    };
    (log != pg_sys::InvalidOid).then_some(log)
}

/// `streams._partition_bounds() → TABLE (partition regclass, first_position
/// bigint, end_position bigint)`: the log's partitions in position order
/// (first_position null: from the start).
#[pg_extern(sql = false)]
fn _partition_bounds(
) -> TableIterator<'static, (name!(partition, pg_sys::Oid), name!(first_position, Option<i64>), name!(end_position, i64))>
{
    let partitions = log_table().map(of_table).unwrap_or_default();
    TableIterator::new(partitions.into_iter().map(|p| (p.oid, p.lower, p.upper)))
}

/// The name of the partition that holds the positions retention removed:
/// empty, from the start up to the first position kept.
pub(crate) const REMOVED: &std::ffi::CStr = c"event_log_removed";

/// `streams._first_position() → bigint`: the first position the log still
/// holds after retention removed partitions (null: nothing removed): the end
/// of the removed range's partition, the log's lowest. Read from the
/// relation cache under a lock on the log held to the end of the
/// transaction, which a drop has to wait for.
#[pg_extern(sql = false)]
fn _first_position() -> Option<i64> {
    first_kept()
}

/// See [`_first_position`].
pub(crate) fn first_kept() -> Option<i64> {
    let log = log_table()?;
    let lowest = of_table(log).first().copied()?;
    // SAFETY: a syscache lookup of a partition the lock above keeps in place; the name is
    // copied before the next catalog access.
    let name = unsafe {
        let name = pg_sys::get_rel_name(lowest.oid);
        (!name.is_null()).then(|| std::ffi::CStr::from_ptr(name).to_owned())
    }?;
    (lowest.lower.is_none() && name.as_c_str() == REMOVED).then_some(lowest.upper)
}

/// Make sure a partition holds every position in `low..=high` (the
/// positions a publish is about to write). Normally the worker made them
/// ahead and this is a lookup. A missing one (the first partition of a new
/// log, or a worker far behind) is the worker's to make: the publisher asks
/// it and waits ([`wait_for_worker`]). Only when no worker makes it in time
/// does the publisher make it itself, through `streams._add_partition`, as
/// the log's owner: DDL in its own transaction, which holds every other
/// publisher of positions in that partition until it ends.
///
/// # Safety
/// SAFETY: inside the publishing transaction, as the log's owner, with the log locked (ROW
/// EXCLUSIVE); an ERROR aborts the (sub)transaction, which undoes a partition half made.
pub(crate) unsafe fn ensure_holding(log: pg_sys::Oid, low: i64, high: i64) {
    let mut position = low;
    let mut partitions = of_table(log);
    while position <= high {
        match holding(&partitions, position) {
            Some(partition) => position = partition.upper,
            None => {
                partitions = wait_for_worker(log, position);
                if holding(&partitions, position).is_some() {
                    continue;
                }
                add_partition(position);
                // The attach invalidated the parent's descriptor; the new
                // command id makes it visible to this lookup.
                pg_sys::CommandCounterIncrement();
                partitions = of_table(log);
                if holding(&partitions, position).is_none() {
                    StreamsError::MissingObject("a partition of streams.event_log for the new position").raise();
                }
            }
        }
    }
}

/// How long a publisher waits for the worker to make a missing partition
/// before it makes it itself. A worker makes one in milliseconds; a new
/// database's worker starts within a second of its CREATE EXTENSION.
const WORKER_PARTITION_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Ask this database's worker for the partition of `position` and wait,
/// in 2 ms steps on this backend's latch, until it is there, the worker
/// turns out to have no slot, or [`WORKER_PARTITION_WAIT`] passes. Returns
/// the partitions as they are then. A cancel ends the wait with an ERROR.
fn wait_for_worker(log: pg_sys::Oid, position: i64) -> Vec<Partition> {
    use std::sync::atomic::Ordering;
    // SAFETY: MyDatabaseId is set once at connection and only read here.
    let db = unsafe { pg_sys::MyDatabaseId };
    let deadline = std::time::Instant::now() + WORKER_PARTITION_WAIT;
    loop {
        let Some(entry) = crate::shmem::find_db(db) else { return of_table(log) };
        if entry.no_slot.load(Ordering::Acquire) {
            return of_table(log);
        }
        entry.wake_for_partitions();
        crate::shmem::nap_on_latch(2);
        // SAFETY: processes the invalidation messages queued for this backend: a partition the
        // worker committed becomes visible to the relation cache.
        unsafe { pg_sys::AcceptInvalidationMessages() };
        let partitions = of_table(log);
        if holding(&partitions, position).is_some() || std::time::Instant::now() >= deadline {
            return partitions;
        }
    }
}

/// `SELECT streams._add_partition(position)`: make the partition that holds
/// `position` (a no-op when one does).
fn add_partition(position: i64) {
    Spi::connect_mut(|client| client.update("SELECT streams._add_partition($1)", None, &[position.into()]).map(|_| ()))
        .context("making a partition of streams.event_log");
}
