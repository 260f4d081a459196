//! The database's numbers in GET /metrics: a poller reads
//! `streams.metrics()` once per `--metrics-interval` on a connection of its
//! own (as `--metrics-role` when given, else as the login role), encodes the
//! rows to the text format once, and keeps the result; a scrape appends the
//! kept text and reads nothing else, so however often /metrics is scraped,
//! the database sees one query per interval. It runs only when the gateway
//! has a `--metrics-token` (main.rs): the rows name streams, subscriptions,
//! webhooks and their owners, and only a scrape with that token gets them
//! (metrics/access.rs).
//!
//! Always there, also when the read fails:
//! `litebase_streams_gateway_database_metrics_up{database}` (1 when the last
//! read succeeded; 0 and the old numbers dropped when it failed, for
//! instance 42501 when the role may not execute `streams.metrics()`) and
//! `litebase_streams_gateway_database_metrics_age_seconds{database}` (since
//! the last successful read, or since the poller started before the first).
//! A failure is logged when it differs from the previous one, not at every
//! interval.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::time::MissedTickBehavior;
use tokio_postgres::{NoTls, Statement};
use tracing::{info, warn};

use crate::config::Config;
use crate::metrics;
use crate::metrics::text::{self, Family, Sample};

/// The one query of an interval. The labels come as text: the gateway
/// decodes them with serde_json, not through a driver feature.
const QUERY: &str = "SELECT metric, type, help, labels::text, value FROM streams.metrics()";

const UP: &str = "litebase_streams_gateway_database_metrics_up";
const AGE: &str = "litebase_streams_gateway_database_metrics_age_seconds";

/// The SQLSTATE after which the poller keeps its connection (the next
/// interval asks again on it: a GRANT may come meanwhile); after any other
/// failure it connects anew, which also takes a `streams.metrics()` that an
/// extension update replaced.
const INSUFFICIENT_PRIVILEGE: &str = "42501";

/// Start the poller on `connect` (the gateway's primary, as configured) and
/// add its block to /metrics.
pub fn start(cfg: &Config, connect: tokio_postgres::Config) {
    // The connection keeps the gateway's application_name: counted with its others in pg_stat_activity.
    // Until a connection says otherwise: what libpq would connect to.
    let database = connect.get_dbname().or(connect.get_user()).unwrap_or("postgres").to_owned();
    let cache = Arc::new(Mutex::new(Cache { block: String::new(), up: false, read_at: Instant::now(), database }));
    let scraped = cache.clone();
    metrics::add_section(move |out| scraped.lock().unwrap().write(out));
    tokio::spawn(run(connect, cfg.metrics_role.clone(), cfg.metrics_interval(), cache));
}

/// What a scrape writes.
struct Cache {
    /// The families of the last successful read, encoded; empty after a failure.
    block: String,
    up: bool,
    /// When the block was read (or the poller started, before the first read).
    read_at: Instant,
    /// The database's name (the `database` label).
    database: String,
}

impl Cache {
    fn write(&self, out: &mut String) {
        out.push_str(&self.block);
        let labels = vec![("database".to_owned(), self.database.clone())];
        let up = Family {
            name: UP.into(),
            kind: "gauge".into(),
            help: "1 when the gateway's last read of streams.metrics() succeeded, else 0 (and no litebase_streams_* \
                   numbers of the database are shown)."
                .into(),
            samples: vec![Sample { labels: labels.clone(), value: if self.up { 1.0 } else { 0.0 } }],
        };
        let age = Family {
            name: AGE.into(),
            kind: "gauge".into(),
            help: "Seconds since the gateway last read streams.metrics() successfully (since it started, before the \
                   first read)."
                .into(),
            samples: vec![Sample { labels, value: self.read_at.elapsed().as_secs_f64() }],
        };
        text::write_family(out, &up);
        text::write_family(out, &age);
    }
}

/// The poller's connection and its prepared query.
struct Session {
    client: tokio_postgres::Client,
    query: Statement,
}

