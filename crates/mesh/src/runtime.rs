//! The consumer loop every service runs: pull from a durable consumer, handle
//! up to `concurrency` messages at once, ack / nak / dead-letter each, and on
//! shutdown stop pulling and drain what is in flight.

use crate::event_type::EventType;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{consumer::PullConsumer, AckKind, Message};
use futures::StreamExt;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::health::ConsumerHealth;
use crate::{Mesh, MeshError};

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

pub use crate::error::Disposition;

/// In deliver-twice mode, a message's first delivery that its handler
/// finished (would ack) is handed back instead, after `twice`'s delay, so
/// every handler runs twice on every message; any other outcome, or a
/// later delivery, stands.
pub fn hand_back(d: &Disposition, delivered: i64, twice: Option<Duration>) -> Option<Duration> {
    match (d, twice) {
        (Disposition::Ack, Some(delay)) if delivered <= 1 => Some(delay),
        _ => None,
    }
}

/// A message handler.
pub trait Handler: Send + Sync + 'static {
    /// Handle one message. Must be idempotent: messages can be redelivered.
    fn handle(&self, msg: Arc<Message>) -> BoxFuture<'static, Disposition>;
}

/// One consumer loop.
pub struct ConsumerLoop {
    /// Name for logs and the dead-letter subject.
    pub name: String,
    /// The durable consumer.
    pub consumer: PullConsumer,
    /// Messages handled at once by this replica.
    pub concurrency: usize,
    /// The handler.
    pub handler: Arc<dyn Handler>,
    /// Cancelled on shutdown.
    pub shutdown: CancellationToken,
}

/// How long one pull request waits for messages before it is renewed.
const PULL_EXPIRES: Duration = Duration::from_secs(5);

/// Run a consumer loop until `shutdown` is cancelled, then drain.
///
/// The loop registers in [`Mesh::health`] under its name: ready once a pull
/// succeeds (a message comes, or the request ends empty while connected),
/// not ready while pulls fail and once it drains.
///
/// Messages are pulled only for free handler slots: a message is never
/// delivered to this replica to wait in a buffer while its ack-wait runs
/// (where a long handler would make it redeliver elsewhere), and on
/// shutdown nothing is left stranded in a prefetch buffer.
pub async fn run(mesh: Mesh, cl: ConsumerLoop) -> Result<(), MeshError> {
    let slots = Arc::new(Semaphore::new(cl.concurrency.max(1)));
    run_sharing(mesh, cl, slots).await
}

// Over 80 lines on purpose: the pull loop with its shutdown, backoff and slot accounting in
// one place, so the drain at the end can rely on them.
/// [`run`] with handler slots shared by several consumer loops (an executor
/// serving several kinds handles `concurrency` messages at once in all).
/// `slots` must hold `cl.concurrency` permits.
pub async fn run_sharing(
    mesh: Mesh,
    cl: ConsumerLoop,
    slots: Arc<Semaphore>,
) -> Result<(), MeshError> {
    let concurrency = cl.concurrency.max(1);
    let permits = slots;
    let mut failures = 0u32;
    let health = mesh.health().register(&cl.name);
    'pull: loop {
        // Wait for a free slot without taking it (loops sharing the slots
        // must not starve while this one waits for messages), then ask for
        // as many messages as there are free slots.
        let free = tokio::select! {
            _ = cl.shutdown.cancelled() => break,
            p = permits.acquire() => {
                let free = 1 + permits.available_permits();
                drop(p.expect("semaphore is never closed"));
                free
            }
        };
        let batch = cl
            .consumer
            .batch()
            .max_messages(free)
            .expires(PULL_EXPIRES)
            .messages()
            .await;
        let mut batch = match batch {
            Ok(b) => b,
            Err(e) => match pull_failed(&mesh, &cl, &health, &mut failures, e.to_string()).await {
                Resume::Pull => continue,
                Resume::Shutdown => break,
            },
        };
        loop {
            let next = tokio::select! {
                _ = cl.shutdown.cancelled() => break 'pull,
                m = batch.next() => m,
            };
            let msg = match next {
                None => {
                    // Ended empty: answered by the server, or timed out
                    // client-side because the connection is down.
                    if pull_ended(&mesh, &health) {
                        failures = 0;
                    }
                    break;
                }
                Some(Ok(m)) => {
                    failures = 0;
                    health.ready();
                    Arc::new(m)
                }
                Some(Err(e)) => {
                    // A status (consumer deleted, no responders...): back
                    // off as for a failed request rather than spin.
                    match pull_failed(&mesh, &cl, &health, &mut failures, e.to_string()).await {
                        Resume::Pull => break,
                        Resume::Shutdown => break 'pull,
                    }
                }
            };
            // Normally free: this loop asked only for free slots. Loops
            // sharing the slots may have taken them meanwhile; then the
            // message waits here, kept alive by in-progress acks.
            let permit = match permits.clone().try_acquire_owned() {
                Ok(p) => p,
                Err(_) => match wait_for_slot(&mesh, &cl, &permits, &msg).await {
                    Some(p) => p,
                    None => break 'pull,
                },
            };
            let handler = cl.handler.clone();
            let mesh = mesh.clone();
            let health = health.clone();
            tokio::spawn(async move {
                let _permit = permit;
                dispatch(&mesh, &health, handler, msg).await;
            });
        }
    }
    health.not_ready("draining");
    // Drain: wait until every in-flight handler has returned its permit.
    let _all = permits
        .acquire_many(concurrency as u32)
        .await
        .expect("semaphore is never closed");
    tracing::info!(consumer = %cl.name, "drained");
    Ok(())
}

