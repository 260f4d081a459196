//! Subscriptions ordered per key: the events of one key (a path into the
//! data, or the stream) are processed in position order, one transaction
//! at a time; events of different keys go to competing consumers in
//! parallel.
//!
//! * `position`: every event at or below it is processed. Above it,
//!   `streams.subscription_keys` holds, per key, the last processed event
//!   of that key: an event is processed when it is at or below either.
//! * A key is claimed with a lock named by its hash (claims.rs, `Key::Keyed`),
//!   taken without waiting and held until the transaction ends. After taking
//!   it, a poll reads the key's first unprocessed event with a fresh
//!   snapshot: the previous holder's ack, committed before it let go, is
//!   seen. Two keys with the same hash share a lock: still in order, fewer
//!   in parallel.
//! * A nacked event holds its key until it is due; a parked one holds it
//!   until it is retried or discarded, unless the subscription says
//!   `on_dead_letter => 'skip'`. Other keys go on.
//! * An ack records each claimed key's last processed event, and moves
//!   `position` over the processed prefix (one transaction at a time:
//!   the others skip it), dropping the key rows below it.
//!
//! Each event is a delivery of its own for the attempt counts (ranges of
//! consecutive positions are merged), at most [`MAX_RUNS`] per poll.

use std::collections::HashMap;

use crate::log::kept_plan::KeptStatements;
use pgrx::datum::DatumWithOid;
use pgrx::spi::{SpiClient, SpiResult};

use super::claims::{self, Hold, Key};
use super::failures::{self, Head};
use super::poll::Polled;
use super::reads::with_latest_snapshot;
use super::Subscription;
use crate::error::StreamsError;
use crate::shmem::DELIVERY_RANGES;
use litebase_streams_core::keys::{bounded_key, key_hash};
use pgrx::prelude::*;

/// The most runs of consecutive positions one poll claims (each a range of
/// the delivery the worker writes down).
pub(super) const MAX_RUNS: usize = DELIVERY_RANGES;

/// `streams._bounded_key(key)`: a key as subscriptions keep it, itself up
/// to 200 bytes, else its digest (core's `bounded_key`). In Rust, not SQL:
/// a SQL body that names its argument three times is not inlined, and
/// running it per scanned event cost more than all the rest of a poll.
#[pg_extern(sql = false, immutable, strict, parallel_safe)]
fn _bounded_key(key: &str) -> String {
    bounded_key(key).into_owned()
}

/// The subscription's unprocessed events after `after` (its position) up
/// to `upto`, with their keys: at most `limit`, in order.
fn window(
    client: &mut SpiClient<'_>,
    sub: &Subscription,
    after: i64,
    upto: i64,
    limit: i64,
) -> SpiResult<Vec<(i64, String)>> {
    let (filter, values) = sub.events_condition(6);
    // In position order from `after` (the position, read just before: a
    // fold committed in between only makes some events look unprocessed,
    // and a poll checks each key's first one again after locking it), so
    // that the scan stops at the limit.
    // Each event's key computed once (OFFSET 0: the lateral subquery is not
    // flattened into its two uses), the events scanned in position order.
    let sql = format!(
        "SELECT e.position, k.key
         FROM streams.event_log e
         CROSS JOIN LATERAL (SELECT streams._event_key($5, e.stream, e.data, e.key) AS key OFFSET 0) k
         WHERE e.position > $1 AND e.position <= $2 {filter}
           AND NOT EXISTS (SELECT FROM streams.subscription_keys s
                           WHERE s.subscription = $4 AND s.key = k.key AND s.position >= e.position)
         ORDER BY e.position LIMIT $3"
    );
    let key_path = sub.key_path.clone().unwrap_or_default();
    let mut args: Vec<DatumWithOid> = vec![after.into(), upto.into(), limit.into(), sub.id.into(), key_path.into()];
    args.extend(values.into_iter().map(DatumWithOid::from));
    with_latest_snapshot(|| {
        client
            .select_kept(sql.as_str(), None, &args)?
            .map(|row| Ok((row.get::<i64>(1)?.unwrap_or(0), row.get::<String>(2)?.unwrap_or_default())))
            .collect()
    })
}