/// Why a read failed: the SQLSTATE, if the database gave one, and the text to log.
#[derive(Debug, PartialEq)]
struct Failure {
    sqlstate: Option<String>,
    message: String,
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Failure {
        match e.as_db_error() {
            Some(db) => Failure { sqlstate: Some(db.code().code().to_owned()), message: db.message().to_owned() },
            None => Failure { sqlstate: None, message: e.to_string() },
        }
    }
}

async fn run(connect: tokio_postgres::Config, role: Option<String>, interval: Duration, cache: Arc<Mutex<Cache>>) {
    let mut session: Option<Session> = None;
    let mut last_failure: Option<Failure> = None;
    let mut ticks = tokio::time::interval(interval);
    // A slow read delays the next one instead of bunching them up.
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match read(&mut session, &connect, role.as_deref(), &cache).await {
            Ok(block) => {
                let mut c = cache.lock().unwrap();
                (c.block, c.up, c.read_at) = (block, true, Instant::now());
                drop(c);
                if last_failure.take().is_some() {
                    info!("streams.metrics() read again: the database's metrics are back in /metrics");
                }
            }
            Err(failure) => {
                let mut c = cache.lock().unwrap();
                c.block.clear();
                c.up = false;
                drop(c);
                if failure.sqlstate.as_deref() != Some(INSUFFICIENT_PRIVILEGE) {
                    session = None;
                }
                if last_failure.as_ref() != Some(&failure) {
                    let hint = match failure.sqlstate.as_deref() {
                        Some(INSUFFICIENT_PRIVILEGE) => {
                            "; the role needs EXECUTE on it, which pg_monitor has (a NOINHERIT login role: GRANT \
                             pg_monitor TO it and start with --metrics-role pg_monitor)"
                        }
                        _ => "",
                    };
                    warn!(
                        sqlstate = failure.sqlstate.as_deref().unwrap_or(""),
                        "cannot read streams.metrics(): {}{hint}; /metrics shows \
                         litebase_streams_gateway_database_metrics_up 0 until it can",
                        failure.message
                    );
                    last_failure = Some(failure);
                }
            }
        }
    }
}

/// One read: connect if needed, run [`QUERY`], encode the rows.
async fn read(
    session: &mut Option<Session>,
    connect: &tokio_postgres::Config,
    role: Option<&str>,
    cache: &Mutex<Cache>,
) -> Result<String, Failure> {
    if session.as_ref().is_none_or(|s| s.client.is_closed()) {
        *session = None;
        let (client, connection) = connect.connect(NoTls).await?;
        // It ends when the client is dropped.
        tokio::spawn(async move {
            let _ = connection.await;
        });
        if let Some(role) = role {
            // Bound as a parameter: no quoting of the name. A failure drops the
            // connection before anything runs on it as the login role.
            client.execute("SELECT pg_catalog.set_config('role', $1, false)", &[&role]).await?;
        }
        let database: String = client.query_one("SELECT pg_catalog.current_database()::text", &[]).await?.get(0);
        cache.lock().unwrap().database = database;
        let query = client.prepare(QUERY).await?;
        *session = Some(Session { client, query });
    }
    let s = session.as_ref().expect("connected above");
    let rows = s.client.query(&s.query, &[]).await?;
    Ok(encode(rows.iter().map(|r| Row {
        metric: r.get(0),
        kind: r.get(1),
        help: r.get(2),
        labels: r.get(3),
        value: r.get(4),
    })))
}

/// A row of `streams.metrics()`, as read.
#[derive(Debug, Clone, Default)]
struct Row {
    metric: Option<String>,
    kind: Option<String>,
    help: Option<String>,
    /// The `labels` jsonb as text.
    labels: Option<String>,
    value: Option<f64>,
}

