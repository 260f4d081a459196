//! The round's statements, planned once per worker and kept: reading the
//! state (the horizon's row, by the ctid this worker wrote last), the
//! events becoming final with their commit times, the private streams, and
//! saving the state; each in the current schema's form and in 0.1.0's,
//! and the events with their envelope (`type`, `key`, `headers`) only when
//! the log has those columns (0.3.0 on: see [`log_has_envelope`]).
//!
//! [`log_has_envelope`]: crate::log::catalog::log_has_envelope

use std::cell::RefCell;
use std::rc::Rc;

use pgrx::spi::{OwnedPreparedStatement, SpiClient, SpiResult};
use pgrx::{PgBuiltInOids, PgOid};

use crate::log::catalog::Schema;
use crate::log::commit_times;

/// The events a round makes final, at most `$3` of `($1, $2]`, with their
/// exact commit time (null when it is lost: see [`commit_times`]).
///
/// A commit time is exact only when it belongs to the transaction: it is gone
/// when `pg_commit_ts` was truncated before the worker ran, and it belongs to
/// another transaction when the event was restored from a dump (its `tx` is
/// another cluster's, its row was inserted by the restore). An event
/// inserted by its own transaction has `xmin` = `tx` or a subtransaction of
/// it, which commits at the same time; when `xmin`'s commit time is gone too
/// the event is taken to be its own.
const FETCH_NEW: &str = "
SELECT e.position, e.stream::text, e.tx::text::bigint,
       CASE WHEN e.xmin = e.tx::xid
              OR pg_catalog.pg_xact_commit_timestamp(e.xmin) IS NULL
              OR pg_catalog.pg_xact_commit_timestamp(e.xmin) = pg_catalog.pg_xact_commit_timestamp(e.tx::xid)
            THEN pg_catalog.pg_xact_commit_timestamp(e.tx::xid) END,
       e.data, /*envelope*/
FROM streams.event_log e
WHERE e.position > $1 AND e.position <= $2
ORDER BY e.position LIMIT $3";

/// Final events whose commit times an earlier round recorded (notification
/// rounds after a split), the same columns.
const FETCH_RECORDED: &str = "
SELECT e.position, e.stream::text, e.tx::text::bigint, streams._commit_time(e.position), e.data, /*envelope*/
FROM streams.event_log e
WHERE e.position > $1 AND e.position <= $2
ORDER BY e.position LIMIT $3";

/// The columns `/*envelope*/` stands for in [`FETCH_NEW`] and
/// [`FETCH_RECORDED`]: the envelope, or nulls of its types for a log
/// without it (before the 0.3.0 update).
const ENVELOPE: &str = "e.type, e.key, e.headers";
const NO_ENVELOPE: &str = "NULL::text, NULL::text, NULL::jsonb";

/// 0.1.0 has one era and nowhere to say that a commit time was lost (nor
/// an envelope).
const FETCH_V0_1: &str = "
WITH ev AS (
    SELECT position, stream, tx, data FROM streams.event_log
    WHERE position > $1 AND position <= $2
    ORDER BY position LIMIT $3
), fresh AS (
    INSERT INTO streams.transactions (tx, committed_at, first_position)
    SELECT ev.tx, coalesce(pg_catalog.pg_xact_commit_timestamp(ev.tx::xid), pg_catalog.statement_timestamp()),
           pg_catalog.min(ev.position)
    FROM ev
    WHERE NOT EXISTS (SELECT 1 FROM streams.transactions t WHERE t.tx = ev.tx)
    GROUP BY ev.tx
    RETURNING tx, committed_at
)
SELECT ev.position, ev.stream::text, ev.tx::text::bigint,
       coalesce(f.committed_at, t.committed_at), ev.data, NULL::text, NULL::text, NULL::jsonb
FROM ev
LEFT JOIN fresh f ON f.tx = ev.tx
LEFT JOIN streams.transactions t ON t.tx = ev.tx
ORDER BY ev.position";

