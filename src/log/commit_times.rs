//! Commit times, stored by position (`streams.commit_times`, sql/streams.sql).
//!
//! A transaction's commit time is known only once it has committed, and its
//! events are immutable rows written before that, so the time lives beside
//! the log: the worker writes one row per round for the positions the round
//! makes final, `times[i]` being the time of position `first_position + i -
//! 1`. Three parts:
//!
//! - [`Recorder`] builds a round's rows as the worker reads the round's
//!   events (a gap of more than [`MAX_GAP`] unused positions, or a row
//!   reaching [`MERGED_SPAN`] positions, starts a new row, so a round's
//!   memory follows its events, not its positions).
//! - [`compact`] merges short rows (rounds at low rates hold an event or two)
//!   into rows of up to [`MERGED_SPAN`] positions, every few seconds: a row
//!   per round would cost as much space as a row per transaction.
//! - `streams._commit_time(position)` answers for `streams.events`. It keeps
//!   the row it last read in the call site's `fn_extra`, for the rest of the
//!   query: an ordered scan reads each row once and finds every event's time
//!   with an array lookup, where a join would look up an index per event.
//!   Times never change (merging keeps them), so a kept row stays right.

use std::cell::Cell;

use pgrx::datum::{DatumWithOid, TimestampWithTimeZone};
use pgrx::prelude::*;
use pgrx::spi::{OwnedPreparedStatement, SpiClient, SpiResult};

use crate::error::StreamsError;
use crate::log::kept_plan::{spi, KeptPlan};

/// A commit time as microseconds since the Unix epoch (PostgreSQL counts
/// from 2000-01-01).
pub(crate) fn unix_micros(time: TimestampWithTimeZone) -> i64 {
    const POSTGRES_EPOCH_IN_UNIX_MICROS: i64 = 946_684_800_000_000;
    let raw: i64 = time.into_inner();
    raw + POSTGRES_EPOCH_IN_UNIX_MICROS
}

/// A run of more unused positions than this starts a new row.
const MAX_GAP: i64 = 1024;

/// Rows are merged into rows of at most this many positions.
const MERGED_SPAN: i64 = 4096;

/// A row shorter than this is merged with its neighbours.
const SHORT_ROW: i64 = MERGED_SPAN / 4;

/// The times of a round, by position, ready to be written.
pub(crate) struct Recorder {
    rows: Vec<Row>,
    /// The time given to an event whose commit time is lost.
    now: TimestampWithTimeZone,
    inexact: usize,
}

/// One row of `streams.commit_times` in the making.
struct Row {
    first: i64,
    /// Microseconds since 2000-01-01, [`NO_EVENT`] for an unused position.
    times: Vec<i64>,
    inexact: Vec<i64>,
}

const NO_EVENT: i64 = i64::MIN;

impl Recorder {
    pub fn new() -> Recorder {
        // SAFETY: reads the statement start time of the worker's transaction.
        let now = unsafe { pg_sys::GetCurrentStatementStartTimestamp() };
        Recorder {
            rows: Vec::new(),
            now: TimestampWithTimeZone::try_from(now).unwrap_or_else(|_| unreachable!("the clock is in range")),
            inexact: 0,
        }
    }

    /// Record the event at `position` (above every position added before) and
    /// return its time: `exact`, or the time of this round when the commit
    /// time is lost (the row then lists it as inexact).
    pub fn add(&mut self, position: i64, exact: Option<TimestampWithTimeZone>) -> TimestampWithTimeZone {
        let time = exact.unwrap_or(self.now);
        // A row spans at most MERGED_SPAN positions: whatever the gaps, a
        // round's memory and every reader's copy of a row stay small.
        let extends =
            self.rows.last().is_some_and(|row| position - row.end() <= MAX_GAP && position - row.first < MERGED_SPAN);
        if !extends {
            self.rows.push(Row { first: position, times: Vec::new(), inexact: Vec::new() });
        }
        let row = self.rows.last_mut().expect("pushed above");
        row.fill_to(position, 1);
        row.times.push(time.into_inner());
        if exact.is_none() {
            reserve(&mut row.inexact, 1);
            row.inexact.push(position);
            self.inexact += 1;
        }
        time
    }

