//! The limits of the HTTP layer that keep one client, or many idle ones,
//! from holding the gateway's memory and file descriptors: every TCP
//! connection counts (not only SSE and WebSocket), headers must arrive in
//! time and fit a small buffer, idle keep-alive connections close, a write
//! that makes no progress fails, and a JSON page is cut at a byte size.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use clap::Args;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

#[derive(Args, Debug, Clone)]
pub struct Limits {
    /// Most TCP connections at once, of any kind (SSE, WebSocket, pages, publish, idle keep-alive); more get
    /// 503 and are closed. Keep it above --max-connections.
    #[arg(long, env = "LITEBASE_GATEWAY_MAX_TCP_CONNECTIONS", default_value_t = 25_000)]
    pub max_tcp_connections: usize,

    /// Seconds a client has to send a request's headers (also how long an idle keep-alive connection stays
    /// open between requests).
    #[arg(long, env = "LITEBASE_GATEWAY_HEADER_TIMEOUT", default_value_t = 10)]
    pub header_timeout_secs: u64,

    /// Seconds a client has to send a request's body (publish), once its token is accepted; more gets 408.
    #[arg(long, env = "LITEBASE_GATEWAY_BODY_TIMEOUT", default_value_t = 30)]
    pub body_timeout_secs: u64,

    /// Seconds a write to a client may make no progress (a client that stops reading) before its connection
    /// is closed.
    #[arg(long, env = "LITEBASE_GATEWAY_WRITE_TIMEOUT", default_value_t = 30)]
    pub write_timeout_secs: u64,

    /// Largest JSON page, in bytes: a page that would be larger is cut short (at least one event); the client
    /// asks for the next one after the last position it got.
    #[arg(long, env = "LITEBASE_GATEWAY_MAX_PAGE_BYTES", default_value_t = 4 * 1024 * 1024)]
    pub max_page_bytes: usize,
}

/// Largest request head (request line and headers) hyper buffers; more is 431.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;

impl Limits {
    pub fn header_timeout(&self) -> Duration {
        Duration::from_secs(self.header_timeout_secs.max(1))
    }

    pub fn body_timeout(&self) -> Duration {
        Duration::from_secs(self.body_timeout_secs.max(1))
    }

    pub fn write_timeout(&self) -> Duration {
        Duration::from_secs(self.write_timeout_secs.max(1))
    }
}

/// A socket whose writes fail with `TimedOut` when they make no progress for
/// `timeout` (the client stopped reading and every buffer is full). The
/// clock runs only while a write is pending and restarts on progress, so a
/// slow client that keeps reading is not cut.
pub struct WriteTimeout<S> {
    inner: S,
    timeout: Duration,
    sleep: Pin<Box<Sleep>>,
    armed: bool,
}

impl<S> WriteTimeout<S> {
    pub fn new(inner: S, timeout: Duration) -> WriteTimeout<S> {
        WriteTimeout { inner, timeout, sleep: Box::pin(tokio::time::sleep(timeout)), armed: false }
    }

    /// Pass a write's outcome through, starting the clock when it is pending
    /// and failing it when the clock has run out.
    fn watch<T>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match poll {
            Poll::Pending => {
                if !self.armed {
                    self.armed = true;
                    self.sleep.as_mut().reset(Instant::now() + self.timeout);
                }
                match self.sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "write timed out"))),
                    Poll::Pending => Poll::Pending,
                }
            }
            ready => {
                self.armed = false;
                ready
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteTimeout<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.watch(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.watch(cx, poll)
    }
}
