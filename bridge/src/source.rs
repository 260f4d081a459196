//! The database side: one session that consumes the subscription.
//!
//! A window is one transaction: `BEGIN`, a cursor over `streams.poll(...)`,
//! `FETCH`es of at most the in-flight byte bound, and at the end
//! `streams.ack(...)` and `COMMIT` (sent with the next window's `BEGIN` in one
//! round trip). The events are claimed by that transaction until it ends: an
//! ordered subscription gives them to no one else meanwhile, and a crash of
//! the bridge, of the session or of the server returns them, to come again
//! with their next attempt.
//!
//! Every statement is a simple query with its values inlined: the
//! subscription's name obeys the stream naming rule (checked at start), and
//! numbers are numbers, so nothing needs quoting beyond the single quotes.

use std::collections::VecDeque;
use std::str::FromStr;

use bytes::Bytes;
use tokio_postgres::{Client, NoTls, SimpleQueryMessage, SimpleQueryRow};
use tracing::{info, warn};

use crate::config::{Config, Start};
use crate::headers::{carries, defused, defused_json};
use crate::sink::Message;

/// A database failure, and whether retrying can help.
#[derive(Debug)]
pub struct DbError {
    pub message: String,
    /// Bad configuration or missing privileges: the bridge stops.
    pub fatal: bool,
}

impl From<tokio_postgres::Error> for DbError {
    fn from(e: tokio_postgres::Error) -> Self {
        let fatal = e.as_db_error().is_some_and(|db| {
            matches!(
                db.code().code(),
                "42501" | "42710" | "22023" | "42P09" | "3F000" | "42883" | "28000" | "28P01" | "3D000"
            )
        });
        let message = match e.as_db_error() {
            // No schema streams, or no streams.poll: the extension is missing
            // (or older than the bridge) in this database.
            Some(db) if matches!(db.code().code(), "3F000" | "42883") => format!(
                "{} (SQLSTATE {}): is litebase_streams 0.3.0 installed in this database? \
                 (CREATE EXTENSION litebase_streams, or ALTER EXTENSION litebase_streams UPDATE)",
                db.message(),
                db.code().code()
            ),
            Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
            None => e.to_string(),
        };
        DbError { message, fatal }
    }
}

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

pub struct Source {
    client: Client,
    subscription: String,
    /// streams.log_id(): the first part of every message id.
    pub log_id: String,
    /// The subscription as its messages' Litebase-Subscription header says it.
    subscription_header: String,
    subject_prefix: Option<String>,
    window: i32,
    poll_wait_ms: u64,
    /// `ack ...; COMMIT` of the window before, sent with the next `BEGIN`.
    settle: Option<String>,
    /// The sizes (bytes) of the open window's events not fetched yet, in
    /// position order: the first row of a window carries them all.
    unfetched: VecDeque<usize>,
}

/// The session's own settings, whatever the database or role say.
/// `synchronous_commit = off`: a window's commit (its ack) does not wait for
/// the WAL flush, which would cost a disk flush per window. An ack lost in a
/// server crash only delivers its window again, and that stores nothing twice
/// (the bridge skips what JetStream holds, JetStream drops message ids it has).
const SESSION: &str = "SET application_name = 'litebase-streams-bridge';
    SET search_path = pg_catalog, pg_temp;
    SET default_transaction_isolation = 'read committed';
    SET default_transaction_read_only = off;
    SET default_transaction_deferrable = off;
    SET synchronous_commit = off;
    SET lock_timeout = 0;
    SET idle_session_timeout = 0;
    SET TimeZone = 'UTC';
    SET DateStyle = 'ISO';
    SET IntervalStyle = 'postgres';
    SET client_min_messages = warning;
    SET row_security = on";

/// A session with the bridge's own settings, as `--role`.
pub async fn session(cfg: &Config) -> Result<Client, DbError> {
    let pg = tokio_postgres::Config::from_str(&cfg.database_url)
        .map_err(|e| DbError { message: format!("--database-url: {e}"), fatal: true })?;
    let (client, connection) = pg.connect(NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            warn!("database connection: {e}");
        }
    });
    client.batch_execute(SESSION).await?;
    // A statement may wait for the long poll; a window may be held while
    // the sink is retried (--max-hold), and not much longer.
    let hold_ms = cfg.max_hold().as_millis() as u64 + cfg.poll_wait_ms + 30_000;
    client
        .batch_execute(&format!(
            "SET statement_timeout = {}; SET idle_in_transaction_session_timeout = {hold_ms}",
            cfg.poll_wait_ms + 30_000
        ))
        .await?;
    if let Some(role) = &cfg.role {
        client.batch_execute(&format!("SET ROLE {}", quote_ident(role))).await?;
    }
    Ok(client)
}

