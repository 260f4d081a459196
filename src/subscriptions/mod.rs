//! Subscriptions: durable, named consumers of a stream pattern that resume
//! where they stopped, share work, and commit their progress in the same
//! transaction as the work it caused (sql/subscriptions.sql has the SQL
//! side and the contract).
//!
//! * `position` (in `streams.subscription_state`): every event of the
//!   subscription at or below it is processed.
//! * A poll claims the next final events that are neither processed nor
//!   claimed by another open transaction (claims.rs: locks that PostgreSQL
//!   returns when the transaction ends, however it ends). It returns ranges
//!   of positions; `streams.poll` reads their events in its next statement,
//!   whose snapshot sees them all.
//! * `ack(through)` marks what this transaction claimed up to `through` as
//!   processed, in this transaction: a rollback undoes it and returns the
//!   claims. An ordered subscription moves its position; an unordered one
//!   records, per chunk, how far the processed prefix reaches
//!   (`streams.subscription_progress`), and folds finished chunks into the
//!   position.
//!
//! Why no duplicate: a claim's lock is released after its transaction's
//! commit became visible, and a poller reads the progress (the chunk's row
//! and the position together: a fold changes both in one transaction) with a
//! snapshot taken after it got the lock, so it sees every ack of the
//! previous holder.
//!
//! The modules, from the bottom up: `reads` (fresh snapshots), `claims`
//! (the locks and what this transaction claimed), `attempts` (deliveries
//! written down by the worker, per event), `failures` (nacked and parked
//! events), `poll` (ordered and unordered polls), `keyed` (order per key),
//! `leases`, `settling` (nack and the dead-letter functions), `settings`
//! (retry settings, order per key, if_not_exists), `wait` (long
//! polls); this file has the SQL entry points that create, poll and ack.
//!
//! The functions are not SECURITY DEFINER: they check the caller (a member
//! of the subscription's owner, and its read privilege on every stream the
//! pattern selects) and then read and write the tables as the extension's
//! owner, like `publish`.

pub(crate) mod attempts;
mod claims;
mod failures;
mod keyed;
mod leases;
mod poll;
mod reads;
mod settings;
mod settling;
pub mod wait;

use std::time::Duration;

use crate::log::kept_plan::KeptStatements;
use pgrx::datum::{DatumWithOid, Interval};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

use crate::error::{OrRaise, SpiContext, StreamsError};
use crate::{log::privileges, log::publish};
use claims::Key;
use litebase_streams_core::filters::EventFilter;
use litebase_streams_core::names::{parse_stream_selector, StreamSelector};
use poll::{fold_finished_chunks, poll_ordered, poll_unordered, Polled};
use reads::with_latest_snapshot;
pub(crate) use settings::{checked_filter, store_filter};
use wait::{horizon_seen_by_transaction, isolation_is_snapshot, wait_duration};

/// The most events one poll returns.
const MAX_EVENTS_LIMIT: i32 = 10_000;

/// The most chunks one poll of an unordered subscription locks.
pub(super) const MAX_CHUNKS_PER_POLL: usize = 16;

/// A subscription as one call sees it.
pub(crate) struct Subscription {
    pub id: i32,
    pub name: String,
    pub stream: String,
    selector: StreamSelector,
    /// Only events of these types, whose data contains this (both checked
    /// at creation).
    filter: EventFilter,
    ordered: bool,
    owner: pg_sys::Oid,
    /// It belongs to a webhook: only the webhook worker consumes it.
    pub webhook: bool,
    /// Ordered per key: the key's path (`streams._event_key`'s first argument).
    key_path: Option<Vec<String>>,
    /// Per key: a dead letter does not hold its key's later events.
    skip_dead_letters: bool,
    /// Attempts before an event is parked (None: unlimited).
    max_attempts: Option<i32>,
    backoff_min_us: i64,
    backoff_max_us: i64,
    /// Retention removed events it had not processed (overrides_consumers):
    /// the first position kept then. Polls fail (LS001) until a seek.
    lost_before: Option<i64>,
}

impl Subscription {
    /// The SQL conditions on `e` (the log) selecting the subscription's
    /// events: its pattern and its filters, with the values as text
    /// parameters from `$n` on.
    pub(super) fn events_condition(&self, n: usize) -> (String, Vec<String>) {
        self.filter.events_condition(&self.selector, "e", n)
    }
}

