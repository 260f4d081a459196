//! litebase-streams-gateway: the streams of one database over Server-Sent
//! Events and WebSocket, for browsers and services that cannot hold a
//! database connection.
//!
//! Layout: config.rs (flags and environment), auth.rs (JWT → role), db.rs
//! (the pools and every query, each as the request's role), hub.rs (the
//! per-(role, pattern) fan-out, with the no-gap invariant), listen.rs (the
//! one LISTEN connection), subscription.rs (one client: catch-up, then live), http.rs
//! (routes, SSE), ws.rs (WebSocket), event.rs (the wire encoding),
//! pattern.rs (stream names and patterns), metrics.rs (Prometheus),
//! db_metrics.rs (the database's numbers in /metrics, read on an interval),
//! limits.rs (what one TCP connection may hold, and for how long), console/
//! (the web console: its embedded files and its JSON API).

mod app;
mod auth;
mod config;
mod console;
mod db;
mod db_metrics;
mod error;
mod event;
mod http;
mod hub;
mod limits;
mod listen;
mod metrics;
mod pattern;
mod subscription;
mod ws;

use std::str::FromStr;
use std::sync::Arc;

use clap::Parser;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore};
use tower::ServiceExt;
use tracing::{error, info, warn};

use crate::config::{Cli, Command};

fn main() {
    let cli = Cli::parse();
    if let Some(Command::Token { role, expires_in, jwt_secret }) = &cli.command {
        println!("{}", auth::mint(jwt_secret, role, *expires_in));
        return;
    }
    let cfg = cli.serve;
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&cfg.log).unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    raise_fd_limit();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime");
    if let Err(e) = runtime.block_on(serve(cfg)) {
        error!("{e}");
        std::process::exit(1);
    }
}

async fn serve(cfg: config::Config) -> Result<(), String> {
    metrics::install();
    if cfg.jwt_secret.is_none() && cfg.anonymous_role.is_none() {
        warn!("neither --jwt-secret nor --anonymous-role: every request gets 401");
    }
    if cfg.jwt_secret.as_ref().is_some_and(|s| s.len() < 32) {
        warn!("--jwt-secret is shorter than 32 bytes: HS256 tokens signed with it can be guessed offline");
    }
    let login = tokio_postgres::Config::from_str(&cfg.database_url).ok().and_then(|c| c.get_user().map(str::to_owned));
    let auth = auth::Auth::new(cfg.jwt_secret.as_deref(), cfg.anonymous_role.clone(), login);
    let db = db::Db::new(&cfg)?;
    let listen = cfg.listen;
    let limits = cfg.limits.clone();
    let max_tcp = limits.max_tcp_connections.min(fd_budget());
    if max_tcp < limits.max_tcp_connections {
        warn!(max_tcp, "--max-tcp-connections lowered to what the file descriptor limit allows");
    }
    let hub = hub::Hub::start(cfg, db);
    // The database's numbers name streams, subscriptions and roles: read
    // them only when /metrics can keep them from strangers.
    if hub.cfg.metrics_token.is_some() {
        db_metrics::start(&hub.cfg, hub.db.listen_config.clone());
    } else {
        warn!(
            "no --metrics-token: /metrics needs no token and shows the gateway's own counters only, without the \
             database's numbers (streams.metrics() is not read{}) or the clients per topic pattern; to have them, \
             start with --metrics-token <secret> (LITEBASE_GATEWAY_METRICS_TOKEN) and scrape with \
             Authorization: Bearer <secret>",
            if hub.cfg.metrics_role.is_some() { ", so --metrics-role is unused" } else { "" }
        );
    }
    let app = http::router(hub, auth);
    let listener = TcpListener::bind(listen).await.map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    info!("listening on http://{}", listener.local_addr().map_err(|e| e.to_string())?);
    // Every TCP connection holds a permit while it lives: idle and
    // half-sent ones too, which --max-connections (SSE and WebSocket) does not count.
    let permits = Arc::new(Semaphore::new(max_tcp));
    // Refusals that wait for their client to finish sending (see `refuse`).
    let refusals = Arc::new(Semaphore::new(MAX_LINGERING_REFUSALS));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        // Also the idle time allowed between requests on a kept-alive connection.
        .header_read_timeout(limits.header_timeout())
        .max_buf_size(limits::MAX_HEAD_BYTES);
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        let (socket, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of file descriptors, most likely: wait instead of spinning.
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut shutdown => {
                info!("shutting down");
                return Ok(());
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            let linger = refusals.clone().try_acquire_owned().ok();
            tokio::spawn(refuse(socket, linger));
            continue;
        };
        let _ = socket.set_nodelay(true);
        let app = app.clone();
        let http = http.clone();
        let write_timeout = limits.write_timeout();
        tokio::spawn(async move {
            let _permit = permit;
            // The connection's kill switch: pulled when its client falls
            // behind, it drops the connection even while writes are blocked.
            let kill = Arc::new(Notify::new());
            let conn_kill = app::ConnKill(kill.clone());
            let service = app.map_request(move |mut request: axum::extract::Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(conn_kill.clone());
                request
            });
            let fd = std::os::fd::AsRawFd::as_raw_fd(&socket);
            let socket = limits::WriteTimeout::new(socket, write_timeout);
            let connection =
                http.serve_connection(TokioIo::new(socket), TowerToHyperService::new(service)).with_upgrades();
            tokio::pin!(connection);
            tokio::select! {
                _ = &mut connection => {}
                _ = kill.notified() => {
                    // Reset rather than close: the client sees the end at
                    // once instead of after what its socket buffers still
                    // hold, and the kernel frees them.
                    reset_on_close(fd);
                }
            }
        });
    }
}

/// At most this many refused connections are kept open (for at most
/// `REFUSAL_SECS`) to be read to their end; past it they are closed at once.
const MAX_LINGERING_REFUSALS: usize = 64;
const REFUSAL_SECS: u64 = 1;
/// How much of a refused client's request is read before the close.
const REFUSAL_DRAIN_BYTES: u64 = 64 * 1024;

/// A connection over --max-tcp-connections: 503 if it can be written at
/// once, then closed.
///
/// With a `linger` permit, the request the client already sent is read and
/// thrown away before the close (at most `REFUSAL_DRAIN_BYTES`, within `REFUSAL_SECS`): closing a
/// socket with unread input resets it, and a reset can reach the client
/// before it has read the 503, which it then never sees.
async fn refuse(mut socket: tokio::net::TcpStream, linger: Option<tokio::sync::OwnedSemaphorePermit>) {
    const BODY: &str = r#"{"error":"too many connections (--max-tcp-connections)","sqlstate":null}"#;
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{BODY}",
        BODY.len()
    );
    let answer = async {
        socket.write_all(response.as_bytes()).await?;
        if linger.is_some() {
            socket.shutdown().await?;
            tokio::io::copy(&mut (&mut socket).take(REFUSAL_DRAIN_BYTES), &mut tokio::io::sink()).await?;
        }
        Ok::<_, std::io::Error>(())
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(REFUSAL_SECS), answer).await;
    drop(linger);
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// SO_LINGER 0 on a socket that is still open (the connection future owns it until it is dropped).
fn reset_on_close(fd: std::os::fd::RawFd) {
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: `fd` is an open socket (its owner has not been dropped yet) and
    // `linger` outlives the call.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

/// TCP connections the file descriptor limit leaves room for, besides the
/// database connections, the log and the listener.
fn fd_budget() -> usize {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit only writes the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return usize::MAX;
    }
    (limit.rlim_cur as usize).saturating_sub(256).max(16)
}

/// As many file descriptors as the hard limit allows: one per client.
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
