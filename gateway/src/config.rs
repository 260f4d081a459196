//! Configuration: every option is a flag and an environment variable
//! (`litebase-streams-gateway --help` lists them with their defaults).

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// The dev cluster `make start` runs (as root; `make gateway` passes the
/// right one either way).
pub const DEV_CLUSTER: &str =
    "host=/tmp/litebase_streams-cluster-54329/socket port=54329 user=postgres dbname=postgres";

#[derive(Parser, Debug)]
#[command(
    name = "litebase-streams-gateway",
    version,
    about = "Server-Sent Events and WebSocket fan-out of litebase_streams, over a few database connections",
    long_about = "Serves the streams of one database over HTTP: GET /v1/streams/{pattern}/events (SSE or a JSON \
                  page), GET /v1/ws (WebSocket), POST /v1/streams/{stream}/events (publish), /healthz, /metrics. \
                  Every request runs as the PostgreSQL role named by its JWT's `role` claim (SET LOCAL ROLE), so \
                  the database's stream privileges decide what it may read and publish."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub serve: Config,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print an HS256 token for a role, signed with the configured secret (for tests and scripts).
    Token {
        /// The PostgreSQL role the token's requests run as (the `role` claim).
        #[arg(long)]
        role: String,
        /// Seconds until it expires (the `exp` claim).
        #[arg(long, default_value_t = 3600)]
        expires_in: u64,
        /// The secret (HS256) to sign it with.
        #[arg(long, env = "LITEBASE_GATEWAY_JWT_SECRET", hide_env_values = true)]
        jwt_secret: String,
    },
}

#[derive(Args, Debug, Clone)]
pub struct Config {
    /// The database (libpq key=value string or postgres:// URL). The gateway's role needs LOGIN and membership
    /// of each role it serves (GRANT app_reader TO gateway), nothing else.
    #[arg(long, env = "LITEBASE_GATEWAY_DATABASE_URL", hide_env_values = true, default_value = DEV_CLUSTER)]
    pub database_url: String,

    /// A hot standby of that database for catch-up reads and JSON pages (LISTEN, publishing and the live path stay
    /// on --database-url).
    #[arg(long, env = "LITEBASE_GATEWAY_REPLICA_URL", hide_env_values = true)]
    pub replica_url: Option<String>,

    /// Address to listen on.
    #[arg(long, env = "LITEBASE_GATEWAY_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// Origins browsers may call the gateway from (CORS): `*`, or a comma-separated list such as
    /// `https://app.example.com,http://localhost:3000`. None by default (same origin only).
    #[arg(long, env = "LITEBASE_GATEWAY_ALLOW_ORIGIN")]
    pub allow_origin: Option<String>,

    /// HS256 secret that signs the clients' JWTs. Without it no token is accepted.
    #[arg(long, env = "LITEBASE_GATEWAY_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<String>,

    /// Role for requests without a token (none by default: they get 401).
    #[arg(long, env = "LITEBASE_GATEWAY_ANONYMOUS_ROLE")]
    pub anonymous_role: Option<String>,

    /// Role /healthz asks `streams.worker_pid()` as (it needs the read privilege on some stream). Default: the
    /// anonymous role, else the role of the latest subscription; without any, /healthz checks the database only.
    #[arg(long, env = "LITEBASE_GATEWAY_HEALTH_ROLE")]
    pub health_role: Option<String>,

    /// Database connections for queries (catch-up, pages, publish), besides the one that LISTENs.
    #[arg(long, env = "LITEBASE_GATEWAY_POOL_SIZE", default_value_t = 4)]
    pub pool_size: usize,

    /// Most SSE and WebSocket connections at once; more get 503.
    #[arg(long, env = "LITEBASE_GATEWAY_MAX_CONNECTIONS", default_value_t = 20_000)]
    pub max_connections: usize,

    /// Most events queued for one client (SSE connection or WebSocket subscription); a client that falls
    /// further behind is disconnected.
    #[arg(long, env = "LITEBASE_GATEWAY_CLIENT_BUFFER_EVENTS", default_value_t = 4096)]
    pub client_buffer_events: usize,

    /// Most bytes of events queued for one client; a client that falls further behind is disconnected.
    #[arg(long, env = "LITEBASE_GATEWAY_CLIENT_BUFFER_BYTES", default_value_t = 1024 * 1024)]
    pub client_buffer_bytes: usize,

    /// Events per catch-up query (streams.replay's max_events).
    #[arg(long, env = "LITEBASE_GATEWAY_PAGE_SIZE", default_value_t = 1000)]
    pub page_size: i32,

    /// Largest max_events a JSON page may ask for.
    #[arg(long, env = "LITEBASE_GATEWAY_MAX_PAGE_SIZE", default_value_t = 10_000)]
    pub max_page_size: i32,

