//! One slot per backend for its open publishing transaction (indexed by
//! `pgprocno`, so each backend owns its slot): the lowest position it holds,
//! which holds the horizon back.

use std::sync::atomic::{AtomicI32, AtomicI64, AtomicU32, AtomicU64, Ordering};

use pgrx::pg_sys;

use super::slots;

/// A slot's value while its backend is taking its first position.
const ALLOCATING: u64 = u64::MAX;

/// One backend's open publishing transaction. `low == 0`: none.
#[repr(C)]
pub struct PublisherSlot {
    db: AtomicU32,
    low: AtomicU64,
    /// When the transaction announced itself (TimestampTz), for hold_timeout.
    since: AtomicI64,
    /// The announcing backend's pid, for hold_timeout.
    pid: AtomicI32,
}

/// This backend's publisher slot.
pub fn my_slot(procno: i32) -> Option<&'static PublisherSlot> {
    slots().get(usize::try_from(procno).ok()?)
}

impl PublisherSlot {
    /// Announce a first publish in database `db`: a position is being taken.
    pub fn begin(&self, db: pg_sys::Oid) {
        // SAFETY: plain reads of this backend's statement start time and of MyProcPid, which is set
        // once at process start and only read here.
        self.since.store(unsafe { pg_sys::GetCurrentStatementStartTimestamp() }, Ordering::Relaxed);
        self.pid.store(unsafe { pg_sys::MyProcPid }, Ordering::Relaxed);
        self.db.store(db.to_u32(), Ordering::SeqCst);
        self.low.store(ALLOCATING, Ordering::SeqCst);
    }

    /// The first position is known: hold exactly it.
    pub fn hold(&self, position: u64) {
        self.low.store(position, Ordering::SeqCst);
    }

    /// The transaction finished. Atomics only: runs inside commit callbacks.
    pub fn release(&self) {
        self.low.store(0, Ordering::SeqCst);
    }
}

/// The lowest position held by each open publishing transaction of database
/// `db`, keyed by pgprocno. A backend still taking its first position is
/// usually a few instructions from knowing it (or from withdrawing): wait
/// briefly, since whatever it gets may be below the caller's reading of the
/// sequence. One that stays allocating (its `nextval` waits on a lock) counts
/// as holding everything ([`HOLDS_EVERYTHING`]): the horizon does not move
/// this round, and nobody waits on it.
pub fn held_positions(db: pg_sys::Oid) -> Vec<(usize, u64)> {
    let mut found = Vec::new();
    for (procno, slot) in slots().iter().enumerate() {
        let mut low = slot.low.load(Ordering::SeqCst);
        if low == 0 || slot.db.load(Ordering::SeqCst) != db.to_u32() {
            continue;
        }
        let mut spins = 0u32;
        while low == ALLOCATING && spins < 1100 {
            spins += 1;
            if spins < 1000 {
                std::hint::spin_loop();
            } else {
                // SAFETY: a plain sleep of 10 µs; at most 100 of them per slot.
                unsafe { pg_sys::pg_usleep(10) };
            }
            low = slot.low.load(Ordering::SeqCst);
        }
        match low {
            0 => {}
            ALLOCATING => found.push((procno, HOLDS_EVERYTHING)),
            low => found.push((procno, low)),
        }
    }
    found
}

/// The lowest position held by an open publishing transaction of `db`,
/// passing over backends still taking their first one (they will get a
/// position above every one taken so far); without waiting.
pub fn lowest_position_held(db: pg_sys::Oid) -> Option<u64> {
    slots()
        .iter()
        .filter(|slot| slot.db.load(Ordering::SeqCst) == db.to_u32())
        .map(|slot| slot.low.load(Ordering::SeqCst))
        .filter(|&low| low != 0 && low != ALLOCATING)
        .min()
}

/// The position reported for a slot still allocating after the wait.
pub const HOLDS_EVERYTHING: u64 = 1;

/// The pid and start time (TimestampTz) of the open publishing transaction
/// in slot `procno` while it still holds position `low`.
pub fn holder_of(procno: usize, low: u64) -> Option<(i32, i64)> {
    let slot = slots().get(procno)?;
    let (pid, since) = (slot.pid.load(Ordering::Relaxed), slot.since.load(Ordering::Relaxed));
    // Read after pid and since: a slot reused since the scan shows a new low.
    (slot.low.load(Ordering::SeqCst) == low && low != 0).then_some((pid, since))
}

/// The process with this pgprocno, or None for one out of range.
fn proc_at(procno: usize) -> Option<*const pg_sys::PGPROC> {
    // SAFETY: ProcGlobal and its allProcs array live in shared memory as long
    // as the server; the index is checked against allProcCount.
    unsafe {
        let global = pg_sys::ProcGlobal;
        (procno < (*global).allProcCount as usize).then(|| (*global).allProcs.add(procno) as *const pg_sys::PGPROC)
    }
}

/// The pid of the process with this pgprocno (0 for one out of range).
pub fn pid_of(procno: usize) -> i32 {
    // SAFETY: proc_at points into shared memory that lives as long as the server.
    proc_at(procno).map_or(0, |proc_| unsafe { (*proc_).pid })
}

/// The top transaction id of the process with this pgprocno (invalid for
/// one out of range or not in a transaction). Read without a lock: it may
/// already be the id of the transaction the process runs next.
pub fn xid_of(procno: usize) -> pg_sys::TransactionId {
    // SAFETY: proc_at points into shared memory that lives as long as the
    // server; a volatile read, since the process changes it concurrently.
    proc_at(procno).map_or(pg_sys::InvalidTransactionId, |proc_| unsafe { std::ptr::read_volatile(&(*proc_).xid) })
}
