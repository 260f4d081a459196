//! The worker's part in how the log is stored (sql/storage.sql): it makes
//! the log's partitions ahead of need, and applies the opt-in retention by
//! dropping whole partitions, never one a consumer still needs unless told.
//! Both run with the maintenance, every [`SUMMARY_INTERVAL`].

use pgrx::prelude::*;

use super::maintenance::SUMMARY_INTERVAL;
use super::runtime::{attempt, warn_failed};
use crate::error::SpiContext;
use crate::hooks::partitions::dropping_for_retention;
use crate::log::partitions;

/// Make partitions until the one after the newest position's ends at least
/// half a partition ahead of it, so that publishers find theirs made.
/// `wanted`: a publisher asked for a partition it found missing (and waits
/// for it); only then is the first partition of a log without any made
/// here, since a database being restored from a dump has none until the
/// restore makes its own, and one made here would collide with it.
/// Returns the newest position at which to look again (None: at the next
/// interval).
pub(super) fn make_partitions_ahead(wanted: bool) -> Option<i64> {
    let result = attempt(|| {
        let log = crate::log::catalog::extension_log()?;
        if !partitions::is_partitioned(log) {
            return None;
        }
        let highest = partitions::of_table(log).last().copied();
        if highest.is_none() && !wanted {
            return None;
        }
        Spi::run("SET LOCAL lock_timeout = '1s'").context("setting lock_timeout for making partitions");
        let (newest, size) =
            Spi::get_two::<i64, i64>("SELECT streams._newest_position(), (streams._storage()).partition_size")
                .context("reading the newest position and the partition size");
        let (newest, size) = (newest.unwrap_or(0), size.unwrap_or(1_000_000).max(2));
        let highest = match highest {
            Some(highest) => highest,
            None => {
                Spi::run("SELECT streams._add_partition(0)").context("making the log's first partition");
                // SAFETY: inside this maintenance transaction.
                unsafe { pg_sys::CommandCounterIncrement() };
                partitions::of_table(log).last().copied()?
            }
        };
        let mut end = highest.upper;
        while newest + size / 2 >= end {
            // Far behind (the sequence moved on: a setval by a role with
            // pg_write_all_data, say): one partition from the highest one's
            // end up to the newest position's, not one per partition size
            // (thousands of them would fill the lock table in one transaction).
            let at = if (newest - end) / size > MAX_PARTITIONS_PER_PASS { newest } else { end };
            Spi::run_with_args("SELECT streams._add_partition($1)", &[at.into()]).context("making a partition ahead");
            // SAFETY: inside this maintenance transaction.
            unsafe { pg_sys::CommandCounterIncrement() };
            let made = partitions::of_table(log).last().map_or(end, |p| p.upper);
            if made <= end {
                break;
            }
            end = made;
        }
        Some(end - size / 2)
    });
    result.unwrap_or_else(|failure| {
        warn_failed("making partitions of the log", &failure, SUMMARY_INTERVAL);
        None
    })
}

/// More partitions than this missing below the newest position: the gap
/// gets one partition. A batch of many partitions' worth still gets its
/// partitions of the set size.
const MAX_PARTITIONS_PER_PASS: i64 = 64;

/// What retention would drop next.
struct Due {
    partition: pg_sys::Oid,
    end: i64,
    held: bool,
}

/// Apply the retention (streams.set_retention): drop the due partitions,
/// oldest first, one per transaction, and stop at one a consumer still
/// needs unless overrides_consumers says to mark it lost instead.
///
/// Each drop first locks the log ACCESS EXCLUSIVE (for at most
/// [`LOCK_TIMEOUT`], then it waits for the next interval: publishers queue
/// behind the lock while it waits), and only then decides, in a new
/// snapshot: every reader and consumer that held the log has finished, so
/// a consumer that moved back (a seek) before is seen, and one that comes
/// after finds the partition gone and reads LS001 (streams._retained).
pub(super) fn apply_retention() {
    const LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '50ms'";
    for _ in 0..MAX_DROPS_PER_INTERVAL {
        let dropped = attempt(|| {
            // A 0.2.0 log (not updated yet) is one table: nothing to drop.
            if !crate::log::catalog::extension_log().is_some_and(partitions::is_partitioned) {
                return false;
            }
            let Some(candidate) = next_due() else { return false };
            let overrides = Spi::get_one::<bool>("SELECT (streams._storage()).retention_overrides_consumers")
                .context("reading the retention settings")
                .unwrap_or(false);
            if candidate.held && !overrides {
                return false;
            }
            // The newest transaction in it, for replay(from_tx => ..): read
            // before the lock, as its events no longer change.
            let newest_tx = Spi::get_one::<String>(&format!(
                "SELECT max(p.tx)::text FROM {} p",
                regclass_text(candidate.partition)
            ))
            .context("reading the newest transaction of a partition");
            Spi::run(LOCK_TIMEOUT).context("setting lock_timeout for retention");
            Spi::run("LOCK TABLE streams.event_log IN ACCESS EXCLUSIVE MODE").context("locking the log for retention");
            let Some(due) = next_due() else { return false };
            if due.partition != candidate.partition || (due.held && !overrides) {
                return false;
            }
            drop_partition(&due, newest_tx);
            true
        });
        match result_of(dropped) {
            Some(true) => continue,
            _ => break,
        }
    }
}

