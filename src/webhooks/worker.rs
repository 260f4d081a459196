//! The webhook worker: one background worker per database with webhooks.
//!
//! # Design
//!
//! The main thread does everything that touches PostgreSQL, in short
//! transactions; requests run on threads (http.rs). Each turn of the loop:
//!
//! 1. One transaction records the outcomes that arrived (a 2xx moves the
//!    webhook's subscription position over the events it carried; a
//!    failure counts an attempt and schedules the next one) and reads the
//!    webhooks. It commits synchronously (the worker's session otherwise
//!    commits asynchronously): once the position moved, a crash does not
//!    repeat those events.
//! 2. For each active webhook with no request in flight whose next attempt
//!    is due, a read-only transaction reads its next events (final ones,
//!    after its position, at most `batch` and about [`MAX_BODY_BYTES`]),
//!    and a thread sends them. A failed read fails that webhook's attempt
//!    only.
//! 3. The worker sleeps on its latch until a request finishes (its thread
//!    signals the process), the horizon moves (the database's worker wakes
//!    it like a long poll), a webhook changes (the changing transaction
//!    wakes it at commit), or the earliest retry is due.
//!
//! A webhook has at most one request in flight, so its events arrive in
//! position order. A retry resends the same events (up to the last
//! position of the failed request, remembered while the worker runs).
//!
//! The worker is started by the database's worker: when a transaction that
//! created or resumed a webhook commits (it asks through shared memory; a
//! user's backend never starts workers, so no transaction can fill the
//! worker slots), at its own start, and every few seconds while active
//! webhooks have none (after a server restart, or when no slot was free).
//! It exits when no active webhook is left, when the extension is dropped
//! and before DROP DATABASE.
//!
//! Bounds: at most `webhook_max_concurrency` requests in flight (threads),
//! bodies of about [`MAX_BODY_BYTES`] (one larger event goes alone, and
//! larger bodies share [`MAX_LARGE_BYTES_IN_FLIGHT`]), and each turn
//! serves the due webhooks in rotating order and builds at most
//! [`MAX_BYTES_BUILT_PER_TURN`], so no owner's webhooks keep others waiting
//! for long. Outcomes are recorded with `SKIP LOCKED`: a webhook whose rows
//! its owner holds locked waits, the others go on.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use pgrx::bgworkers::*;
use pgrx::prelude::*;

use super::http::Sender;
use super::requests::{next_request, Next, MAX_BODY_BYTES, MAX_LARGE_BYTES_IN_FLIGHT};
use super::state::{load, record, Report, Webhook};
use crate::delivery::runtime::{attempt, extension_installed, in_transaction, pin_session_settings, Failure};
use crate::error::SpiContext;
use crate::gucs;
use crate::shmem::{self, DbEntry};
use litebase_streams_core::backoff::backoff;
use litebase_streams_core::hosts::Allowed;

const LIBRARY: &str = "litebase_streams";
const WORKER_TYPE: &str = "litebase_streams webhooks";

/// The most body bytes one turn builds before it records what finished and
/// goes on (so that webhooks of large events delay the others by little).
const MAX_BYTES_BUILT_PER_TURN: usize = 16 << 20;

/// How soon outcomes whose rows another transaction locked are tried again.
const LOCKED_RETRY: Duration = Duration::from_millis(100);

/// Start the webhook worker of database `db`. False when no background
/// worker slot is free.
fn launch(db: pg_sys::Oid) -> bool {
    BackgroundWorkerBuilder::new(&format!("litebase_streams webhooks for database {}", db.to_u32()))
        .set_type(WORKER_TYPE)
        .set_library(LIBRARY)
        .set_function("litebase_streams_webhook_worker_main")
        .enable_spi_access()
        .set_restart_time(Some(Duration::from_secs(1)))
        .set_argument(Some(pg_sys::Datum::from(db.to_u32())))
        .load_dynamic()
        .is_ok()
}

/// Whether a webhook worker serves database `db`.
fn running(db: pg_sys::Oid) -> bool {
    shmem::find_db(db).is_some_and(|entry| entry.webhook_pid.load(Ordering::Acquire) != 0)
}

