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

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use pgrx::bgworkers::*;
use pgrx::datum::{DatumWithOid, TimestampWithTimeZone};
use pgrx::prelude::*;
use pgrx::spi::{OwnedPreparedStatement, SpiClient};
use pgrx::PgOid;

use super::hosts::Allowed;
use super::http::{self, Outcome, Request, Sender};
use crate::delivery::runtime::{attempt, extension_installed, in_transaction, pin_session_settings, Failure};
use crate::error::StreamsError;
use crate::shmem::{self, DbEntry};
use crate::{gucs, log::privileges, log::publish};
use litebase_streams_core::backoff::backoff;
use litebase_streams_core::names::{parse_stream_selector, StreamSelector};
use litebase_streams_core::payload::{write_full_payload, Event};

const LIBRARY: &str = "litebase_streams";
const WORKER_TYPE: &str = "litebase_streams webhooks";

/// About the most bytes one request body carries (one event always goes,
/// whatever its size).
const MAX_BODY_BYTES: usize = 1 << 20;

/// The most bytes of larger bodies (single events over [`MAX_BODY_BYTES`])
/// in flight at once; one always may go. With the concurrency limit this
/// bounds the worker's memory: about `webhook_max_concurrency` MB plus this
/// (or one event larger than it).
const MAX_LARGE_BYTES_IN_FLIGHT: i64 = 64 << 20;

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
    if crate::delivery::worker::left_for_a_dropped_database(db, "webhook worker") {
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
        Spi::run("SET synchronous_commit = on").unwrap_or_else(|e| {
            StreamsError::Spi { doing: "pinning the webhook worker's settings", error: e.to_string() }.raise()
        });
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
    shmem::detach(entry, shmem::Server::WebhookWorker, pg_sys::MyProcPid);
    if let Some(slot) = shmem::my_consumer_slot() {
        slot.wait_in(0, 0);
    }
}

/// A webhook as one turn of the loop sees it.
struct Webhook {
    id: i32,
    name: String,
    pattern: String,
    owner: pg_sys::Oid,
    url: String,
    secret: String,
    batch: i64,
    /// Its subscription's position: delivered through.
    position: i64,
    /// The last position of the request in flight or failed last, written
    /// before it was sent: its retry carries the same events, so the same
    /// webhook-id, also after a crash. None before 0.3.0's schema.
    sending_upto: Option<i64>,
    active: bool,
    /// When its next attempt is due (zero: now).
    due_in: Duration,
}

/// What became of an attempt, to record.
#[derive(Clone)]
struct Report {
    webhook: i32,
    /// The position the events followed, and the last one sent.
    after: i64,
    last: i64,
    status: Option<u16>,
    /// None: delivered.
    error: Option<String>,
    /// Give up: disable the webhook.
    disable: bool,
}

