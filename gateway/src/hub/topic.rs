//! A topic: the clients of one (role, pattern), its tail, and its task.
//!
//! How the topic learns of events: a notification on one of its streams'
//! channels wakes it. It forwards the payload without a query only when all
//! of these hold: the sender is the worker (`streams.worker_pid()`, see
//! docs/security.md), the topic names one stream, a privilege check no older
//! than `--poll-interval-ms` found the role may still read it, the payload
//! carries the data (not private, not truncated), and its `prev` (the
//! stream's previous event) is at or below the tail, so nothing of the
//! stream was missed. Anything else (a forged or unverified notification, a
//! gap, a private or truncated event, a pattern topic, a stale or failed
//! privilege check) makes the topic replay from its tail as its role
//! instead: one query for all of its clients, in which row-level security
//! decides. Only the worker's notifications to single-stream topics are
//! kept (within a byte bound); unverified ones merely mark the topic for a
//! replay, and such forced replays run at most once per poll interval, so
//! forged notifications cost neither memory nor more than that load.
//!
//! A timer replays every `--poll-interval-ms` too, which finds the first
//! events of streams a pattern had not met (their channels are LISTENed
//! from then on); it backs off up to `MAX_POLL` while the replays come back
//! empty. After a lost LISTEN connection every topic replays once it is
//! back. Topics are bounded by `--max-topics` (and `--max-topics-per-role`);
//! a topic closes `--topic-idle-ms` after its last client left, whatever
//! its poll backoff (the client that leaves wakes it), and lets go of its
//! channels (the last user of one UNLISTENs it).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Notify};
use tracing::{debug, info, warn};

use crate::db::{Server, Start};
use crate::error::ApiError;
use crate::event::{event_of, Event};
use crate::metrics;
use crate::pattern::Selector;
use litebase_streams_core::filters::EventFilter;
use litebase_streams_core::payload::decode_payload;

use super::{Hub, Note, Slot};

/// How often a topic checks that its role may still read its pattern (also
/// without traffic; with traffic a single-stream topic checks once per poll
/// interval before forwarding).
const PRIVILEGE_RECHECK: Duration = Duration::from_secs(10);
/// The longest a topic whose replays keep coming back empty waits between them.
const MAX_POLL: Duration = Duration::from_secs(10);
/// How far above the horizon its last replay saw a forwarded payload's
/// position may be (far more than can be published between two replays):
/// a payload beyond it would silence the topic, so a replay decides instead.
const MAX_FORWARD_JUMP: i64 = 1 << 40;

pub struct Topic {
    pub role: String,
    pub pattern: String,
    /// Only the events these filters keep (the database applies them).
    pub filter: EventFilter,
    /// The pattern and filters: what the hub knows the topic by.
    pub(super) key: String,
    /// The pattern as a JSON string, for WebSocket messages.
    pub pattern_json: String,
    pub(super) selector: Selector,
    pub(super) state: Mutex<TopicState>,
    pub(super) wake: Notify,
    init: tokio::sync::Mutex<bool>,
    /// Its task runs.
    pub(super) started: std::sync::atomic::AtomicBool,
    /// The streams whose channels this topic holds (listen.rs counts them).
    channels: tokio::sync::Mutex<std::collections::HashSet<String>>,
    /// When the last privilege check that found the role may read the
    /// pattern started; None after a failed or negative one.
    read_checked: Mutex<Option<Instant>>,
}

pub(super) struct TopicState {
    pub(super) tail: i64,
    /// The horizon of the topic's latest replay (or of its start).
    pub(super) horizon: i64,
    pub(super) clients: Vec<Slot>,
    /// The worker's notifications (single-stream topics only), and their bytes.
    pub(super) inbox: Vec<Note>,
    pub(super) inbox_bytes: usize,
    /// Replay soon: an unverified notification came (coalesced to one replay per poll interval).
    pub(super) force_replay: bool,
    /// Replay now: the worker notified a pattern topic, or the inbox overflowed.
    pub(super) replay_due: bool,
    pub(super) idle_since: Option<Instant>,
    pub(super) closed: bool,
}

enum Action {
    Drop,
    Forward(Arc<Event>),
    Replay,
}

