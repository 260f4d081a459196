//! The webhooks' rows as the webhook worker reads and writes them: loading
//! the webhooks and the horizon, recording the outcomes of requests
//! (delivered, failed, given up), and the kept plans its statements run
//! through.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;
use pgrx::spi::{OwnedPreparedStatement, SpiClient, SpiResult};
use pgrx::PgOid;

use super::http::Outcome;
use crate::gucs;
use litebase_streams_core::filters::EventFilter;

/// A webhook as one turn of the loop sees it.
pub(super) struct Webhook {
    pub(super) id: i32,
    pub(super) name: String,
    pub(super) pattern: String,
    pub(super) owner: pg_sys::Oid,
    pub(super) url: String,
    pub(super) secret: String,
    pub(super) batch: i64,
    /// Its subscription's position: delivered through.
    pub(super) position: i64,
    /// The last position of the request in flight or failed last, written
    /// before it was sent: its retry carries the same events, so the same
    /// webhook-id, also after a crash. None before 0.3.0's schema.
    pub(super) sending_upto: Option<i64>,
    pub(super) active: bool,
    /// When its next attempt is due (zero: now).
    pub(super) due_in: Duration,
    /// Only the events of these types, whose data contains this (none
    /// before 0.3.0's schema).
    pub(super) filter: EventFilter,
}

/// What became of an attempt, to record.
#[derive(Clone)]
pub(super) struct Report {
    pub(super) webhook: i32,
    /// The position the events followed, and the last one sent.
    pub(super) after: i64,
    pub(super) last: i64,
    pub(super) status: Option<u16>,
    /// None: delivered.
    pub(super) error: Option<String>,
    /// Give up: disable the webhook.
    pub(super) disable: bool,
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

/// Record what became of the attempts: move positions over delivered
/// events, count failures, schedule retries, disable what gave up. Rows
/// another transaction holds (the owner pausing, resuming or seeking its
/// webhook) are skipped, not waited for: those reports come back, to be
/// recorded by a later turn, and no webhook waits for another's lock.
pub(super) fn record(client: &mut SpiClient<'_>, reports: Vec<Report>) -> SpiResult<Vec<Report>> {
    let mut unrecorded = Vec::new();
    for report in reports {
        let state = exec(
            client,
            "SELECT w.attempts, pg_catalog.now() - w.failing_since >= pg_catalog.make_interval(secs => $2)
             FROM streams.webhook_state w JOIN streams.subscription_state s ON s.id = w.subscription
             WHERE w.subscription = $1 FOR NO KEY UPDATE OF w, s SKIP LOCKED",
            None,
            &[report.webhook.into(), gucs::webhook_disable_after().map_or(0.0, |d| d.as_secs_f64()).into()],
        )?;
        if state.is_empty() {
            let exists = !client
                .select(
                    "SELECT FROM streams.webhook_state w WHERE w.subscription = $1",
                    None,
                    &[report.webhook.into()],
                )?
                .is_empty();
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
        let failing_too_long = gucs::webhook_disable_after().is_some() && row.get::<bool>(2)?.unwrap_or(false);
        let max_attempts = gucs::webhook_max_attempts();
        let (disable, error) = if report.disable {
            (true, format!("disabled: {error}"))
        } else if max_attempts.is_some_and(|max| attempts >= max) {
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
    let (min, max) = gucs::webhook_retry_range();
    let (min, max) = (min.as_millis() as u64, max.as_millis() as u64);
    let exponent = attempts.saturating_sub(1).clamp(0, 40) as u32;
    let full = min.saturating_mul(1u64 << exponent.min(40)).min(max);
    // SAFETY: the backend's global PRNG, used from the main thread only.
    let jitter = unsafe { pg_sys::pg_prng_uint64_range(&raw mut pg_sys::pg_global_prng_state, 0, full / 2) };
    Duration::from_millis(full - jitter)
}

/// The statement that reads the webhooks, with `$sending` as the batch in
/// flight's last position and `$filter` as its types and filter.
macro_rules! load {
    ($sending:literal, $filter:literal) => {
        concat!(
            "SELECT s.id, s.name::text, s.stream::text, s.owner::oid, s.position, w.url, w.secret, w.batch,
       NOT w.paused AND w.disabled_at IS NULL,
       GREATEST(0, pg_catalog.ceil(EXTRACT(epoch FROM w.next_attempt_at - pg_catalog.clock_timestamp()) * 1000))::bigint, ",
            $sending,
            ", ",
            $filter,
            "
FROM streams.webhook_state w JOIN streams.subscription_state s ON s.id = w.subscription
ORDER BY s.id"
        )
    };
}

const LOAD: &str = load!("w.sending_upto", "s.types, s.filter::text");

/// [`LOAD`] for a database still at 0.2.0 (no `sending_upto`: until
/// `ALTER EXTENSION litebase_streams UPDATE`, a retry after a crash may
/// carry more events under another id).
const LOAD_V0_2: &str = load!("NULL::bigint", "NULL::text[], NULL::text");

/// Writes down the batch about to be sent (see `Webhook::sending_upto`).
/// Skips a row its owner holds locked (returning nothing): that webhook
/// waits, the others go on.
pub(super) const SENDING: &str = "
UPDATE streams.webhook_state w SET sending_upto = $2
FROM (SELECT l.subscription FROM streams.webhook_state l WHERE l.subscription = $1 FOR UPDATE SKIP LOCKED) l
WHERE w.subscription = l.subscription
RETURNING 1";

/// Moves a filtered webhook from `$2` to `$3` over events its filter
/// leaves out (none to send): unless a seek moved it meanwhile, or its
/// owner holds its row (then a later turn does).
pub(super) const SKIP: &str = "
UPDATE streams.subscription_state s SET position = $3
FROM (SELECT l.id FROM streams.subscription_state l WHERE l.id = $1 AND l.position = $2 FOR NO KEY UPDATE SKIP LOCKED) l
WHERE s.id = l.id
RETURNING 1";

/// Whether the schema has `webhook_state.sending_upto` (0.3.0 on).
pub(super) fn persists_batches() -> bool {
    // SAFETY: catalog lookups with static C strings inside the caller's transaction; missing_ok.
    unsafe {
        let schema = pg_sys::get_namespace_oid(c"streams".as_ptr(), true);
        let table = pg_sys::get_relname_relid(c"webhook_state".as_ptr(), schema);
        table != pg_sys::InvalidOid && pg_sys::get_attnum(table, c"sending_upto".as_ptr()) != 0
    }
}

/// The webhooks, and the horizon.
pub(super) fn load(client: &mut SpiClient<'_>) -> SpiResult<(Vec<Webhook>, i64)> {
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
            filter: EventFilter { types: row.get::<Vec<String>>(12)?, data: row.get::<String>(13)? },
        });
    }
    Ok((webhooks, horizon))
}

thread_local! {
    /// The worker's statements, planned once and kept (the plan cache
    /// re-plans them when the tables change), by their text.
    static PLANS: RefCell<HashMap<String, Rc<OwnedPreparedStatement>>> = RefCell::new(HashMap::new());
}

/// Run `sql` through its kept plan (prepared on first use, with the types
/// of `args`).
pub(super) fn exec<'conn>(
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