/// A pull that ended without a message: ready again if NATS is connected
/// (true), else not ready, naming the connection state.
fn pull_ended(mesh: &Mesh, health: &crate::health::ConsumerHealth) -> bool {
    match mesh.client().connection_state() {
        async_nats::connection::State::Connected => {
            health.ready();
            true
        }
        state => {
            mesh.outages().note();
            health.not_ready(&format!("pull unanswered: NATS {state}"));
            false
        }
    }
}

/// Whether the `failures`th failed pull in a row is logged as a warning:
/// the first, then one in 30 (about a minute apart once the delay reached
/// its 2 s cap), so an outage is seen without a line every two seconds.
fn loud_pull_failure(failures: u32) -> bool {
    failures == 1 || failures.is_multiple_of(30)
}

/// What a consumer loop does after waiting out a failed pull.
enum Resume {
    /// Pull again.
    Pull,
    /// The service is shutting down.
    Shutdown,
}

/// A failed pull (request or status): counted, reported to health, and
/// waited out with [`Backoff::PULL`](crate::backoff::Backoff::PULL) (or
/// until shutdown).
async fn pull_failed(
    mesh: &Mesh,
    cl: &ConsumerLoop,
    health: &crate::health::ConsumerHealth,
    failures: &mut u32,
    error: String,
) -> Resume {
    *failures += 1;
    mesh.outages().note();
    health.pull_failed(&error);
    let wait = crate::backoff::Backoff::PULL.delay(*failures);
    if loud_pull_failure(*failures) {
        tracing::warn!(consumer = %cl.name, %error, failures = *failures,
            retry_in_ms = wait.as_millis() as u64, "pull failed");
    } else {
        tracing::debug!(consumer = %cl.name, %error, failures = *failures, "pull failed");
    }
    tokio::select! {
        _ = cl.shutdown.cancelled() => Resume::Shutdown,
        _ = tokio::time::sleep(wait) => Resume::Pull,
    }
}

/// Wait for a handler slot for `msg`, telling JetStream it is in progress
/// meanwhile. On shutdown the message is handed back (NAK, no delay) for
/// another replica, and `None` is returned.
async fn wait_for_slot(
    mesh: &Mesh,
    cl: &ConsumerLoop,
    permits: &Arc<Semaphore>,
    msg: &Message,
) -> Option<tokio::sync::OwnedSemaphorePermit> {
    let period = mesh.config().ack_wait / 2;
    let slot = async {
        tokio::select! {
            p = permits.clone().acquire_owned() => Some(p.expect("semaphore is never closed")),
            _ = cl.shutdown.cancelled() => None,
        }
    };
    let permit = heartbeat(msg, period, slot).await;
    if permit.is_none() {
        let _ = msg.ack_with(AckKind::Nak(None)).await;
    }
    permit
}

/// Drive `work` while telling JetStream every `period` (at least 50 ms)
/// that `msg` is still being worked on, so it is not redelivered
/// elsewhere meanwhile: the one in-progress ack of the mesh (a message
/// waiting for a handler slot, a pipeline running).
pub async fn heartbeat<T>(msg: &Message, period: Duration, work: impl Future<Output = T>) -> T {
    let period = period.max(Duration::from_millis(50));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    tokio::pin!(work);
    loop {
        tokio::select! {
            out = &mut work => return out,
            _ = tick.tick() => {
                if let Err(e) = msg.ack_with(AckKind::Progress).await {
                    tracing::debug!(error = %e, "in-progress ack failed");
                }
            }
        }
    }
}

