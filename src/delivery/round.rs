//! One delivery round of a database's worker: compute the horizon, record the
//! commit time of each newly final transaction, NOTIFY each newly final event
//! in position order, and persist the new horizon.
//!
//! # Visibility never waits for NOTIFY
//!
//! Normally a round does all of it in one transaction ([`Phase::Combined`]):
//! the notifications go out at that transaction's commit, so a client
//! receives an event only once `streams.events` shows it. But NOTIFY can fail
//! for reasons outside the database (any role can fill the cluster-wide
//! notification queue), and a failure aborts the whole transaction. So after
//! a failed round the worker splits the work: [`Phase::Visibility`] records
//! commit times and advances the horizon in a transaction that sends nothing,
//! and [`Phase::Notify`] sends what became visible but was not yet notified,
//! in position order, from the persisted `delivered` position. Readers keep
//! seeing new events while notifications fail; once they succeed again the
//! listeners receive every event late but in order and once, and the worker
//! returns to one transaction per round.
//!
//! # Memory
//!
//! A round holds at most `batch_size` events, and reads an event's data (and
//! its envelope's values) only when it can fit a notification: the size
//! comes from the stored datum's header (no detoasting), so a 200 MB event
//! costs the worker nothing (see bounded.rs).
//!
//! # The envelope
//!
//! Payloads carry an event's `type`, `key` and `headers` when it has them
//! (a private stream's only its `type`). The library also serves logs from
//! before the 0.3.0 update, which have no such columns: the round's
//! statements read them only when the log has them (checked each round).
//!
//! # Commit times are exact or marked
//!
//! A round records the commit time of each event it makes final in
//! `streams.commit_times` (commit_times.rs), from `pg_commit_ts`, which
//! VACUUM FREEZE truncates; a worker that falls behind long enough finds it
//! gone. Nothing can stop the truncation (a worker that is not running
//! cannot hold it back), so the event then gets the time the worker recorded
//! it, an upper bound, listed in the row's `inexact`, and the worker warns.
//! An event restored from a dump before it was recorded is treated the same
//! way: its `tx` belongs to the dumped cluster, and this cluster's commit
//! time for that id is another transaction's (the event's `xmin`, the
//! restore, tells them apart; see [`FETCH_NEW`]).
//!
//! # Eras
//!
//! Transaction ids are unique in one cluster, not across clusters. A log
//! restored into another cluster holds ids that cluster hands out again, so
//! the first round after such a restore (`horizon_state.system_identifier`
//! is another cluster's) starts a new era at the restored horizon;
//! `replay(from_tx => ..)` takes the newest transaction with an id. Commit
//! times are kept by position, which no restore repeats.
//!
//! # Two schema versions
//!
//! The library serves databases still at extension version 0.1.0 (until
//! `ALTER EXTENSION litebase_streams UPDATE`) with that version's statements:
//! no delivered position, no private streams, one transaction per round.

use std::cell::RefCell;
use std::ffi::CString;

use pgrx::prelude::*;
use pgrx::spi::{SpiClient, SpiResult};

use super::bounded::{jsonb_text, read_envelope};
use super::plans::{plans, Plans};
use crate::error::{SpiContext, StreamsError};
use crate::ffi;
use crate::log::catalog::{database_is_template, installed_schema, log_has_envelope, Schema};
use crate::log::commit_times::Recorder;
use crate::shmem;
use litebase_streams_core::horizon;
use litebase_streams_core::names::pattern_matches;
use litebase_streams_core::payload::{encode_payload, Event};

/// What a round does (see the module comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Combined,
    Visibility,
    Notify,
}

/// What a round did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// `horizon`: everything at or below it is visible; `delivered`:
    /// everything at or below it was notified; `newest`: the newest position
    /// allocated when the round began; `more`: the batch limit cut the round
    /// short; `sequence`: the log's `streams.position_seq`, which names the
    /// log (a re-created one has another).
    Done { horizon: i64, delivered: i64, newest: i64, more: bool, sequence: pg_sys::Oid },
    /// The extension is not installed in this database (any more).
    ExtensionGone,
    /// The database became a template: the worker leaves it.
    Template,
}