/// Whether the database's schema counts attempts (0.3.0; a database still
/// at 0.2.0 is served as before until ALTER EXTENSION ... UPDATE).
pub(crate) fn tracks_attempts() -> bool {
    // SAFETY: catalog lookups with static C strings inside the caller's transaction; missing_ok.
    unsafe {
        let schema = pg_sys::get_namespace_oid(c"streams".as_ptr(), true);
        pg_sys::get_relname_relid(c"subscription_deliveries".as_ptr(), schema) != pg_sys::InvalidOid
    }
}

/// `streams._create_subscription(name, stream, start, ordered)`: behind
/// `streams.create_subscription`, which validates the start arguments and
/// turns them into a position.
#[pg_extern(sql = false)]
fn _create_subscription(name: Option<&str>, stream: Option<&str>, start: Option<i64>, ordered: Option<bool>) {
    // The readers' lock order first: an upgrade step takes it too.
    crate::log::catalog::lock_for_reading();
    let name = name.ok_or(StreamsError::NullArgument("name")).or_raise();
    let stream = stream.ok_or(StreamsError::NullArgument("stream")).or_raise();
    let start = start.ok_or(StreamsError::NullArgument("after")).or_raise();
    let ordered = ordered.ok_or(StreamsError::NullArgument("ordered")).or_raise();
    create(name, stream, start, ordered);
}

/// Create a subscription owned by the caller, after checking its name,
/// pattern, start and the caller's read privilege; its id.
pub(crate) fn create(name: &str, stream: &str, start: i64, ordered: bool) -> i32 {
    check_subscription_name(name).or_raise();
    parse_stream_selector(stream).or_raise();
    if start < 0 {
        StreamsError::NegativeArgument { argument: "after", value: start }.raise();
    }
    check_read_coverage(name, stream);
    // SAFETY: reads the backend's current user id, set once it is connected.
    let caller = unsafe { pg_sys::GetUserId() };
    if named(name).iter().any(|n| n.own) {
        // Before the INSERT, which would take an id from the sequence even
        // when the name is taken (ids are 32-bit claim lock keys). Another
        // role's subscription of the same name is no conflict: names are
        // per owner.
        StreamsError::DuplicateSubscription(name.to_owned()).raise();
    }
    // ON CONFLICT without a target: names are unique per owner since 0.3.0,
    // and across owners in a database still at 0.2.0, which this library
    // serves too until ALTER EXTENSION ... UPDATE.
    let created = as_owner(|client| {
        let args: [DatumWithOid; 5] = [name.into(), stream.into(), ordered.into(), start.into(), caller.into()];
        let rows = client.update_kept(
            "INSERT INTO streams.subscription_state (name, stream, ordered, position, owner)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING RETURNING id",
            None,
            &args,
        )?;
        reads::first_value(rows)
    });
    created.unwrap_or_else(|| StreamsError::DuplicateSubscription(name.to_owned()).raise())
}

/// `streams.drop_subscription(name)`: true if it existed.
#[pg_extern(sql = false)]
fn _drop_subscription(name: Option<&str>) -> bool {
    // The readers' lock order first: an upgrade step takes it too.
    crate::log::catalog::lock_for_reading();
    let name = name.ok_or(StreamsError::NullArgument("name")).or_raise();
    let Some(subscription) = find(name) else { return false };
    check_member(&subscription);
    refuse_webhook(&subscription);
    claims::lock_exclusively(subscription.id);
    // A delivery of a poll that ended while it waited may still be on its
    // way: the worker's insert would wait for this transaction's delete (a
    // foreign key check), holding up every poller meanwhile.
    attempts::await_earlier_deliveries(subscription.id, &[(i64::MIN, i64::MAX)]);
    as_owner(|client| {
        client.update_kept("DELETE FROM streams.subscription_state WHERE id = $1", None, &[subscription.id.into()])?;
        Ok(())
    });
    true
}

