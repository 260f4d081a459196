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
//! The functions are not SECURITY DEFINER: they check the caller (a member
//! of the subscription's owner, and its read privilege on every stream the
//! pattern selects) and then read and write the tables as the extension's
//! owner, like `publish`.

mod claims;
pub mod wait;

use pgrx::datum::{DatumWithOid, Interval};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

use crate::error::{OrRaise, StreamsError};
use crate::{log::privileges, log::publish};
use claims::{Hold, Key, CHUNK_WIDTH};
use litebase_streams_core::names::{parse_stream_selector, StreamSelector};
use wait::{horizon_seen_by_transaction, isolation_is_snapshot, wait_duration};

/// The most events one poll returns.
const MAX_EVENTS_LIMIT: i32 = 10_000;

/// The most chunks one poll of an unordered subscription locks.
const MAX_CHUNKS_PER_POLL: usize = 16;

/// A subscription as one call sees it.
pub(crate) struct Subscription {
    pub id: i32,
    pub name: String,
    pub stream: String,
    selector: StreamSelector,
    ordered: bool,
    owner: pg_sys::Oid,
    /// It belongs to a webhook: only the webhook worker consumes it.
    pub webhook: bool,
}

/// `streams._create_subscription(name, stream, start, ordered)`: behind
/// `streams.create_subscription`, which validates the start arguments and
/// turns them into a position.
#[pg_extern(sql = false)]
fn _create_subscription(name: Option<&str>, stream: Option<&str>, start: Option<i64>, ordered: Option<bool>) {
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
        StreamsError::InvalidArgument(format!("after must not be negative (got {start})")).raise();
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
    let created = as_owner(|client| {
        let args: [DatumWithOid; 5] = [name.into(), stream.into(), ordered.into(), start.into(), caller.into()];
        let rows = client.update(
            "INSERT INTO streams.subscription_state (name, stream, ordered, position, owner)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (owner, name) DO NOTHING RETURNING id",
            None,
            &args,
        )?;
        if rows.is_empty() {
            Ok(None)
        } else {
            rows.first().get::<i32>(1)
        }
    });
    created.unwrap_or_else(|| StreamsError::DuplicateSubscription(name.to_owned()).raise())
}

/// `streams.drop_subscription(name)`: true if it existed.
#[pg_extern(sql = false)]
fn _drop_subscription(name: Option<&str>) -> bool {
    let name = name.ok_or(StreamsError::NullArgument("name")).or_raise();
    let Some(subscription) = find(name) else { return false };
    check_member(&subscription);
    refuse_webhook(&subscription);
    claims::lock_exclusively(subscription.id);
    as_owner(|client| {
        client.update("DELETE FROM streams.subscription_state WHERE id = $1", None, &[subscription.id.into()])?;
        Ok(())
    });
    true
}

/// `streams._seek_subscription(name, start)`: behind `streams.seek`.
#[pg_extern(sql = false)]
fn _seek_subscription(name: Option<&str>, start: Option<i64>) {
    let name = name.ok_or(StreamsError::NullArgument("subscription")).or_raise();
    let start = start.ok_or(StreamsError::NullArgument("after")).or_raise();
    if start < 0 {
        StreamsError::InvalidArgument(format!("after must not be negative (got {start})")).raise();
    }
    let subscription = open(name);
    claims::lock_exclusively(subscription.id);
    as_owner(|client| {
        client.update(
            "UPDATE streams.subscription_state SET position = $2 WHERE id = $1",
            None,
            &[subscription.id.into(), start.into()],
        )?;
        client.update(
            "DELETE FROM streams.subscription_progress WHERE subscription = $1",
            None,
            &[subscription.id.into()],
        )?;
        Ok(())
    });
}