impl Topic {
    pub(super) fn new(role: &str, pattern: &str, selector: Selector, filter: EventFilter) -> Topic {
        Topic {
            role: role.to_owned(),
            key: crate::pattern::topic_key(pattern, &filter),
            filter,
            pattern: pattern.to_owned(),
            pattern_json: serde_json::to_string(pattern).expect("a string serialises"),
            selector,
            state: Mutex::new(TopicState {
                tail: 0,
                horizon: 0,
                clients: Vec::new(),
                inbox: Vec::new(),
                inbox_bytes: 0,
                force_replay: false,
                replay_due: false,
                idle_since: None,
                closed: false,
            }),
            wake: Notify::new(),
            init: tokio::sync::Mutex::new(false),
            started: false.into(),
            channels: Default::default(),
            read_checked: Mutex::new(None),
        }
    }

    /// LISTEN on the topic's channels, set its tail to the horizon, start its task.
    pub(super) async fn ensure_started(self: &Arc<Topic>, hub: &Arc<Hub>) -> Result<(), ApiError> {
        let mut started = self.init.lock().await;
        if *started {
            return Ok(());
        }
        let (names, horizon) = match self.listen_channels(hub).await {
            Ok(found) => found,
            Err(e) => {
                // All or nothing: a later attempt starts from no channels.
                self.release_channels(hub).await;
                return Err(e);
            }
        };
        {
            let mut st = self.state.lock().unwrap();
            st.tail = horizon;
            st.horizon = horizon;
        }
        *started = true;
        self.started.store(true, Ordering::Relaxed);
        debug!(role = %self.role, pattern = %self.pattern, horizon, streams = names.len(), "topic started");
        tokio::spawn(self.clone().run(hub.clone()));
        Ok(())
    }

    /// The topic's channels (LISTENed on), its streams and the horizon.
    async fn listen_channels(&self, hub: &Hub) -> Result<(Vec<String>, i64), ApiError> {
        // For one stream: LISTEN before reading the horizon, so every event
        // above the tail is notified on a channel already listened to.
        if let Selector::Exact(name) = &self.selector {
            hub.listen(name).await?;
            self.channels.lock().await.insert(name.clone());
        }
        let (names, horizon) = hub.db.stream_names(&self.role, &self.selector).await?;
        if !matches!(self.selector, Selector::Exact(_)) {
            let mut channels = self.channels.lock().await;
            for name in &names {
                hub.listen(name).await?;
                channels.insert(name.clone());
            }
        }
        Ok((names, horizon))
    }

    /// Let go of every channel the topic holds.
    async fn release_channels(&self, hub: &Hub) {
        for channel in self.channels.lock().await.drain() {
            hub.unlisten(&channel);
        }
    }