/// `streams._seek_subscription(name, start)`: behind `streams.seek`.
#[pg_extern(sql = false)]
fn _seek_subscription(name: Option<&str>, start: Option<i64>) {
    // The readers' lock order first: an upgrade step takes it too.
    crate::log::catalog::lock_for_reading();
    let name = name.ok_or(StreamsError::NullArgument("subscription")).or_raise();
    let start = start.ok_or(StreamsError::NullArgument("after")).or_raise();
    if start < 0 {
        StreamsError::NegativeArgument { argument: "after", value: start }.raise();
    }
    let subscription = open(name);
    claims::lock_exclusively(subscription.id);
    as_owner(|client| {
        if tracks_attempts() {
            client.update_kept(
                "UPDATE streams.subscription_state SET position = $2, lost_before = NULL WHERE id = $1",
                None,
                &[subscription.id.into(), start.into()],
            )?;
            // LS001 below the first position retention kept: streams.seek
            // checks it after this, the log locked (lock_for_reading, above).
        } else {
            client.update_kept(
                "UPDATE streams.subscription_state SET position = $2 WHERE id = $1",
                None,
                &[subscription.id.into(), start.into()],
            )?;
        }
        client.update_kept(
            "DELETE FROM streams.subscription_progress WHERE subscription = $1",
            None,
            &[subscription.id.into()],
        )?;
        if tracks_attempts() {
            // Reprocessing starts afresh: attempts from 1, no pending retry.
            attempts::forget_all(client, subscription.id)?;
            failures::forget_pending(client, subscription.id)?;
            client.update_kept(
                "DELETE FROM streams.subscription_keys WHERE subscription = $1",
                None,
                &[subscription.id.into()],
            )?;
        }
        Ok(())
    });
}

/// `streams._poll(subscription, max_events, wait)`: claim the next events
/// and return them as ranges: `count` events of `stream` after `after`.
/// The 0.2.0 form: for databases not yet updated, and for a poll compiled
/// before an update that runs after it (its attempts are counted, not
/// returned).
#[pg_extern(sql = false)]
fn _poll(
    subscription: Option<&str>,
    max_events: Option<i32>,
    wait: Option<Interval>,
) -> TableIterator<'static, (name!(stream, String), name!(after, i64), name!(count, i32))> {
    let (subscription, pieces, _) = claim(subscription, max_events, wait, tracks_attempts(), None);
    if let Some(first) = subscription.lost_before {
        raise_lost(&subscription.name, first);
    }
    let stream = subscription.stream;
    TableIterator::new(pieces.into_iter().map(move |(after, count, _)| (stream.clone(), after, count as i32)))
}

/// `streams._claim(subscription, max_events, wait, lease)`: claim the next
/// events, in one row: the subscription's stream (a pattern of one) or
/// prefix (`prefix.*`; both NULL for `*`; for a wildcard pattern its
/// literal prefix, and the pattern, which the names must match), its
/// filters (types, filter: the ranges hold events that do not pass
/// them, which the poll leaves out) and the `(after, through]`
/// ranges of positions holding its events, in order, their delivery on its
/// way to being written down (`streams._await_delivery` waits for it); with
/// `lease`, claimed for that long under the lease id returned, and written
/// down before it returns. `streams.poll` reads the events in its next
/// statement.
#[allow(clippy::type_complexity)] // the SQL row, spelled out for pgrx
#[pg_extern(sql = false)]
fn _claim(
    subscription: Option<&str>,
    max_events: Option<i32>,
    wait: Option<Interval>,
    lease: Option<Interval>,
) -> TableIterator<
    'static,
    (
        name!(stream, Option<String>),
        name!(prefix, Option<String>),
        name!(afters, Vec<i64>),
        name!(throughs, Vec<i64>),
        name!(lease, Option<i64>),
        name!(pattern, Option<String>),
        name!(types, Option<Vec<String>>),
        name!(filter, Option<pgrx::JsonB>),
        name!(lost_before, Option<i64>),
    ),
