//! The gateway's database side: a small pool on the primary (and optionally
//! one on a hot standby for catch-up reads), and every query a request needs,
//! each in its own transaction that first switches to the request's role with
//! `set_config('role', $1, true)` (`SET LOCAL ROLE` with the name as a bound
//! parameter: no quoting, no injection). The extension's privileges then
//! decide: row-level security on the log for reading, publish's check for
//! writing. Statements are parameterized and prepared once per connection.

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Transaction};
use tokio_postgres::error::SqlState;
use tokio_postgres::{IsolationLevel, NoTls};

use crate::error::{ApiError, INSUFFICIENT_PRIVILEGE, INVALID_PARAMETER};
use crate::event::{Envelope, Event};
use crate::metrics;
use crate::pattern::Selector;

/// Where a replay starts: replay's `after`, and its `since` or `from_tx`;
/// with both, an event is read only past both (the later bound wins).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Start {
    /// Positions greater than this; none: from the beginning.
    pub after: Option<i64>,
    pub bound: Option<Bound>,
}

/// A replay's start by time or by transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bound {
    /// Events committed at or after this time (the database reads the text).
    Since(String),
    /// From this transaction's first event on (an xid8, digits only).
    FromTx(String),
}

impl Start {
    /// Positions greater than `position`.
    pub fn after(position: i64) -> Start {
        Start { after: Some(position), bound: None }
    }
}

/// One catch-up page, read in one snapshot with the horizon it saw.
pub struct Page {
    pub events: Vec<Arc<Event>>,
    pub horizon: i64,
    pub worker_pid: Option<i32>,
    /// The page stopped at its event or byte limit: more may follow. A page
    /// without `more` holds every matching event up to `horizon`, or up to
    /// `until` when that is lower.
    pub more: bool,
}

/// Rows fetched per round trip at most, while reading a page by portal.
const CHUNK_ROWS: i32 = 256;

/// Which server a read goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    Primary,
    /// The replica when one is configured, else the primary.
    Reader,
}

#[derive(Clone)]
pub struct Db {
    primary: Pool,
    replica: Option<Pool>,
    pub listen_config: tokio_postgres::Config,
    /// When (Unix seconds) a replay last found the database without the
    /// envelope's columns (before 0.3.0); 0: not since the last success.
    old_schema_at: Arc<AtomicU64>,
}

/// What a publish asks beside its data: the envelope's `type` and `key`,
/// and an idempotency key (see [`Db::publish`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct Publish<'a> {
    pub type_: Option<&'a str>,
    pub key: Option<&'a str>,
    pub idempotency_key: Option<&'a str>,
}

/// What a replay page asks for (see [`Db::replay_page_bytes`]).
struct PageAsk<'a> {
    pattern: &'a str,
    start: &'a Start,
    filter: &'a litebase_streams_core::filters::EventFilter,
    /// The last position to read (inclusive); none: up to the horizon.
    until: Option<i64>,
    limit: i32,
    max_bytes: usize,
}

fn unix_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

const REPLAY: &str = r#"SELECT e.position, e.stream,
       coalesce(pg_catalog.to_char(e."time" AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), ''),
       e.tx::text::bigint, e.data::text, e.type, e.key, e.headers::text
FROM streams.replay(stream => $1, after => $2, since => $3::text::timestamptz,
                    from_tx => $4::text::xid8, max_events => $5,
                    types => $6::text[], filter => $7::text::jsonb, until => $8) e"#;

/// [`REPLAY`] for a database not yet updated to 0.3.0, whose events have
/// no envelope and whose replay has no `until`: the page is cut at the
/// first event above it instead (replay returns position order).
const REPLAY_V0_2: &str = r#"SELECT e.position, e.stream,
       coalesce(pg_catalog.to_char(e."time" AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), ''),
       e.tx::text::bigint, e.data::text, NULL::text, NULL::text, NULL::text
