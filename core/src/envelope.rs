//! The event envelope: the optional `type`, `key` and `headers` an event
//! carries beside its data, and the idempotency key of a publish. The
//! limits and shape rules, checked when an event is published (22023).

/// The longest `type` (bytes).
pub const MAX_TYPE_BYTES: usize = 255;

/// The longest `key` (bytes). Subscriptions ordered by it keep keys over
/// 200 bytes as their digest (see [`crate::keys::bounded_key`]).
pub const MAX_KEY_BYTES: usize = 1024;

/// The most headers an event has.
pub const MAX_HEADERS: usize = 64;

/// The longest header name (bytes).
pub const MAX_HEADER_NAME_BYTES: usize = 255;

/// The largest `headers` object (bytes of its stored jsonb form).
pub const MAX_HEADERS_BYTES: usize = 8192;

/// The longest idempotency key (bytes).
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 255;

/// Why a value of the envelope is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvelopeError {
    /// The argument: `type`, `key`, `headers` or `idempotency_key`.
    pub argument: &'static str,
    pub reason: String,
}

fn refuse(argument: &'static str, reason: impl Into<String>) -> Result<(), EnvelopeError> {
    Err(EnvelopeError { argument, reason: reason.into() })
}

/// A short text of the envelope: not empty, at most `limit` bytes, no
/// control characters (they would break header lines and log lines
/// downstream).
fn check_text(argument: &'static str, value: &str, limit: usize) -> Result<(), EnvelopeError> {
    if value.is_empty() {
        return refuse(argument, format!("{argument} must not be empty (leave it null instead)"));
    }
    if value.len() > limit {
        return refuse(argument, format!("{argument} is longer than {limit} bytes"));
    }
    if value.chars().any(char::is_control) {
        return refuse(argument, format!("{argument} must not contain control characters"));
    }
    Ok(())
}

/// An event's type: 1 to 255 bytes, no control characters.
pub fn check_type(value: &str) -> Result<(), EnvelopeError> {
    check_text("type", value, MAX_TYPE_BYTES)
}

/// An event's key: 1 to 1024 bytes, no control characters.
pub fn check_key(value: &str) -> Result<(), EnvelopeError> {
    check_text("key", value, MAX_KEY_BYTES)
}

/// An idempotency key: 1 to 255 bytes, no control characters.
pub fn check_idempotency_key(value: &str) -> Result<(), EnvelopeError> {
    check_text("idempotency_key", value, MAX_IDEMPOTENCY_KEY_BYTES)
}

/// A header's name: 1 to 255 bytes, no control characters.
pub fn check_header_name(name: &str) -> Result<(), EnvelopeError> {
    check_text("headers", name, MAX_HEADER_NAME_BYTES).map_err(|error| EnvelopeError {
        argument: "headers",
        reason: format!("header name {:?}: {}", truncated(name), error.reason.replacen("headers", "a name", 1)),
    })
}

/// What a value of `headers` is, as far as the rules care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderValue {
    String,
    /// A number, boolean, null, array or object.
    Other(&'static str),
}

/// One header, checked: its name, and that its value is a string.
pub fn check_header(name: &str, value: HeaderValue) -> Result<(), EnvelopeError> {
    check_header_name(name)?;
    match value {
        HeaderValue::String => Ok(()),
        HeaderValue::Other(kind) => {
            refuse("headers", format!("header {:?} is {kind}: header values are strings", truncated(name)))
        }
    }
}

/// The headers object as a whole: `count` entries, `stored_bytes` of jsonb.
pub fn check_headers_size(count: usize, stored_bytes: usize) -> Result<(), EnvelopeError> {
    if count > MAX_HEADERS {
        return refuse("headers", format!("headers has {count} entries; at most {MAX_HEADERS} are allowed"));
    }
    if stored_bytes > MAX_HEADERS_BYTES {
        return refuse("headers", format!("headers is {stored_bytes} bytes; at most {MAX_HEADERS_BYTES} are allowed"));
    }
    Ok(())
}

/// At most 40 characters of `text`, for a message.
fn truncated(text: &str) -> String {
    let mut out: String = text.chars().take(40).collect();
    if out.len() < text.len() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_texts_pass_and_bad_ones_say_why() {
        assert!(check_type("order.created").is_ok());
        assert!(check_type(&"t".repeat(MAX_TYPE_BYTES)).is_ok());
        assert!(check_type(&"t".repeat(MAX_TYPE_BYTES + 1)).unwrap_err().reason.contains("longer than 255"));
        assert!(check_type("").unwrap_err().reason.contains("empty"));
        assert!(check_key("a\nb").unwrap_err().reason.contains("control"));
        assert!(check_key(&"k".repeat(MAX_KEY_BYTES)).is_ok());
        assert!(check_key(&"k".repeat(MAX_KEY_BYTES + 1)).is_err());
        assert_eq!(check_idempotency_key("").unwrap_err().argument, "idempotency_key");
        assert!(check_idempotency_key("ord_123/attempt-1").is_ok());
    }

    #[test]
    fn headers_are_named_strings_within_limits() {
        assert!(check_header("traceparent", HeaderValue::String).is_ok());
        let number = check_header("retries", HeaderValue::Other("a number")).unwrap_err();
        assert!(number.reason.contains("\"retries\" is a number"), "{number:?}");
        assert!(check_header("", HeaderValue::String).unwrap_err().reason.contains("empty"));
        assert!(check_header("a\tb", HeaderValue::String).is_err());
        assert!(check_headers_size(MAX_HEADERS, MAX_HEADERS_BYTES).is_ok());
        assert!(check_headers_size(MAX_HEADERS + 1, 10).is_err());
        assert!(check_headers_size(1, MAX_HEADERS_BYTES + 1).is_err());
    }
}
