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
//! The hub owns the topics (at most `--max-topics`), the LISTEN connection
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
use crate::listen::ListenRequest;
use crate::metrics;
use crate::pattern::Selector;

pub use topic::Topic;

/// Most bytes of notifications a topic keeps unread; past that it drops them and replays.
const INBOX_BYTES: usize = 1024 * 1024;

pub struct Hub {
    pub cfg: Config,
    pub db: Db,
    topics: Mutex<HashMap<(String, String), Arc<Topic>>>,
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

pub struct Note {
    pub pid: i32,
    pub payload: String,
}

impl Hub {
    pub fn start(cfg: Config, db: Db) -> Arc<Hub> {
        let (listen, requests) = mpsc::unbounded_channel();
        let hub = Arc::new(Hub {
            cfg,
            db,
            topics: Mutex::new(HashMap::new()),
            listen,
            worker_pid: AtomicI32::new(0),
            listening: false.into(),
            next_client: AtomicU64::new(1),
            last_role: Mutex::new(None),
        });
        tokio::spawn(crate::listen::listener(hub.clone(), requests));
        hub
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
        slot: Slot,
    ) -> Result<(Arc<Topic>, i64), ApiError> {
        loop {
            let topic = {
                let mut topics = self.topics.lock().unwrap();
                let key = (role.to_owned(), pattern.to_owned());
                if !topics.contains_key(&key) && topics.len() >= self.cfg.max_topics {
                    metrics::get().topic_limit_refusals.increment(1);
                    return Err(ApiError::unavailable(format!(
                        "too many subscribed patterns: the gateway serves at most {} role and pattern pairs at once \
                         (--max-topics); retry later",
                        self.cfg.max_topics
                    )));
                }
                topics
                    .entry(key)
                    .or_insert_with(|| {
                        metrics::get().topics.increment(1.0);
                        Arc::new(Topic::new(role, pattern, selector.clone()))
                    })
                    .clone()
            };
            if let Err(e) = topic.ensure_started(self).await {
                // Leave no topic behind that no task runs (its inbox would only grow).
                let mut topics = self.topics.lock().unwrap();
                let key = (role.to_owned(), pattern.to_owned());
                if !topic.started.load(Ordering::Relaxed) && topics.get(&key).is_some_and(|t| Arc::ptr_eq(t, &topic)) {
                    topics.remove(&key);
                    metrics::get().topics.decrement(1.0);
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
        for topic in topics.values().filter(|t| t.selector.matches(channel)) {
            let mut st = topic.state.lock().unwrap();
            if !verified {
                st.force_replay = true;
            } else if !matches!(topic.selector, Selector::Exact(_)) {
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
        for topic in self.topics.lock().unwrap().values() {
            topic.state.lock().unwrap().force_replay = true;
            topic.wake.notify_one();
        }
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
