//! One subscription's task: sessions (connect, LISTEN, read the worker's
//! pid and the log id, catch up, follow) one after another, with a backoff
//! after a lost connection.
//!
//! `last_seen` only grows, and an event is handed out only when its
//! position is above it: exactly once, in order. It moves past an event
//! only when everything of the subscription below that event has been
//! handed out (see `decide`), or to the horizon of a replay that returned
//! a short page (the replay and the horizon are read in one statement, so
//! the same snapshot: every event at or below that horizon was in it).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use litebase_streams_core::backoff::backoff;
use litebase_streams_core::filters::{validate_filter, validate_types, EventFilter};
use litebase_streams_core::names::{parse_stream_selector, pattern_matches, StreamSelector};
use tokio::sync::mpsc;
use tokio_postgres::types::Type;
use tokio_postgres::Notification;

use super::decide::{judge, Verdict};
use super::SubscribeOptions;
use crate::connection::{self, quote_ident, Listening, Message};
use crate::event::EVENT_COLUMNS;
use crate::{Error, Event};

/// The longest the safety-net replay waits while replays come back empty.
const MAX_POLL: Duration = Duration::from_secs(10);

/// What `streams.log_id()` answers for a moment while the extension is
/// being created: the session is retried.
const NO_LOG_YET: &str = "streams.log_id() is null";

/// The most channels a pattern subscription listens on at its start.
const MAX_CHANNELS: i64 = 10_000;

fn replay_sql() -> String {
    format!(
        "SELECT h.log_id, h.horizon, {EVENT_COLUMNS}
         FROM (SELECT streams.log_id()::text AS log_id, streams.horizon() AS horizon) h
         LEFT JOIN LATERAL streams.replay(stream => $1, after => $2, max_events => $3,
                                          types => $4, filter => $5::text::jsonb) e ON true
         ORDER BY e.position"
    )
}

fn get_sql() -> String {
    format!("SELECT streams.log_id()::text, {EVENT_COLUMNS} FROM streams.get($1) e")
}

/// The names of the streams between two bounds, one index probe each.
const STREAM_NAMES: &str = "WITH RECURSIVE s(stream) AS (
    SELECT (SELECT min(e.stream) FROM streams.event_log e WHERE e.stream >= $1 AND e.stream < $2)
    UNION ALL
    SELECT (SELECT min(e.stream) FROM streams.event_log e WHERE e.stream > s.stream AND e.stream < $2)
    FROM s WHERE s.stream IS NOT NULL
) SELECT s.stream::text FROM s WHERE s.stream IS NOT NULL LIMIT $3";

type Outgoing = mpsc::Sender<Result<(String, Event), Error>>;

/// Why a session ended.
enum End {
    /// Nobody reads the subscription any more.
    Dropped,
    Failed(Error),
}

impl From<Error> for End {
    fn from(e: Error) -> End {
        End::Failed(e)
    }
}

impl From<tokio_postgres::Error> for End {
    fn from(e: tokio_postgres::Error) -> End {
        End::Failed(e.into())
    }
}

pub(super) struct Follower {
    config: tokio_postgres::Config,
    pattern: String,
    /// The stream, for a subscription of one stream.
    exact: Option<String>,
    selector: StreamSelector,
    /// The filters, tested here on events that come by notification.
    filter: EventFilter,
    options: SubscribeOptions,
    log_id: Option<String>,
    last_seen: i64,
    worker_pid: Option<i32>,
    /// The channels this session listens on (patterns).
    channels: HashSet<String>,
    /// When a notification of another process last cost a query: anyone
    /// can pg_notify, so those cost at most one per poll interval.
    untrusted_at: Option<Instant>,
    out: Outgoing,
}

