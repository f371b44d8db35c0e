//! What one client may hold of the API: how long it may take to send a
//! request's headers (and, on a kept-alive connection, to start the next
//! request), how long to send its body, how large the body may be, and how
//! many connections the API keeps open at once. At the limit a new
//! connection takes the slot of the oldest one that has sent nothing yet
//! (once past a short grace after it was accepted), or is closed at once
//! when every open one has spoken, so idle clients
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
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

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
pub struct Conn {
    /// When it was accepted.
    since: Instant,
    /// It has sent a byte.
    spoke: AtomicBool,
    /// Closed to give its slot to a newer connection.
    evicted: AtomicBool,
    /// Woken to see the eviction.
    waker: Mutex<Option<Waker>>,
    /// Told of the eviction while it still waits for a slot.
    evicted_waiting: Notify,
}

impl Conn {
    /// A connection accepted now.
    fn new() -> Self {
        Self {
            since: Instant::now(),
            spoke: AtomicBool::new(false),
            evicted: AtomicBool::new(false),
            waker: Mutex::new(None),
            evicted_waiting: Notify::new(),
        }
    }
}

/// How long a new connection waits for an evicted one to give its slot.
const EVICTION_WAIT: Duration = Duration::from_secs(1);

/// How long a connection is safe from eviction after it is accepted: the
/// time a client needs to send its request, and the server to read it, on
/// a loaded machine. Without it a burst of silent connections accepted
/// just after a real client's (the server accepts in parallel) could
/// evict it before its first bytes are read.
const GRACE: Duration = Duration::from_millis(250);

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

/// What [`evict_oldest_silent`] found.
#[derive(Debug, PartialEq, Eq)]
enum Evict {
    /// The oldest silent connection was closed.
    Evicted,
    /// The oldest silent connection is still within its grace: ask again
    /// after this long.
    Wait(Duration),
    /// No other open connection is silent.
    None,
}

