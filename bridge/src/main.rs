//! litebase-streams-bridge: the events of one subscription into NATS
//! JetStream, exactly once and in position order.
//!
//! Layout: config.rs (flags and environment), source.rs (the database
//! session: windows of claimed events, acks), sink.rs (what a destination
//! must do), jetstream.rs (the JetStream destination), bridge.rs (the loop
//! between them), subjects.rs (stream names to subjects), metrics.rs
//! (Prometheus); this file starts them and serves /metrics and /healthz.

mod bridge;
mod config;
mod headers;
mod jetstream;
mod metrics;
mod sink;
mod source;
mod subjects;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use clap::Parser;
use tracing::{error, info, warn};

fn main() {
    let cfg = config::Config::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&cfg.log).unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = cfg.validate() {
        error!("{e}");
        std::process::exit(2);
    }
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a tokio runtime");
    if let Err(e) = runtime.block_on(serve(cfg)) {
        error!("{e}");
        std::process::exit(1);
    }
}

async fn serve(cfg: config::Config) -> Result<(), String> {
    metrics::install();
    let listener =
        tokio::net::TcpListener::bind(cfg.listen).await.map_err(|e| format!("cannot listen on {}: {e}", cfg.listen))?;
    tokio::spawn(async move {
        let app = Router::new().route("/metrics", get(render_metrics)).route("/healthz", get(healthz));
        if let Err(e) = axum::serve(listener, app).await {
            error!("HTTP: {e}");
        }
    });
    info!(listen = %cfg.listen, "serving /metrics and /healthz");
    let mut sink = jetstream::JetStream::connect(&cfg).await?;
    tokio::spawn(watch(cfg.clone(), sink.client()));
    let stop = Arc::new(AtomicBool::new(false));
    tokio::spawn(shutdown_on_signal(stop.clone()));
    let result = bridge::run(&cfg, &mut sink, &stop).await;
    if result.is_ok() {
        info!("stopped");
    }
    result
}

/// Every 2 s: the subscription's lag (its own session) and NATS's state.
async fn watch(cfg: config::Config, nats: async_nats::Client) {
    let m = metrics::get();
    let mut session = None;
    loop {
        metrics::set_nats_up(nats.connection_state() == async_nats::connection::State::Connected);
        if session.is_none() {
            session = source::session(&cfg).await.inspect_err(|e| warn!("lag: {e}")).ok();
        }
        if let Some(client) = &session {
            match source::lag(client, &cfg.subscription).await {
                Ok((events, seconds)) => {
                    m.lag_events.set(events as f64);
                    m.lag_seconds.set(seconds);
                }
                Err(_) => session = None,
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

async fn shutdown_on_signal(stop: Arc<AtomicBool>) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    info!("stopping after the window in hand");
    stop.store(true, Ordering::Relaxed);
    // A second signal, or a window that does not end, stops at once: the
    // window's events come again on the next start.
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
        _ = tokio::time::sleep(Duration::from_secs(30)) => {}
    }
    std::process::exit(0);
}

async fn render_metrics() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], metrics::render())
}

/// 200 when the database session and NATS are both up, else 503.
async fn healthz() -> impl IntoResponse {
    let (db, nats) = metrics::up();
    let state = |up: bool| if up { "up" } else { "down" };
    let body = serde_json::json!({ "database": state(db), "nats": state(nats) });
    (if db && nats { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }, axum::Json(body))
}