impl Follower {
    pub(super) fn new(
        config: tokio_postgres::Config,
        pattern: &str,
        options: SubscribeOptions,
        out: Outgoing,
    ) -> Result<Follower, Error> {
        let selector = parse_stream_selector(pattern)?;
        if let Some(types) = &options.types {
            let list: Vec<Option<&str>> = types.iter().map(|t| Some(t.as_str())).collect();
            validate_types(&list)?;
        }
        if let Some(filter) = &options.filter {
            validate_filter(filter)?;
        }
        let exact = match &selector {
            StreamSelector::Exact(name) => Some(name.clone()),
            _ => None,
        };
        let filter = EventFilter { types: options.types.clone(), data: options.filter.as_ref().map(|f| f.to_string()) };
        let (log_id, last_seen) = match &options.after {
            Some(cursor) => (Some(cursor.log_id.clone()), cursor.position),
            None => (None, 0),
        };
        Ok(Follower {
            config,
            pattern: pattern.to_owned(),
            exact,
            selector,
            filter,
            options,
            log_id,
            last_seen,
            worker_pid: None,
            channels: HashSet::new(),
            untrusted_at: None,
            out,
        })
    }

    /// Sessions until the subscription is dropped or fails for good.
    pub(super) async fn run(mut self) {
        let mut failures = 0;
        loop {
            let started_with = self.last_seen;
            let error = match self.session(&mut failures).await {
                End::Dropped => return,
                End::Failed(e) => e,
            };
            if !self.retryable(&error) {
                let _ = self.out.send(Err(error)).await;
                return;
            }
            if let Some(hook) = &self.options.on_connection_lost {
                (hook.0)(&error);
            }
            if self.last_seen > started_with {
                failures = 0;
            }
            failures += 1;
            tokio::select! {
                _ = tokio::time::sleep(backoff(failures).max(Duration::from_millis(50))) => {}
                _ = self.out.closed() => return,
            }
        }
    }

    /// A lost connection; or, once the subscription has found its log, the
    /// extension missing for a moment (being re-created: the next session
    /// then finds the new log id and ends with LogChanged).
    fn retryable(&self, e: &Error) -> bool {
        e.is_connection_error()
            || matches!(e, Error::Decode(what) if what == NO_LOG_YET)
            || (self.log_id.is_some() && matches!(e.sqlstate(), Some("42883" | "3F000" | "42P01")))
    }

    async fn session(&mut self, failures: &mut u32) -> End {
        let mut conn = match connection::connect(&self.config).await {
            Ok(conn) => conn,
            Err(e) => return End::Failed(e.into()),
        };
        match self.follow(&mut conn, failures).await {
            Ok(never) => match never {},
            Err(end) => end,
        }
    }

    async fn follow(&mut self, conn: &mut Listening, failures: &mut u32) -> Result<std::convert::Infallible, End> {
        // 1. LISTEN first,
        self.channels.clear();
        match self.exact.clone() {
            Some(name) => self.listen(conn, &[name]).await?,
            None => {
                let names = self.stream_names(conn).await?;
                self.listen(conn, &names).await?;
            }
        }
        // 2. then the worker's pid and the log,
        let row = conn.client.query_typed_one("SELECT streams.worker_pid(), streams.log_id()::text", &[]).await?;
        self.worker_pid = row.try_get(0)?;
        self.check_log(row.try_get(1)?)?;
        *failures = 0;
        // 3. then catch up,
        self.catch_up(conn).await?;
        // 4. then follow the worker's notifications (and replay now and then).
        let base = self.options.poll_interval.max(Duration::from_millis(10));
        let mut wait = base;
        let mut next_poll = Instant::now() + wait;
        loop {
            tokio::select! {
                message = conn.messages.recv() => {
                    let notes = drain(message, &mut conn.messages)?;
                    let deferred = self.notified(conn, notes).await?;
                    wait = base;
                    // A deferred replay is due within the interval, however long a flood lasts.
                    next_poll = deferred.map_or(Instant::now() + wait, |at| at.min(Instant::now() + wait));
                }
                _ = tokio::time::sleep_until(next_poll.into()) => {
                    let found = self.catch_up(conn).await?;
                    wait = if found { base } else { (wait * 2).min(MAX_POLL.max(base)) };
                    next_poll = Instant::now() + wait;
                }
                _ = self.out.closed() => return Err(End::Dropped),
            }
        }
    }

