//! litebase-streams-bridge-bench: the other side of the bridge's benchmark
//! (`make bench`, bench/phases/bridge.py). Three subcommands, each printing
//! JSON on stdout:
//!
//! - `direct`: the bridge's own JetStream publisher (jetstream.rs, compiled
//!   into this binary as it is) publishing N messages with the headers and
//!   message ids source.rs gives an event, in windows of `--window`, each
//!   window's PubAcks awaited before the next as the bridge does, with no
//!   database in the loop: the ceiling the bridge is compared with.
//! - `latency`: an ordered push consumer of a JetStream stream from its new
//!   messages; records each message's arrival (CLOCK_MONOTONIC, the clock the
//!   Python publishers read, so times of both processes compare) and its
//!   `Litebase-Position`, as JSON lines.
//! - `check`: reads every message of a stream: its count, the positions
//!   (`Litebase-Position`) and the storage times of the first and the last
//!   message; optionally deletes the stream.
//! - `null`: the bridge's own loop (bridge.rs and source.rs, as they are)
//!   with a sink that stores at once: the database's share of a window.

// The bridge's modules, as they are (the crate is a binary): the same client,
// connection options, stream creation and publishing as the bridge, and the
// same database session and loop.
#[allow(dead_code)]
#[path = "../bridge.rs"]
mod bridge;
#[allow(dead_code)]
#[path = "../config.rs"]
mod config;
#[allow(dead_code)]
#[path = "../headers.rs"]
mod headers;
#[allow(dead_code)]
#[path = "../jetstream.rs"]
mod jetstream;
#[allow(dead_code)]
#[path = "../metrics.rs"]
mod metrics;
#[allow(dead_code)]
#[path = "../sink.rs"]
mod sink;
#[allow(dead_code)]
#[path = "../source.rs"]
mod source;
#[allow(dead_code)]
#[path = "../subjects.rs"]
mod subjects;

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{push, DeliverPolicy};
use bytes::Bytes;
use clap::{Parser, Subcommand};
use futures_util::StreamExt;
use serde_json::json;

use crate::sink::{Message, Sink, Stored};

#[derive(Parser, Debug)]
#[command(name = "litebase-streams-bridge-bench", about = "The bridge's benchmark helpers (bench/phases/bridge.py)")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Publish --count messages as the bridge would, without the database.
    Direct(Direct),
    /// Record the arrival of each new message of a stream (JSON lines).
    Latency(Latency),
    /// Read a whole stream: message count, positions, storage times.
    Check(Check),
    /// The bridge's loop and database session with a sink that stores at once.
    Null(Null),
}

#[derive(clap::Args, Debug)]
struct Direct {
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    /// The JetStream stream, created as the bridge creates one (file storage, its duplicate window).
    #[arg(long)]
    stream: String,
    /// As the bridge's --subject-prefix.
    #[arg(long)]
    subject_prefix: Option<String>,
    /// The litebase stream the events are of (their subject, Litebase-Stream).
    #[arg(long, default_value = "bench.bridge")]
    stream_name: String,
    #[arg(long)]
    count: usize,
    /// Messages per window; a window's PubAcks are awaited before the next.
    #[arg(long, default_value_t = 100)]
    window: usize,
    /// Payloads, one per line, used in turn (the events' data as the database returns it).
    #[arg(long)]
    payload_file: PathBuf,
    /// Litebase-Log-Id and the first part of Nats-Msg-Id (streams.log_id()).
    #[arg(long, default_value = "00000000-0000-0000-0000-000000000000")]
    log_id: String,
    /// The position of the first message; the next ones follow.
    #[arg(long, default_value_t = 1)]
    first_position: i64,
    /// Litebase-Tx.
    #[arg(long, default_value = "1000")]
    tx: String,
    /// Litebase-Time.
    #[arg(long, default_value = "2026-01-01T00:00:00.000000Z")]
    time: String,
}