/// The subscription's lag: pending events and the age of the oldest, in seconds.
pub async fn lag(client: &Client, subscription: &str) -> Result<(i64, f64), DbError> {
    let row = client
        .query_opt(
            "SELECT pending, COALESCE(extract(epoch FROM lag_time), 0)::float8 FROM streams.subscriptions \
             WHERE name = $1 AND owner = current_user::regrole",
            &[&subscription],
        )
        .await?;
    Ok(row.map_or((0, 0.0), |r| (r.get::<_, Option<i64>>(0).unwrap_or(0), r.get(1))))
}

impl Source {
    pub async fn connect(cfg: &Config) -> Result<Source, DbError> {
        let client = session(cfg).await?;
        let log_id: String = client.query_one("SELECT streams.log_id()::text", &[]).await?.get(0);
        let after = match cfg.start().map_err(|message| DbError { message, fatal: true })? {
            Start::Now => "NULL".to_owned(),
            Start::After(p) => p.to_string(),
        };
        client
            .execute(
                &format!(
                    "SELECT streams.create_subscription($1, $2, after => {after}, ordered => true, \
                     if_not_exists => true)"
                ),
                &[&cfg.subscription, &cfg.pattern],
            )
            .await?;
        let row = client
            .query_one(
                "SELECT max_attempts FROM streams.subscriptions WHERE name = $1 AND owner = current_user::regrole",
                &[&cfg.subscription],
            )
            .await?;
        if let Some(max) = row.get::<_, Option<i32>>(0) {
            return Err(DbError {
                message: format!(
                    "subscription {} has max_attempts {max}: the bridge never gives up on an event, and one parked \
                     after {max} failed windows would be lost to JetStream. Run \
                     streams.alter_subscription('{}', unlimited_attempts => true)",
                    cfg.subscription, cfg.subscription
                ),
                fatal: true,
            });
        }
        info!(subscription = %cfg.subscription, pattern = %cfg.pattern, %log_id, "consuming");
        Ok(Source {
            client,
            subscription: cfg.subscription.clone(),
            subscription_header: defused(&cfg.subscription),
            log_id,
            subject_prefix: cfg.subject_prefix.clone(),
            window: cfg.window,
            poll_wait_ms: cfg.poll_wait_ms,
            settle: None,
            unfetched: VecDeque::new(),
        })
    }

    /// Settle the window before (if any) and open the next: claim up to a
    /// window of events and fetch the first of them. Its row also carries
    /// the size of every event of the window (the cursor's query holds them
    /// in the server, not here), so the fetches after it take exactly what
    /// fits in the in-flight bound.
    pub async fn open_window(&mut self) -> Result<Fetched, DbError> {
        let mut sql = self.settle.take().unwrap_or_default();
        sql.push_str(&format!(
            "BEGIN; DECLARE lbs_window NO SCROLL CURSOR FOR \
             SELECT position, stream, time, tx, data, type, key, headers, attempt, \
                    CASE WHEN n = 1 THEN array_agg(octet_length(data) + coalesce(octet_length(headers), 0)) OVER all_rows END \
             FROM (SELECT position, stream, to_char(time, 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') AS time, tx::text AS tx, \
                          data::text AS data, type, key, headers::text AS headers, attempt, \
                          row_number() OVER (ORDER BY position) AS n \
                   FROM streams.poll('{}', max_events => {}, wait => '{} milliseconds')) w \
             WINDOW all_rows AS (ORDER BY position ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) \
             ORDER BY position; FETCH 1 FROM lbs_window",
            self.subscription, self.window, self.poll_wait_ms
        ));
        self.unfetched.clear();
        self.run_fetch(&sql).await
    }

    /// Fetch the window's next events: as many as fit in `max_bytes` (at
    /// least one). None when the window has no more.
    pub async fn fetch(&mut self, max_bytes: usize) -> Result<Option<Fetched>, DbError> {
        let rows = rows_within(&self.unfetched, max_bytes);
        if rows == 0 {
            return Ok(None);
        }
        self.run_fetch(&format!("FETCH {rows} FROM lbs_window")).await.map(Some)
    }

    async fn run_fetch(&mut self, sql: &str) -> Result<Fetched, DbError> {
        let result = self.client.simple_query(sql).await;
        let messages = match result {
            Ok(m) => m,
            Err(e) => {
                let _ = self.client.batch_execute("ROLLBACK").await;
                return Err(e.into());
            }
        };
        // The rows of the last statement, the FETCH (an ack before it returns one too).
        let mut rows = Vec::new();
        let mut last = Vec::new();
        for message in messages {
            match message {
                SimpleQueryMessage::Row(row) => rows.push(row),
                SimpleQueryMessage::CommandComplete(_) => last = std::mem::take(&mut rows),
                _ => {}
            }
        }
        let mut fetched = Fetched::default();
        for row in &last {
            if let Some(sizes) = row.get(9) {
                self.unfetched = parse_sizes(sizes);
            }
            self.unfetched.pop_front();
            let m = self.message(row)?;
            fetched.redelivered |= row.get(8).and_then(|a| a.parse::<i32>().ok()).is_some_and(|a| a > 1);
            fetched.bytes += m.size();
            fetched.messages.push(m);
        }
        Ok(fetched)
    }

