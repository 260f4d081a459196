//! Keys of subscriptions ordered per key: which part of an event is its
//! key, and the 32-bit hash that names a key's claim lock.

/// Where an event's key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPath {
    /// The stream name (`'$stream'`): ordered per stream.
    Stream,
    /// The event's own key (`'$key'`, the envelope's): an event without
    /// one has the empty key.
    Envelope,
    /// A path into the event's data (`'order_id'`, `'customer.id'`,
    /// `'$.customer.id'`): its text; an event without it has the empty key.
    Data(Vec<String>),
}

/// The most segments a data path may have.
const MOST_SEGMENTS: usize = 16;

/// The longest segment.
const LONGEST_SEGMENT: usize = 63;

/// Parse a key path; the reason when it is not one.
pub fn parse_key_path(path: &str) -> Result<KeyPath, &'static str> {
    match path {
        "$stream" => return Ok(KeyPath::Stream),
        "$key" => return Ok(KeyPath::Envelope),
        _ => {}
    }
    let dotted = path.strip_prefix("$.").unwrap_or(path);
    if dotted.is_empty() {
        return Err("a key is '$key', '$stream' or a path into data such as 'order_id' or 'customer.id'");
    }
    let segments: Vec<&str> = dotted.split('.').collect();
    if segments.len() > MOST_SEGMENTS {
        return Err("a key path has at most 16 segments");
    }
    for segment in &segments {
        if segment.is_empty() || segment.len() > LONGEST_SEGMENT {
            return Err("each segment of a key path is 1 to 63 characters, separated by single dots");
        }
        if !segment.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
            return Err("a key path's segments are letters, digits, '_' and '-' (a JSON path such as 'customer.id')");
        }
    }
    Ok(KeyPath::Data(segments.into_iter().map(str::to_owned).collect()))
}

impl KeyPath {
    /// As the `text[]` that `streams._event_key` takes: `{$stream}` or the
    /// data path.
    pub fn as_array(&self) -> Vec<String> {
        match self {
            KeyPath::Stream => vec!["$stream".to_owned()],
            KeyPath::Envelope => vec!["$key".to_owned()],
            KeyPath::Data(segments) => segments.clone(),
        }
    }
}

/// The 32-bit FNV-1a hash of a key: its claim lock's name. Two keys with
/// the same hash share one lock (each still in order; fewer in parallel).
pub fn key_hash(key: &str) -> u32 {
    key.bytes().fold(0x811c_9dc5u32, |hash, byte| (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193))
}

/// The name of a stream's `expected_prev` lock: 64 bits of the SHA-256 of
/// the name. Unlike [`key_hash`], no publisher can pick another name with
/// the same lock (a second preimage of 64 bits), so a role that may publish
/// only to its own streams cannot hold another stream's lock.
pub fn stream_lock_name(stream: &str) -> [u32; 2] {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(stream.as_bytes());
    let word = |i: usize| u32::from_be_bytes([digest[i], digest[i + 1], digest[i + 2], digest[i + 3]]);
    [word(0), word(4)]
}

/// The longest key kept as it is (bytes); a longer one is kept as its digest.
pub const KEPT_KEY_BYTES: usize = 200;

/// A key as subscriptions keep it: itself up to [`KEPT_KEY_BYTES`], else
/// `sha256:` and the hex digest of its bytes, so that a publisher's huge
/// key can neither exceed an index entry nor fill a poll's memory.
pub fn bounded_key(key: &str) -> std::borrow::Cow<'_, str> {
    use sha2::{Digest, Sha256};
    use std::fmt::Write;
    if key.len() <= KEPT_KEY_BYTES {
        return std::borrow::Cow::Borrowed(key);
    }
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for byte in Sha256::digest(key.as_bytes()) {
        write!(out, "{byte:02x}").expect("writing to a String");
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_lock_names_do_not_collide_where_fnv_hashes_do() {
        // "mine.Npwb9z" has the 32-bit FNV-1a hash of "ledger".
        assert_eq!(key_hash("mine.Npwb9z"), key_hash("ledger"));
        assert_ne!(stream_lock_name("mine.Npwb9z"), stream_lock_name("ledger"));
        assert_eq!(stream_lock_name("ledger"), stream_lock_name("ledger"));
    }

    #[test]
    fn key_paths_are_the_stream_or_dotted_paths_into_data() {
        assert_eq!(parse_key_path("$stream"), Ok(KeyPath::Stream));
        assert_eq!(parse_key_path("$key"), Ok(KeyPath::Envelope));
        assert_eq!(KeyPath::Envelope.as_array(), vec!["$key"]);
        assert_eq!(parse_key_path("order_id"), Ok(KeyPath::Data(vec!["order_id".into()])));
        assert_eq!(parse_key_path("$.customer.id"), Ok(KeyPath::Data(vec!["customer".into(), "id".into()])));
        assert_eq!(parse_key_path("a-b.c_d.0"), Ok(KeyPath::Data(vec!["a-b".into(), "c_d".into(), "0".into()])));
        for bad in ["", "$.", "a..b", ".a", "a.", "a b", "data->>'x'", "$[0]", "a.*", &"x.".repeat(17)] {
            assert!(parse_key_path(bad).is_err(), "{bad:?} is not a key path");
        }
    }

    #[test]
    fn key_hashes_are_fnv1a() {
        assert_eq!(key_hash(""), 0x811c_9dc5);
        assert_eq!(key_hash("a"), 0xe40c_292c);
        assert_ne!(key_hash("ord_1"), key_hash("ord_2"));
    }

    #[test]
    fn a_key_is_kept_up_to_200_bytes_and_digested_beyond() {
        let short = "k".repeat(200);
        assert_eq!(bounded_key(&short), short.as_str());
        assert_eq!(bounded_key("ord_1"), "ord_1");
        // sha256 of 201 'k' bytes, as PostgreSQL's sha256() gives it.
        let long = "k".repeat(201);
        let kept = bounded_key(&long);
        assert!(kept.starts_with("sha256:") && kept.len() == 71, "{kept}");
        assert_eq!(bounded_key("é".repeat(101).as_str()).len(), 71, "202 bytes: digested");
    }
}