    /// How many events got the round's time instead of their commit time.
    pub fn inexact(&self) -> usize {
        self.inexact
    }

    /// Insert the rows.
    pub fn save(self, client: &mut SpiClient<'_>, insert: &OwnedPreparedStatement) -> SpiResult<()> {
        for row in &self.rows {
            insert_row(client, insert, row)?;
        }
        Ok(())
    }
}

impl Row {
    /// The position after the last one in the row.
    fn end(&self) -> i64 {
        self.first + self.times.len() as i64
    }

    /// Mark the unused positions up to `position` (not yet in the row),
    /// with room for `more` times after them.
    fn fill_to(&mut self, position: i64, more: usize) {
        let gap = (position - self.end()) as usize;
        reserve(&mut self.times, gap + more);
        self.times.resize(self.times.len() + gap, NO_EVENT);
    }
}

/// Grow `vec` by `more`, or raise an ERROR (54000) where an allocation
/// failure would abort the server.
fn reserve(vec: &mut Vec<i64>, more: usize) {
    if vec.try_reserve(more).is_err() {
        StreamsError::OutOfMemory("the commit times of a delivery round").raise();
    }
}

/// `INSERT INTO streams.commit_times`, the statement [`Recorder::save`] and
/// [`compact`] take (prepared by the caller, with [`INSERT_TYPES`]).
pub(crate) const INSERT: &str = "INSERT INTO streams.commit_times (first_position, times, last_time, inexact)
                                 VALUES ($1, $2, $3, $4)";

pub(crate) const INSERT_TYPES: [pg_sys::Oid; 4] =
    [pg_sys::INT8OID, pg_sys::TIMESTAMPTZARRAYOID, pg_sys::TIMESTAMPTZOID, pg_sys::INT8ARRAYOID];

/// Insert `row`, with the latest of its times as `last_time`.
fn insert_row(client: &mut SpiClient<'_>, insert: &OwnedPreparedStatement, row: &Row) -> SpiResult<()> {
    // SAFETY: a 1-D timestamptz array built by PostgreSQL's own accumulator in the current (SPI)
    // memory context; an allocation failure there is an ERROR, never an abort.
    let times = unsafe {
        let state = pg_sys::initArrayResult(pg_sys::TIMESTAMPTZOID, pg_sys::CurrentMemoryContext, false);
        for &time in &row.times {
            pg_sys::accumArrayResult(
                state,
                pg_sys::Datum::from(time),
                time == NO_EVENT,
                pg_sys::TIMESTAMPTZOID,
                pg_sys::CurrentMemoryContext,
            );
        }
        DatumWithOid::new(pg_sys::makeArrayResult(state, pg_sys::CurrentMemoryContext), pg_sys::TIMESTAMPTZARRAYOID)
    };
    let last_time = row.times.iter().copied().max().and_then(|t| TimestampWithTimeZone::try_from(t).ok());
    let inexact = (!row.inexact.is_empty()).then(|| row.inexact.clone());
    client.update(insert, None, &[row.first.into(), times, last_time.into(), inexact.into()])?;
    Ok(())
}

/// The rows [`compact`] looks at: first position and length.
const SCAN: &str = "SELECT c.first_position, pg_catalog.cardinality(c.times)
                    FROM streams.commit_times c WHERE c.first_position > $1
                    ORDER BY c.first_position LIMIT $2";
const READ_RANGE: &str = "SELECT c.first_position, c.times, c.inexact FROM streams.commit_times c
                          WHERE c.first_position >= $1 AND c.first_position <= $2 ORDER BY c.first_position";
const DELETE_RANGE: &str = "DELETE FROM streams.commit_times c WHERE c.first_position >= $1 AND c.first_position <= $2";

/// At most this many rows are looked at per call.
const COMPACT_SCAN_ROWS: i64 = 20_000;