/// Delay before the `n`th attempt after a transient failure: 250 ms,
/// doubling, at most 30 s: ten deliveries take about a minute and a half,
/// and a message is dead-lettered only past ten deliveries and two minutes
/// ([`chances_used`]).
fn backoff(n: u32) -> Duration {
    crate::backoff::Backoff::MESSAGE.delay(n)
}

/// Whether a message delivered `delivered` times, first stored `age` ago,
/// has had its chances and is dead-lettered unhandled: more than `max`
/// deliveries and at least `min_age` old. An outage inflates the count
/// without the handler failing (every ack wait that runs out while a node
/// is down is one more delivery), so the count alone would dead-letter
/// work a short outage only delayed. Past three times `max` it goes
/// whatever its age (a handler that fails fast, a clock that puts
/// `published` in the future); an unknown age counts as old.
pub fn chances_used(delivered: i64, age: Option<Duration>, max: i64, min_age: Duration) -> bool {
    delivered > max && (age.is_none_or(|a| a >= min_age) || delivered > max.saturating_mul(3))
}

async fn dispatch(
    mesh: &Mesh,
    health: &ConsumerHealth,
    handler: Arc<dyn Handler>,
    msg: Arc<Message>,
) {
    let name = health.name();
    let delivered = msg.info().map(|i| i.delivered).unwrap_or(1);
    let _in_flight = health.started(delivered);
    let age = age(&msg);
    let cfg = mesh.config();
    let disposition = if chances_used(delivered, age, cfg.max_deliveries, cfg.dead_letter_age) {
        Disposition::DeadLetter(format!("delivered {delivered} times without being handled"))
    } else {
        let started = std::time::Instant::now();
        let span = consume_span(mesh, name, &msg);
        let fut = span
            .in_scope(|| handler.handle(msg.clone()))
            .instrument(span);
        let d = match tokio::spawn(fut).await {
            Ok(d) => d,
            Err(e) => Disposition::DeadLetter(format!("handler panicked: {e}")),
        };
        health.handled_in(started.elapsed());
        d
    };
    let disposition = match hand_back(&disposition, delivered, mesh.config().deliver_twice) {
        Some(delay) => Disposition::HandBack(delay),
        None => disposition,
    };
    health.disposed(&disposition);
    let acked = match disposition {
        Disposition::HandBack(delay) => msg.ack_with(AckKind::Nak(Some(delay))).await,
        Disposition::Ack => msg.ack().await,
        Disposition::Retry(delay) => msg.ack_with(AckKind::Nak(delay)).await,
        Disposition::Backoff => {
            let wait = backoff(u32::try_from(delivered).unwrap_or(u32::MAX));
            msg.ack_with(AckKind::Nak(Some(wait))).await
        }
        Disposition::DeadLetter(reason) => {
            tracing::error!(consumer = %name, subject = %msg.subject, %reason, "dead-lettering message");
            if let Err(e) = dead_letter(mesh, name, &msg, &reason).await {
                tracing::error!(consumer = %name, error = %e, "dead-letter publish failed; will be redelivered");
                let _ = msg
                    .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                    .await;
                return;
            }
            if let Err(e) = announce_dead_letter(mesh, name, &msg, &reason).await {
                // The copy is safe in the DLQ, but the notice is what ends
                // the execution waiting on the message: delivered again,
                // both are published again (same ids, kept once).
                tracing::error!(consumer = %name, error = %e, "dead-letter notice not published; will be redelivered");
                let _ = msg
                    .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                    .await;
                return;
            }
            msg.ack().await
        }
    };
    if let Err(e) = acked {
        tracing::warn!(consumer = %name, subject = %msg.subject, error = %e, "ack failed; message will be redelivered");
    }
}

