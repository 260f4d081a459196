//! Attempts: how many times each event was handed to a consumer of a
//! subscription without being settled (acked, parked or discarded).
//!
//! A poll's claims live in the consuming transaction, and whatever that
//! transaction writes is gone when it rolls back, loses its session or dies
//! with the server. So the poll asks the database's worker to write the
//! delivery down in a transaction of the worker's own (shmem/deliveries.rs)
//! and returns the events only once that commit is flushed: whatever ends
//! the attempt afterwards, the next delivery counts one more.
//!
//! `streams.subscription_deliveries` holds the count as segments: every
//! event of the subscription in `(low, high]` was delivered `attempts`
//! times, last to the backend `delivered_to` (pid and start time, so that a
//! nack after the consuming transaction failed is accepted from that
//! session alone). A delivery of `(after, through]` adds one inside it,
//! splitting the segments it cuts; an ack trims the settled events out, in
//! the consuming transaction. Segments stay few: a consumer's deliveries
//! are contiguous, and an ordered subscription's start where the last
//! settled event ended.

use std::time::{Duration, Instant};

use crate::log::kept_plan::KeptStatements;
use pgrx::datum::{DatumWithOid, TimestampWithTimeZone};
use pgrx::prelude::*;
use pgrx::spi::{SpiClient, SpiResult};

use super::reads::with_latest_snapshot;
use crate::error::{OrRaise, StreamsError};
use crate::shmem::{self, DeliveryAnswer, DeliveryRequest};

/// The longest a poll waits without any worker before it gives up (one
/// restarting after a crash attaches well within it).
const NO_WORKER_GRACE: Duration = Duration::from_secs(10);

/// How often a waiting poller sets the worker's latch again.
const REWAKE: Duration = Duration::from_millis(100);

/// Events of a subscription in `(low, high]`, delivered `attempts` times,
/// last to backend `pid` started at `started`.
#[derive(Debug, Clone)]
pub(crate) struct Segment {
    pub low: i64,
    pub high: i64,
    pub attempts: i32,
    pub pid: i32,
    /// Its start time (a raw TimestampTz).
    pub started: i64,
    /// None: now (a delivery being written).
    pub delivered_at: Option<TimestampWithTimeZone>,
    /// The lease the events are claimed under, and until when.
    pub lease: Option<i64>,
    pub leased_until: Option<TimestampWithTimeZone>,
    /// A delivery being written under a lease: for how long.
    pub lease_for_us: Option<i64>,
}

impl Segment {
    fn cut(&self, low: i64, high: i64) -> Segment {
        Segment { low, high, ..self.clone() }
    }

    /// Whether the backend running this is the one it was delivered to.
    pub fn delivered_to_me(&self) -> bool {
        // SAFETY: plain reads of this backend's pid and start time.
        let (pid, started) = unsafe { (pg_sys::MyProcPid, pg_sys::MyStartTimestamp) };
        self.pid == pid && self.started == started
    }
}

thread_local! {
    /// This backend's deliveries written down, and the time its polls
    /// waited for them (streams._delivery_waits).
    static WAITS: std::cell::Cell<(i64, i64)> = const { std::cell::Cell::new((0, 0)) };
}

/// `streams._delivery_waits()`: how many deliveries this backend's polls
/// had written down, and how long they waited for the worker in all
/// (microseconds): what counting attempts costs a consumer.
#[pg_extern(sql = false)]
fn _delivery_waits() -> TableIterator<'static, (name!(deliveries, i64), name!(waited_us, i64))> {
    TableIterator::once(WAITS.with(|w| w.get()))
}

/// The delivery this backend's last poll asked the worker to write down,
/// and the segments that held its events' attempts before it (what
/// `streams._attempt` answers from: one more).
struct Pending {
    /// The poll's transaction (its local id): the answers are for it only.
    transaction: u32,
    /// The request's sequence number; 0 once answered.
    sequence: u64,
    ranges: Vec<(i64, i64)>,
    before: Vec<Segment>,
}

thread_local! {
    static PENDING: std::cell::RefCell<Option<Pending>> = const { std::cell::RefCell::new(None) };
}

