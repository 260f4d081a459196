//! Rust half of `streams.replay` (sql/streams.sql). `replay` is a plain SQL
//! function that PostgreSQL inlines into the caller's query; these immutable
//! helpers turn its arguments into constants at plan time, so that a call with
//! literal arguments plans like the hand-written range query on
//! `streams.events` (an exact stream uses the (stream, position) index, a
//! pattern becomes a range on it) and bad arguments fail before anything runs.

use pgrx::prelude::*;

use crate::error::{OrRaise, StreamsError};
use crate::notify::{parse_stream_selector, StreamSelector};

fn selector(pattern: Option<&str>) -> StreamSelector {
    pattern.map_or(StreamSelector::All, |p| parse_stream_selector(p).or_raise())
}

/// The stream name when `pattern` is an exact name, else null.
#[pg_extern(immutable, parallel_safe)]
fn _stream_exact(pattern: Option<&str>) -> Option<String> {
    match selector(pattern) {
        StreamSelector::Exact(name) => Some(name),
        _ => None,
    }
}

/// The lowest name matched by a prefix pattern (`payment.*` → `payment.`), else null.
#[pg_extern(immutable, parallel_safe)]
fn _stream_prefix_low(pattern: Option<&str>) -> Option<String> {
    match selector(pattern) {
        StreamSelector::Prefix { prefix, .. } => Some(prefix),
        _ => None,
    }
}

/// The smallest name above every name a prefix pattern matches, else null.
#[pg_extern(immutable, parallel_safe)]
fn _stream_prefix_high(pattern: Option<&str>) -> Option<String> {
    match selector(pattern) {
        StreamSelector::Prefix { upper, .. } => Some(upper),
        _ => None,
    }
}

/// `max_events`, checked: not null (22004), not negative (22023).
#[pg_extern(immutable, parallel_safe)]
fn _replay_limit(max_events: Option<i32>) -> i32 {
    match max_events {
        None => StreamsError::NullArgument("max_events").raise(),
        Some(n) if n < 0 => StreamsError::InvalidArgument(format!("max_events must be zero or more, not {n}")).raise(),
        Some(n) => n,
    }
}
