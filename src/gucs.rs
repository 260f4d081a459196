//! Every `litebase_streams.*` setting.
//!
//! The limits that protect other sessions (`hold_timeout`, `max_event_size`)
//! are superuser-only (`PGC_SUSET`): a publisher cannot lift them with `SET`,
//! while a superuser can still set them per database or role
//! (`ALTER DATABASE app SET litebase_streams.hold_timeout = '30s'`).
//!
//! The settings are private: each is read through one typed getter below.

use std::time::Duration;

use std::ffi::CString;

use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};

/// `litebase_streams.idle_poll`: how long a worker sleeps when nothing woke
/// it, in milliseconds. Publishers wake the worker at every commit, so this is
/// only a safety net (and how soon a dropped extension's worker leaves).
static IDLE_POLL_MS: GucSetting<i32> = GucSetting::<i32>::new(1000);

/// `litebase_streams.batch_size`: the most events one delivery transaction
/// notifies. Larger batches amortise the commit; smaller ones bound the size
/// of one transaction's notification queue entries.
static BATCH_SIZE: GucSetting<i32> = GucSetting::<i32>::new(10_000);

/// `litebase_streams.hold_timeout`: the longest a publishing transaction may
/// hold the horizon back, in milliseconds (0: no limit). The worker ends the
/// session of a holder older than this. The value that counts is the
/// database's (`ALTER DATABASE ... SET`) or the server's, never a session's.
static HOLD_TIMEOUT_MS: GucSetting<i32> = GucSetting::<i32>::new(0);

/// `litebase_streams.max_backlog`: how far (in positions) the worker may fall
/// behind publishers (0: no limit). A transaction's first publish waits (up
/// to a second) while more final positions than this await the worker, so
/// that under a load the worker cannot keep up with (asynchronous commit on
/// a machine the publishers saturate), publishers slow to its pace instead
/// of events staying invisible for longer and longer. Positions behind an
/// open publishing transaction do not count. 2000 is about 100 ms of events
/// at 20,000 events/s. Server-wide.
static MAX_BACKLOG: GucSetting<i32> = GucSetting::<i32>::new(2000);

/// `litebase_streams.max_event_size`: the largest `data` one event may carry,
/// in bytes of its stored (uncompressed) jsonb form (0: no limit).
static MAX_EVENT_SIZE: GucSetting<i32> = GucSetting::<i32>::new(0);

/// `litebase_streams.webhook_allowed_hosts`: host names, IP addresses and
/// CIDR ranges webhooks may reach besides public addresses (loopback,
/// private and link-local addresses are refused unless listed here).
/// Server-wide (postgresql.conf or ALTER SYSTEM): the webhook worker and
/// `create_webhook` must see the same list, and only a superuser may widen it.
static WEBHOOK_ALLOWED_HOSTS: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c""));

/// `litebase_streams.idempotency_window`: how long (s) publish remembers
/// an idempotency key per stream. Server-wide: publishers and the worker
/// that forgets old keys must agree on it.
static IDEMPOTENCY_WINDOW_S: GucSetting<i32> = GucSetting::<i32>::new(86_400);

/// `litebase_streams.webhook_timeout`: how long (ms) one webhook request
/// may take, connecting included.
static WEBHOOK_TIMEOUT_MS: GucSetting<i32> = GucSetting::<i32>::new(10_000);

/// `litebase_streams.webhook_retry_min` / `webhook_retry_max`: the backoff
/// after a failed request starts at the first and doubles up to the
/// second (ms), with jitter.
static WEBHOOK_RETRY_MIN_MS: GucSetting<i32> = GucSetting::<i32>::new(1_000);
static WEBHOOK_RETRY_MAX_MS: GucSetting<i32> = GucSetting::<i32>::new(600_000);

/// `litebase_streams.webhook_max_concurrency`: webhook requests in flight
/// at once, per database (each on a thread of the webhook worker). Due
/// webhooks wait for a free one, served in turn.
static WEBHOOK_MAX_CONCURRENCY: GucSetting<i32> = GucSetting::<i32>::new(64);

/// `litebase_streams.webhook_max_attempts`: failed attempts of one request
/// after which the webhook is disabled (0: no limit).
static WEBHOOK_MAX_ATTEMPTS: GucSetting<i32> = GucSetting::<i32>::new(0);