#[derive(clap::Args, Debug)]
struct Latency {
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    /// The JetStream stream (it must exist).
    #[arg(long)]
    stream: String,
    /// Only the messages of this subject (default: all).
    #[arg(long)]
    subject: Option<String>,
    /// Stop after this many messages.
    #[arg(long)]
    count: Option<usize>,
    /// Stop after this many seconds.
    #[arg(long)]
    seconds: Option<f64>,
    /// Once stdin is closed: stop after this many milliseconds without a message.
    #[arg(long, default_value_t = 500)]
    idle_ms: u64,
    /// Where the records go (default: stdout, after the ready line).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct Check {
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    #[arg(long)]
    stream: String,
    /// Delete the stream afterwards.
    #[arg(long)]
    delete: bool,
    /// Seconds to read it in.
    #[arg(long, default_value_t = 120.0)]
    timeout: f64,
}

#[derive(clap::Args, Debug)]
struct Null {
    /// As the bridge's --database-url.
    #[arg(long, default_value = config::DEV_CLUSTER)]
    database_url: String,
    /// As the bridge's --subscription (created from --start if absent).
    #[arg(long)]
    subscription: String,
    /// As the bridge's --pattern.
    #[arg(long)]
    pattern: String,
    /// As the bridge's --start.
    #[arg(long, default_value = "beginning")]
    start: String,
    #[arg(long, default_value_t = 100)]
    window: i32,
    /// Stop once this many events went through (the window in hand is acked).
    #[arg(long)]
    count: usize,
}

fn main() {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new("warn").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a tokio runtime");
    let result = runtime.block_on(async {
        match args.command {
            Command::Direct(a) => direct(a).await,
            Command::Latency(a) => latency(a).await,
            Command::Check(a) => check(a).await,
            Command::Null(a) => null(a).await,
        }
    });
    match result {
        Ok(out) => println!("{out}"),
        Err(e) => {
            eprintln!("litebase-streams-bridge-bench: {e}");
            std::process::exit(1);
        }
    }
}

/// CLOCK_MONOTONIC in nanoseconds (Python's time.monotonic_ns on Linux).
fn monotonic_ns() -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec, which `ts` is.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

async fn direct(a: Direct) -> Result<serde_json::Value, String> {
    let payloads: Vec<Bytes> = std::fs::read_to_string(&a.payload_file)
        .map_err(|e| format!("--payload-file {}: {e}", a.payload_file.display()))?
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| Bytes::copy_from_slice(l.as_bytes()))
        .collect();
    if payloads.is_empty() {
        return Err("--payload-file has no payload".into());
    }
    if a.window == 0 {
        return Err("--window must be at least 1".into());
    }
    // The bridge's configuration with the bridge's defaults, but for these.
    let mut argv = vec![
        "litebase-streams-bridge".to_owned(),
        "--nats-url".into(),
        a.nats_url.clone(),
        "--jetstream-stream".into(),
        a.stream.clone(),
        "--pattern".into(),
        a.stream_name.clone(),
        "--window".into(),
        a.window.to_string(),
    ];
    if let Some(prefix) = &a.subject_prefix {
        argv.extend(["--subject-prefix".into(), prefix.clone()]);
    }
    let cfg = config::Config::try_parse_from(argv).map_err(|e| e.to_string())?;
    cfg.validate()?;
    metrics::install(); // jetstream.rs counts reconnects
    let mut sink = jetstream::JetStream::connect(&cfg).await?;
    let subject = subjects::subject(a.subject_prefix.as_deref(), &a.stream_name);
    let subscription = headers::defused(&cfg.subscription);
    // What source.rs makes of an event without type, key or headers (the bench's events).
    let message = |i: usize| {
        let position = a.first_position + i as i64;
        Message {
            position,
            subject: subject.clone(),
            id: format!("{}:{position}", a.log_id),
            headers: vec![
                ("Litebase-Log-Id", a.log_id.clone()),
                ("Litebase-Position", position.to_string()),
                ("Litebase-Subscription", subscription.clone()),
                ("Litebase-Stream", a.stream_name.clone()),
                ("Litebase-Time", a.time.clone()),
                ("Litebase-Tx", a.tx.clone()),
            ],
            event_headers: Vec::new(),
            payload: payloads[i % payloads.len()].clone(),
        }
    };
    let (mut stored, mut duplicates, mut windows) = (0usize, 0usize, 0usize);
    let started = Instant::now();
    let mut from = 0;
    while from < a.count {
        let to = (from + a.window).min(a.count);
        let batch: Vec<Message> = (from..to).map(message).collect();
        let outcome = sink.store(&batch).await;
        stored += outcome.stored;
        duplicates += outcome.duplicates;
        windows += 1;
        if let Some(e) = outcome.error {
            return Err(format!("window {windows} (from message {from}): {e}"));
        }
        from = to;
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(json!({
        "events": a.count, "stored": stored, "duplicates": duplicates, "windows": windows,
        "seconds": seconds, "events_per_s": a.count as f64 / seconds,
    }))
}