/// The span a consumer handles `msg` in: parented to the trace context the
/// message carries (`traceparent`), else to the root span of its execution
/// ([`noetl_telemetry::root`]), so every hop of an execution is in its one
/// trace. Debug level: free unless spans are exported or logged at debug.
fn consume_span(mesh: &Mesh, consumer: &str, msg: &Message) -> tracing::Span {
    let span = tracing::debug_span!(
        "consume",
        otel.name = %format_args!("consume {consumer}"),
        otel.kind = "consumer",
        messaging.system = "nats",
        messaging.destination.name = %msg.subject,
        consumer = %consumer,
    );
    if !noetl_telemetry::enabled() {
        return span;
    }
    let parent = trace_parent(msg).or_else(|| {
        let eid = execution_of(mesh, msg)?;
        noetl_telemetry::root::context(&crate::ids::trace_id_for("", &eid), &eid)
    });
    match parent {
        Some(cx) => {
            noetl_telemetry::propagation::set_parent(&span, cx);
            span
        }
        // Nothing to attach it to (an execution request from outside): the
        // handler starts the trace itself.
        None => tracing::Span::none(),
    }
}

/// The trace context `msg` was published with (its `traceparent` and
/// `tracestate` headers), when valid.
pub fn trace_parent(msg: &Message) -> Option<noetl_telemetry::Context> {
    use noetl_telemetry::propagation::{parent_from, TRACEPARENT, TRACESTATE};
    let header = |name: &str| {
        msg.headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str())
    };
    parent_from(header(TRACEPARENT), header(TRACESTATE))
}

/// Header naming the subject a dead letter came from.
pub const HEADER_ORIGINAL_SUBJECT: &str = "Noetl-Original-Subject";
/// Header with the reason a message was dead-lettered.
pub const HEADER_REASON: &str = "Noetl-Dead-Letter-Reason";
/// Header naming the execution a work message belongs to, on subjects that
/// do not carry it (task commands).
pub const HEADER_EXECUTION_ID: &str = "Noetl-Execution-Id";

/// The execution a message belongs to: from its subject
/// (`<p>.token.<eid>`, `<p>.loop.<eid>`, `<p>.evt.<eid>.<type>`) or from its
/// [`HEADER_EXECUTION_ID`] header.
pub fn execution_of(mesh: &Mesh, msg: &Message) -> Option<String> {
    // A subject outside the prefix may still carry the header.
    let from_subject = mesh
        .subjects()
        .parse(msg.subject.as_str())
        .and_then(|p| p.execution())
        .map(str::to_string);
    from_subject.or_else(|| {
        msg.headers
            .as_ref()?
            .get(HEADER_EXECUTION_ID)
            .map(|v| v.as_str().to_string())
            .filter(|e| !e.is_empty())
    })
}

/// Tell the execution's router that one of its messages was dead-lettered,
/// so the execution fails with the reason instead of waiting forever.
async fn announce_dead_letter(
    mesh: &Mesh,
    name: &str,
    msg: &Message,
    reason: &str,
) -> Result<(), MeshError> {
    let notice_suffix = format!(".{}", EventType::MessageDeadLettered.wire_name());
    if msg.subject.as_str().ends_with(&notice_suffix) {
        return Ok(()); // never a notice about a notice
    }
    let Some(eid) = execution_of(mesh, msg) else {
        return Ok(());
    };
    let seq = msg
        .info()
        .map(|i| i.stream_sequence.to_string())
        .unwrap_or_default();
    let discriminator = format!("{}#{seq}", msg.subject);
    let event = crate::events::EventDraft {
        execution_id: &eid,
        discriminator: &discriminator,
        ..Default::default()
    }
    .build(&crate::payloads::DeadLettered {
        consumer: name.to_string(),
        subject: msg.subject.to_string(),
        reason: reason.to_string(),
    });
    mesh.emit(&event).await?.wait().await
}

async fn dead_letter(
    mesh: &Mesh,
    name: &str,
    msg: &Message,
    reason: &str,
) -> Result<(), MeshError> {
    let subject = mesh.subjects().dead_letter(name);
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(HEADER_ORIGINAL_SUBJECT, msg.subject.as_str());
    let one_line: String = reason
        .chars()
        .filter(|c| *c != '\n' && *c != '\r')
        .take(1000)
        .collect();
    headers.insert(HEADER_REASON, one_line.as_str());
    // One copy per original message, however often this is retried.
    let seq = msg
        .info()
        .map(|i| format!("{}:{}", i.stream, i.stream_sequence))
        .unwrap_or_else(|_| msg.subject.to_string());
    let id = format!("dlq:{name}:{seq}");
    headers.insert("Nats-Msg-Id", id.as_str());
    let ack = mesh
        .js()
        .publish_with_headers(subject.clone(), headers, msg.payload.clone())
        .await
        .map_err(|e| MeshError::Publish {
            subject: subject.clone(),
            message: e.to_string(),
        })?;
    ack.await.map_err(|e| MeshError::Publish {
        subject,
        message: e.to_string(),
    })?;
    Ok(())
}

