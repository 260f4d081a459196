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
///
/// A pattern is an exact name, `*` (every stream), or a name whose
/// `.`-separated segments may be `*`: a `*` before the last segment stands
/// for exactly one whole, non-empty segment (`order.*.failed` selects
/// `order.eu.failed`, not `order.eu.x.failed`), while a trailing `*` (the
/// last segment `*`, or `prefix*`) stands for any suffix, as it always did
/// (`payment.*` selects `payment.card.success`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamSelector {
    /// One stream, by exact name.
    Exact(String),
    /// Every stream whose name starts with the prefix: the half-open byte range
    /// `[prefix, upper)`, which a btree on a `COLLATE "C"` column can scan.
    Prefix { prefix: String, upper: String },
    /// A pattern with a `*` segment before its end: the streams in the range
    /// of its literal prefix (the text before the first `*`; empty when the
    /// pattern starts with `*`, and then every stream) whose names
    /// [`pattern_matches`] the pattern.
    Wildcard { prefix: String, upper: String, pattern: String },
    /// Every stream (the pattern `*`).
    All,
}

impl StreamSelector {
    /// The SQL condition selecting these streams on `column`, with the
    /// values as parameters `$n` (and `$n+1`, `$n+2`): `AND ...`, or nothing
    /// for `*`. A wildcard pattern is matched by `streams._stream_matches`
    /// inside the range of its literal prefix, so that an index on the
    /// column still narrows the scan.
    pub fn sql_condition(&self, column: &str, n: usize) -> (String, Vec<&str>) {
        match self {
            StreamSelector::Exact(name) => (format!("AND {column} = ${n}"), vec![name.as_str()]),
            StreamSelector::Prefix { prefix, upper } => {
                (format!("AND {column} >= ${n} AND {column} < ${}", n + 1), vec![prefix.as_str(), upper.as_str()])
            }
            StreamSelector::Wildcard { prefix, pattern, .. } if prefix.is_empty() => {
                (format!("AND streams._stream_matches({column}, ARRAY[${n}]::pg_catalog.text[])"), vec![pattern.as_str()])
            }
            StreamSelector::Wildcard { prefix, upper, pattern } => (
                format!(
                    "AND {column} >= ${n} AND {column} < ${} AND streams._stream_matches({column}, ARRAY[${}]::pg_catalog.text[])",
                    n + 1,
                    n + 2
                ),
                vec![prefix.as_str(), upper.as_str(), pattern.as_str()],
            ),
            StreamSelector::All => (String::new(), vec![]),
        }
    }

    /// The literal prefix every selected name starts with and the smallest
    /// string above all of them, when the selector has a non-empty one (a
    /// prefix pattern, or a wildcard pattern that does not start with `*`).
    pub fn prefix_range(&self) -> Option<(&str, &str)> {
        match self {
            StreamSelector::Prefix { prefix, upper } => Some((prefix, upper)),
            StreamSelector::Wildcard { prefix, upper, .. } if !prefix.is_empty() => Some((prefix, upper)),
            _ => None,
        }
    }
}

/// The smallest string above every string that starts with `prefix` (not
/// empty). Every name byte is ASCII below 0x7f, so bumping the last byte
/// gives it.
fn upper_bound(prefix: &str) -> String {
    let mut upper = prefix.as_bytes().to_vec();
    *upper.last_mut().expect("prefix is not empty") += 1;
    String::from_utf8(upper).expect("ASCII stays ASCII")
}

/// Parse a pattern: `name`, `prefix*`, `*`, or segments with `*` in them
/// (`order.*.failed`, `*.failed`, `order.*.*`).
pub fn parse_stream_selector(pattern: &str) -> Result<StreamSelector, NameError> {
    if pattern == "*" {
        return Ok(StreamSelector::All);
    }
    let Some(first_star) = pattern.find('*') else {
        validate_stream_name(pattern)?;
        return Ok(StreamSelector::Exact(pattern.to_owned()));
    };
    let segments: Vec<&str> = pattern.split('.').collect();
    let last = segments.len() - 1;
    for (i, segment) in segments.iter().enumerate() {
        if segment.is_empty() {
            return Err(invalid(
                pattern,
                "a pattern with '*' has an empty segment (\"..\", or '.' at its start or end)",
            ));
        }
        let trailing = i == last && segment.strip_suffix('*').is_some_and(|s| !s.contains('*'));
        if segment.contains('*') && *segment != "*" && !trailing {
            return Err(invalid(
                pattern,
                "'*' must be a whole segment ('order.*.failed') or end the pattern ('payment.*')",
            ));
        }
    }
    // The literal text obeys the naming rule: each '*' standing for one
    // character, the trailing one for none.
    let literal = pattern.strip_suffix('*').unwrap_or(pattern).replace('*', "x");
    if !literal.is_empty() {
        validate_stream_name(&literal).map_err(|e| invalid(pattern, e.reason))?;
    }
    let prefix = pattern[..first_star].to_owned();
    if first_star == pattern.len() - 1 {
        let upper = upper_bound(&prefix);
        return Ok(StreamSelector::Prefix { prefix, upper });
    }
    let upper = if prefix.is_empty() { String::new() } else { upper_bound(&prefix) };
    Ok(StreamSelector::Wildcard { prefix, upper, pattern: pattern.to_owned() })
}