> {
    let lease = lease.map(|l| leases::duration(&l));
    let (subscription, mut claimed, lease) = claim(subscription, max_events, wait, true, lease);
    // Retention cut below it: nothing claimed, and streams.poll raises LS001
    // (raised here, through Rust, the extension's own SQLSTATE would become XX000).
    let lost_before = subscription.lost_before;
    let (stream, prefix, pattern) = match subscription.selector {
        StreamSelector::Exact(name) => (Some(name), None, None),
        StreamSelector::Prefix { prefix, .. } => (None, Some(prefix), None),
        StreamSelector::Wildcard { prefix, pattern, .. } => {
            (None, Some(prefix).filter(|p| !p.is_empty()), Some(pattern))
        }
        StreamSelector::All => (None, None, None),
    };
    claimed.sort_unstable();
    let afters = claimed.iter().map(|&(after, _, _)| after).collect();
    let throughs = claimed.iter().map(|&(_, _, through)| through).collect();
    let EventFilter { types, data } = subscription.filter;
    // PostgreSQL's own text of a jsonb: it parses (were it not to, JSON null
    // would keep no event rather than every one).
    let filter = data.map(|data| pgrx::JsonB(serde_json::from_str(&data).unwrap_or(serde_json::Value::Null)));
    TableIterator::once((stream, prefix, afters, throughs, lease, pattern, types, filter, lost_before))
}

/// Claim the next events: the subscription, the `(after, count, through]`
/// ranges holding them and the lease id. With `attempts`, their
/// delivery is submitted to the worker (written down before returning
/// when leased). Nothing for a subscription retention cut below
/// (`lost_before`): the caller raises LS001.
fn claim(
    subscription: Option<&str>,
    max_events: Option<i32>,
    wait: Option<Interval>,
    attempts: bool,
    lease: Option<Duration>,
) -> (Subscription, Vec<(i64, i64, i64)>, Option<i64>) {
    // The readers' lock order first: an upgrade step takes it too.
    crate::log::catalog::lock_for_reading();
    let name = subscription.ok_or(StreamsError::NullArgument("subscription")).or_raise();
    let max_events = max_events.ok_or(StreamsError::NullArgument("max_events")).or_raise();
    let wait = wait.ok_or(StreamsError::NullArgument("wait")).or_raise();
    if !(1..=MAX_EVENTS_LIMIT).contains(&max_events) {
        StreamsError::ArgumentOutOfRange {
            argument: "max_events",
            value: max_events.into(),
            min: 1,
            max: MAX_EVENTS_LIMIT.into(),
        }
        .raise();
    }
    let wait = wait_duration(&wait, "wait").or_raise();
    let subscription = open(name);
    refuse_webhook(&subscription);
    if subscription.lost_before.is_some() {
        return (subscription, Vec::new(), None); // the caller raises LS001
    }
    check_read_coverage(&subscription.name, &subscription.stream);
    if lease.is_some() && (!subscription.ordered || subscription.key_path.is_some()) {
        StreamsError::NeedsOrdered { function: "streams.poll(lease => ...)", subscription: subscription.name }.raise();
    }
    if isolation_is_snapshot() && (!subscription.ordered || !wait.is_zero()) {
        // An unordered poll could not see another consumer's ack, and a long
        // poll would never see a new event.
        StreamsError::PollNeedsReadCommitted { long_poll: subscription.ordered }.raise();
    }
    let waiter = wait::Waiter::new(wait, subscription.id);
    let claimed = loop {
        waiter.reset();
        let horizon = horizon_seen_by_transaction();
        let polled = as_owner(|client| {
            if subscription.key_path.is_some() {
                keyed::poll(client, &subscription, horizon, max_events as i64)
            } else if subscription.ordered {
                poll_ordered(client, &subscription, horizon, max_events as i64, attempts, lease.is_some())
            } else {
                poll_unordered(client, &subscription, horizon, max_events as i64, attempts)
            }
        });
        let Polled { ranges, due_in, release_token } = polled;
        if !ranges.is_empty() {
            break (ranges, release_token);
        }
        if due_in == Some(Duration::ZERO) {
            continue; // it parked a put-back event: look again at once
        }
        if !waiter.sleep_at_most(due_in) {
            break (ranges, release_token);
        }
    };
    let (claimed, release_token) = claimed;
    if !attempts {
        return (subscription, claimed, None);
    }
    let deliveries: Vec<(i64, i64)> = claimed.iter().map(|&(after, _, through)| (after, through)).collect();
    let lease = lease.filter(|_| !claimed.is_empty()).map(|for_| (leases::new_id(), for_.as_micros() as i64));
    if lease.is_some() {
        attempts::record(subscription.id, lease, &deliveries);
    } else {
        attempts::submit(subscription.id, lease, &deliveries);
    }
    if release_token {
        // The lease holds the events now, not this transaction.
        claims::unlock(subscription.id, Key::Token, claims::Hold::Exclusive);
    }
    (subscription, claimed, lease.map(|l| l.0))
}

