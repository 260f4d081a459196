//! Claims: which events a transaction polled and has not yet acked.
//!
//! A claim is a lock in PostgreSQL's lock manager, held until the claiming
//! transaction ends: a commit, a rollback, a failed statement that aborts
//! the transaction, a rolled-back savepoint (its locks go with it) or a lost
//! session all return it, without any code of ours running. The locks use
//! the advisory lock tag with a fourth field that `pg_advisory_lock` and its
//! kin never produce (they use 1 and 2), so no SQL caller can take, hold or
//! release a subscription's claims; `pg_locks` shows them as advisory locks
//! with `objsubid` 19522 (token), 19523 (chunk) or 19524 (key).
//!
//! * Every subscription has a token. An ordered subscription's pollers take
//!   it exclusively: one transaction at a time polls it. An unordered one's
//!   take it shared. `seek` and `drop_subscription` take it exclusively and
//!   so wait for every transaction holding claims, and keep new ones out
//!   until they commit: an ack cannot land on a rewound subscription.
//! * An unordered subscription is split into chunks of [`CHUNK_WIDTH`]
//!   positions, one lock each: concurrent pollers take different chunks,
//!   and within a chunk the processed events are always a prefix (a claim
//!   starts where the last ack of the chunk ended). Consumers therefore work
//!   in parallel when the pending events span several chunks.
//!
//! What the transaction claimed (the position ranges) is kept here, in
//! backend memory, per subtransaction: a rolled-back savepoint drops the
//! ranges it added, as PostgreSQL drops the locks. The counts are also
//! published in shared memory for `streams.subscriptions`.

use std::cell::{Cell, RefCell};
use std::ffi::c_void;

use pgrx::prelude::*;

use crate::error::StreamsError;
use crate::shmem;

/// Positions per chunk of an unordered subscription. Chunk numbers are lock
/// keys of 32 bits: positions up to 4.4 * 10^12.
pub const CHUNK_WIDTH: i64 = 1024;

/// The fourth field of a subscription's lock tags.
const TOKEN_TAG: u16 = 0x4C42;
const CHUNK_TAG: u16 = 0x4C43;
const KEY_TAG: u16 = 0x4C44;

/// The chunk of an unordered subscription a position falls in.
pub fn chunk_of(position: i64) -> i64 {
    position / CHUNK_WIDTH
}

/// What a claim locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// An ordered subscription's only lock.
    Token,
    Chunk(i64),
    /// A dead letter put back, below an ordered subscription's position:
    /// held under the token, no lock of its own.
    PutBack,
    /// A key of a subscription ordered per key (its hash).
    Keyed(u32),
}

/// Events of a subscription's stream pattern in `(low, high]`, polled by
/// this transaction (`count` of them).
#[derive(Debug, Clone, Copy)]
pub struct Claim {
    pub subscription: i32,
    pub key: Key,
    pub low: i64,
    pub high: i64,
    pub count: i64,
    subtransaction: pg_sys::SubTransactionId,
}

/// The most chunk locks one transaction takes: every lock takes a slot of
/// the lock table all sessions share, and a consumer that polls over and
/// over without committing must not fill it.
pub const MAX_CHUNKS_PER_TRANSACTION: usize = 64;

/// Subscriptions whose pollers a transaction's end wakes by name; with more,
/// it wakes every poller of the database.
const WAKE_LIST: usize = 8;

thread_local! {
    static CLAIMS: RefCell<Vec<Claim>> = const { RefCell::new(Vec::new()) };
    /// (subscription, position, subtransaction) of the events this
    /// transaction nacked after polling them.
    static NACKED: RefCell<Vec<(i32, i64, pg_sys::SubTransactionId)>> = const { RefCell::new(Vec::new()) };
    static CALLBACKS_REGISTERED: Cell<bool> = const { Cell::new(false) };
    /// This transaction took a subscription lock (a claim, or seek's token).
    static LOCKED: Cell<Option<WakeList>> = const { Cell::new(None) };
    /// This transaction holds a subscription's token exclusively (seek,
    /// drop_subscription): it must not PREPARE, or a prepared transaction
    /// would hold the subscription until COMMIT PREPARED, across restarts.
    static EXCLUSIVE: Cell<bool> = const { Cell::new(false) };
    /// Set at the transaction's end: wake these pollers once the locks are
    /// released (see [`resource_release_callback`]).
    static WAKE_AFTER_RELEASE: Cell<Option<WakeList>> = const { Cell::new(None) };
}

