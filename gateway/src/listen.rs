//! The gateway's one LISTEN connection: LISTENs on the channels topics ask
//! for, hands every notification (channel, sender pid, payload) to the hub,
//! and after a lost connection reconnects with backoff, LISTENs again on
//! every channel, and has every topic replay from its tail (nothing sent
//! while it was away is lost: the replays find it).
//!
//! Channels are counted: each topic that uses one holds a reference, and the
//! last one to let go UNLISTENs it (every LISTENed channel costs the server
//! a look at each notification of the database). Requests are handled in
//! the order they were sent, so a release never overtakes its acquire.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::{AsyncMessage, NoTls};
use tracing::{info, warn};

use crate::metrics;

/// One notification: the sending process and its payload.
pub struct Note {
    pub pid: i32,
    pub payload: String,
}

/// Where the listener hands what it receives (the hub).
pub trait Notifications: Send + Sync + 'static {
    /// A notification arrived on `channel`.
    fn dispatch(&self, channel: &str, note: Note);
    /// The connection was lost and is back: notifications may be missing.
    fn replay_all(&self);
    /// Whether the connection is up and listening (for /healthz).
    fn set_listening(&self, listening: bool);
}

pub enum ListenRequest {
    /// Take a reference on a channel (LISTEN on it if it is the first); `done` once it is listened to.
    Acquire { channel: String, done: oneshot::Sender<()> },
    /// Let go of a reference taken by `Acquire` (UNLISTEN if it was the last).
    Release { channel: String },
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Runs for the gateway's lifetime.
pub async fn listener<H: Notifications>(
    config: tokio_postgres::Config,
    hub: Arc<H>,
    mut requests: mpsc::UnboundedReceiver<ListenRequest>,
) {
    // Channel -> the topics that hold it.
    let mut channels: HashMap<String, usize> = HashMap::new();
    let mut waiting: VecDeque<ListenRequest> = VecDeque::new();
    let mut backoff = Duration::from_millis(100);
    let mut connected_before = false;
    loop {
        let (client, mut connection) = match config.connect(NoTls).await {
            Ok(pair) => pair,
            Err(e) => {
                warn!(error = %e, "LISTEN connection failed; retrying in {backoff:?}");
                // Keep taking requests while away; they are answered once connected.
                let sleep = tokio::time::sleep(backoff);
                tokio::pin!(sleep);
                loop {
                    tokio::select! {
                        _ = &mut sleep => break,
                        Some(req) = requests.recv() => waiting.push_back(req),
                    }
                }
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        // The connection's task hands each notification to the hub as it
        // reads it (no queue in between: a flood waits in the server's
        // queue, not in the gateway's memory), and keeps the connection
        // going for the LISTEN commands below.
        let driver_hub = hub.clone();
        let mut driver = tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(message) = messages.next().await {
                match message {
                    Ok(AsyncMessage::Notification(n)) => {
                        driver_hub.dispatch(n.channel(), Note { pid: n.process_id(), payload: n.payload().to_owned() });
                    }
                    Ok(_) => {}
                    Err(e) => {
                        warn!(error = %e, "LISTEN connection lost");
                        break;
                    }
                }
            }
        });
        let mut ok = true;
        for channel in channels.keys() {
            if let Err(e) = client.batch_execute(&format!("LISTEN {}", quote_ident(channel))).await {
                warn!(error = %e, "LISTEN failed");
                ok = false;
                break;
            }
        }
        if ok {
            backoff = Duration::from_millis(100);
            hub.set_listening(true);
            if connected_before {
                metrics::get().listen_reconnects.increment(1);
                info!(channels = channels.len(), "LISTEN connection re-established; every topic replays");
                hub.replay_all();
            }
            connected_before = true;
            'connected: loop {
                let request = match waiting.pop_front() {
                    Some(r) => r,
                    None => tokio::select! {
                        req = requests.recv() => match req { Some(r) => r, None => return },
                        _ = &mut driver => break 'connected,
                    },
                };
                match request {
                    ListenRequest::Acquire { channel, done } => {
                        if !channels.contains_key(&channel) {
                            if let Err(e) = client.batch_execute(&format!("LISTEN {}", quote_ident(&channel))).await {
                                warn!(error = %e, "LISTEN failed");
                                waiting.push_front(ListenRequest::Acquire { channel, done });
                                break 'connected;
                            }
                        }
                        *channels.entry(channel).or_insert(0) += 1;
                        metrics::get().listen_channels.set(channels.len() as f64);
                        let _ = done.send(());
                    }
                    ListenRequest::Release { channel } => {
                        let Some(count) = channels.get_mut(&channel) else { continue };
                        *count -= 1;
                        if *count == 0 {
                            channels.remove(&channel);
                            metrics::get().listen_channels.set(channels.len() as f64);
                            // On failure the connection is gone, and the channel is not LISTENed again.
                            if let Err(e) = client.batch_execute(&format!("UNLISTEN {}", quote_ident(&channel))).await {
                                warn!(error = %e, "UNLISTEN failed");
                                break 'connected;
                            }
                        }
                    }
                }
            }
        }
        hub.set_listening(false);
        driver.abort();
        tokio::time::sleep(backoff).await;
    }
}
