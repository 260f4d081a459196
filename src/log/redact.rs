//! Redaction: the one change a stored event may undergo. `streams.redact`
//! (one position) and `streams.redact_matching` (a stream's events by a
//! data filter or a key) replace an event's `data` with the tombstone
//! `{"redacted": true}` and its `headers` with null; position, stream,
//! time, tx, type and key stay. Each redaction is recorded in
//! `streams.redactions` (position, stream, by whom, when, why).
//!
//! Who: roles granted `'redact'` on the stream, explicitly (a superuser or
//! the extension's owner too needs the grant: the grant is the record that
//! someone may erase). The immutability trigger (`streams._refuse_change`)
//! refuses every UPDATE, DELETE and TRUNCATE of the log except the UPDATE
//! this module runs, which it recognises by a backend-local flag no SQL can
//! set: it is set only around that one statement, run as the log's owner,
//! on a table whose only triggers are the extension's.

use std::cell::Cell;

use pgrx::prelude::*;

use crate::error::{OrRaise, SpiContext, StreamsError};
use crate::ffi;
use crate::log::{privileges, publish};
use litebase_streams_core::names::validate_stream_name;

/// The data of a redacted event.
const TOMBSTONE: &str = r#"{"redacted": true}"#;
/// The longest reason kept.
const MAX_REASON: usize = 1000;

thread_local! {
    /// Set while this backend runs the redacting UPDATE.
    static REDACTING: Cell<bool> = const { Cell::new(false) };
}

/// `streams._refuse_change() → trigger`, BEFORE UPDATE OR DELETE OR
/// TRUNCATE ... FOR EACH STATEMENT on `streams.event_log`, and BEFORE UPDATE
/// OR DELETE ... FOR EACH ROW on it, which every partition inherits (both
/// ENABLE ALWAYS).
///
/// # Safety
/// SAFETY: fmgr calls it; `fcinfo->context` is checked to be a TriggerData before it is read.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn litebase_streams_refuse_change(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    let context = (*fcinfo).context;
    let (operation, table) = if !context.is_null() && (*context).type_ == pg_sys::NodeTag::T_TriggerData {
        let data = &*(context as *const pg_sys::TriggerData);
        let operation = match data.tg_event & pg_sys::TRIGGER_EVENT_OPMASK {
            pg_sys::TRIGGER_EVENT_UPDATE => "UPDATE",
            pg_sys::TRIGGER_EVENT_DELETE => "DELETE",
            pg_sys::TRIGGER_EVENT_TRUNCATE => "TRUNCATE",
            _ => "INSERT",
        };
        let rel = data.tg_relation;
        let schema = pg_sys::get_namespace_name((*(*rel).rd_rel).relnamespace);
        let name = std::ffi::CStr::from_ptr((*(*rel).rd_rel).relname.data.as_ptr()).to_string_lossy();
        let schema = if schema.is_null() {
            String::new()
        } else {
            std::ffi::CStr::from_ptr(schema).to_string_lossy().into_owned()
        };
        (operation, format!("{schema}.{name}"))
    } else {
        ("a call", "streams.event_log".to_owned())
    };
    if operation == "UPDATE" && REDACTING.with(|r| r.get()) {
        // FOR EACH ROW (the trigger each partition has): the new row goes on.
        let data = context as *const pg_sys::TriggerData;
        if ((*data).tg_event & pg_sys::TRIGGER_EVENT_ROW) != 0 {
            return pg_sys::Datum::from((*data).tg_newtuple);
        }
        return pg_sys::Datum::from(0);
    }
    StreamsError::ImmutableEvents { operation, table }.raise()
}

ffi::function_info_v1!(pg_finfo_litebase_streams_refuse_change);

/// `streams.redact(position bigint, reason text) → boolean`: redact the
/// final event at `position`; false when it was redacted already.
#[pg_extern(sql = false)]
fn redact(position: Option<i64>, reason: Option<&str>) -> bool {
    let position = position.ok_or(StreamsError::NullArgument("position")).or_raise();
    let reason = checked_reason(reason);
    let sequence = publish::position_sequence();
    let owner = publish::log_owner(sequence);
    Spi::connect_mut(|client| {
        require_any_grant(client);
        let stream: Option<String> = privileges::as_owner(owner, || {
            client
                .select(
                    "SELECT e.stream FROM streams.event_log e WHERE e.position = $1 AND e.position <= streams.horizon()",
                    Some(1),
                    &[position.into()],
                )
                .and_then(|rows| if rows.is_empty() { Ok(None) } else { rows.first().get::<String>(1) })
                .context("finding the event to redact")
        });
        // An event of a stream the caller may not redact answers as a missing
        // one: neither its existence nor its stream is the caller's to learn.
        match stream {
            Some(stream) if may_redact(client, Some(&stream)) => {}
            _ => StreamsError::NoSuchEvent(position).raise(),
        }
        let redacted = redact_where(client, owner, "e.position = $1", vec![position.into()], reason);
        redacted > 0
    })
}