/// Where [`compact`] goes on: every row of the log whose `event_log` is
/// `log` up to `settled` is as merged as it will get.
#[derive(Default)]
pub(crate) struct Compacted {
    log: pg_sys::Oid,
    settled: i64,
}

/// Merge runs of short rows into rows of up to [`MERGED_SPAN`] positions, in
/// the worker's transaction, from where the last call left off (from the
/// start for a new table: a re-created log). Nothing when the database's
/// schema has no commit times (0.1.0).
pub(crate) fn compact(client: &mut SpiClient<'_>, done: &mut Compacted) -> SpiResult<()> {
    let Some(log) = crate::log::catalog::log_with_commit_times() else { return Ok(()) };
    if done.log != log {
        *done = Compacted { log, settled: 0 };
    }
    done.settled = compact_after(client, done.settled)?;
    Ok(())
}

/// [`compact`] after position `after`; returns the position the next call
/// may start after (a row that may still gain neighbours stays after it).
fn compact_after(client: &mut SpiClient<'_>, after: i64) -> SpiResult<i64> {
    let int8 = pgrx::PgOid::BuiltIn(pgrx::PgBuiltInOids::INT8OID);
    let rows: Vec<(i64, i64)> = client
        .select(SCAN, None, &[after.into(), COMPACT_SCAN_ROWS.into()])?
        .map(|row| Ok((row.get::<i64>(1)?.unwrap_or(0), i64::from(row.get::<i32>(2)?.unwrap_or(0)))))
        .collect::<SpiResult<_>>()?;
    let groups = plan_merges(&rows);
    let settled = settled_through(&rows, &groups, after);
    if groups.is_empty() {
        return Ok(settled);
    }
    let read = client.prepare(READ_RANGE, &[int8, int8])?;
    let delete = client.prepare_mut(DELETE_RANGE, &[int8, int8])?;
    let insert = client.prepare_mut(INSERT, &INSERT_TYPES.map(pgrx::PgOid::from))?.keep();
    for group in groups {
        let (first, last) = (rows[group.start].0, rows[group.end - 1].0);
        let mut merged = Row { first, times: Vec::new(), inexact: Vec::new() };
        for row in client.select(&read, None, &[first.into(), last.into()])? {
            let start = row.get::<i64>(1)?.unwrap_or(first);
            let times = row.get::<Vec<Option<TimestampWithTimeZone>>>(2)?.unwrap_or_default();
            // Rows written by the worker never overlap, and a run spans at
            // most MERGED_SPAN positions; anything else is not merged.
            if !start.checked_sub(merged.end()).is_some_and(|gap| (0..=MERGED_SPAN).contains(&gap)) {
                StreamsError::Spi {
                    doing: "merging commit times",
                    error: format!("overlapping or distant rows at {start}"),
                }
                .raise();
            }
            merged.fill_to(start, times.len());
            merged.times.extend(times.into_iter().map(|t| t.map_or(NO_EVENT, TimestampWithTimeZone::into_inner)));
            merged.inexact.extend(row.get::<Vec<i64>>(3)?.unwrap_or_default());
        }
        let deleted = client.update(&delete, None, &[first.into(), last.into()])?.len();
        if deleted != group.len() {
            StreamsError::Spi { doing: "merging commit times", error: format!("{deleted} rows at {first}..={last}") }
                .raise();
        }
        insert_row(client, &insert, &merged)?;
    }
    Ok(settled)
}

/// Which runs of rows (indexes into `rows`, each `(first position, length)`)
/// to merge: consecutive short rows whose span fits [`MERGED_SPAN`], two or
/// more of them.
fn plan_merges(rows: &[(i64, i64)]) -> Vec<std::ops::Range<usize>> {
    let mut groups = Vec::new();
    let mut start = 0;
    while start < rows.len() {
        let (first, _) = rows[start];
        let mut end = start;
        while end < rows.len() {
            let (position, length) = rows[end];
            let span = i128::from(position) + i128::from(length) - i128::from(first);
            if length >= SHORT_ROW || span > i128::from(MERGED_SPAN) {
                break;
            }
            end += 1;
        }
        if end - start >= 2 {
            groups.push(start..end);
        }
        start = end.max(start + 1);
    }
    groups
}

