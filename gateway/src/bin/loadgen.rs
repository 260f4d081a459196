//! litebase-streams-loadgen: many SSE clients on one gateway, built on the
//! gateway's own stack (tokio, hyper, tokio-postgres), for `make bench`
//! (bench/phases/gateway.py).
//!
//! It connects `--clients` SSE clients to one pattern, then publishes
//! `--rate` events per second for `--duration` seconds (one transaction
//! each), and measures in every client the time from each event's commit
//! (its `time`, the commit timestamp) to its arrival, and that each client
//! got every event once, in order. With `--gateway-pid` it also reads the
//! gateway's memory before and after the clients connected and its CPU time
//! while events flowed. One JSON object on stdout.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

#[derive(Parser, Debug)]
#[command(name = "litebase-streams-loadgen", about = "SSE load on a litebase-streams-gateway; prints JSON")]
struct Args {
    /// The gateway's address.
    #[arg(long, default_value = "127.0.0.1:8080")]
    gateway: String,
    /// The pattern the clients subscribe to.
    #[arg(long, default_value = "bench.gateway")]
    pattern: String,
    /// The stream events are published to (matched by --pattern).
    #[arg(long, default_value = "bench.gateway")]
    stream: String,
    /// A bearer token for the clients (none: the gateway's anonymous role).
    #[arg(long, env = "LOADGEN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Concurrent SSE clients.
    #[arg(long, default_value_t = 5000)]
    clients: usize,
    /// Connections opened at once while connecting.
    #[arg(long, default_value_t = 256)]
    connect_concurrency: usize,
    /// Events published per second.
    #[arg(long, default_value_t = 20.0)]
    rate: f64,
    /// Seconds of publishing.
    #[arg(long, default_value_t = 20.0)]
    duration: f64,
    /// The database to publish to (libpq string).
    #[arg(long, env = "LOADGEN_DATABASE_URL")]
    database_url: String,
    /// The gateway's pid, to read its memory and CPU from /proc.
    #[arg(long)]
    gateway_pid: Option<u32>,
}

/// Commit-to-arrival latency histogram: 100 µs buckets up to 10 s.
struct Histogram {
    buckets: Vec<AtomicU64>,
}

const BUCKET_US: u64 = 100;

impl Histogram {
    fn new() -> Histogram {
        Histogram { buckets: (0..100_001).map(|_| AtomicU64::new(0)).collect() }
    }

    fn record(&self, us: i64) {
        let i = ((us.max(0) as u64) / BUCKET_US).min(self.buckets.len() as u64 - 1) as usize;
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Percentile in ms (upper bound of the bucket).
    fn percentile(&self, p: f64) -> f64 {
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return f64::NAN;
        }
        let rank = ((p / 100.0) * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return ((i as u64 + 1) * BUCKET_US) as f64 / 1000.0;
            }
        }
        f64::NAN
    }
}

#[derive(Default)]
struct Totals {
    connected: AtomicUsize,
    failed: AtomicUsize,
    ended: AtomicUsize,
    deliveries: AtomicU64,
    out_of_order: AtomicU64,
}

fn now_us() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as i64
}

/// `2026-11-30T15:05:22.767915Z` → µs since the epoch.
fn parse_time_us(t: &str) -> Option<i64> {
    let b = t.as_bytes();
    if b.len() < 27 {
        return None;
    }
    let num = |s: &str| s.parse::<i64>().ok();
    let (y, m, d) = (num(&t[0..4])?, num(&t[5..7])?, num(&t[8..10])?);
    let (hh, mm, ss) = (num(&t[11..13])?, num(&t[14..16])?, num(&t[17..19])?);
    let us = num(&t[20..26])?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 86_400 + hh * 3600 + mm * 60 + ss) * 1_000_000) + us)
}

