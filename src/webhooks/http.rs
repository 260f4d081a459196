//! The HTTP side of webhooks: signing (Standard Webhooks) and sending, on
//! threads of the webhook worker that never touch PostgreSQL.
//!
//! Each request runs on a thread of its own, so a slow or dead endpoint
//! holds only its own thread; the worker's main thread collects outcomes
//! from a channel. A finished thread sends SIGUSR1 to its own process:
//! PostgreSQL's handler sets the worker's latch, which ends its wait at
//! once (threads must not call PostgreSQL functions, SetLatch included).
//! The threads block every signal, so PostgreSQL's handlers keep running
//! on the main thread only.
//!
//! Limits: connect, read and write timeouts and an overall deadline
//! (`litebase_streams.webhook_timeout`), no redirects, no proxy from the
//! environment, and at most [`MAX_RESPONSE_READ`] bytes of a response body
//! read (and thrown away: only the status counts).

use std::io::Read;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use litebase_streams_core::hosts::Allowed;
use litebase_streams_core::signing::sign;

/// The most bytes of a response body read (so that the connection can be
/// reused); the rest is left unread and the connection dropped.
const MAX_RESPONSE_READ: u64 = 64 * 1024;

/// One POST to make.
pub struct Request {
    /// The webhook (its subscription id).
    pub webhook: i32,
    /// The position of the last event in the body.
    pub last: i64,
    /// The subscription's position when the body was read.
    pub after: i64,
    pub url: String,
    /// The `webhook-id` header.
    pub id: String,
    /// The signing key: the secret's bytes after `whsec_`, base64-decoded.
    pub key: Vec<u8>,
    pub body: Vec<u8>,
}

/// What became of a request.
pub struct Outcome {
    pub webhook: i32,
    pub last: i64,
    pub after: i64,
    /// The response status, if a response came.
    pub status: Option<u16>,
    /// Why the request failed (None: a 2xx).
    pub error: Option<String>,
}

impl Outcome {
    pub fn delivered(&self) -> bool {
        self.error.is_none()
    }

    pub fn gone(&self) -> bool {
        self.status == Some(410)
    }
}

/// Sends requests on threads and hands back their outcomes.
pub struct Sender {
    agent: ureq::Agent,
    done_tx: mpsc::Sender<Outcome>,
    done_rx: mpsc::Receiver<Outcome>,
    refused_tx: mpsc::Sender<String>,
    refused_rx: mpsc::Receiver<String>,
}

impl Sender {
    pub fn new(timeout: Duration, allowed: Allowed) -> Sender {
        let (done_tx, done_rx) = mpsc::channel();
        let (refused_tx, refused_rx) = mpsc::channel();
        Sender { agent: agent(timeout, allowed, refused_tx.clone()), done_tx, done_rx, refused_tx, refused_rx }
    }

    /// New settings: requests from now on use them.
    pub fn reconfigure(&mut self, timeout: Duration, allowed: Allowed) {
        self.agent = agent(timeout, allowed, self.refused_tx.clone());
    }

    /// What the address policy refused since the last call, with the
    /// addresses: for the server's log only. The webhook's owner learns only
    /// that the host's addresses are not allowed (`last_error`), never how an
    /// internal name resolves.
    pub fn refused(&self) -> Vec<String> {
        self.refused_rx.try_iter().collect()
    }

    /// Start sending `request`; its outcome arrives through [`Sender::finished`].
    /// An error means no thread could be started: nothing was sent.
    pub fn send(&self, request: Request) -> Result<(), String> {
        let agent = self.agent.clone();
        let done = self.done_tx.clone();
        let spawned = with_signals_blocked(|| {
            std::thread::Builder::new().name("litebase_streams webhook".into()).spawn(move || {
                let (status, error) = post(&agent, &request);
                let outcome =
                    Outcome { webhook: request.webhook, last: request.last, after: request.after, status, error };
                drop(request);
                if done.send(outcome).is_ok() {
                    wake_main_thread();
                }
            })
        });
        spawned.map(drop).map_err(|e| format!("no thread to send the request: {e}"))
    }

    /// The outcomes that arrived since the last call.
    pub fn finished(&self) -> Vec<Outcome> {
        self.done_rx.try_iter().collect()
    }
}

