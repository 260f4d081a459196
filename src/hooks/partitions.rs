//! The part of the ProcessUtility hook that keeps the log's partitions as
//! immutable as the log: a statement on a partition itself fires the
//! partition's triggers, not the log's, and TRUNCATE, DROP TABLE and
//! DETACH PARTITION fire none that could refuse. So they are refused here,
//! for everyone, superusers included; the only drop is retention's
//! (src/delivery/storage.rs), which the hook recognises by a backend-local
//! flag no SQL can set. A table an operator attaches gets row-level
//! security (with no policy, so it is read through streams.events only);
//! the log's row trigger PostgreSQL clones onto it. `COPY streams.event_log
//! TO` is refused with the query form that works (see [`check`]).

use std::cell::Cell;

use pgrx::prelude::*;

use crate::error::{SpiContext, StreamsError};

thread_local! {
    /// Set while this backend's worker drops partitions for retention.
    static RETAINING: Cell<bool> = const { Cell::new(false) };
}

/// Run `body` with partition drops allowed (retention's, in the worker).
pub(crate) fn dropping_for_retention<R>(body: impl FnOnce() -> R) -> R {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            RETAINING.with(|r| r.set(false));
        }
    }
    RETAINING.with(|r| r.set(true));
    let _reset = Reset;
    body()
}

/// Nothing to do after the statement (see [`check`]).
const NOTHING: *mut pg_sys::RangeVar = std::ptr::null_mut();

/// Refuse TRUNCATE, DROP TABLE and DETACH PARTITION of the log's
/// partitions (55000); the table the statement attaches to the log, if it
/// does (null otherwise), to give row-level security afterwards.
///
/// # Safety
/// SAFETY: `stmt` is the utility statement ProcessUtility was given; node tags are checked before
/// each cast. #[pg_guard] turns a panic (the refusal) into an ERROR.
#[pg_guard]
pub(super) unsafe extern "C-unwind" fn check(stmt: *mut pg_sys::Node) -> *mut pg_sys::RangeVar {
    if stmt.is_null() {
        return NOTHING;
    }
    match (*stmt).type_ {
        pg_sys::NodeTag::T_TruncateStmt => {
            let relations = pgrx::PgList::<pg_sys::RangeVar>::from_pg((*(stmt as *mut pg_sys::TruncateStmt)).relations);
            for relation in relations.iter_ptr() {
                if let Some(name) = partition_of_log(relation) {
                    StreamsError::ImmutableEvents { operation: "TRUNCATE", table: name }.raise();
                }
            }
            NOTHING
        }
        pg_sys::NodeTag::T_DropStmt => {
            let drop = &*(stmt as *mut pg_sys::DropStmt);
            if drop.removeType != pg_sys::ObjectType::OBJECT_TABLE || RETAINING.with(|r| r.get()) {
                return NOTHING;
            }
            let objects = pgrx::PgList::<pg_sys::List>::from_pg(drop.objects);
            for names in objects.iter_ptr() {
                if let Some(name) = partition_of_log(pg_sys::makeRangeVarFromNameList(names)) {
                    StreamsError::ImmutableEvents { operation: "DROP TABLE", table: name }.raise();
                }
            }
            NOTHING
        }
        pg_sys::NodeTag::T_AlterTableStmt => {
            let alter = &*(stmt as *mut pg_sys::AlterTableStmt);
            if alter.relation.is_null() || !is_log(alter.relation) {
                return NOTHING;
            }
            let commands = pgrx::PgList::<pg_sys::AlterTableCmd>::from_pg(alter.cmds);
            let mut action = NOTHING;
            for command in commands.iter_ptr() {
                let def = (*command).def;
                let partition = if !def.is_null() && (*def).type_ == pg_sys::NodeTag::T_PartitionCmd {
                    (*(def as *mut pg_sys::PartitionCmd)).name
                } else {
                    std::ptr::null_mut()
                };
                match (*command).subtype {
                    pg_sys::AlterTableType::AT_DetachPartition | pg_sys::AlterTableType::AT_DetachPartitionFinalize => {
                        let name = relation_name(partition);
                        StreamsError::ImmutableEvents { operation: "DETACH PARTITION", table: name }.raise();
                    }
                    pg_sys::AlterTableType::AT_AttachPartition if !partition.is_null() => {
                        action = partition;
                    }
                    _ => {}
                }
            }
            action
        }
        pg_sys::NodeTag::T_CopyStmt => {
            // COPY of the log by name: PostgreSQL refuses a partitioned table
            // to roles that bypass row-level security, and to every other
            // role copies ONLY the parent (row security turns it into a
            // query without its partitions): no row, and no error. Refused
            // for everyone, with the form that works.
            let copy = &*(stmt as *mut pg_sys::CopyStmt);
            // A role without SELECT on it gets PostgreSQL's 42501 as before.
            if !copy.is_from
                && copy.query.is_null()
                && !copy.relation.is_null()
                && is_log(copy.relation)
                && pg_sys::pg_class_aclcheck(log_oid(), pg_sys::GetUserId(), pg_sys::ACL_SELECT as pg_sys::AclMode)
                    == pg_sys::AclResult::ACLCHECK_OK
            {
                StreamsError::CopyOfPartitionedLog.raise();
            }
            NOTHING
        }
        _ => NOTHING,
    }
}

