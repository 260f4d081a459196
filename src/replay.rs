//! Rust half of `streams.replay` (sql/streams.sql): turning the `stream`
//! argument into an index-friendly selector, with the naming rule's errors.

use pgrx::prelude::*;

use crate::error::OrRaise;
use crate::notify::{parse_stream_selector, StreamSelector};

/// `exact` for a stream name; `prefix_low`/`prefix_high` (a half-open range of
/// names) for a pattern such as `payment.*`; all null for `*`.
#[pg_extern(immutable, parallel_safe, strict)]
fn _stream_selector(
    pattern: &str,
) -> TableIterator<'static, (name!(exact, Option<String>), name!(prefix_low, Option<String>), name!(prefix_high, Option<String>))>
{
    let row = match parse_stream_selector(pattern).or_raise() {
        StreamSelector::Exact(name) => (Some(name), None, None),
        StreamSelector::Prefix { prefix, upper } => (None, Some(prefix), Some(upper)),
        StreamSelector::All => (None, None, None),
    };
    TableIterator::once(row)
}
