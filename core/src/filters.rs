//! Event filters: which events of the selected streams a reader wants, by
//! type (`types => text[]`: the event's type is one of them) and by data
//! (`filter => jsonb`: containment, `data @> filter`). Shared by replay,
//! subscriptions and the gateway.
//!
//! A filter only narrows: it is applied to the rows the caller may read
//! (row-level security runs first), so it never reveals an event of a stream
//! the caller may not read. Limits keep a filter cheap to store with a
//! subscription and to test on every event.

use crate::names::StreamSelector;

/// The largest `filter`, as compact JSON text.
pub const MAX_FILTER_BYTES: usize = 4096;
/// The most entries of `types`.
pub const MAX_TYPES: usize = 100;

/// A filter that breaks the rules, and why. The extension raises it as
/// SQLSTATE 22023 (error.rs converts it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterError {
    pub argument: &'static str,
    pub reason: String,
}

fn invalid(argument: &'static str, reason: impl Into<String>) -> FilterError {
    FilterError { argument, reason: reason.into() }
}

/// Check `filter`: a JSON object of at most [`MAX_FILTER_BYTES`] as compact
/// text.
pub fn validate_filter(filter: &serde_json::Value) -> Result<(), FilterError> {
    if !filter.is_object() {
        return Err(invalid("filter", "it must be a JSON object, such as '{\"status\": \"failed\"}'"));
    }
    let size = filter.to_string().len();
    if size > MAX_FILTER_BYTES {
        return Err(invalid("filter", format!("it is {size} bytes as JSON, more than the {MAX_FILTER_BYTES} allowed")));
    }
    Ok(())
}

/// Check `types`: 1 to [`MAX_TYPES`] entries, none null or empty.
pub fn validate_types<S: AsRef<str>>(types: &[Option<S>]) -> Result<(), FilterError> {
    if types.is_empty() {
        return Err(invalid("types", "it is empty: give at least one type, or NULL for every type"));
    }
    if types.len() > MAX_TYPES {
        return Err(invalid("types", format!("it has {} entries, more than the {MAX_TYPES} allowed", types.len())));
    }
    if types.iter().any(|t| t.as_ref().is_none_or(|t| t.as_ref().is_empty())) {
        return Err(invalid("types", "it contains a null or empty type"));
    }
    Ok(())
}

/// Parse the gateway's `types=a,b` query parameter.
pub fn parse_types_parameter(types: &str) -> Result<Vec<String>, FilterError> {
    let list: Vec<Option<String>> = types.split(',').map(|t| Some(t.trim().to_owned())).collect();
    validate_types(&list)?;
    Ok(list.into_iter().flatten().collect())
}

/// Parse and check a filter given as JSON text (the gateway's `filter=`).
pub fn parse_filter(filter: &str) -> Result<serde_json::Value, FilterError> {
    if filter.len() > MAX_FILTER_BYTES * 4 {
        return Err(invalid("filter", format!("it is more than {MAX_FILTER_BYTES} bytes")));
    }
    let value: serde_json::Value =
        serde_json::from_str(filter).map_err(|e| invalid("filter", format!("it is not valid JSON: {e}")))?;
    validate_filter(&value)?;
    Ok(value)
}

/// A checked filter: what a subscription stores and its queries test.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventFilter {
    /// The event's type is one of these (None: any type, or none).
    pub types: Option<Vec<String>>,
    /// The event's data contains this JSON object, as compact text (None: any data).
    pub data: Option<String>,
}

impl EventFilter {
    /// Whether it lets every event through.
    pub fn is_empty(&self) -> bool {
        self.types.is_none() && self.data.is_none()
    }

    /// The SQL conditions on the events aliased `alias`, with the values as
    /// text parameters from `$n` on: `AND ...` (or nothing), and the values.
    pub fn sql_condition(&self, alias: &str, n: usize) -> (String, Vec<String>) {
        let mut sql = String::new();
        let mut values = Vec::new();
        if let Some(types) = &self.types {
            sql.push_str(&format!(" AND {alias}.type = ANY (${}::pg_catalog.text[])", n + values.len()));
            values.push(array_literal(types));
        }
        if let Some(data) = &self.data {
            sql.push_str(&format!(" AND {alias}.data OPERATOR(pg_catalog.@>) ${}::pg_catalog.jsonb", n + values.len()));
            values.push(data.clone());
        }
        (sql, values)
    }

    /// The SQL conditions on the events aliased `alias` that `selector`
    /// selects and this filter lets through, with the values as text
    /// parameters from `$n` on: what subscriptions and webhooks read.
    pub fn events_condition(&self, selector: &StreamSelector, alias: &str, n: usize) -> (String, Vec<String>) {
        let (mut sql, values) = selector.sql_condition(&format!("{alias}.stream"), n);
        let mut values: Vec<String> = values.into_iter().map(str::to_owned).collect();
        let (filter, filter_values) = self.sql_condition(alias, n + values.len());
        sql.push_str(&filter);
        values.extend(filter_values);
        (sql, values)
    }