/// From the database's worker, in a transaction: start the webhook worker
/// if active webhooks wait for one.
pub fn ensure_worker(db: pg_sys::Oid) {
    if running(db) || !webhooks_installed() {
        return;
    }
    let wanted = Spi::connect(|client| {
        client
            .select(
                "SELECT EXISTS (SELECT FROM streams.webhook_state w WHERE NOT w.paused AND w.disabled_at IS NULL)",
                Some(1),
                &[],
            )?
            .first()
            .get_one::<bool>()
    });
    if matches!(wanted, Ok(Some(true))) && !launch(db) {
        warning!("litebase_streams: no background worker slot for the webhook worker; retrying");
    }
}

/// Whether this database's extension has webhooks (0.1.0, before its
/// upgrade, has not).
fn webhooks_installed() -> bool {
    // SAFETY: catalog lookups with static C strings inside the caller's transaction.
    unsafe {
        let schema = pg_sys::get_namespace_oid(c"streams".as_ptr(), true);
        schema != pg_sys::InvalidOid
            && pg_sys::get_relname_relid(c"webhook_state".as_ptr(), schema) != pg_sys::InvalidOid
    }
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn litebase_streams_webhook_worker_main(arg: pg_sys::Datum) {
    let db = pg_sys::Oid::from(arg.value() as u32);
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    if crate::delivery::runtime::left_for_a_dropped_database(db, "webhook worker") {
        return;
    }
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(db), None);
    // A reload signalled between the fork and the handler above was ignored:
    // read the configuration once now (a narrowed webhook_allowed_hosts must
    // not be missed).
    // SAFETY: outside any transaction, as every backend reloads on SIGHUP.
    unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
    if !in_transaction(extension_installed) || in_transaction(crate::log::catalog::database_is_template) {
        return;
    }
    // SAFETY: MyProcPid is set at process start, MyProc once connected; only read.
    let (pid, procno) = unsafe { (pg_sys::MyProcPid, (*pg_sys::MyProc).pgprocno) };
    let shmem::Attach::Attached(entry) = shmem::attach(db, shmem::Server::WebhookWorker, pid, procno) else {
        return; // another one serves this database, or it is being dropped
    };
    // SAFETY: `entry` lives in shared memory for the server's life, so detach may use it at exit.
    unsafe { pg_sys::before_shmem_exit(Some(detach), pg_sys::Datum::from(entry as *const DbEntry)) };
    in_transaction(|| {
        pin_session_settings();
        // Progress must be durable before the next request goes out.
        Spi::run("SET synchronous_commit = on").context("pinning the webhook worker's settings");
    });
    // Woken like a long poll whenever the horizon moves.
    if let Some(slot) = shmem::my_consumer_slot() {
        slot.wait_in(db.to_u32(), 0);
    }
    log!("litebase_streams webhook worker started for database {}", db.to_u32());
    serve(entry);
}

/// # Safety
/// SAFETY: registered through before_shmem_exit with `arg` a `&'static DbEntry` in shared memory.
#[pg_guard]
unsafe extern "C-unwind" fn detach(_code: i32, arg: pg_sys::Datum) {
    let entry = &*(arg.cast_mut_ptr::<DbEntry>() as *const DbEntry);
    shmem::detach(entry, shmem::Server::WebhookWorker, pg_sys::MyProcPid, false);
    if let Some(slot) = shmem::my_consumer_slot() {
        slot.wait_in(0, 0);
    }
}

