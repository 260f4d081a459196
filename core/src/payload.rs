//! Notification payloads: the event as compact JSON, with `prev`, the
//! position of the stream's previous event (so a listener can tell it
//! missed one), and the event's envelope (`type`, `key`, `headers`) when it
//! has one; when it would not fit in one notification it is sent without
//! `data` (and then without `headers`) and marked `"truncated": true`.
//!
//! The envelope's fields are written only when they are set, so the
//! payload of an event without one is byte for byte what it was before
//! events had envelopes.

pub use crate::json::{format_time, write_compact_json};
use crate::json::{write_envelope, write_head, write_headers, write_text_field};

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
    /// The event's type, when it has one.
    pub type_: Option<&'a str>,
    /// The event's key, when it has one (never in a private stream's payload).
    pub key: Option<&'a str>,
    /// The event's headers as JSON text (jsonb's output form, a JSON object),
    /// when it has them (never in a private stream's payload).
    pub headers: Option<&'a str>,
    /// The event's data as JSON text (jsonb's output form); `None` when it
    /// is too large to send anyway (the worker does not even read it).
    pub data: Option<&'a str>,
    /// The stream is private: the payload never carries `data`, `key` or
    /// `headers` (its `type` it does: a listener may filter on it).
    pub private: bool,
}

/// The payload of an event with all of its data and envelope, whatever its
/// size (for webhooks, which send what notifications truncate), written
/// into `out` as it goes: the data is copied once, into `out`. `private` is
/// not looked at: a webhook's owner may read its streams.
pub fn write_full_payload<W: std::io::Write>(out: &mut W, event: &Event<'_>) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(160);
    write_event_head(&mut head, event);
    write_envelope(&mut head, event.type_, event.key, event.headers);
    out.write_all(&head)?;
    out.write_all(b",\"data\":")?;
    write_compact_json(out, event.data.unwrap_or("null"))?;
    out.write_all(b"}")
}

/// The notification payload of an event: compact JSON, in the field order
/// position, stream, time, tx, prev, type, key, headers, then data; the
/// envelope's fields only when set. A private stream's payload carries
/// `type` and `"private": true`, never `key`, `headers` or `data`. When the
/// payload would not fit in [`MAX_PAYLOAD_BYTES`] it goes without `data`
/// and with `"truncated": true`; when even that is too large, without
/// `headers` too (and, for values no publish lets through, without `key`
/// and `type`): every payload fits.
///
/// Written by hand, in the field order of the DESIGN's contract: the worker
/// encodes one per event, and the data is jsonb's own output (valid JSON,
/// numbers exactly as stored: 49.00 stays 49.00), so it needs compacting,
/// not parsing.
pub fn encode_payload(event: &Event<'_>) -> String {
    const TRUNCATED: &[u8] = b",\"truncated\":true}";
    let data = event.data.filter(|text| !event.private && text.len() <= MAX_DATA_TEXT_BYTES);
    let mut out = Vec::with_capacity(160 + data.map_or(0, str::len));
    write_event_head(&mut out, event);
    let without_type = out.len();
    write_text_field(&mut out, b",\"type\":", event.type_);
    if event.private {
        const PRIVATE: &[u8] = b",\"private\":true}";
        if out.len() + PRIVATE.len() > MAX_PAYLOAD_BYTES {
            out.truncate(without_type);
        }
        out.extend_from_slice(PRIVATE);
        return String::from_utf8(out).expect("UTF-8 text and ASCII only");
    }
    let without_key = out.len();
    write_text_field(&mut out, b",\"key\":", event.key);
    let without_headers = out.len();
    write_headers(&mut out, event.headers);
    let without_data = out.len();
    if let Some(text) = data {
        out.extend_from_slice(b",\"data\":");
        write_compact_json(&mut out, text).expect("writing into a Vec cannot fail");
        // With its closing brace, at most the limit.
        if out.len() < MAX_PAYLOAD_BYTES {
            out.push(b'}');
            return String::from_utf8(out).expect("UTF-8 text and ASCII only");
        }
    }
    // Without data; then, as long as it does not fit, without the envelope
    // from its end.
    for cut in [without_data, without_headers, without_key, without_type] {
        out.truncate(cut);
        if out.len() + TRUNCATED.len() <= MAX_PAYLOAD_BYTES {
            break;
        }
    }
    out.extend_from_slice(TRUNCATED);
    String::from_utf8(out).expect("UTF-8 text and ASCII only")
}

