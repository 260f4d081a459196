//! Stream names to NATS subjects.
//!
//! A stream name (`[A-Za-z0-9_.:-]`, see core's names.rs) is already a subject
//! whose tokens are its `.`-separated segments, with one exception: NATS has no
//! empty tokens, and a name may have empty segments (`a..b`, `a.`). Those become
//! `~`, a character no stream name has, so the mapping stays one to one.

use litebase_streams_core::names::{parse_stream_selector, StreamSelector};

/// The token an empty segment becomes.
const EMPTY_SEGMENT: &str = "~";

/// The subject of `stream`'s events, under `prefix` if there is one.
pub fn subject(prefix: Option<&str>, stream: &str) -> String {
    let mut out = String::with_capacity(prefix.map_or(0, |p| p.len() + 1) + stream.len() + 2);
    if let Some(prefix) = prefix {
        out.push_str(prefix);
        out.push('.');
    }
    for (i, segment) in stream.split('.').enumerate() {
        if i > 0 {
            out.push('.');
        }
        out.push_str(if segment.is_empty() { EMPTY_SEGMENT } else { segment });
    }
    out
}

/// The subjects of a JetStream stream that holds every event `pattern`
/// selects: the pattern itself where NATS can say it (`payment.*` ->
/// `payment.>`, `order.*.failed` stays), else the narrowest wider one (a
/// partial last segment, `order.pay*`, becomes `order.>`).
pub fn for_pattern(prefix: Option<&str>, pattern: &str) -> Result<Vec<String>, String> {
    let selector = parse_stream_selector(pattern).map_err(|e| format!("--pattern {:?}: {}", e.name, e.reason))?;
    let tokens: Vec<String> = match selector {
        StreamSelector::All => vec![">".into()],
        StreamSelector::Exact(name) => return Ok(vec![subject(prefix, &name)]),
        StreamSelector::Prefix { .. } | StreamSelector::Wildcard { .. } => {
            let segments: Vec<&str> = pattern.split('.').collect();
            let last = segments.len() - 1;
            segments
                .iter()
                .enumerate()
                .map(|(i, s)| match *s {
                    "*" if i == last => ">".to_owned(),
                    "*" => "*".to_owned(),
                    s if i == last && s.ends_with('*') => ">".to_owned(),
                    s => s.to_owned(),
                })
                .collect()
        }
    };
    let body = tokens.join(".");
    Ok(vec![match prefix {
        Some(prefix) => format!("{prefix}.{body}"),
        None => body,
    }])
}

/// A subject prefix: one or more non-empty tokens without wildcards or
/// spaces, and not under NATS's own subjects.
pub fn check_prefix(prefix: &str) -> Result<(), String> {
    let bad = prefix.split('.').any(|t| t.is_empty() || t.contains(['*', '>']) || t.chars().any(char::is_whitespace));
    if bad || captures_system_subjects(prefix) {
        return Err(format!(
            "--subject-prefix {prefix:?}: NATS subject tokens, non-empty, separated by '.', without '*', '>' or \
             spaces, and not `$...` or `_INBOX` (NATS's own subjects)"
        ));
    }
    Ok(())
}

/// Whether a subject (or a subject filter) reaches subjects NATS uses for
/// itself: its first token a wildcard (`>`, `*.>`), `$...` (`$JS.API`,
/// `$SYS`) or `_INBOX` (request replies, JetStream's acknowledgements).
pub fn captures_system_subjects(subject: &str) -> bool {
    let first = subject.split('.').next().unwrap_or_default();
    matches!(first, "*" | ">" | "_INBOX") || first.starts_with('$')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_that_reach_nats_own_are_told_apart() {
        for s in [">", "*.>", "*.*.>", "_INBOX.>", "$JS.API.>", "$SYS"] {
            assert!(captures_system_subjects(s), "{s}");
        }
        for s in ["payment.>", "orders.*.>", "app.>", "inbox.>"] {
            assert!(!captures_system_subjects(s), "{s}");
        }
        assert!(check_prefix("_INBOX").is_err());
        assert!(check_prefix("$JS").is_err());
        assert!(check_prefix("app.events").is_ok());
    }

    #[test]
    fn a_stream_name_is_its_subject_and_empty_segments_become_tilde() {
        assert_eq!(subject(None, "payment.success"), "payment.success");
        assert_eq!(subject(Some("events"), "payment.success"), "events.payment.success");
        assert_eq!(subject(None, "a..b."), "a.~.b.~");
        assert_eq!(subject(None, "order:eu-1"), "order:eu-1");
        // one to one: different names, different subjects
        assert_ne!(subject(None, "a..b"), subject(None, "a.b"));
    }

    #[test]
    fn patterns_map_to_subjects_that_hold_every_selected_stream() {
        assert_eq!(for_pattern(None, "*").unwrap(), vec![">"]);
        assert_eq!(for_pattern(Some("lbs"), "*").unwrap(), vec!["lbs.>"]);
        assert_eq!(for_pattern(None, "payment.*").unwrap(), vec!["payment.>"]);
        assert_eq!(for_pattern(None, "payment.success").unwrap(), vec!["payment.success"]);
        assert_eq!(for_pattern(None, "order.*.failed").unwrap(), vec!["order.*.failed"]);
        assert_eq!(for_pattern(None, "order.pay*").unwrap(), vec!["order.>"]);
        assert_eq!(for_pattern(Some("x.y"), "pay*").unwrap(), vec!["x.y.>"]);
        assert!(for_pattern(None, "a..*").is_err());
    }

    #[test]
    fn prefixes_are_plain_subject_tokens() {
        assert!(check_prefix("events").is_ok());
        assert!(check_prefix("db1.events").is_ok());
        for bad in ["", "a..b", "a.", "a.*", "a.>", "a b"] {
            assert!(check_prefix(bad).is_err(), "{bad:?}");
        }
    }
}
