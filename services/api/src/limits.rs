//! What one client may hold of the API: how long it may take to send a
//! request's headers (and, on a kept-alive connection, to start the next
//! request), how long to send its body, how large the body may be, and how
//! many connections the API keeps open at once. At the limit a new
//! connection takes the slot of the oldest one that has sent nothing yet,
//! or is closed at once when every open one has spoken, so idle clients
//! cannot use up the process's file descriptors (its NATS connection needs
//! some) nor lock out `/api/health`; an idle one is closed after the header
//! timeout anyway.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum_server::accept::Accept;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Largest request body: a playbook at the 4 MiB limit, base64-encoded.
pub const MAX_BODY: usize = 6 * 1024 * 1024;

/// Default [`Limits::max_connections`].
pub const MAX_CONNECTIONS: usize = 512;

/// Default [`Limits::header_timeout`].
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// The limits of one API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Open connections at most; one more takes the slot of the oldest
    /// silent one, or is closed at once.
    pub max_connections: usize,
    /// A connection's first request must arrive, and each request's
    /// headers be read, within this; a kept-alive connection idle this
    /// long is closed.
    pub header_timeout: Duration,
    /// A request body must arrive within this (else 408).
    pub body_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: MAX_CONNECTIONS,
            header_timeout: HEADER_TIMEOUT,
            body_timeout: crate::extract::BODY_TIMEOUT,
        }
    }
}

/// Why a declared body is refused before it is read: over `max` bytes.
pub fn body_too_large(declared: Option<u64>, max: usize) -> Option<String> {
    match declared {
        Some(n) if n > max as u64 => Some(format!(
            "the request body of {n} bytes is over the {} MiB limit",
            max / (1024 * 1024)
        )),
        _ => None,
    }
}

/// An acceptor that holds one of a fixed number of slots per connection
/// (the slot goes back when the connection closes). A connection that
/// finds none takes the slot of the oldest connection that has sent
/// nothing yet (that one is closed), so clients that connect and stay
/// silent cannot lock others out; when every slot is held by a connection
/// that has sent something, the new one is closed at once.
#[derive(Clone)]
pub struct Slots<A> {
    inner: A,
    free: Arc<Semaphore>,
    silent: Arc<Mutex<VecDeque<Weak<Conn>>>>,
}

/// What the acceptor knows of one open connection.
#[derive(Default)]
pub struct Conn {
    /// It has sent a byte.
    spoke: AtomicBool,
    /// Closed to give its slot to a newer connection.
    evicted: AtomicBool,
    /// Woken to see the eviction.
    waker: Mutex<Option<Waker>>,
}

/// How long a new connection waits for an evicted one to give its slot.
const EVICTION_WAIT: Duration = Duration::from_secs(1);

impl<A> Slots<A> {
    /// `max` slots in front of `inner`.
    pub fn new(inner: A, max: usize) -> Self {
        Self {
            inner,
            free: Arc::new(Semaphore::new(max.max(1))),
            silent: Default::default(),
        }
    }
}

/// Close the oldest open connection that has sent nothing: true when one
/// was found. Connections closed or heard from leave the queue.
fn evict_oldest_silent(silent: &Mutex<VecDeque<Weak<Conn>>>) -> bool {
    let mut queue = silent.lock().unwrap_or_else(|p| p.into_inner());
    while let Some(weak) = queue.pop_front() {
        let Some(conn) = weak.upgrade() else { continue };
        if conn.spoke.load(Ordering::Acquire) {
            continue;
        }
        conn.evicted.store(true, Ordering::Release);
        if let Some(w) = conn.waker.lock().unwrap_or_else(|p| p.into_inner()).take() {
            w.wake();
        }
        return true;
    }
    false
}