/// Up to [`WAKE_LIST`] subscription ids without allocating; `None` in the
/// list's place means "all of them".
#[derive(Debug, Clone, Copy)]
struct WakeList {
    ids: [i32; WAKE_LIST],
    len: usize,
    overflow: bool,
}

impl WakeList {
    fn with(list: Option<WakeList>, subscription: i32) -> WakeList {
        let mut list = list.unwrap_or(WakeList { ids: [0; WAKE_LIST], len: 0, overflow: false });
        if !list.ids[..list.len].contains(&subscription) {
            if list.len < WAKE_LIST {
                list.ids[list.len] = subscription;
                list.len += 1;
            } else {
                list.overflow = true;
            }
        }
        list
    }
}

fn note_locked(subscription: i32) {
    LOCKED.with(|l| l.set(Some(WakeList::with(l.get(), subscription))));
}

fn tag(subscription: i32, key: Key) -> pg_sys::LOCKTAG {
    let (field3, field4) = match key {
        Key::Token | Key::PutBack => (0, TOKEN_TAG),
        Key::Chunk(chunk) => (u32::try_from(chunk).expect("positions below 4.4 * 10^12"), CHUNK_TAG),
        Key::Keyed(hash) => (hash, KEY_TAG),
    };
    pg_sys::LOCKTAG {
        // SAFETY: MyDatabaseId is set once the backend connected; a plain read.
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.to_u32(),
        locktag_field2: subscription as u32,
        locktag_field3: field3,
        locktag_field4: field4,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    }
}

/// How a transaction holds a subscription's token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Polling an unordered subscription: many transactions at once.
    Shared,
    /// Polling an ordered subscription, or changing it (seek, drop): one
    /// transaction, and none of the others.
    Exclusive,
}

impl Hold {
    fn mode(self) -> pg_sys::LOCKMODE {
        (match self {
            Hold::Shared => pg_sys::ShareLock,
            Hold::Exclusive => pg_sys::ExclusiveLock,
        }) as pg_sys::LOCKMODE
    }
}

/// Take the lock for `key` unless another transaction holds it in a
/// conflicting mode; true when this transaction holds it now. Never waits.
/// Chunks are always taken exclusively.
pub fn try_lock(subscription: i32, key: Key, hold: Hold) -> bool {
    register_callbacks();
    let tag = tag(subscription, key);
    // SAFETY: a transaction-scoped lock on a tag of our own; LockAcquire raises
    // (out of shared memory) through pgrx's FFI guard, as a Rust panic.
    let result = unsafe { pg_sys::LockAcquire(&tag, hold.mode(), false, true) };
    let locked = result != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL;
    if locked {
        note_locked(subscription);
    }
    locked
}

/// How many chunk and key locks this transaction holds claims under (all
/// subscriptions).
pub fn chunks_claimed() -> usize {
    CLAIMS.with(|c| {
        let claims = c.borrow();
        let chunk = |c: &Claim| match c.key {
            Key::Chunk(chunk) => Some((c.subscription, chunk)),
            Key::Keyed(hash) => Some((c.subscription, -1 - i64::from(hash))),
            Key::Token | Key::PutBack => None,
        };
        let mut chunks: Vec<(i32, i64)> = claims.iter().filter_map(chunk).collect();
        chunks.sort_unstable();
        chunks.dedup();
        chunks.len()
    })
}

