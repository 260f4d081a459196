//! Rust half of `streams.replay` (sql/streams.sql). `replay` is a plain SQL
//! function that PostgreSQL inlines into the caller's query; these immutable
//! helpers turn its arguments into constants at plan time, so that a call with
//! literal arguments plans like the hand-written range query on
//! `streams.events` (an exact stream uses the (stream, position) index, a
//! pattern becomes a range on it, a wildcard pattern such as
//! `order.*.failed` the range of its literal prefix and a match) and bad
//! arguments fail before anything runs. The filters (`types`, `filter`) are
//! checked here too, and stay plain conditions on the rows the caller's
//! row-level security lets through.

use pgrx::prelude::*;

use crate::error::{OrRaise, StreamsError};
use litebase_streams_core::filters::{validate_filter, validate_types};
use litebase_streams_core::names::{parse_stream_selector, StreamSelector};

fn selector(pattern: Option<&str>) -> StreamSelector {
    pattern.map_or(StreamSelector::All, |p| parse_stream_selector(p).or_raise())
}

/// The stream name when `pattern` is an exact name, else null.
#[pg_extern(immutable, parallel_safe)]
pub(crate) fn _stream_exact(pattern: Option<&str>) -> Option<String> {
    match selector(pattern) {
        StreamSelector::Exact(name) => Some(name),
        _ => None,
    }
}

/// The lowest name matched by a prefix pattern (`payment.*` → `payment.`)
/// or by a wildcard pattern's literal prefix (`order.*.failed` → `order.`),
/// else null.
#[pg_extern(immutable, parallel_safe)]
pub(crate) fn _stream_prefix_low(pattern: Option<&str>) -> Option<String> {
    selector(pattern).prefix_range().map(|(low, _)| low.to_owned())
}

/// The smallest name above every name a prefix pattern (or a wildcard
/// pattern's literal prefix) matches, else null.
#[pg_extern(immutable, parallel_safe)]
pub(crate) fn _stream_prefix_high(pattern: Option<&str>) -> Option<String> {
    selector(pattern).prefix_range().map(|(_, high)| high.to_owned())
}

/// The pattern when it has a `*` segment before its end (`order.*.failed`:
/// the names in its prefix range must still match it), else null.
#[pg_extern(sql = false, immutable, parallel_safe)]
pub(crate) fn _stream_wildcard(pattern: Option<&str>) -> Option<String> {
    match selector(pattern) {
        StreamSelector::Wildcard { pattern, .. } => Some(pattern),
        _ => None,
    }
}

/// `types`, checked: 1 to 100 non-empty types (22023).
#[pg_extern(sql = false, immutable, strict, parallel_safe)]
pub(crate) fn _check_types(types: Vec<Option<String>>) -> Vec<Option<String>> {
    validate_types(&types).or_raise();
    types
}

/// `filter`, checked: a JSON object of at most 4 kB (22023).
#[pg_extern(sql = false, immutable, strict, parallel_safe)]
pub(crate) fn _check_filter(filter: pgrx::JsonB) -> pgrx::JsonB {
    validate_filter(&filter.0).or_raise();
    filter
}

/// `until`, checked: the last position a replay returns (null: no end),
/// not negative (22023).
#[pg_extern(sql = false, immutable, parallel_safe)]
pub(crate) fn _replay_until(until: Option<i64>) -> i64 {
    match until {
        None => i64::MAX,
        Some(n) if n < 0 => StreamsError::NegativeArgument { argument: "until", value: n }.raise(),
        Some(n) => n,
    }
}

/// `max_events`, checked: not null (22004), not negative (22023).
#[pg_extern(immutable, parallel_safe)]
pub(crate) fn _replay_limit(max_events: Option<i32>) -> i32 {
    match max_events {
        None => StreamsError::NullArgument("max_events").raise(),
        Some(n) if n < 0 => StreamsError::NegativeArgument { argument: "max_events", value: n.into() }.raise(),
        Some(n) => n,
    }
}

/// `streams._era(position, era_bounds)`: the era of the log `position`
/// belongs to, which `streams.events` joins `streams.transactions` on. 0 for
/// every position of a log never restored into another cluster; each such
/// restore appends a bound (`streams.horizon_state.era_bounds`), and the
/// positions above it are of the next era. Bounds are few and ascending.
///
/// A plain V1 function rather than a `#[pg_extern]`: it runs once per row a
/// reader reads `time` of, and without bounds (the common case) it returns
/// before touching anything.
///
/// # Safety
/// SAFETY: called by the executor with the two arguments declared in
/// sql/streams.sql (bigint, bigint[]).
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn litebase_streams_era(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    let args = (*fcinfo).args.as_slice(2);
    if args[0].isnull || args[1].isnull {
        return pg_sys::Datum::from(0i32);
    }
    let position = i64::from_datum(args[0].value, false).unwrap_or_default();
    let bounds = pgrx::Array::<i64>::from_datum(args[1].value, false);
    pg_sys::Datum::from(era_of(position, bounds.iter().flat_map(|b| b.iter().flatten())))
}

crate::ffi::function_info_v1!(pg_finfo_litebase_streams_era);

fn era_of(position: i64, bounds: impl Iterator<Item = i64>) -> i32 {
    bounds.filter(|&bound| position > bound).count() as i32
}

#[cfg(test)]
mod tests {
    use super::era_of;

    #[test]
    fn a_position_above_a_bound_is_of_the_next_era() {
        assert_eq!(era_of(5, [].into_iter()), 0);
        assert_eq!(era_of(10, [10].into_iter()), 0);
        assert_eq!(era_of(11, [10].into_iter()), 1);
        assert_eq!(era_of(11, [10, 10].into_iter()), 2);
        assert_eq!(era_of(500, [10, 200, 700].into_iter()), 2);
    }
}