/// Due dead letters put back whose events are processed for their key.
fn put_backs(client: &mut SpiClient<'_>, sub: &Subscription) -> SpiResult<Vec<(i64, String)>> {
    let key_path = sub.key_path.clone().unwrap_or_default();
    let args: [DatumWithOid; 2] = [sub.id.into(), key_path.into()];
    with_latest_snapshot(|| {
        client
            .select_kept(
                "SELECT f.position, streams._event_key($2, e.stream, e.data, e.key)
                 FROM streams.subscription_failures f
                 JOIN streams.event_log e ON e.position = f.position
                 CROSS JOIN (SELECT s.position AS low FROM streams.subscription_state s WHERE s.id = $1) s
                 LEFT JOIN streams.subscription_keys k
                        ON k.subscription = $1 AND k.key = streams._event_key($2, e.stream, e.data, e.key)
                 WHERE f.subscription = $1 AND f.parked_at IS NULL
                   AND (f.retry_at IS NULL OR f.retry_at <= pg_catalog.clock_timestamp())
                   AND (f.position <= s.low OR f.position <= k.position)
                 ORDER BY f.position LIMIT 16",
                None,
                &args,
            )?
            .map(|row| Ok((row.get::<i64>(1)?.unwrap_or(0), row.get::<String>(2)?.unwrap_or_default())))
            .collect()
    })
}

/// The first unprocessed event of each of `keys` among the `window`'s
/// events (all of the subscription's events unprocessed when it was read,
/// in order), judged by how far the subscription and each key are
/// processed as read now, with a snapshot taken after their locks: the
/// previous holder's ack is seen. Nothing new appears inside the window
/// (it lies below the horizon), and what was processed stays processed.
fn heads(
    client: &mut SpiClient<'_>,
    sub: &Subscription,
    keys: &[String],
    window: &[(i64, String)],
) -> SpiResult<HashMap<String, i64>> {
    if keys.is_empty() {
        return Ok(HashMap::new());
    }
    // One statement, one snapshot: a fold moves the position and drops the
    // key rows below it in one transaction.
    let args: [DatumWithOid; 2] = [sub.id.into(), keys.to_vec().into()];
    let rows: Vec<(i64, Option<String>, Option<i64>)> = with_latest_snapshot(|| {
        client
            .select_kept(
                "SELECT s.position, k.key, k.position FROM streams.subscription_state s
                 LEFT JOIN streams.subscription_keys k ON k.subscription = s.id AND k.key = ANY ($2)
                 WHERE s.id = $1",
                None,
                &args,
            )?
            .map(|row| -> SpiResult<_> {
                Ok((row.get::<i64>(1)?.unwrap_or(0), row.get::<String>(2)?, row.get::<i64>(3)?))
            })
            .collect::<SpiResult<_>>()
    })?;
    let Some(&(low, _, _)) = rows.first() else { StreamsError::UnknownSubscription(sub.name.clone()).raise() };
    let done: HashMap<String, i64> =
        rows.into_iter().filter_map(|(_, key, position)| Some((key?, position.unwrap_or(i64::MIN)))).collect();
    let mut heads = HashMap::with_capacity(keys.len());
    for (position, key) in window {
        let processed_through = done.get(key).copied().unwrap_or(i64::MIN).max(low);
        if *position > processed_through && keys.contains(key) && !heads.contains_key(key) {
            heads.insert(key.clone(), *position);
        }
    }
    Ok(heads)
}

/// The events of `key` at or below `position` are processed (or settled
/// as dead letters skipped, or discarded), in the calling transaction.
fn processed_through(client: &mut SpiClient<'_>, sub: i32, key: &str, position: i64) -> SpiResult<()> {
    let args: [DatumWithOid; 3] = [sub.into(), key.into(), position.into()];
    client.update_kept(
        "INSERT INTO streams.subscription_keys AS k (subscription, key, position) VALUES ($1, $2, $3)
         ON CONFLICT (subscription, key) DO UPDATE SET position = GREATEST(k.position, excluded.position)",
        None,
        &args,
    )?;
    Ok(())
}

/// What a key found in the window calls for in this poll.
enum Verdict {
    /// Claim its events from this one on.
    From(i64),
    Blocked,
}