/// Have the worker write down that this backend gets the subscription's
/// events in each of `ranges` (`(after, through]`), without waiting: the
/// poll reads the events meanwhile, and `streams._await_delivery` waits for
/// the commit before the poll returns them. The counts are read first,
/// with the events' claims held and no other delivery of them on its way
/// (see [`await_earlier_deliveries`]): nothing else changes them before the
/// worker adds this delivery, so each event's attempt is its count + 1.
pub(super) fn submit(subscription: i32, lease: Option<(i64, i64)>, ranges: &[(i64, i64)]) {
    PENDING.with(|p| *p.borrow_mut() = None);
    if ranges.is_empty() {
        return;
    }
    crate::require_preload().or_raise();
    // SAFETY: plain reads of backend globals set once the backend is connected.
    let (db, pid, started) = unsafe { (pg_sys::MyDatabaseId, pg_sys::MyProcPid, pg_sys::MyStartTimestamp) };
    let (Some(entry), Some(mailbox)) = (shmem::find_db(db), shmem::my_mailbox()) else {
        StreamsError::DeliveryNotRecorded { worker: false }.raise()
    };
    // Any request of the events still on its way (this slot's own too: see
    // delivery_in_flight) would add to the counts read below.
    await_earlier_deliveries(subscription, ranges);
    let before = super::as_owner(|client| {
        let mut segments = Vec::new();
        for &(after, through) in ranges {
            segments.extend(overlapping(client, subscription, after, through)?);
        }
        Ok(segments)
    });
    let sequence = mailbox.request(db.to_u32(), subscription, (pid, started), lease, ranges);
    let transaction = this_transaction();
    PENDING.with(|p| *p.borrow_mut() = Some(Pending { transaction, sequence, ranges: ranges.to_vec(), before }));
    // Now, so that the worker writes while the poll reads (no worker: the
    // wait notices).
    if entry.is_for(db) {
        entry.wake_for_deliveries();
    }
}

/// As [`submit`], and wait until the worker committed (55000 when it
/// cannot, or on interrupts): a lease must be written down before the
/// subscription is let go.
pub(super) fn record(subscription: i32, lease: Option<(i64, i64)>, ranges: &[(i64, i64)]) {
    submit(subscription, lease, ranges);
    await_delivery();
}

/// Wait until the worker committed request `sequence` of this backend.
fn wait_for(sequence: u64) {
    let Some(mailbox) = shmem::my_mailbox() else { StreamsError::DeliveryNotRecorded { worker: false }.raise() };
    let asked = Instant::now();
    let mut worker = WorkerWatch::default();
    loop {
        // Reset first: an answer after the look below sets the latch again.
        // SAFETY: MyLatch is this backend's own latch.
        unsafe { pg_sys::ResetLatch(pg_sys::MyLatch) };
        match mailbox.answer(sequence) {
            DeliveryAnswer::Done => break,
            DeliveryAnswer::Failed => StreamsError::DeliveryNotRecorded { worker: true }.raise(),
            DeliveryAnswer::Blocked => StreamsError::DeliveryBlocked.raise(),
            DeliveryAnswer::Pending => {}
        }
        worker.wake();
        // The worker sets this latch when it answers; interrupts set it
        // too, and CHECK_FOR_INTERRUPTS raises through pgrx's guard.
        shmem::wait_on_my_latch(REWAKE.as_millis() as i64);
        pg_sys::check_for_interrupts!();
    }
    let waited = asked.elapsed().as_micros() as i64;
    WAITS.with(|w| w.set((w.get().0 + 1, w.get().1 + waited)));
}

/// Wait until no delivery of the subscription's events in any of `ranges`
/// (`(after, through]`) waits for the worker, so that the count read next
/// holds it. Called with the events' claim held, before a poll decides on
/// their attempts: a poller whose transaction ended while its delivery
/// waited (terminated, cancelled) left the request behind, and the worker
/// commits it after that claim was let go. Otherwise the next poll would
/// count from before it and hand an event out past `max_attempts`.
pub(super) fn await_earlier_deliveries(subscription: i32, ranges: &[(i64, i64)]) {
    // SAFETY: a plain read of a backend global set once it is connected.
    let db = unsafe { pg_sys::MyDatabaseId };
    let mut worker = WorkerWatch::default();
    while shmem::delivery_in_flight(db, subscription, ranges) {
        worker.wake();
        // The worker answers the other backend, not this one: a short nap.
        shmem::nap_on_latch(1);
    }
}