/// The position up to which every row is settled once `groups` are merged:
/// everything before the run of short rows that ends the scan (more rows may
/// still join it), or everything when a long row ends it.
fn settled_through(rows: &[(i64, i64)], groups: &[std::ops::Range<usize>], after: i64) -> i64 {
    let Some(&(last_first, last_length)) = rows.last() else { return after };
    if last_length >= SHORT_ROW {
        return last_first;
    }
    let tail_start = groups.last().filter(|g| g.end == rows.len()).map_or(rows.len() - 1, |g| g.start);
    rows[..tail_start].last().map_or(after, |&(first, _)| first)
}

/// `streams._commit_time(position bigint) → timestamptz` (sql/streams.sql):
/// the time from the row that holds `position`, kept in `fn_extra` for the
/// call site's next calls. Reads `streams.commit_times` as the caller.
///
/// # Safety
/// SAFETY: only fmgr calls it, as `streams._commit_time(bigint)`, STRICT, so `fcinfo` holds one
/// non-null bigint and a `flinfo` whose `fn_extra` only this function sets.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn litebase_streams_commit_time(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    let position = pgrx::fcinfo::pg_getarg_datum_raw(fcinfo, 0).value() as i64;
    let flinfo = (*fcinfo).flinfo;
    let mut kept = (*flinfo).fn_extra as *mut KeptRow;
    if kept.is_null() {
        kept = pg_sys::MemoryContextAllocZero((*flinfo).fn_mcxt, std::mem::size_of::<KeptRow>()) as *mut KeptRow;
        (*flinfo).fn_extra = kept.cast();
    }
    if !(*kept).covers(position) {
        (*kept).load(position, (*flinfo).fn_mcxt);
    }
    match (*kept).time(position) {
        Some(time) => time,
        None => {
            (*fcinfo).isnull = true;
            pg_sys::Datum::from(0)
        }
    }
}

crate::ffi::function_info_v1!(pg_finfo_litebase_streams_commit_time);

/// The row `_commit_time` read last, copied into the call site's memory
/// context (palloc'd, freed with it: no Rust destructors).
#[repr(C)]
struct KeptRow {
    first: i64,
    count: i64,
    times: *mut pg_sys::Datum,
    nulls: *mut bool,
}

thread_local! {
    static LOOKUP_PLAN: Cell<pg_sys::SPIPlanPtr> = const { Cell::new(std::ptr::null_mut()) };
}

static LOOKUP: KeptPlan<1> = KeptPlan {
    sql: c"SELECT c.first_position, c.times FROM streams.commit_times c
           WHERE c.first_position <= $1 ORDER BY c.first_position DESC LIMIT 1",
    types: [pg_sys::INT8OID],
    plan: LOOKUP_PLAN,
};

impl KeptRow {
    fn covers(&self, position: i64) -> bool {
        // Checked: a row forged near i64::MIN must not wrap into an index.
        position.checked_sub(self.first).is_some_and(|offset| offset >= 0 && offset < self.count)
    }

    /// # Safety
    /// SAFETY: `times` and `nulls` hold `count` elements (as [`load`](Self::load) leaves them).
    unsafe fn time(&self, position: i64) -> Option<pg_sys::Datum> {
        if !self.covers(position) {
            return None;
        }
        let index = (position - self.first) as usize;
        (!*self.nulls.add(index)).then(|| *self.times.add(index))
    }