/// Remember a new connection as silent (and forget, from the front,
/// those closed or heard from).
fn remember(silent: &Mutex<VecDeque<Weak<Conn>>>, conn: &Arc<Conn>) {
    let mut queue = silent.lock().unwrap_or_else(|p| p.into_inner());
    while queue
        .front()
        .is_some_and(|w| w.upgrade().is_none_or(|c| c.spoke.load(Ordering::Acquire)))
    {
        queue.pop_front();
    }
    queue.push_back(Arc::downgrade(conn));
}

/// A slot for a new connection: a free one, or one an evicted silent
/// connection gives back.
async fn slot(
    free: Arc<Semaphore>,
    silent: &Mutex<VecDeque<Weak<Conn>>>,
) -> Option<OwnedSemaphorePermit> {
    if let Ok(s) = free.clone().try_acquire_owned() {
        return Some(s);
    }
    if !evict_oldest_silent(silent) {
        return None;
    }
    tokio::time::timeout(EVICTION_WAIT, free.acquire_owned())
        .await
        .ok()
        .and_then(Result::ok)
}

impl<A, I, S> Accept<I, S> for Slots<A>
where
    A: Accept<I, S> + Clone + Send + Sync + 'static,
    A::Future: Send,
    I: Send + 'static,
    S: Send + 'static,
{
    type Stream = Held<A::Stream>;
    type Service = A::Service;
    type Future = Pin<
        Box<dyn std::future::Future<Output = io::Result<(Self::Stream, Self::Service)>> + Send>,
    >;

    fn accept(&self, stream: I, service: S) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let Some(permit) = slot(this.free.clone(), &this.silent).await else {
                tracing::warn!(
                    target: "noetl_api::access",
                    "connection closed at once: the API holds its maximum of open connections, each of them heard from"
                );
                return Err(io::Error::other("connection limit reached"));
            };
            let conn = Arc::new(Conn::default());
            remember(&this.silent, &conn);
            let (stream, service) = this.inner.accept(stream, service).await?;
            Ok((
                Held {
                    inner: stream,
                    _slot: permit,
                    conn,
                },
                service,
            ))
        })
    }
}

/// A connection holding its slot.
pub struct Held<T> {
    inner: T,
    _slot: OwnedSemaphorePermit,
    conn: Arc<Conn>,
}

impl<T> Held<T> {
    /// An error when the connection was evicted (its waker kept to be told
    /// otherwise).
    fn evicted(&self, cx: &Context<'_>) -> Option<io::Error> {
        if self.conn.evicted.load(Ordering::Acquire) {
            return Some(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed to give its slot to a newer connection",
            ));
        }
        if !self.conn.spoke.load(Ordering::Acquire) {
            *self.conn.waker.lock().unwrap_or_else(|p| p.into_inner()) = Some(cx.waker().clone());
        }
        None
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Held<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(e) = self.evicted(cx) {
            return Poll::Ready(Err(e));
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.conn.spoke.store(true, Ordering::Release);
        }
        read
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Held<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.evicted(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.evicted(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_silent_connection_is_evicted_and_one_heard_from_is_not() {
        let silent = Mutex::new(VecDeque::new());
        let (a, b, c) = (
            Arc::new(Conn::default()),
            Arc::new(Conn::default()),
            Arc::new(Conn::default()),
        );
        remember(&silent, &a);
        remember(&silent, &b);
        remember(&silent, &c);
        a.spoke.store(true, Ordering::Release);
        assert!(evict_oldest_silent(&silent));
        assert!(!a.evicted.load(Ordering::Acquire), "it has spoken");
        assert!(b.evicted.load(Ordering::Acquire), "the oldest silent one");
        drop(c);
        assert!(
            !evict_oldest_silent(&silent),
            "none left: the new one is refused"
        );
    }

    #[test]
    fn a_declared_body_over_the_limit_is_refused_before_it_is_read() {
        let max = 6 * 1024 * 1024;
        assert_eq!(body_too_large(None, max), None);
        assert_eq!(body_too_large(Some(max as u64), max), None);
        let e = body_too_large(Some(10_000_000), max).unwrap();
        assert!(e.contains("10000000 bytes") && e.contains("6 MiB"), "{e}");
    }
}
