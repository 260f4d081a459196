//! Stream names and patterns, by the extension's rule (litebase-streams-core):
//! a name is 1 to 63 bytes of `[A-Za-z0-9_.:-]` starting with a letter, digit
//! or `_`; a pattern is a name, `prefix*`, `*`, or has `*` segments
//! (`order.*.failed`: one whole segment each). The gateway checks them
//! before it takes a LISTEN channel or a topic for one (the database checks
//! them again: 22023), and decides here whether a role's read grants cover a
//! pattern, with the rule subscriptions use.

use litebase_streams_core::filters::{self, EventFilter, FilterError};
use litebase_streams_core::names::{self, NameError, StreamSelector};

/// The filters of a route or WebSocket subscription: `types` (a comma list,
/// or a JSON array in a WebSocket message) and `filter` (a JSON object that
/// the events' data must contain). Checked here for a 400; the database
/// checks them again (22023) and applies them to the rows the role may read.
pub fn parse_filter(types: Option<&str>, filter: Option<&str>) -> Result<EventFilter, String> {
    let describe = |FilterError { argument, reason }: FilterError| format!("invalid {argument}: {reason}");
    let types = types.map(filters::parse_types_parameter).transpose().map_err(describe)?;
    let data = filter.map(|f| filters::parse_filter(f).map(|v| v.to_string())).transpose().map_err(describe)?;
    Ok(EventFilter { types, data })
}

/// The key that tells the topics of one pattern with different filters apart.
pub fn topic_key(pattern: &str, filter: &EventFilter) -> String {
    if filter.is_empty() {
        return pattern.to_owned();
    }
    format!("{pattern}\u{0}{:?}\u{0}{}", filter.types, filter.data.as_deref().unwrap_or(""))
}

/// What a pattern selects.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Selector {
    Exact(String),
    Prefix(String),
    /// A pattern with a `*` segment before its end, and its literal prefix
    /// (the text before the first `*`, perhaps empty).
    Wildcard {
        pattern: String,
        prefix: String,
    },
    All,
}

/// Check a stream name against the naming rule; the error says what is wrong.
pub fn validate_stream_name(name: &str) -> Result<(), String> {
    names::validate_stream_name(name)
        .map_err(|NameError { name, reason }| format!("invalid stream name {name:?}: {reason}"))
}

/// Parse `name`, `prefix*`, `*` or a pattern with `*` segments.
pub fn parse(pattern: &str) -> Result<Selector, String> {
    match names::parse_stream_selector(pattern) {
        Ok(StreamSelector::Exact(name)) => Ok(Selector::Exact(name)),
        Ok(StreamSelector::Prefix { prefix, .. }) => Ok(Selector::Prefix(prefix)),
        Ok(StreamSelector::Wildcard { pattern, prefix, .. }) => Ok(Selector::Wildcard { pattern, prefix }),
        Ok(StreamSelector::All) => Ok(Selector::All),
        Err(NameError { reason, .. }) => Err(format!("invalid stream pattern {pattern:?}: {reason}")),
    }
}

impl Selector {
    pub fn matches(&self, stream: &str) -> bool {
        match self {
            Selector::Exact(name) => name == stream,
            Selector::Prefix(prefix) => stream.starts_with(prefix.as_str()),
            Selector::Wildcard { pattern, .. } => names::pattern_matches(pattern, stream),
            Selector::All => true,
        }
    }

    /// Whether a role holding read grants on `grants` (names and patterns,
    /// as `streams._read_patterns()` returns them) may read everything this
    /// selects: a grant on `'payment.*'` covers `payment.*` and
    /// `payment.success`, one on `payment.success` does not cover `payment.*`.
    pub fn covered_by(&self, grants: &[String]) -> bool {
        let pattern = self.pattern();
        grants.iter().any(|grant| names::pattern_covers(grant, &pattern))
    }

    /// The pattern this selector was parsed from (a prefix's as `prefix*`).
    pub fn pattern(&self) -> String {
        match self {
            Selector::Exact(name) => name.clone(),
            Selector::Prefix(prefix) => format!("{prefix}*"),
            Selector::Wildcard { pattern, .. } => pattern.clone(),
            Selector::All => "*".to_owned(),
        }
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
        assert!(parse("payment.*.failed").unwrap().covered_by(&grants));
        let wild = vec!["order.*.failed".to_string()];
        assert!(parse("order.eu.failed").unwrap().covered_by(&wild));
        assert!(parse("order.*.failed").unwrap().covered_by(&wild));
        assert!(!parse("order.*").unwrap().covered_by(&wild));
        assert!(!parse("order.eu.ok").unwrap().covered_by(&wild));
    }

    #[test]
    fn selectors_match_stream_names() {
        assert!(parse("pay.*").unwrap().matches("pay.x"));
        assert!(!parse("pay.*").unwrap().matches("payx"));
        assert!(parse("*").unwrap().matches("anything"));
        assert!(!parse("a").unwrap().matches("ab"));
        assert!(parse("order.*.failed").unwrap().matches("order.eu.failed"));
        assert!(!parse("order.*.failed").unwrap().matches("order.eu.x.failed"));
        assert!(parse("order.*x").is_err());
    }
}