FROM streams.replay(stream => $1, after => $2, since => $3::text::timestamptz,
                    from_tx => $4::text::xid8, max_events => $5) e"#;

/// SQLSTATE undefined_column and undefined_function: [`REPLAY`] on a
/// database before 0.3.0 (no envelope columns, no replay filters).
const UNDEFINED_COLUMN: &str = "42703";
const UNDEFINED_FUNCTION: &str = "42883";

/// How long the gateway keeps using [`REPLAY_V0_2`] after a database
/// without the envelope's columns refused [`REPLAY`], before it tries
/// again (the database may have been updated since).
const OLD_SCHEMA_RECHECK_SECS: u64 = 10;

const HORIZON: &str = "SELECT streams.horizon(), streams.worker_pid()";

/// [`HORIZON`] that also reads a replay's `since` as the database does:
/// a `since` it cannot read is 22007 here, whatever replay then plans (a
/// log without partitions yet is planned as empty, and replay's own check
/// of its arguments never runs).
const HORIZON_SINCE: &str = "SELECT streams.horizon(), streams.worker_pid(), $1::text::timestamptz IS NULL";

/// The names of the streams between two bounds, one index probe each (a
/// loose scan of (stream, position)), as the reader sees them.
const STREAM_NAMES: &str = r#"WITH RECURSIVE s(stream) AS (
    SELECT (SELECT pg_catalog.min(e.stream) FROM streams.event_log e WHERE e.stream >= $1 AND e.stream < $2)
    UNION ALL
    SELECT (SELECT pg_catalog.min(e.stream) FROM streams.event_log e WHERE e.stream > s.stream AND e.stream < $2)
    FROM s WHERE s.stream IS NOT NULL
) SELECT s.stream::text FROM s WHERE s.stream IS NOT NULL LIMIT 10000"#;

fn config(url: &str, query_timeout_secs: u64) -> Result<tokio_postgres::Config, String> {
    let mut config = tokio_postgres::Config::from_str(url).map_err(|e| format!("bad database URL: {e}"))?;
    config.application_name("litebase-streams-gateway");
    // Custom plans: replay's arguments fold to constants only with literal
    // values, and a generic plan of it can scan far more than a page.
    let timeout = format!("-c statement_timeout={}s -c plan_cache_mode=force_custom_plan", query_timeout_secs);
    config.options(&timeout);
    config.connect_timeout(std::time::Duration::from_secs(5));
    Ok(config)
}

