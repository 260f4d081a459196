//! Configuration: every option is a flag and an environment variable
//! (`litebase-streams-bridge --help` lists them with their defaults).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

/// The dev cluster `make start` runs (as root; `make bridge` passes the right
/// one either way).
pub const DEV_CLUSTER: &str =
    "host=/tmp/litebase_streams-cluster-54329/socket port=54329 user=postgres dbname=postgres";

#[derive(Parser, Debug, Clone)]
#[command(
    name = "litebase-streams-bridge",
    version,
    about = "Feeds a litebase_streams subscription into NATS JetStream, exactly once and in position order",
    long_about = "Consumes one ordered subscription of a database (created if absent) and publishes each event to a \
                  JetStream stream (created if absent), with `Nats-Msg-Id: <log_id>:<position>`. A window of events \
                  is acked in the database only once JetStream acknowledged every one of them, in the same \
                  transaction that claimed them; after any crash the window comes again and JetStream's duplicate \
                  window drops what it already stored. Serves /metrics (Prometheus) and /healthz."
)]
pub struct Config {
    /// The database (libpq key=value string or postgres:// URL).
    #[arg(long, env = "LITEBASE_BRIDGE_DATABASE_URL", hide_env_values = true, default_value = DEV_CLUSTER)]
    pub database_url: String,

    /// Role to consume as (SET ROLE after connecting; the login role must be a member). Its stream grants decide
    /// what the subscription may select. Default: the login role.
    #[arg(long, env = "LITEBASE_BRIDGE_ROLE")]
    pub role: Option<String>,

    /// The subscription to consume (the stream naming rule). Created if the role has none of that name: ordered,
    /// on --pattern, starting at --start. An existing one must be ordered on --pattern, without a key or
    /// max_attempts.
    #[arg(long, env = "LITEBASE_BRIDGE_SUBSCRIPTION", default_value = "nats_bridge")]
    pub subscription: String,

    /// The stream pattern of the subscription (as in streams.create_subscription: a name, 'prefix.*', '*').
    #[arg(long, env = "LITEBASE_BRIDGE_PATTERN", default_value = "*")]
    pub pattern: String,

    /// Where a subscription the bridge creates starts: `now` (after the current horizon), `beginning`, or a
    /// position (after it). An existing subscription keeps its position.
    #[arg(long, env = "LITEBASE_BRIDGE_START", default_value = "now")]
    pub start: String,

    /// NATS servers, comma-separated (nats://host:port).
    #[arg(long, env = "LITEBASE_BRIDGE_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    pub nats_url: String,

    /// A NATS credentials file (JWT and NKey seed).
    #[arg(long, env = "LITEBASE_BRIDGE_NATS_CREDS")]
    pub nats_creds: Option<PathBuf>,

    /// NATS user (with --nats-password).
    #[arg(long, env = "LITEBASE_BRIDGE_NATS_USER")]
    pub nats_user: Option<String>,

    /// NATS password.
    #[arg(long, env = "LITEBASE_BRIDGE_NATS_PASSWORD", hide_env_values = true)]
    pub nats_password: Option<String>,

    /// NATS token.
    #[arg(long, env = "LITEBASE_BRIDGE_NATS_TOKEN", hide_env_values = true)]
    pub nats_token: Option<String>,

    /// The JetStream stream written to; created if absent with --subjects, --replicas, --storage and
    /// --duplicate-window-secs (an existing one is used as it is).
    #[arg(long, env = "LITEBASE_BRIDGE_JETSTREAM_STREAM", default_value = "LITEBASE_STREAMS")]
    pub jetstream_stream: String,

    /// Prefix of every subject: `payment.success` goes to `<prefix>.payment.success`. None by default: the
    /// subject is the stream name.
    #[arg(long, env = "LITEBASE_BRIDGE_SUBJECT_PREFIX")]
    pub subject_prefix: Option<String>,

    /// Subjects of a JetStream stream the bridge creates, comma-separated. Default: what --pattern maps to
    /// (`payment.*` -> `payment.>`, under --subject-prefix).
    #[arg(long, env = "LITEBASE_BRIDGE_SUBJECTS")]
    pub subjects: Option<String>,

    /// Replicas of a JetStream stream the bridge creates (1 to 5; more than 1 needs a JetStream cluster).
    #[arg(long, env = "LITEBASE_BRIDGE_REPLICAS", default_value_t = 1)]
    pub replicas: usize,

    /// Storage of a JetStream stream the bridge creates.
    #[arg(long, env = "LITEBASE_BRIDGE_STORAGE", value_enum, default_value_t = Storage::File)]
    pub storage: Storage,

    /// Seconds JetStream remembers a message id (a stream the bridge creates). A window delivered again first
    /// skips what the stream's newest message says it holds; past this window, an event published again when
    /// JetStream could not be asked that may be stored twice. JetStream keeps every id of the window in memory.
    #[arg(long, env = "LITEBASE_BRIDGE_DUPLICATE_WINDOW", default_value_t = 120)]
    pub duplicate_window_secs: u64,