/// `streams.ack(subscription, through)`: what this transaction polled up to
/// `through` is processed.
#[pg_extern(sql = false)]
fn _ack(subscription: Option<&str>, through: Option<i64>) {
    // The readers' lock order first: an upgrade step takes it too.
    crate::log::catalog::lock_for_reading();
    let name = subscription.ok_or(StreamsError::NullArgument("subscription")).or_raise();
    let through = through.ok_or(StreamsError::NullArgument("through")).or_raise();
    let subscription = open(name);
    refuse_webhook(&subscription);
    let claimed = claims::of(subscription.id);
    let Some(polled_through) = claimed.iter().map(|c| c.high).max() else {
        StreamsError::AckNotPolled { subscription: subscription.name, through, polled_through: None }.raise()
    };
    if through > polled_through {
        StreamsError::AckNotPolled { subscription: subscription.name, through, polled_through: Some(polled_through) }
            .raise();
    }
    let horizon = horizon_seen_by_transaction();
    let tracks = tracks_attempts();
    as_owner(|client| {
        if subscription.key_path.is_some() {
            return keyed::ack(client, &subscription, through, horizon);
        }
        if subscription.ordered {
            // In position order: the ack stops before the first event this
            // transaction nacked; those after it come again after it.
            let nacked = claims::nacked(subscription.id);
            let upto = nacked.iter().map(|n| n - 1).min().map_or(through, |stop| stop.min(through));
            client.update_kept(
                "UPDATE streams.subscription_state
                 SET position = GREATEST(position, $2), last_ack_at = pg_catalog.now() WHERE id = $1",
                None,
                &[subscription.id.into(), upto.into()],
            )?;
            if tracks {
                for claim in &claimed {
                    // A put-back event is acked by an ack through it.
                    let upto = if claim.key == Key::PutBack { through } else { upto };
                    let high = claim.high.min(upto);
                    attempts::settle(client, subscription.id, claim.low, high, &nacked)?;
                    failures::forget(client, subscription.id, claim.low, high, &nacked)?;
                }
            }
            return Ok(());
        }
        for claim in claimed.iter().filter(|c| c.low < through) {
            let Key::Chunk(chunk) = claim.key else { continue };
            let args: [DatumWithOid; 3] = [subscription.id.into(), chunk.into(), claim.high.min(through).into()];
            client.update_kept(
                "INSERT INTO streams.subscription_progress AS p (subscription, chunk, done_through, acked_at)
                 VALUES ($1, $2, $3, pg_catalog.now())
                 ON CONFLICT (subscription, chunk) DO UPDATE
                 SET done_through = GREATEST(p.done_through, excluded.done_through), acked_at = excluded.acked_at",
                None,
                &args,
            )?;
        }
        if tracks {
            // Nacked events stay failed (an ack moves the chunk past them:
            // they come again as put-backs); the others succeeded.
            let nacked = claims::nacked(subscription.id);
            for claim in claimed.iter().filter(|c| c.low < through) {
                let high = claim.high.min(through);
                attempts::settle(client, subscription.id, claim.low, high, &nacked)?;
                failures::forget(client, subscription.id, claim.low, high, &nacked)?;
            }
        }
        fold_finished_chunks(client, &subscription, horizon)
    });
}

/// `streams._chunk(position)`: the chunk of an unordered subscription a
/// position falls in.
#[pg_extern(sql = false, immutable, strict, parallel_safe)]
fn _chunk(position: i64) -> i64 {
    claims::chunk_of(position)
}

/// `streams._claims()`: (subscription id, pid, claimed events) of the open
/// transactions of this database, for `streams.subscriptions`: only for
/// subscriptions whose owner the caller has the privileges of.
#[pg_extern(sql = false)]
fn _claims() -> TableIterator<'static, (name!(subscription, i32), name!(pid, i32), name!(claimed, i64))> {
    crate::require_preload().or_raise();
    // SAFETY: MyDatabaseId is set once the backend connected; a plain read.
    let mut claims = crate::shmem::claims_in(unsafe { pg_sys::MyDatabaseId });
    if !claims.is_empty() {
        let ids: Vec<i32> = claims.iter().map(|c| c.0).collect();
        let owners: Vec<(i32, pg_sys::Oid)> = as_owner(|client| {
            client
                .select_kept(
                    "SELECT s.id, s.owner FROM streams.subscription_state s WHERE s.id = ANY ($1)",
                    None,
                    &[ids.into()],
                )?
                .map(|row| Ok((row.get::<i32>(1)?.unwrap_or(0), row.get::<pg_sys::Oid>(2)?.unwrap_or_default())))
                .collect()
        });
        claims.retain(|(id, _, _)| owners.iter().any(|(sub, owner)| sub == id && caller_acts_for(*owner)));
    }
    TableIterator::new(claims)
}