/// A backend waiting for this database's worker to write deliveries down:
/// it sets the worker's latch, and gives up (55000) when no worker has been
/// there for [`NO_WORKER_GRACE`].
#[derive(Default)]
struct WorkerWatch {
    missing_since: Option<Instant>,
}

impl WorkerWatch {
    fn wake(&mut self) {
        // SAFETY: a plain read of a backend global set once it is connected.
        let db = unsafe { pg_sys::MyDatabaseId };
        if shmem::find_db(db).is_some_and(|entry| entry.is_for(db) && entry.wake_for_deliveries()) {
            self.missing_since = None;
        } else if self.missing_since.get_or_insert_with(Instant::now).elapsed() > NO_WORKER_GRACE {
            StreamsError::DeliveryNotRecorded { worker: false }.raise();
        }
    }
}

/// `streams._attempt(position)`: the delivery attempt of an event this
/// backend's last poll, in this transaction, claimed (NULL for any other
/// event, and in any other transaction): its count before that
/// poll, plus one. It does not wait: `streams.poll` reads its events, with
/// their attempts, while the worker writes the delivery down, and then
/// waits for that commit (`streams._await_delivery`) before it returns
/// them.
#[pg_extern(sql = false)]
fn _attempt(position: i64) -> Option<i32> {
    with_pending(|pending| {
        if !pending.ranges.iter().any(|&(after, through)| after < position && position <= through) {
            return None;
        }
        let before = pending.before.iter().find(|s| s.low < position && position <= s.high);
        Some(before.map_or(1, |s| s.attempts.saturating_add(1)))
    })
    .flatten()
}

/// `body` on the pending delivery of this backend's last poll, if that
/// poll ran in this transaction (None otherwise).
fn with_pending<R>(body: impl FnOnce(&mut Pending) -> R) -> Option<R> {
    PENDING.with(|p| p.borrow_mut().as_mut().filter(|pending| pending.transaction == this_transaction()).map(body))
}

/// The local id of this backend's transaction.
fn this_transaction() -> u32 {
    // SAFETY: MyProc is this backend's own PGPROC, set once it is connected.
    unsafe { (*pg_sys::MyProc).lxid }
}

/// `streams._await_delivery()`: wait until the worker committed the
/// delivery of this backend's last poll (at once when it did, or when the
/// poll claimed nothing). `streams.poll` calls it after it read its
/// events: none is returned before its attempt is written down.
#[pg_extern(sql = false)]
fn _await_delivery() {
    await_delivery();
}

/// Wait until the worker committed the delivery of this transaction's last
/// poll, if it has not yet.
fn await_delivery() {
    // Not borrowed while waiting: wait_for may raise.
    let sequence = with_pending(|pending| pending.sequence).unwrap_or(0);
    if sequence != 0 {
        wait_for(sequence);
        with_pending(|pending| pending.sequence = 0);
    }
}

/// The worker's side: write down every request, in the worker's current
/// transaction (it commits them all at once). For each request, whether it
/// was written: false when another transaction holds a lock the writes
/// would wait for, which the worker does not wait for (see
/// [`lock_records`]).
pub(crate) fn write_requests(requests: &[DeliveryRequest]) -> SpiResult<Vec<bool>> {
    crate::log::kept_plan::with_index_plans(|| {
        Spi::connect_mut(|client| {
            let mut written = Vec::with_capacity(requests.len());
            for request in requests {
                // Locked first, every range's: a request is written whole or not
                // at all.
                let Some(locked) = lock_records(client, request)? else {
                    written.push(false);
                    continue;
                };
                for (i, (&(after, through), segments)) in request.ranges.iter().zip(locked).enumerate() {
                    // A segment that begins below a later range may span a
                    // range before it too (a poll ordered per key skips the
                    // positions of held keys), which rewrote it: read again.
                    // The first range's are as locked.
                    let segments = if i > 0 && segments.iter().any(|s| s.low < after) {
                        overlapping(client, request.subscription, after, through)?
                    } else {
                        segments
                    };
                    add_delivery(client, request, after, through, segments)?;
                }
                written.push(true);
            }
            Ok(written)
        })
    })
}