/// `streams._poll(subscription, max_events, wait)`: claim the next events
/// and return them as ranges: `count` events of `stream` after `after`.
#[pg_extern(sql = false)]
fn _poll(
    subscription: Option<&str>,
    max_events: Option<i32>,
    wait: Option<Interval>,
) -> TableIterator<'static, (name!(stream, String), name!(after, i64), name!(count, i32))> {
    let name = subscription.ok_or(StreamsError::NullArgument("subscription")).or_raise();
    let max_events = max_events.ok_or(StreamsError::NullArgument("max_events")).or_raise();
    let wait = wait.ok_or(StreamsError::NullArgument("wait")).or_raise();
    if !(1..=MAX_EVENTS_LIMIT).contains(&max_events) {
        StreamsError::InvalidArgument(format!(
            "max_events must be between 1 and {MAX_EVENTS_LIMIT} (got {max_events})"
        ))
        .raise();
    }
    let wait = wait_duration(&wait, "wait").or_raise();
    let subscription = open(name);
    refuse_webhook(&subscription);
    check_read_coverage(&subscription.name, &subscription.stream);
    if isolation_is_snapshot() && (!subscription.ordered || !wait.is_zero()) {
        // An unordered poll could not see another consumer's ack, and a long
        // poll would never see a new event.
        StreamsError::PollNeedsReadCommitted { long_poll: subscription.ordered }.raise();
    }
    let waiter = wait::Waiter::new(wait, subscription.id);
    let claimed = loop {
        waiter.reset();
        let horizon = horizon_seen_by_transaction();
        let claimed = as_owner(|client| {
            if subscription.ordered {
                poll_ordered(client, &subscription, horizon, max_events as i64)
            } else {
                poll_unordered(client, &subscription, horizon, max_events as i64)
            }
        });
        if !claimed.is_empty() || !waiter.sleep() {
            break claimed;
        }
    };
    let stream = subscription.stream;
    TableIterator::new(claimed.into_iter().map(move |(after, count)| (stream.clone(), after, count as i32)))
}

