//! Waiting for the horizon: `streams.wait` and a subscription's long poll
//! sleep on their process latch until the database's worker moves the
//! horizon, a transaction that held subscription claims ends, the wait is
//! over, or an interrupt arrives (cancel, statement_timeout, terminate,
//! shutdown: each sets the latch, and `CHECK_FOR_INTERRUPTS` raises it).
//! Nothing polls a table while it sleeps.

use std::time::{Duration, Instant};

use pgrx::prelude::*;

use crate::error::SpiContext;
use crate::log::kept_plan::KeptStatements;
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
    /// Wait up to `wait` for the horizon, and for claims of `subscription`
    /// (0: none) to be returned.
    pub fn new(wait: Duration, subscription: i32) -> Waiter {
        super::claims::register_callbacks(); // also stops the wait at transaction end
        let slot = shmem::my_consumer_slot();
        if let Some(slot) = slot.filter(|_| !wait.is_zero()) {
            // SAFETY: MyDatabaseId is set once the backend connected; a plain read.
            slot.wait_in(unsafe { pg_sys::MyDatabaseId }.to_u32(), subscription);
        }
        // A wait of a year is as good as forever (and keeps the Instant in range).
        Waiter { slot, deadline: Instant::now() + wait.min(Duration::from_secs(365 * 86_400)) }
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
        self.sleep_at_most(None)
    }

    /// [`Waiter::sleep`], waking after `due_in` at the latest (a nacked
    /// event falls due).
    pub fn sleep_at_most(&self, due_in: Option<Duration>) -> bool {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let nap = due_in.map_or(recheck_after(), |due| due.min(recheck_after()));
        let timeout = i64::try_from(left.min(nap).as_millis()).unwrap_or(i64::MAX).max(1);
        // Not reset here: reset() comes before the next look for events.
        // Interrupt handlers set the latch, and CHECK_FOR_INTERRUPTS raises
        // through pgrx's guard.
        shmem::wait_on_my_latch(timeout);
        pg_sys::check_for_interrupts!();
        true
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            slot.wait_in(0, 0);
        }
    }
}

/// `streams.wait(position, timeout)`: true as soon as the event at
/// `position` is final (the caller's next statement sees it in
/// `streams.events`), false when `timeout` passes first.
#[pg_extern(sql = false)]
fn _wait(position: Option<i64>, timeout: Option<pgrx::datum::Interval>) -> bool {
    use crate::error::{OrRaise, StreamsError};
    // The readers' lock order first: an upgrade step takes it too.
    crate::log::catalog::lock_for_reading();
    let position = position.ok_or(StreamsError::NullArgument("position")).or_raise();
    let timeout = timeout.ok_or(StreamsError::NullArgument("timeout")).or_raise();
    let timeout = wait_duration(&timeout, "timeout").or_raise();
    crate::require_preload().or_raise();
    let waiter = Waiter::new(timeout, 0);
    loop {
        waiter.reset();
        if horizon_seen_by_transaction() >= position {
            return true;
        }
        if isolation_is_snapshot() {
            // The transaction's snapshot will never show it.
            StreamsError::WaitNeedsReadCommitted.raise();
        }
        if !waiter.sleep() {
            return false;
        }
    }
}

/// How long a wait sleeps at most before it looks again. On a hot standby
/// no worker wakes it (the horizon moves by WAL replay), so it looks every
/// [`STANDBY_RECHECK`].
fn recheck_after() -> Duration {
    // SAFETY: reads shared recovery state; callable from any connected backend.
    if unsafe { pg_sys::RecoveryInProgress() } {
        STANDBY_RECHECK
    } else {
        MAX_SLEEP
    }
}

const STANDBY_RECHECK: Duration = Duration::from_millis(50);

/// The horizon as the calling transaction's next statement will see it (under
/// repeatable read, the transaction's snapshot), read as the caller. The
/// SQL entry points that call it took the readers' locks first
/// (`lock_for_reading`), so the snapshot taken here sees whatever committed
/// while they were waited for.
pub fn horizon_seen_by_transaction() -> i64 {
    // SAFETY: a plain call that returns a snapshot owned by the snapshot manager.
    let snapshot = unsafe { pg_sys::GetTransactionSnapshot() };
    // A read-only select (Spi::get_one would assign a transaction id: an
    // error on a hot standby, and a commit record for a mere read).
    with_active_snapshot(snapshot, || {
        crate::log::kept_plan::with_pinned_search_path(|| {
            Spi::connect(|client| {
                client
                    .select_kept(
                        "SELECT coalesce((SELECT h.horizon FROM streams.horizon_state h ORDER BY h.horizon DESC LIMIT 1), 0)",
                        Some(1),
                        &[],
                    )?
                    .first()
                    .get_one::<i64>()
            })
        })
    })
    .context("reading the horizon")
    .unwrap_or(0)
}

/// Run `body` with `snapshot` as the active snapshot: the one read-only SPI
/// statements use.
pub fn with_active_snapshot<R>(snapshot: pg_sys::Snapshot, body: impl FnOnce() -> R) -> R {
    // SAFETY: pushes a snapshot and pops it below; an ERROR in between
    // unwinds the snapshot stack with the (sub)transaction.
    unsafe { pg_sys::PushActiveSnapshot(snapshot) };
    let result = body();
    // SAFETY: pops the snapshot pushed above.
    unsafe { pg_sys::PopActiveSnapshot() };
    result
}

/// Whether the transaction reads with one snapshot (repeatable read or
/// serializable): it never sees a later commit.
pub fn isolation_is_snapshot() -> bool {
    // SAFETY: a backend-global set when the transaction starts; only read here.
    unsafe { pg_sys::XactIsoLevel >= pg_sys::XACT_REPEATABLE_READ as i32 }
}

/// An interval argument as a duration (months count 30 days); 22023 when
/// negative.
pub fn wait_duration(
    wait: &pgrx::datum::Interval,
    argument: &'static str,
) -> Result<Duration, crate::error::StreamsError> {
    let days = wait.months() as i64 * 30 + wait.days() as i64;
    let micros = days.checked_mul(86_400_000_000).and_then(|d| d.checked_add(wait.micros()));
    match micros {
        Some(micros) if micros >= 0 => Ok(Duration::from_micros(micros as u64)),
        Some(_) => Err(crate::error::StreamsError::NegativeInterval { argument }),
        None => Err(crate::error::StreamsError::IntervalOutOfRange { argument }),
    }
}