/// The round's state: the row version this worker wrote last (`$1`, its
/// ctid), found at once however many old versions a long-open snapshot
/// keeps (see `streams.horizon_state` in sql/streams.sql). Null columns when
/// that version is not the visible one: [`READ_STATE`] then looks it up.
const READ_STATE_AT: &str = "
SELECT h.horizon, coalesce(h.delivered, h.horizon),
       (SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END FROM streams.position_seq s),
       h.system_identifier, h.era_bounds, h.ctid::text
FROM (SELECT NULL) AS one LEFT JOIN streams.horizon_state h ON h.ctid = $1::text::tid";

/// The round's state, as readers find it: the version with the highest
/// horizon. For the first round, and after someone else wrote the row (a
/// restore).
const READ_STATE: &str = "
SELECT h.horizon, coalesce(h.delivered, h.horizon),
       (SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END FROM streams.position_seq s),
       h.system_identifier, h.era_bounds, h.row_ctid::text
FROM (SELECT NULL) AS one
LEFT JOIN (SELECT s.horizon, s.delivered, s.system_identifier, s.era_bounds, s.ctid AS row_ctid
           FROM streams.horizon_state s ORDER BY s.horizon DESC LIMIT 1) h ON true";

const READ_STATE_V0_1: &str =
    "SELECT streams.horizon(), streams.horizon(), streams._newest_position(), NULL::bigint, NULL::bigint[], NULL::text";

/// The previous event of a stream, for an event whose stream the worker has
/// not notified since it started.
const PREVIOUS: &str = "SELECT pg_catalog.max(e.position) FROM streams.event_log e
                        WHERE e.stream = $1 COLLATE \"C\" AND e.position < $2";

/// Read with the same fresh snapshot as the events it applies to, so an
/// event published after `set_private` committed is always sent without data.
const READ_PRIVATE: &str = "SELECT pg_catalog.array_agg(p.stream::text) FROM streams.private_streams p";
const READ_PRIVATE_V0_1: &str = "SELECT NULL::text[]";

/// Saves the round's state: a new version of the row version the round
/// read (`$7`, its ctid), written only over the state the round read (`$5`
/// horizon, `$6` system identifier). The round read the state with an older
/// snapshot than this statement's, and only the worker writes the row,
/// except a restore: pg_restore's COPY can commit in between, and
/// overwriting the restored row with this cluster's identifier would hide
/// the restore (no new era). Returns the new version's ctid when it wrote
/// one.
const SAVE: &str = "
UPDATE streams.horizon_state
SET horizon = $1, delivered = NULLIF($2, $1), system_identifier = $3, era_bounds = $4
WHERE ctid = $7::text::tid AND horizon = $5 AND system_identifier IS NOT DISTINCT FROM $6
RETURNING ctid::text";

/// [`SAVE`] for the first round, which read no row: the row is inserted by
/// the worker instead of by the extension script, so that restoring a dump
/// (which carries the row) does not collide with it. A row a restore
/// inserted in between is left alone: nothing is written. Takes the same
/// parameters (`$5` to `$7` are null, so unused).
const SAVE_FIRST: &str = "
INSERT INTO streams.horizon_state (id, horizon, delivered, system_identifier, era_bounds)
SELECT true, $1, NULLIF($2, $1), $3, $4
WHERE NOT EXISTS (SELECT FROM streams.horizon_state)
RETURNING ctid::text";

/// 0.1.0 has no delivered position and no eras; `$2` to `$7` are unused.
const SAVE_V0_1: &str = "
WITH updated AS (UPDATE streams.horizon_state SET horizon = $1 WHERE id RETURNING 1),
inserted AS (
    INSERT INTO streams.horizon_state (id, horizon) SELECT true, $1 WHERE NOT EXISTS (SELECT FROM updated) RETURNING 1
)
SELECT NULL::text FROM (SELECT 1 FROM updated UNION ALL SELECT 1 FROM inserted) AS written";

