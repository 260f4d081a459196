//! Prometheus metrics (the `metrics` facade, rendered by
//! metrics-exporter-prometheus at GET /metrics), as in the gateway.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use metrics::{counter, gauge, Counter, Gauge};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

pub struct Metrics {
    /// Events the sink stored for the first time.
    pub bridged: Counter,
    /// Events the sink already had (a window delivered again).
    pub duplicates: Counter,
    /// Windows acked in the database.
    pub windows: Counter,
    /// Events larger than NATS's max_payload, stored as a stand-in without data.
    pub truncated: Counter,
    pub publish_failures: Counter,
    pub nats_reconnects: Counter,
    pub database_reconnects: Counter,
    pub in_flight_events: Gauge,
    pub in_flight_bytes: Gauge,
    pub lag_events: Gauge,
    pub lag_seconds: Gauge,
    pub database_up: Gauge,
    pub nats_up: Gauge,
}

static METRICS: OnceLock<Metrics> = OnceLock::new();
static DATABASE_UP: AtomicBool = AtomicBool::new(false);
static NATS_UP: AtomicBool = AtomicBool::new(false);

/// Whether the bridge's database session is up (/healthz and the gauge).
pub fn set_database_up(up: bool) {
    DATABASE_UP.store(up, Ordering::Relaxed);
    get().database_up.set(f64::from(u8::from(up)));
}

/// Whether NATS is connected (/healthz and the gauge).
pub fn set_nats_up(up: bool) {
    NATS_UP.store(up, Ordering::Relaxed);
    get().nats_up.set(f64::from(u8::from(up)));
}

/// The database's and NATS's state, as the bridge last saw them.
pub fn up() -> (bool, bool) {
    (DATABASE_UP.load(Ordering::Relaxed), NATS_UP.load(Ordering::Relaxed))
}
static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

pub fn install() {
    let handle = PrometheusBuilder::new().install_recorder().expect("one recorder per process");
    let _ = HANDLE.set(handle);
    let _ = METRICS.set(Metrics {
        bridged: counter!("litebase_streams_bridge_events_total"),
        duplicates: counter!("litebase_streams_bridge_duplicates_total"),
        windows: counter!("litebase_streams_bridge_acks_total"),
        truncated: counter!("litebase_streams_bridge_truncated_total"),
        publish_failures: counter!("litebase_streams_bridge_publish_failures_total"),
        nats_reconnects: counter!("litebase_streams_bridge_reconnects_total", "target" => "nats"),
        database_reconnects: counter!("litebase_streams_bridge_reconnects_total", "target" => "database"),
        in_flight_events: gauge!("litebase_streams_bridge_in_flight_events"),
        in_flight_bytes: gauge!("litebase_streams_bridge_in_flight_bytes"),
        lag_events: gauge!("litebase_streams_bridge_lag_events"),
        lag_seconds: gauge!("litebase_streams_bridge_lag_seconds"),
        database_up: gauge!("litebase_streams_bridge_up", "target" => "database"),
        nats_up: gauge!("litebase_streams_bridge_up", "target" => "nats"),
    });
    // Counters appear at 0 from the first scrape on.
    for c in ["litebase_streams_bridge_events_total", "litebase_streams_bridge_duplicates_total"] {
        counter!(c).increment(0);
    }
}

pub fn get() -> &'static Metrics {
    METRICS.get().expect("metrics::install runs first")
}

pub fn render() -> String {
    HANDLE.get().map(PrometheusHandle::render).unwrap_or_default()
}
