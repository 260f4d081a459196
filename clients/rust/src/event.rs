//! The one event type the library hands out, whatever path the event came
//! by (a replay row, a notification payload, `streams.get`, a poll), and
//! the cursor a subscriber persists.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::Error;

/// One committed event of the log.
///
/// Serialises to the canonical JSON form of an event (`position`,
/// `stream`, `time` in RFC 3339 UTC with microseconds, `tx`, then `type`,
/// `key` and `headers` only when set, then `data`), and reads it back:
///
/// ```
/// use litebase_streams_client::Event;
///
/// let text = r#"{"position":12,"stream":"payment.success","time":"2026-12-03T18:50:10.123456Z","tx":274094,"type":"paid","data":{"amount":49}}"#;
/// let event: Event = serde_json::from_str(text).unwrap();
/// assert_eq!((event.position, event.event_type.as_deref()), (12, Some("paid")));
/// assert_eq!(serde_json::to_string(&event).unwrap(), text);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The event's place on the database's timeline, unique in the log.
    pub position: i64,
    /// The stream it was published to.
    pub stream: String,
    /// The commit time of the publishing transaction (microseconds).
    #[serde(with = "rfc3339_micros")]
    pub time: DateTime<Utc>,
    /// The publishing transaction (`xid8`, never negative).
    pub tx: u64,
    /// The envelope's type, when published with one.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub event_type: Option<String>,
    /// The envelope's key (the entity the event is about), when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The envelope's headers (string values), when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<Map<String, Value>>,
    /// What was published.
    pub data: Value,
}

/// Where a subscriber is: the position of the last event it processed and
/// the log that position belongs to.
///
/// Persist it with the work the events caused, and give it back as
/// [`SubscribeOptions::after`](crate::SubscribeOptions::after) to resume
/// exactly after that event. Positions are only meaningful in their log:
/// when the database's `streams.log_id()` is another one (the extension was
/// re-created, the database restored), `subscribe` ends with
/// [`Error::LogChanged`] instead of guessing.
///
/// ```
/// use litebase_streams_client::Cursor;
///
/// let saved = serde_json::to_string(&Cursor { log_id: "0b6e…".into(), position: 41 }).unwrap();
/// let cursor: Cursor = serde_json::from_str(&saved).unwrap();
/// assert_eq!(cursor.position, 41);
/// assert_eq!(Cursor::start_of("0b6e…").position, 0);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Cursor {
    /// `streams.log_id()` as text.
    pub log_id: String,
    /// The last position processed (0: none yet).
    pub position: i64,
}

impl Cursor {
    /// The cursor before the first event of the log `log_id`.
    pub fn start_of(log_id: impl Into<String>) -> Cursor {
        Cursor { log_id: log_id.into(), position: 0 }
    }
}

/// The SELECT list every query of the library reads an event with, from
/// `streams.events` rows aliased `e`: position, stream, time, tx, data,
/// type, key, headers, all of types tokio-postgres knows (no type lookups,
/// no named statements: it works through PgBouncer).
pub(crate) const EVENT_COLUMNS: &str =
    "e.position, e.stream, e.\"time\", e.tx::text::bigint, e.data::text, e.type, e.key, e.headers::text";

impl Event {
    /// The event in `row`'s columns from `first` on, in the order of
    /// [`EVENT_COLUMNS`]; `None` when its position is NULL (no event).
    pub(crate) fn from_row(row: &tokio_postgres::Row, first: usize) -> Result<Option<Event>, Error> {
        let Some(position) = row.try_get::<_, Option<i64>>(first)? else { return Ok(None) };
        let time: Option<DateTime<Utc>> = row.try_get(first + 2)?;
        let time = time.ok_or_else(|| Error::Decode(format!("event {position} has no commit time")))?;
        let tx: i64 = row.try_get(first + 3)?;
        let data: Option<String> = row.try_get(first + 4)?;
        let headers: Option<String> = row.try_get(first + 7)?;
        Ok(Some(Event {
            position,
            stream: row.try_get(first + 1)?,
            time,
            tx: u64::try_from(tx).map_err(|_| Error::Decode(format!("event {position}: tx {tx}")))?,
            event_type: row.try_get(first + 5)?,
            key: row.try_get(first + 6)?,
            headers: headers.as_deref().map(|text| json(position, text)).transpose()?,
            data: data_json(position, data.as_deref().unwrap_or("null"))?,
        }))
    }

