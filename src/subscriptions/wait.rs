//! Long polls: a `poll` with `wait` sleeps on its process latch until the
//! database's worker moves the horizon, a transaction that held claims ends,
//! the wait is over, or an interrupt arrives (cancel, statement_timeout,
//! terminate, shutdown: each sets the latch, and `CHECK_FOR_INTERRUPTS`
//! raises it). Nothing polls a table while it sleeps.

use std::time::{Duration, Instant};

use pgrx::prelude::*;

use crate::shmem::{self, ConsumerSlot};

/// The longest single sleep: a safety net against a lost wake-up (the
/// worker restarting, say), not the way events are found. Long enough that
/// a test of the wake-up cannot pass on it.
const MAX_SLEEP: Duration = Duration::from_secs(10);

/// Registered as waiting for this database's horizon while alive; a poll
/// that ends, returns or raises (the error unwinds through it) stops
/// waiting.
pub struct Waiter {
    slot: Option<&'static ConsumerSlot>,
    deadline: Instant,
}

impl Waiter {
    pub fn new(wait: Duration) -> Waiter {
        super::claims::register_callbacks(); // also stops the wait at transaction end
        let slot = shmem::my_consumer_slot();
        if let Some(slot) = slot.filter(|_| !wait.is_zero()) {
            // SAFETY: MyDatabaseId is set once the backend connected; a plain read.
            slot.wait_in(unsafe { pg_sys::MyDatabaseId }.to_u32());
        }
        Waiter { slot, deadline: Instant::now() + wait }
    }

    /// Forget earlier wake-ups: call before looking for events, so that one
    /// arriving after the look is kept for [`Waiter::sleep`].
    pub fn reset(&self) {
        // SAFETY: MyLatch is this backend's own latch, set at process start.
        unsafe { pg_sys::ResetLatch(pg_sys::MyLatch) };
    }

    /// Sleep until woken or the deadline; false when the wait is over.
    /// Raises on interrupts (cancel, timeouts, termination).
    pub fn sleep(&self) -> bool {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let timeout = left.min(MAX_SLEEP).as_millis().max(1) as std::ffi::c_long;
        // SAFETY: waits on this backend's own latch; WL_EXIT_ON_PM_DEATH ends
        // the process if the postmaster dies. Interrupt handlers set the
        // latch, and CHECK_FOR_INTERRUPTS raises through pgrx's guard.
        unsafe {
            pg_sys::WaitLatch(
                pg_sys::MyLatch,
                (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
                timeout,
                pg_sys::PG_WAIT_EXTENSION,
            );
        }
        pg_sys::check_for_interrupts!();
        true
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            slot.wait_in(0);
        }
    }
}
