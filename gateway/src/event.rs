//! One event as the gateway sends it, encoded once and shared by every client
//! that receives it (an `Arc<Event>` in each client's queue).
//!
//! The JSON is the notification payload's shape without its delivery fields
//! (`prev`, `truncated`, `private`):
//! `{"position":…,"stream":…,"time":…,"tx":…,"type":…,"key":…,"headers":{…},"data":…}`,
//! compact, the envelope's `type`, `key` and `headers` only when the event
//! has them, `data` always present and byte-for-byte what the payload would
//! carry (numbers as stored: 49.00 stays 49.00), whether the event came from a
//! replay page or from a notification.

use bytes::Bytes;
use litebase_streams_core::payload::Decoded;

#[derive(Debug)]
pub struct Event {
    pub position: i64,
    pub stream: String,
    /// The event as JSON.
    pub json: String,
    /// Its Server-Sent Events frame: `id:`, `event:`, `data:`.
    pub sse: Bytes,
    /// Where in `json` the envelope's `,"type":` starts, when it has one
    /// (a WebSocket message names it `event_type`: its own `type` is the
    /// message's kind).
    type_at: Option<usize>,
}

/// The envelope's type as `json` writes it.
const TYPE_FIELD: &str = r#","type":"#;

/// An event's envelope: each value when it has one; `headers` as JSON text
/// (compacted when the event is encoded).
#[derive(Debug, Clone, Copy, Default)]
pub struct Envelope<'a> {
    pub type_: Option<&'a str>,
    pub key: Option<&'a str>,
    pub headers: Option<&'a str>,
}

