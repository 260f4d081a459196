//! Appending events to `streams.event_log` without the executor.
//!
//! An INSERT through SPI plans nothing per call (the plans are kept), but
//! still starts an executor for a one-row ModifyTable, revalidates the plan,
//! connects SPI and pins `search_path` around it: about as much work as the
//! row itself. For the rows publish writes, an INSERT comes down to the heap
//! insert and one insert per index (with the primary key's uniqueness check),
//! which is what [`Appender`] does, the way COPY does it.
//!
//! Only while the table is as the extension made it: seven columns (four
//! before the 0.3.0 update, which added the envelope's), no INSERT
//! trigger or rule, no CHECK constraint, no forced row-level security, and indexes on
//! plain columns only (no expression, predicate or exclusion constraint,
//! which would run functions). Otherwise [`Appender::open`] answers `None`
//! and publish inserts through SPI as before, so a table someone changed
//! still gets everything an INSERT does.

use pgrx::pg_sys;

/// `streams.event_log`, open for appending in the current transaction.
pub(crate) struct Appender {
    rel: pg_sys::Relation,
    estate: *mut pg_sys::EState,
    target: *mut pg_sys::ResultRelInfo,
    slot: *mut pg_sys::TupleTableSlot,
    command: pg_sys::CommandId,
}

impl Appender {
    /// Open the table `log` (RowExclusiveLock, held to the end of the
    /// transaction, as an INSERT takes it) or `None` when it is not as the
    /// extension made it.
    ///
    /// # Safety
    /// SAFETY: inside a transaction, with `log` the OID of `streams.event_log`; pgrx's FFI guard
    /// turns an ERROR into a Rust panic, and the transaction's abort releases what is open then
    /// (locks, relation and buffer pins, the executor state's memory).
    pub unsafe fn open(log: pg_sys::Oid) -> Option<Appender> {
        let rel = pg_sys::table_open(log, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE);
        if !plain_table(rel) {
            pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
            return None;
        }
        let estate = pg_sys::CreateExecutorState();
        let target = pg_sys::palloc0(std::mem::size_of::<pg_sys::ResultRelInfo>()) as *mut pg_sys::ResultRelInfo;
        (*target).type_ = pg_sys::NodeTag::T_ResultRelInfo;
        pg_sys::InitResultRelInfo(target, rel, 1, std::ptr::null_mut(), 0);
        pg_sys::ExecOpenIndices(target, false);
        let appender = Appender {
            rel,
            estate,
            target,
            slot: pg_sys::table_slot_create(rel, &mut (*estate).es_tupleTable),
            command: pg_sys::GetCurrentCommandId(true),
        };
        if !plain_indexes(target) {
            appender.close();
            return None;
        }
        Some(appender)
    }

    /// Whether the table has the envelope's columns (type, key, headers):
    /// not before the 0.3.0 update.
    pub fn has_envelope(&self) -> bool {
        // SAFETY: `rel` is open until close.
        unsafe { (*(*self.rel).rd_att).natts == ROW_COLUMNS as i32 }
    }

    /// Append one row: `values` in column order (position, stream, tx,
    /// data, type, key, headers), null where `None`; a table without the
    /// envelope's columns takes the first four, and the caller checked
    /// that the others are null.
    ///
    /// # Safety
    /// SAFETY: `values` are datums of the columns' types, valid until this returns (the heap
    /// tuple copies them).
    pub unsafe fn append(&mut self, values: Row) {
        let slot = self.slot;
        pg_sys::ExecClearTuple(slot);
        let columns = (*(*self.rel).rd_att).natts as usize;
        for (i, value) in values.into_iter().take(columns).enumerate() {
            *(*slot).tts_values.add(i) = value.unwrap_or(pg_sys::Datum::from(0));
            *(*slot).tts_isnull.add(i) = value.is_none();
        }
        pg_sys::ExecStoreVirtualTuple(slot);
        pg_sys::table_tuple_insert(self.rel, slot, self.command, 0, std::ptr::null_mut());
        pg_sys::ExecInsertIndexTuples(
            self.target,
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

    /// Close the indexes and the table (its lock stays to the end of the
    /// transaction) and free the executor state.
    ///
    /// # Safety
    /// SAFETY: after [`open`](Self::open), once.
    pub unsafe fn close(self) {
        pg_sys::ExecCloseIndices(self.target);
        pg_sys::ExecResetTupleTable((*self.estate).es_tupleTable, false);
        pg_sys::FreeExecutorState(self.estate);
        pg_sys::table_close(self.rel, pg_sys::NoLock as pg_sys::LOCKMODE);
    }
}

/// The columns of a row of the log: position, stream, tx, data, type, key,
/// headers.
pub(crate) const ROW_COLUMNS: usize = 7;

/// A row of the log, in column order; `None` is null.
pub(crate) type Row = [Option<pg_sys::Datum>; ROW_COLUMNS];

/// A plain table of seven live columns (or the four of 0.2.0), without
/// INSERT triggers, rules, CHECK constraints or forced row-level security.
///
/// # Safety
/// SAFETY: `rel` is an open relation.
unsafe fn plain_table(rel: pg_sys::Relation) -> bool {
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
    form.relkind == pg_sys::RELKIND_RELATION as std::ffi::c_char
        && columns_as_made
        && !insert_triggers
        && !checks
        && !form.relforcerowsecurity
        && !form.relhasrules
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
