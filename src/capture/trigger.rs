//! The capture trigger: `streams._capture()`, fired AFTER each statement on
//! a captured table, publishes one event per changed row, in the order of
//! the statement's transition tables, as one batch.
//!
//! Events: type `insert`, `update`, `delete` or `truncate`; key the primary
//! key as a JSON object (`{"id": 7}`), none without one; data
//! `{"new": row}`, `{"new": row, "old": old}` or `{"old": old}`, where
//! `old` follows the table's replica identity (DEFAULT: the primary key,
//! USING INDEX: that index's columns, FULL: the whole row, NOTHING: no
//! `old`), and no row holds the excluded columns. Columns are read at each
//! statement, so ADD and DROP COLUMN show in the next events.
//!
//! Rows become JSON as the table's owner (a column type's cast to json is
//! the owner's code, not the extension's), and the events are published
//! with the owner's publish privilege, whoever changed the table. The
//! trigger's arguments are the stream and the attribute numbers of the
//! excluded columns (numbers survive RENAME COLUMN). Only `streams.capture`
//! can attach the function (nobody else has EXECUTE on it), and it checks
//! at each firing that it runs as capture made it.
//!
//! Memory: rows are read from the transition tables (which spill to disk
//! past work_mem) and published in chunks of [`CHUNK_ROWS`], each chunk's
//! JSON freed before the next.

use std::ffi::{c_char, CStr};

use pgrx::prelude::*;
use pgrx::IntoDatum;

use crate::error::{OrRaise, StreamsError};
use crate::ffi;
use crate::log::privileges;
use crate::log::publish::{self, Change};
use litebase_streams_core::envelope;

/// Rows converted and published per step, at most.
const CHUNK_ROWS: usize = 1000;
/// Memory a step may take, at most (past one row): large rows go out a few at a time.
const CHUNK_BYTES: usize = 16 * 1024 * 1024;

/// `streams._capture() → trigger`, declared in sql/capture.sql.
///
/// # Safety
/// SAFETY: fmgr calls it; `fcinfo->context` is checked to be a TriggerData before any use, and
/// the relation, trigger and transition tables it points to live until the trigger returns.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn litebase_streams_capture(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    let context = (*fcinfo).context;
    if context.is_null() || (*context).type_ != pg_sys::NodeTag::T_TriggerData {
        StreamsError::CaptureMisused("called as a trigger").raise();
    }
    let data = &*(context as *const pg_sys::TriggerData);
    let event = data.tg_event;
    if event & pg_sys::TRIGGER_EVENT_ROW != 0 || event & pg_sys::TRIGGER_EVENT_TIMINGMASK != pg_sys::TRIGGER_EVENT_AFTER
    {
        StreamsError::CaptureMisused("an AFTER ... FOR EACH STATEMENT trigger").raise();
    }
    let trigger = &*data.tg_trigger;
    let args: Vec<&str> = (0..trigger.tgnargs as usize)
        .map(|i| CStr::from_ptr(*trigger.tgargs.add(i)).to_str().unwrap_or_default())
        .collect();
    let Some((&stream, excluded)) = args.split_first() else {
        StreamsError::CaptureMisused("given the stream as its first argument").raise();
    };
    let rel = data.tg_relation;
    let owner = (*(*rel).rd_rel).relowner;
    let sequence = publish::checked_stream_for(stream, owner);
    let stream_datum = stream.into_datum().expect("a text datum");
    let table = Table::describe(rel, excluded);
    let op = event & pg_sys::TRIGGER_EVENT_OPMASK;
    let (old, new) = match op {
        pg_sys::TRIGGER_EVENT_INSERT => (None, Some(data.tg_newtable)),
        pg_sys::TRIGGER_EVENT_UPDATE => (Some(data.tg_oldtable), Some(data.tg_newtable)),
        pg_sys::TRIGGER_EVENT_DELETE => (Some(data.tg_oldtable), None),
        _ => (None, None),
    };
    if old.is_some_and(|t| t.is_null()) || new.is_some_and(|t| t.is_null()) {
        StreamsError::CaptureMisused("created by streams.capture (its transition tables are missing)").raise();
    }
    // Opened in the trigger's memory context: they outlive every chunk.
    let mut old = old.map(|store| Transition::open(store, (*rel).rd_att));
    let mut new = new.map(|store| Transition::open(store, (*rel).rd_att));
    let mut out = Batch::new(sequence, stream_datum);
    let type_ = out.types[op as usize];
    if op == pg_sys::TRIGGER_EVENT_TRUNCATE {
        out.push(Change { type_, key: None, data: object(&[]) });
    }
    let mut rows_left = true;
    while rows_left {
        // A chunk's rows become JSON as the table's owner, then the chunk is published.
        privileges::as_owner_restricted(owner, || {
            while !out.full() {
                let old_row = old.as_mut().and_then(|t| t.next());
                let new_row = new.as_mut().and_then(|t| t.next());
                if old_row.is_none() && new_row.is_none() {
                    rows_left = false;
                    break;
                }
                out.push(table.change(type_, old_row, new_row));
            }
        });
        out.flush();
    }
    for transition in [old, new].into_iter().flatten() {
        transition.close();
    }
    out.finish();
    pg_sys::Datum::from(0)
}

