//! Per-stream privileges, as the Rust side sees them: who may publish to a
//! stream, who may read a whole pattern (subscriptions), running the publish
//! INSERT as the extension's owner, and the pattern test and its planner
//! support used by the log's row-level security.
//!
//! The grants live in `streams.stream_grants` (sql/streams.sql). Reading is
//! enforced by row-level security on `streams.event_log`; publishing is
//! checked here, as the caller, before the event is written as the owner.
//! `publish` is therefore *not* SECURITY DEFINER: the caller's identity is
//! what the check needs, and the owner's is used only for the INSERT.
//!
//! A publisher that is not a superuser asks the database once per (role,
//! stream) and keeps the answer in a small backend-local cache. The cache is
//! dropped when any transaction that changed grants commits (a cluster-wide
//! generation counter bumped in the commit callback) and when roles or role
//! memberships change (syscache callbacks), so a revoke takes effect for the
//! next publish of every session. Answers read under a transaction snapshot
//! (repeatable read) are not kept: they may predate a revoke.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use pgrx::prelude::*;
use pgrx::IntoDatum;

use crate::log::kept_plan::{spi, KeptPlan};

use crate::error::{SpiContext, StreamsError};
use crate::shmem;

/// Cached answers hold at most this many (role, stream) pairs.
const CACHE_CAPACITY: usize = 1024;

/// What a cached answer is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Question {
    /// May publish to this stream.
    Publish,
    /// May read every stream this pattern selects.
    ReadAll,
}

thread_local! {
    /// (user, which log: its position sequence, question, stream or pattern)
    /// → the answer.
    static CACHE: RefCell<HashMap<(u32, u32, Question, String), bool>> = RefCell::new(HashMap::new());
    static CACHE_GENERATION: Cell<u64> = const { Cell::new(0) };
    static CALLBACK_REGISTERED: Cell<bool> = const { Cell::new(false) };
    static CHANGED_IN_THIS_XACT: Cell<bool> = const { Cell::new(false) };
    static MAY_PUBLISH_PLAN: Cell<pg_sys::SPIPlanPtr> = const { Cell::new(std::ptr::null_mut()) };
}

/// Raise 42501 unless the current user may publish to `stream` of the log
/// whose position sequence is `log`.
pub fn check_publish(stream: &str, log: pg_sys::Oid) {
    let allowed = cached_answer(log, Question::Publish, stream, || ask_may_publish(stream));
    deny_unless(allowed, stream)
}

/// Whether the current user may read every stream `pattern` selects (a
/// name, `prefix.*` or `*`) in the log whose position sequence is `log`: a
/// superuser, the owner, or a read grant that covers the whole pattern.
pub fn may_read_all(pattern: &str, log: pg_sys::Oid) -> bool {
    cached_answer(log, Question::ReadAll, pattern, || ask_may_read_all(pattern))
}

/// The answer for the current user, from the cache or from `ask`.
fn cached_answer(log: pg_sys::Oid, question: Question, stream: &str, ask: impl FnOnce() -> bool) -> bool {
    // SAFETY: a syscache lookup of the current user inside the caller's transaction; pgrx's FFI
    // guard turns an ERROR into a Rust panic.
    if unsafe { pg_sys::superuser() } {
        return true;
    }
    // SAFETY: reads the backend's current user id, set once it is connected.
    let user = unsafe { pg_sys::GetUserId() }.to_u32();
    refresh_cache();
    let key = (user, log.to_u32(), question, stream.to_owned());
    if let Some(allowed) = CACHE.with(|c| c.borrow().get(&key).copied()) {
        return allowed;
    }
    let allowed = ask();
    // A transaction-snapshot answer may predate a revoke that committed
    // since: use it, but keep only answers read with a fresh snapshot.
    // SAFETY: a backend-global set when the transaction starts; only read here.
    if unsafe { pg_sys::XactIsoLevel } >= pg_sys::XACT_REPEATABLE_READ as i32 {
        return allowed;
    }
    CACHE.with(|c| {
        let mut cache = c.borrow_mut();
        if cache.len() >= CACHE_CAPACITY {
            cache.clear();
        }
        cache.insert(key, allowed);
    });
    allowed
}

fn deny_unless(allowed: bool, stream: &str) {
    if !allowed {
        StreamsError::PermissionDenied { privilege: "publish", stream: stream.to_owned() }.raise();
    }
}

fn refresh_cache() {
    if !CALLBACK_REGISTERED.with(|r| r.replace(true)) {
        // SAFETY: registers a plain function for the rest of this backend's
        // life; the callback only clears a thread-local map.
        unsafe {
            for cache in [pg_sys::SysCacheIdentifier::AUTHMEMMEMROLE, pg_sys::SysCacheIdentifier::AUTHOID] {
                pg_sys::CacheRegisterSyscacheCallback(
                    cache as i32,
                    Some(forget_cached_answers),
                    pg_sys::Datum::from(0),
                );
            }
        }
    }
    let generation = shmem::acl_generation();
    if CACHE_GENERATION.with(|g| g.replace(generation)) != generation {
        CACHE.with(|c| c.borrow_mut().clear());
    }
}

/// # Safety
/// SAFETY: registered with CacheRegisterSyscacheCallback; ignores its arguments and only clears a
/// thread-local map that is never borrowed across a call into PostgreSQL.
#[pg_guard]
unsafe extern "C-unwind" fn forget_cached_answers(_arg: pg_sys::Datum, _cache: i32, _hash: u32) {
    CACHE.with(|c| c.borrow_mut().clear());
}