impl From<Outcome> for Report {
    fn from(outcome: Outcome) -> Report {
        let disable = outcome.gone();
        let error = if disable { Some("the endpoint answered 410 Gone".to_owned()) } else { outcome.error };
        Report {
            webhook: outcome.webhook,
            after: outcome.after,
            last: outcome.last,
            status: outcome.status,
            error,
            disable,
        }
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
        if crate::delivery::worker::shutdown_requested() {
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
            if in_flight.len() >= max_concurrency() || built >= MAX_BYTES_BUILT_PER_TURN {
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

/// `litebase_streams.webhook_max_concurrency`: requests in flight at once.
fn max_concurrency() -> usize {
    gucs::WEBHOOK_MAX_CONCURRENCY.get().max(1) as usize
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

/// Record what became of the attempts: move positions over delivered
/// events, count failures, schedule retries, disable what gave up. Rows
/// another transaction holds (the owner pausing, resuming or seeking its
/// webhook) are skipped, not waited for: those reports come back, to be
/// recorded by a later turn, and no webhook waits for another's lock.
fn record(client: &mut SpiClient<'_>, reports: Vec<Report>) -> SpiResult<Vec<Report>> {
    let mut unrecorded = Vec::new();
    for report in reports {
        let state = exec(
            client,
            "SELECT w.attempts, pg_catalog.now() - w.failing_since >= pg_catalog.make_interval(secs => $2)
             FROM streams.webhook_state w JOIN streams.subscription_state s ON s.id = w.subscription
             WHERE w.subscription = $1 FOR NO KEY UPDATE OF w, s SKIP LOCKED",
            None,
            &[report.webhook.into(), f64::from(gucs::WEBHOOK_DISABLE_AFTER_S.get()).into()],
        )?;
        if state.is_empty() {
            let exists = client
                .select(
                    "SELECT FROM streams.webhook_state w WHERE w.subscription = $1",
                    None,
                    &[report.webhook.into()],
                )?
                .len()
                > 0;
            if exists {
                unrecorded.push(report); // locked: later
            }
            continue; // or dropped meanwhile
        }
        let row = state.first();
        let Some(error) = &report.error else {
            let args: [DatumWithOid; 4] =
                [report.webhook.into(), report.after.into(), report.last.into(), report.status.map(i32::from).into()];
            // Only over the position the events followed: a seek meanwhile wins.
            exec(
                client,
                "WITH moved AS (
                     UPDATE streams.subscription_state s SET position = $3, last_ack_at = pg_catalog.now()
                     WHERE s.id = $1 AND s.position = $2 RETURNING s.id
                 )
                 UPDATE streams.webhook_state w
                 SET attempts = 0, failing_since = NULL, next_attempt_at = NULL, last_status = $4,
                     last_error = NULL, last_attempt_at = pg_catalog.now(), last_success_at = pg_catalog.now()
                 WHERE w.subscription = $1",
                None,
                &args,
            )?;
            continue;
        };
        let attempts = row.get::<i32>(1)?.unwrap_or(0).saturating_add(1);
        let failing_too_long = gucs::WEBHOOK_DISABLE_AFTER_S.get() > 0 && row.get::<bool>(2)?.unwrap_or(false);
        let max_attempts = gucs::WEBHOOK_MAX_ATTEMPTS.get();
        let (disable, error) = if report.disable {
            (true, format!("disabled: {error}"))
        } else if max_attempts > 0 && attempts >= max_attempts {
            (true, format!("disabled after {attempts} failed attempts: {error}"))
        } else if failing_too_long {
            (true, format!("disabled after failing for litebase_streams.webhook_disable_after: {error}"))
        } else {
            (false, error.clone())
        };
        let args: [DatumWithOid; 6] = [
            report.webhook.into(),
            attempts.into(),
            report.status.map(i32::from).into(),
            error.as_str().into(),
            (retry_delay(attempts).as_secs_f64()).into(),
            disable.into(),
        ];
        exec(
            client,
            "UPDATE streams.webhook_state w
             SET attempts = $2, failing_since = coalesce(w.failing_since, pg_catalog.now()), last_status = $3,
                 last_error = $4, last_attempt_at = pg_catalog.now(),
                 next_attempt_at = CASE WHEN $6 THEN NULL
                                        ELSE pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => $5) END,
                 disabled_at = CASE WHEN $6 THEN pg_catalog.now() ELSE w.disabled_at END
             WHERE w.subscription = $1",
            None,
            &args,
        )?;
    }
    Ok(unrecorded)
}

/// The backoff before attempt `attempts + 1`: `webhook_retry_min`
/// doubled per failed attempt, capped at `webhook_retry_max`, and a
/// random point between half and all of it (so that webhooks failing
/// together do not retry together).
fn retry_delay(attempts: i32) -> Duration {
    let min = gucs::WEBHOOK_RETRY_MIN_MS.get().max(1) as u64;
    let max = (gucs::WEBHOOK_RETRY_MAX_MS.get().max(1) as u64).max(min);
    let exponent = attempts.saturating_sub(1).clamp(0, 40) as u32;
    let full = min.saturating_mul(1u64 << exponent.min(40)).min(max);
    // SAFETY: the backend's global PRNG, used from the main thread only.
    let jitter = unsafe { pg_sys::pg_prng_uint64_range(&raw mut pg_sys::pg_global_prng_state, 0, full / 2) };
    Duration::from_millis(full - jitter)
}

const LOAD: &str = "
SELECT s.id, s.name::text, s.stream::text, s.owner::oid, s.position, w.url, w.secret, w.batch,
       NOT w.paused AND w.disabled_at IS NULL,
       GREATEST(0, pg_catalog.ceil(EXTRACT(epoch FROM w.next_attempt_at - pg_catalog.clock_timestamp()) * 1000))::bigint,
       w.sending_upto
FROM streams.webhook_state w JOIN streams.subscription_state s ON s.id = w.subscription
ORDER BY s.id";

/// [`LOAD`] for a database still at 0.2.0 (no `sending_upto`: until
/// `ALTER EXTENSION litebase_streams UPDATE`, a retry after a crash may
/// carry more events under another id).
const LOAD_V0_2: &str = "
SELECT s.id, s.name::text, s.stream::text, s.owner::oid, s.position, w.url, w.secret, w.batch,
       NOT w.paused AND w.disabled_at IS NULL,
       GREATEST(0, pg_catalog.ceil(EXTRACT(epoch FROM w.next_attempt_at - pg_catalog.clock_timestamp()) * 1000))::bigint,
       NULL::bigint
FROM streams.webhook_state w JOIN streams.subscription_state s ON s.id = w.subscription
ORDER BY s.id";

/// Writes down the batch about to be sent (see `Webhook::sending_upto`).
/// Skips a row its owner holds locked (returning nothing): that webhook
/// waits, the others go on.
const SENDING: &str = "
UPDATE streams.webhook_state w SET sending_upto = $2
FROM (SELECT l.subscription FROM streams.webhook_state l WHERE l.subscription = $1 FOR UPDATE SKIP LOCKED) l
WHERE w.subscription = l.subscription
RETURNING 1";

/// Whether the schema has `webhook_state.sending_upto` (0.3.0 on).
fn persists_batches() -> bool {
    // SAFETY: catalog lookups with static C strings inside the caller's transaction; missing_ok.
    unsafe {
        let schema = pg_sys::get_namespace_oid(c"streams".as_ptr(), true);
        let table = pg_sys::get_relname_relid(c"webhook_state".as_ptr(), schema);
        table != pg_sys::InvalidOid && pg_sys::get_attnum(table, c"sending_upto".as_ptr()) != 0
    }
}

/// The webhooks, and the horizon.
fn load(client: &mut SpiClient<'_>) -> SpiResult<(Vec<Webhook>, i64)> {
    let horizon = exec(client, "SELECT streams.horizon()", None, &[])?.first().get::<i64>(1)?.unwrap_or(0);
    let rows = exec(client, if persists_batches() { LOAD } else { LOAD_V0_2 }, None, &[])?;
    let mut webhooks = Vec::with_capacity(rows.len());
    for row in rows {
        webhooks.push(Webhook {
            id: row.get::<i32>(1)?.unwrap_or(0),
            name: row.get::<String>(2)?.unwrap_or_default(),
            pattern: row.get::<String>(3)?.unwrap_or_default(),
            owner: row.get::<pg_sys::Oid>(4)?.unwrap_or(pg_sys::InvalidOid),
            position: row.get::<i64>(5)?.unwrap_or(0),
            url: row.get::<String>(6)?.unwrap_or_default(),
            secret: row.get::<String>(7)?.unwrap_or_default(),
            batch: i64::from(row.get::<i32>(8)?.unwrap_or(1)),
            active: row.get::<bool>(9)?.unwrap_or(false),
            due_in: Duration::from_millis(row.get::<i64>(10)?.unwrap_or(0).max(0) as u64),
            sending_upto: row.get::<i64>(11)?,
        });
    }
    Ok((webhooks, horizon))
}

/// What to send to a webhook next.
enum Next {
    /// Nothing pending.
    Nothing,
    /// A large event waits until other large bodies are sent.
    Deferred,
    /// Its owner holds its row locked: the batch cannot be written down.
    Locked,
    Ready(Request),
}

/// The next request of `webhook`: its events after its position up to
/// `upto`. Err((why, disable)) when the webhook cannot be served (its owner
/// lost the read privilege: disable it).
fn next_request(webhook: &Webhook, upto: i64, log_id: &str, large_budget: i64) -> Result<Next, (String, bool)> {
    let Ok(selector) = parse_stream_selector(&webhook.pattern) else {
        return Err((format!("its stream pattern \"{}\" is invalid", webhook.pattern), true));
    };
    let Some(key) = http::signing_key(&webhook.secret) else {
        return Err(("its secret is not whsec_ and base64".into(), true));
    };
    let log = publish::position_sequence();
    if !privileges::as_owner(webhook.owner, || privileges::may_read_all(&webhook.pattern, log)) {
        return Err((
            format!(
                "its owner may no longer read every stream of \"{}\" (streams.grant('read', ...))",
                webhook.pattern
            ),
            true,
        ));
    }
    let read = Spi::connect_mut(|client| {
        let Some((planned_last, planned_bytes)) = plan_request(client, webhook, &selector, upto)? else {
            return Ok(Ok(Next::Nothing));
        };
        if planned_bytes > MAX_BODY_BYTES as i64
            && planned_bytes > large_budget
            && large_budget < MAX_LARGE_BYTES_IN_FLIGHT
        {
            return Ok(Ok(Next::Deferred));
        }
        let single = webhook.batch == 1;
        let mut body = Body::default();
        let (mut first, mut last) = (None, None);
        let mut events = events_between(client, &selector, webhook.position, planned_last)?;
        while let Some(row) = events.next() {
            if last.is_some() && body.0.len() >= MAX_BODY_BYTES {
                break; // the data printed larger than it is stored: the rest next time
            }
            let position = row.get::<i64>(1)?.unwrap_or(0);
            let event = Event {
                position,
                stream: row.get::<&str>(2)?.unwrap_or_default(),
                time_us: row.get::<TimestampWithTimeZone>(3)?.map_or(0, crate::delivery::round::unix_micros),
                tx: row.get::<i64>(4)?.unwrap_or(0),
                prev: row.get::<i64>(5)?.unwrap_or(0),
                data: row.get::<&str>(6)?,
                private: false,
            };
            let written = (|| {
                if !single {
                    body.write_all(if first.is_none() { b"[" } else { b"," })?;
                }
                write_full_payload(&mut body, &event)
            })();
            if let Err(error) = written {
                return Ok(Err(format!("building the request failed: {error}")));
            }
            first.get_or_insert(position);
            last = Some(position);
        }
        let (Some(first), Some(last)) = (first, last) else { return Ok(Ok(Next::Nothing)) };
        if !single && body.write_all(b"]").is_err() {
            return Ok(Err("building the request failed: out of memory".into()));
        }
        let log = log_id.replace('-', "");
        let id = if first == last {
            format!("msg_{log}_{}_{first}", webhook.id)
        } else {
            format!("msg_{log}_{}_{first}-{last}", webhook.id)
        };
        // Committed (synchronously) before the request goes out.
        if persists_batches()
            && webhook.sending_upto != Some(last)
            && exec(client, SENDING, None, &[webhook.id.into(), last.into()])?.is_empty()
        {
            return Ok(Ok(Next::Locked));
        }
        let request = Request {
            webhook: webhook.id,
            last,
            after: webhook.position,
            url: webhook.url.clone(),
            id,
            key,
            body: body.0,
        };
        Ok::<_, pgrx::spi::Error>(Ok(Next::Ready(request)))
    });
    read.unwrap_or_else(|error| {
        StreamsError::Spi { doing: "reading a webhook's events", error: error.to_string() }.raise()
    })
    .map_err(|error| (format!("webhook \"{}\": {error}", webhook.name), false))
}

/// The last position the next request carries, and the size of its data:
/// at most `batch` events after the position, up to `upto`, and no more
/// than about [`MAX_BODY_BYTES`] (at least one event). Sizes are the
/// uncompressed size of the stored jsonb, read without detoasting it.
fn plan_request(
    client: &mut SpiClient<'_>,
    webhook: &Webhook,
    selector: &StreamSelector,
    upto: i64,
) -> SpiResult<Option<(i64, i64)>> {
    let (filter, values) = selector.sql_condition("e.stream", 4);
    let sql = format!(
        "SELECT e.position, e.data FROM streams.event_log e
         WHERE e.position > $1 AND e.position <= $2 {filter} ORDER BY e.position LIMIT $3"
    );
    let mut all: Vec<DatumWithOid> = vec![webhook.position.into(), upto.into(), webhook.batch.into()];
    all.extend(values.into_iter().map(DatumWithOid::from));
    let (mut last, mut bytes) = (None, 0i64);
    let mut rows = exec(client, &sql, None, &all)?;
    while let Some(row) = rows.next() {
        let position = row.get::<i64>(1)?;
        // SAFETY: a non-null jsonb datum of the current row, valid for this SPI call; only its
        // header is read (no detoasting).
        let size =
            rows.get_datum_by_ordinal(2)?.map_or(0, |datum| unsafe { pg_sys::toast_raw_datum_size(datum) } as i64);
        if last.is_some() && bytes + size > MAX_BODY_BYTES as i64 {
            break;
        }
        bytes += size;
        last = position;
    }
    Ok(last.map(|last| (last, bytes)))
}

/// The events of the pattern in `(after, last]`, as the payload needs them.
fn events_between<'conn>(
    client: &mut SpiClient<'conn>,
    selector: &StreamSelector,
    after: i64,
    last: i64,
) -> SpiResult<pgrx::spi::SpiTupleTable<'conn>> {
    let (filter, values) = selector.sql_condition("e.stream", 3);
    let sql = format!(
        "SELECT e.position, e.stream::text, e.time, e.tx::text::bigint,
                coalesce((SELECT p.position FROM streams.event_log p
                          WHERE p.stream = e.stream AND p.position < e.position
                          ORDER BY p.position DESC LIMIT 1), 0),
                e.data::text
         FROM streams.events e
         WHERE e.position > $1 AND e.position <= $2 {filter} ORDER BY e.position"
    );
    let mut all: Vec<DatumWithOid> = vec![after.into(), last.into()];
    all.extend(values.into_iter().map(DatumWithOid::from));
    exec(client, &sql, None, &all)
}

thread_local! {
    /// The worker's statements, planned once and kept (the plan cache
    /// re-plans them when the tables change), by their text.
    static PLANS: RefCell<HashMap<String, Rc<OwnedPreparedStatement>>> = RefCell::new(HashMap::new());
}

/// Run `sql` through its kept plan (prepared on first use, with the types
/// of `args`).
fn exec<'conn>(
    client: &mut SpiClient<'conn>,
    sql: &str,
    limit: Option<std::ffi::c_long>,
    args: &[DatumWithOid<'_>],
) -> SpiResult<pgrx::spi::SpiTupleTable<'conn>> {
    let plan = match PLANS.with(|plans| plans.borrow().get(sql).cloned()) {
        Some(plan) => plan,
        None => {
            let types: Vec<PgOid> = args.iter().map(|a| PgOid::from(a.oid())).collect();
            let plan = Rc::new(client.prepare_mut(sql, &types)?.keep());
            PLANS.with(|plans| plans.borrow_mut().insert(sql.to_owned(), plan.clone()));
            plan
        }
    };
    client.update(&*plan, limit, args)
}

/// A request body that reports an allocation failure as an error instead
/// of aborting the process (which would restart the whole server).
#[derive(Default)]
struct Body(Vec<u8>);

impl Write for Body {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.try_reserve(bytes.len()).map_err(|_| std::io::Error::from(std::io::ErrorKind::OutOfMemory))?;
        self.0.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

type SpiResult<T> = Result<T, pgrx::spi::Error>;