ffi::function_info_v1!(pg_finfo_litebase_streams_capture);

/// What a statement's events need to know about the table, read from the
/// relation cache at each statement.
struct Table {
    to_jsonb: pg_sys::FmgrInfo,
    /// `jsonb - text[]` and jsonb's output function.
    delete: pg_sys::FmgrInfo,
    output: pg_sys::FmgrInfo,
    /// text[] datums of column names to remove (None: nothing to remove).
    drop_from_row: Option<pg_sys::Datum>,
    drop_from_key: Option<pg_sys::Datum>,
    has_key: bool,
    /// What `old` holds: None (no `old`) or the names to remove from the old row.
    old: Option<Option<pg_sys::Datum>>,
}

impl Table {
    /// # Safety
    /// SAFETY: `rel` is the trigger's open relation; `excluded` its trigger arguments after the
    /// stream (attribute numbers as text).
    unsafe fn describe(rel: pg_sys::Relation, excluded: &[&str]) -> Table {
        let desc = &*(*rel).rd_att;
        let excluded: Vec<i16> = excluded.iter().filter_map(|n| n.parse().ok()).collect();
        let bitmap = |kind| pg_sys::RelationGetIndexAttrBitmap(rel, kind);
        let key = bitmap(pg_sys::IndexAttrBitmapKind::INDEX_ATTR_BITMAP_PRIMARY_KEY);
        let identity = bitmap(pg_sys::IndexAttrBitmapKind::INDEX_ATTR_BITMAP_IDENTITY_KEY);
        let member = |set: *mut pg_sys::Bitmapset, attnum: i16| {
            pg_sys::bms_is_member(attnum as i32 - pg_sys::FirstLowInvalidHeapAttributeNumber, set)
        };
        let (mut drop_row, mut drop_key, mut drop_identity) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..desc.natts as usize {
            let attribute = &*desc.attrs.as_ptr().add(i);
            if attribute.attisdropped {
                continue;
            }
            let name = CStr::from_ptr(attribute.attname.data.as_ptr()).to_string_lossy().into_owned();
            let is_excluded = excluded.contains(&attribute.attnum);
            // An excluded column stays out of the key too (the key may have
            // changed to include it since the capture).
            if is_excluded || !member(key, attribute.attnum) {
                drop_key.push(name.clone());
            }
            if is_excluded || !member(identity, attribute.attnum) {
                drop_identity.push(name.clone());
            }
            if is_excluded {
                drop_row.push(name);
            }
        }
        let has_key = !pg_sys::bms_is_empty(key);
        let names = |names: Vec<String>| (!names.is_empty()).then(|| names.into_datum().expect("a text[] datum"));
        let old = match (*(*rel).rd_rel).relreplident as u8 {
            b'f' => Some(names(drop_row.clone())),
            b'n' => None,
            _ if pg_sys::bms_is_empty(identity) => None,
            _ => Some(names(drop_identity)),
        };
        let mut to_jsonb = pg_sys::FmgrInfo::default();
        pg_sys::fmgr_info(pg_sys::Oid::from(pg_sys::F_TO_JSONB), &mut to_jsonb);
        // to_jsonb reads its argument's type from the call expression.
        let argument = pg_sys::makeNullConst(desc.tdtypeid, -1, pg_sys::InvalidOid);
        let call = pg_sys::makeFuncExpr(
            pg_sys::Oid::from(pg_sys::F_TO_JSONB),
            pg_sys::JSONBOID,
            pg_sys::lcons(argument.cast(), std::ptr::null_mut()),
            pg_sys::InvalidOid,
            pg_sys::InvalidOid,
            pg_sys::CoercionForm::COERCE_EXPLICIT_CALL,
        );
        to_jsonb.fn_expr = call.cast();
        let function = |oid: u32| {
            let mut info = pg_sys::FmgrInfo::default();
            pg_sys::fmgr_info(pg_sys::Oid::from(oid), &mut info);
            info
        };
        let (delete, output) = (function(pg_sys::F_JSONB_DELETE_JSONB__TEXT), function(pg_sys::F_JSONB_OUT));
        Table { to_jsonb, delete, output, drop_from_row: names(drop_row), drop_from_key: names(drop_key), has_key, old }
    }

