//! One delivery round of a database's worker: compute the horizon, record the
//! commit time of each newly final transaction, NOTIFY each newly final event
//! in position order, and persist the new horizon, all in one transaction.
//!
//! Since the notifications are sent at that transaction's commit, a client
//! receives an event only once `streams.events` shows it, and a round that
//! fails (say, the notification queue is full) delivers nothing and persists
//! nothing: the next round starts again from the persisted horizon.

use std::cell::RefCell;
use std::ffi::CString;
use std::rc::Rc;

use pgrx::prelude::*;
use pgrx::spi::{OwnedPreparedStatement, SpiClient, SpiResult};
use pgrx::{PgBuiltInOids, PgOid};

use crate::horizon;
use crate::pg_decls;
use crate::notify::{encode_payload, Event};
use crate::shmem;

/// What a round did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// Nothing new became final; everything up to `horizon` is delivered.
    Idle { horizon: i64 },
    /// Delivered up to `horizon`; `more` when the batch limit cut the round short.
    Delivered { horizon: i64, more: bool },
    /// The extension is not installed in this database (any more).
    ExtensionGone,
}

/// The newly final events with their transaction's commit time, inserting a
/// `streams.transactions` row for each transaction seen for the first time.
const FETCH_FINAL_EVENTS: &str = "
WITH ev AS (
    SELECT position, stream, tx, data FROM streams.event_log
    WHERE position > $1 AND position <= $2
    ORDER BY position LIMIT $3
), fresh AS (
    INSERT INTO streams.transactions (tx, committed_at, first_position)
    SELECT ev.tx, coalesce(pg_xact_commit_timestamp(ev.tx::xid), statement_timestamp()), min(ev.position)
    FROM ev
    WHERE NOT EXISTS (SELECT 1 FROM streams.transactions t WHERE t.tx = ev.tx)
    GROUP BY ev.tx
    RETURNING tx, committed_at
)
SELECT ev.position, ev.stream::text, ev.tx::text::bigint,
       (extract(epoch FROM coalesce(f.committed_at, t.committed_at)) * 1000000)::bigint,
       ev.data::text
FROM ev
LEFT JOIN fresh f ON f.tx = ev.tx
LEFT JOIN streams.transactions t ON t.tx = ev.tx
ORDER BY ev.position";

const READ_STATE: &str = "SELECT streams.horizon(), streams._newest_position()";

/// An UPDATE (a HOT update of one row) in the common case; the row is
/// inserted by the first round instead of by the extension script, so that
/// restoring a dump (which carries the row) does not collide with it.
const SAVE_HORIZON: &str = "
WITH updated AS (UPDATE streams.horizon_state SET horizon = $1 WHERE id RETURNING 1)
INSERT INTO streams.horizon_state (id, horizon) SELECT true, $1 WHERE NOT EXISTS (SELECT FROM updated)";

/// Run one round inside the caller's transaction (which has an active snapshot).
pub fn run(db: pg_sys::Oid, batch_size: i64) -> Round {
    if unsafe { pg_sys::get_extension_oid(c"litebase_streams".as_ptr(), true) } == pg_sys::InvalidOid {
        return Round::ExtensionGone;
    }
    Spi::connect_mut(|client| deliver(client, db, batch_size))
        .unwrap_or_else(|e| error!("litebase_streams delivery: {e}"))
}

/// The round's three statements, planned once per worker and kept (the plan
/// cache re-plans them if the tables change).
struct Plans {
    read_state: OwnedPreparedStatement,
    fetch: OwnedPreparedStatement,
    save: OwnedPreparedStatement,
}

thread_local! {
    static PLANS: RefCell<Option<Rc<Plans>>> = const { RefCell::new(None) };
}

fn plans(client: &SpiClient<'_>) -> SpiResult<Rc<Plans>> {
    if let Some(plans) = PLANS.with(|p| p.borrow().clone()) {
        return Ok(plans);
    }
    let int8 = PgOid::BuiltIn(PgBuiltInOids::INT8OID);
    let plans = Rc::new(Plans {
        read_state: client.prepare(READ_STATE, &[])?.keep(),
        fetch: client.prepare_mut(FETCH_FINAL_EVENTS, &[int8, int8, int8])?.keep(),
        save: client.prepare_mut(SAVE_HORIZON, &[int8])?.keep(),
    });
    PLANS.with(|p| *p.borrow_mut() = Some(plans.clone()));
    Ok(plans)
}

fn deliver(client: &mut SpiClient<'_>, db: pg_sys::Oid, batch_size: i64) -> SpiResult<Round> {
    let plans = plans(client)?;
    // Order matters (see horizon.rs): the newest allocated position first,
    // then the publishers' slots, then a fresh snapshot for the events.
    let state = client.select(&plans.read_state, None, &[])?.first();
    let persisted = state.get::<i64>(1)?.unwrap_or(0);
    let max_allocated = state.get::<i64>(2)?.unwrap_or(0).max(0) as u64;
    let held = shmem::held_positions(db);
    let horizon = (horizon::compute(max_allocated, held.into_iter().map(|(_, low)| low)) as i64).max(persisted);
    if horizon == persisted {
        return Ok(Round::Idle { horizon: persisted });
    }
    unsafe {
        pg_sys::PopActiveSnapshot();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }

    let rows = client.update(&plans.fetch, None, &[persisted.into(), horizon.into(), batch_size.into()])?;
    let fetched = rows.len() as i64;
    let mut last = persisted;
    for row in rows {
        let (position, stream, tx, time_us, data) = (
            row.get::<i64>(1)?.unwrap_or_default(),
            row.get::<&str>(2)?.unwrap_or_default(),
            row.get::<i64>(3)?.unwrap_or_default(),
            row.get::<i64>(4)?.unwrap_or_default(),
            row.get::<&str>(5)?.unwrap_or("null"),
        );
        let payload = encode_payload(&Event { position, stream, time_us, tx, data })
            .unwrap_or_else(|e| error!("event {position} has data that is not valid JSON: {e}"));
        let channel = CString::new(stream).expect("stream names hold no NUL");
        let payload = CString::new(payload).expect("JSON text holds no NUL");
        pg_decls::notify(&channel, &payload);
        last = position;
    }

    let more = fetched == batch_size;
    let delivered = if more { last } else { horizon };
    client.update(&plans.save, None, &[delivered.into()])?;
    Ok(Round::Delivered { horizon: delivered, more })
}