    /// The event a notification payload carries in full (not truncated, not
    /// private); `None` when it lacks the data.
    pub(crate) fn from_payload(payload: &litebase_streams_core::payload::Decoded<'_>) -> Result<Option<Event>, Error> {
        if payload.truncated || payload.private {
            return Ok(None);
        }
        let Some(data) = payload.data else { return Ok(None) };
        let position = payload.position;
        let time = DateTime::parse_from_rfc3339(payload.time)
            .map_err(|e| Error::Decode(format!("event {position}: time {:?}: {e}", payload.time)))?
            .with_timezone(&Utc);
        Ok(Some(Event {
            position,
            stream: payload.stream.to_owned(),
            time,
            tx: u64::try_from(payload.tx).map_err(|_| Error::Decode(format!("event {position}: tx {}", payload.tx)))?,
            event_type: payload.type_.clone(),
            key: payload.key.clone(),
            headers: payload.headers.map(|raw| json(position, raw.get())).transpose()?,
            data: data_json(position, data.get())?,
        }))
    }
}

fn json<T: serde::de::DeserializeOwned>(position: i64, text: &str) -> Result<T, Error> {
    serde_json::from_str(text).map_err(|e| Error::Decode(format!("event {position}: {e}")))
}

/// An event's `data`; its JSON text as a `Value::String` when it nests
/// deeper than serde_json parses (128 levels; jsonb allows thousands): an
/// error here would end every subscription and consumer of the stream at
/// that event, again at each restart.
fn data_json(position: i64, text: &str) -> Result<Value, Error> {
    match serde_json::from_str(text) {
        Err(e) if e.to_string().starts_with("recursion limit exceeded") => Ok(Value::String(text.to_owned())),
        parsed => parsed.map_err(|e| Error::Decode(format!("event {position}: {e}"))),
    }
}

/// `time` as the canonical form writes it: RFC 3339, UTC, microseconds, `Z`.
mod rfc3339_micros {
    use chrono::{DateTime, SecondsFormat, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(time: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&time.to_rfc3339_opts(SecondsFormat::Micros, true))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        DateTime::parse_from_rfc3339(&text).map(|t| t.with_timezone(&Utc)).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use litebase_streams_core::payload::{decode_payload, encode_payload, Event as Wire};

    fn wire<'a>(data: Option<&'a str>, private: bool) -> Wire<'a> {
        Wire {
            position: 7,
            stream: "payment.success",
            time_us: 1_700_000_000_000_001,
            tx: 812,
            prev: 3,
            type_: Some("paid"),
            key: Some("ord_1"),
            headers: Some(r#"{"trace": "x"}"#),
            data,
            private,
        }
    }

    #[test]
    fn a_payload_becomes_the_same_event_as_its_canonical_json() {
        let text = encode_payload(&wire(Some(r#"{"amount": 49}"#), false));
        let event = Event::from_payload(&decode_payload(&text).unwrap()).unwrap().expect("data is there");
        let canonical = r#"{"position":7,"stream":"payment.success","time":"2023-11-14T22:13:20.000001Z","tx":812,"type":"paid","key":"ord_1","headers":{"trace":"x"},"data":{"amount":49}}"#;
        assert_eq!(serde_json::to_string(&event).unwrap(), canonical);
        assert_eq!(serde_json::from_str::<Event>(canonical).unwrap(), event);
    }

    #[test]
    fn truncated_and_private_payloads_carry_no_event() {
        let private = encode_payload(&wire(Some("1"), true));
        assert_eq!(Event::from_payload(&decode_payload(&private).unwrap()).unwrap(), None);
        let big = format!("\"{}\"", "x".repeat(9000));
        let truncated = encode_payload(&wire(Some(&big), false));
        assert!(truncated.contains("\"truncated\":true"));
        assert_eq!(Event::from_payload(&decode_payload(&truncated).unwrap()).unwrap(), None);
    }

    #[test]
    fn a_bad_time_is_a_decode_error_not_a_panic() {
        let text = r#"{"position":1,"stream":"s","time":"yesterday","tx":1,"prev":0,"data":1}"#;
        assert!(matches!(Event::from_payload(&decode_payload(text).unwrap()), Err(Error::Decode(_))));
    }
}
