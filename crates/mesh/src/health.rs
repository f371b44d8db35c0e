//! Health and metrics of one process, for `noetl serve --http-addr`:
//! `/healthz` (is the NATS connection up), `/readyz` (can every consumer
//! loop pull) and `/metrics` (Prometheus counters of what the loops see).
//!
//! A [`Mesh`](crate::Mesh) holds one [`Health`]; every consumer loop
//! registers itself in it ([`Health::register`]) and reports through the
//! returned [`ConsumerHealth`]: whether it can pull, and what it did with
//! each message. The decisions themselves are the plain functions
//! [`liveness`] and [`readiness`].
//!
//! Every metric is registered in one place, [`Metrics::new`]: a new metric is
//! a field there and one `register` call. Labels name consumers and
//! outcomes, never executions (their number is unbounded).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::connection::State;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::error::Disposition;

/// The `Content-Type` of [`Health::render_metrics`]' output.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Why `/healthz` fails: the NATS connection is not up.
pub fn liveness(state: &State) -> Result<(), String> {
    match state {
        State::Connected => Ok(()),
        State::Pending => Err("NATS connection not established yet".into()),
        State::Disconnected => Err("NATS connection lost; reconnecting".into()),
    }
}

/// What one consumer loop reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerStatus {
    /// The consumer loop's name (its durable consumer).
    pub name: String,
    /// `None` when it can pull, else why not.
    pub not_ready: Option<String>,
}

/// Why `/readyz` fails: the connection is down, no consumer loop runs, or
/// one cannot pull (each such consumer is named with its reason). A loop
/// exists only once its durable consumer is bound, so a missing stream or
/// consumer shows as a loop that never starts or whose pulls fail.
pub fn readiness(state: &State, consumers: &[ConsumerStatus]) -> Result<(), String> {
    liveness(state)?;
    if consumers.is_empty() {
        return Err("no consumer loop is running".into());
    }
    let waiting: Vec<String> = consumers
        .iter()
        .filter_map(|c| {
            c.not_ready
                .as_ref()
                .map(|why| format!("consumer {}: {why}", c.name))
        })
        .collect();
    if waiting.is_empty() {
        Ok(())
    } else {
        Err(waiting.join("; "))
    }
}

/// Health and metrics of one process; see the module docs.
pub struct Health {
    consumers: Mutex<Vec<Arc<Slot>>>,
    metrics: Metrics,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            consumers: Mutex::new(Vec::new()),
            metrics: Metrics::new(),
        }
    }
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("consumers", &self.consumers())
            .finish_non_exhaustive()
    }
}

/// One registered consumer loop.
struct Slot {
    name: String,
    not_ready: Mutex<Option<String>>,
}

impl Health {
    /// Register a consumer loop named `name`: not ready until its first
    /// pull succeeds. It is unregistered when the last clone of the returned
    /// handle is dropped.
    pub fn register(self: &Arc<Self>, name: &str) -> ConsumerHealth {
        let slot = Arc::new(Slot {
            name: name.to_string(),
            not_ready: Mutex::new(Some("has not pulled yet".into())),
        });
        lock(&self.consumers).push(slot.clone());
        ConsumerHealth {
            inner: Arc::new(Registration {
                metrics: self.metrics.for_consumer(name),
                slot,
                health: self.clone(),
            }),
        }
    }

    /// What every registered consumer loop reports, in registration order.
    pub fn consumers(&self) -> Vec<ConsumerStatus> {
        lock(&self.consumers)
            .iter()
            .map(|s| ConsumerStatus {
                name: s.name.clone(),
                not_ready: lock(&s.not_ready).clone(),
            })
            .collect()
    }

    /// [`readiness`] of this process over a connection in `state`.
    pub fn ready(&self, state: &State) -> Result<(), String> {
        readiness(state, &self.consumers())
    }