    /// Whether an event of this type and data passes (the gateway tests
    /// events it already holds).
    pub fn matches(&self, event_type: Option<&str>, data: &serde_json::Value) -> bool {
        let type_ok = self.types.as_ref().is_none_or(|types| event_type.is_some_and(|t| types.iter().any(|x| x == t)));
        type_ok
            && self.data.as_ref().is_none_or(|filter| {
                serde_json::from_str::<serde_json::Value>(filter).is_ok_and(|filter| contains(data, &filter))
            })
    }
}

/// A text[] literal of `items`, each quoted.
fn array_literal(items: &[String]) -> String {
    let quoted: Vec<String> =
        items.iter().map(|item| format!("\"{}\"", item.replace('\\', "\\\\").replace('"', "\\\""))).collect();
    format!("{{{}}}", quoted.join(","))
}

/// jsonb containment (`value @> filter`), as PostgreSQL defines it: an
/// object contains an object whose every key it has with a containing
/// value; an array contains an array whose every element some element of
/// it contains; scalars contain equal scalars. (A filter is an object, so
/// PostgreSQL's top-level rule for an array containing a scalar never
/// applies.)
pub fn contains(value: &serde_json::Value, filter: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (value, filter) {
        (Value::Object(v), Value::Object(f)) => f.iter().all(|(k, fv)| v.get(k).is_some_and(|vv| contains(vv, fv))),
        (Value::Array(v), Value::Array(f)) => f
            .iter()
            .all(|fe| v.iter().any(|ve| if fe.is_array() || fe.is_object() { contains(ve, fe) } else { ve == fe })),
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (a, b) => !a.is_object() && !a.is_array() && a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn filters_must_be_small_objects() {
        assert!(validate_filter(&json!({"status": "failed"})).is_ok());
        assert!(validate_filter(&json!({})).is_ok());
        for bad in [json!([1]), json!("x"), json!(1), json!(null)] {
            assert_eq!(validate_filter(&bad).unwrap_err().argument, "filter");
        }
        let big = json!({ "k": "x".repeat(MAX_FILTER_BYTES) });
        assert!(validate_filter(&big).unwrap_err().reason.contains("4096"));
        assert!(parse_filter("{\"a\":").is_err());
        assert!(parse_filter("[]").is_err());
    }

    #[test]
    fn types_are_a_short_list_of_names() {
        assert!(validate_types(&[Some("a"), Some("b")]).is_ok());
        assert!(validate_types::<&str>(&[]).is_err());
        assert!(validate_types(&[Some("a"), None]).is_err());
        assert!(validate_types(&[Some("")]).is_err());
        assert_eq!(parse_types_parameter("order.failed, order.paid").unwrap(), vec!["order.failed", "order.paid"]);
        assert!(parse_types_parameter("a,,b").is_err());
    }

    #[test]
    fn conditions_number_their_parameters_and_quote_types() {
        let filter = EventFilter { types: Some(vec!["a".into(), "b\"c".into()]), data: Some("{\"x\":1}".into()) };
        let (sql, values) = filter.sql_condition("e", 7);
        assert_eq!(
            sql,
            " AND e.type = ANY ($7::pg_catalog.text[]) AND e.data OPERATOR(pg_catalog.@>) $8::pg_catalog.jsonb"
        );
        assert_eq!(values, vec!["{\"a\",\"b\\\"c\"}".to_owned(), "{\"x\":1}".to_owned()]);
        assert_eq!(EventFilter::default().sql_condition("e", 1), (String::new(), vec![]));
    }

    #[test]
    fn events_conditions_number_the_filter_after_the_pattern() {
        let selector = crate::names::parse_stream_selector("orders.*").unwrap();
        let filter = EventFilter { types: Some(vec!["paid".into()]), data: None };
        let (sql, values) = filter.events_condition(&selector, "e", 4);
        assert_eq!(sql, "AND e.stream >= $4 AND e.stream < $5 AND e.type = ANY ($6::pg_catalog.text[])");
        assert_eq!(values, vec!["orders.".to_owned(), "orders/".to_owned(), "{\"paid\"}".to_owned()]);
    }

    #[test]
    fn containment_follows_jsonb() {
        let data = json!({"status": "failed", "amount": 10, "tags": ["a", "b"], "who": {"id": 1, "eu": true}});
        assert!(contains(&data, &json!({})));
        assert!(contains(&data, &json!({"status": "failed"})));
        assert!(contains(&data, &json!({"amount": 10.0})));
        assert!(contains(&data, &json!({"tags": ["b"]})));
        assert!(contains(&data, &json!({"who": {"eu": true}})));
        assert!(!contains(&data, &json!({"status": "ok"})));
        assert!(!contains(&data, &json!({"tags": "a"})));
        assert!(!contains(&data, &json!({"missing": null})));
        let filter = EventFilter { types: Some(vec!["t".into()]), data: Some("{\"status\":\"failed\"}".into()) };
        assert!(filter.matches(Some("t"), &data));
        assert!(!filter.matches(None, &data));
        assert!(!filter.matches(Some("u"), &data));
    }
}