/// At most this many partitions dropped per interval, so that a retention
/// turned on over a long log does not hold the worker from its rounds.
const MAX_DROPS_PER_INTERVAL: usize = 8;

/// The outcome of one retention step: whether it dropped a partition (a
/// lock timeout, 55P03, is a retry at the next interval, not a warning).
fn result_of(outcome: Result<bool, super::runtime::Failure>) -> Option<bool> {
    match outcome {
        Ok(dropped) => Some(dropped),
        Err(failure) if failure.sqlstate == "55P03" => None,
        Err(failure) => {
            warn_failed("applying retention", &failure, SUMMARY_INTERVAL);
            None
        }
    }
}

/// The first partition retention would drop now.
fn next_due() -> Option<Due> {
    Spi::connect(|client| {
        let rows = client.select(
            "SELECT d.partition::oid, d.end_position, d.held FROM streams._retention_due() d LIMIT 1",
            Some(1),
            &[],
        )?;
        if rows.is_empty() {
            return Ok::<_, pgrx::spi::Error>(None);
        }
        let row = rows.first();
        Ok(Some(Due {
            partition: row.get::<pg_sys::Oid>(1)?.unwrap_or(pg_sys::InvalidOid),
            end: row.get::<i64>(2)?.unwrap_or(0),
            held: row.get::<bool>(3)?.unwrap_or(true),
        }))
    })
    .context("finding the partitions retention would drop")
    .filter(|due: &Due| due.partition != pg_sys::InvalidOid)
}

/// Drop `due` (the log locked ACCESS EXCLUSIVE): mark the consumers it cuts
/// below as having lost events (only with overrides_consumers do any
/// remain), record the cut, forget the commit times below it.
fn drop_partition(due: &Due, newest_tx: Option<String>) {
    let name = regclass_text(due.partition);
    Spi::run_with_args(
        "WITH cut AS (
             SELECT p.newest_time FROM streams.partitions p WHERE p.partition = $1::pg_catalog.oid::pg_catalog.regclass)
         INSERT INTO streams.storage_settings AS s (first_position, cut_at, cut_time, cut_tx)
         SELECT $2, pg_catalog.now(), cut.newest_time, $3::xid8 FROM cut
         ON CONFLICT (id) DO UPDATE SET first_position = excluded.first_position, cut_at = excluded.cut_at,
             cut_time = GREATEST(s.cut_time, excluded.cut_time), cut_tx = GREATEST(s.cut_tx, excluded.cut_tx)",
        &[due.partition.into(), due.end.into(), newest_tx.into()],
    )
    .context("recording the retention cut");
    // Never silently: every subscription left below the cut (only with
    // overrides_consumers does one hold a partition and remain; a disabled
    // webhook's holds none), and every one whose dead letters go with the
    // partition, is marked until its owner moves it (streams.seek); one
    // marked before is marked again, with the new first position.
    Spi::run_with_args(
        "UPDATE streams.subscription_state s SET lost_before = $1
         WHERE s.position < $1 - 1
            OR s.lost_before IS NOT NULL
            OR EXISTS (SELECT FROM streams.subscription_failures f WHERE f.subscription = s.id AND f.position < $1)",
        &[due.end.into()],
    )
    .context("marking the subscriptions retention cut below");
    Spi::run_with_args("DELETE FROM streams.subscription_failures WHERE position < $1", &[due.end.into()])
        .context("forgetting the dead letters retention removed");
    // The removed positions' partition moves up to the new first one: it
    // stays empty, and a read of positions below the cut reaches it (plans
    // never prune it away) and fails with LS001 (streams._retained).
    dropping_for_retention(|| {
        Spi::run(&format!("DROP TABLE {name}")).context("dropping a partition for retention");
        Spi::run("DROP TABLE IF EXISTS streams.event_log_removed").context("dropping the old removed range");
    });
    Spi::run_with_args("SELECT streams._add_removed_range($1)", &[due.end.into()]).context("marking the removed range");
    Spi::run_with_args(
        "DELETE FROM streams.commit_times c
         WHERE c.first_position + pg_catalog.cardinality(c.times) <= $1",
        &[due.end.into()],
    )
    .context("forgetting the commit times retention removed");
}

/// `oid::regclass` as text: the partition's qualified, quoted name.
fn regclass_text(oid: pg_sys::Oid) -> String {
    Spi::get_one_with_args::<String>("SELECT $1::pg_catalog.oid::pg_catalog.regclass::text", &[oid.into()])
        .context("naming a partition")
        .unwrap_or_default()
}