/// Whether `pattern` (an exact name, `prefix*`, `*`, or segments with `*`)
/// selects `stream`. A malformed pattern selects nothing. It allocates
/// nothing: row-level security calls it for every event a reader with
/// grants reads.
pub fn pattern_matches(pattern: &str, stream: &str) -> bool {
    if pattern == "*" {
        return true;
    }
    if !pattern.contains('*') {
        return pattern == stream;
    }
    let mut rest = stream;
    let mut segments = pattern.split('.').peekable();
    while let Some(segment) = segments.next() {
        if segments.peek().is_none() {
            return match segment.strip_suffix('*') {
                Some(literal) if !literal.contains('*') => rest.starts_with(literal),
                Some(_) => false,
                None => !segment.contains('*') && rest == segment,
            };
        }
        if segment == "*" {
            match rest.find('.') {
                Some(end) if end > 0 => rest = &rest[end + 1..],
                _ => return false,
            }
        } else if segment.is_empty() || segment.contains('*') {
            return false;
        } else {
            match rest.strip_prefix(segment).and_then(|r| r.strip_prefix('.')) {
                Some(r) => rest = r,
                None => return false,
            }
        }
    }
    false
}

/// Whether every stream `pattern` selects is also selected by `grant` (a
/// read grant's name or pattern), so that the grant lets a subscription of
/// the whole pattern read all of it. Decided segment by segment; when in
/// doubt (a malformed grant or pattern), no.
pub fn pattern_covers(grant: &str, pattern: &str) -> bool {
    if grant == "*" {
        return true;
    }
    if !pattern.contains('*') {
        return pattern_matches(grant, pattern);
    }
    if pattern == "*" || parse_stream_selector(pattern).is_err() || parse_stream_selector(grant).is_err() {
        return false;
    }
    let granted: Vec<&str> = grant.split('.').collect();
    let asked: Vec<&str> = pattern.split('.').collect();
    for (i, &g) in granted.iter().enumerate() {
        let Some(&p) = asked.get(i) else { return false };
        let (g_last, p_last) = (i == granted.len() - 1, i == asked.len() - 1);
        let p_suffix = if p_last { p.strip_suffix('*') } else { None };
        if let Some(literal) = g.strip_suffix('*').filter(|_| g_last) {
            // The grant takes any rest that starts with `literal`: the
            // pattern's rest always must.
            return literal.is_empty()
                || match p_suffix {
                    Some(asked) => asked.starts_with(literal),
                    None => p != "*" && p.starts_with(literal),
                };
        }
        if p_suffix.is_some() || g_last != p_last {
            return false;
        }
        if g != "*" && g != p {
            return false;
        }
    }
    true
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
        assert_eq!(
            parse_stream_selector("order.*.failed").unwrap(),
            StreamSelector::Wildcard {
                prefix: "order.".into(),
                upper: "order/".into(),
                pattern: "order.*.failed".into()
            }
        );
        assert_eq!(
            parse_stream_selector("*.failed").unwrap(),
            StreamSelector::Wildcard { prefix: String::new(), upper: String::new(), pattern: "*.failed".into() }
        );
        assert!(matches!(parse_stream_selector("order.*.*").unwrap(), StreamSelector::Wildcard { .. }));
        assert!(matches!(parse_stream_selector("pay*").unwrap(), StreamSelector::Prefix { .. }));
    }

    #[test]
    fn malformed_wildcards_are_rejected() {
        for bad in [
            "order.*x",
            "order.x*y",
            "**",
            "order.**",
            "*x",
            "order..*",
            "order.*..failed",
            "order.*.",
            ".*.x",
            "a*.b",
            "bad name.*.x",
            "order.*.fa iled",
            "-x.*.y",
        ] {
            assert!(parse_stream_selector(bad).is_err(), "{bad:?} should be rejected");
        }
        let long = format!("{}.*.x", "a".repeat(60));
        assert!(parse_stream_selector(&long).is_err());
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
    fn a_middle_star_matches_one_whole_segment() {
        assert!(pattern_matches("order.*.failed", "order.eu.failed"));
        assert!(pattern_matches("order.*.failed", "order.us-east:1.failed"));
        assert!(!pattern_matches("order.*.failed", "order.eu.x.failed"));
        assert!(!pattern_matches("order.*.failed", "order..failed"));
        assert!(!pattern_matches("order.*.failed", "order.eu.failedx"));
        assert!(!pattern_matches("order.*.failed", "order.failed"));
        assert!(!pattern_matches("order.*.failed", "orders.eu.failed"));
        assert!(pattern_matches("*.failed", "order.failed"));
        assert!(!pattern_matches("*.failed", "order.eu.failed"));
        // A trailing star keeps its meaning: any suffix.
        assert!(pattern_matches("order.*.*", "order.eu.failed"));
        assert!(pattern_matches("order.*.*", "order.eu.a.b"));
        assert!(!pattern_matches("order.*.*", "order.eu"));
        assert!(pattern_matches("order.*.f*", "order.eu.failed"));
        // Malformed patterns select nothing.
        assert!(!pattern_matches("order.*x", "order.*x"));
        assert!(!pattern_matches("**", "anything"));
    }

    #[test]
    fn matching_agrees_with_the_selector_range() {
        let names =
            ["order.eu.failed", "order.failed", "order.eu.ok", "orders.eu.failed", "order.", "order.x.y.failed"];
        for pattern in ["order.*.failed", "order.*", "order.*.*", "*.failed", "order.eu.failed", "*"] {
            let selector = parse_stream_selector(pattern).unwrap();
            for name in names {
                if pattern_matches(pattern, name) {
                    if let Some((low, high)) = selector.prefix_range() {
                        assert!(name >= low && name < high, "{pattern} selects {name} outside its range");
                    }
                }
            }
        }
    }

    #[test]
    fn grants_cover_the_patterns_inside_them() {
        assert!(pattern_covers("*", "*.failed"));
        assert!(pattern_covers("order.*", "order.*.failed"));
        assert!(pattern_covers("order.*.failed", "order.*.failed"));
        assert!(pattern_covers("order.*.failed", "order.eu.failed"));
        assert!(pattern_covers("order.*.*", "order.eu.*"));
        assert!(pattern_covers("order.*.*", "order.*.failed"));
        assert!(pattern_covers("pay*", "payment.*.x"));
        assert!(!pattern_covers("order.eu.*", "order.*.failed"));
        assert!(!pattern_covers("order.*.failed", "order.*"));
        assert!(!pattern_covers("order.*.failed", "order.*.*"));
        assert!(!pattern_covers("order.*.failed", "order.*.failed.x"));
        assert!(!pattern_covers("order.eu.failed", "order.*.failed"));
        assert!(!pattern_covers("*.failed", "*"));
        assert!(!pattern_covers("p*", "*.x"));
        assert!(!pattern_covers("order.*x", "order.*x"));
        // The forms that were there before wildcards.
        assert!(pattern_covers("payment.*", "payment.eu.*"));
        assert!(pattern_covers("payment.*", "payment.success"));
        assert!(!pattern_covers("payment.success", "payment.*"));
        assert!(!pattern_covers("payment.eu.*", "payment.*"));
        assert!(!pattern_covers("payment.*", "*"));
        assert!(!pattern_covers("orders", "orders.*"));
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
        let wildcard = parse_stream_selector("order.*.failed").unwrap();
        let (sql, values) = wildcard.sql_condition("e.stream", 5);
        assert_eq!(
            sql,
            "AND e.stream >= $5 AND e.stream < $6 AND streams._stream_matches(e.stream, ARRAY[$7]::pg_catalog.text[])"
        );
        assert_eq!(values, vec!["order.", "order/", "order.*.failed"]);
        let leading = parse_stream_selector("*.failed").unwrap();
        assert_eq!(leading.sql_condition("e.stream", 2).1, vec!["*.failed"]);
    }
}