/// After an ATTACH PARTITION to the log: row-level security on the new
/// partition, as on those the extension makes (no policy: pg_read_all_data
/// reading it directly sees no row).
///
/// # Safety
/// SAFETY: `partition` is the statement's RangeVar, which ProcessUtility left in place;
/// #[pg_guard] turns a panic into an ERROR.
#[pg_guard]
pub(super) unsafe extern "C-unwind" fn after_attach(partition: *mut pg_sys::RangeVar) {
    let relid = relation_oid(partition);
    if relid == pg_sys::InvalidOid {
        return;
    }
    let quoted = pg_sys::quote_qualified_identifier(
        pg_sys::get_namespace_name(pg_sys::get_rel_namespace(relid)),
        pg_sys::get_rel_name(relid),
    );
    let sql = format!("ALTER TABLE {} ENABLE ROW LEVEL SECURITY", std::ffi::CStr::from_ptr(quoted).to_string_lossy());
    Spi::run(&sql).context("enabling row-level security on the attached partition");
}

/// `relation` resolved without a lock (InvalidOid when it names nothing).
///
/// # Safety
/// SAFETY: `relation` is null or a valid RangeVar.
unsafe fn relation_oid(relation: *mut pg_sys::RangeVar) -> pg_sys::Oid {
    if relation.is_null() {
        return pg_sys::InvalidOid;
    }
    pg_sys::RangeVarGetRelidExtended(
        relation,
        pg_sys::NoLock as pg_sys::LOCKMODE,
        pg_sys::RVROption::RVR_MISSING_OK,
        None,
        std::ptr::null_mut(),
    )
}

/// The name a statement gave a relation, for messages.
///
/// # Safety
/// SAFETY: `relation` is null or a valid RangeVar.
unsafe fn relation_name(relation: *mut pg_sys::RangeVar) -> String {
    if relation.is_null() || (*relation).relname.is_null() {
        return "a partition of streams.event_log".to_owned();
    }
    let name = std::ffi::CStr::from_ptr((*relation).relname).to_string_lossy().into_owned();
    if (*relation).schemaname.is_null() {
        name
    } else {
        format!("{}.{name}", std::ffi::CStr::from_ptr((*relation).schemaname).to_string_lossy())
    }
}

/// The extension's `streams.event_log`, if installed.
fn log_oid() -> pg_sys::Oid {
    // SAFETY: syscache lookups with missing_ok and static C strings.
    unsafe {
        let schema = pg_sys::get_namespace_oid(c"streams".as_ptr(), true);
        if schema == pg_sys::InvalidOid {
            return pg_sys::InvalidOid;
        }
        pg_sys::get_relname_relid(c"event_log".as_ptr(), schema)
    }
}

/// Whether `relation` is `streams.event_log`.
///
/// # Safety
/// SAFETY: `relation` is a valid RangeVar.
unsafe fn is_log(relation: *mut pg_sys::RangeVar) -> bool {
    let log = log_oid();
    log != pg_sys::InvalidOid && relation_oid(relation) == log
}

/// The name of `relation` when it is a partition of the log.
///
/// # Safety
/// SAFETY: `relation` is a valid RangeVar.
unsafe fn partition_of_log(relation: *mut pg_sys::RangeVar) -> Option<String> {
    let relid = relation_oid(relation);
    if relid == pg_sys::InvalidOid || !pg_sys::get_rel_relispartition(relid) {
        return None;
    }
    let log = log_oid();
    if log == pg_sys::InvalidOid {
        return None;
    }
    // Read without locking the log: pg_inherits names the parent. Every
    // name qualified, the operator too: this runs as whoever issued the
    // statement (a superuser, say) under the session's search_path, where
    // a database owner may have planted an `=` of their own.
    let parent = Spi::get_one_with_args::<pg_sys::Oid>(
        "SELECT i.inhparent FROM pg_catalog.pg_inherits i WHERE i.inhrelid OPERATOR(pg_catalog.=) $1",
        &[relid.into()],
    )
    .context("finding the parent of a partition");
    (parent == Some(log)).then(|| relation_name(relation))
}