/// `streams.redact_matching(stream text, reason text, filter jsonb, key
/// text) → bigint`: redact the final events of `stream` whose data contains
/// `filter` and whose key is `key` (each when given, at least one);
/// returns how many were redacted.
#[pg_extern(sql = false)]
fn redact_matching(stream: Option<&str>, reason: Option<&str>, filter: Option<pgrx::JsonB>, key: Option<&str>) -> i64 {
    let stream = stream.ok_or(StreamsError::NullArgument("stream")).or_raise();
    validate_stream_name(stream).or_raise();
    let reason = checked_reason(reason);
    if filter.is_none() && key.is_none() {
        StreamsError::RedactionNeedsSelection.raise();
    }
    let sequence = publish::position_sequence();
    let owner = publish::log_owner(sequence);
    Spi::connect_mut(|client| {
        require_grant(client, stream);
        redact_where(
            client,
            owner,
            "e.stream = $1 AND ($2::jsonb IS NULL OR e.data @> $2::jsonb) AND ($3::text IS NULL OR e.key = $3::text)",
            vec![stream.into(), filter.into(), key.into()],
            reason,
        )
    })
}

fn checked_reason(reason: Option<&str>) -> &str {
    let reason = reason.ok_or(StreamsError::NullArgument("reason")).or_raise();
    if reason.trim().is_empty() {
        StreamsError::InvalidEnvelope { argument: "reason", reason: "it is empty".into() }.raise();
    }
    if reason.len() > MAX_REASON {
        StreamsError::TextTooLong { argument: "reason", limit: MAX_REASON }.raise();
    }
    reason
}

/// 42501 unless the caller holds a redact grant on some stream (before
/// anything is looked up for it).
fn require_any_grant(client: &pgrx::spi::SpiClient<'_>) {
    if !may_redact(client, None) {
        StreamsError::PermissionDenied { privilege: "redact", stream: "*".into() }.raise();
    }
}

/// Whether the caller may redact `stream` (None: any stream).
fn may_redact(client: &pgrx::spi::SpiClient<'_>, stream: Option<&str>) -> bool {
    client
        .select("SELECT streams._may_redact($1)", Some(1), &[stream.into()])
        .and_then(|rows| rows.first().get::<bool>(1))
        .context("checking the redact privilege")
        == Some(true)
}

/// 42501 unless the caller may redact `stream`.
fn require_grant(client: &pgrx::spi::SpiClient<'_>, stream: &str) {
    if !may_redact(client, Some(stream)) {
        StreamsError::PermissionDenied { privilege: "redact", stream: stream.to_owned() }.raise();
    }
}

/// Tombstone the final events `condition` selects that were not redacted
/// yet (by the record, not by the data: an event published with the
/// tombstone as its data may still carry headers) (on
/// `streams.event_log e`, with `args` from $1) and record each, as the
/// log's owner; returns how many.
fn redact_where(
    client: &mut pgrx::spi::SpiClient<'_>,
    owner: pg_sys::Oid,
    condition: &str,
    mut args: Vec<pgrx::datum::DatumWithOid<'_>>,
    reason: &str,
) -> i64 {
    // SAFETY: the backend's current user id, set once it is connected.
    let by = unsafe { pg_sys::GetUserId() };
    let n = args.len();
    let sql = format!(
        "WITH r AS (
            UPDATE streams.event_log e SET data = '{TOMBSTONE}'::jsonb, headers = NULL
            WHERE {condition} AND e.position <= streams.horizon()
              AND NOT EXISTS (SELECT FROM streams.redactions x WHERE x.position = e.position)
            RETURNING e.position, e.stream)
         INSERT INTO streams.redactions (position, stream, redacted_by, reason)
         SELECT r.position, r.stream, ${}::oid::pg_catalog.regrole, ${} FROM r",
        n + 1,
        n + 2
    );
    args.push(by.into());
    args.push(reason.into());
    privileges::as_owner(owner, || {
        REDACTING.with(|r| r.set(true));
        // Cleared whether the statement succeeds or raises.
        let _reset = Reset;
        client.update(&sql, None, &args).context("redacting").len() as i64
    })
}

/// Clears [`REDACTING`] when dropped (also while an ERROR unwinds).
struct Reset;

impl Drop for Reset {
    fn drop(&mut self) {
        REDACTING.with(|r| r.set(false));
    }
}