    async fn run(self: Arc<Topic>, hub: Arc<Hub>) {
        let base = hub.cfg.poll_interval();
        // The safety-net poll: `wait` doubles while replays find nothing.
        let mut wait = base;
        let mut next_poll = Instant::now() + wait;
        let mut checked = Instant::now();
        let mut last_forced: Option<Instant> = None;
        loop {
            // Without clients it wakes to close, however far the next poll is.
            let wake_at = self.idle_until(&hub).map_or(next_poll, |close| close.min(next_poll));
            let slept = tokio::select! {
                _ = self.wake.notified() => false,
                _ = tokio::time::sleep_until(wake_at.into()) => true,
            };
            if slept && self.close_if_idle(&hub) {
                self.release_channels(&hub).await;
                return;
            }
            let ticked = slept && Instant::now() >= next_poll;
            if ticked && checked.elapsed() >= PRIVILEGE_RECHECK {
                checked = Instant::now();
                self.recheck_privileges(&hub).await;
            }
            // Forced replays (unverified notifications) at most once per poll interval.
            let force_ok = last_forced.is_none_or(|at| at.elapsed() >= base);
            let (notes, due, forced) = {
                let mut st = self.state.lock().unwrap();
                st.inbox_bytes = 0;
                let due = std::mem::take(&mut st.replay_due);
                let forced = st.force_replay && (force_ok || ticked || due);
                if forced {
                    st.force_replay = false;
                } else if st.force_replay {
                    next_poll = next_poll.min(last_forced.map_or(Instant::now(), |at| at + base));
                }
                (std::mem::take(&mut st.inbox), due, forced)
            };
            if forced {
                metrics::get().forced_replays.increment(1);
                last_forced = Some(Instant::now());
            }
            // A forward needs a recent privilege check: make one for a batch of notifications.
            if !notes.is_empty() && !self.read_checked_within(base) {
                checked = Instant::now();
                self.recheck_privileges(&hub).await;
            }
            let mut sent = 0;
            let mut replayed = false;
            if ticked || forced || due {
                replayed = true;
                sent += self.replay(&hub).await;
            }
            let active = sent > 0 || due || !notes.is_empty();
            for note in notes {
                match self.classify(&hub, &note, base) {
                    Action::Drop => {}
                    Action::Forward(event) => {
                        let mut st = self.state.lock().unwrap();
                        // A replay may have sent it already.
                        if event.position > st.tail {
                            self.fan_out(&hub, &mut st, &event);
                        }
                    }
                    // One replay covers every notification received before it.
                    Action::Replay if replayed => {}
                    Action::Replay => {
                        replayed = true;
                        self.replay(&hub).await;
                    }
                }
            }
            if active {
                wait = base;
                next_poll = next_poll.min(Instant::now() + base);
            }
            if ticked {
                if !active {
                    wait = (wait * 2).min(MAX_POLL.max(base));
                }
                next_poll = Instant::now() + wait;
            }
        }
    }

    /// When the topic is to close if no client comes: None while it has clients.
    fn idle_until(&self, hub: &Hub) -> Option<Instant> {
        let mut st = self.state.lock().unwrap();
        if !st.clients.is_empty() {
            return None;
        }
        Some(*st.idle_since.get_or_insert_with(Instant::now) + hub.cfg.topic_idle())
    }

    fn close_if_idle(self: &Arc<Topic>, hub: &Hub) -> bool {
        let mut topics = hub.topics.lock().unwrap();
        let mut st = self.state.lock().unwrap();
        if !st.clients.is_empty() {
            return false;
        }
        let since = *st.idle_since.get_or_insert_with(Instant::now);
        if since.elapsed() < hub.cfg.topic_idle() {
            return false;
        }
        st.closed = true;
        topics.remove(self);
        debug!(role = %self.role, pattern = %self.pattern, "topic dropped (no clients)");
        true
    }

    /// Revoked read grants end the live path at once: the topic's clients
    /// are disconnected and get 403 when they come back. Until a check
    /// succeeds again, nothing is forwarded without a replay.
    async fn recheck_privileges(&self, hub: &Hub) {
        metrics::get().privilege_checks.increment(1);
        let started = Instant::now();
        *self.read_checked.lock().unwrap() = None;
        let covered = match hub.db.read_grants(Server::Primary, &self.role).await {
            Ok((all, grants)) => all || self.selector.covered_by(&grants),
            Err(ApiError::Forbidden(_)) => false,
            Err(_) => return, // the database is away: replays decide until a check succeeds
        };
        if covered {
            *self.read_checked.lock().unwrap() = Some(started);
            return;
        }
        info!(role = %self.role, pattern = %self.pattern, "read privilege revoked: disconnecting the topic's clients");
        let mut st = self.state.lock().unwrap();
        for slot in st.clients.drain(..) {
            slot.kill.notify_one();
        }
    }

    /// Whether a privilege check that started at most `window` ago found the role may read the pattern.
    fn read_checked_within(&self, window: Duration) -> bool {
        self.read_checked.lock().unwrap().is_some_and(|at| at.elapsed() <= window)
    }

