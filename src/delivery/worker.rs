//! The background workers.
//!
//! # Design
//!
//! Each database that has the extension gets one worker, which runs delivery
//! rounds (delivery.rs): whenever a publishing transaction commits or aborts it
//! flips the database's `wake` flag and sets the worker's latch; the worker
//! then computes the new horizon and delivers what became final. An idle poll
//! (`litebase_streams.idle_poll`) is only a safety net.
//!
//! Workers are started by the launcher (launcher.rs) and by `CREATE
//! EXTENSION`, and by the postmaster one second after a worker died with exit
//! code 1.
//!
//! Only one worker serves a database: it claims the database's shared entry,
//! and a second worker that finds the entry taken waits briefly (a worker of a
//! dropped extension may be leaving) and then exits.
//!
//! Exit codes follow the postmaster's rules: 0 means "done, do not restart"
//! (extension gone, database being dropped), 1 means "restart me" (SIGTERM from
//! `pg_terminate_backend`; at shutdown the postmaster restarts nothing). A
//! worker restarted after its database was dropped leaves with 0 before
//! connecting (see `shmem::remember_dropped`). A
//! failing round is logged, its transaction aborted, and retried with backoff:
//! a bad batch never kills the worker. All state is re-read from the database
//! each round, so a restart loses nothing.

use std::sync::atomic::Ordering;
use std::time::Duration;

use pgrx::bgworkers::*;
use pgrx::prelude::*;

use super::maintenance::{compact_commit_times, forget_idempotency_keys, summarize_new_ranges, SUMMARY_INTERVAL};
use super::round::{Phase, Round};
use super::runtime::{
    attempt, extension_installed, in_transaction, left_for_a_dropped_database, pin_session_settings,
    shutdown_requested, warn_failed, Failure,
};
use super::storage;
use super::stream_stats::{count_new_events, Counted, CATCH_UP_PAUSE, STATS_INTERVAL};
use crate::gucs;
use crate::shmem::{self, Attach, DbEntry, DeliveryAnswer, NotifyState, Server, WorkerState};
use litebase_streams_core::backoff::backoff_after;

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn litebase_streams_worker_main(arg: pg_sys::Datum) {
    let db = pg_sys::Oid::from(arg.value() as u32);
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    if left_for_a_dropped_database(db, "worker") {
        return;
    }
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(db), None);
    wait_for_creator();
    if !in_transaction(extension_installed) {
        // Most databases, at server start; or a CREATE EXTENSION that
        // claimed an entry rolled back.
        shmem::release_if_unused(db);
        return;
    }
    if in_transaction(crate::log::catalog::database_is_template) {
        log!("litebase_streams worker for database {}: a template database gets no worker", db.to_u32());
        shmem::release_if_unused(db);
        return;
    }
    let Some(entry) = attach(db) else { return };
    in_transaction(pin_session_settings);
    log!("litebase_streams worker started for database {}", db.to_u32());
    start_webhook_worker(db);
    serve(db, entry);
}

/// A worker started by a transaction (CREATE EXTENSION, create_webhook)
/// waits for it to end before looking at what it created.
pub(crate) fn wait_for_creator() {
    if let Ok(xid) = BackgroundWorker::get_extra().parse::<u32>() {
        // SAFETY: runs inside in_transaction's transaction, as XactLockTableWait requires; a null
        // relation and ctid are allowed with XLTW_None.
        in_transaction(|| unsafe {
            pg_sys::XactLockTableWait(
                pg_sys::TransactionId::from(xid),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                pg_sys::XLTW_Oper::XLTW_None,
            )
        });
    }
}