/// What to do with a message whose handling failed with `e`, from its
/// kind alone ([`crate::error::dispose`]): a transient failure or a lost
/// compare-and-set is retried with a growing delay; anything retrying
/// cannot fix (a corrupt record, a missing object) is dead-lettered at
/// once, which fails the execution with this reason.
pub fn retry_on(e: &MeshError) -> Disposition {
    let kind = e.kind();
    if kind.is_retryable() {
        tracing::warn!(error = %e, ?kind, "transient failure; message will be retried");
    }
    crate::error::dispose(kind, e.to_string())
}

/// Why a message was not handled: the one error every service's handlers
/// return.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// A mesh failure: its kind decides between a retry and a dead letter
    /// ([`retry_on`]).
    #[error(transparent)]
    Mesh(#[from] MeshError),
    /// The message can never be handled: dead-lettered with this reason.
    #[error("{0}")]
    Refused(String),
    /// The message's work is over and nothing of it is owed: its execution
    /// ended and its state was removed since (`noetl admin compact`), so a
    /// late copy is acked unhandled, writing nothing back. The reason is
    /// logged.
    #[error("{0}")]
    Over(String),
    /// Nothing of the message's execution is found: no plan, no events.
    /// Either it never existed, or the message was read before what was
    /// written for it reached this reader (a stream leader that changed
    /// right after the write). A young message is retried with backoff
    /// ([`unknown`]); an old one, or one of unknown age, is dead-lettered
    /// with this reason.
    #[error("{0}")]
    Unknown(String),
}

/// How long a message of an unknown execution ([`HandlerError::Unknown`])
/// keeps being retried before it is dead-lettered: a leader election of
/// the cluster's streams takes a few seconds, and a message first stored
/// within this of now can still be ahead of the writes it follows.
pub const UNKNOWN_GRACE: Duration = Duration::from_secs(30);

/// What a message of an unknown execution, first stored `age` ago, gets:
/// retried with backoff while younger than [`UNKNOWN_GRACE`], else
/// dead-lettered with `reason` (an unknown age counts as old).
pub fn unknown(reason: String, age: Option<Duration>) -> Disposition {
    match age {
        Some(a) if a < UNKNOWN_GRACE => {
            tracing::warn!(%reason, age_ms = a.as_millis() as u64, "execution not found yet; message will be retried");
            Disposition::Backoff
        }
        _ => Disposition::DeadLetter(reason),
    }
}

/// How long ago `msg` was first stored (`None` when its metadata does
/// not say, or the clock puts it in the future).
pub fn age(msg: &Message) -> Option<Duration> {
    let published = msg.info().ok()?.published;
    std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::from(published))
        .ok()
}

/// What to do with a message first stored `age` ago once its handler
/// returned `result`.
pub fn disposition(result: Result<(), HandlerError>, age: Option<Duration>) -> Disposition {
    match result {
        Ok(()) => Disposition::Ack,
        Err(HandlerError::Mesh(e)) => retry_on(&e),
        Err(HandlerError::Refused(reason)) => Disposition::DeadLetter(reason),
        Err(HandlerError::Unknown(reason)) => unknown(reason, age),
        Err(HandlerError::Over(reason)) => {
            tracing::info!(%reason, "late message acked unhandled");
            Disposition::Ack
        }
    }
}

/// Decode a message's payload as `what`, or refuse it naming its subject.
pub fn decode<M: prost::Message + Default>(
    what: &'static str,
    msg: &Message,
) -> Result<M, HandlerError> {
    crate::codec::decode(what, &msg.payload)
        .map_err(|e| HandlerError::Refused(format!("{e} (subject {})", msg.subject)))
}

/// Decode an event message, JSON or protobuf
/// ([`crate::codec::decode_event`]); refused, naming the subject, when it
/// is neither.
pub fn decode_event(msg: &Message) -> Result<noetl_wire::Event, HandlerError> {
    crate::events::decode(msg)
        .map_err(|e| HandlerError::Refused(format!("{e} (subject {})", msg.subject)))
}