fn serve(entry: &'static DbEntry) {
    let mut sender = Sender::new(gucs::webhook_timeout(), allowed_hosts());
    // Webhooks with a request in flight, and the bytes of its body.
    let mut in_flight: HashMap<i32, usize> = HashMap::new();
    // The last position of a webhook's failed request: its retry resends the same events.
    let mut retry_upto: HashMap<i32, i64> = HashMap::new();
    // (position, horizon) a webhook was found to have nothing in: not read again until one moves.
    let mut nothing_in: HashMap<i32, (i64, i64)> = HashMap::new();
    // Outcomes not recorded yet (a turn failed, or the webhook's rows were
    // locked by its owner): their webhooks send nothing until they are.
    let mut reports: Vec<Report> = Vec::new();
    let mut failures = 0u32;
    let mut log_id = String::new();
    let mut rotation = 0usize;
    loop {
        if entry.stop.load(Ordering::Acquire) {
            return; // DROP DATABASE waits for us; exit 0
        }
        if crate::delivery::runtime::shutdown_requested() {
            // SAFETY: outside any transaction; proc_exit runs detach and never returns.
            unsafe { pg_sys::proc_exit(1) };
        }
        if BackgroundWorker::sighup_received() {
            // SAFETY: outside any transaction, as every backend reloads on SIGHUP.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
            sender.reconfigure(gucs::webhook_timeout(), allowed_hosts());
        }
        for refused in sender.refused() {
            log!("litebase_streams webhook worker: address policy refused a request: {refused}");
        }
        for outcome in sender.finished() {
            in_flight.remove(&outcome.webhook);
            if outcome.delivered() {
                retry_upto.remove(&outcome.webhook);
            } else {
                retry_upto.insert(outcome.webhook, outcome.last);
            }
            reports.push(outcome.into());
        }
        let turn = attempt(|| {
            // A template database keeps no worker connected (see catalog::database_is_template).
            if !extension_installed() || crate::log::catalog::database_is_template() {
                return None;
            }
            // The turn writes the webhooks' rows, then reads the horizon:
            // the readers' lock order first, as an upgrade step takes it.
            crate::log::catalog::lock_for_reading();
            Some(Spi::connect_mut(|client| {
                // A copy: if the turn fails, its transaction rolls back and the reports stay to record.
                let unrecorded = record(client, reports.clone())?;
                if log_id.is_empty() {
                    log_id = client
                        .select("SELECT streams.log_id()::text", None, &[])?
                        .first()
                        .get::<String>(1)?
                        .unwrap_or_default();
                }
                Ok::<_, pgrx::spi::Error>((unrecorded, load(client)?))
            }))
        });
        let (webhooks, horizon) = match turn {
            Ok(None) => {
                log!("litebase_streams webhook worker: extension dropped or database became a template, exiting");
                return;
            }
            Ok(Some(Ok((unrecorded, loaded)))) => {
                failures = 0;
                reports = unrecorded;
                loaded
            }
            Ok(Some(Err(error))) => {
                failures += 1;
                warn_failed(&Failure { message: error.to_string(), sqlstate: "XX000".into() }, backoff(failures));
                pause(entry, backoff(failures));
                continue;
            }
            Err(failure) => {
                failures += 1;
                let backoff = litebase_streams_core::backoff::backoff_after(&failure.sqlstate, failures);
                warn_failed(&failure, backoff);
                pause(entry, backoff);
                continue;
            }
        };
        if in_flight.is_empty() && reports.is_empty() && !webhooks.iter().any(|w| w.active) {
            log!("litebase_streams webhook worker: no active webhook left, exiting");
            return;
        }
        // Forget what dropped webhooks left behind.
        let known: HashSet<i32> = webhooks.iter().map(|w| w.id).collect();
        retry_upto.retain(|id, _| known.contains(id));
        nothing_in.retain(|id, _| known.contains(id));
        let held: HashSet<i32> = in_flight.keys().chain(reports.iter().map(|r| &r.webhook)).copied().collect();
        let idle: Vec<&Webhook> = webhooks.iter().filter(|w| w.active && !held.contains(&w.id)).collect();
        // Round robin: each turn starts one webhook further, so no webhook
        // (nor its owner's many) is always served first.
        rotation = rotation.wrapping_add(1);
        let start = if idle.is_empty() { 0 } else { rotation % idle.len() };
        let mut next_due = gucs::idle_poll();
        let mut built = 0usize;
        let mut again = false;
        let recorded_before = reports.len();
        for webhook in idle[start..].iter().chain(&idle[..start]) {
            if !webhook.due_in.is_zero() {
                next_due = next_due.min(webhook.due_in);
                continue;
            }
            if in_flight.len() >= gucs::webhook_max_concurrency() || built >= MAX_BYTES_BUILT_PER_TURN {
                again = true; // the rest next turn, after recording what finished
                break;
            }
            // A retry resends what failed (unless a seek moved the webhook past it).
            let upto = webhook
                .sending_upto
                .or_else(|| retry_upto.get(&webhook.id).copied())
                .filter(|&last| last > webhook.position)
                .map_or(horizon, |last| last.min(horizon));
            if nothing_in.get(&webhook.id) == Some(&(webhook.position, upto)) {
                continue;
            }
            let large_budget =
                MAX_LARGE_BYTES_IN_FLIGHT - in_flight.values().filter(|&&b| b > MAX_BODY_BYTES).sum::<usize>() as i64;
            match attempt(|| next_request(webhook, upto, &log_id, large_budget)) {
                Ok(Ok(Next::Nothing)) => {
                    nothing_in.insert(webhook.id, (webhook.position, upto));
                }
                Ok(Ok(Next::Deferred)) => {}
                Ok(Ok(Next::Locked)) => next_due = next_due.min(LOCKED_RETRY),
                Ok(Ok(Next::Moved)) => again = true,
                Ok(Ok(Next::Ready(request))) => {
                    let (after, last, bytes) = (request.after, request.last, request.body.len());
                    built += bytes;
                    match sender.send(request) {
                        Ok(()) => {
                            in_flight.insert(webhook.id, bytes);
                        }
                        Err(error) => reports.push(failed(webhook, after, last, error, false)),
                    }
                }
                Ok(Err((error, disable))) => {
                    reports.push(failed(webhook, webhook.position, webhook.position + 1, error, disable))
                }
                // 42501: the privilege check itself was denied (the owner
                // lost even the schema): the owner may not read.
                Err(failure) => reports.push(failed(
                    webhook,
                    webhook.position,
                    webhook.position + 1,
                    format!("reading its events failed: {} (SQLSTATE {})", failure.message, failure.sqlstate),
                    failure.sqlstate == "42501",
                )),
            }
        }
        if again || reports.len() > recorded_before {
            continue; // record the new failures, or serve the rest, at once
        }
        if !reports.is_empty() {
            // Outcomes whose rows are locked: try again soon (not at once).
            next_due = next_due.min(LOCKED_RETRY);
        }
        if !BackgroundWorker::wait_latch(Some(next_due)) {
            // SAFETY: outside any transaction; proc_exit runs detach and never returns.
            unsafe { pg_sys::proc_exit(1) };
        }
    }
}