/// Claim `entry` as its worker, waiting up to a few seconds for a previous
/// worker (say, of a just-dropped extension) to leave.
fn attach(db: pg_sys::Oid) -> Option<&'static DbEntry> {
    // SAFETY: MyProcPid is set at process start, MyProc once the backend is connected; only read.
    let (pid, procno) = unsafe { (pg_sys::MyProcPid, (*pg_sys::MyProc).pgprocno) };
    for _ in 0..50 {
        match shmem::attach(db, Server::Worker, pid, procno) {
            Attach::Attached(entry) => {
                entry.set_state(WorkerState::Starting);
                // SAFETY: `entry` is a &'static DbEntry in shared memory that lives as long as the
                // server, so detach may dereference it at exit.
                unsafe { pg_sys::before_shmem_exit(Some(detach), pg_sys::Datum::from(entry as *const DbEntry)) };
                return Some(entry);
            }
            Attach::Full => {
                warning!(
                    "litebase_streams: more databases with the extension than max_worker_processes; no worker here"
                );
                return None;
            }
            Attach::Stopping => return None,
            // The worker before this one is still leaving.
            Attach::Taken => {
                if !BackgroundWorker::wait_latch(Some(Duration::from_millis(100))) {
                    return None;
                }
            }
        }
    }
    None
}

/// Set before the worker returns because the extension was dropped or the
/// database became a template: it is not restarted, and its entry may go.
static LEAVING_FOR_GOOD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// # Safety
/// SAFETY: registered only by [`attach`], through before_shmem_exit, with `arg` a
/// `&'static DbEntry` in shared memory; runs once, at process exit.
#[pg_guard]
unsafe extern "C-unwind" fn detach(_code: i32, arg: pg_sys::Datum) {
    let entry = &*(arg.cast_mut_ptr::<DbEntry>() as *const DbEntry);
    shmem::detach(entry, Server::Worker, pg_sys::MyProcPid, LEAVING_FOR_GOOD.load(Ordering::Acquire));
}

