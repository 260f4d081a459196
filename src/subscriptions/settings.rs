//! A subscription's settings beyond its pattern and start: creating one
//! with retry settings, an ordering per key and `if_not_exists`, and
//! changing them (`alter_subscription`). The subscriptions' own table and
//! checks are in mod.rs.

use std::time::Duration;

use crate::log::kept_plan::KeptStatements;
use pgrx::datum::{DatumWithOid, Interval};
use pgrx::prelude::*;

use super::{as_owner, create, failures, named, open, refuse_webhook};
use crate::error::{OrRaise, StreamsError};
use litebase_streams_core::filters::{validate_filter, validate_types, EventFilter};

/// The most attempts `max_attempts` may allow.
const MOST_ATTEMPTS: i32 = 1000;

/// Retry settings of a subscription as given (None: unchanged, or the
/// default at creation).
#[derive(Default, Clone, Copy)]
struct RetrySettings {
    max_attempts: Option<i32>,
    backoff_min: Option<Duration>,
    backoff_max: Option<Duration>,
}

impl RetrySettings {
    fn from_arguments(max_attempts: Option<i32>, backoff_min: Option<Interval>, backoff_max: Option<Interval>) -> Self {
        if let Some(max) = max_attempts {
            if !(1..=MOST_ATTEMPTS).contains(&max) {
                StreamsError::ArgumentOutOfRange {
                    argument: "max_attempts",
                    value: max.into(),
                    min: 1,
                    max: MOST_ATTEMPTS.into(),
                }
                .raise();
            }
        }
        RetrySettings {
            max_attempts,
            backoff_min: backoff_min.map(|b| failures::delay(&b, "backoff_min")),
            backoff_max: backoff_max.map(|b| failures::delay(&b, "backoff_max")),
        }
    }
}

/// `streams._create_subscription(name, stream, start, ordered,
/// max_attempts, backoff_min, backoff_max, if_not_exists, types, filter)`:
/// the same, with retry settings and filters (0.3.0).
#[pg_extern(sql = false)]
#[allow(clippy::too_many_arguments)]
fn _create_subscription_with_retries(
    name: Option<&str>,
    stream: Option<&str>,
    start: Option<i64>,
    ordered: Option<bool>,
    key: Option<&str>,
    on_dead_letter: Option<&str>,
    max_attempts: Option<i32>,
    backoff_min: Option<Interval>,
    backoff_max: Option<Interval>,
    if_not_exists: Option<bool>,
    types: Option<Vec<Option<String>>>,
    filter: Option<pgrx::JsonB>,
) {
    crate::log::catalog::lock_for_reading();
    let name = name.ok_or(StreamsError::NullArgument("name")).or_raise();
    let stream = stream.ok_or(StreamsError::NullArgument("stream")).or_raise();
    let start = start.ok_or(StreamsError::NullArgument("after")).or_raise();
    let ordered = ordered.ok_or(StreamsError::NullArgument("ordered")).or_raise();
    let backoff_min = backoff_min.ok_or(StreamsError::NullArgument("backoff_min")).or_raise();
    let backoff_max = backoff_max.ok_or(StreamsError::NullArgument("backoff_max")).or_raise();
    let if_not_exists = if_not_exists.ok_or(StreamsError::NullArgument("if_not_exists")).or_raise();
    let settings = RetrySettings::from_arguments(max_attempts, Some(backoff_min), Some(backoff_max));
    if settings.backoff_min > settings.backoff_max {
        StreamsError::BackoffOrder.raise();
    }
    let key_path = key.map(|key| {
        if !ordered {
            StreamsError::KeyNeedsOrdered.raise();
        }
        litebase_streams_core::keys::parse_key_path(key)
            .unwrap_or_else(|reason| StreamsError::InvalidKeyPath { key: key.to_owned(), reason }.raise())
            .as_array()
    });
    let skip_dead_letters = match on_dead_letter.unwrap_or("hold") {
        "hold" => false,
        "skip" => true,
        other => StreamsError::InvalidOnDeadLetter(other.to_owned()).raise(),
    };
    let filter = checked_filter(types, filter);
    if if_not_exists {
        if let Some(existing) = named(name).into_iter().find(|n| n.own) {
            let differs = if existing.stream != stream {
                Some("stream pattern")
            } else if existing.ordered != ordered || existing.key.as_deref() != key {
                Some("ordering")
            } else if !same_filter(&existing.filter, &filter) {
                Some("filter (types or filter)")
            } else {
                None
            };
            if let Some(differs) = differs {
                StreamsError::SubscriptionDiffers { name: name.to_owned(), differs }.raise();
            }
            return;
        }
    }
    let id = create(name, stream, start, ordered);
    alter(id, settings, false);
    if key.is_some() || skip_dead_letters {
        as_owner(|client| {
            let args: [DatumWithOid; 4] = [
                id.into(),
                key.into(),
                key_path.clone().into(),
                (if skip_dead_letters { "skip" } else { "hold" }).into(),
            ];
            client.update_kept(
                "UPDATE streams.subscription_state SET key = $2, key_path = $3, on_dead_letter = $4 WHERE id = $1",
                None,
                &args,
            )?;
            Ok(())
        });
    }
    store_filter(id, &filter);
}

