//! Prometheus metrics (the `metrics` facade, rendered by
//! metrics-exporter-prometheus at GET /metrics). Handles of the hot counters
//! are registered once: a delivery costs one atomic add.

use std::sync::OnceLock;
use std::time::Instant;

use metrics::{counter, gauge, histogram, Counter, Gauge};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

pub struct Metrics {
    pub sent_catchup: Counter,
    pub sent_live: Counter,
    pub slow_client_drops: Counter,
    pub listen_reconnects: Counter,
    pub unverified_notifications: Counter,
    pub notifications: Counter,
    pub replays: Counter,
    pub sse_connections: Gauge,
    pub ws_connections: Gauge,
    pub topics: Gauge,
    pub listen_channels: Gauge,
    pub forced_replays: Counter,
    pub privilege_checks: Counter,
    pub topic_limit_refusals: Counter,
    pub db_connections: Gauge,
}

static METRICS: OnceLock<Metrics> = OnceLock::new();
static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Install the recorder (once per process: later calls, as from tests, do nothing).
pub fn install() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(install_recorder);
}

fn install_recorder() {
    let handle = PrometheusBuilder::new()
        .set_buckets(&[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0])
        .expect("static buckets")
        .install_recorder()
        .expect("one recorder per process");
    let _ = HANDLE.set(handle);
    let _ = METRICS.set(Metrics {
        sent_catchup: counter!("gateway_events_sent_total", "source" => "catchup"),
        sent_live: counter!("gateway_events_sent_total", "source" => "live"),
        slow_client_drops: counter!("gateway_slow_client_drops_total"),
        listen_reconnects: counter!("gateway_listen_reconnects_total"),
        unverified_notifications: counter!("gateway_unverified_notifications_total"),
        notifications: counter!("gateway_notifications_total"),
        replays: counter!("gateway_topic_replays_total"),
        sse_connections: gauge!("gateway_connections", "transport" => "sse"),
        ws_connections: gauge!("gateway_connections", "transport" => "websocket"),
        topics: gauge!("gateway_topics"),
        listen_channels: gauge!("gateway_listen_channels"),
        forced_replays: counter!("gateway_forced_replays_total"),
        privilege_checks: counter!("gateway_privilege_checks_total"),
        topic_limit_refusals: counter!("gateway_topic_limit_refusals_total"),
        db_connections: gauge!("gateway_database_connections"),
    });
}

pub fn get() -> &'static Metrics {
    METRICS.get().expect("metrics::install ran at start")
}

pub fn render() -> String {
    HANDLE.get().map(|h| h.render()).unwrap_or_default()
}

pub fn query_seconds(query: &'static str, since: Instant) {
    histogram!("gateway_query_duration_seconds", "query" => query).record(since.elapsed().as_secs_f64());
}
