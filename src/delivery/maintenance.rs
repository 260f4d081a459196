//! The worker's housekeeping between rounds, every [`SUMMARY_INTERVAL`]:
//! summarising new BRIN ranges of the log, merging the short rows of
//! commit times the rounds wrote, and forgetting idempotency keys older than
//! the window. None makes an event final, so they commit without waiting for
//! the WAL flush or synchronous standbys.

use std::time::Duration;

use pgrx::prelude::*;

use super::runtime::{attempt, warn_failed};
use crate::error::SpiContext;

/// How often the worker summarises new BRIN ranges and merges commit times.
pub(super) const SUMMARY_INTERVAL: Duration = Duration::from_secs(5);

/// Summarise the block ranges the log's BRIN indexes have not covered yet
/// (they are created with autosummarize off: at high rates its per-range
/// autovacuum requests overflow their queue and flood the server log). A
/// failure is logged and retried at the next interval.
pub(super) fn summarize_new_ranges() {
    // The partitions' indexes (relkind 'i'): the log's own is partitioned
    // ('I') and holds no ranges.
    const SUMMARIZE: &str = "SELECT pg_catalog.brin_summarize_new_values(i.oid)
        FROM pg_catalog.pg_class i
        WHERE i.relnamespace = 'streams'::pg_catalog.regnamespace AND i.relkind = 'i'
          AND i.relam = (SELECT a.oid FROM pg_catalog.pg_am a WHERE a.amname = 'brin')";
    let result = attempt(|| {
        // Only the extension's own indexes: summarising runs index
        // expressions, and the worker is a superuser.
        if crate::log::catalog::extension_log().is_none() {
            return;
        }
        commit_without_waiting();
        Spi::run(SUMMARIZE).context("summarizing BRIN ranges")
    });
    match result {
        // A lock timeout means autovacuum is on the table (and summarises too).
        Err(failure) if failure.sqlstate != "55P03" => warn_failed("BRIN summarization", &failure, SUMMARY_INTERVAL),
        _ => {}
    }
}

/// Let the current maintenance transaction commit without waiting for the
/// WAL flush or for synchronous standbys. It makes no event final (merged
/// commit times keep their values; a crash that loses it leaves the rows as
/// they were), so only rounds need `synchronous_commit = on`, and a
/// maintenance write must not leave the worker waiting on an absent standby.
fn commit_without_waiting() {
    Spi::run("SET LOCAL synchronous_commit = off").context("setting synchronous_commit for maintenance");
}

/// Merge the short rows of commit times the rounds wrote (commit_times.rs).
/// A failure is logged and retried at the next interval.
pub(super) fn compact_commit_times(compacted: &mut crate::log::commit_times::Compacted) {
    let result = attempt(|| {
        commit_without_waiting();
        Spi::connect_mut(|client| crate::log::commit_times::compact(client, compacted)).context("merging commit times")
    });
    if let Err(failure) = result {
        warn_failed("merging commit times", &failure, SUMMARY_INTERVAL);
    }
}

/// The most idempotency keys one interval deletes: at 10,000 per 5 s the
/// worker keeps up with 2,000 keyed publishes per second, and a larger
/// backlog (after the window was shortened) goes in steps instead of one
/// long transaction.
const FORGET_PER_INTERVAL: i64 = 10_000;

/// Delete idempotency keys older than `litebase_streams.idempotency_window`
/// (publish already treats them as forgotten; this bounds the table). Not
/// before the 0.3.0 update, which made the table. A failure is logged and
/// retried at the next interval.
pub(super) fn forget_idempotency_keys() {
    const FORGET: &str = "DELETE FROM streams.idempotency_keys k
        WHERE k.ctid = ANY (ARRAY(SELECT o.ctid FROM streams.idempotency_keys o
                                  WHERE o.created_at < pg_catalog.now() - pg_catalog.make_interval(secs => $1)
                                  LIMIT $2))";
    let result = attempt(|| {
        let exists = Spi::get_one::<bool>("SELECT pg_catalog.to_regclass('streams.idempotency_keys') IS NOT NULL")
            .context("looking up streams.idempotency_keys");
        if exists != Some(true) {
            return;
        }
        commit_without_waiting();
        let window = crate::gucs::idempotency_window_s() as f64;
        Spi::run_with_args(FORGET, &[window.into(), FORGET_PER_INTERVAL.into()]).context("forgetting idempotency keys");
    });
    if let Err(failure) = result {
        warn_failed("forgetting idempotency keys", &failure, SUMMARY_INTERVAL);
    }
}
