//! The headers the bridge copies from an event into a NATS message: which
//! envelope headers travel as headers of their own, and how copied values
//! are written so that nats-server cannot take them for its own headers.

/// nats-server before 2.11 (Debian 12 ships 2.9) finds `Nats-Msg-Id` and
/// the other `Nats-*` headers by their first occurrence anywhere in a
/// message's header block (nats-server #3649): a value that contains the
/// text would hide the bridge's own message id, and JetStream's duplicate
/// detection with it. So no value the bridge copies from an event contains
/// `nats-` in any letter case.
fn has_nats_text(text: &str) -> bool {
    text.as_bytes().windows(5).any(|w| w.eq_ignore_ascii_case(b"nats-"))
}

/// A value copied from an event (its stream, type, key), as a header value
/// nats-server cannot mistake for one of its own: unchanged unless it holds
/// `%` or `nats-` (any case); then `%` is written `%25` and the `-` of each
/// `nats-` `%2D`. Percent-decoding gives the original back.
pub fn defused(value: &str) -> String {
    if !value.contains('%') && !has_nats_text(value) {
        return value.to_owned();
    }
    let mut out = String::with_capacity(value.len() + 8);
    let lower = value.to_ascii_lowercase();
    for (i, c) in value.char_indices() {
        match c {
            '%' => out.push_str("%25"),
            '-' if i >= 4 && lower[..i].ends_with("nats") => out.push_str("%2D"),
            c => out.push(c),
        }
    }
    out
}

/// The envelope's headers as JSON, with the `-` of every `nats-` (any case)
/// written as the JSON escape `\u002d`: the same JSON value, and no text
/// nats-server could mistake for one of its headers. (In JSON text such a
/// `-` can only stand inside a string.)
pub fn defused_json(json: &str) -> String {
    if !has_nats_text(json) {
        return json.to_owned();
    }
    let lower = json.to_ascii_lowercase();
    let mut out = String::with_capacity(json.len() + 16);
    for (i, c) in json.char_indices() {
        if c == '-' && i >= 4 && lower[..i].ends_with("nats") {
            out.push_str("\\u002d");
        } else {
            out.push(c);
        }
    }
    out
}

/// Whether an envelope header travels as a NATS header of its own: its name
/// a header token, not the bridge's (`Litebase-*`), neither name nor value
/// with `nats-` in it (`Nats-*` headers steer JetStream: a publisher must not
/// set the message id or expectations, nor hide the bridge's, see
/// [`has_nats_text`]), and a value on one line. Every header is in
/// `Litebase-Headers` anyway.
pub fn carries(name: &str, value: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| (33..=126).contains(&b) && b != b':')
        && !name.to_ascii_lowercase().starts_with("litebase-")
        && !has_nats_text(name)
        && !has_nats_text(value)
        && !value.contains(['\r', '\n'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_harmless_envelope_headers_become_nats_headers() {
        assert!(carries("traceparent", "00-abc-def-01"));
        assert!(!carries("Nats-Msg-Id", "x"));
        assert!(!carries("nats-expected-last-sequence", "1"));
        assert!(!carries("Litebase-Position", "1"));
        assert!(!carries("a:b", "x"));
        assert!(!carries("a b", "x"));
        assert!(!carries("ok", "two\r\nlines"));
    }

    #[test]
    fn no_copied_value_holds_text_nats_server_takes_for_its_own_headers() {
        assert_eq!(defused("order.paid"), "order.paid");
        assert_eq!(defused("see Nats-Msg-Id"), "see Nats%2DMsg-Id");
        assert_eq!(defused("NATS-x nats-y 50%"), "NATS%2Dx nats%2Dy 50%25");
        assert_eq!(defused_json(r#"{"Nats-Msg-Id":"forged"}"#), r#"{"Nats\u002dMsg-Id":"forged"}"#);
        let back: serde_json::Value = serde_json::from_str(&defused_json(r#"{"a":"x nats-y"}"#)).unwrap();
        assert_eq!(back["a"], "x nats-y");
        assert!(!carries("X-Nats-Msg-Id", "x"));
        assert!(!carries("note", "see Nats-Msg-Id"));
    }
}
