//! The fan-out: one LISTEN connection for the whole gateway, and one topic
//! per (role, pattern) that clients subscribe to.
//!
//! Invariant (no gap, no duplicate): a topic has a `tail`, and it has sent
//! its clients every event of its pattern that its role may read and whose
//! position lies above the tail it had when they registered, in position
//! order, once. It moves the tail only by sending an event, or to the horizon
//! of a snapshot in which a replay from the tail came back short (every
//! matching event up to that horizon was then sent). A client registers
//! first, then catches up by replay until a short page from a snapshot whose
//! horizon reaches the tail it registered at; it forwards only positions
//! above the last one it sent. The two together miss nothing and repeat
//! nothing.
//!
//! The hub owns the topics (at most `--max-topics`, and at most
//! `--max-topics-per-role` of one role, so that one token holder cannot
//! take them all), the LISTEN connection
//! (listen.rs) and the worker's pid; each notification goes to the topics
//! whose pattern matches its channel (`Hub::dispatch`). How a topic learns
//! of events and sends them: hub/topic.rs.

mod topic;

use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Notify};

use crate::config::Config;
use crate::db::Db;
use crate::error::ApiError;
use crate::event::Event;
use crate::listen::{ListenRequest, Note, Notifications};
use crate::metrics;
use crate::pattern::Selector;

pub use topic::Topic;

/// Most bytes of notifications a topic keeps unread; past that it drops them and replays.
const INBOX_BYTES: usize = 1024 * 1024;

pub struct Hub {
    pub cfg: Config,
    pub db: Db,
    topics: Mutex<Topics>,
    listen: mpsc::UnboundedSender<crate::listen::ListenRequest>,
    /// The worker's pid as the last replay read it (0: not known yet).
    worker_pid: AtomicI32,
    pub listening: std::sync::atomic::AtomicBool,
    next_client: AtomicU64,
    /// The latest role that read something (/healthz may ask as it).
    pub last_role: Mutex<Option<String>>,
}

/// A client's place in a topic: its queue, the bytes in it, and how to cut
/// its connection when it falls behind.
#[derive(Clone)]
pub struct Slot {
    id: u64,
    tx: mpsc::Sender<Arc<Event>>,
    pub queued: Arc<AtomicUsize>,
    kill: Arc<Notify>,
}

/// The topics by (role, pattern), and how many each role holds.
#[derive(Default)]
struct Topics {
    by_key: HashMap<(String, String), Arc<Topic>>,
    per_role: HashMap<String, usize>,
}

impl Topics {
    fn insert(&mut self, key: (String, String), topic: Arc<Topic>) {
        *self.per_role.entry(key.0.clone()).or_default() += 1;
        self.by_key.insert(key, topic);
        metrics::get().topics.increment(1.0);
    }

    /// Remove `topic` if it is still the one under its key.
    fn remove(&mut self, topic: &Arc<Topic>) {
        let key = (topic.role.clone(), topic.key.clone());
        if !self.by_key.get(&key).is_some_and(|t| Arc::ptr_eq(t, topic)) {
            return;
        }
        self.by_key.remove(&key);
        if let Some(held) = self.per_role.get_mut(&key.0) {
            *held -= 1;
            if *held == 0 {
                self.per_role.remove(&key.0);
            }
        }
        metrics::get().topics.decrement(1.0);
    }

    /// Why a new topic for `role` may not open now, if it may not.
    fn refusal(&self, role: &str, cfg: &Config) -> Option<ApiError> {
        if self.by_key.len() >= cfg.max_topics {
            return Some(ApiError::unavailable(format!(
                "too many subscribed patterns: the gateway serves at most {} role and pattern pairs at once \
                 (--max-topics); retry later",
                cfg.max_topics
            )));
        }
        let cap = cfg.max_topics_per_role();
        if self.per_role.get(role).copied().unwrap_or(0) >= cap {
            return Some(ApiError::unavailable(format!(
                "too many subscribed patterns for role {role:?}: the gateway serves at most {cap} patterns of one \
                 role at once (--max-topics-per-role); retry once some of its subscriptions have ended"
            )));
        }
        None
    }
}

impl Hub {
    pub fn start(cfg: Config, db: Db) -> Arc<Hub> {
        let (hub, requests) = Hub::new(cfg, db);
        tokio::spawn(crate::listen::listener(hub.db.listen_config.clone(), hub.clone(), requests));
        let scraped = Arc::downgrade(&hub);
        metrics::add_section(move |out| {
            if let Some(hub) = scraped.upgrade() {
                metrics::topic_clients::write(out, hub.clients_by_pattern());
            }
        });
        hub
    }

