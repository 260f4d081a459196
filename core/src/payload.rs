//! Notification payloads: the event as compact JSON, with `prev`, the
//! position of the stream's previous event (so a listener can tell it
//! missed one); when it would not fit in one notification it is sent
//! without `data` and marked `"truncated": true`.

/// PostgreSQL refuses payloads of 8000 bytes or more (with the default block size).
pub const MAX_PAYLOAD_BYTES: usize = 7999;

/// One final event, as the worker reads it for delivery.
#[derive(Debug, Clone)]
pub struct Event<'a> {
    pub position: i64,
    pub stream: &'a str,
    /// Commit time, microseconds since the Unix epoch.
    pub time_us: i64,
    pub tx: i64,
    /// The position of the previous event of the same stream, 0 if none.
    pub prev: i64,
    /// The event's data as JSON text (jsonb's output form); `None` when it
    /// is too large to send anyway (the worker does not even read it).
    pub data: Option<&'a str>,
    /// The stream is private: the payload never carries `data`.
    pub private: bool,
}

/// RFC 3339, UTC, microseconds, `Z`: `2026-11-30T01:02:03.000004Z`.
/// (Written digit by digit: the worker formats one time per event, and
/// chrono's `format` parses its pattern on every call.)
pub fn format_time(unix_us: i64) -> String {
    use chrono::{Datelike, Timelike};
    let time = chrono::DateTime::from_timestamp_micros(unix_us).unwrap_or_default();
    let mut out = String::with_capacity(27);
    let mut digits = |value: u32, width: u32, then: char| {
        for place in (0..width).rev() {
            out.push(char::from(b'0' + (value / 10u32.pow(place) % 10) as u8));
        }
        out.push(then);
    };
    digits(time.year().clamp(0, 9999) as u32, 4, '-');
    digits(time.month(), 2, '-');
    digits(time.day(), 2, 'T');
    digits(time.hour(), 2, ':');
    digits(time.minute(), 2, ':');
    digits(time.second(), 2, '.');
    digits(time.timestamp_subsec_micros(), 6, 'Z');
    out
}

/// Drop the whitespace jsonb's output puts after `:` and `,` (and any other
/// insignificant whitespace), leaving string contents untouched; written
/// into `out` in runs between the dropped bytes.
pub fn write_compact_json<W: std::io::Write>(out: &mut W, text: &str) -> std::io::Result<()> {
    let bytes = text.as_bytes();
    let (mut in_string, mut escaped, mut run_start) = (false, false, 0);
    for (i, &b) in bytes.iter().enumerate() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
        } else if b == b'"' {
            in_string = true;
        } else if b.is_ascii_whitespace() {
            out.write_all(&bytes[run_start..i])?;
            run_start = i + 1;
        }
    }
    out.write_all(&bytes[run_start..])
}

/// The payload of an event with all of its data, whatever its size (for
/// webhooks, which send what notifications truncate), written into `out`
/// as it goes: the data is copied once, into `out`.
pub fn write_full_payload<W: std::io::Write>(out: &mut W, event: &Event<'_>) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(160);
    write_head(&mut head, event);
    out.write_all(&head)?;
    out.write_all(b",\"data\":")?;
    write_compact_json(out, event.data.unwrap_or("null"))?;
    out.write_all(b"}")
}

/// The notification payload of an event: compact JSON; without `data` and
/// with `"private": true` for a private stream; without `data` and with
/// `"truncated": true` when the full payload would not fit.
///
/// Written by hand, in the field order of the DESIGN's contract: the worker
/// encodes one per event, and the data is jsonb's own output (valid JSON,
/// numbers exactly as stored: 49.00 stays 49.00), so it needs compacting,
/// not parsing.
pub fn encode_payload(event: &Event<'_>) -> String {
    let data = event.data.filter(|text| !event.private && text.len() <= MAX_DATA_TEXT_BYTES);
    let mut out = Vec::with_capacity(160 + data.map_or(0, str::len));
    write_head(&mut out, event);
    if event.private {
        out.extend_from_slice(b",\"private\":true");
    } else {
        let without_data = out.len();
        if let Some(text) = data {
            out.extend_from_slice(b",\"data\":");
            write_compact_json(&mut out, text).expect("writing into a Vec cannot fail");
        }
        if data.is_none() || out.len() + 1 > MAX_PAYLOAD_BYTES {
            out.truncate(without_data);
            out.extend_from_slice(b",\"truncated\":true");
        }
    }
    out.push(b'}');
    String::from_utf8(out).expect("UTF-8 text and ASCII only")
}

/// `{"position":..,"stream":"..","time":"..","tx":..,"prev":..` (no closing brace).
fn write_head(out: &mut Vec<u8>, event: &Event<'_>) {
    use std::io::Write;
    out.extend_from_slice(b"{\"position\":");
    write!(out, "{}", event.position).expect("writing into a Vec cannot fail");
    out.extend_from_slice(b",\"stream\":");
    // Escaped by serde_json: a log restored from elsewhere is not trusted to
    // follow the naming rule (under which names need no escaping).
    serde_json::to_writer(&mut *out, event.stream).expect("writing into a Vec cannot fail");
    out.extend_from_slice(b",\"time\":\"");
    out.extend_from_slice(format_time(event.time_us).as_bytes());
    out.extend_from_slice(b"\",\"tx\":");
    write!(out, "{},\"prev\":{}", event.tx, event.prev).expect("writing into a Vec cannot fail");
}

/// Data text longer than this cannot fit a payload even once compacted
/// (compaction only drops the single spaces jsonb's output puts after `:`
/// and `,`, so it at most halves the text).
pub const MAX_DATA_TEXT_BYTES: usize = 2 * MAX_PAYLOAD_BYTES;