async fn connect(url: &str) -> Result<async_nats::Client, String> {
    async_nats::ConnectOptions::new()
        .name("litebase-streams-bridge-bench")
        .connection_timeout(Duration::from_secs(5))
        .connect(url)
        .await
        .map_err(|e| format!("NATS {url}: {e}"))
}

fn position_of(message: &async_nats::jetstream::Message) -> Option<i64> {
    message.headers.as_ref()?.get("Litebase-Position")?.as_str().parse().ok()
}

async fn latency(a: Latency) -> Result<serde_json::Value, String> {
    let client = connect(&a.nats_url).await?;
    let js = async_nats::jetstream::new(client.clone());
    let stream = js.get_stream(&a.stream).await.map_err(|e| format!("stream {}: {e}", a.stream))?;
    let consumer = stream
        .create_consumer(push::OrderedConfig {
            deliver_subject: client.new_inbox(),
            filter_subject: a.subject.clone().unwrap_or_default(),
            deliver_policy: DeliverPolicy::New,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("consumer on {}: {e}", a.stream))?;
    let mut messages = consumer.messages().await.map_err(|e| format!("consumer on {}: {e}", a.stream))?;
    // stdin closed: the publishing is over; drain and stop.
    let (closed_tx, mut closed) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let mut stdin = tokio::io::stdin();
        let mut buf = [0u8; 256];
        while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {}
        let _ = closed_tx.send(true);
    });
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", json!({"ready": true}));
        let _ = out.flush();
    }
    let deadline = a.seconds.map(|s| tokio::time::Instant::now() + Duration::from_secs_f64(s));
    let idle = Duration::from_millis(a.idle_ms);
    let mut records: Vec<(i64, i64, u64)> = Vec::new();
    let mut unpositioned = 0usize;
    loop {
        if a.count.is_some_and(|n| records.len() + unpositioned >= n) {
            break;
        }
        let wait = if *closed.borrow() { idle } else { Duration::from_secs(3600) };
        let wait = match deadline {
            Some(d) => wait.min(d.saturating_duration_since(tokio::time::Instant::now())),
            None => wait,
        };
        tokio::select! {
            next = tokio::time::timeout(wait, messages.next()) => match next {
                Ok(Some(Ok(message))) => {
                    let t = monotonic_ns();
                    let seq = message.info().map(|i| i.stream_sequence).unwrap_or(0);
                    match position_of(&message) {
                        Some(p) => records.push((p, t, seq)),
                        None => unpositioned += 1,
                    }
                }
                Ok(Some(Err(e))) => return Err(format!("consumer: {e}")),
                Ok(None) => break,
                Err(_) => {
                    if *closed.borrow() || deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                        break;
                    }
                }
            },
            _ = closed.changed(), if !*closed.borrow() => {}
        }
    }
    let lines: String =
        records.iter().map(|(p, t, s)| format!("{}\n", json!({"position": p, "mono_ns": t, "seq": s}))).collect();
    match &a.out {
        Some(path) => std::fs::write(path, lines).map_err(|e| format!("--out {}: {e}", path.display()))?,
        None => print!("{lines}"),
    }
    Ok(json!({"messages": records.len() + unpositioned, "without_position": unpositioned}))
}

