//! `streams.to_json(e streams.events)` (sql/streams.sql): a replay row in
//! the canonical JSON form of an event, the bytes a notification carries
//! for it without `prev` (and always with `data`), written by the encoder
//! the worker's notifications, the webhooks and the gateway share
//! (`litebase_streams_core::json`). The SQL function hands the row's
//! fields to this one as text where that keeps them exact: the data and
//! headers as jsonb prints them (49.00 stays 49.00), the transaction id as
//! its digits.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;

use litebase_streams_core::json::{format_time, EventJson};

/// The canonical JSON text of an event, declared `RETURNS json` by hand
/// (json is text inside: the text is returned as it is, key order and all).
/// A missing field, which a row of `streams.events` never has, is written
/// empty (`data`: null).
#[allow(clippy::too_many_arguments)] // the columns of streams.events, one each
#[pg_extern(sql = false, immutable, parallel_safe)]
pub(crate) fn _event_json(
    position: Option<i64>,
    stream: Option<&str>,
    time: Option<TimestampWithTimeZone>,
    tx: Option<i64>,
    type_: Option<&str>,
    key: Option<&str>,
    headers: Option<&str>,
    data: Option<&str>,
) -> String {
    let time = time.map_or_else(String::new, |t| format_time(crate::log::commit_times::unix_micros(t)));
    EventJson {
        position: position.unwrap_or_default(),
        stream: stream.unwrap_or_default(),
        time: &time,
        tx: tx.unwrap_or_default(),
        type_,
        key,
        headers,
        data: data.unwrap_or("null"),
    }
    .to_json()
}
