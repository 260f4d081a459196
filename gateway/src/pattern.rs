//! Stream names and patterns, as the extension defines them (src/notify.rs):
//! a name is 1 to 63 bytes of `[A-Za-z0-9_.:-]` starting with a letter, digit
//! or `_`; a pattern is a name, `prefix*` or `*`. The gateway checks them
//! before it takes a LISTEN channel or a topic for one (the database checks
//! them again: 22023), and decides here whether a role's read grants cover a
//! pattern, with the rule subscriptions use.

pub const MAX_STREAM_NAME_BYTES: usize = 63;

/// What a pattern selects.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Selector {
    Exact(String),
    Prefix(String),
    All,
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-')
}

/// Check a stream name against the naming rule; the error says what is wrong.
pub fn validate_stream_name(name: &str) -> Result<(), String> {
    let bytes = name.as_bytes();
    match bytes.first() {
        None => return Err("a stream name must not be empty".into()),
        Some(&b) if !(b.is_ascii_alphanumeric() || b == b'_') => {
            return Err(format!("invalid stream name {name:?}: it must start with a letter, digit or '_'"))
        }
        _ => {}
    }
    if bytes.len() > MAX_STREAM_NAME_BYTES {
        return Err(format!("invalid stream name {name:?}: it is longer than 63 bytes"));
    }
    if !bytes.iter().all(|&b| is_name_byte(b)) {
        return Err(format!("invalid stream name {name:?}: it contains a character outside [A-Za-z0-9_.:-]"));
    }
    Ok(())
}

/// Parse `name`, `prefix*` or `*`.
pub fn parse(pattern: &str) -> Result<Selector, String> {
    let Some(prefix) = pattern.strip_suffix('*') else {
        validate_stream_name(pattern)?;
        return Ok(Selector::Exact(pattern.to_owned()));
    };
    if prefix.is_empty() {
        return Ok(Selector::All);
    }
    if prefix.contains('*') {
        return Err(format!("invalid stream pattern {pattern:?}: '*' may appear only once, at the end"));
    }
    validate_stream_name(prefix).map_err(|e| format!("invalid stream pattern {pattern:?}: {e}"))?;
    Ok(Selector::Prefix(prefix.to_owned()))
}

impl Selector {
    pub fn matches(&self, stream: &str) -> bool {
        match self {
            Selector::Exact(name) => name == stream,
            Selector::Prefix(prefix) => stream.starts_with(prefix.as_str()),
            Selector::All => true,
        }
    }

    /// Whether a role holding read grants on `grants` (names and patterns,
    /// as `streams._read_patterns()` returns them) may read everything this
    /// selects: a grant on `'payment.*'` covers `payment.*` and
    /// `payment.success`, one on `payment.success` does not cover `payment.*`.
    pub fn covered_by(&self, grants: &[String]) -> bool {
        grants.iter().any(|grant| match parse(grant) {
            Ok(Selector::All) => true,
            Ok(Selector::Prefix(p)) => match self {
                Selector::Exact(name) | Selector::Prefix(name) => name.starts_with(p.as_str()),
                Selector::All => false,
            },
            Ok(Selector::Exact(g)) => matches!(self, Selector::Exact(name) if *name == g),
            Err(_) => false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_parse_like_the_extension() {
        assert_eq!(parse("*").unwrap(), Selector::All);
        assert_eq!(parse("a.b").unwrap(), Selector::Exact("a.b".into()));
        assert_eq!(parse("pay.*").unwrap(), Selector::Prefix("pay.".into()));
        for bad in ["", "a*b*", "bad name", ".x", "é", "x\"y", &"a".repeat(64)] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn grants_cover_patterns_as_subscriptions_do() {
        let grants = vec!["payment.*".to_string(), "orders".to_string()];
        assert!(parse("payment.*").unwrap().covered_by(&grants));
        assert!(parse("payment.success").unwrap().covered_by(&grants));
        assert!(parse("orders").unwrap().covered_by(&grants));
        assert!(!parse("orders*").unwrap().covered_by(&grants));
        assert!(!parse("*").unwrap().covered_by(&grants));
        assert!(!parse("internal.x").unwrap().covered_by(&grants));
        assert!(parse("*").unwrap().covered_by(&["*".to_string()]));
    }

    #[test]
    fn selectors_match_stream_names() {
        assert!(parse("pay.*").unwrap().matches("pay.x"));
        assert!(!parse("pay.*").unwrap().matches("payx"));
        assert!(parse("*").unwrap().matches("anything"));
        assert!(!parse("a").unwrap().matches("ab"));
    }
}