/// The subscription named `name` that the caller may use, or raise.
pub(super) fn open(name: &str) -> Subscription {
    let subscription = find(name).unwrap_or_else(|| StreamsError::UnknownSubscription(name.to_owned()).raise());
    check_member(&subscription);
    subscription
}

/// LS001: retention removed events of `name` it had not processed (it
/// was told to, with overrides_consumers); the first position it kept is
/// `first`. Raised by streams._subscription_lost; through Rust (here, for
/// the 0.2.0 form `_poll`) pgrx turns the extension's own SQLSTATE into
/// XX000, which is why streams.poll and streams.seek raise it in SQL.
fn raise_lost(name: &str, first: i64) -> ! {
    Spi::run_with_args("SELECT streams._subscription_lost($1, $2)", &[name.into(), first.into()])
        .context("reporting events removed by retention");
    StreamsError::MissingObject("function streams._subscription_lost").raise()
}

/// A webhook's subscription is consumed by the webhook worker alone: a
/// poll or ack of its own would take events from it.
pub(super) fn refuse_webhook(subscription: &Subscription) {
    if subscription.webhook {
        StreamsError::WebhookSubscription(subscription.name.clone()).raise();
    }
}

/// The subscription named `name` as the caller sees it. Names are per
/// owning role, so that a role that takes a name first cannot lock another
/// team out of it: the caller's own subscription of that name, else the one
/// owned by a role whose privileges the caller has (42P09 when several are),
/// else one owned by anybody, which [`check_member`] then refuses (42501).
pub(crate) fn find(name: &str) -> Option<Subscription> {
    let named = named(name);
    let first = named.first()?;
    if !first.own && first.member {
        let owners: Vec<String> = named.iter().filter(|n| n.member).map(|n| n.owner_name.clone()).collect();
        if owners.len() > 1 {
            StreamsError::AmbiguousSubscription { name: name.to_owned(), owners }.raise();
        }
    }
    let selector = parse_stream_selector(&first.stream).or_raise();
    Some(Subscription {
        id: first.id,
        name: name.to_owned(),
        stream: first.stream.clone(),
        selector,
        filter: first.filter.clone(),
        ordered: first.ordered,
        owner: first.owner,
        webhook: first.webhook,
        key_path: first.key_path.clone(),
        skip_dead_letters: first.skip_dead_letters,
        max_attempts: first.max_attempts,
        backoff_min_us: first.backoff_min_us,
        backoff_max_us: first.backoff_max_us,
        lost_before: first.lost_before,
    })
}

/// One subscription of a given name, seen from the caller.
struct Named {
    id: i32,
    stream: String,
    ordered: bool,
    owner: pg_sys::Oid,
    owner_name: String,
    webhook: bool,
    key: Option<String>,
    key_path: Option<Vec<String>>,
    skip_dead_letters: bool,
    max_attempts: Option<i32>,
    backoff_min_us: i64,
    backoff_max_us: i64,
    filter: EventFilter,
    lost_before: Option<i64>,
    /// The caller owns it.
    own: bool,
    /// The caller has the privileges of its owner.
    member: bool,
}