    /// A hub whose LISTEN connection is not started: `start` runs it on the
    /// requests returned; tests keep the hub offline (its pools connect only
    /// when a query asks them to).
    pub fn new(cfg: Config, db: Db) -> (Arc<Hub>, mpsc::UnboundedReceiver<ListenRequest>) {
        let (listen, requests) = mpsc::unbounded_channel();
        let hub = Arc::new(Hub {
            cfg,
            db,
            topics: Mutex::new(Topics::default()),
            listen,
            worker_pid: AtomicI32::new(0),
            listening: false.into(),
            next_client: AtomicU64::new(1),
            last_role: Mutex::new(None),
        });
        (hub, requests)
    }

    /// A new client slot with its receiving end.
    pub fn slot(&self, kill: Arc<Notify>) -> (Slot, mpsc::Receiver<Arc<Event>>) {
        let (tx, rx) = mpsc::channel(self.cfg.client_buffer_events.max(1));
        let id = self.next_client.fetch_add(1, Ordering::Relaxed);
        (Slot { id, tx, queued: Arc::new(AtomicUsize::new(0)), kill }, rx)
    }

    /// Register `slot` with the topic of (role, pattern), creating it if
    /// needed; the topic's tail at registration.
    pub async fn register(
        self: &Arc<Hub>,
        role: &str,
        pattern: &str,
        selector: &Selector,
        filter: &litebase_streams_core::filters::EventFilter,
        slot: Slot,
    ) -> Result<(Arc<Topic>, i64), ApiError> {
        loop {
            let topic = {
                let mut topics = self.topics.lock().unwrap();
                let key = (role.to_owned(), crate::pattern::topic_key(pattern, filter));
                match topics.by_key.get(&key) {
                    Some(topic) => topic.clone(),
                    None => {
                        if let Some(refusal) = topics.refusal(role, &self.cfg) {
                            metrics::get().topic_limit_refusals.increment(1);
                            return Err(refusal);
                        }
                        let topic = Arc::new(Topic::new(role, pattern, selector.clone(), filter.clone()));
                        topics.insert(key, topic.clone());
                        topic
                    }
                }
            };
            if let Err(e) = topic.ensure_started(self).await {
                // Leave no topic behind that no task runs (its inbox would only grow).
                let mut topics = self.topics.lock().unwrap();
                if !topic.started.load(Ordering::Relaxed) {
                    topics.remove(&topic);
                }
                return Err(e);
            }
            let mut st = topic.state.lock().unwrap();
            if st.closed {
                continue; // dropped as idle meanwhile: take a new one
            }
            st.clients.push(slot);
            st.idle_since = None;
            let tail = st.tail;
            drop(st);
            return Ok((topic, tail));
        }
    }

    /// Take a reference on a channel, LISTENing on it if nobody holds it.
    /// Every `Ok` is to be matched by one `unlisten`.
    async fn listen(&self, channel: &str) -> Result<(), ApiError> {
        let (done, wait) = oneshot::channel();
        self.listen
            .send(ListenRequest::Acquire { channel: channel.to_owned(), done })
            .map_err(|_| ApiError::unavailable("the LISTEN connection is gone"))?;
        match tokio::time::timeout(Duration::from_secs(10), wait).await {
            Ok(Ok(())) => Ok(()),
            _ => {
                // The request may still complete: balance it (requests run in order).
                self.unlisten(channel);
                Err(ApiError::unavailable("database unavailable: LISTEN did not complete"))
            }
        }
    }

    /// Let go of a reference taken by `listen`.
    fn unlisten(&self, channel: &str) {
        let _ = self.listen.send(ListenRequest::Release { channel: channel.to_owned() });
    }

    /// A notification for the topics whose pattern matches its channel. Only
    /// the worker's (verified by the sender's pid) notifications to
    /// single-stream topics are kept; the rest only mark topics for a replay.
    pub fn dispatch(&self, channel: &str, note: Note) {
        metrics::get().notifications.increment(1);
        let worker = self.worker_pid.load(Ordering::Relaxed);
        let verified = worker != 0 && note.pid == worker;
        if !verified {
            // Forged, or the worker restarted: the topics replay instead.
            metrics::get().unverified_notifications.increment(1);
        }
        let topics = self.topics.lock().unwrap();
        for topic in topics.by_key.values().filter(|t| t.selector.matches(channel)) {
            let mut st = topic.state.lock().unwrap();
            if !verified {
                st.force_replay = true;
            } else if !matches!(topic.selector, Selector::Exact(_)) || !topic.filter.is_empty() {
                st.replay_due = true;
            } else if st.inbox_bytes + note.payload.len() > INBOX_BYTES {
                st.inbox.clear();
                st.inbox_bytes = 0;
                st.replay_due = true;
            } else {
                st.inbox_bytes += note.payload.len();
                st.inbox.push(Note { pid: note.pid, payload: note.payload.clone() });
            }
            drop(st);
            topic.wake.notify_one();
        }
    }

