//! `litebase_streams_gateway_topic_clients{pattern}`: the clients of each
//! topic pattern, summed over roles (a role name never becomes a label),
//! computed at scrape from the hub's memory. Patterns are chosen by
//! clients, so the label set is bounded: the [`MAX_PATTERNS`] patterns with
//! most clients get their own series, the rest are summed into
//! `pattern="(other)"`.

use std::collections::HashMap;

use super::text::{self, Family, Sample};

pub const NAME: &str = "litebase_streams_gateway_topic_clients";
/// Patterns with a series of their own at most.
pub const MAX_PATTERNS: usize = 100;
/// The label of the patterns beyond [`MAX_PATTERNS`].
pub const OTHER: &str = "(other)";

/// Append the family for `clients` (clients by pattern) to `out`.
pub fn write(out: &mut String, clients: HashMap<String, usize>) {
    text::write_family(out, &family(clients, MAX_PATTERNS));
}

/// The family for `clients` (clients by pattern), at most `limit` patterns
/// by name plus `(other)`: most clients first, ties by name, so that the
/// same counts always give the same series.
pub fn family(clients: HashMap<String, usize>, limit: usize) -> Family {
    let mut by_count: Vec<(String, usize)> = clients.into_iter().filter(|(_, n)| *n > 0).collect();
    by_count.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let rest: usize = by_count.iter().skip(limit).map(|(_, n)| n).sum();
    let others = by_count.len() > limit;
    by_count.truncate(limit);
    let mut samples: Vec<Sample> = by_count
        .into_iter()
        .map(|(pattern, n)| Sample { labels: vec![("pattern".into(), pattern)], value: n as f64 })
        .collect();
    if others {
        samples.push(Sample { labels: vec![("pattern".into(), OTHER.into())], value: rest as f64 });
    }
    Family {
        name: NAME.into(),
        kind: "gauge".into(),
        help: format!(
            "Clients (SSE connections and WebSocket subscriptions) per topic pattern, summed over roles; the {} \
             patterns with most clients by name, the rest as pattern=\"{OTHER}\".",
            MAX_PATTERNS
        ),
        samples,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(family: &Family) -> Vec<(String, f64)> {
        family.samples.iter().map(|s| (s.labels[0].1.clone(), s.value)).collect()
    }

    #[test]
    fn the_patterns_with_most_clients_are_named_and_the_rest_summed() {
        let clients: HashMap<String, usize> =
            [("a.*", 5), ("b.*", 1), ("c.*", 3), ("d.*", 3), ("e.*", 2), ("idle.*", 0)]
                .into_iter()
                .map(|(p, n)| (p.to_owned(), n))
                .collect();
        let f = family(clients.clone(), 3);
        // Ties by name: c before d; b and e are the rest.
        assert_eq!(series(&f), [("a.*".into(), 5.0), ("c.*".into(), 3.0), ("d.*".into(), 3.0), (OTHER.into(), 3.0)]);
        // Within the bound nothing is summed, and a pattern without clients has no series.
        assert_eq!(series(&family(clients.clone(), 5)).len(), 5);
        assert!(!series(&family(clients, 5)).iter().any(|(p, _)| p == OTHER || p == "idle.*"));
        assert!(family(HashMap::new(), MAX_PATTERNS).samples.is_empty());
    }

    #[test]
    fn at_most_the_bound_of_patterns_have_a_series() {
        let clients: HashMap<String, usize> = (0..250).map(|i| (format!("s{i:03}.*"), 1 + i % 7)).collect();
        let total: usize = clients.values().sum();
        let mut counts: Vec<usize> = clients.values().copied().collect();
        counts.sort_unstable_by(|a, b| b.cmp(a));
        let f = family(clients, MAX_PATTERNS);
        assert_eq!(f.samples.len(), MAX_PATTERNS + 1);
        assert_eq!(f.samples.iter().map(|s| s.value).sum::<f64>(), total as f64, "nobody lost in the bound");
        assert_eq!(f.samples.last().unwrap().labels, [("pattern".to_owned(), OTHER.to_owned())]);
        // Those named have at least as many clients as any summed one.
        let least_named = f.samples[..MAX_PATTERNS].iter().map(|s| s.value).fold(f64::MAX, f64::min);
        assert_eq!(least_named, counts[MAX_PATTERNS - 1] as f64);
    }
}
