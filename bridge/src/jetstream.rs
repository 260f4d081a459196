//! The JetStream [`Sink`]: connects (with backoff and reconnects), creates the
//! stream if absent, and publishes a batch with every message in flight at
//! once, then waits for their acknowledgements in order.

use std::time::Duration;

use async_nats::jetstream::{self, context::Publish, stream};
use async_nats::{ConnectOptions, HeaderMap};
use tracing::{info, warn};

use crate::config::{Config, Storage};
use crate::metrics;
use crate::sink::{Message, Sink, Stored};

pub struct JetStream {
    client: async_nats::Client,
    js: jetstream::Context,
    ack_timeout: Duration,
    /// The JetStream stream written to.
    stream: String,
    /// The bridge's subscription, as its messages' Litebase-Subscription says.
    subscription: String,
}

impl JetStream {
    /// Connect and make sure the stream exists (retrying until NATS answers).
    pub async fn connect(cfg: &Config) -> Result<JetStream, String> {
        let mut options = ConnectOptions::new()
            .name("litebase-streams-bridge")
            .retry_on_initial_connect()
            .connection_timeout(Duration::from_secs(5))
            .max_reconnects(None)
            .reconnect_delay_callback(|attempt| backoff(attempt as u32))
            .event_callback(|event| async move {
                match event {
                    async_nats::Event::Connected => info!("NATS connected"),
                    async_nats::Event::Disconnected => {
                        metrics::get().nats_reconnects.increment(1);
                        warn!("NATS disconnected; reconnecting")
                    }
                    other => info!("NATS: {other}"),
                }
            });
        if let Some(path) = &cfg.nats_creds {
            options =
                options.credentials_file(path).await.map_err(|e| format!("--nats-creds {}: {e}", path.display()))?;
        }
        if let (Some(user), Some(password)) = (&cfg.nats_user, &cfg.nats_password) {
            options = options.user_and_password(user.clone(), password.clone());
        }
        if let Some(token) = &cfg.nats_token {
            options = options.token(token.clone());
        }
        let servers: Vec<async_nats::ServerAddr> = cfg
            .nats_url
            .split(',')
            .map(|s| s.trim().parse().map_err(|e| format!("--nats-url {s:?}: {e}")))
            .collect::<Result<_, _>>()?;
        let client = options.connect(servers).await.map_err(|e| format!("NATS: {e}"))?;
        let mut js = jetstream::new(client.clone());
        js.set_timeout(cfg.ack_timeout());
        let sink = JetStream {
            client,
            js,
            ack_timeout: cfg.ack_timeout(),
            stream: cfg.jetstream_stream.clone(),
            subscription: crate::headers::defused(&cfg.subscription),
        };
        let mut attempt = 0;
        loop {
            match sink.ensure_stream(cfg).await {
                Ok(()) => return Ok(sink),
                Err(e) if attempt < 8 => {
                    attempt += 1;
                    warn!("JetStream stream {}: {e}; retrying", cfg.jetstream_stream);
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Err(e) => return Err(format!("JetStream stream {}: {e}", cfg.jetstream_stream)),
            }
        }
    }

    /// The NATS client (its connection state, for /healthz).
    pub fn client(&self) -> async_nats::Client {
        self.client.clone()
    }

    async fn ensure_stream(&self, cfg: &Config) -> Result<(), String> {
        if self.js.get_stream(&cfg.jetstream_stream).await.is_ok() {
            return Ok(());
        }
        let subjects = match &cfg.subjects {
            Some(list) => list.split(',').map(|s| s.trim().to_owned()).collect(),
            None => crate::subjects::for_pattern(cfg.subject_prefix.as_deref(), &cfg.pattern)?,
        };
        let config = stream::Config {
            name: cfg.jetstream_stream.clone(),
            subjects: subjects.clone(),
            num_replicas: cfg.replicas,
            storage: match cfg.storage {
                Storage::File => stream::StorageType::File,
                Storage::Memory => stream::StorageType::Memory,
            },
            duplicate_window: cfg.duplicate_window(),
            ..Default::default()
        };
        self.js.get_or_create_stream(config).await.map_err(|e| e.to_string())?;
        info!(stream = %cfg.jetstream_stream, ?subjects, replicas = cfg.replicas, "JetStream stream created");
        Ok(())
    }
}

/// The delay before reconnect attempt `n`: 100 ms doubling to 5 s.
pub fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(100u64.saturating_mul(1 << attempt.min(6))).min(Duration::from_secs(5))
}