/// What every service needs to run: the mesh, how many messages a replica
/// handles at once, and the shutdown signal.
#[derive(Clone)]
pub struct ServiceParams {
    /// Connected mesh.
    pub mesh: Mesh,
    /// Messages handled at once by this replica.
    pub concurrency: usize,
    /// Cancelled on shutdown (SIGTERM / Ctrl-C); services then drain.
    pub shutdown: CancellationToken,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_young_message_past_its_deliveries_gets_more_chances_an_old_one_does_not() {
        let min = Duration::from_secs(120);
        let young = Some(Duration::from_secs(20));
        let old = Some(Duration::from_secs(121));
        assert!(!chances_used(10, old, 10, min), "within max_deliveries");
        assert!(chances_used(11, old, 10, min), "past them, and old");
        assert!(
            !chances_used(11, young, 10, min),
            "an outage's redeliveries"
        );
        assert!(!chances_used(30, young, 10, min));
        assert!(
            chances_used(31, young, 10, min),
            "three times max: whatever its age"
        );
        assert!(
            chances_used(11, None, 10, min),
            "an unknown age counts as old"
        );
        assert!(chances_used(11, young, 10, Duration::ZERO));
    }

    #[test]
    fn a_handler_result_decides_its_disposition() {
        assert!(matches!(disposition(Ok(()), None), Disposition::Ack));
        let refused = disposition(
            Err(HandlerError::Refused("token t1 names step x".into())),
            None,
        );
        assert!(
            matches!(&refused, Disposition::DeadLetter(r) if r == "token t1 names step x"),
            "{refused:?}"
        );
        let outage = MeshError::Kv {
            bucket: "b".into(),
            key: "k".into(),
            message: "timed out".into(),
        };
        assert!(matches!(
            disposition(Err(outage.into()), None),
            Disposition::Backoff
        ));
        let corrupt = MeshError::Corrupt {
            bucket: "b".into(),
            key: "e1".into(),
            message: "eof".into(),
        };
        assert!(matches!(
            disposition(Err(corrupt.into()), None),
            Disposition::DeadLetter(_)
        ));
        let over = HandlerError::Over("execution e1 ended and its state was removed".into());
        assert!(matches!(disposition(Err(over), None), Disposition::Ack));
    }

    #[test]
    fn a_message_of_an_unknown_execution_is_retried_while_young_then_dead_lettered() {
        let unknown = || {
            Err(HandlerError::Unknown(
                "token for unknown execution e1".into(),
            ))
        };
        let secs = |s| Some(Duration::from_secs(s));
        assert!(matches!(
            disposition(unknown(), secs(0)),
            Disposition::Backoff
        ));
        assert!(matches!(
            disposition(unknown(), secs(29)),
            Disposition::Backoff
        ));
        for old in [secs(30), secs(600), None] {
            assert!(
                matches!(
                    disposition(unknown(), old),
                    Disposition::DeadLetter(r) if r == "token for unknown execution e1"
                ),
                "{old:?}"
            );
        }
    }

    #[test]
    fn deliver_twice_hands_back_only_a_first_delivery_that_would_be_acked() {
        let ms = Duration::from_millis;
        let twice = Some(ms(10));
        assert_eq!(hand_back(&Disposition::Ack, 1, twice), Some(ms(10)));
        assert_eq!(hand_back(&Disposition::Ack, 2, twice), None);
        assert_eq!(hand_back(&Disposition::Ack, 1, None), None);
        for other in [
            Disposition::Retry(None),
            Disposition::Backoff,
            Disposition::DeadLetter("bad".into()),
        ] {
            assert_eq!(hand_back(&other, 1, twice), None, "{other:?}");
        }
    }

    #[test]
    fn a_long_outage_warns_on_its_first_failed_pull_then_once_a_minute() {
        let loud: Vec<u32> = (1..=100).filter(|n| loud_pull_failure(*n)).collect();
        assert_eq!(loud, [1, 30, 60, 90]);
    }

    #[test]
    fn backoff_doubles_from_250ms_up_to_30s() {
        let ms: Vec<u128> = (1..=10).map(|n| backoff(n).as_millis()).collect();
        assert_eq!(
            ms,
            [250, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
        assert_eq!(backoff(0).as_millis(), 250);
        assert_eq!(backoff(u32::MAX).as_millis(), 30000);
        // Ten deliveries last long enough for a server restart.
        let total: u128 = ms.iter().sum();
        assert!(total > 100_000, "{total}");
    }
}