/// The main loop: a round whenever woken, backoff after failures.
///
/// While an open publishing transaction holds the horizon right above where
/// it stands, and everything visible was notified, a round cannot do
/// anything: the worker then waits (looking at the slots in shared memory
/// again every few milliseconds and whenever a commit wakes it, without a
/// transaction) until the holder leaves, running a round at least every
/// `idle_poll`, so that `hold_timeout` is still enforced.
///
/// After a failed round the worker splits visibility from notification (see
/// delivery.rs): a visibility round on every wake, and a notification round
/// when its own backoff allows, until notifications have caught up.
///
/// Under load a round starts at most every [`BUSY_ROUND_INTERVAL`]: after a
/// round that made [`BUSY_ROUND_EVENTS`] or more positions final, the next
/// one waits for the rest of the interval. A round costs the same whether it
/// finds one event or a hundred, so at high rates this is what keeps the
/// worker's CPU per event low, at the cost of at most that interval of
/// latency; at low rates rounds find an event or two and start at once.
///
/// Between rounds it also does the housekeeping of maintenance.rs (every
/// few seconds) and counts the new final events per stream
/// (stream_stats.rs, about every second).
fn serve(db: pg_sys::Oid, entry: &'static DbEntry) {
    let mut failures = 0u32;
    let mut split = false;
    let mut notify_failures = 0u32;
    let mut next_notify = std::time::Instant::now();
    let mut next_summary = std::time::Instant::now() + SUMMARY_INTERVAL;
    // The newest position at which the next partition is due (storage.rs).
    let mut partitions_ahead_from = 0i64;
    let mut compacted = crate::log::commit_times::Compacted::default();
    let mut next_stats = std::time::Instant::now();
    // Where the per-stream counts stand, and whether a pass ran out of time.
    let mut stats = Counted::Nothing;
    let mut last_round = std::time::Instant::now();
    let mut busy = false;
    loop {
        if entry.stop.load(Ordering::Acquire) {
            return; // exit 0: DROP DATABASE is waiting for us
        }
        if shutdown_requested() {
            // SAFETY: between rounds, outside any transaction; proc_exit never returns (exit, no
            // unwinding) and runs detach through before_shmem_exit.
            unsafe { pg_sys::proc_exit(1) }; // restarted unless the server is stopping
        }
        if BackgroundWorker::sighup_received() {
            // SAFETY: between rounds, outside any transaction, as every postmaster child reloads on
            // SIGHUP; pgrx's FFI guard turns an ERROR into a Rust panic.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        serve_deliveries(db, entry);
        entry.wake.store(false, Ordering::SeqCst);
        if entry.webhooks_wanted.swap(false, Ordering::AcqRel) {
            start_webhook_worker(db);
        }
        if entry.partitions_wanted.swap(false, Ordering::AcqRel) {
            // A publisher waits for a partition (log/partitions.rs): the first
            // one of a new log, or one this worker did not make ahead.
            partitions_ahead_from = storage::make_partitions_ahead(true).unwrap_or(i64::MAX);
        }
        let since_last = last_round.elapsed();
        if busy && since_last < BUSY_ROUND_INTERVAL {
            // Not on the latch: every commit sets it.
            pause(BUSY_ROUND_INTERVAL - since_last);
            continue;
        }
        busy = false;
        if !split && failures == 0 && since_last < gucs::idle_poll() && blocked_by_holder(db, entry) {
            // (No round ran since the flag was cleared, so no wait inside
            // one can have used up a publisher's SetLatch.)
            // Short waits: looking at the slots costs next to nothing, and a
            // wake-up that raced with this check costs at most one step.
            if !BackgroundWorker::wait_latch(Some(HOLDER_RECHECK.min(gucs::idle_poll() - since_last))) {
                // SAFETY: as below: between rounds, outside any transaction.
                unsafe { pg_sys::proc_exit(1) };
            }
            continue;
        }
        last_round = std::time::Instant::now();
        let phase = if split { Phase::Visibility } else { Phase::Combined };
        let mut visible_now = false;
        let mut wait = match round(db, entry, phase) {
            Ok(Round::ExtensionGone) => {
                log!("litebase_streams worker for database {}: extension dropped, exiting", db.to_u32());
                LEAVING_FOR_GOOD.store(true, Ordering::Release);
                return;
            }
            Ok(Round::Template) => {
                LEAVING_FOR_GOOD.store(true, Ordering::Release);
                log!("litebase_streams worker for database {}: the database became a template, exiting", db.to_u32());
                return;
            }
            Ok(Round::Done { horizon, delivered, newest, more, sequence }) => {
                failures = 0;
                visible_now = !more;
                let before = entry.horizon.swap(horizon as u64, Ordering::Relaxed);
                // After the horizon: a publisher that finds its log's sequence
                // here reads this log's horizon (announce.rs, above_horizon).
                entry.log_sequence.store(sequence.to_u32(), Ordering::Release);
                busy = horizon as u64 >= before + BUSY_ROUND_EVENTS;
                if before != horizon as u64 {
                    // Committed: long polls of subscriptions see the new horizon.
                    shmem::wake_pollers(db, None);
                }
                // The publishers' running maximum (max_backlog), reset to this
                // log's (a re-created log starts again at 1).
                entry.newest.store(newest as u64, Ordering::Relaxed);
                if !split {
                    entry.delivered.store(delivered as u64, Ordering::Relaxed);
                }
                // Partitions ahead of the publishers: as soon as the newest
                // position passes the mark, not only at the interval.
                if newest >= partitions_ahead_from {
                    partitions_ahead_from = storage::make_partitions_ahead(false).unwrap_or(i64::MAX);
                }
                // Also between the rounds of a long backlog, not only when idle.
                if std::time::Instant::now() >= next_summary {
                    next_summary = std::time::Instant::now() + SUMMARY_INTERVAL;
                    summarize_new_ranges();
                    compact_commit_times(&mut compacted);
                    forget_idempotency_keys();
                    partitions_ahead_from = storage::make_partitions_ahead(false).unwrap_or(i64::MAX);
                    storage::apply_retention();
                    start_webhook_worker(db);
                }
                if std::time::Instant::now() >= next_stats {
                    stats = count_new_events();
                    let behind = matches!(stats, Counted::Through { behind: true, .. });
                    next_stats = std::time::Instant::now() + if behind { CATCH_UP_PAUSE } else { STATS_INTERVAL };
                }
                if more {
                    continue; // the batch limit cut the round short
                }
                entry.set_state(WorkerState::Idle);
                // Events became final since the last count: count them by the
                // interval, even when idle_poll is longer.
                match stats {
                    Counted::Through { position, .. } if position < horizon => {
                        gucs::idle_poll().min(next_stats.saturating_duration_since(std::time::Instant::now()))
                    }
                    _ => gucs::idle_poll(),
                }
            }
            Err(failure) => {
                failures += 1;
                if phase == Phase::Combined {
                    // Perhaps NOTIFY failed: from now on visibility goes first.
                    split = true;
                    entry.notify_state.store(failure.notify_state() as u32, Ordering::Relaxed);
                    if failure.notify_state() == NotifyState::QueueFull {
                        entry.notification_failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
                entry.set_state(WorkerState::Retrying);
                let backoff = backoff_after(&failure.sqlstate, failures);
                warn_failed("delivery round", &failure, backoff);
                backoff
            }
        };
        if split && std::time::Instant::now() >= next_notify {
            match round(db, entry, Phase::Notify) {
                Ok(Round::Done { horizon, delivered, more, .. }) => {
                    notify_failures = 0;
                    entry.delivered.store(delivered as u64, Ordering::Relaxed);
                    entry.notify_state.store(NotifyState::Ok as u32, Ordering::Relaxed);
                    if more {
                        wait = std::time::Duration::ZERO;
                    } else if visible_now && delivered >= horizon {
                        // Everything visible is notified: one transaction per round again.
                        split = false;
                    }
                }
                Ok(Round::ExtensionGone | Round::Template) => {
                    LEAVING_FOR_GOOD.store(true, Ordering::Release);
                    return;
                }
                Err(failure) => {
                    notify_failures += 1;
                    entry.notification_failures.fetch_add(1, Ordering::Relaxed);
                    entry.notify_state.store(failure.notify_state() as u32, Ordering::Relaxed);
                    let backoff = backoff_after(&failure.sqlstate, notify_failures);
                    warn_failed("notification round", &failure, backoff);
                    next_notify = std::time::Instant::now() + backoff;
                    wait = wait.min(backoff);
                }
            }
        }
        // A commit during the round raised the flag, and its SetLatch may have
        // been used up inside the round: PostgreSQL's own waits (a buffer
        // I/O, a lock) reset the same latch. Publishers set the latch only
        // when they raise the flag, so sleeping on the latch alone would miss
        // every commit until idle_poll.
        if failures == 0 && entry.wake.load(Ordering::SeqCst) {
            wait = Duration::ZERO;
        }
        if !wait.is_zero() && !wait_serving_deliveries(entry, db, wait) {
            // SAFETY: SIGTERM or postmaster death (wait_latch false), between rounds and outside
            // any transaction; proc_exit never returns and runs detach through before_shmem_exit.
            unsafe { pg_sys::proc_exit(1) };
        }
    }
}

/// Wait up to `wait` for a reason to run a round, writing down the
/// deliveries pollers ask for meanwhile: a poll wakes the worker for its
/// delivery alone, and a round after each would make the next poll wait
/// for it. False on SIGTERM or the postmaster's death.
fn wait_serving_deliveries(entry: &DbEntry, db: pg_sys::Oid, wait: Duration) -> bool {
    let deadline = std::time::Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return true;
        }
        if !BackgroundWorker::wait_latch(Some(left)) {
            return false;
        }
        if !entry.deliveries_wanted.load(Ordering::Acquire) {
            return true; // a commit, a signal, a webhook: what the loop looks at
        }
        serve_deliveries(db, entry);
        if BackgroundWorker::sighup_received() {
            // SAFETY: as in serve: outside any transaction.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        if entry.wake.load(Ordering::SeqCst)
            || entry.stop.load(Ordering::Acquire)
            || entry.webhooks_wanted.load(Ordering::Acquire)
            || entry.partitions_wanted.load(Ordering::Acquire)
            || shutdown_requested()
        {
            return true;
        }
    }
}

/// Write down the deliveries that pollers wait for (subscriptions/attempts.rs),
/// all in one transaction, before anything else: a poller cannot return its
/// events until then. A failure is logged and answered: the pollers raise.
/// A request whose attempt records another transaction holds is answered
/// Blocked without waiting for that transaction.
fn serve_deliveries(db: pg_sys::Oid, entry: &DbEntry) {
    if !entry.deliveries_wanted.swap(false, Ordering::AcqRel) {
        return;
    }
    let requests = shmem::delivery_requests(db);
    if requests.is_empty() {
        return;
    }
    if let Some(written) = write_deliveries(&requests) {
        answer(&requests, &written);
    } else if requests.len() > 1 {
        // One request's failure must not fail every poller waiting with it:
        // each alone.
        for request in &requests {
            let one = std::slice::from_ref(request);
            match write_deliveries(one) {
                Some(written) => answer(one, &written),
                None => shmem::answer_deliveries(one, DeliveryAnswer::Failed),
            }
        }
    } else {
        shmem::answer_deliveries(&requests, DeliveryAnswer::Failed);
    }
}

/// Tell each poller whether its request was written (`written[i]`) or
/// left unwritten, blocked.
fn answer(requests: &[shmem::DeliveryRequest], written: &[bool]) {
    for (request, &written) in requests.iter().zip(written) {
        let outcome = if written { DeliveryAnswer::Done } else { DeliveryAnswer::Blocked };
        shmem::answer_deliveries(std::slice::from_ref(request), outcome);
    }
}

/// Write `requests` down in one transaction: for each, whether it was
/// written (false: blocked), or None when the transaction failed (logged).
fn write_deliveries(requests: &[shmem::DeliveryRequest]) -> Option<Vec<bool>> {
    let written = attempt(|| match crate::subscriptions::attempts::write_requests(requests) {
        Ok(written) => written,
        // Raised, so that the transaction rolls back whatever it wrote.
        Err(error) => {
            crate::error::StreamsError::Spi { doing: "writing down deliveries", error: error.to_string() }.raise()
        }
    });
    match written {
        Ok(written) => Some(written),
        Err(failure) => {
            warn_failed("writing down deliveries", &failure, Duration::ZERO);
            None
        }
    }
}

/// Whether the next round would find nothing to do: the lowest position an
/// open publishing transaction holds is right above the horizon (so the
/// horizon cannot move until it leaves; a backend still taking its first
/// position gets one above it), and every visible event was notified. Reads
/// shared memory only.
fn blocked_by_holder(db: pg_sys::Oid, entry: &DbEntry) -> bool {
    let horizon = entry.horizon.load(Ordering::Relaxed);
    entry.delivered.load(Ordering::Relaxed) == horizon && shmem::lowest_position_held(db) == Some(horizon + 1)
}

/// See [`serve`]: a round that made this many positions final counts as busy.
const BUSY_ROUND_EVENTS: u64 = 4;

/// See [`serve`]: under load, rounds start at most this often.
const BUSY_ROUND_INTERVAL: Duration = Duration::from_millis(2);

/// Sleep for `duration` (whole milliseconds, at least one), waking for
/// nothing but the postmaster's death (which ends the process).
fn pause(duration: Duration) {
    let ms = duration.as_millis().clamp(1, i64::MAX as u128) as std::ffi::c_long;
    // SAFETY: a plain timed wait on this process's latch, between rounds and outside any
    // transaction; WL_EXIT_ON_PM_DEATH exits if the postmaster dies.
    unsafe {
        pg_sys::WaitLatch(
            pg_sys::MyLatch,
            (pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
            ms,
            pg_sys::PG_WAIT_EXTENSION,
        );
    }
}

/// How often a worker waiting behind a holder looks at the slots again.
const HOLDER_RECHECK: Duration = Duration::from_millis(5);

/// Start the database's webhook worker if active webhooks have none (after
/// a server restart, or when no slot was free when they were created). A
/// failure is logged and retried at the next interval.
fn start_webhook_worker(db: pg_sys::Oid) {
    if let Err(failure) = attempt(|| crate::webhooks::ensure_worker(db)) {
        warn_failed("starting the webhook worker", &failure, SUMMARY_INTERVAL);
    }
}

/// One delivery round in its own transaction (see [`attempt`]).
fn round(db: pg_sys::Oid, entry: &DbEntry, phase: Phase) -> Result<Round, Failure> {
    entry.set_state(WorkerState::Delivering);
    entry.rounds.fetch_add(1, Ordering::Relaxed);
    let batch_size = gucs::batch_size();
    attempt(|| super::round::run(db, batch_size, phase))
}