/// Claim the next events of keys no other transaction holds.
pub(super) fn poll(client: &mut SpiClient<'_>, sub: &Subscription, horizon: i64, max: i64) -> SpiResult<Polled> {
    // Shared: other pollers go on; a seek or drop in progress keeps us out.
    if !claims::try_lock(sub.id, Key::Token, Hold::Shared) {
        return Ok(Polled::default());
    }
    let held = claims::chunks_claimed();
    if held >= claims::MAX_CHUNKS_PER_TRANSACTION {
        StreamsError::TooManyClaims { subscription: sub.name.clone(), chunks: held }.raise();
    }
    let lockable = claims::MAX_CHUNKS_PER_TRANSACTION - held;
    let mine: Vec<claims::Claim> = claims::of(sub.id);
    let already = |position: i64| mine.iter().any(|c| c.low < position && position <= c.high);
    // Dead letters put back lie below their key's processed event: first,
    // each alone, as in an ordered subscription.
    for (position, key) in put_backs(client, sub)? {
        let hash = key_hash(&key);
        if already(position) {
            continue;
        }
        let held = mine.iter().any(|c| c.key == Key::Keyed(hash));
        if held || claims::try_lock(sub.id, Key::Keyed(hash), Hold::Exclusive) {
            if !failures::still_due(client, sub.id, position)? {
                // Processed by the consumer that held its key.
                if !held {
                    claims::unlock(sub.id, Key::Keyed(hash), Hold::Exclusive);
                }
                continue;
            }
            if let Head::Park { attempts } = failures::head(client, sub, position)? {
                failures::park(client, sub.id, position, attempts, None)?;
                continue;
            }
            claims::add(sub.id, Key::Keyed(hash), position - 1, position, 1);
            return Ok(Polled { ranges: vec![(position - 1, 1, position)], ..Polled::default() });
        }
    }
    let position = super::reads::read_position(client, sub.id)?;
    let window = window(client, sub, position, horizon, (max * 4).clamp(256, 10_000))?;
    // Pass 1: the keys this poll may claim, in window order.
    let mut candidates: Vec<String> = Vec::new();
    let mut locked_here: Vec<u32> = Vec::new();
    let mut refused: Vec<String> = Vec::new();
    let mut events_of_candidates = 0;
    for (position, key) in &window {
        if already(*position) {
            continue;
        }
        if candidates.contains(key) {
            events_of_candidates += 1;
            continue;
        }
        if refused.contains(key) || events_of_candidates >= max {
            continue;
        }
        let hash = key_hash(key);
        let held_by_me = mine.iter().any(|c| c.key == Key::Keyed(hash)) || locked_here.contains(&hash);
        if held_by_me
            || (locked_here.len() < lockable.min(MAX_RUNS)
                && claims::try_lock(sub.id, Key::Keyed(hash), Hold::Exclusive))
        {
            if !held_by_me {
                locked_here.push(hash);
            }
            candidates.push(key.clone());
            events_of_candidates += 1;
        } else {
            refused.push(key.clone());
        }
    }
    // Each candidate's first unprocessed event, seen after its lock: only
    // the window's events can be claimed, so only the window is searched.
    let mut verdicts: HashMap<String, Verdict> = HashMap::new();
    let mut due_in = None;
    let mut wrote = false;
    let mut heads = heads(client, sub, &candidates, &window)?;
    for key in &candidates {
        let mut head = heads.remove(key);
        let verdict = loop {
            let Some(position) = head else { break Verdict::Blocked };
            if already(position) {
                break Verdict::From(position);
            }
            match failures::head(client, sub, position)? {
                Head::Deliver => break Verdict::From(position),
                Head::Wait(wait) => {
                    due_in = Some(due_in.map_or(wait, |d: std::time::Duration| d.min(wait)));
                    break Verdict::Blocked;
                }
                verdict @ (Head::Park { .. } | Head::Parked) => {
                    if let Head::Park { attempts } = verdict {
                        failures::park(client, sub.id, position, attempts, None)?;
                        wrote = true;
                    }
                    if !sub.skip_dead_letters {
                        break Verdict::Blocked; // ordered per key means ordered
                    }
                    processed_through(client, sub.id, key, position)?;
                    wrote = true;
                    head = self::heads(client, sub, std::slice::from_ref(key), &window)?.remove(key);
                }
            }
        };
        verdicts.insert(key.clone(), verdict);
    }
    // Pass 2: claim in window order.
    let mut claimed: Vec<(i64, u32)> = Vec::new();
    let mut runs = 0;
    for (position, key) in &window {
        if claimed.len() as i64 >= max {
            break;
        }
        let Some(Verdict::From(from)) = verdicts.get(key) else { continue };
        if *position < *from || already(*position) {
            continue;
        }
        let continues_run = claimed.last().is_some_and(|&(last, _)| last + 1 == *position);
        if !continues_run {
            if runs == MAX_RUNS {
                break;
            }
            runs += 1;
        }
        claimed.push((*position, key_hash(key)));
    }
    for hash in &locked_here {
        if !wrote && !claimed.iter().any(|c| c.1 == *hash) {
            claims::unlock(sub.id, Key::Keyed(*hash), Hold::Exclusive);
        }
    }
    if claimed.is_empty() {
        if !wrote && mine.is_empty() {
            claims::unlock(sub.id, Key::Token, Hold::Shared);
        }
        return Ok(Polled { due_in, ..Polled::default() });
    }
    let mut ranges: Vec<(i64, i64, i64)> = Vec::new();
    for &(position, hash) in &claimed {
        claims::add(sub.id, Key::Keyed(hash), position - 1, position, 1);
        match ranges.last_mut() {
            Some(run) if run.2 + 1 == position => {
                run.1 += 1;
                run.2 = position;
            }
            _ => ranges.push((position - 1, 1, position)),
        }
    }
    Ok(Polled { ranges, ..Polled::default() })
}