    /// The event of one changed row (`old` for UPDATE and DELETE, `new`
    /// for INSERT and UPDATE), as composite datums of the table's row type.
    ///
    /// # Safety
    /// SAFETY: the datums are rows of the described relation.
    unsafe fn change(&self, type_: pg_sys::Datum, old: Option<pg_sys::Datum>, new: Option<pg_sys::Datum>) -> Change {
        let old = old.map(|row| self.json(row));
        let new = new.map(|row| self.json(row));
        let key = match self.has_key {
            true => new.or(old).map(|row| self.key_text(self.without(row, self.drop_from_key))),
            false => None,
        };
        let mut fields: Vec<(&CStr, pg_sys::Datum)> = Vec::with_capacity(2);
        if let Some(row) = new {
            fields.push((c"new", self.without(row, self.drop_from_row)));
        }
        if let (Some(row), Some(drop)) = (old, self.old) {
            fields.push((c"old", self.without(row, drop)));
        }
        Change { type_, key, data: object(&fields) }
    }

    /// `to_jsonb(row)`.
    ///
    /// # Safety
    /// SAFETY: `row` is a composite datum of the described relation's row type; to_jsonb raises (through pgrx's guard) on failure and allocates in the current memory context.
    unsafe fn json(&self, row: pg_sys::Datum) -> pg_sys::Datum {
        pg_sys::FunctionCall1Coll(mutable(&self.to_jsonb), pg_sys::InvalidOid, row)
    }

    /// `row - names` (jsonb minus a text[] of keys), or `row` when there is
    /// nothing to remove.
    ///
    /// # Safety
    /// SAFETY: `row` is a jsonb datum and `names` a text[] datum, both valid in the current memory context.
    unsafe fn without(&self, row: pg_sys::Datum, names: Option<pg_sys::Datum>) -> pg_sys::Datum {
        match names {
            Some(names) => pg_sys::FunctionCall2Coll(mutable(&self.delete), pg_sys::InvalidOid, row, names),
            None => row,
        }
    }