    /// The metrics, for code that counts more than the consumer loop.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The Prometheus (OpenMetrics) text exposition of every metric, with
    /// `noetl_nats_connected` taken from `state`.
    pub fn render_metrics(&self, state: &State) -> String {
        self.metrics
            .nats_connected
            .set(i64::from(*state == State::Connected));
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.metrics.registry);
        out
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A consumer loop's handle on the process [`Health`]: cheap to clone.
#[derive(Clone)]
pub struct ConsumerHealth {
    inner: Arc<Registration>,
}

struct Registration {
    slot: Arc<Slot>,
    metrics: ConsumerMetrics,
    health: Arc<Health>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        lock(&self.health.consumers).retain(|s| !Arc::ptr_eq(s, &self.slot));
    }
}

impl ConsumerHealth {
    /// The consumer loop's name.
    pub fn name(&self) -> &str {
        &self.inner.slot.name
    }

    /// A pull succeeded (a message came, or the request ended empty).
    pub fn ready(&self) {
        *lock(&self.inner.slot.not_ready) = None;
    }

    /// The loop cannot pull, because of `reason`.
    pub fn not_ready(&self, reason: &str) {
        *lock(&self.inner.slot.not_ready) = Some(reason.to_string());
    }

    /// A pull request failed with `error`: counted, and not ready.
    pub fn pull_failed(&self, error: &str) {
        self.inner.metrics.pull_failures.inc();
        self.not_ready(&format!("pull failed: {error}"));
    }

    /// A message delivered `delivered` times is being handled; it counts as
    /// in flight until the returned guard is dropped.
    pub fn started(&self, delivered: i64) -> InFlight {
        let m = &self.inner.metrics;
        if delivered > 1 {
            m.redeliveries.inc();
        }
        m.in_flight.inc();
        InFlight(m.in_flight.clone())
    }

    /// The handler took `elapsed`.
    pub fn handled_in(&self, elapsed: Duration) {
        self.inner
            .metrics
            .handler_duration
            .observe(elapsed.as_secs_f64());
    }

    /// The message ends with `disposition`.
    pub fn disposed(&self, disposition: &Disposition) {
        let m = &self.inner.metrics;
        match disposition {
            Disposition::Ack => &m.ack,
            Disposition::Retry(_) => &m.retry,
            Disposition::Backoff => &m.backoff,
            Disposition::DeadLetter(_) => &m.dead_letter,
            Disposition::HandBack(_) => &m.handed_back,
        }
        .inc();
    }
}

/// A message in flight; see [`ConsumerHealth::started`].
pub struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Labels naming a consumer loop.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConsumerLabels {
    /// The consumer loop's name.
    pub consumer: String,
}

/// Labels naming a consumer loop and what became of a message.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MessageLabels {
    /// The consumer loop's name.
    pub consumer: String,
    /// `ack`, `retry`, `backoff` or `dead_letter`.
    pub disposition: &'static str,
}

type HistogramFamily<S> = Family<S, Histogram, fn() -> Histogram>;

/// Labels of a task run: its tool kind and outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TaskLabels {
    /// Tool kind.
    pub kind: String,
    /// `ok` or `error`.
    pub status: &'static str,
}

/// A tool kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// Tool kind.
    pub kind: String,
}

/// A loop iteration's event: `started`, `done` or `failed`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IterationLabels {
    /// What happened to the iteration.
    pub event: &'static str,
}

/// An execution's status: `started`, `completed`, `failed` or `cancelled`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExecutionLabels {
    /// Started, or how it ended.
    pub status: &'static str,
}

/// A KV bucket.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BucketLabels {
    /// The bucket's name.
    pub bucket: String,
}

/// Compare-and-set conflicts by bucket, counted by `kv` for the
/// whole process (a KV write does not know its mesh) and registered into
/// every [`Metrics`].
pub fn kv_cas_conflicts() -> &'static Family<BucketLabels, Counter> {
    static CONFLICTS: std::sync::OnceLock<Family<BucketLabels, Counter>> =
        std::sync::OnceLock::new();
    CONFLICTS.get_or_init(Family::default)
}

