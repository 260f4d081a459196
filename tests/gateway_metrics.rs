//! GET /metrics of the gateway: its own metrics (`litebase_streams_gateway_*`),
//! the database's numbers that it reads from `streams.metrics()` once per
//! `--metrics-interval` and caches, and the clients per topic pattern.
//!
//! Every scrape is checked line by line against the text format and parsed
//! with prometheus-parse; the values move when the test publishes, holds a
//! transaction open, stops a consumer, connects clients; a role without
//! EXECUTE gives `litebase_streams_gateway_database_metrics_up 0` (and 1 once
//! granted); a scrape storm costs the database no more than one
//! `streams.metrics()` call per interval, counted with pg_stat_statements on
//! a cluster of its own; and every metric name the Grafana dashboard and the
//! alert rules (docs/grafana/) use is in a real scrape. The gateways here
//! run with `--metrics-token` and scrape with it; without one, /metrics has
//! the gateway's own counters only and the database is never asked.
#![cfg(feature = "integration")]

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::gateway::{token, Gateway, Setup};
use common::{publish, wait_until, ScratchCluster};
use prometheus_parse::{LineInfo, Scrape, Value};

/// The `--metrics-token` of the gateways here.
const METRICS_TOKEN: &str = "the metrics secret of gateway_metrics";

/// The Authorization header value of a scrape with [`METRICS_TOKEN`].
fn bearer() -> String {
    format!("Bearer {METRICS_TOKEN}")
}

/// Long enough for the worker's stats pass (about once a second) and a
/// poll at `--metrics-interval 1`, with room for a loaded machine.
const MOVES: Duration = Duration::from_secs(30);

/// A gateway whose metrics poller reads as pg_monitor (its login role is a
/// member: the recipe of docs/gateway.md), every second.
fn setup() -> Setup {
    let s = Setup::publishing(&[
        "--metrics-interval",
        "1",
        "--metrics-role",
        "pg_monitor",
        "--metrics-token",
        METRICS_TOKEN,
    ]);
    s.db.connect().batch_execute(&format!("GRANT pg_monitor TO {}", s.login.name)).unwrap();
    s
}

/// One scrape with the metrics token, its body.
fn scrape_text(gateway: &Gateway) -> (u16, String) {
    gateway.request("GET", "/metrics", &[("Authorization", &bearer())], "")
}

/// One scrape, every line checked against the text format, then parsed.
fn scrape(gateway: &Gateway) -> Scrape {
    let (status, body) = scrape_text(gateway);
    assert_eq!(status, 200, "{body}");
    check_lines(&body);
    Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).expect("the scrape parses")
}

/// Each line is a HELP or TYPE comment, or a sample whose labels and value
/// are well formed (prometheus-parse skips what it cannot read; this does not).
fn check_lines(body: &str) {
    let mut typed = BTreeSet::new();
    for line in body.lines() {
        let info = LineInfo::parse(line);
        match info {
            LineInfo::Empty => {}
            LineInfo::Doc { .. } => assert!(line.starts_with("# HELP "), "{line:?}"),
            LineInfo::Type { ref metric_name, .. } => {
                let kind = line.rsplit(' ').next().unwrap();
                assert!(["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind), "{line:?}");
                let name = metric_name.trim_end_matches("_bucket");
                assert!(typed.insert(name.to_owned()), "a second TYPE line for {name}: {line:?}");
            }
            LineInfo::Sample { labels, value, timestamp, .. } => {
                assert!(timestamp.is_none(), "no timestamps: {line:?}");
                assert!(
                    value == "NaN" || value == "+Inf" || value == "-Inf" || value.parse::<f64>().is_ok(),
                    "{line:?}"
                );
                if let Some(labels) = labels {
                    assert!(labels_well_formed(labels), "bad labels in {line:?}");
                    // prometheus-parse's regex stops at the first '}': it must be the one before the value.
                    assert!(line.ends_with(&format!("{{{labels}}} {value}")), "{line:?}");
                }
            }
            LineInfo::Ignored => panic!("a line that is not the text format: {line:?}"),
        }
    }
}

/// `name="value",...` with values escaped as the format says.
fn labels_well_formed(labels: &str) -> bool {
    let mut chars = labels.chars().peekable();
    loop {
        let mut name = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' {
                break;
            }
            name.push(c);
            chars.next();
        }
        let first_ok = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        if !first_ok || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return false;
        }
        if chars.next() != Some('=') || chars.next() != Some('"') {
            return false;
        }
        loop {
            match chars.next() {
                None | Some('\n') => return false,
                Some('"') => break,
                Some('\\') => {
                    if !matches!(chars.next(), Some('\\' | '"' | 'n')) {
                        return false;
                    }
                }
                Some(_) => {}
            }
        }
        match chars.next() {
            None => return true,
            Some(',') => {}
            Some(_) => return false,
        }
    }
}

