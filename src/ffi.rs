//! PostgreSQL symbols that pgrx's generated bindings leave out (their headers
//! are not in its list), declared here and called through pgrx's FFI guard so
//! that a PostgreSQL ERROR inside them becomes a Rust panic as usual.

use std::ffi::c_char;

use pgrx::pg_sys::{self, ffi::pg_guard_ffi_boundary};

mod raw {
    use super::*;
    // SAFETY: these match PostgreSQL 15's headers named below; the functions are called only
    // through pg_guard_ffi_boundary, so an ERROR becomes a Rust panic.
    unsafe extern "C-unwind" {
        // commands/sequence.h
        pub fn nextval_internal(relid: pg_sys::Oid, check_permissions: bool) -> i64;
        // commands/async.h: what pg_notify() calls
        pub fn Async_Notify(channel: *const c_char, payload: *const c_char);
        // access/twophase.h
        pub static max_prepared_xacts: i32;
    }
}

/// tcop/utility.h, declared without pgrx's guard: the ProcessUtility hook
/// passes every statement but DROP DATABASE straight through, so PostgreSQL
/// errors keep their full report (position, context) instead of taking a
/// round trip through a Rust panic.
pub mod unguarded {
    use pgrx::pg_sys;
    // SAFETY: matches tcop/utility.h (PostgreSQL 14+); only utility.rs's Call::next calls it, from
    // frames that own nothing to drop, so an ERROR may longjmp through them.
    unsafe extern "C-unwind" {
        pub fn standard_ProcessUtility(
            pstmt: *mut pg_sys::PlannedStmt,
            query: *const std::ffi::c_char,
            read_only_tree: bool,
            context: pg_sys::ProcessUtilityContext::Type,
            params: pg_sys::ParamListInfo,
            query_env: *mut pg_sys::QueryEnvironment,
            dest: *mut pg_sys::DestReceiver,
            qc: *mut pg_sys::QueryCompletion,
        );
    }
}

/// Advance sequence `relid` and return its new value.
pub fn nextval(relid: pg_sys::Oid) -> i64 {
    // SAFETY: the closure only calls C and owns nothing, as pg_guard_ffi_boundary requires;
    // publishers call it on the main thread, inside their transaction, after the privilege check.
    unsafe { pg_guard_ffi_boundary(|| raw::nextval_internal(relid, false)) }
}

/// Queue a notification, sent when the current transaction commits.
pub fn notify(channel: &std::ffi::CStr, payload: &std::ffi::CStr) {
    // SAFETY: the closure only calls C; both strings outlive the call (Async_Notify copies them),
    // and the only caller, a delivery round, runs inside the worker's transaction.
    unsafe { pg_guard_ffi_boundary(|| raw::Async_Notify(channel.as_ptr(), payload.as_ptr())) }
}

/// The `max_prepared_transactions` setting.
pub fn max_prepared_xacts() -> i32 {
    // SAFETY: a PGC_POSTMASTER setting, fixed at server start and only read here.
    unsafe { raw::max_prepared_xacts }
}

/// `PG_FUNCTION_INFO_V1` for a C-level function declared by hand in
/// sql/streams.sql: `function_info_v1!(pg_finfo_<symbol>);`.
macro_rules! function_info_v1 {
    ($finfo:ident) => {
        #[no_mangle]
        #[doc(hidden)]
        pub extern "C" fn $finfo() -> &'static pgrx::pg_sys::Pg_finfo_record {
            const V1_API: pgrx::pg_sys::Pg_finfo_record = pgrx::pg_sys::Pg_finfo_record { api_version: 1 };
            &V1_API
        }
    };
}
pub(crate) use function_info_v1;