/// `streams.ack(subscription, through)`: what this transaction polled up to
/// `through` is processed.
#[pg_extern(sql = false)]
fn _ack(subscription: Option<&str>, through: Option<i64>) {
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
    as_owner(|client| {
        if subscription.ordered {
            client.update(
                "UPDATE streams.subscription_state
                 SET position = GREATEST(position, $2), last_ack_at = pg_catalog.now() WHERE id = $1",
                None,
                &[subscription.id.into(), through.into()],
            )?;
            return Ok(());
        }
        for claim in claimed.iter().filter(|c| c.low < through) {
            let Key::Chunk(chunk) = claim.key else { continue };
            let args: [DatumWithOid; 3] = [subscription.id.into(), chunk.into(), claim.high.min(through).into()];
            client.update(
                "INSERT INTO streams.subscription_progress AS p (subscription, chunk, done_through, acked_at)
                 VALUES ($1, $2, $3, pg_catalog.now())
                 ON CONFLICT (subscription, chunk) DO UPDATE
                 SET done_through = GREATEST(p.done_through, excluded.done_through), acked_at = excluded.acked_at",
                None,
                &args,
            )?;
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
                .select(
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

/// An ordered subscription: one transaction at a time holds its token. The
/// holder continues after what it claimed; a new holder starts at the
/// position, read after it got the token (so it sees the last holder's ack).
fn poll_ordered(client: &mut SpiClient<'_>, sub: &Subscription, horizon: i64, max: i64) -> SpiResult<Vec<(i64, i64)>> {
    let (start, newly_locked) = match claims::claimed_through(sub.id, Key::Token) {
        Some(through) => (through, false),
        None if claims::try_lock(sub.id, Key::Token, Hold::Exclusive) => (read_position(client, sub.id)?, true),
        None => return Ok(Vec::new()),
    };
    let (count, last) = next_events(client, sub, start, horizon, max)?;
    let Some(last) = last else {
        if newly_locked {
            claims::unlock(sub.id, Key::Token, Hold::Exclusive); // claimed nothing: the next poller may go on
        }
        return Ok(Vec::new());
    };
    if newly_locked {
        // Lock the row the ack updates (no other poller waits on it: they
        // wait for the token). Under repeatable read this fails with 40001
        // if the position moved since the transaction's snapshot.
        let rows = client.update(
            "SELECT s.position FROM streams.subscription_state s WHERE s.id = $1 FOR NO KEY UPDATE",
            None,
            &[sub.id.into()],
        )?;
        let locked = if rows.is_empty() { None } else { rows.first().get::<i64>(1)? };
        if locked != Some(start) {
            // A seek committed in between: start again from its position.
            claims::unlock(sub.id, Key::Token, Hold::Exclusive);
            return poll_ordered(client, sub, horizon, max);
        }
    }
    claims::add(sub.id, Key::Token, start, last, count);
    Ok(vec![(start, count)])
}

/// An unordered subscription: take the lowest events of chunks no other
/// transaction holds, at most [`MAX_CHUNKS_PER_POLL`] chunks.
fn poll_unordered(
    client: &mut SpiClient<'_>,
    sub: &Subscription,
    horizon: i64,
    max: i64,
) -> SpiResult<Vec<(i64, i64)>> {
    // Shared: other pollers go on; a seek or drop in progress keeps us out.
    if !claims::try_lock(sub.id, Key::Token, Hold::Shared) {
        return Ok(Vec::new());
    }
    let claimed = poll_chunks(client, sub, horizon, max)?;
    if claimed.is_empty() {
        claims::unlock(sub.id, Key::Token, Hold::Shared);
    }
    Ok(claimed)
}

fn poll_chunks(client: &mut SpiClient<'_>, sub: &Subscription, horizon: i64, max: i64) -> SpiResult<Vec<(i64, i64)>> {
    let held = claims::chunks_claimed();
    if held >= claims::MAX_CHUNKS_PER_TRANSACTION {
        StreamsError::TooManyClaims { subscription: sub.name.clone(), chunks: held }.raise();
    }
    let lockable = MAX_CHUNKS_PER_POLL.min(claims::MAX_CHUNKS_PER_TRANSACTION - held);
    let position = read_position(client, sub.id)?;
    let page = (max * 2).max(100);
    // (chunk, low, last position taken, count), in the order first taken.
    let mut taken: Vec<(i64, i64, i64, i64)> = Vec::new();
    let mut locked_here: Vec<i64> = Vec::new();
    let mut total = 0;
    let mut cursor = position;
    'scan: loop {
        let candidates = unprocessed_events(client, sub, cursor, horizon, page)?;
        let exhausted = (candidates.len() as i64) < page;
        for &event in &candidates {
            cursor = event;
            let chunk = claims::chunk_of(event);
            let index = match taken.iter().position(|t| t.0 == chunk) {
                Some(index) => index,
                None => {
                    let low = if let Some(through) = claims::claimed_through(sub.id, Key::Chunk(chunk)) {
                        through
                    } else if locked_here.len() < lockable
                        && claims::try_lock(sub.id, Key::Chunk(chunk), Hold::Exclusive)
                    {
                        locked_here.push(chunk);
                        // Read after taking the lock: the last holder's ack.
                        processed_through(client, sub.id, chunk)?.max(chunk * CHUNK_WIDTH - 1)
                    } else {
                        // Another transaction holds it (or this poll locked
                        // enough chunks): go on after it.
                        cursor = (chunk + 1) * CHUNK_WIDTH - 1;
                        if locked_here.len() >= lockable {
                            break 'scan;
                        }
                        continue 'scan;
                    };
                    taken.push((chunk, low, low, 0));
                    taken.len() - 1
                }
            };
            let entry = &mut taken[index];
            if event > entry.2 {
                entry.2 = event;
                entry.3 += 1;
                total += 1;
                if total == max {
                    break 'scan;
                }
            }
        }
        if exhausted {
            break;
        }
    }
    let mut claimed = Vec::new();
    for (chunk, low, last, count) in taken {
        if count == 0 {
            if locked_here.contains(&chunk) {
                claims::unlock(sub.id, Key::Chunk(chunk), Hold::Exclusive);
            }
            continue;
        }
        claims::add(sub.id, Key::Chunk(chunk), low, last, count);
        claimed.push((low, count));
    }
    claimed.sort_unstable();
    Ok(claimed)
}

/// Move the position of an unordered subscription over the events whose
/// chunks were acked (this transaction's acks included), and drop the
/// progress rows below it. From `ack`, not `poll`: the update holds the row
/// until the transaction ends, and a long poll that claimed nothing must not
/// (a seek would wait for it). Skipped while another transaction does it.
fn fold_finished_chunks(client: &mut SpiClient<'_>, sub: &Subscription, horizon: i64) -> SpiResult<()> {
    let position = read_position(client, sub.id)?;
    let first = unprocessed_events(client, sub, position, horizon, 1)?;
    let done_through = first.first().map_or(horizon, |&p| p - 1).max(position);
    if claims::chunk_of(done_through + 1) <= claims::chunk_of(position + 1) {
        return Ok(());
    }
    let args: [DatumWithOid; 3] = [sub.id.into(), position.into(), done_through.into()];
    client.update(
        "WITH mine AS (
             SELECT s.id FROM streams.subscription_state s
             WHERE s.id = $1 AND s.position = $2 FOR NO KEY UPDATE SKIP LOCKED
         ), folded AS (
             DELETE FROM streams.subscription_progress p USING mine
             WHERE p.subscription = mine.id AND p.chunk < streams._chunk($3 + 1)
             RETURNING p.acked_at
         )
         UPDATE streams.subscription_state s
         SET position = $3,
             last_ack_at = GREATEST(s.last_ack_at, (SELECT pg_catalog.max(f.acked_at) FROM folded f))
         FROM mine WHERE s.id = mine.id",
        None,
        &args,
    )?;
    Ok(())
}

/// How many of the subscription's events `(after, upto]` holds, at most
/// `limit`, and the position of the last of them.
fn next_events(
    client: &mut SpiClient<'_>,
    sub: &Subscription,
    after: i64,
    upto: i64,
    limit: i64,
) -> SpiResult<(i64, Option<i64>)> {
    let (sql, args) = events_query(sub, after, upto, limit, "");
    let sql = format!("SELECT pg_catalog.count(*), pg_catalog.max(n.position) FROM ({sql}) n");
    with_latest_snapshot(|| {
        let rows = client.select(sql.as_str(), None, &args)?;
        let row = rows.first();
        Ok((row.get::<i64>(1)?.unwrap_or(0), row.get::<i64>(2)?))
    })
}

/// Up to `limit` positions of the subscription's events in `(after, upto]`
/// that no ack of their chunk processed.
fn unprocessed_events(
    client: &mut SpiClient<'_>,
    sub: &Subscription,
    after: i64,
    upto: i64,
    limit: i64,
) -> SpiResult<Vec<i64>> {
    let (sql, args) = events_query(
        sub,
        after,
        upto,
        limit,
        "AND NOT EXISTS (SELECT FROM streams.subscription_progress p
                         WHERE p.subscription = $4 AND p.chunk = streams._chunk(e.position)
                           AND p.done_through >= e.position)",
    );
    with_latest_snapshot(|| {
        client.select(sql.as_str(), None, &args)?.map(|row| row.get::<i64>(1).map(|p| p.unwrap_or(0))).collect()
    })
}

/// The positions of the subscription's events in `(after, upto]`, at most
/// `limit`, in order (`extra`: more conditions on `e`), and its arguments.
fn events_query<'a>(
    sub: &'a Subscription,
    after: i64,
    upto: i64,
    limit: i64,
    extra: &str,
) -> (String, Vec<DatumWithOid<'a>>) {
    let (filter, values) = sub.selector.sql_condition("e.stream", 5);
    let sql = format!(
        "SELECT e.position FROM streams.event_log e
         WHERE e.position > $1 AND e.position <= $2 {filter} {extra}
         ORDER BY e.position LIMIT $3"
    );
    let mut args: Vec<DatumWithOid> = vec![after.into(), upto.into(), limit.into(), sub.id.into()];
    args.extend(values.into_iter().map(DatumWithOid::from));
    (sql, args)
}

/// The position as committed now (a dropped subscription: raise).
fn read_position(client: &mut SpiClient<'_>, id: i32) -> SpiResult<i64> {
    let rows = with_latest_snapshot(|| {
        client.select("SELECT s.position FROM streams.subscription_state s WHERE s.id = $1", None, &[id.into()])
    })?;
    if rows.is_empty() {
        StreamsError::UnknownSubscription(format!("(id {id})")).raise();
    }
    Ok(rows.first().get::<i64>(1)?.unwrap_or(0))
}

/// How far the chunk's events are processed: its progress row, or the
/// position. Both from one snapshot: a concurrent fold moves the position
/// over the chunk and deletes its row in one transaction.
fn processed_through(client: &mut SpiClient<'_>, id: i32, chunk: i64) -> SpiResult<i64> {
    with_latest_snapshot(|| {
        let rows = client.select(
            "SELECT GREATEST(s.position, (SELECT p.done_through FROM streams.subscription_progress p
                                          WHERE p.subscription = s.id AND p.chunk = $2))
             FROM streams.subscription_state s WHERE s.id = $1",
            None,
            &[id.into(), chunk.into()],
        )?;
        if rows.is_empty() {
            StreamsError::UnknownSubscription(format!("(id {id})")).raise();
        }
        Ok(rows.first().get::<i64>(1)?.unwrap_or(0))
    })
}