/// The round's statements, planned once per worker and kept (the plan cache
/// re-plans them if the tables change); prepared anew when the schema
/// version changes, and when the log gains the envelope's columns.
pub(super) struct Plans {
    pub(super) schema: Schema,
    /// The log has the envelope's columns: the fetches read them.
    pub(super) envelope: bool,
    /// The current schema only: [`READ_STATE_AT`].
    pub(super) read_state_at: Option<OwnedPreparedStatement>,
    pub(super) read_state: OwnedPreparedStatement,
    pub(super) read_private: OwnedPreparedStatement,
    pub(super) previous: OwnedPreparedStatement,
    /// Events becoming final (0.1.0: recording their commit times too):
    /// position, stream, tx, time, data, type, key, headers.
    pub(super) fetch_new: OwnedPreparedStatement,
    /// The current schema only: events made final before, and the insert of
    /// commit times.
    pub(super) recorded: Option<Recorded>,
    pub(super) save: OwnedPreparedStatement,
    /// The current schema only: [`SAVE_FIRST`] (0.1.0's save does both).
    pub(super) save_first: Option<OwnedPreparedStatement>,
}

pub(super) struct Recorded {
    pub(super) fetch: OwnedPreparedStatement,
    pub(super) insert_times: OwnedPreparedStatement,
}

thread_local! {
    static PLANS: RefCell<Option<Rc<Plans>>> = const { RefCell::new(None) };
}

pub(super) fn plans(client: &SpiClient<'_>, schema: Schema, envelope: bool) -> SpiResult<Rc<Plans>> {
    let envelope = envelope && schema == Schema::Current;
    if let Some(plans) = PLANS.with(|p| p.borrow().clone()).filter(|p| p.schema == schema && p.envelope == envelope) {
        return Ok(plans);
    }
    let columns = |sql: &str| sql.replace("/*envelope*/", if envelope { ENVELOPE } else { NO_ENVELOPE });
    let int8 = PgOid::BuiltIn(PgBuiltInOids::INT8OID);
    let int8_array = PgOid::BuiltIn(PgBuiltInOids::INT8ARRAYOID);
    let (read_state, read_private, fetch_new, save) = match schema {
        Schema::Current => (READ_STATE, READ_PRIVATE, FETCH_NEW, SAVE),
        Schema::V0_1 => (READ_STATE_V0_1, READ_PRIVATE_V0_1, FETCH_V0_1, SAVE_V0_1),
    };
    let range = [int8, int8, int8];
    let text = PgOid::BuiltIn(PgBuiltInOids::TEXTOID);
    let save_types = [int8, int8, int8, int8_array, int8, int8, text];
    let recorded = match schema {
        Schema::Current => Some(Recorded {
            fetch: client.prepare(&columns(FETCH_RECORDED), &range)?.keep(),
            insert_times: client
                .prepare_mut(commit_times::INSERT, &commit_times::INSERT_TYPES.map(PgOid::from))?
                .keep(),
        }),
        Schema::V0_1 => None,
    };
    let plans = Rc::new(Plans {
        schema,
        envelope,
        read_state_at: match schema {
            Schema::Current => Some(client.prepare(READ_STATE_AT, &[text])?.keep()),
            Schema::V0_1 => None,
        },
        read_state: client.prepare(read_state, &[])?.keep(),
        read_private: client.prepare(read_private, &[])?.keep(),
        previous: client.prepare(PREVIOUS, &[text, int8])?.keep(),
        fetch_new: client.prepare_mut(&columns(fetch_new), &range)?.keep(),
        recorded,
        save: client.prepare_mut(save, &save_types)?.keep(),
        save_first: match schema {
            Schema::Current => Some(client.prepare_mut(SAVE_FIRST, &save_types)?.keep()),
            Schema::V0_1 => None,
        },
    });
    PLANS.with(|p| *p.borrow_mut() = Some(plans.clone()));
    Ok(plans)
}