/// Close the oldest open connection other than `me` that has sent
/// nothing, once it is past its [`GRACE`]. Connections closed or heard
/// from leave the queue.
fn evict_oldest_silent(
    silent: &Mutex<VecDeque<Weak<Conn>>>,
    me: &Arc<Conn>,
    now: Instant,
) -> Evict {
    let mut queue = silent.lock().unwrap_or_else(|p| p.into_inner());
    queue.retain(|w| {
        w.upgrade()
            .is_some_and(|c| !c.spoke.load(Ordering::Acquire) && !c.evicted.load(Ordering::Acquire))
    });
    let Some(at) = queue
        .iter()
        .position(|w| w.upgrade().is_some_and(|c| !Arc::ptr_eq(&c, me)))
    else {
        return Evict::None;
    };
    let Some(conn) = queue[at].upgrade() else {
        return Evict::None;
    };
    let age = now.saturating_duration_since(conn.since);
    if age < GRACE {
        return Evict::Wait(GRACE - age);
    }
    queue.remove(at);
    conn.evicted.store(true, Ordering::Release);
    if let Some(w) = conn.waker.lock().unwrap_or_else(|p| p.into_inner()).take() {
        w.wake();
    }
    conn.evicted_waiting.notify_one();
    Evict::Evicted
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

/// A stream whose first bytes can be awaited without reading them.
pub trait Readable {
    /// Ready once bytes have arrived (an error when the peer closed
    /// first). Peeks: what arrived is left for the server to read.
    fn bytes_arrived(&self) -> impl std::future::Future<Output = io::Result<()>> + Send + '_;
}

impl Readable for tokio::net::TcpStream {
    // Not `readable()`: its readiness may be a false positive (a new
    // registration reports ready), and a silent client would pass.
    async fn bytes_arrived(&self) -> io::Result<()> {
        let mut one = [0u8; 1];
        match self.peek(&mut one).await? {
            0 => Err(io::ErrorKind::UnexpectedEof.into()),
            _ => Ok(()),
        }
    }
}

/// A slot for a new connection `conn`: a free one, or the one the silent
/// connection it evicts gives back; `None` when every open connection has
/// spoken (or this one was evicted in turn while it waited). `heard`
/// completes when the connection's first bytes arrive.
///
/// Each new connection evicts exactly one before it waits for a slot, and
/// only those that evicted wait for one, so the slots given back match
/// the connections waiting for them. A connection that evicted counts as
/// silent from then on (a still newer one may evict it in turn, its claim
/// passing on): were it remembered only once it holds its slot, a burst
/// of new connections would find the queue emptied by the evictions ahead
/// of it and be closed at once although every open connection is silent.
/// Its request arriving while it waits makes it a client, not evicted.
async fn slot(
    free: Arc<Semaphore>,
    silent: &Mutex<VecDeque<Weak<Conn>>>,
    conn: &Arc<Conn>,
    heard: impl std::future::Future<Output = io::Result<()>>,
) -> Option<OwnedSemaphorePermit> {
    if let Ok(s) = free.clone().try_acquire_owned() {
        remember(silent, conn);
        return Some(s);
    }
    let deadline = Instant::now() + GRACE + EVICTION_WAIT;
    let mut heard = std::pin::pin!(heard);
    let mut listening = true;
    let on_heard = |r: io::Result<()>, listening: &mut bool| {
        *listening = false;
        if r.is_ok() {
            conn.spoke.store(true, Ordering::Release);
        }
    };
    // Find the connection to evict (the oldest silent one may still be
    // within its grace).
    loop {
        let now = Instant::now();
        let wait = match evict_oldest_silent(silent, conn, now) {
            Evict::Evicted => break,
            Evict::None => return None,
            Evict::Wait(d) => d.min(deadline.saturating_duration_since(now)),
        };
        if wait.is_zero() {
            return None;
        }
        tokio::select! {
            r = &mut heard, if listening => on_heard(r, &mut listening),
            () = tokio::time::sleep(wait) => {}
        }
    }
    remember(silent, conn);
    // Then the slot it freed (or, when it was a waiter's, the next).
    let acquire = tokio::time::timeout_at(deadline, free.acquire_owned());
    tokio::pin!(acquire);
    loop {
        tokio::select! {
            permit = &mut acquire => return permit.ok().and_then(Result::ok),
            () = conn.evicted_waiting.notified() => return None,
            r = &mut heard, if listening => on_heard(r, &mut listening),
        }
    }
}

impl<A, I, S> Accept<I, S> for Slots<A>
where
    A: Accept<I, S> + Clone + Send + Sync + 'static,
    A::Future: Send,
    I: Readable + Send + 'static,
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
            let conn = Arc::new(Conn::new());
            let Some(permit) = slot(
                this.free.clone(),
                &this.silent,
                &conn,
                stream.bytes_arrived(),
            )
            .await
            else {
                if conn.evicted.load(Ordering::Acquire) {
                    tracing::debug!(
                        target: "noetl_api::access",
                        "connection closed while it waited for a slot: a newer one took its place"
                    );
                } else {
                    tracing::warn!(
                        target: "noetl_api::access",
                        "connection closed at once: the API holds its maximum of open connections, each of them heard from"
                    );
                }
                return Err(io::Error::other("connection limit reached"));
            };
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

    /// A connection accepted `ago` before now.
    fn accepted(ago: Duration) -> Arc<Conn> {
        let mut c = Conn::new();
        c.since = Instant::now() - ago;
        Arc::new(c)
    }

    #[test]
    fn the_oldest_silent_connection_past_its_grace_is_evicted_and_one_heard_from_is_not() {
        let old = Duration::from_secs(1);
        let silent = Mutex::new(VecDeque::new());
        let (a, b, c, me) = (accepted(old), accepted(old), accepted(old), accepted(old));
        remember(&silent, &a);
        remember(&silent, &b);
        remember(&silent, &c);
        remember(&silent, &me);
        a.spoke.store(true, Ordering::Release);
        let now = Instant::now();
        assert_eq!(evict_oldest_silent(&silent, &me, now), Evict::Evicted);
        assert!(!a.evicted.load(Ordering::Acquire), "it has spoken");
        assert!(b.evicted.load(Ordering::Acquire), "the oldest silent one");
        drop(c);
        assert_eq!(
            evict_oldest_silent(&silent, &me, now),
            Evict::None,
            "none left but itself: the new one is refused"
        );
        let young = accepted(Duration::from_millis(100));
        remember(&silent, &young);
        let left = GRACE - Duration::from_millis(100);
        assert!(
            matches!(evict_oldest_silent(&silent, &me, Instant::now()),
                Evict::Wait(d) if d <= left && d > left - Duration::from_millis(50)),
            "within its grace: not yet"
        );
        assert!(!young.evicted.load(Ordering::Acquire));
    }

    /// A burst: the evictions ahead of a new connection have emptied the
    /// queue and their slots are not back yet; it evicts the oldest waiter
    /// (once past its grace) instead of being closed at once.
    #[tokio::test(flavor = "current_thread")]
    async fn a_burst_of_new_connections_evicts_waiters_not_itself() {
        let free = Arc::new(Semaphore::new(2));
        let silent = Arc::new(Mutex::new(VecDeque::new()));
        let old = Duration::from_secs(1);
        let (a, b) = (accepted(old), accepted(old));
        let slot_a = slot(free.clone(), &silent, &a, std::future::pending())
            .await
            .unwrap();
        let slot_b = slot(free.clone(), &silent, &b, std::future::pending())
            .await
            .unwrap();
        let conns: Vec<Arc<Conn>> = (0..3).map(|_| Arc::new(Conn::new())).collect();
        let mut waiting = Vec::new();
        for c in &conns {
            let (free, silent, c) = (free.clone(), silent.clone(), c.clone());
            waiting.push(tokio::spawn(async move {
                slot(free, &silent, &c, std::future::pending()).await
            }));
            for _ in 0..4 {
                tokio::task::yield_now().await;
            }
        }
        assert!(a.evicted.load(Ordering::Acquire));
        assert!(b.evicted.load(Ordering::Acquire));
        assert!(
            !conns[0].evicted.load(Ordering::Acquire),
            "the oldest waiter is within its grace"
        );
        tokio::time::sleep(GRACE + Duration::from_millis(50)).await;
        assert!(
            conns[0].evicted.load(Ordering::Acquire),
            "then it is evicted"
        );
        // The evicted connections close, giving their slots back.
        drop((slot_a, slot_b));
        let got: Vec<bool> = futures::future::join_all(waiting)
            .await
            .into_iter()
            .map(|r| r.unwrap().is_some())
            .collect();
        assert_eq!(got, [false, true, true]);
    }

    /// A waiting connection whose request arrives is a client: a newer
    /// silent one cannot evict it, and is closed itself.
    #[tokio::test(flavor = "current_thread")]
    async fn a_waiter_that_sends_its_request_is_not_evicted() {
        let free = Arc::new(Semaphore::new(1));
        let silent = Arc::new(Mutex::new(VecDeque::new()));
        let a = accepted(Duration::from_secs(1));
        let slot_a = slot(free.clone(), &silent, &a, std::future::pending())
            .await
            .unwrap();
        let w = accepted(Duration::from_secs(1));
        let waiter = {
            let (free, silent, w) = (free.clone(), silent.clone(), w.clone());
            tokio::spawn(async move { slot(free, &silent, &w, async { Ok(()) }).await })
        };
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        assert!(a.evicted.load(Ordering::Acquire));
        assert!(w.spoke.load(Ordering::Acquire), "its request arrived");
        let n = accepted(Duration::from_secs(1));
        assert!(
            slot(free.clone(), &silent, &n, std::future::pending())
                .await
                .is_none(),
            "nothing silent to evict: closed at once"
        );
        assert!(!w.evicted.load(Ordering::Acquire));
        drop(slot_a);
        assert!(waiter.await.unwrap().is_some(), "it gets the evicted slot");
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