impl Event {
    /// From its parts; `data` and `envelope.headers` are JSON text (compacted here).
    pub fn new(position: i64, stream: String, time: &str, tx: i64, envelope: Envelope<'_>, data: &str) -> Event {
        let quoted = |text: &str| serde_json::to_string(text).expect("a string serialises");
        let mut json =
            format!(r#"{{"position":{position},"stream":{},"time":{},"tx":{tx}"#, quoted(&stream), quoted(time));
        let type_at = envelope.type_.map(|type_| {
            let at = json.len();
            json.push_str(TYPE_FIELD);
            json.push_str(&quoted(type_));
            at
        });
        if let Some(key) = envelope.key {
            json.push_str(&format!(r#","key":{}"#, quoted(key)));
        }
        if let Some(headers) = envelope.headers {
            json.push_str(&format!(r#","headers":{}"#, compact_json(headers)));
        }
        json.push_str(&format!(r#","data":{}}}"#, compact_json(data)));
        let sse = Bytes::from(format!("id: {position}\nevent: {stream}\ndata: {json}\n\n"));
        Event { position, stream, json, sse, type_at }
    }

    /// The WebSocket message for a subscription to `pattern_json` (the
    /// pattern as a JSON string): the event's fields after `type` and
    /// `subscription`, the envelope's type as `event_type` (`type` is the
    /// message's own: `"event"`).
    pub fn ws_message(&self, pattern_json: &str) -> String {
        match self.type_at {
            None => format!(r#"{{"type":"event","subscription":{pattern_json},{}"#, &self.json[1..]),
            Some(at) => format!(
                r#"{{"type":"event","subscription":{pattern_json},{},"event_type":{}"#,
                &self.json[1..at],
                &self.json[at + TYPE_FIELD.len()..]
            ),
        }
    }
}

/// The event of a notification payload, when it carries it whole (not
/// private, not truncated).
pub fn event_of(payload: &Decoded<'_>) -> Option<Event> {
    if payload.private || payload.truncated {
        return None;
    }
    let data = payload.data?;
    let envelope = Envelope {
        type_: payload.type_.as_deref(),
        key: payload.key.as_deref(),
        headers: payload.headers.map(|raw| raw.get()),
    };
    Some(Event::new(payload.position, payload.stream.to_owned(), payload.time, payload.tx, envelope, data.get()))
}

/// Drop insignificant whitespace (jsonb's output puts a space after `:` and
/// `,`), leaving string contents untouched: the worker's compaction, the
/// same function.
pub fn compact_json(text: &str) -> String {
    let mut out = Vec::with_capacity(text.len());
    litebase_streams_core::payload::write_compact_json(&mut out, text).expect("writing into a Vec cannot fail");
    String::from_utf8(out).expect("only ASCII whitespace between UTF-8 runs is dropped")
}

#[cfg(test)]
mod tests {
    use super::*;
    use litebase_streams_core::payload::decode_payload;

    #[test]
    fn replayed_and_notified_events_encode_alike() {
        let replayed = Event::new(
            7,
            "p.s".into(),
            "2026-11-30T00:00:00.000001Z",
            812,
            Envelope::default(),
            r#"{"amount": 49.00, "s": "a, b"}"#,
        );
        let payload = r#"{"position":7,"stream":"p.s","time":"2026-11-30T00:00:00.000001Z","tx":812,"prev":3,"data":{"amount":49.00,"s":"a, b"}}"#;
        let notified = event_of(&decode_payload(payload).unwrap()).unwrap();
        assert_eq!(replayed.json, notified.json);
        assert_eq!(
            replayed.json,
            r#"{"position":7,"stream":"p.s","time":"2026-11-30T00:00:00.000001Z","tx":812,"data":{"amount":49.00,"s":"a, b"}}"#
        );
        assert_eq!(
            std::str::from_utf8(&replayed.sse).unwrap(),
            format!("id: 7\nevent: p.s\ndata: {}\n\n", replayed.json)
        );
        assert!(replayed.ws_message("\"p.*\"").starts_with(r#"{"type":"event","subscription":"p.*","position":7,"#));
    }

    #[test]
    fn the_envelope_is_carried_alike_from_replays_and_notifications() {
        let envelope = Envelope {
            type_: Some("order.created"),
            key: Some("ord \"1\""),
            headers: Some(r#"{"trace": "a, b", "traceparent": "00-1"}"#),
        };
        let replayed = Event::new(9, "p.s".into(), "2026-11-30T00:00:00.000001Z", 5, envelope, r#"{"n": 1}"#);
        assert_eq!(
            replayed.json,
            r#"{"position":9,"stream":"p.s","time":"2026-11-30T00:00:00.000001Z","tx":5,"type":"order.created","key":"ord \"1\"","headers":{"trace":"a, b","traceparent":"00-1"},"data":{"n":1}}"#
        );
        let payload = litebase_streams_core::payload::encode_payload(&litebase_streams_core::payload::Event {
            position: 9,
            stream: "p.s",
            time_us: 1_795_996_800_000_001,
            tx: 5,
            prev: 0,
            type_: envelope.type_,
            key: envelope.key,
            headers: envelope.headers,
            data: Some(r#"{"n": 1}"#),
            private: false,
        });
        let notified = event_of(&decode_payload(&payload).unwrap()).unwrap();
        assert_eq!(notified.json, replayed.json);
        assert!(std::str::from_utf8(&notified.sse).unwrap().contains(r#""type":"order.created","key":"#));
        assert_eq!(
            notified.ws_message("\"p.s\""),
            r#"{"type":"event","subscription":"p.s","position":9,"stream":"p.s","time":"2026-11-30T00:00:00.000001Z","tx":5,"event_type":"order.created","key":"ord \"1\"","headers":{"trace":"a, b","traceparent":"00-1"},"data":{"n":1}}"#
        );
    }

    #[test]
    fn private_and_truncated_payloads_carry_no_event() {
        for p in [
            r#"{"position":1,"stream":"s","time":"t","tx":1,"prev":0,"private":true}"#,
            r#"{"position":1,"stream":"s","time":"t","tx":1,"prev":0,"truncated":true}"#,
            r#"{"position":1,"stream":"s","time":"t","tx":1,"prev":0,"type":"t","private":true}"#,
            r#"{"position":1,"stream":"s","time":"t","tx":1,"prev":0,"type":"t","key":"k","truncated":true}"#,
        ] {
            assert!(event_of(&decode_payload(p).unwrap()).is_none());
        }
    }
}
