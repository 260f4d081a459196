//! One client's subscription to a pattern: registered with its topic first,
//! then caught up by replay pages as the client's role, then live from the
//! topic's queue, forwarding only positions above the last one it sent (see
//! the invariant in hub.rs). With `until` it ends once every event up to
//! that position was sent: at once when the catch-up gets there, else when
//! a live event above it comes, or when a page read every poll interval
//! (`--poll-interval-ms`) while it waits finds the horizon past it.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Notify};

use crate::db::{Server, Start};
use crate::error::ApiError;
use crate::event::Event;
use crate::hub::{Hub, Slot, Topic};
use crate::{metrics, pattern};

pub struct Subscription {
    hub: Arc<Hub>,
    pub topic: Arc<Topic>,
    slot: Slot,
    rx: mpsc::Receiver<Arc<Event>>,
    /// The last position sent to the client.
    pub last: i64,
    /// Where the next catch-up page starts.
    start: Start,
    /// Catch-up is over once a short page comes from a snapshot whose horizon
    /// reaches this: the topic's tail when the client registered, raised to
    /// any live event dropped while catching up.
    seam: i64,
    caught_up: bool,
    pending: VecDeque<Arc<Event>>,
    /// The last position to send (inclusive); none: live on.
    until: Option<i64>,
    /// Every event up to `until` is sent or in `pending`.
    reached: bool,
    /// While live short of `until`: when to read a page again (kept across
    /// calls of `next` that a heartbeat cut short).
    recheck: Option<tokio::time::Instant>,
}

/// Why a subscription ended.
#[derive(Debug)]
pub enum End {
    /// The client fell behind its buffer (or lost its privilege): its connection is cut.
    Dropped,
    Error(ApiError),
    /// Every event up to this position (the request's `until`) was sent:
    /// the response ends normally.
    Reached(i64),
}

impl Subscription {
    /// Check the pattern and the role's read privilege on it, register, and
    /// read the first catch-up page; every failure here is the request's
    /// error (400, 401, 403, 503).
    pub async fn open(
        hub: &Arc<Hub>,
        role: &str,
        pattern: &str,
        filter: litebase_streams_core::filters::EventFilter,
        start: Start,
        until: Option<i64>,
        kill: Arc<Notify>,
    ) -> Result<Subscription, ApiError> {
        let selector = pattern::parse(pattern).map_err(ApiError::invalid_parameter)?;
        check_read(hub, role, pattern, &selector).await?;
        let (slot, rx) = hub.slot(kill);
        let (topic, tail) = hub.register(role, pattern, &selector, &filter, slot.clone()).await?;
        let last = start.after.unwrap_or(0);
        let mut sub = Subscription {
            hub: hub.clone(),
            topic,
            slot,
            rx,
            last,
            start,
            seam: tail,
            caught_up: false,
            pending: VecDeque::new(),
            until,
            reached: false,
            recheck: None,
        };
        sub.catch_up_page().await?;
        Ok(sub)
    }

    /// The next event for the client (`true` when it came live).
    pub async fn next(&mut self) -> Result<(Arc<Event>, bool), End> {
        loop {
            while let Some(event) = self.pending.pop_front() {
                self.slot.queued.fetch_sub(event.sse.len(), Ordering::Relaxed);
                if self.until.is_some_and(|until| event.position > until) {
                    self.reached = true;
                } else if event.position > self.last {
                    self.last = event.position;
                    metrics::get().sent_catchup.increment(1);
                    return Ok((event, false));
                }
            }
            if let Some(until) = self.until {
                if self.reached || self.last >= until {
                    return Err(End::Reached(until));
                }
            }
            if !self.caught_up {
                match self.catch_up_page().await {
                    Ok(()) => continue,
                    Err(ApiError::Unavailable { .. }) => {
                        // The database is away: the client stays, and catches up when it is back.
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        continue;
                    }
                    Err(e) => return Err(End::Error(e)),
                }
            }
            let received = match self.until {
                None => self.rx.recv().await,
                Some(_) => {
                    let poll = self.hub.cfg.poll_interval();
                    let at = *self.recheck.get_or_insert_with(|| tokio::time::Instant::now() + poll);
                    match tokio::time::timeout_at(at, self.rx.recv()).await {
                        Ok(received) => received,
                        Err(_) => {
                            self.recheck = None;
                            // Nothing came: the horizon may have passed `until`
                            // without an event of this pattern. A page from the
                            // last position sent tells.
                            self.start = Start::after(self.last);
                            self.caught_up = false;
                            continue;
                        }
                    }
                }
            };
            match received {
                Some(event) => {
                    self.slot.queued.fetch_sub(event.sse.len(), Ordering::Relaxed);
                    if self.until.is_some_and(|until| event.position > until) {
                        // Live events come in position order: all up to `until` were sent.
                        self.reached = true;
                    } else if event.position > self.last {
                        self.last = event.position;
                        metrics::get().sent_live.increment(1);
                        return Ok((event, true));
                    }
                }
                None => return Err(End::Dropped),
            }
        }
    }

    async fn catch_up_page(&mut self) -> Result<(), ApiError> {
        // Live events that arrived meanwhile: this catch-up will read them
        // again, as long as it goes on past them.
        while let Ok(event) = self.rx.try_recv() {
            self.slot.queued.fetch_sub(event.sse.len(), Ordering::Relaxed);
            self.seam = self.seam.max(event.position);
        }
        // The page counts toward the client's byte budget while it waits to
        // be sent (in `queued`, which the topic's fan-out checks too), and
        // takes at most half of it so live events still fit beside it.
        let budget = (self.hub.cfg.client_buffer_bytes / 2).max(1);
        let page = self
            .hub
            .db
            .replay_page_bytes(
                Server::Reader,
                &self.topic.role,
                &self.topic.pattern,
                &self.start,
                &self.topic.filter,
                self.until,
                self.hub.cfg.page_size,
                budget,
            )
            .await?;
        let short = !page.more;
        match page.events.last() {
            Some(event) => self.start = Start::after(event.position),
            None if self.start.bound.is_some() => {
                // Nothing since that time or transaction yet: from the horizon on.
                self.start = Start::after(page.horizon);
                self.last = self.last.max(page.horizon);
            }
            None => {}
        }
        let bytes: usize = page.events.iter().map(|e| e.sse.len()).sum();
        self.slot.queued.fetch_add(bytes, Ordering::Relaxed);
        self.pending.extend(page.events);
        if short {
            if self.until.is_some_and(|until| page.horizon >= until) {
                // Every matching event up to `until` is in this page or was sent.
                tracing::debug!(client = self.slot.id(), last = self.last, until = self.until, "reached until");
                self.reached = true;
                self.caught_up = true;
            } else if page.horizon >= self.seam {
                tracing::debug!(client = self.slot.id(), last = self.last, horizon = page.horizon, "caught up");
                self.caught_up = true;
            } else {
                // A standby behind the primary: wait for it to get there.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Ok(())
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.topic.unregister(self.slot.id());
    }
}

/// 403 unless the role's read grants cover the whole pattern (the rule
/// subscriptions use); 403 too when the role may not use the schema at all.
pub async fn check_read(hub: &Hub, role: &str, pattern: &str, selector: &pattern::Selector) -> Result<(), ApiError> {
    let (all, grants) = hub.db.read_grants(Server::Reader, role).await?;
    if all || selector.covered_by(&grants) {
        hub.note_reader(role);
        Ok(())
    } else {
        Err(ApiError::forbidden(format!("role {role:?} may not read {pattern:?}")))
    }
}
