//! Appending events to `streams.event_log` without the executor.
//!
//! An INSERT through SPI plans nothing per call (the plans are kept), but
//! still starts an executor for a one-row ModifyTable, revalidates the plan,
//! connects SPI and pins `search_path` around it: about as much work as the
//! row itself. For the rows publish writes, an INSERT comes down to the heap
//! insert and one insert per index (with the primary key's uniqueness check),
//! which is what [`Appender`] does, the way COPY does it.
//!
//! The log is partitioned by position (partitions.rs): each row goes to the
//! partition that holds its position, found in the parent's partition
//! descriptor as tuple routing finds it, and the partition's own indexes
//! take its index entries. The partition's constraint is not checked again:
//! the row was routed by it.
//!
//! Only while the tables are as the extension made them: seven columns
//! (four before the 0.3.0 update, which added the envelope's) in the
//! parent's order and types, no INSERT trigger or rule, no CHECK
//! constraint, no forced row-level security, and indexes on plain columns
//! only (no expression, predicate or exclusion constraint, which would run
//! functions). Otherwise [`Appender::open`] (or [`Appender::append`], for a
//! partition an operator attached) answers `None` and publish inserts
//! through SPI, so a table someone changed still gets everything an INSERT
//! does.

use pgrx::pg_sys;

use crate::error::StreamsError;
use crate::log::partitions;

/// `streams.event_log`, open for appending in the current transaction.
pub(crate) struct Appender {
    /// The parent (partitioned) table, or a plain table (a 0.2.0 log
    /// before its update, which appends to it directly).
    log: pg_sys::Relation,
    /// The partitions that hold the rows to come, open for appending (or
    /// the plain log itself, with no bounds).
    targets: Vec<Target>,
    command: pg_sys::CommandId,
}

/// One table open for appending: the relation, its indexes and a slot.
struct Target {
    bounds: Option<partitions::Partition>,
    rel: pg_sys::Relation,
    estate: *mut pg_sys::EState,
    info: *mut pg_sys::ResultRelInfo,
    slot: *mut pg_sys::TupleTableSlot,
}

impl Appender {
    /// Open the table `log` (RowExclusiveLock, held to the end of the
    /// transaction, as an INSERT takes it) and the partitions that hold the
    /// positions `low..=high` (which exist: partitions::ensure_holding), or
    /// `None` when one of them is not as the extension makes them.
    ///
    /// # Safety
    /// SAFETY: inside a transaction, with `log` the OID of `streams.event_log`; pgrx's FFI guard
    /// turns an ERROR into a Rust panic, and the transaction's abort releases what is open then
    /// (locks, relation and buffer pins, the executor state's memory).
    pub unsafe fn open(log: pg_sys::Oid, low: i64, high: i64) -> Option<Appender> {
        let rel = pg_sys::table_open(log, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE);
        let partitioned = (*(*rel).rd_rel).relkind == pg_sys::RELKIND_PARTITIONED_TABLE as std::ffi::c_char;
        let mut appender = Appender { log: rel, targets: Vec::new(), command: pg_sys::GetCurrentCommandId(true) };
        if !plain_table(rel, partitioned) {
            appender.close();
            return None;
        }
        if !partitioned {
            let target = Target::open(rel, None, rel);
            return match target {
                Some(target) => {
                    appender.targets.push(target);
                    Some(appender)
                }
                None => {
                    appender.close();
                    None
                }
            };
        }
        let partitions = partitions::of_relation(rel);
        let mut position = low;
        while position <= high {
            let Some(bounds) = partitions::holding(&partitions, position) else {
                appender.close();
                StreamsError::MissingObject("a partition of streams.event_log for the new position").raise();
            };
            let partition = pg_sys::table_open(bounds.oid, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE);
            match Target::open(partition, Some(bounds), rel) {
                Some(target) => appender.targets.push(target),
                None => {
                    appender.close();
                    return None;
                }
            }
            position = bounds.upper;
        }
        Some(appender)
    }

    /// Whether the table has the envelope's columns (type, key, headers):
    /// not before the 0.3.0 update.
    pub fn has_envelope(&self) -> bool {
        // SAFETY: `log` is open until close.
        unsafe { (*(*self.log).rd_att).natts == ROW_COLUMNS as i32 }
    }

    /// Append one row: `values` in column order (position, stream, tx,
    /// data, type, key, headers), null where `None`; a table without the
    /// envelope's columns takes the first four, and the caller checked
    /// that the others are null. Its position is within what
    /// [`open`](Self::open) was given.
    ///
    /// # Safety
    /// SAFETY: `values` are datums of the columns' types, valid until this returns (the heap
    /// tuple copies them); `values[0]` is the position, never null.
    pub unsafe fn append(&mut self, values: Row) {
        let position = values[0].map_or(0, |p| p.value() as i64);
        let Some(target) = self.targets.iter().find(|t| t.bounds.is_none_or(|b| b.holds(position))) else {
            StreamsError::MissingObject("a partition of streams.event_log for the new position").raise();
        };
        target.insert(values, self.command);
    }

    /// Close the partitions, their indexes and the table (their locks stay
    /// to the end of the transaction) and free the executor states.
    ///
    /// # Safety
    /// SAFETY: after [`open`](Self::open), once.
    pub unsafe fn close(self) {
        for target in self.targets {
            let partition = target.bounds.is_some();
            target.close(partition);
        }
        pg_sys::table_close(self.log, pg_sys::NoLock as pg_sys::LOCKMODE);
    }
}