/// Every metric of the process, registered in [`Metrics::new`].
pub struct Metrics {
    registry: Registry,
    /// `noetl_messages_total{consumer,disposition}`.
    pub messages: Family<MessageLabels, Counter>,
    /// `noetl_handler_duration_seconds{consumer}`.
    pub handler_duration: HistogramFamily<ConsumerLabels>,
    /// `noetl_redeliveries_total{consumer}`: messages delivered more than once.
    pub redeliveries: Family<ConsumerLabels, Counter>,
    /// `noetl_in_flight{consumer}`.
    pub in_flight: Family<ConsumerLabels, Gauge>,
    /// `noetl_pull_failures_total{consumer}`.
    pub pull_failures: Family<ConsumerLabels, Counter>,
    /// `noetl_nats_connected`: 1 while connected, else 0.
    pub nats_connected: Gauge,
    /// `noetl_tasks_total{kind,status}`: task runs by tool kind and outcome.
    pub tasks: Family<TaskLabels, Counter>,
    /// `noetl_task_duration_seconds{kind}`: time in the tool per task run.
    pub task_duration: HistogramFamily<KindLabels>,
    /// `noetl_loop_iterations_total{event}`: iterations started, done, failed.
    pub loop_iterations: Family<IterationLabels, Counter>,
    /// `noetl_executions_total{status}`: executions started and ended.
    pub executions: Family<ExecutionLabels, Counter>,
}

fn handler_histogram() -> Histogram {
    // 1 ms to ~4 min: routing decisions up to long tool calls.
    Histogram::new(exponential_buckets(0.001, 4.0, 10))
}

