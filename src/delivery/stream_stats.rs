//! Events per stream, for `streams.streams` and `streams.metrics()`: about
//! every [`STATS_INTERVAL`] the worker adds the final events above
//! `streams.stream_stats_state.counted_through` to `streams.stream_stats`.
//!
//! # Exactly once
//!
//! Each step counts the events in one range of positions `(counted_through,
//! upto]`, `upto` at most the horizon its snapshot sees, and in the same
//! transaction adds them to the totals and moves `counted_through` to
//! `upto`. Every event at or below the horizon is committed and visible to
//! that snapshot, and none can appear there later (the horizon's
//! invariant), so a range is complete when it is counted; a crash or a
//! failure rolls back the totals and the mark together, and the worker is
//! the only writer. Rolled-back publishes leave no row, so they count for
//! nothing.
//!
//! # Bounded steps
//!
//! A step covers at most [`STEP_POSITIONS`] positions from the first event
//! above the mark (a gap of unused positions costs one step), and one pass takes
//! steps only until [`PASS_BUDGET`] is spent: a log updated from 0.2.0 with
//! 100M events (counted_through starts at 0) catches up in short
//! transactions, between delivery rounds, without holding back delivery for
//! more than the budget at a time. While behind, passes come every
//! [`CATCH_UP_PAUSE`] instead of every interval.
//!
//! Nothing here makes an event final: the steps commit without waiting for
//! the WAL flush (a lost commit loses totals and mark together).

use std::time::{Duration, Instant};

use pgrx::prelude::*;

use super::runtime::{attempt, warn_failed};
use crate::error::SpiContext;

/// How often the worker counts new final events (see the module comment).
pub(super) const STATS_INTERVAL: Duration = Duration::from_secs(1);

/// The most positions one step (one transaction) counts: about 35 ms of
/// work on a 2-core machine (100,000 took 72 ms).
const STEP_POSITIONS: i64 = 50_000;

/// The longest one pass keeps taking steps.
const PASS_BUDGET: Duration = Duration::from_millis(100);

/// The pause between passes while the counts are behind the horizon: the
/// worker spends at most about half its time catching up.
pub(super) const CATCH_UP_PAUSE: Duration = Duration::from_millis(100);

/// Where the counts stand after a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Counted {
    /// Counted through this position; `behind`: the budget ran out before
    /// the counts reached the horizon.
    Through { position: i64, behind: bool },
    /// The database has no statistics tables (not yet updated to 0.3.0) or
    /// the step failed: try again at the next interval.
    Nothing,
}

/// Where the counts stand and the horizon: `(counted_through, horizon)`.
/// The row is locked, so the step below adds to the totals it read.
const READ_STATE: &str = "
    SELECT s.counted_through,
           coalesce((SELECT h.horizon FROM streams.horizon_state h ORDER BY h.horizon DESC LIMIT 1), 0)
    FROM streams.stream_stats_state s
    FOR UPDATE OF s";

/// Count the events in `($1, $2]` per stream, add them to the totals and
/// to the log-wide total (which streams.metrics() reads instead of every
/// stream's row) and move the mark, in one statement: every part sees the
/// same snapshot and runs in the caller's transaction. A stream's first position stays the
/// lowest counted, its last time is its newest event's commit time.
const COUNT_STEP: &str = "
    WITH counted AS (
        SELECT e.stream, pg_catalog.count(*) AS events,
               pg_catalog.min(e.position) AS first_position, pg_catalog.max(e.position) AS last_position
        FROM streams.event_log e
        WHERE e.position > $1 AND e.position <= $2
        GROUP BY e.stream
    ), added AS (
        INSERT INTO streams.stream_stats AS s (stream, events, first_position, last_position, last_time)
        SELECT c.stream, c.events, c.first_position, c.last_position, streams._commit_time(c.last_position)
        FROM counted c
        ON CONFLICT (stream) DO UPDATE
        SET events = s.events + excluded.events,
            first_position = LEAST(s.first_position, excluded.first_position),
            last_position = GREATEST(s.last_position, excluded.last_position),
            last_time = CASE WHEN excluded.last_position > s.last_position THEN excluded.last_time ELSE s.last_time END
    )
    UPDATE streams.stream_stats_state
    SET counted_through = $2,
        events = events + (SELECT coalesce(pg_catalog.sum(c.events), 0) FROM counted c)::bigint";

/// The first event above a position (null: none): where a step starts.
const NEXT_EVENT: &str = "SELECT (SELECT e.position FROM streams.event_log e WHERE e.position > $1
                                  ORDER BY e.position LIMIT 1)";

/// One step: `Some((counted_through, horizon))` after it; None before
/// the 0.3.0 update, which made the tables.
fn step() -> Option<(i64, i64)> {
    let exists = Spi::get_one::<bool>("SELECT pg_catalog.to_regclass('streams.stream_stats_state') IS NOT NULL")
        .context("looking up streams.stream_stats_state");
    if exists != Some(true) {
        return None;
    }
    Spi::connect_mut(|client| {
        let state = client.update(READ_STATE, Some(1), &[])?;
        if state.is_empty() {
            return Ok(None); // its one row is gone: nothing to count into
        }
        let row = state.first();
        let (counted, horizon) = (row.get::<i64>(1)?.unwrap_or(0), row.get::<i64>(2)?.unwrap_or(0));
        if counted >= horizon {
            return Ok(Some((counted, horizon)));
        }
        // A step starts at the next event, not at the next position: a gap
        // of unused positions (a sequence moved far ahead with setval, which
        // pg_write_all_data may do) is skipped in one step, not walked
        // 50,000 positions at a time for days.
        let next = client
            .select(NEXT_EVENT, Some(1), &[counted.into()])?
            .first()
            .get::<i64>(1)?
            .filter(|&position| position <= horizon);
        let from = next.map_or(horizon, |position| position - 1);
        let upto = horizon.min(from.saturating_add(STEP_POSITIONS));
        client.update("SET LOCAL synchronous_commit = off", None, &[])?;
        client.update(COUNT_STEP, None, &[counted.into(), upto.into()])?;
        Ok::<_, pgrx::spi::SpiError>(Some((upto, horizon)))
    })
    .context("counting events per stream")
}

/// Count new final events, in steps, until the counts reach the horizon or
/// the budget is spent. A failure is logged and retried at the next interval.
pub(super) fn count_new_events() -> Counted {
    let started = Instant::now();
    loop {
        let step_started = Instant::now();
        match attempt(step) {
            Ok(None) => return Counted::Nothing,
            Ok(Some((counted, horizon))) if counted >= horizon => {
                return Counted::Through { position: counted, behind: false }
            }
            // Another step as long as this one would overrun the budget.
            Ok(Some((counted, _))) if started.elapsed() + step_started.elapsed() >= PASS_BUDGET => {
                return Counted::Through { position: counted, behind: true }
            }
            Ok(Some(_)) => {}
            Err(failure) => {
                warn_failed("counting events per stream", &failure, STATS_INTERVAL);
                return Counted::Nothing;
            }
        }
    }
}