async fn check(a: Check) -> Result<serde_json::Value, String> {
    let client = connect(&a.nats_url).await?;
    let js = async_nats::jetstream::new(client.clone());
    let mut stream = js.get_stream(&a.stream).await.map_err(|e| format!("stream {}: {e}", a.stream))?;
    let state = stream.info().await.map_err(|e| format!("stream {}: {e}", a.stream))?.state.clone();
    let mut positions = Vec::with_capacity(state.messages as usize);
    let mut unpositioned = 0usize;
    if state.messages > 0 {
        let consumer = stream
            .create_consumer(push::OrderedConfig {
                deliver_subject: client.new_inbox(),
                deliver_policy: DeliverPolicy::All,
                ..Default::default()
            })
            .await
            .map_err(|e| format!("consumer on {}: {e}", a.stream))?;
        let mut messages = consumer.messages().await.map_err(|e| format!("consumer on {}: {e}", a.stream))?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(a.timeout);
        loop {
            let message = match tokio::time::timeout_at(deadline, messages.next()).await {
                Ok(Some(Ok(m))) => m,
                Ok(Some(Err(e))) => return Err(format!("consumer: {e}")),
                Ok(None) => break,
                Err(_) => return Err(format!("stream {}: not read in {} s", a.stream, a.timeout)),
            };
            match position_of(&message) {
                Some(p) => positions.push(p),
                None => unpositioned += 1,
            }
            if message.info().is_ok_and(|i| i.stream_sequence >= state.last_sequence) {
                break;
            }
        }
    }
    if a.delete {
        js.delete_stream(&a.stream).await.map_err(|e| format!("delete stream {}: {e}", a.stream))?;
    }
    let out_of_order = positions.windows(2).filter(|w| w[1] <= w[0]).count();
    let mut distinct = positions.clone();
    distinct.sort_unstable();
    distinct.dedup();
    Ok(json!({
        "messages": state.messages,
        "read": positions.len() + unpositioned,
        "without_position": unpositioned,
        "distinct_positions": distinct.len(),
        "duplicates": positions.len() - distinct.len(),
        "out_of_order": out_of_order,
        "first_ts_ns": state.first_timestamp.unix_timestamp_nanos() as i64,
        "last_ts_ns": state.last_timestamp.unix_timestamp_nanos() as i64,
        "bytes": state.bytes,
        "positions": positions,
    }))
}

/// Set by [`NullSink`] once it saw --count events: bridge::run then acks the
/// window in hand and returns.
static STOP: AtomicBool = AtomicBool::new(false);

/// Stores every batch at once, noting when.
struct NullSink {
    count: usize,
    seen: usize,
    calls: usize,
    first: Option<(Instant, usize)>,
    last: Option<Instant>,
}

impl Sink for NullSink {
    async fn store(&mut self, messages: &[Message]) -> Stored {
        let now = Instant::now();
        self.first.get_or_insert((now, messages.len()));
        self.last = Some(now);
        self.seen += messages.len();
        self.calls += 1;
        if self.seen >= self.count {
            STOP.store(true, Ordering::Relaxed);
        }
        Stored { stored: messages.len(), duplicates: 0, error: None }
    }

    async fn last_stored(&mut self, _log_id: &str) -> Option<i64> {
        None
    }

    fn connected(&self) -> bool {
        true
    }
}

async fn null(a: Null) -> Result<serde_json::Value, String> {
    let argv = [
        "litebase-streams-bridge",
        "--database-url",
        &a.database_url,
        "--subscription",
        &a.subscription,
        "--pattern",
        &a.pattern,
        "--start",
        &a.start,
        "--window",
        &a.window.to_string(),
    ];
    let cfg = config::Config::try_parse_from(argv).map_err(|e| e.to_string())?;
    cfg.validate()?;
    metrics::install(); // bridge.rs counts windows
    let mut sink = NullSink { count: a.count, seen: 0, calls: 0, first: None, last: None };
    let started = Instant::now();
    bridge::run(&cfg, &mut sink, &STOP).await?;
    let wall = started.elapsed().as_secs_f64();
    let (first, first_batch) = sink.first.ok_or("no event came")?;
    let seconds = sink.last.map_or(0.0, |l| (l - first).as_secs_f64());
    Ok(json!({
        "events": sink.seen, "store_calls": sink.calls, "first_batch": first_batch,
        "seconds": seconds, "wall_seconds": wall,
        "events_per_s": if seconds > 0.0 { (sink.seen - 1) as f64 / seconds } else { f64::NAN },
    }))
}