/// Keep only the events `filter` lets through for the new subscription (or
/// webhook) `id`.
pub(crate) fn store_filter(id: i32, filter: &EventFilter) {
    if filter.is_empty() {
        return;
    }
    as_owner(|client| {
        let args: [DatumWithOid; 3] = [id.into(), filter.types.clone().into(), filter.data.clone().into()];
        client.update_kept(
            "UPDATE streams.subscription_state SET types = $2, filter = $3::pg_catalog.jsonb WHERE id = $1",
            None,
            &args,
        )?;
        Ok(())
    });
}

/// `types` and `filter` of a new subscription or webhook, checked (22023).
pub(crate) fn checked_filter(types: Option<Vec<Option<String>>>, filter: Option<pgrx::JsonB>) -> EventFilter {
    if let Some(types) = &types {
        validate_types(types).or_raise();
    }
    if let Some(filter) = &filter {
        validate_filter(&filter.0).or_raise();
    }
    EventFilter {
        types: types.map(|types| types.into_iter().flatten().collect()),
        data: filter.map(|filter| filter.0.to_string()),
    }
}

/// Whether two filters keep the same events: the same types (in any order)
/// and the same JSON (compared as values: the stored one is PostgreSQL's
/// text of it).
fn same_filter(a: &EventFilter, b: &EventFilter) -> bool {
    let sorted = |types: &Option<Vec<String>>| {
        types.clone().map(|mut t| {
            t.sort_unstable();
            t.dedup();
            t
        })
    };
    let json = |data: &Option<String>| data.as_deref().map(serde_json::from_str::<serde_json::Value>);
    let (ja, jb) = (json(&a.data), json(&b.data));
    let same_data = match (ja, jb) {
        (None, None) => true,
        (Some(Ok(x)), Some(Ok(y))) => x == y,
        _ => false,
    };
    sorted(&a.types) == sorted(&b.types) && same_data
}

/// `streams.alter_subscription(name, max_attempts, backoff_min,
/// backoff_max, unlimited_attempts)`: change its retry settings (NULL:
/// unchanged).
#[pg_extern(sql = false)]
fn _alter_subscription(
    name: Option<&str>,
    max_attempts: Option<i32>,
    backoff_min: Option<Interval>,
    backoff_max: Option<Interval>,
    unlimited_attempts: Option<bool>,
) {
    crate::log::catalog::lock_for_reading();
    let name = name.ok_or(StreamsError::NullArgument("name")).or_raise();
    let unlimited = unlimited_attempts.unwrap_or(false);
    let settings = RetrySettings::from_arguments(max_attempts, backoff_min, backoff_max);
    let subscription = open(name);
    refuse_webhook(&subscription);
    let min = settings.backoff_min.map_or(subscription.backoff_min_us, |d| d.as_micros() as i64);
    let max = settings.backoff_max.map_or(subscription.backoff_max_us, |d| d.as_micros() as i64);
    if min > max {
        StreamsError::BackoffOrder.raise();
    }
    alter(subscription.id, settings, unlimited);
}

fn alter(id: i32, settings: RetrySettings, unlimited: bool) {
    let micros = |d: Option<Duration>| d.map(|d| d.as_micros() as i64);
    as_owner(|client| {
        let args: [DatumWithOid; 5] = [
            id.into(),
            settings.max_attempts.into(),
            unlimited.into(),
            micros(settings.backoff_min).into(),
            micros(settings.backoff_max).into(),
        ];
        client.update_kept(
            "UPDATE streams.subscription_state
             SET max_attempts = CASE WHEN $3 THEN NULL ELSE coalesce($2, max_attempts) END,
                 backoff_min = coalesce(pg_catalog.make_interval(secs => $4::double precision / 1e6), backoff_min),
                 backoff_max = coalesce(pg_catalog.make_interval(secs => $5::double precision / 1e6), backoff_max)
             WHERE id = $1",
            None,
            &args,
        )?;
        Ok(())
    });
}
