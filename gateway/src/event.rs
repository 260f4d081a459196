//! One event as the gateway sends it, encoded once and shared by every client
//! that receives it (an `Arc<Event>` in each client's queue).
//!
//! The JSON is the event's canonical form, written by the encoder the
//! extension's notifications and `streams.to_json` use (core's `json`):
//! `{"position":…,"stream":…,"time":…,"tx":…,"type":…,"key":…,"headers":{…},"data":…}`,
//! compact, the envelope's `type`, `key` and `headers` only when the event
//! has them, `data` always present and byte-for-byte what the payload would
//! carry (numbers as stored: 49.00 stays 49.00), whether the event came from a
//! replay page or from a notification: the payload without its delivery
//! fields (`prev`, `truncated`, `private`).

use std::sync::OnceLock;

use bytes::Bytes;
use litebase_streams_core::json::EventJson;
use litebase_streams_core::payload::Decoded;

/// How an event's SSE frame names it (the `frames` query parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Frames {
    /// `event: {stream}`: an EventSource listens per stream name
    /// (`addEventListener(name, ..)`).
    #[default]
    Named,
    /// No `event:` line (`frames=message`): every event reaches an
    /// EventSource's `onmessage`, whatever stream of the pattern it is of.
    Message,
}

impl Frames {
    /// The `frames` query parameter: none or `message`; anything else is 22023.
    pub fn parse(value: Option<&str>) -> Result<Frames, String> {
        match value {
            None => Ok(Frames::Named),
            Some("message") => Ok(Frames::Message),
            Some(other) => Err(format!("frames must be \"message\" (or left out), not {other:?}")),
        }
    }
}

#[derive(Debug)]
pub struct Event {
    pub position: i64,
    pub stream: String,
    /// The event as JSON.
    pub json: String,
    /// Its Server-Sent Events frame: `id:`, `event:`, `data:`.
    pub sse: Bytes,
    /// Its frame without `event:` ([`Frames::Message`]), made when a client
    /// first asks for it and shared by all that do.
    message: OnceLock<Bytes>,
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
    /// From its parts; `data` and `envelope.headers` are JSON text (compacted
    /// here), `time` as the database's `to_char` or the payload wrote it.
    pub fn new(position: i64, stream: String, time: &str, tx: i64, envelope: Envelope<'_>, data: &str) -> Event {
        let canonical = EventJson {
            position,
            stream: &stream,
            time,
            tx,
            type_: envelope.type_,
            key: envelope.key,
            headers: envelope.headers,
            data,
        };
        let mut json = Vec::with_capacity(128 + data.len() + envelope.headers.map_or(0, str::len));
        let envelope_at = canonical.write(&mut json);
        let json = String::from_utf8(json).expect("UTF-8 text and ASCII only");
        let type_at = envelope.type_.map(|_| envelope_at);
        let sse = Bytes::from(format!("id: {position}\nevent: {stream}\ndata: {json}\n\n"));
        Event { position, stream, json, sse, message: OnceLock::new(), type_at }
    }

    /// Its Server-Sent Events frame in the form asked for.
    pub fn frame(&self, frames: Frames) -> Bytes {
        match frames {
            Frames::Named => self.sse.clone(),
            Frames::Message => self
                .message
                .get_or_init(|| Bytes::from(format!("id: {}\ndata: {}\n\n", self.position, self.json)))
                .clone(),
        }
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
    fn message_frames_are_the_named_ones_without_the_event_line() {
        let event = Event::new(7, "p.s".into(), "2026-11-30T00:00:00.000001Z", 812, Envelope::default(), "{}");
        assert_eq!(event.frame(Frames::Named), event.sse);
        let message = event.frame(Frames::Message);
        assert_eq!(std::str::from_utf8(&message).unwrap(), format!("id: 7\ndata: {}\n\n", event.json));
        assert_eq!(event.frame(Frames::Message).as_ptr(), message.as_ptr(), "made once, then shared");
        assert_eq!(Frames::parse(None), Ok(Frames::Named));
        assert_eq!(Frames::parse(Some("message")), Ok(Frames::Message));
        for bad in ["", "named", "Message", "message,named"] {
            assert!(Frames::parse(Some(bad)).is_err(), "{bad:?}");
        }
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
