//! What one client may hold of the API: how long it may take to send a
//! request's headers (and, on a kept-alive connection, to start the next
//! request), how long to send its body, how large the body may be, and how
//! many connections the API keeps open at once. A connection over the limit
//! is closed as soon as it is accepted, so idle or slow clients cannot use
//! up the process's file descriptors (its NATS connection and `/api/health`
//! need some); an idle one is closed after the header timeout.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
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
    /// Open connections at most; one more is closed at once.
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
/// (the slot goes back when the connection closes) and closes a
/// connection that finds none.
#[derive(Clone)]
pub struct Slots<A> {
    inner: A,
    free: Arc<Semaphore>,
}

impl<A> Slots<A> {
    /// `max` slots in front of `inner`.
    pub fn new(inner: A, max: usize) -> Self {
        Self {
            inner,
            free: Arc::new(Semaphore::new(max.max(1))),
        }
    }
}

impl<A, I, S> Accept<I, S> for Slots<A>
where
    A: Accept<I, S> + Clone + Send + 'static,
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
        let slot = self.free.clone().try_acquire_owned();
        let inner = self.inner.clone();
        Box::pin(async move {
            let Ok(slot) = slot else {
                tracing::warn!(
                    target: "noetl_api::access",
                    "connection closed at once: the API holds its maximum of open connections"
                );
                return Err(io::Error::other("connection limit reached"));
            };
            let (stream, service) = inner.accept(stream, service).await?;
            Ok((
                Held {
                    inner: stream,
                    _slot: slot,
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
}

impl<T: AsyncRead + Unpin> AsyncRead for Held<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Held<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
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
    fn a_declared_body_over_the_limit_is_refused_before_it_is_read() {
        let max = 6 * 1024 * 1024;
        assert_eq!(body_too_large(None, max), None);
        assert_eq!(body_too_large(Some(max as u64), max), None);
        let e = body_too_large(Some(10_000_000), max).unwrap();
        assert!(e.contains("10000000 bytes") && e.contains("6 MiB"), "{e}");
    }
}