/// `ack(through)` of a subscription ordered per key: the claimed events up
/// to `through` are processed, except, per key, from the first one this
/// transaction nacked on; then the position moves over the processed prefix.
pub(super) fn ack(client: &mut SpiClient<'_>, sub: &Subscription, through: i64, horizon: i64) -> SpiResult<()> {
    let mut claimed: Vec<i64> =
        claims::of(sub.id).iter().filter(|c| matches!(c.key, Key::Keyed(_))).map(|c| c.high).collect();
    claimed.sort_unstable();
    claimed.dedup();
    let nacked = claims::nacked(sub.id);
    let mut positions: Vec<i64> = claimed.iter().copied().filter(|&p| p <= through).collect();
    positions.extend(nacked.iter().copied());
    positions.sort_unstable();
    positions.dedup();
    // Per key, in position order: processed until the first nacked event.
    let mut stopped: Vec<String> = Vec::new();
    let mut last_processed: HashMap<String, i64> = HashMap::new();
    let mut processed: Vec<i64> = Vec::with_capacity(positions.len());
    for (position, key) in keys_of(client, sub, &positions)? {
        if stopped.contains(&key) || nacked.contains(&position) || position > through {
            stopped.push(key);
            continue;
        }
        processed.push(position);
        last_processed.insert(key, position);
    }
    let (keys, lasts): (Vec<String>, Vec<i64>) = last_processed.into_iter().unzip();
    let args: [DatumWithOid; 3] = [sub.id.into(), keys.into(), lasts.into()];
    client.update_kept(
        "INSERT INTO streams.subscription_keys AS k (subscription, key, position)
         SELECT $1, u.key, u.position FROM ROWS FROM (pg_catalog.unnest($2::text[]), pg_catalog.unnest($3::bigint[]))
              AS u(key, position)
         ON CONFLICT (subscription, key) DO UPDATE SET position = GREATEST(k.position, excluded.position)",
        None,
        &args,
    )?;
    // Each processed event's attempts and failures are settled. The claims
    // are single events, merged here into runs of consecutive positions:
    // the worker wrote each delivered run down as segments inside it. A run
    // of processed events only goes at once; one with an event that stays
    // (nacked, or after a nacked one of its key) is cut around it.
    let unprocessed: Vec<i64> = claimed.iter().copied().filter(|p| processed.binary_search(p).is_err()).collect();
    let mut runs = Vec::new();
    for run in runs_of(&claimed) {
        if unprocessed.iter().any(|&p| p > run.0 && p <= run.1) {
            super::attempts::settle(client, sub.id, run.0, run.1, &unprocessed)?;
        } else {
            runs.push(run);
        }
    }
    let (lows, highs): (Vec<i64>, Vec<i64>) = runs.iter().copied().unzip();
    let args: [DatumWithOid; 4] = [sub.id.into(), lows.into(), highs.into(), processed.clone().into()];
    client.update_kept(
        "WITH settled AS (
             DELETE FROM streams.subscription_deliveries d
             USING ROWS FROM (pg_catalog.unnest($2::bigint[]), pg_catalog.unnest($3::bigint[])) AS r(low, high)
             WHERE d.subscription = $1 AND d.high > r.low AND d.high <= r.high AND d.low >= r.low
         )
         DELETE FROM streams.subscription_failures f
         WHERE f.subscription = $1 AND f.parked_at IS NULL AND f.position = ANY ($4::bigint[])",
        None,
        &args,
    )?;
    fold(client, sub, horizon)
}