/// The value of the sample of `metric` whose labels include `labels`.
fn value(scrape: &Scrape, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
            _ => panic!("{metric} is not a counter or gauge"),
        })
        .next()
}

/// Wait until `metric` (with `labels`) satisfies `holds`; the last scrape.
fn wait_for(gateway: &Gateway, metric: &str, labels: &[(&str, &str)], holds: impl Fn(f64) -> bool) -> Scrape {
    let mut last = None;
    wait_until(&format!("{metric}{labels:?} moves"), MOVES, || {
        let s = scrape(gateway);
        let ok = value(&s, metric, labels).is_some_and(&holds);
        last = Some(s);
        ok
    });
    last.unwrap()
}

#[test]
fn events_total_counts_what_the_test_publishes() {
    let s = setup();
    let db = s.db.name.as_str();
    let stream = "pay.metrics";
    let mut owner = s.db.connect();
    publish(&mut owner, stream, r#"{"n":1}"#);
    let first =
        wait_for(&s.gateway, "litebase_streams_events_total", &[("database", db), ("stream", stream)], |v| v == 1.0);
    assert_eq!(value(&first, "litebase_streams_gateway_database_metrics_up", &[("database", db)]), Some(1.0));
    let age = value(&first, "litebase_streams_gateway_database_metrics_age_seconds", &[("database", db)]).unwrap();
    assert!((0.0..30.0).contains(&age), "{age}");
    for n in 0..4 {
        publish(&mut owner, stream, &format!(r#"{{"n":{n}}}"#));
    }
    publish(&mut owner, "pay.other", "{}");
    let later =
        wait_for(&s.gateway, "litebase_streams_events_total", &[("database", db), ("stream", stream)], |v| v == 5.0);
    // Counters are typed as such, and the other stream has a series of its own.
    let events = later.samples.iter().find(|x| x.metric == "litebase_streams_events_total").unwrap();
    assert!(matches!(events.value, Value::Counter(_)), "{:?}", events.value);
    wait_for(&s.gateway, "litebase_streams_events_total", &[("stream", "pay.other")], |v| v == 1.0);
    let newest = value(&later, "litebase_streams_newest_position", &[("database", db)]).unwrap();
    assert!(newest >= 5.0, "{newest}");
    assert_eq!(value(&later, "litebase_streams_worker_up", &[("database", db)]), Some(1.0));
}

#[test]
fn an_open_transaction_shows_as_horizon_lag_and_holder_age() {
    let s = setup();
    let db = s.db.name.as_str();
    let mut holder = s.db.connect();
    let mut writer = s.db.connect();
    publish(&mut writer, "pay.before", "{}");
    wait_for(&s.gateway, "litebase_streams_horizon_lag_positions", &[("database", db)], |v| v == 0.0);
    wait_for(&s.gateway, "litebase_streams_horizon_holder_age_seconds", &[("database", db)], |v| v == 0.0);

    holder.batch_execute("BEGIN").unwrap();
    publish(&mut holder, "pay.held", "{}");
    publish(&mut writer, "pay.after", "{}");
    wait_for(&s.gateway, "litebase_streams_horizon_holder_age_seconds", &[("database", db)], |v| v > 0.0);
    let held = wait_for(&s.gateway, "litebase_streams_horizon_lag_positions", &[("database", db)], |v| v > 0.0);
    let horizon = value(&held, "litebase_streams_horizon", &[("database", db)]).unwrap();
    let newest = value(&held, "litebase_streams_newest_position", &[("database", db)]).unwrap();
    assert!(horizon < newest, "horizon {horizon}, newest {newest}");

    holder.batch_execute("COMMIT").unwrap();
    wait_for(&s.gateway, "litebase_streams_horizon_lag_positions", &[("database", db)], |v| v == 0.0);
    wait_for(&s.gateway, "litebase_streams_horizon_holder_age_seconds", &[("database", db)], |v| v == 0.0);
}

#[test]
fn a_stopped_consumer_shows_as_pending_and_lag() {
    let s = setup();
    let db = s.db.name.as_str();
    let mut owner = s.db.connect();
    let owner_name: String = owner.query_one("SELECT current_user::text", &[]).unwrap().get(0);
    owner.batch_execute("SELECT streams.create_subscription('billing', 'pay.*', after => 0)").unwrap();
    publish(&mut owner, "pay.a", "{}");
    let labels = [("database", db), ("subscription", "billing"), ("owner", owner_name.as_str())];
    wait_for(&s.gateway, "litebase_streams_subscription_pending", &labels, |v| v == 1.0);
    // The consumer takes everything: nothing pending.
    common::subscriptions::consume(&mut owner, "billing", 100);
    wait_for(&s.gateway, "litebase_streams_subscription_pending", &labels, |v| v == 0.0);
    wait_for(&s.gateway, "litebase_streams_subscription_lag_seconds", &labels, |v| v == 0.0);
    // It stops; events keep coming.
    for _ in 0..3 {
        publish(&mut owner, "pay.a", "{}");
    }
    wait_for(&s.gateway, "litebase_streams_subscription_pending", &labels, |v| v == 3.0);
    let late = wait_for(&s.gateway, "litebase_streams_subscription_lag_seconds", &labels, |v| v > 0.0);
    assert_eq!(value(&late, "litebase_streams_subscription_claimed", &labels), Some(0.0));
    assert_eq!(value(&late, "litebase_streams_subscription_parked", &labels), Some(0.0));
}

#[test]
fn topic_clients_are_counted_by_pattern_without_role_names() {
    let s = setup();
    let other = s.role("other", "SELECT streams.grant('read', 'pay.*', '{r}');");
    let path = "/v1/streams/pay.*/events";
    let clients = |scrape: &Scrape| value(scrape, "litebase_streams_gateway_topic_clients", &[("pattern", "pay.*")]);
    assert_eq!(clients(&scrape(&s.gateway)), None, "no client yet");
    let mut sse = vec![
        s.gateway.sse(path, Some(&token(&s.reader.name)), None),
        s.gateway.sse(path, Some(&token(&s.reader.name)), None),
        s.gateway.sse(path, Some(&token(&other.name)), None),
        s.gateway.sse("/v1/streams/pay.a/events", Some(&token(&other.name)), None),
    ];
    assert!(sse.iter().all(|c| c.status == 200));
    // Two topics (two roles) of one pattern: summed.
    let seen = wait_for(&s.gateway, "litebase_streams_gateway_topic_clients", &[("pattern", "pay.*")], |v| v == 3.0);
    assert_eq!(value(&seen, "litebase_streams_gateway_topic_clients", &[("pattern", "pay.a")]), Some(1.0));
    for sample in &seen.samples {
        for v in sample.labels.values() {
            assert!(!v.contains(&s.reader.name) && !v.contains(&other.name), "a role name in {sample:?}");
        }
    }
    sse.truncate(1);
    wait_for(&s.gateway, "litebase_streams_gateway_topic_clients", &[("pattern", "pay.*")], |v| v == 1.0);
    sse.clear();
    wait_until("the pattern without clients has no series", MOVES, || clients(&scrape(&s.gateway)).is_none());
}

/// Whether `scrape` has any of the database's own numbers.
fn has_database_numbers(scrape: &Scrape) -> bool {
    scrape
        .samples
        .iter()
        .any(|x| x.metric.starts_with("litebase_streams_") && !x.metric.starts_with("litebase_streams_gateway_"))
}

#[test]
fn a_role_without_execute_gives_up_0_until_granted() {
    let s = Setup::publishing(&["--metrics-token", METRICS_TOKEN]);
    let db = s.db.name.as_str();
    let up = |gateway: &Gateway| {
        value(&scrape(gateway), "litebase_streams_gateway_database_metrics_up", &[("database", db)])
    };
    let refusals = |gateway: &Gateway| gateway.log_text().matches("cannot read streams.metrics()").count();
    // The login role alone (NOINHERIT, no grant) may not execute it.
    wait_until("the login role's refusal is logged", MOVES, || s.gateway.log_text().contains("42501"));
    assert_eq!(up(&s.gateway), Some(0.0));

    let watcher = s.role("watcher", "");
    let gateway = Gateway::start(
        &s.db,
        &s.login.name,
        &["--metrics-interval", "1", "--metrics-role", &watcher.name, "--metrics-token", METRICS_TOKEN],
    );
    wait_until("the refusal is logged", MOVES, || gateway.log_text().contains("42501"));
    let refused = scrape(&gateway);
    assert_eq!(value(&refused, "litebase_streams_gateway_database_metrics_up", &[("database", db)]), Some(0.0));
    assert!(!has_database_numbers(&refused), "no database numbers without EXECUTE");
    assert!(refused.docs.contains_key("litebase_streams_gateway_database_metrics_age_seconds"));
    // Refused at several intervals in a row.
    wait_for(&gateway, "litebase_streams_gateway_database_metrics_age_seconds", &[("database", db)], |v| v > 3.0);

    s.db.connect().batch_execute(&format!("GRANT pg_monitor TO {}", watcher.name)).unwrap();
    let granted = wait_for(&gateway, "litebase_streams_gateway_database_metrics_up", &[("database", db)], |v| v == 1.0);
    assert!(value(&granted, "litebase_streams_horizon", &[("database", db)]).is_some());
    // Logged once per change, not once per interval.
    assert_eq!(refusals(&gateway), 1, "{}", gateway.log_text());

    // Revoked: the numbers read before are dropped, not served stale.
    s.db.connect().batch_execute(&format!("REVOKE pg_monitor FROM {}", watcher.name)).unwrap();
    let revoked = wait_for(&gateway, "litebase_streams_gateway_database_metrics_up", &[("database", db)], |v| v == 0.0);
    assert!(!has_database_numbers(&revoked), "the old numbers are gone");
    wait_until("the new refusal is logged", MOVES, || refusals(&gateway) == 2);
}

#[test]
fn a_scrape_storm_adds_at_most_one_query_per_interval() {
    let cluster = ScratchCluster::start(
        "metrics-storm",
        &[
            "shared_preload_libraries = 'litebase_streams,pg_stat_statements'",
            "track_commit_timestamp = on",
            "fsync = off",
        ],
    );
    let mut admin = cluster.connect("postgres");
    admin.batch_execute("CREATE DATABASE storm").unwrap();
    let mut c = cluster.connect("storm");
    c.batch_execute("CREATE EXTENSION litebase_streams; CREATE EXTENSION pg_stat_statements").unwrap();
    cluster.wait_for_worker("storm");
    publish(&mut c, "pay.storm", "{}");
    let interval = 1.0;
    let url = format!("host=127.0.0.1 port={} user=postgres dbname=storm", cluster.port);
    let gateway = Gateway::start_url(&url, &["--metrics-interval", "1", "--metrics-token", METRICS_TOKEN]);
    wait_for(&gateway, "litebase_streams_gateway_database_metrics_up", &[("database", "storm")], |v| v == 1.0);

    let calls = |c: &mut postgres::Client| metrics_calls(c, "storm");
    let reset = Instant::now();
    c.batch_execute("SELECT pg_stat_statements_reset()").unwrap();
    let start = Instant::now();
    // 100 scrapes a second for 5 seconds: 4 scrapers at 25 a second each,
    // every answer with the cached block in it.
    const SCRAPERS: u64 = 4;
    const EACH: u64 = 125;
    let port = gateway.port;
    let scrapers: Vec<_> = (0..SCRAPERS)
        .map(|i| {
            std::thread::spawn(move || {
                for n in 0..EACH {
                    let due = start + Duration::from_millis(10 * (n * SCRAPERS + i));
                    if let Some(wait) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    let (status, body) =
                        common::gateway::request(port, "GET", "/metrics", &[("Authorization", &bearer())], "");
                    assert_eq!(status, 200);
                    assert!(body.contains("\nlitebase_streams_horizon{"), "the cached block is served: {body}");
                }
            })
        })
        .collect();
    for scraper in scrapers {
        scraper.join().unwrap();
    }
    let scrapes = SCRAPERS * EACH;
    let counted = calls(&mut c);
    let elapsed = start.elapsed().as_secs_f64();
    // From before the reset to after the count, the poller's ticks (one per
    // interval, each up to a scheduling delay late) fit this many reads.
    let window = reset.elapsed().as_secs_f64();
    let most = ((window + 0.5) / interval).floor() as i64 + 1;
    scrape(&gateway);
    println!("{scrapes} scrapes in {elapsed:.2} s: {counted} streams.metrics() calls (at most {most})");
    assert!(counted <= most, "{counted} calls of streams.metrics() in {elapsed:.2} s of scrapes (at most {most})");
    // The count works: the poller goes on reading once per interval.
    wait_until("the poller reads again", MOVES, || calls(&mut c) > counted);
}

/// The calls of `streams.metrics()` in database `db` that pg_stat_statements counted.
fn metrics_calls(c: &mut postgres::Client, db: &str) -> i64 {
    c.query_one(
        "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1) AND query ~ 'streams\\.metrics\\('",
        &[&db],
    )
    .unwrap()
    .get(0)
}

/// Without --metrics-token /metrics needs no token and has the gateway's
/// own counters only: no database numbers, no up or age (there is no
/// poller), no clients per pattern; the database is never asked for
/// `streams.metrics()` (counted with pg_stat_statements while a gateway
/// with a token, started later, reads its own database several times);
/// and the start says so once. A bearer changes nothing there.
#[test]
fn without_a_metrics_token_the_database_is_never_asked() {
    let cluster = ScratchCluster::start(
        "metrics-untokened",
        &[
            "shared_preload_libraries = 'litebase_streams,pg_stat_statements'",
            "track_commit_timestamp = on",
            "fsync = off",
        ],
    );
    let mut admin = cluster.connect("postgres");
    for sql in ["CREATE DATABASE quiet", "CREATE DATABASE watched", "CREATE ROLE quiet_reader NOLOGIN"] {
        admin.batch_execute(sql).unwrap();
    }
    let mut quiet_db = cluster.connect("quiet");
    quiet_db
        .batch_execute("CREATE EXTENSION litebase_streams; SELECT streams.grant('read', 'pay.*', 'quiet_reader')")
        .unwrap();
    let mut c = cluster.connect("watched");
    c.batch_execute("CREATE EXTENSION litebase_streams; CREATE EXTENSION pg_stat_statements").unwrap();
    cluster.wait_for_worker("quiet");
    cluster.wait_for_worker("watched");
    publish(&mut quiet_db, "pay.quiet", "{}");
    let url = |db: &str| format!("host=127.0.0.1 port={} user=postgres dbname={db}", cluster.port);

    let quiet = Gateway::start_url(
        &url("quiet"),
        &["--metrics-interval", "1", "--metrics-role", "pg_monitor", "--anonymous-role", "quiet_reader"],
    );
    // A poller starts before the gateway listens, and reads at once.
    wait_until("the gateway without a metrics token listens", MOVES, || quiet.log_text().contains("listening on"));
    let watched = Gateway::start_url(&url("watched"), &["--metrics-interval", "1", "--metrics-token", METRICS_TOKEN]);
    wait_until("the gateway with a metrics token reads three times", MOVES, || metrics_calls(&mut c, "watched") >= 3);
    assert_eq!(metrics_calls(&mut c, "quiet"), 0, "streams.metrics() read without a metrics token");

    // A client whose pattern would show in topic_clients.
    let client = quiet.sse("/v1/streams/pay.*/events", None, None);
    assert_eq!(client.status, 200);
    wait_until("the open /metrics counts the client", MOVES, || {
        quiet.get("/metrics").1.contains("litebase_streams_gateway_connections{transport=\"sse\"} 1")
    });
    for headers in [&[][..], &[("Authorization", bearer().as_str())][..]] {
        let (status, body) = quiet.request("GET", "/metrics", headers, "");
        assert_eq!(status, 200, "{body}");
        check_lines(&body);
        let open = Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).expect("the scrape parses");
        assert!(open.docs.contains_key("litebase_streams_gateway_connections"), "the gateway's own counters: {body}");
        assert!(!has_database_numbers(&open), "{body}");
        for absent in ["litebase_streams_gateway_database_metrics_", "litebase_streams_gateway_topic_clients", "pay."] {
            assert!(!body.contains(absent), "{absent} without a metrics token: {body}");
        }
    }
    let log = quiet.log_text();
    assert_eq!(log.matches("no --metrics-token").count(), 1, "{log}");
    assert!(log.contains("--metrics-role is unused"), "{log}");
    assert!(!watched.log_text().contains("no --metrics-token"), "{}", watched.log_text());
}

/// `litebase_streams_*` names used in the dashboard and the alert rules.
fn names_in_docs() -> BTreeSet<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/grafana");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    assert!(!files.is_empty(), "no dashboard (*.json) in {}", dir.display());
    files.push(dir.join("alerts.yml"));
    let mut names = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let mut rest = text.as_str();
        while let Some(at) = rest.find("litebase_streams_") {
            let tail = &rest[at..];
            let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')).unwrap_or(tail.len());
            // Prose has "name:" and "litebase_streams_*": neither is a name.
            let name = tail[..end].trim_end_matches(':');
            if !name.ends_with('_') {
                names.insert(name.to_owned());
            }
            rest = &tail[end..];
        }
    }
    names
}