/// Run one round inside the caller's transaction (which has an active snapshot).
pub fn run(db: pg_sys::Oid, batch_size: i64, phase: Phase) -> Round {
    let Some((schema, log)) = installed_schema() else { return Round::ExtensionGone };
    if database_is_template() {
        return Round::Template;
    }
    // The lock on the log may have waited for an ALTER EXTENSION ... UPDATE:
    // a snapshot from before it would read the updated tables as they were
    // (a horizon_state row without the cluster's identifier looks restored).
    // SAFETY: in_transaction pushed the active snapshot this replaces; read
    // committed, so GetTransactionSnapshot takes a new one.
    unsafe {
        pg_sys::PopActiveSnapshot();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    let sequence = crate::log::publish::position_sequence();
    Spi::connect_mut(|client| deliver(client, db, batch_size, phase, schema, (log, sequence)))
        .context("a delivery round")
}

thread_local! {
    /// The ctid of the `horizon_state` version the last round wrote.
    static WRITTEN: RefCell<Option<String>> = const { RefCell::new(None) };
    static LAST_NOTIFIED: RefCell<LastNotified> = RefCell::new(LastNotified::default());
}

/// The last position the worker notified per stream, for the `prev` field of
/// payloads (a listener that saw another last position on that stream missed
/// something). Bounded: when full it starts over, and a stream it does not
/// know is looked up in the log.
#[derive(Default)]
struct LastNotified {
    /// The `streams.event_log` these positions belong to.
    log: pg_sys::Oid,
    by_stream: std::collections::HashMap<String, i64>,
}

const LAST_NOTIFIED_CAPACITY: usize = 10_000;

impl LastNotified {
    /// The previous event of `stream` before `position`: from memory when it
    /// is below `position` (an entry at or above it comes from an attempt
    /// that rolled back), else from the log.
    fn previous(&mut self, client: &SpiClient<'_>, plans: &Plans, stream: &str, position: i64) -> SpiResult<i64> {
        if let Some(&last) = self.by_stream.get(stream).filter(|&&last| last < position) {
            return Ok(last);
        }
        let row = client.select(&plans.previous, Some(1), &[stream.into(), position.into()])?.first();
        Ok(row.get::<i64>(1)?.unwrap_or(0))
    }

    fn record(&mut self, stream: &str, position: i64) {
        if !self.by_stream.contains_key(stream) && self.by_stream.len() >= LAST_NOTIFIED_CAPACITY {
            self.by_stream.clear();
        }
        self.by_stream.insert(stream.to_owned(), position);
    }
}

fn deliver(
    client: &mut SpiClient<'_>,
    db: pg_sys::Oid,
    batch_size: i64,
    phase: Phase,
    schema: Schema,
    (log, sequence): (pg_sys::Oid, pg_sys::Oid),
) -> SpiResult<Round> {
    let plans = plans(client, schema, log_has_envelope(log))?;
    let phase = if schema == Schema::V0_1 { Phase::Combined } else { phase };
    // Order matters (see litebase_streams_core::horizon): the newest allocated position first,
    // then the publishers' slots, then a fresh snapshot for the events.
    let written = WRITTEN.with(|w| w.borrow().clone());
    let at = match (&plans.read_state_at, written) {
        (Some(read_state_at), Some(ctid)) => Some(client.select(read_state_at, None, &[ctid.into()])?.first())
            .filter(|state| state.get::<i64>(1).ok().flatten().is_some()),
        _ => None,
    };
    let state = match at {
        Some(state) => state,
        None => client.select(&plans.read_state, None, &[])?.first(),
    };
    let read_at = state.get::<String>(6)?;
    let persisted_row = state.get::<i64>(1)?;
    let persisted = persisted_row.unwrap_or(0);
    let delivered = state.get::<i64>(2)?.unwrap_or(0);
    let max_allocated = state.get::<i64>(3)?.unwrap_or(0).max(0) as u64;
    let written_by = state.get::<i64>(4)?;
    let eras = Eras::read(schema, persisted_row.is_some(), written_by, state.get::<Vec<i64>>(5)?, persisted);
    let newest = max_allocated as i64;
    let held = shmem::held_positions(db);
    crate::log::hold::enforce(max_allocated, &held);
    let horizon = (horizon::compute(max_allocated, held.iter().map(|(_, low)| *low)) as i64).max(persisted);
    let idle = Round::Done { horizon: persisted, delivered, newest, more: false, sequence };
    match phase {
        _ if eras.restored => {}
        Phase::Combined | Phase::Visibility
            if horizon == persisted && (phase == Phase::Visibility || delivered == persisted) =>
        {
            return Ok(idle)
        }
        Phase::Notify if delivered >= persisted => return Ok(idle),
        _ => {}
    }
    // SAFETY: the worker's transaction pushed an active snapshot; replacing it
    // with a fresh one (taken after the slot scan) keeps the stack balanced.
    unsafe {
        pg_sys::PopActiveSnapshot();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }

    // Notifications behind the horizon (after a restore, or after a split
    // round) go out first, with the times recorded before.
    let catching_up = delivered < persisted && phase != Phase::Visibility;
    let (new_horizon, new_delivered, more) = match phase {
        Phase::Visibility => {
            let limit = batch_size * 10;
            let batch = Batch { after: persisted, upto: horizon, limit, new: true };
            let (last, more) = read_events(client, &plans, batch, None)?;
            (if more { last } else { horizon }, delivered, more)
        }
        Phase::Combined | Phase::Notify => {
            let private: Vec<String> =
                client.select(&plans.read_private, None, &[])?.first().get::<Vec<String>>(1)?.unwrap_or_default();
            let new = !catching_up && phase == Phase::Combined;
            let upto = if new { horizon } else { persisted };
            let batch = Batch { after: delivered, upto, limit: batch_size, new };
            let (sent_through, more) = read_events(client, &plans, batch, Some(Notify { log, private: &private }))?;
            let sent = if more { sent_through } else { upto };
            // After catching up, a combined round goes on at once.
            (sent.max(persisted), sent, more || (catching_up && phase == Phase::Combined))
        }
    };
    let bounds = (!eras.bounds.is_empty()).then_some(eras.bounds);
    let args = [
        new_horizon.into(),
        new_delivered.into(),
        eras.system_identifier.into(),
        bounds.into(),
        persisted_row.into(),
        written_by.into(),
        read_at.into(),
    ];
    let save = match &plans.save_first {
        Some(save_first) if persisted_row.is_none() => save_first,
        _ => &plans.save,
    };
    let saved = client.update(save, None, &args)?;
    if saved.is_empty() {
        StreamsError::HorizonStateChanged.raise();
    }
    // If the round fails after this, the version rolls back with it, and
    // the next round finds it invisible and looks the row up.
    let ctid = saved.first().get::<String>(1)?;
    WRITTEN.with(|w| *w.borrow_mut() = ctid);
    Ok(Round::Done { horizon: new_horizon, delivered: new_delivered, newest, more, sequence })
}

/// The eras of the log (see `horizon_state.era_bounds` in sql/streams.sql): a
/// log restored into another cluster carries transaction ids of that
/// cluster, which this one may hand out again, so the first round after such
/// a restore starts a new era at the restored horizon. Every event at or
/// below it was made final in the cluster that wrote it (a dump holds the
/// horizon and the commit times of one snapshot); every event above it is
/// made final here, in the new era.
struct Eras {
    /// The positions after which each later era begins.
    bounds: Vec<i64>,
    /// This cluster's, written with the horizon.
    system_identifier: i64,
    /// This round starts a new era.
    restored: bool,
}

impl Eras {
    fn read(schema: Schema, row_exists: bool, written_by: Option<i64>, bounds: Option<Vec<i64>>, horizon: i64) -> Eras {
        // SAFETY: reads a field of the control file copy in shared memory,
        // set at startup and never changed.
        let system_identifier = unsafe { pg_sys::GetSystemIdentifier() } as i64;
        let mut bounds = bounds.unwrap_or_default();
        // A row without a system identifier comes from a 0.1.0 dump (the
        // update to 0.2.0 and every later round write it).
        let restored = schema == Schema::Current && row_exists && written_by != Some(system_identifier);
        if restored {
            bounds.push(horizon);
            log!(
                "litebase_streams: this log was restored from another cluster; events after position {horizon} \
                 start era {} of its transaction ids",
                bounds.len()
            );
        }
        Eras { bounds, system_identifier, restored }
    }
}

/// Tell the operator that some events carry an inexact time (listed in
/// `streams.commit_times.inexact`).
fn warn_lost_commit_times(events: i64, after: i64, through: i64) {
    if events > 0 {
        StreamsError::CommitTimesLost { events, after, through }.warn();
    }
}

/// The events a round reads: `(after, upto]`, at most `limit`; `new`: above
/// the persisted horizon, so this round records their commit times.
#[derive(Clone, Copy)]
struct Batch {
    after: i64,
    upto: i64,
    limit: i64,
    new: bool,
}

/// What a notifying round needs: which log, and the private streams.
struct Notify<'a> {
    log: pg_sys::Oid,
    private: &'a [String],
}

