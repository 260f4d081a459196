//! One slot per backend for its subscription polls: the database whose
//! horizon it waits for, and how many events its open transaction claimed.

use std::sync::atomic::{AtomicI32, AtomicI64, AtomicU32, Ordering};

use pgrx::pg_sys;

use super::{available, consumer_slots, pid_of};

/// How many subscriptions one backend's transaction reports claims for in
/// `streams.subscriptions` (it may claim from more; they are not counted).
pub const CLAIMS_SHOWN: usize = 4;

/// One backend's subscription polls: the database whose horizon it waits
/// for, and how many events its open transaction claimed, per subscription.
/// Written only by its backend; read by the worker (waiters) and by
/// `streams.subscriptions` (claims).
#[repr(C)]
pub struct ConsumerSlot {
    /// The database a long poll waits in, 0 when none.
    waiting_db: AtomicU32,
    /// The subscription it polls (0: `streams.wait`, the horizon only).
    waiting_subscription: AtomicI32,
    claim_db: AtomicU32,
    /// Subscription ids (0: unused) and their claimed event counts.
    claim_subscription: [AtomicI32; CLAIMS_SHOWN],
    claim_count: [AtomicI64; CLAIMS_SHOWN],
}

/// This backend's consumer slot.
pub fn my_consumer_slot() -> Option<&'static ConsumerSlot> {
    // SAFETY: MyProcNumber's PG15 form: MyProc is set once the backend is connected.
    let procno = unsafe { (*pg_sys::MyProc).pgprocno };
    consumer_slots().get(usize::try_from(procno).ok()?)
}

impl ConsumerSlot {
    /// Wait for database `db`'s horizon and, if not 0, for claims of
    /// `subscription` to be returned (db 0: stop waiting).
    pub fn wait_in(&self, db: u32, subscription: i32) {
        self.waiting_subscription.store(subscription, Ordering::SeqCst);
        self.waiting_db.store(db, Ordering::SeqCst);
    }

    /// Report `count` events claimed from `subscription` in database `db`
    /// (0: none). Atomics only: runs inside commit callbacks.
    pub fn report_claims(&self, db: u32, subscription: i32, count: i64) {
        self.claim_db.store(db, Ordering::Relaxed);
        let entries = self.claim_subscription.iter().zip(&self.claim_count);
        for (sub, claimed) in entries.clone() {
            if sub.load(Ordering::Relaxed) == subscription {
                claimed.store(count, Ordering::Relaxed);
                if count == 0 {
                    sub.store(0, Ordering::Relaxed);
                }
                return;
            }
        }
        if count > 0 {
            if let Some((sub, claimed)) = entries.into_iter().find(|(sub, _)| sub.load(Ordering::Relaxed) == 0) {
                claimed.store(count, Ordering::Relaxed);
                sub.store(subscription, Ordering::Relaxed);
            }
        }
    }

    /// The transaction ended: nothing is claimed. Atomics only.
    pub fn clear_claims(&self) {
        for sub in &self.claim_subscription {
            sub.store(0, Ordering::Relaxed);
        }
    }
}

/// Set the latch of every backend that waits in database `db`: for its
/// horizon (the worker, after each round that moved it), or, with
/// `subscriptions`, only those polling one of them (a transaction that
/// held their claims ended). Atomics and `SetLatch` only.
pub fn wake_pollers(db: pg_sys::Oid, subscriptions: Option<&[i32]>) {
    if !available() {
        return;
    }
    for (procno, slot) in consumer_slots().iter().enumerate() {
        if slot.waiting_db.load(Ordering::SeqCst) != db.to_u32() {
            continue;
        }
        let polled = slot.waiting_subscription.load(Ordering::SeqCst);
        if subscriptions.is_some_and(|subs| !subs.contains(&polled)) {
            continue;
        }
        // SAFETY: ProcGlobal's allProcs lives as long as the server and has a
        // PGPROC for every pgprocno the slots are sized for; SetLatch never raises.
        unsafe {
            let proc_ = (*pg_sys::ProcGlobal).allProcs.add(procno);
            pg_sys::SetLatch(&raw mut (*proc_).procLatch);
        }
    }
}

/// (subscription, pid, claimed events) of every open transaction in `db`
/// that claimed events, for `streams.subscriptions`.
pub fn claims_in(db: pg_sys::Oid) -> Vec<(i32, i32, i64)> {
    let mut found = Vec::new();
    for (procno, slot) in consumer_slots().iter().enumerate() {
        if slot.claim_db.load(Ordering::Relaxed) != db.to_u32() {
            continue;
        }
        for (sub, claimed) in slot.claim_subscription.iter().zip(&slot.claim_count) {
            let (sub, claimed) = (sub.load(Ordering::Relaxed), claimed.load(Ordering::Relaxed));
            if sub != 0 && claimed > 0 {
                found.push((sub, pid_of(procno), claimed));
            }
        }
    }
    found
}