/// The rows as text-format families. A row without a name, or whose labels
/// are not a JSON object, is left out; a label that is not a string is
/// written as its JSON text; a null value is NaN.
fn encode(rows: impl Iterator<Item = Row>) -> String {
    let samples = rows.filter_map(|row| {
        let labels = match row.labels.as_deref() {
            None => Vec::new(),
            Some(text) => match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(text) {
                Ok(map) => map
                    .into_iter()
                    .map(|(name, value)| match value {
                        serde_json::Value::String(s) => (name, s),
                        other => (name, other.to_string()),
                    })
                    .collect(),
                Err(_) => return None,
            },
        };
        let sample = Sample { labels, value: row.value.unwrap_or(f64::NAN) };
        Some((row.metric?, row.kind.unwrap_or_default(), row.help.unwrap_or_default(), sample))
    });
    let mut out = String::new();
    for family in text::group(samples) {
        text::write_family(&mut out, &family);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(metric: &str, kind: &str, labels: Option<&str>, value: Option<f64>) -> Row {
        Row {
            metric: Some(metric.into()),
            kind: Some(kind.into()),
            help: Some(format!("{metric} help")),
            labels: labels.map(str::to_owned),
            value,
        }
    }

    #[test]
    fn rows_become_families_with_escaped_labels() {
        let text = encode(
            [
                row(
                    "litebase_streams_events_total",
                    "counter",
                    Some(r#"{"database": "app", "stream": "say \"hi\" \\ to\nme"}"#),
                    Some(7.0),
                ),
                row("litebase_streams_horizon", "gauge", Some(r#"{"database": "app"}"#), Some(41.0)),
                row(
                    "litebase_streams_events_total",
                    "counter",
                    Some(r#"{"database": "app", "stream": "(other)"}"#),
                    Some(2.0),
                ),
            ]
            .into_iter(),
        );
        assert_eq!(
            text,
            "# HELP litebase_streams_events_total litebase_streams_events_total help\n\
             # TYPE litebase_streams_events_total counter\n\
             litebase_streams_events_total{database=\"app\",stream=\"say \\\"hi\\\" \\\\ to\\nme\"} 7\n\
             litebase_streams_events_total{database=\"app\",stream=\"(other)\"} 2\n\
             # HELP litebase_streams_horizon litebase_streams_horizon help\n\
             # TYPE litebase_streams_horizon gauge\n\
             litebase_streams_horizon{database=\"app\"} 41\n"
        );
    }

    #[test]
    fn nan_null_unknown_types_and_odd_labels() {
        let text = encode(
            [
                row("a", "gauge", None, Some(f64::NAN)),
                row("b", "gauge", Some("{}"), None),
                row("c", "histogram", Some(r#"{"n": 1, "t": true, "z": null}"#), Some(1.0)),
                // Not an object, not JSON: left out.
                row("d", "gauge", Some("[1]"), Some(1.0)),
                row("d", "gauge", Some("{"), Some(1.0)),
                Row { metric: None, value: Some(1.0), ..Row::default() },
            ]
            .into_iter(),
        );
        assert!(text.contains("\na NaN\n"), "{text}");
        assert!(text.contains("\nb NaN\n"), "{text}");
        assert!(text.contains("# TYPE c untyped\nc{n=\"1\",t=\"true\",z=\"null\"} 1\n"), "{text}");
        assert!(!text.contains("\nd"), "{text}");
    }

    #[test]
    fn a_scrape_writes_up_and_age_and_drops_nothing_else() {
        let mut cache = Cache {
            block: "# HELP x h\n# TYPE x gauge\nx 1\n".into(),
            up: true,
            read_at: Instant::now(),
            database: "a\"b".into(),
        };
        let mut out = String::new();
        cache.write(&mut out);
        assert!(out.starts_with("# HELP x h\n"), "{out}");
        assert!(out.contains("\nlitebase_streams_gateway_database_metrics_up{database=\"a\\\"b\"} 1\n"), "{out}");
        assert!(out.contains("\nlitebase_streams_gateway_database_metrics_age_seconds{database=\"a\\\"b\"} "), "{out}");
        (cache.block, cache.up) = (String::new(), false);
        let mut out = String::new();
        cache.write(&mut out);
        assert!(out.starts_with("# HELP litebase_streams_gateway_database_metrics_up "), "{out}");
        assert!(out.contains("_up{database=\"a\\\"b\"} 0\n"), "{out}");
    }
}