impl Metrics {
    /// Create and register every metric: the one place to add one.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let messages = Family::<MessageLabels, Counter>::default();
        registry.register(
            "noetl_messages",
            "Messages a consumer loop finished with, by disposition",
            messages.clone(),
        );
        let handler_duration: HistogramFamily<ConsumerLabels> =
            Family::new_with_constructor(handler_histogram);
        registry.register(
            "noetl_handler_duration_seconds",
            "Time a consumer loop's handler took per message",
            handler_duration.clone(),
        );
        let redeliveries = Family::<ConsumerLabels, Counter>::default();
        registry.register(
            "noetl_redeliveries",
            "Messages a consumer loop received more than once",
            redeliveries.clone(),
        );
        let in_flight = Family::<ConsumerLabels, Gauge>::default();
        registry.register(
            "noetl_in_flight",
            "Messages a consumer loop is handling now",
            in_flight.clone(),
        );
        let pull_failures = Family::<ConsumerLabels, Counter>::default();
        registry.register(
            "noetl_pull_failures",
            "Pull requests of a consumer loop that failed",
            pull_failures.clone(),
        );
        let nats_connected = Gauge::default();
        registry.register(
            "noetl_nats_connected",
            "1 while the NATS connection is up, else 0",
            nats_connected.clone(),
        );
        let tasks = Family::<TaskLabels, Counter>::default();
        registry.register(
            "noetl_tasks",
            "Task runs by tool kind and outcome (each attempt of each iteration)",
            tasks.clone(),
        );
        let task_duration: HistogramFamily<KindLabels> =
            Family::new_with_constructor(handler_histogram);
        registry.register(
            "noetl_task_duration_seconds",
            "Time a task run spent in its tool",
            task_duration.clone(),
        );
        let loop_iterations = Family::<IterationLabels, Counter>::default();
        registry.register(
            "noetl_loop_iterations",
            "Loop iterations started, done and failed",
            loop_iterations.clone(),
        );
        let executions = Family::<ExecutionLabels, Counter>::default();
        registry.register(
            "noetl_executions",
            "Executions started and ended, by status",
            executions.clone(),
        );
        registry.register(
            "noetl_kv_cas_conflicts",
            "KV compare-and-set attempts that lost to another writer, by bucket",
            kv_cas_conflicts().clone(),
        );
        Self {
            registry,
            messages,
            handler_duration,
            redeliveries,
            in_flight,
            pull_failures,
            nats_connected,
            tasks,
            task_duration,
            loop_iterations,
            executions,
        }
    }

    /// A task run of `kind` ended (`ok` or not) after `duration_ms` in its tool.
    pub fn task_ended(&self, kind: &str, ok: bool, duration_ms: u64) {
        let status = if ok { "ok" } else { "error" };
        self.tasks
            .get_or_create(&TaskLabels {
                kind: kind.to_string(),
                status,
            })
            .inc();
        self.task_duration
            .get_or_create(&KindLabels {
                kind: kind.to_string(),
            })
            .observe(duration_ms as f64 / 1000.0);
    }

    /// A loop iteration `started`, was `done` or `failed`.
    pub fn iteration(&self, event: &'static str) {
        self.loop_iterations
            .get_or_create(&IterationLabels { event })
            .inc();
    }

    /// An execution `started`, or ended `completed` / `failed` / `cancelled`.
    pub fn execution(&self, status: &'static str) {
        self.executions
            .get_or_create(&ExecutionLabels { status })
            .inc();
    }

    /// The series of consumer `name`, created now so that they show (at 0)
    /// before the first message.
    fn for_consumer(&self, name: &str) -> ConsumerMetrics {
        let labels = ConsumerLabels {
            consumer: name.to_string(),
        };
        let message = |disposition| {
            self.messages.get_or_create_owned(&MessageLabels {
                consumer: name.to_string(),
                disposition,
            })
        };
        ConsumerMetrics {
            ack: message("ack"),
            retry: message("retry"),
            backoff: message("backoff"),
            dead_letter: message("dead_letter"),
            handed_back: message("handed_back"),
            handler_duration: self.handler_duration.get_or_create_owned(&labels),
            redeliveries: self.redeliveries.get_or_create_owned(&labels),
            in_flight: self.in_flight.get_or_create_owned(&labels),
            pull_failures: self.pull_failures.get_or_create_owned(&labels),
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// One consumer loop's series.
struct ConsumerMetrics {
    ack: Counter,
    retry: Counter,
    backoff: Counter,
    dead_letter: Counter,
    handed_back: Counter,
    handler_duration: Histogram,
    redeliveries: Counter,
    in_flight: Gauge,
    pull_failures: Counter,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(name: &str, not_ready: Option<&str>) -> ConsumerStatus {
        ConsumerStatus {
            name: name.into(),
            not_ready: not_ready.map(str::to_string),
        }
    }

    #[test]
    fn liveness_follows_the_connection() {
        assert_eq!(liveness(&State::Connected), Ok(()));
        let lost = liveness(&State::Disconnected).unwrap_err();
        assert!(lost.contains("NATS connection lost"), "{lost}");
        let pending = liveness(&State::Pending).unwrap_err();
        assert!(pending.contains("not established"), "{pending}");
    }

    #[test]
    fn ready_only_when_connected_and_every_consumer_can_pull() {
        let all = [
            status("router-requests", None),
            status("router-events", None),
        ];
        assert_eq!(readiness(&State::Connected, &all), Ok(()));

        // The connection comes first: no consumer can pull without it.
        let down = readiness(&State::Disconnected, &all).unwrap_err();
        assert!(down.contains("NATS connection lost"), "{down}");

        // Nothing registered yet (still binding consumers) is not ready.
        let none = readiness(&State::Connected, &[]).unwrap_err();
        assert_eq!(none, "no consumer loop is running");

        // Each consumer that cannot pull is named with its reason, on one line.
        let some = [
            status("router-requests", Some("has not pulled yet")),
            status("router-events", None),
            status("scheduler", Some("pull failed: 503")),
        ];
        let why = readiness(&State::Connected, &some).unwrap_err();
        assert_eq!(
            why,
            "consumer router-requests: has not pulled yet; consumer scheduler: pull failed: 503"
        );
        assert!(!why.contains('\n'));
    }

    #[test]
    fn a_consumer_is_not_ready_until_it_pulls_and_again_after_a_failure() {
        let health = Arc::new(Health::default());
        assert_eq!(
            health.ready(&State::Connected).unwrap_err(),
            "no consumer loop is running"
        );
        let a = health.register("a");
        let b = health.register("b");
        assert_eq!(
            health.ready(&State::Connected).unwrap_err(),
            "consumer a: has not pulled yet; consumer b: has not pulled yet"
        );
        a.ready();
        b.ready();
        assert_eq!(health.ready(&State::Connected), Ok(()));
        b.pull_failed("stream not found");
        assert_eq!(
            health.ready(&State::Connected).unwrap_err(),
            "consumer b: pull failed: stream not found"
        );
        b.ready();
        assert_eq!(health.ready(&State::Connected), Ok(()));

        // A loop that ends (its last handle dropped) is unregistered.
        let clone = b.clone();
        drop(b);
        assert_eq!(health.consumers().len(), 2);
        drop(clone);
        assert_eq!(health.consumers(), vec![status("a", None)]);
    }

    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn metrics_render_as_prometheus_text_by_consumer_and_disposition() {
        let health = Arc::new(Health::default());
        let router = health.register("router-requests");
        let executor = health.register("executor-python");
        router.disposed(&Disposition::Ack);
        router.disposed(&Disposition::Ack);
        router.disposed(&Disposition::Retry(None));
        executor.disposed(&Disposition::Backoff);
        executor.disposed(&Disposition::DeadLetter("bad".into()));
        router.pull_failed("timeout");
        let first = router.started(1);
        let again = router.started(3);
        router.handled_in(Duration::from_millis(2));
        drop(first);

        let text = health.render_metrics(&State::Connected);
        let at = |s: &str| sample(&text, s).unwrap_or_else(|| panic!("no {s} in:\n{text}"));
        assert_eq!(
            at(r#"noetl_messages_total{consumer="router-requests",disposition="ack"}"#),
            2.0
        );
        assert_eq!(
            at(r#"noetl_messages_total{consumer="router-requests",disposition="retry"}"#),
            1.0
        );
        assert_eq!(
            at(r#"noetl_messages_total{consumer="router-requests",disposition="dead_letter"}"#),
            0.0
        );
        assert_eq!(
            at(r#"noetl_messages_total{consumer="executor-python",disposition="backoff"}"#),
            1.0
        );
        assert_eq!(
            at(r#"noetl_messages_total{consumer="executor-python",disposition="dead_letter"}"#),
            1.0
        );
        assert_eq!(
            at(r#"noetl_pull_failures_total{consumer="router-requests"}"#),
            1.0
        );
        assert_eq!(
            at(r#"noetl_redeliveries_total{consumer="router-requests"}"#),
            1.0
        );
        assert_eq!(at(r#"noetl_in_flight{consumer="router-requests"}"#), 1.0);
        assert_eq!(
            at(r#"noetl_handler_duration_seconds_count{consumer="router-requests"}"#),
            1.0
        );
        assert_eq!(
            at(r#"noetl_handler_duration_seconds_bucket{le="0.004",consumer="router-requests"}"#),
            1.0
        );
        assert_eq!(at("noetl_nats_connected"), 1.0);
        assert!(text.contains("# TYPE noetl_messages counter"), "{text}");
        assert!(
            text.contains("# TYPE noetl_handler_duration_seconds histogram"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");

        drop(again);
        let text = health.render_metrics(&State::Disconnected);
        assert_eq!(sample(&text, "noetl_nats_connected"), Some(0.0));
        assert_eq!(
            sample(&text, r#"noetl_in_flight{consumer="router-requests"}"#),
            Some(0.0)
        );
    }
}
