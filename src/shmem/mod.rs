//! The state shared between publishers, consumers and workers: one slot per
//! backend for open publishing transactions, one per backend for what its
//! subscription polls claim and wait for, and one entry per database for its
//! worker.
//!
//! Everything here is a plain atomic, so publishers' commit callbacks can touch
//! it without locks or allocation. The slots are indexed by `pgprocno`, so each
//! backend owns its slot exclusively; a database entry is claimed, attached
//! to and freed under an LWLock (databases.rs).
//!
//! * `publishers`: open publishing transactions, and what holds the horizon;
//! * `consumers`: what subscription polls wait for and claim;
//! * `databases`: each database's worker entry, and databases dropped lately;
//! * `deliveries`: a backend's request that its worker record a poll's
//!   deliveries, and the answer.

use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

use pgrx::pg_sys;

mod consumers;
mod databases;
mod deliveries;
mod publishers;

pub use consumers::*;
pub use databases::*;
pub use deliveries::*;
pub use publishers::*;

use databases::DROPPED_REMEMBERED;

#[repr(C)]
pub(super) struct Header {
    pub(super) n_slots: u32,
    pub(super) n_dbs: u32,
    /// Bumped when a transaction that changed stream grants commits.
    pub(super) acl_generation: AtomicU64,
    /// pgprocno of the launcher, -1 when none: publishers set its latch.
    pub(super) launcher_procno: AtomicI32,
    /// Databases dropped lately (0: an empty place), for workers the
    /// postmaster restarts after their database is gone (see
    /// [`remember_dropped`]).
    pub(super) dropped: [AtomicU32; DROPPED_REMEMBERED],
    /// Where the next dropped database goes (modulo `DROPPED_REMEMBERED`).
    pub(super) dropped_next: AtomicU32,
}

static mut SHARED: *mut Header = std::ptr::null_mut();
static mut PREV_REQUEST_HOOK: pg_sys::shmem_request_hook_type = None;
static mut PREV_STARTUP_HOOK: pg_sys::shmem_startup_hook_type = None;
/// The lock of the database entries (see databases.rs), one of a named
/// tranche requested at startup.
static mut DB_LOCK: *mut pg_sys::LWLock = std::ptr::null_mut();

const SHMEM_NAME: &std::ffi::CStr = c"litebase_streams";

/// Slot count and database-entry count, from the server's settings.
fn dimensions() -> (u32, u32) {
    // pgprocno covers backends, auxiliary processes and prepared transactions;
    // the margin covers the auxiliary processes.
    // SAFETY: plain reads of settings fixed at server start; only the shmem hooks call this, after
    // the postmaster computed MaxBackends.
    let (backends, workers) = unsafe { (pg_sys::MaxBackends, pg_sys::max_worker_processes) };
    let prepared = crate::ffi::max_prepared_xacts();
    ((backends + prepared + 16) as u32, workers.max(1) as u32)
}

/// Offsets of the database entries, the publisher slots, the consumer
/// slots and the delivery mailboxes, and the total size.
fn layout(n_slots: u32, n_dbs: u32) -> (usize, usize, usize, usize, usize) {
    let header = std::mem::size_of::<Header>().next_multiple_of(64);
    let dbs = n_dbs as usize * std::mem::size_of::<DbEntry>();
    let slots = n_slots as usize * std::mem::size_of::<PublisherSlot>();
    let consumers = n_slots as usize * std::mem::size_of::<ConsumerSlot>();
    let mailboxes = n_slots as usize * std::mem::size_of::<DeliveryMailbox>();
    let at_consumers = header + dbs + slots;
    (header, header + dbs, at_consumers, at_consumers + consumers, at_consumers + consumers + mailboxes)
}

/// Install the shared-memory hooks. Call only from `_PG_init` while
/// `shared_preload_libraries` is being processed.
///
/// # Safety
/// SAFETY: call only from `_PG_init` during shared_preload_libraries: the postmaster is then
/// single-threaded, so the `static mut` hook slots have no concurrent reader.
pub unsafe fn init() {
    PREV_REQUEST_HOOK = pg_sys::shmem_request_hook;
    pg_sys::shmem_request_hook = Some(request_hook);
    PREV_STARTUP_HOOK = pg_sys::shmem_startup_hook;
    pg_sys::shmem_startup_hook = Some(startup_hook);
}

/// # Safety
/// SAFETY: installed by [`init`]; PostgreSQL calls it once, in the single-threaded postmaster.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn request_hook() {
    if let Some(prev) = PREV_REQUEST_HOOK {
        prev();
    }
    let (n_slots, n_dbs) = dimensions();
    pg_sys::RequestAddinShmemSpace(layout(n_slots, n_dbs).4);
    pg_sys::RequestNamedLWLockTranche(SHMEM_NAME.as_ptr(), 1);
}

/// # Safety
/// SAFETY: installed by [`init`]; runs in the postmaster before any child is forked, so the region
/// from ShmemInitStruct (the size requested above) is initialised before anyone reads it.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn startup_hook() {
    if let Some(prev) = PREV_STARTUP_HOOK {
        prev();
    }
    let (n_slots, n_dbs) = dimensions();
    let size = layout(n_slots, n_dbs).4;
    let mut found = false;
    let base = pg_sys::ShmemInitStruct(SHMEM_NAME.as_ptr(), size, &mut found);
    if !found {
        std::ptr::write_bytes(base as *mut u8, 0, size);
        let header = base as *mut Header;
        (*header).n_slots = n_slots;
        (*header).n_dbs = n_dbs;
        for entry in db_entries_of(header) {
            entry.worker_procno.store(-1, Ordering::Relaxed);
            entry.webhook_procno.store(-1, Ordering::Relaxed);
        }
        (*header).launcher_procno.store(-1, Ordering::Relaxed);
    }
    DB_LOCK = &raw mut (*pg_sys::GetNamedLWLockTranche(SHMEM_NAME.as_ptr())).lock;
    SHARED = base as *mut Header;
}

