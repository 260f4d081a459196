//! The Prometheus text exposition format (version 0.0.4) for metric
//! families whose label sets are only known at run time: the rows of
//! `streams.metrics()` and the clients per topic pattern. The gateway's own
//! metrics come from metrics-exporter-prometheus in the same format, so that
//! GET /metrics is one document a scraper reads in one go.
//!
//! What it guarantees: every line it writes parses. Names that are not
//! Prometheus names are left out (with their samples), label values and
//! help texts are escaped, a type it does not know is written as
//! `untyped`, and the samples of one family come together under one
//! `# HELP` and one `# TYPE` line, whatever order the rows came in.

use std::collections::HashMap;
use std::fmt::Write;

/// One sample: its label pairs in the order given, and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// A metric family: a name, its type and help, and its samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    pub name: String,
    pub kind: String,
    pub help: String,
    pub samples: Vec<Sample>,
}

/// Rows (metric, type, help, sample) grouped into families in the order
/// each name first comes; a later row's type and help are those of the
/// family's first row.
pub fn group(rows: impl IntoIterator<Item = (String, String, String, Sample)>) -> Vec<Family> {
    let mut families: Vec<Family> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for (name, kind, help, sample) in rows {
        let at = *index.entry(name.clone()).or_insert_with(|| {
            families.push(Family { name, kind, help, samples: Vec::new() });
            families.len() - 1
        });
        families[at].samples.push(sample);
    }
    families
}

/// Append `family` to `out`; nothing when its name is not a metric name.
/// A sample with a label name that is not one is left out (its series
/// could not be told from the one without that label).
pub fn write_family(out: &mut String, family: &Family) {
    if !is_metric_name(&family.name) {
        return;
    }
    let kind = match family.kind.as_str() {
        kind @ ("counter" | "gauge" | "untyped") => kind,
        _ => "untyped",
    };
    if !family.help.is_empty() {
        let _ = writeln!(out, "# HELP {} {}", family.name, escape_help(&family.help));
    }
    let _ = writeln!(out, "# TYPE {} {kind}", family.name);
    for sample in &family.samples {
        if !sample.labels.iter().all(|(name, _)| is_label_name(name)) {
            continue;
        }
        out.push_str(&family.name);
        if !sample.labels.is_empty() {
            out.push('{');
            for (i, (name, value)) in sample.labels.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let _ = write!(out, "{name}=\"{}\"", escape_label_value(value));
            }
            out.push('}');
        }
        let _ = writeln!(out, " {}", format_value(sample.value));
    }
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`
pub fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// `[a-zA-Z_][a-zA-Z0-9_]*`, and not `__`-prefixed (reserved to Prometheus).
pub fn is_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    !name.starts_with("__")
        && chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A label value between double quotes: backslash, double quote and line
/// feed escaped.
pub fn escape_label_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A help text (the rest of its line): backslash and line feed escaped.
pub fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A value as Prometheus reads it (Go's ParseFloat): `NaN`, `+Inf`,
/// `-Inf`, or a decimal.
pub fn format_value(value: f64) -> String {
    if value.is_nan() {
        "NaN".into()
    } else if value == f64::INFINITY {
        "+Inf".into()
    } else if value == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        value.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(labels: &[(&str, &str)], value: f64) -> Sample {
        Sample { labels: labels.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(), value }
    }

    fn family(name: &str, kind: &str, help: &str, samples: Vec<Sample>) -> String {
        let mut out = String::new();
        write_family(&mut out, &Family { name: name.into(), kind: kind.into(), help: help.into(), samples });
        out
    }

    #[test]
    fn label_values_escape_quotes_backslashes_and_newlines() {
        let text = family(
            "litebase_streams_events_total",
            "counter",
            "Events.",
            vec![sample(&[("database", "app"), ("stream", "a\"b\\c\nd}e,f=g")], 3.0)],
        );
        assert_eq!(
            text,
            "# HELP litebase_streams_events_total Events.\n\
             # TYPE litebase_streams_events_total counter\n\
             litebase_streams_events_total{database=\"app\",stream=\"a\\\"b\\\\c\\nd}e,f=g\"} 3\n"
        );
        // One sample line: the newline did not end it.
        assert_eq!(text.lines().count(), 3);
    }

    #[test]
    fn help_escapes_backslashes_and_newlines() {
        let text = family("m", "gauge", "two\nlines \\ and \"quotes\"", vec![]);
        assert_eq!(text, "# HELP m two\\nlines \\\\ and \"quotes\"\n# TYPE m gauge\n");
    }

    #[test]
    fn special_values_are_written_as_prometheus_reads_them() {
        let text = family(
            "m",
            "gauge",
            "h",
            vec![
                sample(&[("v", "nan")], f64::NAN),
                sample(&[("v", "inf")], f64::INFINITY),
                sample(&[("v", "-inf")], f64::NEG_INFINITY),
                sample(&[("v", "big")], 1e21),
                sample(&[("v", "small")], 0.25),
                sample(&[("v", "negative")], -3.0),
            ],
        );
        let values: Vec<&str> = text.lines().skip(2).map(|l| l.rsplit(' ').next().unwrap()).collect();
        assert_eq!(values, ["NaN", "+Inf", "-Inf", "1000000000000000000000", "0.25", "-3"]);
    }

    #[test]
    fn an_unknown_type_is_untyped() {
        for kind in ["histogram", "summary", "", "gauge\n# TYPE x counter", "Counter"] {
            let text = family("m", kind, "h", vec![sample(&[], 1.0)]);
            assert_eq!(text, "# HELP m h\n# TYPE m untyped\nm 1\n", "{kind:?}");
        }
        assert!(family("m", "counter", "h", vec![]).contains("# TYPE m counter\n"));
        // No help, no HELP line (an empty one is not one).
        assert_eq!(family("m", "gauge", "", vec![]), "# TYPE m gauge\n");
    }

    #[test]
    fn bad_names_are_left_out() {
        assert_eq!(family("bad name", "gauge", "h", vec![sample(&[], 1.0)]), "");
        assert_eq!(family("1st", "gauge", "h", vec![sample(&[], 1.0)]), "");
        assert_eq!(family("m{x=\"1\"}", "gauge", "h", vec![sample(&[], 1.0)]), "");
        assert_eq!(family("", "gauge", "h", vec![sample(&[], 1.0)]), "");
        let text = family(
            "m",
            "gauge",
            "h",
            vec![
                sample(&[("ok", "1")], 1.0),
                sample(&[("bad-label", "2")], 2.0),
                sample(&[("__name__", "3")], 3.0),
                sample(&[("", "4")], 4.0),
            ],
        );
        assert_eq!(text, "# HELP m h\n# TYPE m gauge\nm{ok=\"1\"} 1\n");
        assert!(is_metric_name("a:b_c1") && is_label_name("_a1") && !is_label_name("a:b"));
    }

    #[test]
    fn rows_of_one_metric_come_together_under_its_first_type_and_help() {
        let row = |name: &str, kind: &str, value: f64| {
            (name.to_owned(), kind.to_owned(), format!("{name} help"), sample(&[], value))
        };
        let families = group([row("a", "gauge", 1.0), row("b", "counter", 2.0), row("a", "counter", 3.0)]);
        assert_eq!(families.len(), 2);
        assert_eq!((families[0].name.as_str(), families[0].kind.as_str()), ("a", "gauge"));
        assert_eq!(families[0].samples.iter().map(|s| s.value).collect::<Vec<_>>(), [1.0, 3.0]);
        assert_eq!(families[1].name, "b");
    }
}