    /// A key's JSON object as the event's text key (at most 1,024 bytes: 22023).
    ///
    /// # Safety
    /// SAFETY: `key` is a jsonb datum; jsonb_out returns a NUL-terminated string in the current memory context.
    unsafe fn key_text(&self, key: pg_sys::Datum) -> pg_sys::Datum {
        let text = pg_sys::FunctionCall1Coll(mutable(&self.output), pg_sys::InvalidOid, key).cast_mut_ptr::<c_char>();
        envelope::check_key(&CStr::from_ptr(text).to_string_lossy()).map_err(crate::log::envelope::invalid).or_raise();
        pg_sys::Datum::from(pg_sys::cstring_to_text(text))
    }
}

/// fmgr takes its call information mutable (it may cache in fn_extra, which
/// these functions do not use).
fn mutable(info: &pg_sys::FmgrInfo) -> *mut pg_sys::FmgrInfo {
    info as *const pg_sys::FmgrInfo as *mut pg_sys::FmgrInfo
}

/// A jsonb object of `fields` (each a jsonb datum), in order.
///
/// # Safety
/// SAFETY: each value is a jsonb datum valid until this returns; the keys are static C strings, and the built value is copied into a new jsonb in the current memory context.
unsafe fn object(fields: &[(&CStr, pg_sys::Datum)]) -> pg_sys::Datum {
    use pg_sys::JsonbIteratorToken::{WJB_BEGIN_OBJECT, WJB_END_OBJECT, WJB_KEY, WJB_VALUE};
    let mut state: *mut pg_sys::JsonbParseState = std::ptr::null_mut();
    pg_sys::pushJsonbValue(&mut state, WJB_BEGIN_OBJECT, std::ptr::null_mut());
    for &(name, value) in fields {
        let mut key = pg_sys::JsonbValue { type_: pg_sys::jbvType::jbvString, val: std::mem::zeroed() };
        key.val.string = pg_sys::JsonbValue__bindgen_ty_1__bindgen_ty_1 {
            len: name.to_bytes().len() as i32,
            val: name.as_ptr().cast_mut(),
        };
        pg_sys::pushJsonbValue(&mut state, WJB_KEY, &mut key);
        let jsonb = pg_sys::pg_detoast_datum(value.cast_mut_ptr()) as *mut pg_sys::Jsonb;
        let mut inner = pg_sys::JsonbValue { type_: pg_sys::jbvType::jbvBinary, val: std::mem::zeroed() };
        inner.val.binary = pg_sys::JsonbValue__bindgen_ty_1__bindgen_ty_4 {
            len: pgrx::varlena::varsize_any(jsonb.cast()) as i32,
            data: &mut (*jsonb).root,
        };
        pg_sys::pushJsonbValue(&mut state, WJB_VALUE, &mut inner);
    }
    let result = pg_sys::pushJsonbValue(&mut state, WJB_END_OBJECT, std::ptr::null_mut());
    pg_sys::Datum::from(pg_sys::JsonbValueToJsonb(result))
}

/// A transition table read from its start with a read pointer of its own
/// (other AFTER triggers of the statement share the table).
struct Transition {
    store: *mut pg_sys::Tuplestorestate,
    slot: *mut pg_sys::TupleTableSlot,
    pointer: i32,
}

impl Transition {
    ///
    /// # Safety
    /// SAFETY: `store` is one of the firing trigger's transition tables, alive until the trigger returns, and `desc` the relation's descriptor; the slot lives in the caller's memory context.
    unsafe fn open(store: *mut pg_sys::Tuplestorestate, desc: pg_sys::TupleDesc) -> Transition {
        let pointer = pg_sys::tuplestore_alloc_read_pointer(store, pg_sys::EXEC_FLAG_REWIND as i32);
        pg_sys::tuplestore_select_read_pointer(store, pointer);
        pg_sys::tuplestore_rescan(store);
        let slot = pg_sys::MakeSingleTupleTableSlot(desc, &pg_sys::TTSOpsMinimalTuple);
        Transition { store, slot, pointer }
    }