/// `litebase_streams.webhook_disable_after`: how long (s) a webhook may
/// fail without a success before it is disabled (0: never).
static WEBHOOK_DISABLE_AFTER_S: GucSetting<i32> = GucSetting::<i32>::new(3 * 86_400);

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
    GucRegistry::define_int_guc(
        c"litebase_streams.max_backlog",
        c"How far (positions) the worker may fall behind publishers; 0 disables.",
        c"A transaction's first publish waits, up to a second, while more final positions than this \
          await the worker: publishers slow down to the worker's pace.",
        &MAX_BACKLOG,
        0,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"litebase_streams.hold_timeout",
        c"The longest (ms) a publishing transaction may hold the horizon back; 0 disables.",
        c"The worker terminates the session of a publishing transaction open longer than this. \
          Superuser-only; set it per database with ALTER DATABASE ... SET.",
        &HOLD_TIMEOUT_MS,
        0,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"litebase_streams.max_event_size",
        c"The largest data (bytes, uncompressed jsonb) one event may carry; 0 disables.",
        c"streams.publish refuses larger events with SQLSTATE 54000. Superuser-only.",
        &MAX_EVENT_SIZE,
        0,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_BYTE,
    );
    GucRegistry::define_string_guc(
        c"litebase_streams.webhook_allowed_hosts",
        c"Host names, IP addresses and CIDR ranges webhooks may reach besides public addresses.",
        c"Comma-separated. Loopback, private, link-local and other non-public addresses are refused unless \
          listed, also when a public name resolves to them. Server-wide (ALTER SYSTEM).",
        &WEBHOOK_ALLOWED_HOSTS,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"litebase_streams.webhook_timeout",
        c"How long (ms) one webhook request may take, connecting included.",
        c"A request without a 2xx answer within it is retried with backoff.",
        &WEBHOOK_TIMEOUT_MS,
        100,
        600_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"litebase_streams.webhook_retry_min",
        c"The first backoff (ms) after a failed webhook request; it doubles up to webhook_retry_max.",
        c"Each wait is drawn between half and all of the current backoff (jitter).",
        &WEBHOOK_RETRY_MIN_MS,
        1,
        86_400_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"litebase_streams.webhook_retry_max",
        c"The longest backoff (ms) between attempts of a failing webhook request.",
        c"",
        &WEBHOOK_RETRY_MAX_MS,
        1,
        86_400_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"litebase_streams.webhook_max_concurrency",
        c"Webhook requests in flight at once, per database.",
        c"Each runs on a thread of the database's webhook worker; due webhooks wait for a free one, in turn.",
        &WEBHOOK_MAX_CONCURRENCY,
        1,
        1024,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"litebase_streams.webhook_max_attempts",
        c"Failed attempts of one webhook request after which the webhook is disabled; 0: no limit.",
        c"",
        &WEBHOOK_MAX_ATTEMPTS,
        0,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"litebase_streams.webhook_disable_after",
        c"How long (s) a webhook may fail without a success before it is disabled; 0: never.",
        c"",
        &WEBHOOK_DISABLE_AFTER_S,
        0,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"litebase_streams.idempotency_window",
        c"How long (s) publish remembers an idempotency key.",
        c"A publish with a key remembered for its stream writes nothing and returns the original positions. \
          The worker forgets older keys.",
        &IDEMPOTENCY_WINDOW_S,
        1,
        366 * 86_400,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
}

/// `idempotency_window`, in seconds.
pub fn idempotency_window_s() -> i64 {
    i64::from(IDEMPOTENCY_WINDOW_S.get().max(1))
}

/// `webhook_allowed_hosts` as written.
pub fn webhook_allowed_hosts() -> String {
    WEBHOOK_ALLOWED_HOSTS.get().map(|v| v.to_string_lossy().into_owned()).unwrap_or_default()
}

pub fn webhook_timeout() -> Duration {
    Duration::from_millis(WEBHOOK_TIMEOUT_MS.get().max(1) as u64)
}

pub fn idle_poll() -> Duration {
    Duration::from_millis(IDLE_POLL_MS.get().max(1) as u64)
}

/// `hold_timeout` as a duration, `None` when off.
pub fn hold_timeout() -> Option<Duration> {
    let ms = HOLD_TIMEOUT_MS.get();
    (ms > 0).then(|| Duration::from_millis(ms as u64))
}

/// `batch_size`: the most events one delivery round notifies.
pub fn batch_size() -> i64 {
    i64::from(BATCH_SIZE.get().max(1))
}

/// `max_backlog` in positions, `None` when off.
pub fn max_backlog() -> Option<u64> {
    let limit = MAX_BACKLOG.get();
    (limit > 0).then_some(limit as u64)
}

/// `max_event_size` in bytes, `None` when off.
pub fn max_event_size() -> Option<usize> {
    let limit = MAX_EVENT_SIZE.get();
    (limit > 0).then_some(limit as usize)
}

/// `webhook_retry_min` and `webhook_retry_max`, the second at least the first.
pub fn webhook_retry_range() -> (Duration, Duration) {
    let min = WEBHOOK_RETRY_MIN_MS.get().max(1) as u64;
    let max = (WEBHOOK_RETRY_MAX_MS.get().max(1) as u64).max(min);
    (Duration::from_millis(min), Duration::from_millis(max))
}

/// `webhook_max_concurrency`: requests in flight at once, at least one.
pub fn webhook_max_concurrency() -> usize {
    WEBHOOK_MAX_CONCURRENCY.get().max(1) as usize
}

/// `webhook_max_attempts`, `None` when there is no limit.
pub fn webhook_max_attempts() -> Option<i32> {
    let limit = WEBHOOK_MAX_ATTEMPTS.get();
    (limit > 0).then_some(limit)
}

/// `webhook_disable_after`, `None` when a failing webhook is never disabled.
pub fn webhook_disable_after() -> Option<Duration> {
    let seconds = WEBHOOK_DISABLE_AFTER_S.get();
    (seconds > 0).then(|| Duration::from_secs(seconds as u64))
}
