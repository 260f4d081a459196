//! Retry schedules of the workers: how long a failed round waits before
//! the next attempt.

use std::time::Duration;

pub fn backoff(failures: u32) -> Duration {
    Duration::from_millis(10u64 << failures.min(10)).min(Duration::from_secs(10))
}

/// [`backoff`] after a failure with SQLSTATE `sqlstate`. A lack of
/// resources (class 53: a full disk, out of memory) goes away without
/// anyone telling the worker, and a retry costs it one failed round, so
/// it looks again every second at most instead of sitting out the full
/// backoff once space is back.
pub fn backoff_after(sqlstate: &str, failures: u32) -> Duration {
    let full = backoff(failures);
    if sqlstate.starts_with("53") {
        full.min(RESOURCE_RECHECK)
    } else {
        full
    }
}

const RESOURCE_RECHECK: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_ten_seconds() {
        assert_eq!(backoff(1), Duration::from_millis(20));
        assert_eq!(backoff(30), Duration::from_secs(10));
    }

    #[test]
    fn a_full_disk_is_looked_at_again_every_second() {
        assert_eq!(backoff_after("53100", 30), Duration::from_secs(1));
        assert_eq!(backoff_after("53200", 2), backoff(2));
        assert_eq!(backoff_after("40001", 30), Duration::from_secs(10));
    }
}

/// When a nacked event of a subscription is delivered again, in
/// microseconds after the nack: `min * 2^(attempt - 1)`, at most `max`,
/// then between half and all of it (`unit` in `[0, 1)`: the jitter that
/// keeps consumers that failed together from coming back together).
pub fn retry_delay_us(attempt: i32, min_us: i64, max_us: i64, unit: f64) -> i64 {
    let doublings = attempt.saturating_sub(1).clamp(0, 62) as u32;
    let full = min_us.max(0).saturating_mul(1i64 << doublings.min(40)).min(max_us.max(0));
    let half = full / 2;
    half + ((full - half) as f64 * unit.clamp(0.0, 1.0)) as i64
}

#[cfg(test)]
mod retry_tests {
    use super::*;

    #[test]
    fn retries_double_up_to_the_maximum_with_jitter_in_the_upper_half() {
        assert_eq!(retry_delay_us(1, 1_000_000, 600_000_000, 0.0), 500_000);
        assert_eq!(retry_delay_us(1, 1_000_000, 600_000_000, 1.0), 1_000_000);
        assert_eq!(retry_delay_us(3, 1_000_000, 600_000_000, 1.0), 4_000_000);
        assert_eq!(retry_delay_us(30, 1_000_000, 600_000_000, 1.0), 600_000_000);
        assert_eq!(retry_delay_us(i32::MAX, i64::MAX, i64::MAX, 0.5), i64::MAX / 2 + (i64::MAX - i64::MAX / 2) / 2);
        assert_eq!(retry_delay_us(0, 1_000, 2_000, 1.0), 1_000);
    }
}