    fn classify(&self, hub: &Hub, note: &Note, fresh: Duration) -> Action {
        let worker = hub.worker_pid.load(Ordering::Relaxed);
        if worker == 0 || note.pid != worker {
            // Forged, or the worker restarted: never forwarded; a replay
            // (which also re-reads worker_pid()) decides.
            return Action::Replay;
        }
        if !self.read_checked_within(fresh) {
            // The role may have lost its read privilege: the replay, as the role, decides.
            return Action::Replay;
        }
        let Some(payload) = decode_payload(&note.payload) else {
            return Action::Replay;
        };
        let (tail, horizon) = {
            let st = self.state.lock().unwrap();
            (st.tail, st.horizon)
        };
        if payload.position <= tail {
            return Action::Drop;
        }
        if payload.position > horizon.saturating_add(MAX_FORWARD_JUMP) {
            return Action::Replay;
        }
        match &self.selector {
            // A filtered topic replays: the database decides what passes.
            Selector::Exact(name)
                if name == payload.stream
                    && payload.prev.is_some_and(|prev| prev <= tail)
                    && self.filter.is_empty() =>
            {
                event_of(&payload).map_or(Action::Replay, |e| Action::Forward(Arc::new(e)))
            }
            _ => Action::Replay,
        }
    }

    /// Replay from the tail as the topic's role, on the primary, and send
    /// what it returns; how many events it sent. On failure the next tick
    /// tries again.
    async fn replay(&self, hub: &Hub) -> usize {
        metrics::get().replays.increment(1);
        let mut sent = 0;
        loop {
            let tail = self.state.lock().unwrap().tail;
            let page = match hub
                .db
                // Pages of at most a client's byte budget: more would overflow every client anyway.
                .replay_page_bytes(
                    Server::Primary,
                    &self.role,
                    &self.pattern,
                    &Start::after(tail),
                    &self.filter,
                    None,
                    hub.cfg.page_size,
                    hub.cfg.client_buffer_bytes,
                )
                .await
            {
                Ok(page) => page,
                Err(e) => {
                    warn!(role = %self.role, pattern = %self.pattern, error = %e.message(), "replay failed; retrying at the next tick");
                    return sent;
                }
            };
            hub.note_worker_pid(page.worker_pid);
            hub.note_reader(&self.role);
            let short = !page.more;
            debug!(pattern = %self.pattern, tail, events = page.events.len(), horizon = page.horizon, "topic replay");
            if !matches!(self.selector, Selector::Exact(_)) {
                // Streams this pattern meets for the first time: their
                // notifications wake it from now on.
                let mut channels = self.channels.lock().await;
                for event in &page.events {
                    if !channels.contains(&event.stream) && hub.listen(&event.stream).await.is_ok() {
                        channels.insert(event.stream.clone());
                    }
                }
            }
            let mut st = self.state.lock().unwrap();
            for event in &page.events {
                if event.position > st.tail {
                    self.fan_out(hub, &mut st, event);
                    sent += 1;
                }
            }
            st.horizon = st.horizon.max(page.horizon);
            if short {
                st.tail = st.tail.max(page.horizon);
                return sent;
            }
        }
    }

    fn fan_out(&self, hub: &Hub, st: &mut TopicState, event: &Arc<Event>) {
        let size = event.sse.len();
        let budget = hub.cfg.client_buffer_bytes;
        let before = st.clients.len();
        st.clients.retain(|slot| {
            let queued = slot.queued.fetch_add(size, Ordering::Relaxed) + size;
            if queued > budget {
                debug!(client = slot.id, queued, budget, size, position = event.position, "over the byte budget");
                return overflow(slot);
            }
            match slot.tx.try_send(event.clone()) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    debug!(client = slot.id, queued, "queue full");
                    overflow(slot)
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            }
        });
        st.tail = event.position;
        if st.clients.is_empty() && before > 0 {
            st.idle_since = Some(Instant::now());
        }
    }

    /// Remove a client's slot (it disconnected). The last one to leave
    /// wakes the topic, which then closes `--topic-idle-ms` later unless a
    /// client came back meanwhile.
    pub fn unregister(&self, id: u64) {
        let mut st = self.state.lock().unwrap();
        st.clients.retain(|s| s.id != id);
        if st.clients.is_empty() {
            st.idle_since.get_or_insert_with(Instant::now);
            drop(st);
            self.wake.notify_one();
        }
    }
}

fn overflow(slot: &Slot) -> bool {
    metrics::get().slow_client_drops.increment(1);
    debug!(client = slot.id, "client buffer full: disconnecting it");
    slot.kill.notify_one();
    false
}