    /// Events per window: one database transaction claims them, and acks them once JetStream stored all.
    #[arg(long, env = "LITEBASE_BRIDGE_WINDOW", default_value_t = 100)]
    pub window: i32,

    /// Most bytes of events (data and headers) read from the database and not yet acknowledged by JetStream
    /// (one event larger than it is read alone); a window of larger events is fetched and published in parts.
    #[arg(long, env = "LITEBASE_BRIDGE_MAX_IN_FLIGHT_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub max_in_flight_bytes: usize,

    /// Milliseconds to wait for JetStream's acknowledgement of a message before publishing it again.
    #[arg(long, env = "LITEBASE_BRIDGE_ACK_TIMEOUT_MS", default_value_t = 5000)]
    pub ack_timeout_ms: u64,

    /// Seconds a window is retried while its transaction holds its events; then it is rolled back (its events
    /// come again) and the bridge reconnects. Must be shorter than --duplicate-window-secs.
    #[arg(long, env = "LITEBASE_BRIDGE_MAX_HOLD", default_value_t = 60)]
    pub max_hold_secs: u64,

    /// Milliseconds a poll waits for new events (the long poll) before the bridge polls again.
    #[arg(long, env = "LITEBASE_BRIDGE_POLL_WAIT_MS", default_value_t = 1000)]
    pub poll_wait_ms: u64,

    /// Address of /metrics and /healthz.
    #[arg(long, env = "LITEBASE_BRIDGE_LISTEN", default_value = "127.0.0.1:9181")]
    pub listen: SocketAddr,

    /// Log filter (tracing's EnvFilter syntax: info, debug, litebase_streams_bridge=debug, ...).
    #[arg(long, env = "LITEBASE_BRIDGE_LOG", default_value = "info")]
    pub log: String,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    File,
    Memory,
}

/// Where a subscription the bridge creates starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    Now,
    After(i64),
}

impl Config {
    /// Check what clap cannot: the names, the ranges, and that a retried window
    /// stays inside JetStream's duplicate window.
    pub fn validate(&self) -> Result<(), String> {
        litebase_streams_core::names::validate_stream_name(&self.subscription)
            .map_err(|e| format!("--subscription {:?}: {}", e.name, e.reason))?;
        litebase_streams_core::names::parse_stream_selector(&self.pattern)
            .map_err(|e| format!("--pattern {:?}: {}", e.name, e.reason))?;
        self.start()?;
        if !(1..=10_000).contains(&self.window) {
            return Err("--window must be 1 to 10000 events (streams.poll's max_events)".into());
        }
        if !(1..=5).contains(&self.replicas) {
            return Err("--replicas must be 1 to 5".into());
        }
        if self.max_in_flight_bytes < 1024 {
            return Err("--max-in-flight-bytes must be at least 1024".into());
        }
        if self.max_hold_secs == 0 || self.max_hold_secs >= self.duplicate_window_secs {
            return Err(format!(
                "--max-hold-secs ({} s) must be more than 0 and shorter than --duplicate-window-secs ({} s): a window retried \
                 after JetStream forgot its message ids would be stored twice",
                self.max_hold_secs, self.duplicate_window_secs
            ));
        }
        if let Some(prefix) = &self.subject_prefix {
            crate::subjects::check_prefix(prefix)?;
        }
        if self.subjects.is_none() && self.subject_prefix.is_none() {
            let subjects = crate::subjects::for_pattern(None, &self.pattern)?;
            if let Some(s) = subjects.iter().find(|s| crate::subjects::captures_system_subjects(s)) {
                return Err(format!(
                    "--pattern {:?} maps to `{s}`: a JetStream stream on it would also capture NATS's own \
                     subjects (JetStream's API `$JS.API.>`, replies on `_INBOX.>`). Give --subject-prefix (events go \
                     to <prefix>.<stream>) or --subjects",
                    self.pattern
                ));
            }
        }
        if self.nats_password.is_some() != self.nats_user.is_some() {
            return Err("--nats-user and --nats-password go together".into());
        }
        Ok(())
    }

    pub fn start(&self) -> Result<Start, String> {
        match self.start.as_str() {
            "now" => Ok(Start::Now),
            "beginning" => Ok(Start::After(0)),
            other => match other.parse::<i64>() {
                Ok(p) if p >= 0 => Ok(Start::After(p)),
                _ => Err(format!("--start {other:?}: `now`, `beginning` or a position (0 or more)")),
            },
        }
    }

    pub fn ack_timeout(&self) -> Duration {
        Duration::from_millis(self.ack_timeout_ms.max(1))
    }

    pub fn max_hold(&self) -> Duration {
        Duration::from_secs(self.max_hold_secs)
    }

    pub fn duplicate_window(&self) -> Duration {
        Duration::from_secs(self.duplicate_window_secs)
    }
}