/// Lock the segments overlapping each range of `request`, without waiting:
/// each range's segments, or None when another transaction holds any of
/// them (see [`overlapping_locked`]). (The insert's foreign key check
/// cannot wait either: a drop waits for the subscription's deliveries on
/// their way first.)
fn lock_records(client: &mut SpiClient<'_>, request: &DeliveryRequest) -> SpiResult<Option<Vec<Vec<Segment>>>> {
    let mut locked = Vec::with_capacity(request.ranges.len());
    for &(after, through) in &request.ranges {
        let Some(segments) = overlapping_locked(client, request.subscription, after, through)? else {
            return Ok(None);
        };
        locked.push(segments);
    }
    Ok(Some(locked))
}

/// One more delivery of the events in `(after, through]`, whose segments
/// are `old`.
fn add_delivery(
    client: &mut SpiClient<'_>,
    request: &DeliveryRequest,
    after: i64,
    through: i64,
    old: Vec<Segment>,
) -> SpiResult<()> {
    if through <= after {
        return Ok(());
    }
    let subscription = request.subscription;
    let fresh = |low, high, attempts| Segment {
        low,
        high,
        attempts,
        pid: request.pid,
        started: request.started,
        delivered_at: None,
        lease: request.lease.map(|l| l.0),
        leased_until: None,
        lease_for_us: request.lease.map(|l| l.1),
    };
    let mut pieces = Vec::with_capacity(old.len() * 2 + 1);
    let mut cursor = after;
    for segment in &old {
        if segment.low < after {
            pieces.push(segment.cut(segment.low, after));
        }
        if segment.low > cursor {
            pieces.push(fresh(cursor, segment.low, 1));
        }
        let (low, high) = (segment.low.max(after), segment.high.min(through));
        pieces.push(fresh(low, high, segment.attempts.saturating_add(1)));
        if segment.high > through {
            pieces.push(segment.cut(through, segment.high));
        }
        cursor = cursor.max(high);
    }
    if cursor < through {
        pieces.push(fresh(cursor, through, 1));
    }
    if old.is_empty() {
        // Nothing to replace (the usual case: the last delivery was settled).
        return insert(client, subscription, &merge(pieces));
    }
    replace(client, subscription, after, through, &merge(pieces))
}

/// The events in `(after, through]` are settled, except those in `keep`
/// (nacked: their count goes on): drop them from the segments.
pub(super) fn settle(
    client: &mut SpiClient<'_>,
    subscription: i32,
    after: i64,
    through: i64,
    keep: &[i64],
) -> SpiResult<()> {
    if through <= after {
        return Ok(());
    }
    let old = overlapping(client, subscription, after, through)?;
    if old.is_empty() {
        return Ok(());
    }
    let mut pieces = Vec::with_capacity(old.len() * 2 + keep.len());
    for segment in &old {
        if segment.low < after {
            pieces.push(segment.cut(segment.low, after));
        }
        let (low, high) = (segment.low.max(after), segment.high.min(through));
        let mut kept: Vec<i64> = keep.iter().copied().filter(|&k| k > low && k <= high).collect();
        kept.sort_unstable();
        kept.dedup();
        pieces.extend(kept.into_iter().map(|k| segment.cut(k - 1, k)));
        if segment.high > through {
            pieces.push(segment.cut(through, segment.high));
        }
    }
    replace(client, subscription, after, through, &pieces)
}

/// The events after `position` that came in the same delivery as `nacked`
/// (the nacked event's segment) were not tried: the consumer failed before
/// them, and they come again after it. Take that delivery back from their
/// counts, so that only the failing event uses up its attempts.
pub(super) fn not_attempted(
    client: &mut SpiClient<'_>,
    subscription: i32,
    position: i64,
    nacked: &Segment,
) -> SpiResult<()> {
    let same_delivery =
        |s: &Segment| s.pid == nacked.pid && s.started == nacked.started && s.delivered_at == nacked.delivered_at;
    let old: Vec<Segment> = overlapping(client, subscription, position, i64::MAX)?;
    // Up to the end of that delivery's last segment: the segments above it
    // stay as they are, unlocked (a poll of those events in this
    // transaction needs the worker to rewrite them).
    let Some(end) = old.iter().filter(|s| same_delivery(s)).map(|s| s.high).max() else {
        return Ok(());
    };
    let old: Vec<&Segment> = old.iter().filter(|s| s.low < end).collect();
    let mut pieces = Vec::with_capacity(old.len() + 1);
    for &segment in &old {
        if !same_delivery(segment) {
            pieces.push(segment.clone());
            continue;
        }
        if segment.low < position {
            pieces.push(segment.cut(segment.low, position));
        }
        if segment.attempts > 1 {
            let mut rest = segment.cut(segment.low.max(position), segment.high);
            rest.attempts -= 1;
            pieces.push(rest);
        }
    }
    replace(client, subscription, position, end, &pieces)
}