/// Take the token exclusively, waiting for every transaction that holds
/// claims of the subscription to end (and keeping new ones out until this
/// transaction ends). The wait obeys lock_timeout, statement_timeout,
/// cancel and deadlock detection, like any lock wait.
pub fn lock_exclusively(subscription: i32) {
    register_callbacks();
    let tag = tag(subscription, Key::Token);
    // SAFETY: as in try_lock; a waiting LockAcquire raises on interrupts
    // through pgrx's FFI guard.
    unsafe { pg_sys::LockAcquire(&tag, Hold::Exclusive.mode(), false, false) };
    EXCLUSIVE.with(|e| e.set(true));
    note_locked(subscription);
}

/// Give back a lock this transaction took but claimed nothing under.
pub fn unlock(subscription: i32, key: Key, hold: Hold) {
    let tag = tag(subscription, key);
    // SAFETY: releases a transaction-scoped lock this backend holds (try_lock
    // succeeded); LockRelease only warns when it is not held.
    unsafe { pg_sys::LockRelease(&tag, hold.mode(), false) };
}

/// Record what a poll claimed under a lock this transaction holds.
pub fn add(subscription: i32, key: Key, low: i64, high: i64, count: i64) {
    // SAFETY: a plain read of the backend's current subtransaction id.
    let subtransaction = unsafe { pg_sys::GetCurrentSubTransactionId() };
    CLAIMS.with(|c| c.borrow_mut().push(Claim { subscription, key, low, high, count, subtransaction }));
    publish_count(subscription);
}

/// This transaction's claims on `subscription`.
pub fn of(subscription: i32) -> Vec<Claim> {
    CLAIMS.with(|c| c.borrow().iter().filter(|c| c.subscription == subscription).copied().collect())
}

/// This transaction nacked the event at `position`, which it polled.
pub fn note_nacked(subscription: i32, position: i64) {
    // SAFETY: a plain read of the backend's current subtransaction id.
    let subtransaction = unsafe { pg_sys::GetCurrentSubTransactionId() };
    NACKED.with(|n| n.borrow_mut().push((subscription, position, subtransaction)));
}

/// The events of `subscription` this transaction polled and nacked.
pub fn nacked(subscription: i32) -> Vec<i64> {
    NACKED.with(|n| n.borrow().iter().filter(|n| n.0 == subscription).map(|n| n.1).collect())
}

/// Where this transaction's next poll of `key` continues: after the highest
/// position it claimed there, if it claimed any.
pub fn claimed_through(subscription: i32, key: Key) -> Option<i64> {
    of(subscription).iter().filter(|c| c.key == key).map(|c| c.high).max()
}

fn publish_count(subscription: i32) {
    let count = CLAIMS.with(|c| c.borrow().iter().filter(|c| c.subscription == subscription).map(|c| c.count).sum());
    if let Some(slot) = shmem::my_consumer_slot() {
        // SAFETY: MyDatabaseId is set once the backend connected; a plain read.
        slot.report_claims(unsafe { pg_sys::MyDatabaseId }.to_u32(), subscription, count);
    }
}

pub fn register_callbacks() {
    if !CALLBACKS_REGISTERED.with(|r| r.replace(true)) {
        // SAFETY: registers plain functions for the rest of this backend's
        // life; they touch backend memory and atomics only, and raise only at
        // PRE_PREPARE, where raising is allowed.
        unsafe {
            pg_sys::RegisterXactCallback(Some(xact_callback), std::ptr::null_mut());
            pg_sys::RegisterSubXactCallback(Some(subxact_callback), std::ptr::null_mut());
            pg_sys::RegisterResourceReleaseCallback(Some(resource_release_callback), std::ptr::null_mut());
        }
    }
}