/// Bytes of `message` as NATS counts them against max_payload: its payload
/// and its header block (`NATS/1.0`, a line per header, a blank line).
fn wire_size(message: &Message) -> usize {
    let line = |k: &str, v: &str| k.len() + v.len() + 4;
    12 + message.payload.len()
        + message.headers.iter().map(|(k, v)| line(k, v)).sum::<usize>()
        + message.event_headers.iter().map(|(k, v)| line(k, v)).sum::<usize>()
        + line("Nats-Msg-Id", &message.id)
        + line("Nats-Expected-Last-Msg-Id", &message.id)
}

/// What goes to NATS for an event larger than the server takes (max_payload,
/// 1 MiB by default): the same message id and Litebase-* headers (but
/// Litebase-Headers), no data, and `Litebase-Truncated: <bytes>`; a consumer
/// reads the event with `streams.get(position)`. Anything else would stop
/// the bridge at that event for good.
fn stand_in(message: &Message, bytes: usize) -> Message {
    let mut headers: Vec<(&'static str, String)> =
        message.headers.iter().filter(|(k, _)| *k != "Litebase-Headers").cloned().collect();
    headers.push(("Litebase-Truncated", bytes.to_string()));
    Message {
        position: message.position,
        subject: message.subject.clone(),
        id: message.id.clone(),
        headers,
        event_headers: Vec::new(),
        payload: bytes::Bytes::new(),
    }
}

fn headers_of(message: &Message) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in &message.event_headers {
        headers.insert(name.as_str(), value.as_str());
    }
    for (name, value) in &message.headers {
        headers.insert(*name, value.as_str());
    }
    headers
}

impl Sink for JetStream {
    async fn store(&mut self, messages: &[Message]) -> Stored {
        let mut pending = Vec::with_capacity(messages.len());
        let mut outcome = Stored::default();
        let max_payload = self.client.server_info().max_payload;
        for (i, message) in messages.iter().enumerate() {
            let size = wire_size(message);
            let truncated;
            let message = if max_payload > 0 && size > max_payload {
                warn!(position = message.position, bytes = size, max_payload, "larger than NATS takes: a stand-in");
                metrics::get().truncated.increment(1);
                truncated = stand_in(message, size);
                &truncated
            } else {
                message
            };
            let mut publish =
                Publish::build().payload(message.payload.clone()).headers(headers_of(message)).message_id(&message.id);
            // Each message after the first is stored only right after the one
            // before it: if one is lost (a connection drop, a leader change)
            // the ones after it are refused too, never stored out of order.
            if i > 0 {
                publish = publish.expected_last_message_id(&messages[i - 1].id);
            }
            match self.js.send_publish(message.subject.clone(), publish).await {
                Ok(ack) => pending.push(ack),
                Err(e) => {
                    outcome.error = Some(format!("publish: {e}"));
                    break;
                }
            }
        }
        for ack in pending {
            match tokio::time::timeout(self.ack_timeout, ack).await {
                Ok(Ok(ack)) => {
                    outcome.stored += 1;
                    outcome.duplicates += usize::from(ack.duplicate);
                }
                Ok(Err(e)) => {
                    outcome.error = Some(format!("acknowledgement: {e}"));
                    break;
                }
                Err(_) => {
                    outcome.error = Some("acknowledgement timed out".into());
                    break;
                }
            }
        }
        outcome
    }

    async fn last_stored(&mut self, log_id: &str) -> Option<i64> {
        let mut stream = self.js.get_stream(&self.stream).await.ok()?;
        let state = stream.info().await.ok()?.state.clone();
        if state.messages == 0 {
            return None;
        }
        let last = stream.get_raw_message(state.last_sequence).await.ok()?;
        let header = |name: &str| last.headers.get(name).map(|v| v.as_str().to_owned());
        let ours = header("Litebase-Log-Id").as_deref() == Some(log_id)
            && header("Litebase-Subscription").as_deref() == Some(self.subscription.as_str());
        let position = header("Litebase-Position")?.parse().ok()?;
        ours.then_some(position)
    }

    fn connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }
}