    /// Seconds between SSE heartbeats (`: ping`) and WebSocket pings.
    #[arg(long, env = "LITEBASE_GATEWAY_HEARTBEAT", default_value_t = 15)]
    pub heartbeat_secs: u64,

    /// Milliseconds between safety-net replays of each subscribed pattern (they find events of streams a
    /// pattern had not met yet, and anything a lost notification hid). A topic whose replays come back empty
    /// waits twice as long each time, up to 10 s, and back to this at its next event or notification. It is
    /// also the most a single-stream topic trusts its last privilege check before forwarding a notification
    /// without a query, and the least time between two replays that unverified notifications force.
    #[arg(long, env = "LITEBASE_GATEWAY_POLL_INTERVAL_MS", default_value_t = 1000)]
    pub poll_interval_ms: u64,

    /// Most topics (distinct role and pattern pairs that clients subscribe to) at once; a subscription that
    /// would open one more gets 503. Each topic LISTENs on its streams' channels and replays on its own.
    #[arg(long, env = "LITEBASE_GATEWAY_MAX_TOPICS", default_value_t = 10_000)]
    pub max_topics: usize,

    /// Most topics one role holds at once (the anonymous role counts as one), so that one token holder cannot
    /// take all of --max-topics; a subscription that would open one more for its role gets 503. Default: a
    /// quarter of --max-topics (at least 1).
    #[arg(long, env = "LITEBASE_GATEWAY_MAX_TOPICS_PER_ROLE")]
    pub max_topics_per_role: Option<usize>,

    /// Milliseconds a topic stays after its last client left (a client that comes back meanwhile finds it
    /// warm; one that comes later opens it again and catches up all the same); then it closes, no longer
    /// counts toward --max-topics and --max-topics-per-role, and UNLISTENs the channels no other topic uses.
    #[arg(long, env = "LITEBASE_GATEWAY_TOPIC_IDLE_MS", default_value_t = 1000)]
    pub topic_idle_ms: u64,

    /// Largest request body (publish), in bytes.
    #[arg(long, env = "LITEBASE_GATEWAY_MAX_BODY_BYTES", default_value_t = 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Largest WebSocket message a client may send, in bytes.
    #[arg(long, env = "LITEBASE_GATEWAY_MAX_WS_MESSAGE_BYTES", default_value_t = 64 * 1024)]
    pub max_ws_message_bytes: usize,

    /// Seconds a query may run (statement_timeout of the gateway's sessions).
    #[arg(long, env = "LITEBASE_GATEWAY_QUERY_TIMEOUT", default_value_t = 10)]
    pub query_timeout_secs: u64,

    /// Seconds between two reads of `streams.metrics()` for GET /metrics: the database's numbers are read once
    /// per interval, on a connection of their own, and cached, so that a scrape never queries the database.
    #[arg(long = "metrics-interval", env = "LITEBASE_GATEWAY_METRICS_INTERVAL", default_value_t = 5)]
    pub metrics_interval_secs: u64,

    /// Role to read `streams.metrics()` as (SET ROLE; it needs EXECUTE on the function, which members of
    /// pg_monitor have). Default: the login role itself.
    #[arg(long, env = "LITEBASE_GATEWAY_METRICS_ROLE")]
    pub metrics_role: Option<String>,

    /// Secret a scrape of GET /metrics must send as `Authorization: Bearer <secret>` (others get 401). Only with
    /// it does /metrics show the database's numbers (`streams.metrics()`: stream, subscription, webhook and owner
    /// names, which SQL shows only to pg_monitor) and the clients per topic pattern; without it /metrics needs no
    /// token and shows the gateway's own counters only, and `streams.metrics()` is never read.
    #[arg(
        long,
        env = "LITEBASE_GATEWAY_METRICS_TOKEN",
        hide_env_values = true,
        value_parser = clap::builder::NonEmptyStringValueParser::new()
    )]
    pub metrics_token: Option<String>,

    #[command(flatten)]
    pub limits: crate::limits::Limits,

    /// Log filter (tracing's EnvFilter syntax: info, debug, litebase_streams_gateway=debug, ...).
    #[arg(long, env = "LITEBASE_GATEWAY_LOG", default_value = "info")]
    pub log: String,
}

impl Config {
    pub fn heartbeat(&self) -> Duration {
        Duration::from_secs(self.heartbeat_secs.max(1))
    }

    pub fn poll_interval(&self) -> Duration {
        Duration::from_millis(self.poll_interval_ms.max(10))
    }

    pub fn max_topics_per_role(&self) -> usize {
        self.max_topics_per_role.unwrap_or((self.max_topics / 4).max(1))
    }

    pub fn topic_idle(&self) -> Duration {
        Duration::from_millis(self.topic_idle_ms)
    }

    pub fn metrics_interval(&self) -> Duration {
        Duration::from_secs(self.metrics_interval_secs.max(1))
    }
}