#[test]
fn every_metric_of_the_dashboard_and_the_alerts_is_scraped() {
    let wanted = names_in_docs();
    assert!(!wanted.is_empty(), "docs/grafana names no litebase_streams_* metric");
    let s = setup();
    let mut owner = s.db.connect();
    // Something of each kind: events, a subscription, a webhook, a client, a replay.
    owner
        .batch_execute(
            "SELECT streams.create_subscription('watched', 'pay.*', after => 0);
             SELECT streams.create_webhook('hook', 'pay.*', 'http://webhook-metrics.invalid/', after => 0);",
        )
        .unwrap();
    publish(&mut owner, "pay.a", "{}");
    let _client = s.gateway.sse("/v1/streams/pay.*/events", Some(&token(&s.reader.name)), None);
    // Once the webhook, the subscription, the stream and the client show, everything is there to show.
    wait_for(&s.gateway, "litebase_streams_webhook_pending", &[("webhook", "hook")], |_| true);
    wait_for(&s.gateway, "litebase_streams_subscription_pending", &[("subscription", "watched")], |v| v == 1.0);
    wait_for(&s.gateway, "litebase_streams_events_total", &[("stream", "pay.a")], |v| v == 1.0);
    wait_for(&s.gateway, "litebase_streams_gateway_topic_clients", &[("pattern", "pay.*")], |v| v == 1.0);
    let (_, body) = scrape_text(&s.gateway);
    check_lines(&body);
    // Sample names as written, and family names (a histogram's has no sample of its own).
    let present: BTreeSet<String> = body
        .lines()
        .filter_map(|l| match l.strip_prefix("# TYPE ") {
            Some(typed) => typed.split(' ').next(),
            None if l.starts_with('#') => None,
            None => l.split(['{', ' ']).next(),
        })
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect();
    let missing: Vec<&String> = wanted.difference(&present).collect();
    println!("{} metric names of docs/grafana checked: {wanted:?}", wanted.len());
    assert!(missing.is_empty(), "used in docs/grafana but not in a scrape: {missing:?}\n{body}");
}
