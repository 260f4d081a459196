//! Polling: what an ordered subscription's token holder or an unordered
//! subscription's consumers claim next, read with a snapshot taken after
//! their claim's lock, and the acked chunks folded into the position.

use crate::log::kept_plan::KeptStatements;
use pgrx::datum::DatumWithOid;
use pgrx::spi::{SpiClient, SpiResult};

use std::time::Duration;

use super::claims::{self, Hold, Key, CHUNK_WIDTH};
use super::failures::{self, Head};
use super::reads::{read_position, with_latest_snapshot};
use super::{attempts, wait};
use super::{Subscription, MAX_CHUNKS_PER_POLL};
use crate::error::StreamsError;

/// What a poll claimed: `(after, count, through)` ranges, and, when it
/// found nothing to deliver, how soon a nacked event falls due.
#[derive(Default)]
pub(super) struct Polled {
    pub ranges: Vec<(i64, i64, i64)>,
    pub due_in: Option<Duration>,
    /// Leased: the token this poll took, to give back once the lease is
    /// written down (the events are claimed by the lease, not the transaction).
    pub release_token: bool,
}

/// An ordered subscription: one transaction at a time holds its token. The
/// holder continues after what it claimed; a new holder starts at the
/// position, read after it got the token (so it sees the last holder's ack).
/// With `attempts` (a database at 0.3.0), the token holder first delivers
/// a dead letter put back, parks an event at the head whose attempts are
/// used up, and waits for one nacked there.
pub(super) fn poll_ordered(
    client: &mut SpiClient<'_>,
    sub: &Subscription,
    horizon: i64,
    max: i64,
    attempts: bool,
    leased: bool,
) -> SpiResult<Polled> {
    let (mut start, newly_locked) = match claims::claimed_through(sub.id, Key::Token) {
        Some(through) => (through, false),
        None if claims::try_lock(sub.id, Key::Token, Hold::Exclusive) => (read_position(client, sub.id)?, true),
        None => return Ok(Polled::default()),
    };
    let unlock = |wrote: bool| {
        if newly_locked && !wrote {
            claims::unlock(sub.id, Key::Token, Hold::Exclusive); // claimed nothing: the next poller may go on
        }
    };
    let (mut count, mut first, mut last) = next_events(client, sub, start, horizon, max)?;
    let put_back = if attempts { failures::due_put_back(client, sub.id, start)? } else { None };
    if last.is_none() && put_back.is_none() {
        let due_in = if attempts { failures::next_put_back(client, sub.id, start)? } else { None };
        unlock(false);
        return Ok(Polled { due_in, ..Polled::default() });
    }
    if newly_locked {
        // Lock the row the ack updates (no other poller waits on it: they
        // wait for the token). Under repeatable read this fails with 40001
        // if the position moved since the transaction's snapshot.
        let rows = client.update_kept(
            "SELECT s.position FROM streams.subscription_state s WHERE s.id = $1 FOR NO KEY UPDATE",
            None,
            &[sub.id.into()],
        )?;
        let locked = super::reads::first_value::<i64>(rows)?;
        if locked != Some(start) {
            // A seek committed in between: start again from its position.
            claims::unlock(sub.id, Key::Token, Hold::Exclusive);
            return poll_ordered(client, sub, horizon, max, attempts, leased);
        }
    }
    if !attempts {
        claims::add(sub.id, Key::Token, start, last.unwrap_or(start), count);
        return Ok(Polled { ranges: vec![(start, count, last.unwrap_or(start))], ..Polled::default() });
    }
    // What this poll claims: for the transaction, or for a lease.
    let claimed = |key, after, through, count, wrote: bool| {
        if !leased {
            claims::add(sub.id, key, after, through, count);
        }
        Polled { ranges: vec![(after, count, through)], due_in: None, release_token: leased && newly_locked && !wrote }
    };
    // Put-back dead letters first, one at a time, each a delivery of its own.
    if let Some(event) = put_back {
        match failures::head(client, sub, event)? {
            Head::Park { attempts } => {
                failures::park(client, sub.id, event, attempts, None)?;
                return Ok(Polled { due_in: Some(Duration::ZERO), ..Polled::default() });
            }
            Head::Wait(due_in) => {
                // Leased to a consumer.
                unlock(false);
                return Ok(Polled { due_in: Some(due_in), ..Polled::default() });
            }
            Head::Deliver | Head::Parked => return Ok(claimed(Key::PutBack, event - 1, event, 1, false)),
        }
    }
    let mut wrote = false;
    while let Some(head) = first {
        match failures::head(client, sub, head)? {
            Head::Deliver => break,
            Head::Wait(due_in) => {
                unlock(wrote);
                return Ok(Polled { due_in: Some(due_in), ..Polled::default() });
            }
            verdict @ (Head::Park { .. } | Head::Parked) => {
                if let Head::Park { attempts } = verdict {
                    failures::park(client, sub.id, head, attempts, None)?;
                }
                // Settled: the subscription moves past it, in this transaction.
                client.update_kept(
                    "UPDATE streams.subscription_state SET position = GREATEST(position, $2) WHERE id = $1",
                    None,
                    &[sub.id.into(), head.into()],
                )?;
                failures::forget_discarded(client, sub.id, head)?;
                wrote = true;
                start = head;
                (count, first, last) = next_events(client, sub, start, horizon, max)?;
            }
        }
    }
    let Some(mut last) = last else {
        unlock(wrote);
        return Ok(Polled::default());
    };
    let head = first.unwrap_or(last);
    if let Some(failing) = failures::first_failing(client, sub.id, head, last)? {
        // The head is fine (above); the delivery stops before the next
        // failing event, which comes at the head in its turn.
        let (n, _, through) = next_events(client, sub, start, failing - 1, max)?;
        count = n;
        last = through.unwrap_or(head);
    }
    Ok(claimed(Key::Token, start, last, count, wrote))
}