/// `streams._may_publish(stream)` as the current user, through a kept plan.
fn ask_may_publish(stream: &str) -> bool {
    let stream = stream.into_datum().expect("text datum");
    // SAFETY: a kept plan of this backend, run inside SPI_connect/finish.
    unsafe {
        spi::connect();
        MAY_PUBLISH.execute(&mut [stream], pg_sys::SPI_OK_SELECT);
        let allowed = spi::first_bool().unwrap_or(false);
        spi::finish();
        allowed
    }
}

static MAY_PUBLISH: KeptPlan<1> =
    KeptPlan { sql: c"SELECT streams._may_publish($1)", types: [pg_sys::TEXTOID], plan: MAY_PUBLISH_PLAN };

/// `streams._reads_all()` and `streams._read_patterns()` as the current user.
fn ask_may_read_all(pattern: &str) -> bool {
    let answer = Spi::connect(|client| {
        let row = client.select("SELECT streams._reads_all(), streams._read_patterns()", None, &[])?.first();
        Ok::<_, pgrx::spi::Error>((
            row.get::<bool>(1)?.unwrap_or(false),
            row.get::<Vec<String>>(2)?.unwrap_or_default(),
        ))
    });
    let (all, grants) = answer.context("checking read privileges");
    all || grants.iter().any(|grant| litebase_streams_core::names::pattern_covers(grant, pattern))
}

/// Run `body` as `owner` (the extension's owner), the way a SECURITY DEFINER
/// function would. A (sub)transaction abort restores the caller's identity
/// if `body` raises.
pub fn as_owner<R>(owner: pg_sys::Oid, body: impl FnOnce() -> R) -> R {
    as_user(owner, pg_sys::SECURITY_LOCAL_USERID_CHANGE, body)
}

/// Run `body` (another role's code: a table owner's cast to json) as
/// `owner`, as a security-restricted operation whose settings are undone
/// afterwards, as PostgreSQL runs an index expression in maintenance: that
/// code may not SET ROLE or leave a `search_path` of its choosing in the
/// caller's session. A (sub)transaction abort restores both if `body` raises.
pub fn as_owner_restricted<R>(owner: pg_sys::Oid, body: impl FnOnce() -> R) -> R {
    // SAFETY: a GUC nesting level of the current transaction, closed below (an abort closes it
    // if `body` raises).
    let settings = unsafe { pg_sys::NewGUCNestLevel() };
    let result = as_user(owner, pg_sys::SECURITY_LOCAL_USERID_CHANGE | pg_sys::SECURITY_RESTRICTED_OPERATION, body);
    // SAFETY: the level opened above, in the same transaction.
    unsafe { pg_sys::AtEOXact_GUC(false, settings) };
    result
}

/// Run `body` as `user` with the security context flags `flags` added.
fn as_user<R>(user: pg_sys::Oid, flags: u32, body: impl FnOnce() -> R) -> R {
    let (mut saved_user, mut saved_context) = (pg_sys::InvalidOid, 0);
    // SAFETY: plain reads and writes of the backend's current user id; the
    // SECURITY_LOCAL_USERID_CHANGE flag is what fmgr_security_definer sets.
    unsafe {
        pg_sys::GetUserIdAndSecContext(&mut saved_user, &mut saved_context);
        pg_sys::SetUserIdAndSecContext(user, saved_context | flags as i32);
    }
    let result = body();
    // SAFETY: as above.
    unsafe { pg_sys::SetUserIdAndSecContext(saved_user, saved_context) };
    result
}

/// `streams._acl_changed()`: called by `streams.grant` and `streams.revoke`;
/// when the transaction commits, every backend drops its cached publish
/// answers.
#[pg_extern(volatile)]
pub(crate) fn _acl_changed() {
    CHANGED_IN_THIS_XACT.with(|c| c.set(true));
}

/// From the transaction callback at commit, PREPARE (the change commits
/// later: invalidating early costs nothing) or abort. Atomics only.
pub fn at_transaction_end(committed_or_prepared: bool) {
    if CHANGED_IN_THIS_XACT.with(|c| c.replace(false)) && committed_or_prepared {
        shmem::bump_acl_generation();
    }
}

/// `streams._stream_matches_support(internal)`: the planner support function
/// of `_stream_matches`. It tells the planner that the privilege test keeps
/// every row: for a reader granted `'*'` (and for the owner) it does, and
/// with PostgreSQL's default guess (a third) ordered replays of large ranges
/// would be planned as full scans and sorts instead of index scans.
///
/// # Safety
/// SAFETY: only the planner calls it: it is STRICT and no SQL value has type `internal`, so
/// `fcinfo` is valid and argument 0 is a support request node.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn litebase_streams_matches_support(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: the planner calls a support function with one internal
    // argument, a request node it owns; we only write the answer field of
    // the request type we check for.
    let request = pgrx::fcinfo::pg_getarg_datum_raw(fcinfo, 0).cast_mut_ptr::<pg_sys::Node>();
    if !request.is_null() && (*request).type_ == pg_sys::NodeTag::T_SupportRequestSelectivity {
        (*(request as *mut pg_sys::SupportRequestSelectivity)).selectivity = 1.0;
        return pg_sys::Datum::from(request);
    }
    pg_sys::Datum::from(0usize)
}

crate::ffi::function_info_v1!(pg_finfo_litebase_streams_matches_support);

/// `streams._stream_matches(stream, patterns)`: whether `stream` is selected
/// by any of `patterns` (exact names, `prefix.*`, `*`, `order.*.failed`). Used by the
/// `streams.events` view and `streams._may_publish`.
#[pg_extern(immutable, strict, parallel_safe)]
pub(crate) fn _stream_matches(stream: &str, patterns: pgrx::Array<&str>) -> bool {
    patterns.iter().flatten().any(|pattern| litebase_streams_core::names::pattern_matches(pattern, stream))
}