/// Forget every count of the subscription (a seek starts afresh).
pub(super) fn forget_all(client: &mut SpiClient<'_>, subscription: i32) -> SpiResult<()> {
    client.update_kept(
        "DELETE FROM streams.subscription_deliveries WHERE subscription = $1",
        None,
        &[subscription.into()],
    )?;
    Ok(())
}

/// Adjacent pieces delivered alike become one.
fn merge(pieces: Vec<Segment>) -> Vec<Segment> {
    let mut merged: Vec<Segment> = Vec::with_capacity(pieces.len());
    for piece in pieces {
        match merged.last_mut() {
            Some(last)
                if last.high == piece.low
                    && last.attempts == piece.attempts
                    && last.pid == piece.pid
                    && last.lease == piece.lease
                    && last.lease_for_us.is_some() == piece.lease_for_us.is_some()
                    && last.delivered_at.is_none()
                    && piece.delivered_at.is_none() =>
            {
                last.high = piece.high;
            }
            _ => merged.push(piece),
        }
    }
    merged
}

/// The columns of a segment, in [`segment_from`]'s order (a macro, so that
/// the statements that read them are constants, built once at compile time).
macro_rules! segment_columns {
    () => {
        "d.low, d.high, d.attempts, d.delivered_to, d.delivered_to_start, d.delivered_at, d.lease, d.leased_until"
    };
}

/// A segment from `segment_columns!()`, starting at column `first`.
fn segment_from(row: &pgrx::spi::SpiHeapTupleData, first: usize) -> SpiResult<Segment> {
    Ok(Segment {
        low: row.get::<i64>(first)?.unwrap_or(0),
        high: row.get::<i64>(first + 1)?.unwrap_or(0),
        attempts: row.get::<i32>(first + 2)?.unwrap_or(0),
        pid: row.get::<i32>(first + 3)?.unwrap_or(0),
        started: row.get::<TimestampWithTimeZone>(first + 4)?.map_or(i64::MIN, pg_sys::TimestampTz::from),
        delivered_at: row.get::<TimestampWithTimeZone>(first + 5)?,
        lease: row.get::<i64>(first + 6)?,
        leased_until: row.get::<TimestampWithTimeZone>(first + 7)?,
        lease_for_us: None,
    })
}

/// The segments that overlap `(after, through]`, in order, read with a
/// snapshot taken now (the worker's commit of this poll's delivery).
pub(super) fn overlapping(
    client: &mut SpiClient<'_>,
    subscription: i32,
    after: i64,
    through: i64,
) -> SpiResult<Vec<Segment>> {
    let args: [DatumWithOid; 3] = [subscription.into(), after.into(), through.into()];
    const QUERY: &str = concat!(
        "SELECT ",
        segment_columns!(),
        " FROM streams.subscription_deliveries d
         WHERE d.subscription = $1 AND d.high > $2 AND d.low < $3
         ORDER BY d.low"
    );
    with_latest_snapshot(|| client.select_kept(QUERY, None, &args)?.map(|row| segment_from(&row, 1)).collect())
}

/// As [`overlapping`], for the worker: the segments locked for its update,
/// or None when another transaction holds a lock on any of them (the
/// poller's own, say, after it acked or nacked some of them). Never waits:
/// the worker writes every poller's deliveries, and one transaction that
/// keeps its locks must not hold the others up.
fn overlapping_locked(
    client: &mut SpiClient<'_>,
    subscription: i32,
    after: i64,
    through: i64,
) -> SpiResult<Option<Vec<Segment>>> {
    let args: [DatumWithOid; 3] = [subscription.into(), after.into(), through.into()];
    // One row per segment locked (or one of NULLs), each with how many
    // segments there are: fewer locked than there are means one was skipped.
    const QUERY: &str = concat!(
        "SELECT v.visible, l.* FROM
             (SELECT pg_catalog.count(*) AS visible FROM streams.subscription_deliveries d
              WHERE d.subscription = $1 AND d.high > $2 AND d.low < $3) v
         LEFT JOIN LATERAL
             (SELECT ",
        segment_columns!(),
        " FROM streams.subscription_deliveries d
              WHERE d.subscription = $1 AND d.high > $2 AND d.low < $3
              ORDER BY d.low FOR UPDATE SKIP LOCKED) l ON true"
    );
    let mut visible = 0;
    let mut locked = Vec::new();
    // update_kept: a locking read is not read-only.
    for row in client.update_kept(QUERY, None, &args)? {
        visible = row.get::<i64>(1)?.unwrap_or(0);
        if row.get::<i64>(2)?.is_some() {
            locked.push(segment_from(&row, 2)?);
        }
    }
    Ok((locked.len() as i64 == visible).then_some(locked))
}