/// Whether the event at `position` is one of the subscription's: final,
/// and of a stream its pattern selects.
pub(super) fn is_event_of(client: &mut SpiClient<'_>, sub: &Subscription, position: i64) -> SpiResult<bool> {
    let horizon = wait::horizon_seen_by_transaction();
    Ok(position <= horizon && next_events(client, sub, position - 1, position, 1)?.0 == 1)
}

/// An unordered subscription: take the lowest events of chunks no other
/// transaction holds, at most [`MAX_CHUNKS_PER_POLL`] chunks. With
/// `attempts` (a database at 0.3.0), failed events that are due again
/// come first, each a delivery of its own, and a chunk's events stop
/// before one that must not be delivered yet (see [`Blocker`]).
pub(super) fn poll_unordered(
    client: &mut SpiClient<'_>,
    sub: &Subscription,
    horizon: i64,
    max: i64,
    attempts: bool,
) -> SpiResult<Polled> {
    // Shared: other pollers go on; a seek or drop in progress keeps us out.
    if !claims::try_lock(sub.id, Key::Token, Hold::Shared) {
        return Ok(Polled::default());
    }
    let mut ranges = if attempts { unordered_put_backs(client, sub, max)? } else { Vec::new() };
    if ranges.is_empty() {
        ranges = poll_chunks(client, sub, horizon, max, attempts)?;
    }
    if ranges.is_empty() {
        claims::unlock(sub.id, Key::Token, Hold::Shared);
        let due_in = if attempts { failures::next_retry(client, sub.id)? } else { None };
        return Ok(Polled { due_in, ..Polled::default() });
    }
    Ok(Polled { ranges, ..Polled::default() })
}