fn pool(config: tokio_postgres::Config, size: usize) -> Result<Pool, String> {
    let manager = Manager::from_config(config, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    Pool::builder(manager)
        .max_size(size.max(1))
        .wait_timeout(Some(std::time::Duration::from_secs(10)))
        .create_timeout(Some(std::time::Duration::from_secs(5)))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .map_err(|e| e.to_string())
}

impl Db {
    pub fn new(cfg: &crate::config::Config) -> Result<Db, String> {
        let primary = config(&cfg.database_url, cfg.query_timeout_secs)?;
        let replica = match &cfg.replica_url {
            Some(url) => Some(pool(config(url, cfg.query_timeout_secs)?, cfg.pool_size)?),
            None => None,
        };
        Ok(Db {
            primary: pool(primary.clone(), cfg.pool_size)?,
            replica,
            listen_config: primary,
            old_schema_at: Arc::default(),
        })
    }

    fn pool(&self, server: Server) -> &Pool {
        match (server, &self.replica) {
            (Server::Reader, Some(replica)) => replica,
            _ => &self.primary,
        }
    }

    /// A connection of `server`'s pool, for queries that live beside the
    /// routes that ask them (the console's, console/api.rs): they run each
    /// in a transaction from [`begin`], as the request's role, never as the
    /// gateway's own.
    pub async fn client(&self, server: Server) -> Result<deadpool_postgres::Object, ApiError> {
        Ok(self.pool(server).get().await?)
    }

    /// Connections the pools hold (for /metrics).
    pub fn connections(&self) -> usize {
        self.primary.status().size + self.replica.as_ref().map_or(0, |p| p.status().size)
    }

    /// One replay page as `role` of the events `filter` keeps, at most `limit` events and about
    /// `max_bytes` bytes (each event counted by its SSE frame): it stops once
    /// the events read reach `max_bytes`, so one event larger than that comes
    /// alone. The rows come through a portal in small chunks sized by the
    /// bytes still allowed, so no more than a chunk's rows are held beyond the
    /// page itself.
    ///
    /// A database not yet updated to 0.3.0 refuses the envelope's columns
    /// (and replay's filters): its pages are read without them (a filtered
    /// page is refused there: 400), and the new form asked for again
    /// [`OLD_SCHEMA_RECHECK_SECS`] later. There `until` is applied here: the
    /// page ends before its first event above it, which is then left out (at
    /// most one chunk is read past it).
    #[allow(clippy::too_many_arguments)] // replay's own arguments, each one a caller sets
    pub async fn replay_page_bytes(
        &self,
        server: Server,
        role: &str,
        pattern: &str,
        start: &Start,
        filter: &litebase_streams_core::filters::EventFilter,
        until: Option<i64>,
        limit: i32,
        max_bytes: usize,
    ) -> Result<Page, ApiError> {
        let timer = Instant::now();
        let ask = PageAsk { pattern, start, filter, until, limit, max_bytes };
        let now = unix_secs();
        let old_schema_at = self.old_schema_at.load(Ordering::Relaxed);
        let statement = match old_schema_at != 0 && now < old_schema_at + OLD_SCHEMA_RECHECK_SECS {
            true => REPLAY_V0_2,
            false => REPLAY,
        };
        let page = match self.read_page(server, role, statement, &ask).await {
            Err(e) if statement == REPLAY && matches!(e.sqlstate(), Some(UNDEFINED_COLUMN | UNDEFINED_FUNCTION)) => {
                self.old_schema_at.store(now.max(1), Ordering::Relaxed);
                self.read_page(server, role, REPLAY_V0_2, &ask).await
            }
            Ok(page) if statement == REPLAY && old_schema_at != 0 => {
                self.old_schema_at.store(0, Ordering::Relaxed);
                Ok(page)
            }
            page => page,
        }?;
        metrics::query_seconds("replay", timer);
        Ok(page)
    }

    /// One page through `statement` ([`REPLAY`] or [`REPLAY_V0_2`]).
    async fn read_page(
        &self,
        server: Server,
        role: &str,
        statement: &str,
        ask: &PageAsk<'_>,
    ) -> Result<Page, ApiError> {
        let mut client = self.pool(server).get().await?;
        let tx = begin(&mut client, role, true).await?;
        let after = ask.start.after;
        let (since, from_tx) = match &ask.start.bound {
            None => (None, None),
            Some(Bound::Since(t)) => (Some(t.as_str()), None),
            Some(Bound::FromTx(x)) => (None, Some(x.as_str())),
        };
        let row = match since {
            None => tx.query_one(&tx.prepare_cached(HORIZON).await?, &[]).await?,
            Some(since) => tx.query_one(&tx.prepare_cached(HORIZON_SINCE).await?, &[&since]).await?,
        };
        let (horizon, worker_pid): (i64, Option<i32>) = (row.get(0), row.get(1));
        let stmt = tx.prepare_cached(statement).await?;
        let portal = if statement == REPLAY {
            let args: [&(dyn tokio_postgres::types::ToSql + Sync); 8] =
                [&ask.pattern, &after, &since, &from_tx, &ask.limit, &ask.filter.types, &ask.filter.data, &ask.until];
            tx.bind(&stmt, &args).await?
        } else if ask.filter.is_empty() {
            tx.bind(&stmt, &[&ask.pattern, &after, &since, &from_tx, &ask.limit]).await?
        } else {
            return Err(ApiError::bad_request("types and filter need litebase_streams 0.3.0 in the database"));
        };
        let (limit, max_bytes) = (ask.limit.max(0) as usize, ask.max_bytes);
        let mut events: Vec<Arc<Event>> = Vec::new();
        let mut bytes = 0usize;
        let mut done = false;
        // Only REPLAY_V0_2 returns events above `until`.
        let until = ask.until.unwrap_or(i64::MAX);
        'chunks: while events.len() < limit && bytes < max_bytes && !done {
            // As many rows as the bytes left allow at the average size so far.
            let average = if events.is_empty() { 0 } else { bytes / events.len() };
            let rows_left = if average == 0 { 16 } else { (max_bytes - bytes).div_ceil(average) };
            let chunk = rows_left.min(limit - events.len()).clamp(1, CHUNK_ROWS as usize);
            let rows = tx.query_portal(&portal, chunk as i32).await?;
            done = rows.len() < chunk;
            for r in &rows {
                if r.get::<_, i64>(0) > until {
                    // Every event up to `until` is in the page.
                    done = true;
                    break 'chunks;
                }
                let envelope = Envelope { type_: r.get(5), key: r.get(6), headers: r.get(7) };
                let event = Event::new(r.get(0), r.get(1), r.get(2), r.get(3), envelope, r.get(4));
                bytes += event.sse.len();
                events.push(Arc::new(event));
            }
        }
        let more = !done;
        // The portal ends with the transaction.
        tx.commit().await?;
        Ok(Page { events, horizon, worker_pid, more })
    }

    /// The read grants of `role`: whether it reads everything, and the names
    /// and patterns granted to it.
    pub async fn read_grants(&self, server: Server, role: &str) -> Result<(bool, Vec<String>), ApiError> {
        let timer = Instant::now();
        let mut client = self.pool(server).get().await?;
        let tx = begin(&mut client, role, true).await?;
        let stmt = tx.prepare_cached("SELECT streams._reads_all(), streams._read_patterns()").await?;
        let row = tx.query_one(&stmt, &[]).await?;
        tx.commit().await?;
        metrics::query_seconds("grants", timer);
        Ok((row.get(0), row.get(1)))
    }

    /// The streams `selector` selects that `role` can see, and the horizon.
    pub async fn stream_names(&self, role: &str, selector: &Selector) -> Result<(Vec<String>, i64), ApiError> {
        let timer = Instant::now();
        let mut client = self.primary.get().await?;
        let tx = begin(&mut client, role, true).await?;
        let (low, high) = match selector {
            Selector::Exact(name) => (name.clone(), format!("{name}\u{1}")),
            Selector::Prefix(prefix) | Selector::Wildcard { prefix, .. } if !prefix.is_empty() => {
                let mut high = prefix.clone().into_bytes();
                *high.last_mut().expect("a prefix is not empty") += 1;
                (prefix.clone(), String::from_utf8(high).expect("names are ASCII"))
            }
            // Every name starts with a letter, digit or '_', all below '~'.
            _ => (String::new(), "~".to_owned()),
        };
        let horizon_stmt = tx.prepare_cached(HORIZON).await?;
        let horizon: i64 = tx.query_one(&horizon_stmt, &[]).await?.get(0);
        let stmt = tx.prepare_cached(STREAM_NAMES).await?;
        // A wildcard's names are those of its literal prefix that match it.
        let names = tx
            .query(&stmt, &[&low, &high])
            .await?
            .iter()
            .map(|r| r.get::<_, String>(0))
            .filter(|name| selector.matches(name))
            .collect();
        tx.commit().await?;
        metrics::query_seconds("stream_names", timer);
        Ok((names, horizon))
    }

    /// Publish `data` (JSON text) to `stream` as `role`, with the envelope's
    /// `type` and `key` when given, and at most once per `idempotency_key`
    /// (`streams.publish_once`); its position, and whether the key was
    /// remembered (a repeat: nothing written, the original position). The
    /// same key with other data or envelope is refused with SQLSTATE 23505
    /// ([`ApiError::Unprocessable`]).
    pub async fn publish(
        &self,
        role: &str,
        stream: &str,
        data: &str,
        ask: &Publish<'_>,
    ) -> Result<(i64, bool), ApiError> {
        let timer = Instant::now();
        let mut client = self.primary.get().await?;
        let tx = begin(&mut client, role, false).await?;
        let published = match ask {
            // The two-argument form also serves databases before 0.3.0.
            Publish { type_: None, key: None, idempotency_key: None } => {
                let stmt = tx.prepare_cached("SELECT streams.publish($1, $2::text::jsonb)").await?;
                tx.query_one(&stmt, &[&stream, &data]).await.map(|row| (row.get(0), false))
            }
            Publish { idempotency_key: None, type_, key } => {
                let stmt = tx.prepare_cached("SELECT streams.publish($1, $2::text::jsonb, $3, $4)").await?;
                tx.query_one(&stmt, &[&stream, &data, type_, key]).await.map(|row| (row.get(0), false))
            }
            Publish { idempotency_key: Some(idempotency_key), type_, key } => {
                let stmt = tx
                    .prepare_cached(
                        "SELECT p.position, p.duplicate FROM streams.publish_once($1, $2::text::jsonb, $3, $4, $5) p",
                    )
                    .await?;
                let args: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
                    [&stream, &data, idempotency_key, type_, key];
                tx.query_one(&stmt, &args).await.map(|row| (row.get(0), row.get(1)))
            }
        };
        let published = published.map_err(|e| match e.code() {
            Some(code) if *code == SqlState::UNIQUE_VIOLATION => ApiError::unprocessable(&e),
            _ => ApiError::from_db(&e),
        })?;
        tx.commit().await?;
        metrics::query_seconds("publish", timer);
        Ok(published)
    }

    /// Whether the database answers, and the worker's pid as `role` sees it
    /// (`streams.worker_pid()`, null while no worker runs); without a role,
    /// only whether the database answers.
    pub async fn health(&self, role: Option<&str>) -> Result<Option<i32>, ApiError> {
        let mut client = self.primary.get().await?;
        let Some(role) = role else {
            client.query_one("SELECT 1", &[]).await?;
            return Ok(None);
        };
        let tx = begin(&mut client, role, true).await?;
        let stmt = tx.prepare_cached(HORIZON).await?;
        let pid: Option<i32> = tx.query_one(&stmt, &[]).await?.get(1);
        tx.commit().await?;
        Ok(pid)
    }
}

/// A transaction as `role`. Read-only ones are REPEATABLE READ, so the
/// horizon and the page come from one snapshot. A role that does not exist
/// is a bad token (401); one the gateway may not become is 403.
pub(crate) async fn begin<'a>(
    client: &'a mut deadpool_postgres::Object,
    role: &str,
    read_only: bool,
) -> Result<Transaction<'a>, ApiError> {
    let isolation = if read_only { IsolationLevel::RepeatableRead } else { IsolationLevel::ReadCommitted };
    let tx = client.build_transaction().isolation_level(isolation).read_only(read_only).start().await?;
    let stmt = tx.prepare_cached("SELECT pg_catalog.set_config('role', $1, true)").await?;
    if let Err(e) = tx.execute(&stmt, &[&role]).await {
        return Err(match e.code().map(SqlState::code) {
            Some(INVALID_PARAMETER) => ApiError::UnknownRole,
            Some(INSUFFICIENT_PRIVILEGE) => {
                ApiError::forbidden("the gateway's database role is not a member of the token's role")
            }
            _ => ApiError::from_db(&e),
        });
    }
    Ok(tx)
}