/// The segment that holds `position`, if it was delivered and not settled.
pub(crate) fn at(client: &mut SpiClient<'_>, subscription: i32, position: i64) -> SpiResult<Option<Segment>> {
    Ok(overlapping(client, subscription, position - 1, position)?.into_iter().next())
}

/// Replace the segments that overlap `(after, through]` with `pieces`.
fn replace(
    client: &mut SpiClient<'_>,
    subscription: i32,
    after: i64,
    through: i64,
    pieces: &[Segment],
) -> SpiResult<()> {
    let args: [DatumWithOid; 3] = [subscription.into(), after.into(), through.into()];
    client.update_kept(
        "DELETE FROM streams.subscription_deliveries d WHERE d.subscription = $1 AND d.high > $2 AND d.low < $3",
        None,
        &args,
    )?;
    insert(client, subscription, pieces)
}

/// Insert `pieces` as segments of the subscription.
fn insert(client: &mut SpiClient<'_>, subscription: i32, pieces: &[Segment]) -> SpiResult<()> {
    if pieces.is_empty() {
        return Ok(());
    }
    let lows: Vec<i64> = pieces.iter().map(|p| p.low).collect();
    let highs: Vec<i64> = pieces.iter().map(|p| p.high).collect();
    let attempts: Vec<i32> = pieces.iter().map(|p| p.attempts).collect();
    let pids: Vec<i32> = pieces.iter().map(|p| p.pid).collect();
    let started: Vec<Option<TimestampWithTimeZone>> =
        pieces.iter().map(|p| TimestampWithTimeZone::try_from(p.started).ok()).collect();
    let delivered: Vec<Option<TimestampWithTimeZone>> = pieces.iter().map(|p| p.delivered_at).collect();
    let leases: Vec<Option<i64>> = pieces.iter().map(|p| p.lease).collect();
    let leased_until: Vec<Option<TimestampWithTimeZone>> = pieces.iter().map(|p| p.leased_until).collect();
    let lease_for: Vec<Option<i64>> = pieces.iter().map(|p| p.lease_for_us).collect();
    let args: [DatumWithOid; 10] = [
        subscription.into(),
        lows.into(),
        highs.into(),
        attempts.into(),
        pids.into(),
        started.into(),
        delivered.into(),
        leases.into(),
        leased_until.into(),
        lease_for.into(),
    ];
    client.update_kept(
        "INSERT INTO streams.subscription_deliveries
             (subscription, low, high, attempts, delivered_to, delivered_to_start, delivered_at, lease, leased_until)
         SELECT $1, u.low, u.high, u.attempts, u.pid, coalesce(u.started, '-infinity'),
                coalesce(u.delivered_at, pg_catalog.now()), u.lease,
                coalesce(pg_catalog.now() + pg_catalog.make_interval(secs => u.lease_for / 1e6), u.leased_until)
         FROM ROWS FROM (pg_catalog.unnest($2::bigint[]), pg_catalog.unnest($3::bigint[]),
                         pg_catalog.unnest($4::integer[]), pg_catalog.unnest($5::integer[]),
                         pg_catalog.unnest($6::timestamptz[]), pg_catalog.unnest($7::timestamptz[]),
                         pg_catalog.unnest($8::bigint[]), pg_catalog.unnest($9::timestamptz[]),
                         pg_catalog.unnest($10::bigint[]))
              AS u(low, high, attempts, pid, started, delivered_at, lease, leased_until, lease_for)",
        None,
        &args,
    )?;
    Ok(())
}