/// Failed events an ack moved past (nacked, or dead letters put back)
/// that are due: each claimed under its chunk's lock, at most `max`.
fn unordered_put_backs(client: &mut SpiClient<'_>, sub: &Subscription, max: i64) -> SpiResult<Vec<(i64, i64, i64)>> {
    let mine = claims::of(sub.id);
    let mut ranges = Vec::new();
    for event in failures::due_unordered(client, sub.id, max.min(MAX_CHUNKS_PER_POLL as i64))? {
        if mine.iter().any(|c| c.low < event && event <= c.high) {
            continue; // polled by this transaction already
        }
        let chunk = Key::Chunk(claims::chunk_of(event));
        let held = claims::claimed_through(sub.id, chunk).is_some();
        if !held && !claims::try_lock(sub.id, chunk, Hold::Exclusive) {
            continue;
        }
        let let_go = || {
            if !held {
                claims::unlock(sub.id, chunk, Hold::Exclusive);
            }
        };
        if !failures::still_due(client, sub.id, event)? {
            let_go(); // processed by the consumer that held it
            continue;
        }
        match failures::head(client, sub, event)? {
            // Written: the lock stays until this transaction ends.
            Head::Park { attempts } => failures::park(client, sub.id, event, attempts, None)?,
            Head::Deliver => {
                claims::add(sub.id, Key::PutBack, event - 1, event, 1);
                ranges.push((event - 1, 1, event));
            }
            Head::Parked | Head::Wait(_) => let_go(),
        }
    }
    Ok(ranges)
}

/// What stops a run of a chunk's events in an unordered subscription: a
/// failed event waiting for its retry time, parked or discarded (moved
/// past at the head of the run: it comes again as a put-back, or never),
/// or one whose attempts are used up (parked at the head).
enum Blocker {
    Settled(i64),
    Spent(i64, i32),
}

impl Blocker {
    fn position(&self) -> i64 {
        match self {
            Blocker::Settled(p) | Blocker::Spent(p, _) => *p,
        }
    }
}

/// The first blocker among `events` (in order, in `(low, last]`).
fn first_blocker(client: &mut SpiClient<'_>, sub: &Subscription, events: &[i64]) -> SpiResult<Option<Blocker>> {
    let (Some(&first), Some(&last)) = (events.first(), events.last()) else { return Ok(None) };
    let settled = failures::first_failing(client, sub.id, first - 1, last)?;
    let mut spent = None;
    if let Some(max) = sub.max_attempts {
        let upto = settled.unwrap_or(last);
        attempts::await_earlier_deliveries(sub.id, &[(first - 1, upto)]);
        for segment in attempts::overlapping(client, sub.id, first - 1, upto)? {
            if segment.attempts >= max {
                if let Some(&event) = events.iter().find(|&&e| segment.low < e && e <= segment.high) {
                    spent = Some(Blocker::Spent(event, segment.attempts));
                    break;
                }
            }
        }
    }
    Ok(match (settled, spent) {
        (Some(p), Some(s)) if s.position() < p => Some(s),
        (Some(p), _) => Some(Blocker::Settled(p)),
        (None, s) => s,
    })
}

/// Cut a chunk's run of `events` after `low` before its first blocker,
/// moving the chunk's progress past blockers at its head (parking the
/// spent ones) in this transaction: `(low, events)` left to claim.
fn unblocked_run(
    client: &mut SpiClient<'_>,
    sub: &Subscription,
    chunk: i64,
    mut low: i64,
    mut events: Vec<i64>,
) -> SpiResult<(i64, Vec<i64>)> {
    while let Some(blocker) = first_blocker(client, sub, &events)? {
        let at = blocker.position();
        if events.first().is_some_and(|&e| e < at) {
            events.retain(|&e| e < at);
            break;
        }
        if let Blocker::Spent(event, attempts) = blocker {
            failures::park(client, sub.id, event, attempts, None)?;
        }
        low = at;
        events.retain(|&e| e > at);
        let args: [DatumWithOid; 3] = [sub.id.into(), chunk.into(), low.into()];
        client.update_kept(
            "INSERT INTO streams.subscription_progress AS p (subscription, chunk, done_through, acked_at)
             VALUES ($1, $2, $3, pg_catalog.now())
             ON CONFLICT (subscription, chunk) DO UPDATE SET done_through = GREATEST(p.done_through, excluded.done_through)",
            None,
            &args,
        )?;
    }
    Ok((low, events))
}