/// Run reads with a snapshot taken now, not the calling statement's: after
/// taking a claim's lock, the last holder's ack must be seen. (Once the
/// transaction has written, SPI takes a fresh snapshot per statement under
/// read committed anyway; unordered polls refuse snapshot isolation.)
fn with_latest_snapshot<R>(body: impl FnOnce() -> R) -> R {
    // SAFETY: a plain call that returns a snapshot owned by the snapshot manager.
    wait::with_active_snapshot(unsafe { pg_sys::GetLatestSnapshot() }, body)
}

/// The subscription named `name` that the caller may use, or raise.
fn open(name: &str) -> Subscription {
    let subscription = find(name).unwrap_or_else(|| StreamsError::UnknownSubscription(name.to_owned()).raise());
    check_member(&subscription);
    subscription
}

/// A webhook's subscription is consumed by the webhook worker alone: a
/// poll or ack of its own would take events from it.
fn refuse_webhook(subscription: &Subscription) {
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
        ordered: first.ordered,
        owner: first.owner,
        webhook: first.webhook,
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
    as_owner(|client| {
        let rows = with_latest_snapshot(|| {
            client.select(
                "SELECT s.id, s.stream, s.ordered, s.owner::oid, s.owner::text,
                        EXISTS (SELECT FROM streams.webhook_state w WHERE w.subscription = s.id),
                        s.owner::oid = $2 AS own,
                        pg_catalog.pg_has_role($2, s.owner::oid, 'USAGE') AS member
                 FROM streams.subscription_state s WHERE s.name = $1
                 ORDER BY own DESC, member DESC, s.id",
                None,
                &[name.into(), caller.into()],
            )
        })?;
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
/// its temporary schema must never be found.
pub(crate) fn as_owner<R>(body: impl FnOnce(&mut SpiClient<'_>) -> SpiResult<R>) -> R {
    let owner = publish::log_owner(publish::position_sequence());
    crate::log::kept_plan::with_pinned_search_path(|| privileges::as_owner(owner, || Spi::connect_mut(body)))
        .unwrap_or_else(|e| StreamsError::Spi { doing: "a subscription statement", error: e.to_string() }.raise())
}

type SpiResult<T> = Result<T, pgrx::spi::Error>;