/// A notification payload as a client reads it: the fields
/// [`encode_payload`] writes, `data` as the raw JSON text it carried.
#[derive(Debug, serde::Deserialize)]
pub struct Decoded<'a> {
    pub position: i64,
    #[serde(borrow)]
    pub stream: &'a str,
    pub time: &'a str,
    pub tx: i64,
    #[serde(default)]
    pub prev: Option<i64>,
    #[serde(default, borrow)]
    pub data: Option<&'a serde_json::value::RawValue>,
    #[serde(default)]
    pub truncated: bool,
    #[serde(default)]
    pub private: bool,
}

/// Read a payload; `None` when it is not one (anyone may NOTIFY any channel).
pub fn decode_payload(text: &str) -> Option<Decoded<'_>> {
    serde_json::from_str(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_is_rfc3339_utc_with_microseconds() {
        assert_eq!(format_time(1_700_000_000_000_001), "2023-11-14T22:13:20.000001Z");
        assert_eq!(format_time(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(format_time(1_796_000_523_000_004), "2026-11-30T01:02:03.000004Z");
        assert_eq!(format_time(1_796_000_523_999_999), "2026-11-30T01:02:03.999999Z");
    }

    fn event(data: &str) -> Event<'_> {
        Event {
            position: 7,
            stream: "payment.success",
            time_us: 1_700_000_000_000_001,
            tx: 812,
            prev: 3,
            data: Some(data),
            private: false,
        }
    }

    #[test]
    fn private_payload_never_carries_data() {
        let mut e = event(r#"{"secret": 1}"#);
        e.private = true;
        let payload = encode_payload(&e);
        let value: serde_json::Value = serde_json::from_str(&payload).unwrap();
        assert_eq!(value["private"], serde_json::Value::Bool(true));
        assert!(value.get("data").is_none() && !payload.contains("secret"));
        assert_eq!(value["position"], 7);
    }

    #[test]
    fn data_the_worker_did_not_read_is_sent_truncated() {
        let mut e = event("{}");
        e.data = None;
        let value: serde_json::Value = serde_json::from_str(&encode_payload(&e)).unwrap();
        assert_eq!(value["truncated"], serde_json::Value::Bool(true));
        assert!(value.get("data").is_none());
    }

    #[test]
    fn payload_is_compact_and_keeps_numbers_exact() {
        let payload = encode_payload(&event(r#"{"amount": 49.00, "order_id": "ord_123"}"#));
        assert_eq!(
            payload,
            r#"{"position":7,"stream":"payment.success","time":"2023-11-14T22:13:20.000001Z","tx":812,"prev":3,"data":{"amount":49.00,"order_id":"ord_123"}}"#
        );
    }

    #[test]
    fn stream_names_are_escaped_as_json_strings() {
        let mut e = event("{}");
        e.stream = "odd\"name\\\u{1}";
        let value: serde_json::Value = serde_json::from_str(&encode_payload(&e)).unwrap();
        assert_eq!(value["stream"], "odd\"name\\\u{1}");
        let mut full = Vec::new();
        write_full_payload(&mut full, &e).unwrap();
        let value: serde_json::Value = serde_json::from_slice(&full).unwrap();
        assert_eq!(value["stream"], "odd\"name\\\u{1}");
        assert_eq!(value["data"], serde_json::json!({}));
    }

    fn compact_json(text: &str) -> String {
        let mut out = Vec::new();
        write_compact_json(&mut out, text).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn compaction_keeps_whitespace_inside_strings() {
        assert_eq!(compact_json(r#"{"a b": "c, d: \"e f\"", "n": [1, 2]}"#), r#"{"a b":"c, d: \"e f\"","n":[1,2]}"#);
    }

    #[test]
    fn oversized_payload_is_sent_truncated_without_data() {
        let big = format!(r#"{{"blob": "{}"}}"#, "x".repeat(20_000));
        let payload = encode_payload(&event(&big));
        let value: serde_json::Value = serde_json::from_str(&payload).unwrap();
        assert_eq!(value["truncated"], serde_json::Value::Bool(true));
        assert!(value.get("data").is_none());
        assert_eq!(value["position"], 7);
        assert!(payload.len() <= MAX_PAYLOAD_BYTES);
    }

    #[test]
    fn payload_at_the_limit_is_not_truncated() {
        let overhead = encode_payload(&event(r#""""#)).len();
        let fits = format!(r#""{}""#, "y".repeat(MAX_PAYLOAD_BYTES - overhead));
        let payload = encode_payload(&event(&fits));
        assert_eq!(payload.len(), MAX_PAYLOAD_BYTES);
        assert!(!payload.contains("truncated"));
    }

    #[test]
    fn a_payload_decodes_to_what_was_encoded() {
        let e = event(r#"{"amount": 49.00, "note": "a b"}"#);
        let text = encode_payload(&e);
        let d = decode_payload(&text).expect("a payload");
        assert_eq!((d.position, d.stream, d.tx, d.prev), (e.position, e.stream, e.tx, Some(e.prev)));
        assert_eq!(d.time, format_time(e.time_us));
        assert_eq!(d.data.map(|raw| raw.get()), Some(r#"{"amount":49.00,"note":"a b"}"#));
        assert!(!d.truncated && !d.private);
        let private = Event { private: true, ..e.clone() };
        let d = decode_payload_owned(&encode_payload(&private));
        assert!(d.0 && d.1.is_none(), "private: no data");
        assert!(decode_payload("not a payload").is_none());
        assert!(decode_payload(r#"{"position": 1}"#).is_none(), "fields missing");
    }

    fn decode_payload_owned(text: &str) -> (bool, Option<String>) {
        let d = decode_payload(text).expect("a payload");
        (d.private, d.data.map(|raw| raw.get().to_owned()))
    }
}
