//! What to do with a notification the worker sent (its sender pid already
//! checked): the part of the client rule that needs no server, so it is
//! tested without one.
//!
//! The invariant: every event of the subscription at or below `last_seen`
//! has been handed out (or left out by the filters, or is below the horizon
//! of a complete replay). A notification may move `last_seen` only when
//! nothing of its stream is missing below it, which its `prev` tells for
//! one stream. A pattern spans streams, and a lost notification of one
//! stream followed by one of another could not be told apart from no loss
//! at all; so for a pattern a notification only says "replay now", and the
//! replay (position order across all streams) decides.

use litebase_streams_core::payload::{decode_payload, Decoded};

use crate::Event;

/// The verdict on one notification from the worker.
#[derive(Debug, PartialEq)]
pub(crate) enum Verdict {
    /// Seen already (or not a payload of ours to act on).
    Drop,
    /// Replay from `last_seen`: a gap, a pattern, or a payload that does not
    /// read as one.
    Replay,
    /// The event at this position, without its data: fetch it with `streams.get`.
    Fetch(i64),
    /// The event, complete, next in line.
    Deliver(Box<Event>),
}

/// Judge `payload` (sent by the worker) for a subscription of the exact
/// stream `exact` (None: a pattern) that has seen everything up to `last_seen`.
pub(crate) fn judge(payload: &str, exact: Option<&str>, last_seen: i64) -> Verdict {
    let Some(decoded) = decode_payload(payload) else { return Verdict::Replay };
    if decoded.position <= last_seen {
        return Verdict::Drop;
    }
    let Some(stream) = exact else { return Verdict::Replay };
    judge_one_stream(&decoded, stream, last_seen)
}

fn judge_one_stream(decoded: &Decoded<'_>, stream: &str, last_seen: i64) -> Verdict {
    if decoded.stream != stream {
        return Verdict::Replay;
    }
    match decoded.prev {
        Some(prev) if prev <= last_seen => {}
        // Missed an event of the stream (or no prev to tell): the replay
        // delivers it, and this one after it.
        _ => return Verdict::Replay,
    }
    if decoded.truncated || decoded.private {
        return Verdict::Fetch(decoded.position);
    }
    match Event::from_payload(decoded) {
        Ok(Some(event)) => Verdict::Deliver(Box::new(event)),
        _ => Verdict::Replay,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(position: i64, prev: i64, tail: &str) -> String {
        format!(
            r#"{{"position":{position},"stream":"orders","time":"2026-12-03T18:50:10.123456Z","tx":9,"prev":{prev}{tail}}}"#
        )
    }

    #[test]
    fn the_next_event_of_the_stream_is_delivered() {
        let Verdict::Deliver(event) = judge(&payload(5, 3, r#","data":{"a":1}"#), Some("orders"), 3) else {
            panic!("delivered");
        };
        assert_eq!((event.position, event.data["a"].as_i64()), (5, Some(1)));
    }

    #[test]
    fn seen_positions_are_dropped() {
        assert_eq!(judge(&payload(3, 1, r#","data":1"#), Some("orders"), 3), Verdict::Drop);
        assert_eq!(judge(&payload(2, 1, r#","data":1"#), None, 3), Verdict::Drop);
    }

    #[test]
    fn a_prev_above_last_seen_is_a_gap() {
        assert_eq!(judge(&payload(9, 6, r#","data":1"#), Some("orders"), 5), Verdict::Replay);
    }

    #[test]
    fn truncated_and_private_events_are_fetched() {
        assert_eq!(judge(&payload(6, 5, r#","truncated":true"#), Some("orders"), 5), Verdict::Fetch(6));
        assert_eq!(judge(&payload(6, 0, r#","private":true"#), Some("orders"), 5), Verdict::Fetch(6));
    }

    #[test]
    fn patterns_and_odd_payloads_replay() {
        assert_eq!(judge(&payload(6, 5, r#","data":1"#), None, 5), Verdict::Replay);
        assert_eq!(judge("not json", Some("orders"), 5), Verdict::Replay);
        assert_eq!(judge(&payload(6, 5, r#","data":1"#), Some("other"), 5), Verdict::Replay);
        let no_prev = r#"{"position":6,"stream":"orders","time":"2026-12-03T18:50:10.123456Z","tx":9,"data":1}"#;
        assert_eq!(judge(no_prev, Some("orders"), 5), Verdict::Replay);
    }
}
