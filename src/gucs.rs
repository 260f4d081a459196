//! Every `litebase_streams.*` setting.

use std::time::Duration;

use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};

/// `litebase_streams.idle_poll`: how long a worker sleeps when nothing woke
/// it, in milliseconds. Publishers wake the worker at every commit, so this is
/// only a safety net (and how soon a dropped extension's worker leaves).
pub static IDLE_POLL_MS: GucSetting<i32> = GucSetting::<i32>::new(1000);

/// `litebase_streams.batch_size`: the most events one delivery transaction
/// notifies. Larger batches amortise the commit; smaller ones bound the size
/// of one transaction's notification queue entries.
pub static BATCH_SIZE: GucSetting<i32> = GucSetting::<i32>::new(10_000);

pub fn init() {
    GucRegistry::define_int_guc(
        c"litebase_streams.idle_poll",
        c"How often (ms) an idle worker looks for work nobody woke it for.",
        c"Publishers wake the worker at commit; this interval is only a safety net.",
        &IDLE_POLL_MS,
        10,
        3_600_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"litebase_streams.batch_size",
        c"The most events one delivery transaction sends.",
        c"A worker delivers at most this many events per transaction, then continues at once.",
        &BATCH_SIZE,
        1,
        1_000_000,
        GucContext::Sighup,
        GucFlags::default(),
    );
}

pub fn idle_poll() -> Duration {
    Duration::from_millis(IDLE_POLL_MS.get().max(1) as u64)
}