/// Read the events of `batch` in position order, recording their commit
/// times when they are new; with `notify`, NOTIFY each. Returns the last position
/// read and whether the batch limit cut it short.
fn read_events(
    client: &mut SpiClient<'_>,
    plans: &Plans,
    batch: Batch,
    notify: Option<Notify<'_>>,
) -> SpiResult<(i64, bool)> {
    let args = [batch.after.into(), batch.upto.into(), batch.limit.into()];
    // 0.1.0's statement records the times itself.
    let (plan, mut times) = match &plans.recorded {
        None => (&plans.fetch_new, None),
        Some(recorded) if !batch.new => (&recorded.fetch, None),
        Some(_) => (&plans.fetch_new, Some(Recorder::new())),
    };
    let mut rows = client.update(plan, None, &args)?;
    let fetched = rows.len() as i64;
    let mut last = batch.after;
    if let Some(notify) = &notify {
        LAST_NOTIFIED.with(|l| {
            let mut l = l.borrow_mut();
            if l.log != notify.log {
                *l = LastNotified { log: notify.log, ..Default::default() };
            }
        });
    }
    while let Some(row) = rows.next() {
        let position = row.get::<i64>(1)?.unwrap_or_default();
        let time = row.get::<pgrx::datum::TimestampWithTimeZone>(4)?;
        let time = match times.as_mut() {
            Some(times) => times.add(position, time),
            None => time.unwrap_or_else(|| {
                StreamsError::CorruptEvent { position, error: "no commit time recorded".into() }.raise()
            }),
        };
        last = position;
        let Some(notify) = &notify else { continue };
        let stream = row.get::<&str>(2)?.unwrap_or_default();
        let tx = row.get::<i64>(3)?.unwrap_or_default();
        let is_private = notify.private.iter().any(|p| pattern_matches(p, stream));
        let envelope = read_envelope(&rows, 6, is_private)?;
        let data = match is_private || envelope.unread {
            true => None,
            false => rows.get_datum_by_ordinal(5)?.and_then(jsonb_text),
        };
        let prev = LAST_NOTIFIED.with(|l| l.borrow_mut().previous(client, plans, stream, position))?;
        LAST_NOTIFIED.with(|l| l.borrow_mut().record(stream, position));
        let event = Event {
            position,
            stream,
            time_us: crate::log::commit_times::unix_micros(time),
            tx,
            prev,
            type_: envelope.type_.as_deref(),
            key: envelope.key.as_deref(),
            headers: envelope.headers.as_deref(),
            data: data.as_deref(),
            private: is_private,
        };
        let payload = encode_payload(&event);
        let channel = CString::new(stream).expect("stream names hold no NUL");
        let payload = CString::new(payload).expect("JSON text holds no NUL");
        ffi::notify(&channel, &payload);
    }
    if let (Some(times), Some(recorded)) = (times, &plans.recorded) {
        warn_lost_commit_times(times.inexact() as i64, batch.after, last);
        times.save(client, &recorded.insert_times)?;
    }
    Ok((last, fetched == batch.limit))
}