fn failed(webhook: &Webhook, after: i64, last: i64, error: String, disable: bool) -> Report {
    Report { webhook: webhook.id, after, last, status: None, error: Some(error), disable }
}

/// Sleep for all of `wait` (a backoff), whatever wakes the latch meanwhile;
/// SIGTERM or postmaster death end the process, DROP DATABASE the wait.
fn pause(entry: &DbEntry, wait: Duration) {
    let until = std::time::Instant::now() + wait;
    while let Some(left) = until.checked_duration_since(std::time::Instant::now()).filter(|d| !d.is_zero()) {
        if entry.stop.load(Ordering::Acquire) {
            return;
        }
        if !BackgroundWorker::wait_latch(Some(left)) {
            // SAFETY: outside any transaction; proc_exit runs detach and never returns.
            unsafe { pg_sys::proc_exit(1) };
        }
    }
}

fn allowed_hosts() -> Allowed {
    Allowed::parse(&gucs::webhook_allowed_hosts()).unwrap_or_else(|e| {
        warning!(
            "litebase_streams: litebase_streams.webhook_allowed_hosts is invalid ({e}); only public addresses are allowed"
        );
        Allowed::default()
    })
}

fn warn_failed(failure: &Failure, backoff: Duration) {
    ereport!(
        PgLogLevel::WARNING,
        PgSqlErrorCode::ERRCODE_WARNING,
        format!(
            "litebase_streams: webhook worker turn failed, retrying in {} ms: {} (SQLSTATE {})",
            backoff.as_millis(),
            failure.message,
            failure.sqlstate
        ),
        "Requests in flight are recorded once a turn succeeds; nothing is lost."
    );
}
