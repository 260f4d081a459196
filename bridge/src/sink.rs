//! Where events go: a [`Sink`] stores a batch of messages in order and says
//! how many of them, from the first, it stored for sure. The bridge acks the
//! subscription only through those. JetStream ([`crate::jetstream`]) is the
//! one implementation; a Kafka sink would be a second one (an idempotent
//! producer, the message id as the record key's dedup, `acks=all`), see
//! docs/scaling.md.

use bytes::Bytes;

/// One event, ready to publish.
#[derive(Debug, Clone)]
pub struct Message {
    pub position: i64,
    pub subject: String,
    /// `<log_id>:<position>`: the same for every delivery of the event.
    pub id: String,
    pub headers: Vec<(&'static str, String)>,
    /// The envelope's own headers, copied as they are where NATS can carry them.
    pub event_headers: Vec<(String, String)>,
    pub payload: Bytes,
}

impl Message {
    /// Bytes held for it (payload and headers).
    pub fn size(&self) -> usize {
        self.payload.len()
            + self.subject.len()
            + self.id.len()
            + self.headers.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
            + self.event_headers.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
    }
}

/// What a [`Sink::store`] achieved.
#[derive(Debug, Default)]
pub struct Stored {
    /// Messages, from the first, stored for sure (new or already there).
    pub stored: usize,
    /// Of those, how many the sink already had (a delivery again after a crash).
    pub duplicates: usize,
    /// Why it stopped before the end, if it did.
    pub error: Option<String>,
}

pub trait Sink {
    /// Store `messages` in their order.
    fn store(&mut self, messages: &[Message]) -> impl std::future::Future<Output = Stored> + Send;

    /// The position of the newest message the sink holds from this bridge's
    /// subscription of log `log_id`, if it can tell (None: nothing, another
    /// writer's message, or no answer). A window delivered again skips what
    /// it holds instead of counting on the sink's duplicate detection, which
    /// lasts a limited time.
    fn last_stored(&mut self, log_id: &str) -> impl std::future::Future<Output = Option<i64>> + Send;

    /// Whether it is connected (a retry waits for it).
    fn connected(&self) -> bool;
}