    /// Mark the window's events through `through` processed, with the next
    /// `open_window` (one round trip): its `COMMIT` is only sent then, so
    /// `settle_now` must follow when no next window comes.
    pub fn settle(&mut self, through: Option<i64>) {
        self.settle = Some(match through {
            Some(p) => format!("SELECT streams.ack('{}', {p}); COMMIT; ", self.subscription),
            None => "COMMIT; ".to_owned(),
        });
    }

    /// Send the pending settle at once.
    pub async fn settle_now(&mut self) -> Result<(), DbError> {
        if let Some(sql) = self.settle.take() {
            if let Err(e) = self.client.batch_execute(&sql).await {
                let _ = self.client.batch_execute("ROLLBACK").await;
                return Err(e.into());
            }
        }
        Ok(())
    }

    /// Give the window's events back (they come again, with their next attempt).
    pub async fn abandon(&mut self) {
        self.settle = None;
        let _ = self.client.batch_execute("ROLLBACK").await;
    }

    fn message(&self, row: &SimpleQueryRow) -> Result<Message, DbError> {
        let bad = |what: &str| DbError { message: format!("streams.poll returned no {what}"), fatal: false };
        let position: i64 = row.get(0).and_then(|p| p.parse().ok()).ok_or_else(|| bad("position"))?;
        let stream = row.get(1).ok_or_else(|| bad("stream"))?;
        let mut headers: Vec<(&'static str, String)> = vec![
            ("Litebase-Log-Id", self.log_id.clone()),
            ("Litebase-Position", position.to_string()),
            ("Litebase-Subscription", self.subscription_header.clone()),
            ("Litebase-Stream", defused(stream)),
            ("Litebase-Time", row.get(2).unwrap_or_default().to_owned()),
            ("Litebase-Tx", row.get(3).unwrap_or_default().to_owned()),
        ];
        if let Some(t) = row.get(5) {
            headers.push(("Litebase-Type", defused(t)));
        }
        if let Some(k) = row.get(6) {
            headers.push(("Litebase-Key", defused(k)));
        }
        let mut event_headers = Vec::new();
        if let Some(json) = row.get(7) {
            headers.push(("Litebase-Headers", defused_json(json)));
            if let Ok(serde_json::Value::Object(map)) = serde_json::from_str(json) {
                for (name, value) in map {
                    if let serde_json::Value::String(value) = value {
                        if carries(&name, &value) {
                            event_headers.push((name, value));
                        }
                    }
                }
            }
        }
        Ok(Message {
            position,
            subject: crate::subjects::subject(self.subject_prefix.as_deref(), stream),
            id: format!("{}:{position}", self.log_id),
            headers,
            event_headers,
            payload: Bytes::copy_from_slice(row.get(4).unwrap_or("null").as_bytes()),
        })
    }
}

/// What one FETCH returned.
#[derive(Default)]
pub struct Fetched {
    pub messages: Vec<Message>,
    pub bytes: usize,
    /// Whether one of them was delivered before (a window given back by a
    /// crash, a rollback, a lost session): JetStream may hold it already.
    pub redelivered: bool,
}

/// Bytes counted for an event besides its data and headers (the Litebase-*
/// headers, subject and message id).
const OVERHEAD: usize = 256;

/// How many of the next events (of `sizes` bytes each, data and headers) to
/// fetch within `max_bytes`: at least one, if any is left.
fn rows_within(sizes: &VecDeque<usize>, max_bytes: usize) -> usize {
    let mut total = 0;
    let mut rows = 0;
    for size in sizes {
        total += size + OVERHEAD;
        if rows > 0 && total > max_bytes {
            break;
        }
        rows += 1;
    }
    rows
}

/// A window's sizes as PostgreSQL prints an int array: `{12,40,7}`.
fn parse_sizes(text: &str) -> VecDeque<usize> {
    text.trim_matches(['{', '}']).split(',').filter_map(|n| n.trim().parse().ok()).collect()
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fetches_take_what_fits_in_the_bound_and_at_least_one_event() {
        let sizes: VecDeque<usize> = [1000, 1000, 300_000, 1000].into_iter().collect();
        assert_eq!(rows_within(&sizes, 8 << 20), 4);
        assert_eq!(rows_within(&sizes, 10_000), 2);
        assert_eq!(rows_within(&[2 << 20].into_iter().collect(), 1 << 20), 1);
        assert_eq!(rows_within(&VecDeque::new(), 1 << 20), 0);
        assert_eq!(parse_sizes("{12,40,7}"), [12, 40, 7]);
    }
}