/// The canonical form's head with `prev` (crate::json).
fn write_event_head(out: &mut Vec<u8>, event: &Event<'_>) {
    write_head(out, event.position, event.stream, &format_time(event.time_us), event.tx, Some(event.prev));
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
    /// The envelope, when the payload carries it (`type` and `key` owned:
    /// they may hold escapes).
    #[serde(default, rename = "type")]
    pub type_: Option<String>,
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default, borrow)]
    pub headers: Option<&'a serde_json::value::RawValue>,
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

    fn event(data: &str) -> Event<'_> {
        Event {
            position: 7,
            stream: "payment.success",
            time_us: 1_700_000_000_000_001,
            tx: 812,
            prev: 3,
            type_: None,
            key: None,
            headers: None,
            data: Some(data),
            private: false,
        }
    }

    fn with_envelope(data: &str) -> Event<'_> {
        Event {
            type_: Some("payment.captured"),
            key: Some("ord_123"),
            headers: Some(r#"{"traceparent": "00-ab-cd-01", "source": "a, b"}"#),
            ..event(data)
        }
    }

    fn full_payload(event: &Event<'_>) -> String {
        let mut out = Vec::new();
        write_full_payload(&mut out, event).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn payloads_without_an_envelope_are_byte_identical_to_before() {
        // The exact bytes of the payloads before events had envelopes.
        let data = r#"{"amount": 49.00}"#;
        let head = r#"{"position":7,"stream":"payment.success","time":"2023-11-14T22:13:20.000001Z","tx":812,"prev":3"#;
        assert_eq!(encode_payload(&event(data)), format!(r#"{head},"data":{{"amount":49.00}}}}"#));
        assert_eq!(full_payload(&event(data)), format!(r#"{head},"data":{{"amount":49.00}}}}"#));
        let private = Event { private: true, ..event(data) };
        assert_eq!(encode_payload(&private), format!(r#"{head},"private":true}}"#));
        let unread = Event { data: None, ..event(data) };
        assert_eq!(encode_payload(&unread), format!(r#"{head},"truncated":true}}"#));
    }

    #[test]
    fn the_envelope_follows_prev_in_order_and_compact() {
        let head = r#"{"position":7,"stream":"payment.success","time":"2023-11-14T22:13:20.000001Z","tx":812,"prev":3"#;
        let envelope =
            r#","type":"payment.captured","key":"ord_123","headers":{"source":"a, b","traceparent":"00-ab-cd-01"}"#;
        // jsonb prints object keys sorted by length then bytes: the worker
        // passes that text on, compacted.
        let e =
            Event { headers: Some(r#"{"source": "a, b", "traceparent": "00-ab-cd-01"}"#), ..with_envelope("[1, 2]") };
        assert_eq!(encode_payload(&e), format!(r#"{head}{envelope},"data":[1,2]}}"#));
        assert_eq!(full_payload(&e), format!(r#"{head}{envelope},"data":[1,2]}}"#));
    }

    #[test]
    fn each_envelope_field_is_written_only_when_set() {
        let only_type = Event { type_: Some("t"), ..event("1") };
        assert!(encode_payload(&only_type).contains(r#""prev":3,"type":"t","data":1}"#));
        let only_key = Event { key: Some("k"), ..event("1") };
        assert!(encode_payload(&only_key).contains(r#""prev":3,"key":"k","data":1}"#));
        let only_headers = Event { headers: Some(r#"{"a": "b"}"#), ..event("1") };
        assert!(encode_payload(&only_headers).contains(r#""prev":3,"headers":{"a":"b"},"data":1}"#));
        assert!(full_payload(&only_key).contains(r#""prev":3,"key":"k","data":1}"#));
    }

    #[test]
    fn envelope_texts_are_escaped_as_json_strings() {
        let e = Event { type_: Some("a\"b"), key: Some("\\k\u{7f}é"), ..event("1") };
        let value: serde_json::Value = serde_json::from_str(&encode_payload(&e)).unwrap();
        assert_eq!((value["type"].as_str(), value["key"].as_str()), (Some("a\"b"), Some("\\k\u{7f}é")));
        let d = decode_payload_owned_envelope(&encode_payload(&e));
        assert_eq!((d.0.as_deref(), d.1.as_deref()), (Some("a\"b"), Some("\\k\u{7f}é")));
    }

    #[test]
    fn a_private_payload_carries_the_type_but_never_key_headers_or_data() {
        let e = Event { private: true, ..with_envelope(r#"{"secret": 1}"#) };
        let payload = encode_payload(&e);
        assert_eq!(
            payload,
            r#"{"position":7,"stream":"payment.success","time":"2023-11-14T22:13:20.000001Z","tx":812,"prev":3,"type":"payment.captured","private":true}"#
        );
        assert!(!payload.contains("ord_123") && !payload.contains("traceparent") && !payload.contains("secret"));
    }

    #[test]
    fn too_large_drops_data_first_and_keeps_the_envelope() {
        let big = format!(r#""{}""#, "x".repeat(MAX_PAYLOAD_BYTES));
        let payload = encode_payload(&with_envelope(&big));
        let value: serde_json::Value = serde_json::from_str(&payload).unwrap();
        assert_eq!(value["truncated"], true);
        assert!(value.get("data").is_none());
        assert_eq!((value["type"].as_str(), value["key"].as_str()), (Some("payment.captured"), Some("ord_123")));
        assert_eq!(value["headers"]["traceparent"], "00-ab-cd-01");
        assert!(payload.ends_with(r#""source":"a, b"},"truncated":true}"#), "{payload}");
    }

    #[test]
    fn still_too_large_without_data_drops_the_headers_too() {
        // Headers that alone overflow a payload (8 KB of stored headers can).
        let headers = format!(r#"{{"h": "{}"}}"#, "v".repeat(MAX_PAYLOAD_BYTES));
        let e = Event { headers: Some(&headers), ..with_envelope("1") };
        let payload = encode_payload(&e);
        assert!(payload.len() <= MAX_PAYLOAD_BYTES);
        let value: serde_json::Value = serde_json::from_str(&payload).unwrap();
        assert_eq!(value["truncated"], true);
        assert!(value.get("headers").is_none() && value.get("data").is_none());
        assert_eq!((value["type"].as_str(), value["key"].as_str()), (Some("payment.captured"), Some("ord_123")));
        // Data that would fit on its own goes too: data is dropped first.
        let small = Event { headers: Some(&headers), data: Some("{}"), ..with_envelope("1") };
        assert!(serde_json::from_str::<serde_json::Value>(&encode_payload(&small)).unwrap().get("data").is_none());
        // The full payload keeps everything.
        let full: serde_json::Value = serde_json::from_str(&full_payload(&e)).unwrap();
        assert_eq!(full["headers"]["h"].as_str().map(str::len), Some(MAX_PAYLOAD_BYTES));
        assert_eq!(full["data"], 1);
    }

    #[test]
    fn headers_that_fit_without_data_are_kept() {
        let overhead = encode_payload(&Event { headers: Some(r#"{"h": ""}"#), data: None, ..with_envelope("1") }).len();
        let headers = format!(r#"{{"h": "{}"}}"#, "v".repeat(MAX_PAYLOAD_BYTES - overhead));
        let big = format!(r#""{}""#, "x".repeat(MAX_PAYLOAD_BYTES));
        let e = Event { headers: Some(&headers), data: Some(&big), ..with_envelope("1") };
        let payload = encode_payload(&e);
        assert_eq!(payload.len(), MAX_PAYLOAD_BYTES);
        assert!(payload.contains(r#""headers":{"h":"vvv"#) && payload.ends_with(r#""},"truncated":true}"#));
        let one_more = format!(r#"{{"h": "{}"}}"#, "v".repeat(MAX_PAYLOAD_BYTES - overhead + 1));
        let payload = encode_payload(&Event { headers: Some(&one_more), ..e });
        assert!(!payload.contains("headers") && payload.ends_with(r#""key":"ord_123","truncated":true}"#));
    }

    #[test]
    fn every_payload_fits_whatever_the_envelope() {
        let huge = "k".repeat(3 * MAX_PAYLOAD_BYTES);
        for private in [false, true] {
            let e = Event { type_: Some(&huge), key: Some(&huge), private, ..with_envelope("1") };
            let payload = encode_payload(&e);
            assert!(payload.len() <= MAX_PAYLOAD_BYTES, "private {private}: {} bytes", payload.len());
            assert!(decode_payload(&payload).is_some());
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

    fn decode_payload_owned_envelope(text: &str) -> (Option<String>, Option<String>, Option<String>) {
        let d = decode_payload(text).expect("a payload");
        (d.type_, d.key, d.headers.map(|raw| raw.get().to_owned()))
    }

    #[test]
    fn an_envelope_decodes_to_what_was_encoded() {
        let e = with_envelope(r#"{"n": 1}"#);
        let d = decode_payload_owned_envelope(&encode_payload(&e));
        assert_eq!(d.0.as_deref(), Some("payment.captured"));
        assert_eq!(d.1.as_deref(), Some("ord_123"));
        assert_eq!(d.2.as_deref(), Some(r#"{"traceparent":"00-ab-cd-01","source":"a, b"}"#));
        assert_eq!(decode_payload_owned_envelope(&encode_payload(&event("1"))), (None, None, None));
    }

    fn decode_payload_owned(text: &str) -> (bool, Option<String>) {
        let d = decode_payload(text).expect("a payload");
        (d.private, d.data.map(|raw| raw.get().to_owned()))
    }

    /// A notification and a webhook event are the canonical form with
    /// `prev` after `tx`, byte for byte.
    #[test]
    fn payloads_are_the_canonical_form_with_prev() {
        let time_us = 1_700_000_000_000_001;
        let time = format_time(time_us);
        for (type_, key, headers) in [(None, None, None), (Some("t"), Some("k"), Some(r#"{"h": "a, b"}"#))] {
            let data = r#"{"amount": 49.00, "s": "ünïcødé"}"#;
            let event = Event {
                position: 7,
                stream: "p.s",
                time_us,
                tx: 9,
                prev: 3,
                type_,
                key,
                headers,
                data: Some(data),
                private: false,
            };
            let canonical =
                crate::json::EventJson { position: 7, stream: "p.s", time: &time, tx: 9, type_, key, headers, data }
                    .to_json();
            let with_prev = canonical.replacen(r#""tx":9"#, r#""tx":9,"prev":3"#, 1);
            assert_eq!(encode_payload(&event), with_prev);
            let mut full = Vec::new();
            write_full_payload(&mut full, &event).unwrap();
            assert_eq!(String::from_utf8(full).unwrap(), with_prev);
        }
    }
}