    /// The next row as a composite datum (a copy in the current memory context).
    ///
    /// The slot is cleared before returning: a table spilled to disk reads
    /// each row into the current memory context (the chunk's, reset after
    /// each chunk) and lets the slot free it, so the slot must not hold it
    /// past this call.
    ///
    /// # Safety
    /// SAFETY: after `open`, while the trigger runs; the datum is copied into the current memory context, so it outlives the slot's next row.
    unsafe fn next(&mut self) -> Option<pg_sys::Datum> {
        pg_sys::tuplestore_select_read_pointer(self.store, self.pointer);
        if !pg_sys::tuplestore_gettupleslot(self.store, true, false, self.slot) {
            return None;
        }
        let row = pg_sys::ExecFetchSlotHeapTupleDatum(self.slot);
        pg_sys::ExecClearTuple(self.slot);
        Some(row)
    }

    ///
    /// # Safety
    /// SAFETY: once, after `open`; gives the table's active read pointer back to other triggers.
    unsafe fn close(self) {
        pg_sys::ExecDropSingleTupleTableSlot(self.slot);
        pg_sys::tuplestore_select_read_pointer(self.store, 0);
    }
}

/// The statement's events, published [`CHUNK_ROWS`] at a time; each
/// chunk's datums live in a memory context reset after it is written.
struct Batch {
    sequence: pg_sys::Oid,
    stream: pg_sys::Datum,
    /// text datums: insert, delete, update, truncate (the trigger event codes' order).
    types: [pg_sys::Datum; 4],
    changes: Vec<Change>,
    chunk: pg_sys::MemoryContext,
    caller: pg_sys::MemoryContext,
}

impl Batch {
    ///
    /// # Safety
    /// SAFETY: inside the firing trigger, `stream` a text datum of the caller's memory context; the chunk context is a child of it, freed on abort with it.
    unsafe fn new(sequence: pg_sys::Oid, stream: pg_sys::Datum) -> Batch {
        let text = |t: &str| t.into_datum().expect("a text datum");
        let types = [text("insert"), text("delete"), text("update"), text("truncate")];
        let caller = pg_sys::CurrentMemoryContext;
        let chunk = pg_sys::AllocSetContextCreateExtended(
            caller,
            c"litebase_streams capture".as_ptr(),
            pg_sys::ALLOCSET_DEFAULT_MINSIZE as usize,
            pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
            pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
        );
        pg_sys::MemoryContextSwitchTo(chunk);
        Batch { sequence, stream, types, changes: Vec::with_capacity(CHUNK_ROWS), chunk, caller }
    }

    ///
    /// # Safety
    /// SAFETY: `change`'s datums live in the chunk context, which is reset only after they are written.
    unsafe fn push(&mut self, change: Change) {
        self.changes.push(change);
    }

    /// Whether the chunk is to be published now: [`CHUNK_ROWS`] rows, or
    /// [`CHUNK_BYTES`] of memory (rows, their JSON, the events).
    fn full(&self) -> bool {
        // SAFETY: the chunk context lives as long as the batch.
        self.changes.len() >= CHUNK_ROWS
            || unsafe { pg_sys::MemoryContextMemAllocated(self.chunk, true) } >= CHUNK_BYTES
    }

    /// Publish the pending changes (if any) and free their memory.
    ///
    /// # Safety
    /// SAFETY: inside the changing transaction, after `checked_stream_for`; the datums of the changes are written before the chunk context is reset.
    unsafe fn flush(&mut self) {
        publish::append_changes(self.sequence, self.stream, &self.changes);
        self.changes.clear();
        pg_sys::MemoryContextReset(self.chunk);
        pg_sys::check_for_interrupts!();
    }

    ///
    /// # Safety
    /// SAFETY: once, last: switches back to the caller's context before the chunk context is deleted.
    unsafe fn finish(self) {
        pg_sys::MemoryContextSwitchTo(self.caller);
        pg_sys::MemoryContextDelete(self.chunk);
    }
}