/// One SSE client: connect, then read events until the body ends.
async fn client(
    args: Arc<Args>,
    after: i64,
    totals: Arc<Totals>,
    hist: Arc<Histogram>,
    received: Arc<AtomicU64>,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    let stream = match TcpStream::connect(&args.gateway).await {
        Ok(s) => s,
        Err(_) => {
            totals.failed.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    let _ = stream.set_nodelay(true);
    let Ok((mut sender, conn)) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await else {
        totals.failed.fetch_add(1, Ordering::Relaxed);
        return;
    };
    tokio::spawn(conn);
    let mut request = hyper::Request::get(format!("/v1/streams/{}/events?after={after}", args.pattern))
        .header("host", &args.gateway)
        .header("accept", "text/event-stream");
    if let Some(token) = &args.token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let response = match sender.send_request(request.body(Empty::<Bytes>::new()).unwrap()).await {
        Ok(r) if r.status() == 200 => r,
        _ => {
            totals.failed.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    totals.connected.fetch_add(1, Ordering::Relaxed);
    drop(permit); // connected: the next client may connect
    let mut body = response.into_body();
    let mut buffer: Vec<u8> = Vec::with_capacity(1024);
    let mut last = after;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else { break };
        let Some(data) = frame.data_ref() else { continue };
        buffer.extend_from_slice(data);
        while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
            let block = &buffer[..end];
            if let Some((position, time)) = parse_block(block) {
                let at = now_us();
                if let Some(t) = time {
                    hist.record(at - t);
                }
                if position <= last {
                    totals.out_of_order.fetch_add(1, Ordering::Relaxed);
                } else {
                    last = position;
                }
                totals.deliveries.fetch_add(1, Ordering::Relaxed);
                received.store(position as u64, Ordering::Relaxed);
            }
            buffer.drain(..end + 2);
        }
    }
    totals.ended.fetch_add(1, Ordering::Relaxed);
}

/// (position, commit time in µs) of an event block; None for comments.
fn parse_block(block: &[u8]) -> Option<(i64, Option<i64>)> {
    let text = std::str::from_utf8(block).ok()?;
    let mut position = None;
    let mut time = None;
    for line in text.lines() {
        if let Some(id) = line.strip_prefix("id: ") {
            position = id.parse().ok();
        } else if let Some(data) = line.strip_prefix("data: ") {
            if let Some(i) = data.find(r#""time":""#) {
                time = parse_time_us(&data[i + 8..]);
            }
        }
    }
    Some((position?, time))
}

fn proc_status_kb(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok()
}

/// utime + stime of a process, in clock ticks.
fn proc_cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit(')').next()?.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

fn main() {
    raise_fd_limit();
    let args = Arc::new(Args::parse());
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let report = runtime.block_on(run(args));
    println!("{report}");
}

async fn run(args: Arc<Args>) -> serde_json::Value {
    let (db, connection) = tokio_postgres::connect(&args.database_url, tokio_postgres::NoTls).await.expect("database");
    tokio::spawn(connection);
    let after: i64 = db.query_one("SELECT streams.horizon()", &[]).await.expect("horizon").get(0);
    let rss_before = args.gateway_pid.and_then(|p| proc_status_kb(p, "VmRSS"));

    let totals = Arc::new(Totals::default());
    let hist = Arc::new(Histogram::new());
    let started = Instant::now();
    let limit = Arc::new(tokio::sync::Semaphore::new(args.connect_concurrency.max(1)));
    let mut positions = Vec::with_capacity(args.clients);
    for _ in 0..args.clients {
        let received = Arc::new(AtomicU64::new(0));
        positions.push(received.clone());
        let permit = limit.clone().acquire_owned().await.unwrap();
        tokio::spawn(client(args.clone(), after, totals.clone(), hist.clone(), received, permit));
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while totals.connected.load(Ordering::Relaxed) + totals.failed.load(Ordering::Relaxed) < args.clients
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let connect_s = started.elapsed().as_secs_f64();
    // Let the last connections finish their catch-up before measuring memory.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rss_connected = args.gateway_pid.and_then(|p| proc_status_kb(p, "VmRSS"));
    let db_connections: i64 = db
        .query_one("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'litebase-streams-gateway'", &[])
        .await
        .map(|r| r.get(0))
        .unwrap_or(-1);

    // Publish at the rate, one transaction per event.
    let cpu_before = args.gateway_pid.and_then(proc_cpu_ticks);
    let self_before = proc_cpu_ticks(std::process::id());
    let publish_started = Instant::now();
    let total = (args.rate * args.duration).round() as u64;
    let interval = Duration::from_secs_f64(1.0 / args.rate.max(0.001));
    let statement = db.prepare("SELECT streams.publish($1, $2::text::jsonb)").await.unwrap();
    let mut last_position = after;
    for i in 0..total {
        let due = publish_started + interval * i as u32;
        tokio::time::sleep_until(due.into()).await;
        let data = format!(r#"{{"i":{i},"order_id":"ord_{i}","amount":49.00}}"#);
        last_position = db.query_one(&statement, &[&args.stream, &data]).await.expect("publish").get(0);
    }
    let publish_s = publish_started.elapsed().as_secs_f64();
    // Wait (at most 10 s) for every connected client to get the last event.
    let wait_deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < wait_deadline
        && positions.iter().filter(|p| p.load(Ordering::Relaxed) as i64 >= last_position).count()
            < totals.connected.load(Ordering::Relaxed)
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let flow_s = publish_started.elapsed().as_secs_f64();
    let cpu_after = args.gateway_pid.and_then(proc_cpu_ticks);
    let self_after = proc_cpu_ticks(std::process::id());
    let rss_after = args.gateway_pid.and_then(|p| proc_status_kb(p, "VmRSS"));
    let hwm = args.gateway_pid.and_then(|p| proc_status_kb(p, "VmHWM"));
    let ticks = 100.0; // USER_HZ on Linux
    let cpu_pct = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), Some(b)) => Some((b - a) as f64 / ticks / flow_s * 100.0),
        _ => None,
    };
    let connected = totals.connected.load(Ordering::Relaxed);
    let deliveries = totals.deliveries.load(Ordering::Relaxed);
    let complete = positions.iter().filter(|p| p.load(Ordering::Relaxed) as i64 >= last_position).count();
    serde_json::json!({
        "clients": args.clients,
        "connected": connected,
        "failed": totals.failed.load(Ordering::Relaxed),
        "disconnected": totals.ended.load(Ordering::Relaxed),
        "connect_s": connect_s,
        "published": total,
        "rate": args.rate,
        "publish_s": publish_s,
        "deliveries": deliveries,
        "expected_deliveries": total * connected as u64,
        "clients_complete": complete,
        "out_of_order_or_duplicate": totals.out_of_order.load(Ordering::Relaxed),
        "deliveries_per_s": deliveries as f64 / flow_s,
        "latency_ms": {"p50": hist.percentile(50.0), "p90": hist.percentile(90.0), "p99": hist.percentile(99.0),
                       "max": hist.percentile(100.0)},
        "gateway": {
            "rss_before_kb": rss_before, "rss_connected_kb": rss_connected, "rss_after_kb": rss_after, "hwm_kb": hwm,
            "cpu_pct": cpu_pct(cpu_before, cpu_after),
            "db_connections": db_connections,
        },
        "loadgen_cpu_pct": cpu_pct(self_before, self_after),
    })
}
