//! Prometheus metrics at GET /metrics: the gateway's own (the `metrics`
//! facade, rendered by metrics-exporter-prometheus), then the sections
//! registered with [`add_section`], which write families whose label sets
//! are only known at run time (text.rs): the database's numbers that
//! db_metrics.rs caches and the clients per topic pattern
//! (topic_clients.rs). Those labels name things (streams, subscriptions,
//! roles, patterns), so the sections are written only for a scrape that
//! sent the metrics token (access.rs); the gateway's own metrics name
//! nothing and are always written. Handles of the hot counters are
//! registered once: a delivery costs one atomic add. Every name starts with
//! `litebase_streams_gateway_`.

pub mod access;
pub mod text;
pub mod topic_clients;

use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Counter, Gauge};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

pub use access::Scope;

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
        sent_catchup: counter!("litebase_streams_gateway_events_sent_total", "source" => "catchup"),
        sent_live: counter!("litebase_streams_gateway_events_sent_total", "source" => "live"),
        slow_client_drops: counter!("litebase_streams_gateway_slow_client_drops_total"),
        listen_reconnects: counter!("litebase_streams_gateway_listen_reconnects_total"),
        unverified_notifications: counter!("litebase_streams_gateway_unverified_notifications_total"),
        notifications: counter!("litebase_streams_gateway_notifications_total"),
        replays: counter!("litebase_streams_gateway_topic_replays_total"),
        sse_connections: gauge!("litebase_streams_gateway_connections", "transport" => "sse"),
        ws_connections: gauge!("litebase_streams_gateway_connections", "transport" => "websocket"),
        topics: gauge!("litebase_streams_gateway_topics"),
        listen_channels: gauge!("litebase_streams_gateway_listen_channels"),
        forced_replays: counter!("litebase_streams_gateway_forced_replays_total"),
        privilege_checks: counter!("litebase_streams_gateway_privilege_checks_total"),
        topic_limit_refusals: counter!("litebase_streams_gateway_topic_limit_refusals_total"),
        db_connections: gauge!("litebase_streams_gateway_database_connections"),
    });
    describe();
}

/// The `# HELP` lines of the gateway's own metrics.
fn describe() {
    let p = "litebase_streams_gateway_";
    let counters = [
        ("events_sent_total", "Events sent to clients, by source: catchup (a replay) or live (a notification)."),
        ("slow_client_drops_total", "Clients disconnected because they fell behind their buffer."),
        ("listen_reconnects_total", "Times the LISTEN connection was opened again after it was lost."),
        ("unverified_notifications_total", "Notifications not sent by the worker (forged, or the worker restarted)."),
        ("notifications_total", "Notifications received on the LISTEN connection."),
        ("topic_replays_total", "Replays the topics ran (catch-up queries for all of a topic's clients)."),
        ("forced_replays_total", "Replays forced by unverified notifications."),
        ("privilege_checks_total", "Checks that a topic's role may still read its pattern."),
        ("topic_limit_refusals_total", "Subscriptions refused by --max-topics or --max-topics-per-role."),
    ];
    for (name, help) in counters {
        describe_counter!(format!("{p}{name}"), help);
    }
    let gauges = [
        ("connections", "Open SSE connections and WebSocket connections, by transport."),
        ("topics", "Open topics (role and pattern pairs clients subscribe to)."),
        ("listen_channels", "Channels the LISTEN connection listens on."),
        ("database_connections", "Database connections of the pools and the LISTEN connection."),
    ];
    for (name, help) in gauges {
        describe_gauge!(format!("{p}{name}"), help);
    }
    describe_histogram!(format!("{p}query_duration_seconds"), "Time of the gateway's database queries, by query.");
}

pub fn get() -> &'static Metrics {
    METRICS.get().expect("metrics::install ran at start")
}

/// What a section writes into the body of GET /metrics (text.rs families).
type Section = Box<dyn Fn(&mut String) + Send + Sync>;

static SECTIONS: Mutex<Vec<Section>> = Mutex::new(Vec::new());

/// Have every scrape of [`Scope::Everything`] append what `section` writes
/// (at start: the gateway registers each section once). A section is for
/// families whose labels name things: a scrape without the metrics token
/// never gets it. A section reads memory only: a scrape never queries the
/// database.
pub fn add_section(section: impl Fn(&mut String) + Send + Sync + 'static) {
    SECTIONS.lock().unwrap().push(Box::new(section));
}

/// The body of a scrape: the gateway's own metrics, and with
/// [`Scope::Everything`] the sections too.
pub fn render(scope: Scope) -> String {
    let mut out = HANDLE.get().map(|h| h.render()).unwrap_or_default();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    if scope == Scope::Everything {
        for section in SECTIONS.lock().unwrap().iter() {
            section(&mut out);
        }
    }
    out
}

pub fn query_seconds(query: &'static str, since: Instant) {
    histogram!("litebase_streams_gateway_query_duration_seconds", "query" => query)
        .record(since.elapsed().as_secs_f64());
}