/// Whether the shared state exists (the library was preloaded).
pub fn available() -> bool {
    // SAFETY: SHARED is written only by the postmaster's startup hook, before any backend forks.
    unsafe { !SHARED.is_null() }
}

pub(super) fn header() -> *mut Header {
    // SAFETY: SHARED is written only by the postmaster's startup hook, before any backend forks.
    let header = unsafe { SHARED };
    assert!(!header.is_null(), "litebase_streams shared memory is not initialised");
    header
}

pub(super) fn db_entries_of(header: *mut Header) -> &'static [DbEntry] {
    // SAFETY: `header` is the ShmemInitStruct region (header() or the startup hook), which lives as
    // long as the server; the entries follow it at layout()'s offset, n_dbs is written before use.
    unsafe {
        let base = (header as *mut u8).add(layout(0, 0).0) as *const DbEntry;
        std::slice::from_raw_parts(base, (*header).n_dbs as usize)
    }
}

pub(super) fn slots() -> &'static [PublisherSlot] {
    let header = header();
    // SAFETY: header() is the ShmemInitStruct region, live as long as the server and sized by the
    // request hook with the same layout(); n_slots and n_dbs never change after startup.
    unsafe {
        let (_, offset, _, _, _) = layout((*header).n_slots, (*header).n_dbs);
        let base = (header as *mut u8).add(offset) as *const PublisherSlot;
        std::slice::from_raw_parts(base, (*header).n_slots as usize)
    }
}

/// The lock of the database entries.
pub(super) fn db_lock() -> *mut pg_sys::LWLock {
    // SAFETY: DB_LOCK is written only by the postmaster's startup hook, before any backend forks.
    let lock = unsafe { DB_LOCK };
    assert!(!lock.is_null(), "litebase_streams shared memory is not initialised");
    lock
}

pub(super) fn consumer_slots() -> &'static [ConsumerSlot] {
    let header = header();
    // SAFETY: as in slots(): the consumer slots follow the publisher slots at layout()'s offset.
    unsafe {
        let (_, _, offset, _, _) = layout((*header).n_slots, (*header).n_dbs);
        let base = (header as *mut u8).add(offset) as *const ConsumerSlot;
        std::slice::from_raw_parts(base, (*header).n_slots as usize)
    }
}

pub(super) fn mailboxes() -> &'static [DeliveryMailbox] {
    let header = header();
    // SAFETY: as in slots(): the mailboxes follow the consumer slots at layout()'s offset.
    unsafe {
        let (_, _, _, offset, _) = layout((*header).n_slots, (*header).n_dbs);
        let base = (header as *mut u8).add(offset) as *const DeliveryMailbox;
        std::slice::from_raw_parts(base, (*header).n_slots as usize)
    }
}

/// The current generation of stream grants (see privileges.rs).
pub fn acl_generation() -> u64 {
    // SAFETY: header() points into shared memory that lives as long as the server; an atomic load.
    unsafe { (*header()).acl_generation.load(Ordering::Acquire) }
}

/// Invalidate every backend's cached publish answers. Atomics only.
pub fn bump_acl_generation() {
    if available() {
        // SAFETY: ShmemInitStruct memory (available() above); atomics only: safe at commit.
        unsafe { (*header()).acl_generation.fetch_add(1, Ordering::AcqRel) };
    }
}

/// Record the launcher's pgprocno so publishers can wake it.
pub fn set_launcher(procno: i32) {
    // SAFETY: header() points into shared memory that lives as long as the server; an atomic store.
    unsafe { (*header()).launcher_procno.store(procno, Ordering::Release) };
}

/// Wait on this backend's own latch until it is set or `milliseconds`
/// pass (the postmaster's death ends the process). The caller resets the
/// latch and checks for interrupts where its protocol needs them.
pub fn wait_on_my_latch(milliseconds: i64) {
    // SAFETY: MyLatch is this backend's own latch, set at process start;
    // WL_EXIT_ON_PM_DEATH ends the process if the postmaster dies.
    unsafe {
        pg_sys::WaitLatch(
            pg_sys::MyLatch,
            (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
            milliseconds,
            pg_sys::PG_WAIT_EXTENSION,
        );
    }
}

/// A backend's short wait for another process (the worker): on its own
/// latch for at most `milliseconds`, then a cancel or terminate ends it
/// with an ERROR.
pub fn nap_on_latch(milliseconds: i64) {
    wait_on_my_latch(milliseconds);
    // SAFETY: MyLatch is this backend's own latch; ResetLatch after the
    // wait, and CHECK_FOR_INTERRUPTS turns a cancel into an ERROR through
    // pgrx's guard.
    unsafe { pg_sys::ResetLatch(pg_sys::MyLatch) };
    pg_sys::check_for_interrupts!();
}

/// Wake the launcher. Atomics and `SetLatch` only.
pub fn wake_launcher() {
    // SAFETY: header() points into shared memory that lives as long as the server; an atomic load.
    let procno = unsafe { (*header()).launcher_procno.load(Ordering::Acquire) };
    if procno >= 0 {
        // SAFETY: a pgprocno the launcher recorded; PGPROC entries live as
        // long as the server, so a stale one (the launcher exited) only sets
        // an unused latch: a spurious wake-up at worst. SetLatch never fails.
        unsafe {
            let proc_ = (*pg_sys::ProcGlobal).allProcs.add(procno as usize);
            pg_sys::SetLatch(&raw mut (*proc_).procLatch);
        }
    }
}