impl Target {
    /// Set up appending to `rel` (the log itself, or its partition
    /// `bounds`), or `None` (and `rel` closed, if it is a partition) when it
    /// is not as the extension makes it.
    ///
    /// # Safety
    /// SAFETY: `rel` and `log` are open in the current transaction.
    unsafe fn open(
        rel: pg_sys::Relation,
        bounds: Option<partitions::Partition>,
        log: pg_sys::Relation,
    ) -> Option<Target> {
        if bounds.is_some() && !(plain_table(rel, false) && same_columns(rel, log)) {
            pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
            return None;
        }
        let estate = pg_sys::CreateExecutorState();
        let info = pg_sys::palloc0(std::mem::size_of::<pg_sys::ResultRelInfo>()) as *mut pg_sys::ResultRelInfo;
        (*info).type_ = pg_sys::NodeTag::T_ResultRelInfo;
        pg_sys::InitResultRelInfo(info, rel, 1, std::ptr::null_mut(), 0);
        pg_sys::ExecOpenIndices(info, false);
        let target =
            Target { bounds, rel, estate, info, slot: pg_sys::table_slot_create(rel, &mut (*estate).es_tupleTable) };
        if !plain_indexes(info) {
            target.close(bounds.is_some());
            return None;
        }
        Some(target)
    }

    /// # Safety
    /// SAFETY: as [`Appender::append`].
    unsafe fn insert(&self, values: Row, command: pg_sys::CommandId) {
        let slot = self.slot;
        pg_sys::ExecClearTuple(slot);
        let columns = (*(*self.rel).rd_att).natts as usize;
        for (i, value) in values.into_iter().take(columns).enumerate() {
            *(*slot).tts_values.add(i) = value.unwrap_or(pg_sys::Datum::from(0));
            *(*slot).tts_isnull.add(i) = value.is_none();
        }
        pg_sys::ExecStoreVirtualTuple(slot);
        pg_sys::table_tuple_insert(self.rel, slot, command, 0, std::ptr::null_mut());
        pg_sys::ExecInsertIndexTuples(
            self.info,
            slot,
            self.estate,
            false,
            false,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        // Index tuples are formed in the per-tuple memory: free it per row.
        let per_tuple = (*self.estate).es_per_tuple_exprcontext;
        if !per_tuple.is_null() {
            pg_sys::MemoryContextReset((*per_tuple).ecxt_per_tuple_memory);
        }
    }

    /// Close the indexes and free the executor state; and the relation
    /// when it is a partition (the log itself the appender closes). Its
    /// lock stays to the end of the transaction.
    ///
    /// # Safety
    /// SAFETY: once per target.
    unsafe fn close(self, relation: bool) {
        pg_sys::ExecCloseIndices(self.info);
        pg_sys::ExecResetTupleTable((*self.estate).es_tupleTable, false);
        pg_sys::FreeExecutorState(self.estate);
        if relation {
            pg_sys::table_close(self.rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        }
    }
}

/// The columns of a row of the log: position, stream, tx, data, type, key,
/// headers.
pub(crate) const ROW_COLUMNS: usize = 7;

/// A row of the log, in column order; `None` is null.
pub(crate) type Row = [Option<pg_sys::Datum>; ROW_COLUMNS];

/// A plain table (or, with `partitioned`, a partitioned one) of seven live
/// columns (or the four of 0.2.0), without INSERT triggers, rules, CHECK
/// constraints or forced row-level security.
///
/// # Safety
/// SAFETY: `rel` is an open relation.
unsafe fn plain_table(rel: pg_sys::Relation, partitioned: bool) -> bool {
    let form = &*(*rel).rd_rel;
    let desc = &*(*rel).rd_att;
    let columns_as_made = (desc.natts == ROW_COLUMNS as i32 || desc.natts == 4)
        && (0..desc.natts as usize).all(|i| !(*desc.attrs.as_ptr().add(i)).attisdropped);
    let triggers = (*rel).trigdesc;
    let insert_triggers = !triggers.is_null() && {
        let t = &*triggers;
        t.trig_insert_before_row
            || t.trig_insert_after_row
            || t.trig_insert_instead_row
            || t.trig_insert_before_statement
            || t.trig_insert_after_statement
            || t.trig_insert_new_table
    };
    let checks = !desc.constr.is_null() && (*desc.constr).num_check > 0;
    let kind = if partitioned { pg_sys::RELKIND_PARTITIONED_TABLE } else { pg_sys::RELKIND_RELATION };
    form.relkind == kind as std::ffi::c_char
        && columns_as_made
        && !insert_triggers
        && !checks
        && !form.relforcerowsecurity
        && !form.relhasrules
}

/// Whether the partition `rel` has the columns of `log` in the same order,
/// of the same types (a table an operator attached may order them
/// otherwise, and tuple routing would map them).
///
/// # Safety
/// SAFETY: both relations are open.
unsafe fn same_columns(rel: pg_sys::Relation, log: pg_sys::Relation) -> bool {
    let (a, b) = (&*(*rel).rd_att, &*(*log).rd_att);
    a.natts == b.natts
        && (0..a.natts as usize).all(|i| {
            let (x, y) = (&*a.attrs.as_ptr().add(i), &*b.attrs.as_ptr().add(i));
            x.atttypid == y.atttypid && x.attname.data == y.attname.data && x.attcollation == y.attcollation
        })
}

/// Every index is on plain columns: no expression, predicate or exclusion
/// constraint.
///
/// # Safety
/// SAFETY: `target` had its indexes opened by ExecOpenIndices.
unsafe fn plain_indexes(target: *mut pg_sys::ResultRelInfo) -> bool {
    let count = (*target).ri_NumIndices.max(0) as usize;
    (0..count).all(|i| {
        let info = &**(*target).ri_IndexRelationInfo.add(i);
        info.ii_Expressions.is_null() && info.ii_Predicate.is_null() && info.ii_ExclusionOps.is_null()
    })
}