fn agent(timeout: Duration, allowed: Allowed, refused: mpsc::Sender<String>) -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout_connect(timeout)
        .timeout_read(timeout)
        .timeout_write(timeout)
        .timeout(timeout)
        .redirects(0)
        .user_agent(concat!("litebase_streams/", env!("CARGO_PKG_VERSION")))
        .resolver(PolicyResolver { allowed: Arc::new(allowed), refused: std::sync::Mutex::new(refused) })
        .build()
}

/// Resolves host names and keeps only the addresses the policy allows; the
/// client connects to nothing else. A refusal names the addresses only on
/// `refused`, for the server's log (see [`Sender::refused`]).
struct PolicyResolver {
    allowed: Arc<Allowed>,
    refused: std::sync::Mutex<mpsc::Sender<String>>,
}

impl ureq::Resolver for PolicyResolver {
    fn resolve(&self, netloc: &str) -> std::io::Result<Vec<SocketAddr>> {
        let host = netloc.rsplit_once(':').map_or(netloc, |(host, _)| host);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let found: Vec<SocketAddr> = netloc.to_socket_addrs()?.collect();
        let (allowed, refused): (Vec<SocketAddr>, Vec<SocketAddr>) =
            found.into_iter().partition(|addr| self.allowed.permits(host, addr.ip()));
        if allowed.is_empty() && !refused.is_empty() {
            let addresses: Vec<String> = refused.iter().map(|a| a.ip().to_string()).collect();
            if let Ok(log) = self.refused.lock() {
                let _ = log.send(format!("{host} resolves to {}", addresses.join(", ")));
            }
            return Err(std::io::Error::new(std::io::ErrorKind::PermissionDenied, refused_message(host)));
        }
        Ok(allowed)
    }
}

/// What the webhook's owner reads when the address policy refuses `host`.
fn refused_message(host: &str) -> String {
    format!(
        "{host}: the address it resolves to is not allowed (not a public address and not in \
         litebase_streams.webhook_allowed_hosts); the server log names it"
    )
}

/// POST the request; (status, error), error None for a 2xx.
fn post(agent: &ureq::Agent, request: &Request) -> (Option<u16>, Option<String>) {
    let timestamp =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()).to_string();
    let signature = sign(&request.key, &request.id, &timestamp, &request.body);
    let response = agent
        .post(&request.url)
        .set("content-type", "application/json")
        .set("webhook-id", &request.id)
        .set("webhook-timestamp", &timestamp)
        .set("webhook-signature", &signature)
        .send_bytes(&request.body);
    match response {
        Ok(response) => {
            let status = response.status();
            discard_body(response);
            let error = (!(200..300).contains(&status)).then(|| format!("the endpoint answered HTTP {status}"));
            (Some(status), error)
        }
        Err(ureq::Error::Status(status, response)) => {
            let reason = response.status_text().to_owned();
            discard_body(response);
            (Some(status), Some(format!("the endpoint answered HTTP {status} {reason}").trim_end().to_owned()))
        }
        Err(ureq::Error::Transport(transport)) => (None, Some(transport.to_string())),
    }
}

fn discard_body(response: ureq::Response) {
    let _ = std::io::copy(&mut response.into_reader().take(MAX_RESPONSE_READ), &mut std::io::sink());
}

/// Run `body` (which starts a thread) with every signal blocked, so that
/// the thread inherits the blocked mask; restore the mask afterwards.
fn with_signals_blocked<R>(body: impl FnOnce() -> R) -> R {
    // SAFETY: plain libc calls on a local sigset_t; pthread_sigmask changes only the calling
    // thread's mask, restored below before anything else runs on it.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut saved: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut saved);
        let result = body();
        libc::pthread_sigmask(libc::SIG_SETMASK, &saved, std::ptr::null_mut());
        result
    }
}

/// Set the worker's latch from a sending thread: SIGUSR1 to our own
/// process, which only the main thread accepts; PostgreSQL's handler sets
/// the latch.
fn wake_main_thread() {
    // SAFETY: kill(2) on our own pid; async-signal-safe and thread-safe.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGUSR1);
    }
}
