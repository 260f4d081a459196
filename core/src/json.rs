//! The canonical JSON form of an event, the one every path hands out:
//!
//! `{"position":12,"stream":"payment.success","time":"2026-12-03T18:50:10.123456Z","tx":274094,`
//! then `"type"`, `"key"` and `"headers"` only when set, then `"data":…}`:
//! compact, `position` and `tx` JSON numbers, `time` RFC 3339 UTC with
//! microseconds and `Z`, `data` jsonb's own text compacted (numbers as
//! stored: 49.00 stays 49.00). `streams.to_json` writes it for a replay row,
//! the gateway for its pages, SSE `data:` and WebSocket messages; a
//! notification payload and a webhook event ([`crate::payload`]) are the
//! same bytes with `"prev"` right after `tx`. The writers below are shared
//! by all of them, so the forms cannot drift apart.

use std::io::Write;

/// An event, its parts as the canonical form needs them.
#[derive(Debug, Clone, Copy)]
pub struct EventJson<'a> {
    pub position: i64,
    pub stream: &'a str,
    /// The commit time as [`format_time`] writes it.
    pub time: &'a str,
    pub tx: i64,
    pub type_: Option<&'a str>,
    pub key: Option<&'a str>,
    /// JSON text of an object (jsonb's output form), compacted here.
    pub headers: Option<&'a str>,
    /// JSON text (jsonb's output form), compacted here.
    pub data: &'a str,
}

impl EventJson<'_> {
    /// The canonical form, appended to `out`; returns the offset in `out`
    /// where the envelope starts (`,"type":` when it has a type), right
    /// after `tx`.
    pub fn write(&self, out: &mut Vec<u8>) -> usize {
        write_head(out, self.position, self.stream, self.time, self.tx, None);
        let envelope_at = out.len();
        write_envelope(out, self.type_, self.key, self.headers);
        out.extend_from_slice(b",\"data\":");
        write_compact_json(out, self.data).expect("writing into a Vec cannot fail");
        out.push(b'}');
        envelope_at
    }

    /// The canonical form as a string.
    pub fn to_json(&self) -> String {
        let mut out = Vec::with_capacity(128 + self.data.len() + self.headers.map_or(0, str::len));
        self.write(&mut out);
        String::from_utf8(out).expect("UTF-8 text and ASCII only")
    }
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
pub fn write_compact_json<W: Write>(out: &mut W, text: &str) -> std::io::Result<()> {
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

/// `{"position":..,"stream":"..","time":"..","tx":..`, then `,"prev":..`
/// when given (no closing brace).
pub(crate) fn write_head(out: &mut Vec<u8>, position: i64, stream: &str, time: &str, tx: i64, prev: Option<i64>) {
    out.extend_from_slice(b"{\"position\":");
    write!(out, "{position}").expect("writing into a Vec cannot fail");
    out.extend_from_slice(b",\"stream\":");
    // Escaped by serde_json: a log restored from elsewhere is not trusted to
    // follow the naming rule (under which names need no escaping), nor a
    // time read from a notification anyone may send.
    serde_json::to_writer(&mut *out, stream).expect("writing into a Vec cannot fail");
    out.extend_from_slice(b",\"time\":");
    serde_json::to_writer(&mut *out, time).expect("writing into a Vec cannot fail");
    write!(out, ",\"tx\":{tx}").expect("writing into a Vec cannot fail");
    if let Some(prev) = prev {
        write!(out, ",\"prev\":{prev}").expect("writing into a Vec cannot fail");
    }
}

/// `,"type":..`, `,"key":..` and `,"headers":{..}`, each when set.
pub(crate) fn write_envelope(out: &mut Vec<u8>, type_: Option<&str>, key: Option<&str>, headers: Option<&str>) {
    write_text_field(out, b",\"type\":", type_);
    write_text_field(out, b",\"key\":", key);
    write_headers(out, headers);
}

/// `,"name":"value"` when `value` is set, escaped by serde_json.
pub(crate) fn write_text_field(out: &mut Vec<u8>, name: &[u8], value: Option<&str>) {
    if let Some(value) = value {
        out.extend_from_slice(name);
        serde_json::to_writer(&mut *out, value).expect("writing into a Vec cannot fail");
    }
}

/// `,"headers":{..}` (compacted) when the event has headers.
pub(crate) fn write_headers(out: &mut Vec<u8>, headers: Option<&str>) {
    if let Some(text) = headers {
        out.extend_from_slice(b",\"headers\":");
        write_compact_json(out, text).expect("writing into a Vec cannot fail");
    }
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

    #[test]
    fn compaction_keeps_whitespace_inside_strings() {
        let mut out = Vec::new();
        write_compact_json(&mut out, r#"{"a b": "c, d: \"e f\"", "n": [1, 2]}"#).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), r#"{"a b":"c, d: \"e f\"","n":[1,2]}"#);
    }

    #[test]
    fn the_canonical_form_is_compact_ordered_and_keeps_numbers() {
        let time = format_time(1_700_000_000_000_001);
        let plain = EventJson {
            position: 12,
            stream: "payment.success",
            time: &time,
            tx: 274094,
            type_: None,
            key: None,
            headers: None,
            data: r#"{"amount": 49.00, "note": "é, ☃"}"#,
        };
        assert_eq!(
            plain.to_json(),
            r#"{"position":12,"stream":"payment.success","time":"2023-11-14T22:13:20.000001Z","tx":274094,"data":{"amount":49.00,"note":"é, ☃"}}"#
        );
        let typed = EventJson { type_: Some("t"), key: Some("k \"1\""), headers: Some(r#"{"a": "b"}"#), ..plain };
        let mut out = b"[".to_vec();
        let at = typed.write(&mut out);
        let text = String::from_utf8(out).unwrap();
        assert!(text[at..].starts_with(r#","type":"t","key":"k \"1\"","headers":{"a":"b"},"data":{"#), "{text}");
        assert!(text[..at].ends_with(r#""tx":274094"#), "{text}");
    }
}
