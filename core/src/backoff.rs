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