fn poll_chunks(
    client: &mut SpiClient<'_>,
    sub: &Subscription,
    horizon: i64,
    max: i64,
    attempts: bool,
) -> SpiResult<Vec<(i64, i64, i64)>> {
    let held = claims::chunks_claimed();
    if held >= claims::MAX_CHUNKS_PER_TRANSACTION {
        StreamsError::TooManyClaims { subscription: sub.name.clone(), chunks: held }.raise();
    }
    let lockable = MAX_CHUNKS_PER_POLL.min(claims::MAX_CHUNKS_PER_TRANSACTION - held);
    let position = read_position(client, sub.id)?;
    let page = (max * 2).max(100);
    // (chunk, low, the events taken), in the order first taken.
    let mut taken: Vec<(i64, i64, Vec<i64>)> = Vec::new();
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
                    taken.push((chunk, low, Vec::new()));
                    taken.len() - 1
                }
            };
            let entry = &mut taken[index];
            if event > entry.2.last().copied().unwrap_or(entry.1) {
                entry.2.push(event);
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
    for (chunk, low, events) in taken {
        let (low, events) = if attempts { unblocked_run(client, sub, chunk, low, events)? } else { (low, events) };
        let Some(&last) = events.last() else {
            if locked_here.contains(&chunk) {
                claims::unlock(sub.id, Key::Chunk(chunk), Hold::Exclusive);
            }
            continue;
        };
        let count = events.len() as i64;
        claims::add(sub.id, Key::Chunk(chunk), low, last, count);
        claimed.push((low, count, last));
    }
    claimed.sort_unstable();
    Ok(claimed)
}

/// Move the position of an unordered subscription over the events whose
/// chunks were acked (this transaction's acks included), and drop the
/// progress rows below it. From `ack`, not `poll`: the update holds the row
/// until the transaction ends, and a long poll that claimed nothing must not
/// (a seek would wait for it). Skipped while another transaction does it.
pub(super) fn fold_finished_chunks(client: &mut SpiClient<'_>, sub: &Subscription, horizon: i64) -> SpiResult<()> {
    let position = read_position(client, sub.id)?;
    let first = unprocessed_events(client, sub, position, horizon, 1)?;
    let done_through = first.first().map_or(horizon, |&p| p - 1).max(position);
    if claims::chunk_of(done_through + 1) <= claims::chunk_of(position + 1) {
        return Ok(());
    }
    let args: [DatumWithOid; 3] = [sub.id.into(), position.into(), done_through.into()];
    client.update_kept(
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
    // Discarded dead letters the position passed are settled for good.
    failures::forget_discarded(client, sub.id, done_through)
}

/// How many of the subscription's events `(after, upto]` holds, at most
/// `limit`, and the positions of the first and the last of them.
fn next_events(
    client: &mut SpiClient<'_>,
    sub: &Subscription,
    after: i64,
    upto: i64,
    limit: i64,
) -> SpiResult<(i64, Option<i64>, Option<i64>)> {
    let (sql, args) = events_query(sub, after, upto, limit, "");
    let sql =
        format!("SELECT pg_catalog.count(*), pg_catalog.min(n.position), pg_catalog.max(n.position) FROM ({sql}) n");
    with_latest_snapshot(|| {
        let rows = client.select_kept(sql.as_str(), None, &args)?;
        let row = rows.first();
        Ok((row.get::<i64>(1)?.unwrap_or(0), row.get::<i64>(2)?, row.get::<i64>(3)?))
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
        client.select_kept(sql.as_str(), None, &args)?.map(|row| row.get::<i64>(1).map(|p| p.unwrap_or(0))).collect()
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
    let (filter, values) = sub.events_condition(5);
    let sql = format!(
        "SELECT e.position FROM streams.event_log e
         WHERE e.position > $1 AND e.position <= $2 {filter} {extra}
         ORDER BY e.position LIMIT $3"
    );
    let mut args: Vec<DatumWithOid> = vec![after.into(), upto.into(), limit.into(), sub.id.into()];
    args.extend(values.into_iter().map(DatumWithOid::from));
    (sql, args)
}

/// How far the chunk's events are processed: its progress row, or the
/// position. Both from one snapshot: a concurrent fold moves the position
/// over the chunk and deletes its row in one transaction.
fn processed_through(client: &mut SpiClient<'_>, id: i32, chunk: i64) -> SpiResult<i64> {
    with_latest_snapshot(|| {
        let rows = client.select_kept(
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