/// The transaction ends: forget the ranges, and have the pollers of the
/// subscriptions it locked woken once PostgreSQL has released the locks (an
/// ordered subscription's next poller, and a seek's, wait for exactly that;
/// woken before the release, a poller could find the lock still held and
/// sleep again). Atomics and `SetLatch` only at commit; clearing the vector
/// frees nothing.
fn end_of_transaction() {
    let held = CLAIMS.with(|c| {
        let mut claims = c.borrow_mut();
        let held = !claims.is_empty();
        claims.clear();
        held
    });
    NACKED.with(|n| n.borrow_mut().clear());
    let slot = shmem::my_consumer_slot();
    if let Some(slot) = slot {
        // A long poll ended by FATAL (terminate) never dropped its Waiter.
        slot.wait_in(0, 0);
        if held {
            slot.clear_claims();
        }
    }
    EXCLUSIVE.with(|e| e.set(false));
    WAKE_AFTER_RELEASE.with(|w| w.set(LOCKED.with(|l| l.take())));
}

/// # Safety
/// SAFETY: registered by [`register_callbacks`]; PostgreSQL calls it during every resource owner
/// release with valid arguments and our null arg. It only sets latches.
#[pg_guard]
unsafe extern "C-unwind" fn resource_release_callback(
    phase: pg_sys::ResourceReleasePhase::Type,
    _is_commit: bool,
    is_top_level: bool,
    _arg: *mut c_void,
) {
    if phase != pg_sys::ResourceReleasePhase::RESOURCE_RELEASE_AFTER_LOCKS || !is_top_level {
        return;
    }
    if let Some(list) = WAKE_AFTER_RELEASE.with(|w| w.take()) {
        let db = pg_sys::MyDatabaseId;
        if list.overflow {
            shmem::wake_pollers(db, None);
        } else {
            shmem::wake_pollers(db, Some(&list.ids[..list.len]));
        }
    }
}

/// # Safety
/// SAFETY: registered by [`register_callbacks`]; PostgreSQL calls it with a valid event and our
/// null arg. It raises only at PRE_PREPARE.
#[pg_guard]
unsafe extern "C-unwind" fn xact_callback(event: pg_sys::XactEvent::Type, _arg: *mut c_void) {
    use pg_sys::XactEvent::*;
    match event {
        XACT_EVENT_PRE_PREPARE if CLAIMS.with(|c| !c.borrow().is_empty()) || EXCLUSIVE.with(|e| e.get()) => {
            StreamsError::PreparedPoll.raise()
        }
        XACT_EVENT_COMMIT
        | XACT_EVENT_PARALLEL_COMMIT
        | XACT_EVENT_ABORT
        | XACT_EVENT_PARALLEL_ABORT
        | XACT_EVENT_PREPARE => end_of_transaction(),
        _ => {}
    }
}

/// A rolled-back savepoint took its locks along: drop its ranges. A released
/// one hands them to its parent, as PostgreSQL does with the locks.
///
/// # Safety
/// SAFETY: registered by [`register_callbacks`]; PostgreSQL calls it with valid ids and our null
/// arg. It never raises.
#[pg_guard]
unsafe extern "C-unwind" fn subxact_callback(
    event: pg_sys::SubXactEvent::Type,
    my_subid: pg_sys::SubTransactionId,
    parent_subid: pg_sys::SubTransactionId,
    _arg: *mut c_void,
) {
    use pg_sys::SubXactEvent::*;
    match event {
        SUBXACT_EVENT_ABORT_SUB => {
            CLAIMS.with(|c| c.borrow_mut().retain(|c| c.subtransaction != my_subid));
            NACKED.with(|n| n.borrow_mut().retain(|n| n.2 != my_subid));
            if let Some(slot) = shmem::my_consumer_slot() {
                slot.clear_claims();
            }
            // Without allocating: publish_count sums in place.
            let count = CLAIMS.with(|c| c.borrow().len());
            for i in 0..count {
                publish_count(CLAIMS.with(|c| c.borrow()[i].subscription));
            }
        }
        SUBXACT_EVENT_COMMIT_SUB => {
            CLAIMS.with(|c| {
                for claim in c.borrow_mut().iter_mut().filter(|c| c.subtransaction == my_subid) {
                    claim.subtransaction = parent_subid;
                }
            });
            NACKED.with(|n| {
                for nacked in n.borrow_mut().iter_mut().filter(|n| n.2 == my_subid) {
                    nacked.2 = parent_subid;
                }
            });
        }
        _ => {}
    }
}