    /// Read the row that holds `position` into `memory`; keep the old one
    /// when there is none (the position is not final yet, or unused).
    ///
    /// # Safety
    /// SAFETY: inside a transaction; `memory` outlives the kept row (the call site's fn_mcxt).
    unsafe fn load(&mut self, position: i64, memory: pg_sys::MemoryContext) {
        spi::connect();
        LOOKUP.execute_read_only(&mut [pg_sys::Datum::from(position)], pg_sys::SPI_OK_SELECT);
        let table = pg_sys::SPI_tuptable;
        if !table.is_null() && pg_sys::SPI_processed == 1 {
            let (tuple, desc) = (*(*table).vals, (*table).tupdesc);
            let mut is_null = false;
            let first = pg_sys::SPI_getbinval(tuple, desc, 1, &mut is_null).value() as i64;
            let array = pg_sys::SPI_getbinval(tuple, desc, 2, &mut is_null);
            let array = pg_sys::pg_detoast_datum(array.cast_mut_ptr()) as *mut pg_sys::ArrayType;
            let (mut values, mut nulls, mut count) = (std::ptr::null_mut(), std::ptr::null_mut(), 0);
            pg_sys::deconstruct_array(
                array,
                pg_sys::TIMESTAMPTZOID,
                8,
                true,
                pg_sys::TYPALIGN_DOUBLE as std::ffi::c_char,
                &mut values,
                &mut nulls,
                &mut count,
            );
            let count = count.max(0) as usize;
            let times = pg_sys::MemoryContextAlloc(memory, count.max(1) * std::mem::size_of::<pg_sys::Datum>());
            let kept_nulls = pg_sys::MemoryContextAlloc(memory, count.max(1)) as *mut bool;
            std::ptr::copy_nonoverlapping(values, times.cast(), count);
            std::ptr::copy_nonoverlapping(nulls, kept_nulls, count);
            if !self.times.is_null() {
                pg_sys::pfree(self.times.cast());
                pg_sys::pfree(self.nulls.cast());
            }
            *self = KeptRow { first, count: count as i64, times: times.cast(), nulls: kept_nulls };
        }
        spi::finish();
    }
}

#[cfg(test)]
mod tests {
    use super::{plan_merges, settled_through, SHORT_ROW};

    #[test]
    fn runs_of_short_rows_are_merged_within_the_span() {
        // Five one-event rows, then a long row, then two short ones.
        let rows = [(1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 2000), (2006, 3), (2009, 1)];
        assert_eq!(plan_merges(&rows), vec![0..5, 6..8]);
        // The tail run may grow: everything before it is settled.
        assert_eq!(settled_through(&rows, &plan_merges(&rows), 0), 6);
    }

    #[test]
    fn a_run_is_cut_where_the_span_would_pass_the_limit() {
        let rows: Vec<(i64, i64)> = (0..10).map(|i| (1 + i * 1000, 900)).collect();
        let groups = plan_merges(&rows);
        assert_eq!(groups, vec![0..4, 4..8, 8..10]);
        assert!(rows.iter().all(|&(_, length)| length < SHORT_ROW));
    }

    #[test]
    fn a_lone_short_row_is_left_alone_and_long_rows_settle() {
        let rows = [(1, 5000), (5001, 3), (5004, 5000)];
        let groups = plan_merges(&rows);
        assert!(groups.is_empty());
        assert_eq!(settled_through(&rows, &groups, 0), 5004);
        assert_eq!(settled_through(&[], &[], 42), 42);
    }
}

/// `streams._first_time_reaching(times timestamptz[], since timestamptz) →
/// integer` (sql/streams.sql): the 1-based index of the first time in a row's
/// `times` at or after `since`, null when none is. `replay(since => ..)`
/// finds where it starts with it: the same answer as unnesting the row's
/// 4,096 times and keeping the lowest match, in a fraction of the time.
#[pg_extern(sql = false, immutable, strict, parallel_safe)]
pub(crate) fn _first_time_reaching(
    times: pgrx::Array<TimestampWithTimeZone>,
    since: TimestampWithTimeZone,
) -> Option<i32> {
    let since = since.into_inner();
    let index = times.iter().position(|time| time.is_some_and(|time| time.into_inner() >= since))?;
    i32::try_from(index + 1).ok()
}