/// Every subscription named `name`: the caller's own first, then those of
/// roles the caller acts for, then the rest.
fn named(name: &str) -> Vec<Named> {
    // SAFETY: reads the backend's current user id, set once it is connected.
    let caller = unsafe { pg_sys::GetUserId() };
    // A database still at 0.2.0 has no retry settings.
    let retry_columns = if tracks_attempts() {
        "s.max_attempts, (pg_catalog.date_part('epoch', s.backoff_min) * 1e6)::bigint,
         (pg_catalog.date_part('epoch', s.backoff_max) * 1e6)::bigint, s.key, s.key_path,
         s.on_dead_letter = 'skip', s.types, s.filter::text, s.lost_before"
    } else {
        "NULL::integer, 0::bigint, 0::bigint, NULL::text, NULL::text[], false, NULL::text[], NULL::text, NULL::bigint"
    };
    let query = format!(
        "SELECT s.id, s.stream, s.ordered, s.owner::oid, s.owner::text,
                EXISTS (SELECT FROM streams.webhook_state w WHERE w.subscription = s.id),
                s.owner::oid = $2 AS own,
                pg_catalog.pg_has_role($2, s.owner::oid, 'USAGE') AS member,
                {retry_columns}
         FROM streams.subscription_state s WHERE s.name = $1
         ORDER BY own DESC, member DESC, s.id"
    );
    as_owner(|client| {
        let rows = with_latest_snapshot(|| client.select_kept(query.as_str(), None, &[name.into(), caller.into()]))?;
        let mut found = Vec::with_capacity(rows.len());
        for row in rows {
            found.push(Named {
                id: row.get::<i32>(1)?.unwrap_or(0),
                stream: row.get::<String>(2)?.unwrap_or_default(),
                ordered: row.get::<bool>(3)?.unwrap_or(true),
                owner: row.get::<pg_sys::Oid>(4)?.unwrap_or(pg_sys::InvalidOid),
                owner_name: row.get::<String>(5)?.unwrap_or_default(),
                webhook: row.get::<bool>(6)?.unwrap_or(false),
                own: row.get::<bool>(7)?.unwrap_or(false),
                member: row.get::<bool>(8)?.unwrap_or(false),
                max_attempts: row.get::<i32>(9)?,
                backoff_min_us: row.get::<i64>(10)?.unwrap_or(0),
                backoff_max_us: row.get::<i64>(11)?.unwrap_or(0),
                key: row.get::<String>(12)?,
                key_path: row.get::<Vec<String>>(13)?,
                skip_dead_letters: row.get::<bool>(14)?.unwrap_or(false),
                filter: EventFilter { types: row.get::<Vec<String>>(15)?, data: row.get::<String>(16)? },
                lost_before: row.get::<i64>(17)?,
            });
        }
        Ok(found)
    })
}

/// 42501 unless the caller has the privileges of the subscription's owner
/// (the role that created it; superusers always do).
pub(crate) fn check_member(subscription: &Subscription) {
    if !caller_acts_for(subscription.owner) {
        StreamsError::NotSubscriptionOwner(subscription.name.clone()).raise();
    }
}

/// Whether the current user has the privileges of `owner`.
fn caller_acts_for(owner: pg_sys::Oid) -> bool {
    // SAFETY: a catalog lookup of role membership inside the caller's transaction.
    unsafe { pg_sys::has_privs_of_role(pg_sys::GetUserId(), owner) }
}

/// 42501 unless the caller may read every stream `pattern` selects: a
/// subscription that skipped what its consumer may not read would ack it
/// unseen.
fn check_read_coverage(subscription: &str, pattern: &str) {
    if !privileges::may_read_all(pattern, publish::position_sequence()) {
        StreamsError::SubscriptionNotReadable { subscription: subscription.to_owned(), stream: pattern.to_owned() }
            .raise();
    }
}

/// Subscription names follow the stream naming rule.
fn check_subscription_name(name: &str) -> Result<(), StreamsError> {
    litebase_streams_core::names::validate_stream_name(name).map_err(
        |litebase_streams_core::names::NameError { name, reason }| StreamsError::InvalidSubscriptionName {
            name,
            reason,
        },
    )
}

/// Run SPI statements as the extension's owner (the tables' owner), under
/// `search_path = pg_catalog, pg_temp` whatever the caller's function was
/// declared with: as the owner, a type or function the caller planted in
/// its temporary schema must never be found. Planned with index scans
/// (see with_index_plans).
pub(crate) fn as_owner<R>(body: impl FnOnce(&mut SpiClient<'_>) -> SpiResult<R>) -> R {
    let owner = publish::log_owner(publish::position_sequence());
    crate::log::kept_plan::with_index_plans(|| privileges::as_owner(owner, || Spi::connect_mut(body)))
        .context("a subscription statement")
}

type SpiResult<T> = Result<T, pgrx::spi::Error>;