    /// Every topic replays from its tail (after the LISTEN connection was
    /// lost). The worker may have restarted meanwhile: its pid is trusted
    /// again only once a replay has read it.
    pub fn replay_all(&self) {
        self.worker_pid.store(0, Ordering::Relaxed);
        for topic in self.topics.lock().unwrap().by_key.values() {
            topic.state.lock().unwrap().force_replay = true;
            topic.wake.notify_one();
        }
    }

    /// Clients by topic pattern, summed over roles and filters (for
    /// /metrics: no role name leaves here).
    pub fn clients_by_pattern(&self) -> HashMap<String, usize> {
        let mut clients: HashMap<String, usize> = HashMap::new();
        for topic in self.topics.lock().unwrap().by_key.values() {
            let n = topic.state.lock().unwrap().clients.len();
            *clients.entry(topic.pattern.clone()).or_default() += n;
        }
        clients
    }

    /// A role that may read something (/healthz may ask as it).
    pub fn note_reader(&self, role: &str) {
        let mut last = self.last_role.lock().unwrap();
        if last.as_deref() != Some(role) {
            *last = Some(role.to_owned());
        }
    }

    /// The worker's pid as a replay read it; none (no worker runs) trusts no pid.
    fn note_worker_pid(&self, pid: Option<i32>) {
        self.worker_pid.store(pid.unwrap_or(0), Ordering::Relaxed);
    }
}

impl Slot {
    pub fn id(&self) -> u64 {
        self.id
    }
}

impl Notifications for Hub {
    fn dispatch(&self, channel: &str, note: Note) {
        Hub::dispatch(self, channel, note)
    }

    fn replay_all(&self) {
        Hub::replay_all(self)
    }

    fn set_listening(&self, listening: bool) {
        self.listening.store(listening, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn config(args: &[&str]) -> Config {
        crate::config::Cli::parse_from(std::iter::once("gateway").chain(args.iter().copied())).serve
    }

    #[test]
    fn the_per_role_cap_defaults_to_a_quarter_of_max_topics() {
        assert_eq!(config(&[]).max_topics_per_role(), 2500);
        assert_eq!(config(&["--max-topics", "20"]).max_topics_per_role(), 5);
        assert_eq!(config(&["--max-topics", "2"]).max_topics_per_role(), 1);
        assert_eq!(config(&["--max-topics", "20", "--max-topics-per-role", "20"]).max_topics_per_role(), 20);
    }

    #[test]
    fn a_role_at_its_cap_is_refused_and_others_are_not() {
        metrics::install();
        let cfg = config(&["--max-topics", "4", "--max-topics-per-role", "2"]);
        let mut topics = Topics::default();
        let open = |topics: &mut Topics, role: &str, pattern: &str| -> Result<Arc<Topic>, ApiError> {
            if let Some(refusal) = topics.refusal(role, &cfg) {
                return Err(refusal);
            }
            let topic =
                Arc::new(Topic::new(role, pattern, crate::pattern::parse(pattern).unwrap(), Default::default()));
            topics.insert((role.into(), pattern.into()), topic.clone());
            Ok(topic)
        };
        let first = open(&mut topics, "greedy", "pay.a").unwrap();
        open(&mut topics, "greedy", "pay.b").unwrap();
        let refused = open(&mut topics, "greedy", "pay.c").err().expect("a third topic of greedy is refused");
        assert_eq!(refused.status(), 503);
        assert!(refused.message().contains("--max-topics-per-role"), "{}", refused.message());
        open(&mut topics, "other", "pay.c").unwrap();
        // A closed topic makes room for its role again.
        topics.remove(&first);
        open(&mut topics, "greedy", "pay.c").unwrap();
        // The gateway-wide cap still holds, and says so.
        open(&mut topics, "third", "pay.a").unwrap();
        let refused = open(&mut topics, "fourth", "pay.a").err().expect("a fifth topic is refused");
        assert!(refused.message().contains("(--max-topics)"), "{}", refused.message());
    }
}