    async fn listen(&mut self, conn: &Listening, names: &[String]) -> Result<(), End> {
        let fresh: Vec<&String> = names.iter().filter(|n| !self.channels.contains(*n)).collect();
        if fresh.is_empty() {
            return Ok(());
        }
        let sql: String = fresh.iter().map(|name| format!("LISTEN {};", quote_ident(name))).collect();
        conn.client.batch_execute(&sql).await?;
        self.channels.extend(fresh.into_iter().cloned());
        Ok(())
    }

    /// The streams a pattern selects now.
    async fn stream_names(&self, conn: &Listening) -> Result<Vec<String>, End> {
        let (low, high) = self.selector.prefix_range().unwrap_or(("", "~"));
        let rows = conn
            .client
            .query_typed(STREAM_NAMES, &[(&low, Type::TEXT), (&high, Type::TEXT), (&MAX_CHANNELS, Type::INT8)])
            .await;
        let rows = match rows.map_err(Error::from) {
            Ok(rows) => rows,
            // A role that may not read the log's table: the replays find the streams.
            Err(Error::PermissionDenied(_)) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut names = Vec::with_capacity(rows.len());
        for row in rows {
            let name: String = row.try_get(0)?;
            if pattern_matches(&self.pattern, &name) {
                names.push(name);
            }
        }
        Ok(names)
    }

    /// The log the database has now: the cursor's, or the subscription ends.
    fn check_log(&mut self, log_id: Option<String>) -> Result<(), Error> {
        let log_id = log_id.ok_or_else(|| Error::Decode(NO_LOG_YET.into()))?;
        match &self.log_id {
            Some(old) if *old != log_id => Err(Error::LogChanged { old: old.clone(), new: log_id }),
            Some(_) => Ok(()),
            None => {
                self.log_id = Some(log_id);
                Ok(())
            }
        }
    }

    /// Replay after `last_seen` until a short page; whether it found events.
    async fn catch_up(&mut self, conn: &Listening) -> Result<bool, End> {
        let sql = replay_sql();
        let page = self.options.page_size.clamp(1, 10_000);
        let filter = self.options.filter.as_ref().map(|f| f.to_string());
        let mut found = false;
        loop {
            self.count_query();
            let rows = conn
                .client
                .query_typed(
                    &sql,
                    &[
                        (&self.pattern, Type::TEXT),
                        (&self.last_seen, Type::INT8),
                        (&page, Type::INT4),
                        (&self.options.types, Type::TEXT_ARRAY),
                        (&filter, Type::TEXT),
                    ],
                )
                .await?;
            let mut events = 0;
            let mut horizon = 0;
            for row in &rows {
                self.check_log(row.try_get(0)?)?;
                horizon = row.try_get::<_, i64>(1)?;
                if let Some(event) = Event::from_row(row, 2)? {
                    events += 1;
                    if self.exact.is_none() && !self.channels.contains(&event.stream) {
                        // A stream the pattern meets for the first time: listen to it from now on.
                        self.listen(conn, std::slice::from_ref(&event.stream)).await?;
                    }
                    found |= self.hand_out(event, false).await?;
                }
            }
            if events < page {
                self.last_seen = self.last_seen.max(horizon);
                return Ok(found);
            }
        }
    }

    /// Hand `event` out when it is next and passes the filters (tested here
    /// when the database has not: `check_filter`); whether it went out.
    async fn hand_out(&mut self, event: Event, check_filter: bool) -> Result<bool, End> {
        if event.position <= self.last_seen {
            return Ok(false);
        }
        self.last_seen = event.position;
        if check_filter && !self.filter.matches(event.event_type.as_deref(), &event.data) {
            return Ok(false);
        }
        let log_id = self.log_id.clone().expect("the log is known before any event");
        self.out.send(Ok((log_id, event))).await.map_err(|_| End::Dropped)?;
        Ok(true)
    }

    /// Act on a batch of notifications; when a replay they call for was
    /// put off (notifications of other processes, throttled), when it is due.
    async fn notified(&mut self, conn: &Listening, notes: Vec<Notification>) -> Result<Option<Instant>, End> {
        let now = Instant::now();
        // At most a second: a restarted worker's first notifications are
        // among those, and wait that long at worst.
        let interval = self.options.poll_interval.clamp(Duration::from_millis(10), Duration::from_secs(1));
        let from_worker = notes.iter().any(|n| Some(n.process_id()) == self.worker_pid);
        let may_force = self.untrusted_at.is_none_or(|at| now.duration_since(at) >= interval);
        if !from_worker {
            if !may_force {
                return Ok(self.untrusted_at.map(|at| at + interval));
            }
            self.untrusted_at = Some(now);
        }
        let mut deferred = None;
        // Once per batch, after the notifications arrived: the worker's pid
        // (it may have restarted) and the log. A notification of a
        // re-created log was sent after the new log existed, so this read
        // sees the new log id: no event of another log is ever taken for
        // the next one of ours (the worker may well keep its pid across a
        // DROP and CREATE EXTENSION).
        self.count_query();
        let row = conn.client.query_typed_one("SELECT streams.worker_pid(), streams.log_id()::text", &[]).await?;
        self.worker_pid = row.try_get(0)?;
        self.check_log(row.try_get(1)?)?;
        let mut replay = false;
        for note in notes {
            if Some(note.process_id()) != self.worker_pid {
                // Anyone can pg_notify: never trusted; a replay decides, at
                // most one per interval for such notifications.
                if from_worker && !may_force {
                    deferred = self.untrusted_at.map(|at| at + interval);
                } else {
                    if from_worker {
                        self.untrusted_at = Some(now);
                    }
                    replay = true;
                }
                continue;
            }
            if let Some(lose) = &self.options.test_hooks.lose_notification {
                if litebase_streams_core::payload::decode_payload(note.payload()).is_some_and(|p| lose(p.position)) {
                    continue;
                }
            }
            match judge(note.payload(), self.exact.as_deref(), self.last_seen) {
                Verdict::Drop => {}
                // A pattern's notifications all replay: once, after the batch.
                Verdict::Replay if self.exact.is_none() => replay = true,
                Verdict::Replay => {
                    self.catch_up(conn).await?;
                    replay = false;
                }
                Verdict::Fetch(position) => self.fetch(conn, position).await?,
                Verdict::Deliver(event) => {
                    self.hand_out(*event, true).await?;
                }
            }
        }
        if replay {
            self.catch_up(conn).await?;
        }
        Ok(deferred)
    }

    fn count_query(&self) {
        if let Some(queries) = &self.options.test_hooks.queries {
            queries.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Fetch a truncated or private event; replay when the role cannot read it.
    async fn fetch(&mut self, conn: &Listening, position: i64) -> Result<(), End> {
        let row = conn.client.query_typed_one(&get_sql(), &[(&position, Type::INT8)]).await?;
        self.check_log(row.try_get(0)?)?;
        match Event::from_row(&row, 1)? {
            Some(event) => {
                self.hand_out(event, true).await?;
            }
            None => {
                self.catch_up(conn).await?;
            }
        }
        Ok(())
    }
}

/// The notifications that have arrived, from `first` on; an error when the
/// connection was lost (after what came before it: those are dropped with
/// the session, and the next one's catch-up delivers their events).
fn drain(first: Option<Message>, messages: &mut mpsc::UnboundedReceiver<Message>) -> Result<Vec<Notification>, End> {
    let mut notes = Vec::new();
    let mut next = first;
    loop {
        match next {
            Some(Message::Notification(note)) => notes.push(note),
            Some(Message::Lost(Some(e))) => return Err(e.into()),
            Some(Message::Lost(None)) | None => return Err(Error::ConnectionLost.into()),
        }
        match messages.try_recv() {
            Ok(message) => next = Some(message),
            Err(_) => return Ok(notes),
        }
    }
}