/// `(after, through]` runs of consecutive positions (sorted input).
fn runs_of(positions: &[i64]) -> Vec<(i64, i64)> {
    let mut runs: Vec<(i64, i64)> = Vec::new();
    for &position in positions {
        match runs.last_mut() {
            Some(run) if run.1 + 1 == position => run.1 = position,
            _ => runs.push((position - 1, position)),
        }
    }
    runs
}

/// The keys of the events at `positions`, in position order.
fn keys_of(client: &mut SpiClient<'_>, sub: &Subscription, positions: &[i64]) -> SpiResult<Vec<(i64, String)>> {
    let key_path = sub.key_path.clone().unwrap_or_default();
    let args: [DatumWithOid; 2] = [positions.to_vec().into(), key_path.into()];
    client
        .select_kept(
            "SELECT e.position, streams._event_key($2, e.stream, e.data, e.key) FROM streams.event_log e
             WHERE e.position = ANY ($1) ORDER BY e.position",
            None,
            &args,
        )?
        .map(|row| Ok((row.get::<i64>(1)?.unwrap_or(0), row.get::<String>(2)?.unwrap_or_default())))
        .collect()
}

/// Move the position over the processed prefix and drop the key rows
/// below it (those no other transaction is writing). Skipped while another
/// transaction does it.
fn fold(client: &mut SpiClient<'_>, sub: &Subscription, horizon: i64) -> SpiResult<()> {
    let position = super::reads::read_position(client, sub.id)?;
    let first = window(client, sub, position, horizon, 1)?;
    let done_through = first.first().map_or(horizon, |(p, _)| p - 1);
    let args: [DatumWithOid; 2] = [sub.id.into(), done_through.into()];
    client.update_kept(
        "WITH mine AS (
             SELECT s.id FROM streams.subscription_state s
             WHERE s.id = $1 AND s.position < $2 FOR NO KEY UPDATE SKIP LOCKED
         ), below AS (
             -- Rows another transaction's ack is writing stay for a later
             -- fold (a row at or below the position is merely redundant):
             -- waiting for them could deadlock with that ack.
             SELECT k.key FROM streams.subscription_keys k, mine
             WHERE k.subscription = mine.id AND k.position <= $2
             FOR UPDATE OF k SKIP LOCKED
         ), folded AS (
             DELETE FROM streams.subscription_keys k USING below
             WHERE k.subscription = $1 AND k.key = below.key
         )
         UPDATE streams.subscription_state s SET position = $2, last_ack_at = pg_catalog.now()
         FROM mine WHERE s.id = mine.id",
        None,
        &args,
    )?;
    Ok(())
}

/// After a nack in a new transaction, or a dead letter's discard: take the
/// key of the event at `position` (false: another transaction holds it).
pub(super) fn lock_key_of(client: &mut SpiClient<'_>, sub: &Subscription, position: i64) -> SpiResult<Option<String>> {
    let Some((_, key)) = keys_of(client, sub, &[position])?.into_iter().next() else { return Ok(None) };
    if claims::try_lock(sub.id, Key::Keyed(key_hash(&key)), Hold::Exclusive) {
        Ok(Some(key))
    } else {
        Ok(None)
    }
}

/// A discarded dead letter that held its key: the key goes on after it.
pub(super) fn discarded(client: &mut SpiClient<'_>, sub: &Subscription, positions: &[i64]) -> SpiResult<()> {
    for (position, key) in keys_of(client, sub, positions)? {
        processed_through(client, sub.id, &key, position)?;
    }
    Ok(())
}
