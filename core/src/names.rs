//! Stream names and stream patterns: the naming rule, shared by the
//! extension (which raises a [`NameError`] as SQLSTATE 22023) and the
//! gateway.
//!
//! A stream's name is also its LISTEN channel, so names obey PostgreSQL's channel
//! limit (63 bytes) and a character set that needs no quoting surprises in any
//! client.

pub const MAX_STREAM_NAME_BYTES: usize = 63;
pub const STREAM_NAME_RULE: &str = "a stream name is 1 to 63 bytes of letters, digits, '_', '.', ':' \
     or '-', starting with a letter, digit or '_'";

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-')
}

/// A name (or pattern) that breaks the naming rule, and why. The extension
/// raises it as SQLSTATE 22023 (error.rs converts it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameError {
    pub name: String,
    pub reason: &'static str,
}

fn invalid(name: &str, reason: &'static str) -> NameError {
    NameError { name: name.to_owned(), reason }
}

/// Check a stream name against the naming rule.
pub fn validate_stream_name(name: &str) -> Result<(), NameError> {
    let bytes = name.as_bytes();
    match bytes.first() {
        None => return Err(invalid(name, "it is empty")),
        Some(&b) if !(b.is_ascii_alphanumeric() || b == b'_') => {
            return Err(invalid(name, "it must start with a letter, digit or '_'"))
        }
        _ => {}
    }
    if bytes.len() > MAX_STREAM_NAME_BYTES {
        return Err(invalid(name, "it is longer than 63 bytes"));
    }
    if !bytes.iter().all(|&b| is_name_byte(b)) {
        return Err(invalid(name, "it contains a character outside [A-Za-z0-9_.:-]"));
    }
    Ok(())
}

/// What a `stream` argument of `streams.replay` selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamSelector {
    /// One stream, by exact name.
    Exact(String),
    /// Every stream whose name starts with the prefix: the half-open byte range
    /// `[prefix, upper)`, which a btree on a `COLLATE "C"` column can scan.
    Prefix { prefix: String, upper: String },
    /// Every stream (the pattern `*`).
    All,
}

impl StreamSelector {
    /// The SQL condition selecting these streams on `column`, with the
    /// values as parameters `$n` (and `$n+1`): `AND ...`, or nothing for `*`.
    pub fn sql_condition(&self, column: &str, n: usize) -> (String, Vec<&str>) {
        match self {
            StreamSelector::Exact(name) => (format!("AND {column} = ${n}"), vec![name.as_str()]),
            StreamSelector::Prefix { prefix, upper } => {
                (format!("AND {column} >= ${n} AND {column} < ${}", n + 1), vec![prefix.as_str(), upper.as_str()])
            }
            StreamSelector::All => (String::new(), vec![]),
        }
    }
}

/// Parse `name`, `prefix*` or `*`.
pub fn parse_stream_selector(pattern: &str) -> Result<StreamSelector, NameError> {
    let Some(prefix) = pattern.strip_suffix('*') else {
        validate_stream_name(pattern)?;
        return Ok(StreamSelector::Exact(pattern.to_owned()));
    };
    if prefix.is_empty() {
        return Ok(StreamSelector::All);
    }
    if prefix.contains('*') {
        return Err(invalid(pattern, "'*' may appear only once, at the end of a pattern"));
    }
    validate_stream_name(prefix)?;
    // Every name byte is ASCII below 0x7f, so bumping the last byte gives the
    // smallest string greater than every name with this prefix.
    let mut upper = prefix.as_bytes().to_vec();
    *upper.last_mut().expect("prefix is not empty") += 1;
    let upper = String::from_utf8(upper).expect("ASCII stays ASCII");
    Ok(StreamSelector::Prefix { prefix: prefix.to_owned(), upper })
}

/// Whether `pattern` (an exact name, `prefix*` or `*`) selects `stream`.
/// A malformed pattern selects nothing.
pub fn pattern_matches(pattern: &str, stream: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => stream.starts_with(prefix) && !prefix.contains('*'),
        None => pattern == stream,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_names_that_follow_the_rule() {
        for name in ["payment.success", "a", "_x", "9lives", "orders:eu-west_1", &"a".repeat(63)] {
            assert_eq!(validate_stream_name(name), Ok(()), "{name}");
        }
    }

    #[test]
    fn rejects_names_that_break_the_rule() {
        for name in ["", ".hidden", "-x", ":x", "has space", "semi;colon", "quote\"", "é", &"a".repeat(64)] {
            assert!(validate_stream_name(name).is_err(), "{name:?} should be rejected");
        }
    }

    #[test]
    fn prefix_pattern_covers_exactly_the_prefixed_names() {
        let StreamSelector::Prefix { prefix, upper } = parse_stream_selector("payment.*").unwrap() else {
            panic!("expected a prefix selector");
        };
        assert_eq!((prefix.as_str(), upper.as_str()), ("payment.", "payment/"));
        let inside = |s: &str| s >= prefix.as_str() && s < upper.as_str();
        assert!(inside("payment.success") && inside("payment.") && inside("payment.~"));
        assert!(!inside("payment") && !inside("paymentx") && !inside("payments.x"));
    }

    #[test]
    fn selector_forms() {
        assert_eq!(parse_stream_selector("*").unwrap(), StreamSelector::All);
        assert_eq!(parse_stream_selector("orders").unwrap(), StreamSelector::Exact("orders".into()));
        assert!(parse_stream_selector("a*b*").is_err());
        assert!(parse_stream_selector("bad name*").is_err());
    }

    #[test]
    fn patterns_select_exact_names_prefixes_and_everything() {
        assert!(pattern_matches("payment.success", "payment.success"));
        assert!(!pattern_matches("payment.success", "payment.successful"));
        assert!(pattern_matches("payment.*", "payment.success"));
        assert!(!pattern_matches("payment.*", "payments.x"));
        assert!(pattern_matches("*", "anything"));
        assert!(!pattern_matches("a*b*", "a*bc"));
    }

    #[test]
    fn selectors_become_sql_conditions_with_numbered_parameters() {
        let exact = parse_stream_selector("orders").unwrap();
        assert_eq!(exact.sql_condition("e.stream", 4), ("AND e.stream = $4".to_owned(), vec!["orders"]));
        let prefix = parse_stream_selector("pay.*").unwrap();
        let (sql, values) = prefix.sql_condition("e.stream", 5);
        assert_eq!(sql, "AND e.stream >= $5 AND e.stream < $6");
        assert_eq!(values.len(), 2);
        assert_eq!(values[0], "pay.");
        assert_eq!(parse_stream_selector("*").unwrap().sql_condition("e.stream", 3), (String::new(), vec![]));
    }
}
