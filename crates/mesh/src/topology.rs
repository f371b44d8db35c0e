//! Idempotent creation of the streams, consumers and KV buckets the mesh uses.

use async_nats::jetstream::{
    self,
    consumer::{pull, AckPolicy, DeliverPolicy, PullConsumer},
    kv,
    stream::{self, RetentionPolicy, StorageType},
};

use std::time::{Duration, Instant};

use async_nats::jetstream::context::{GetStreamError, GetStreamErrorKind};
use async_nats::jetstream::stream::{ConsumerError, ConsumerErrorKind};

use crate::{MeshConfig, MeshError, Subjects};

/// The KV buckets.
pub struct Buckets {
    /// Execution state (`noetl_exec`).
    pub exec: kv::Store,
    /// `ctx` views (`noetl_ctx`).
    pub ctx: kv::Store,
    /// Loop runs (`noetl_loop`).
    pub loops: kv::Store,
    /// Encrypted credentials (`noetl_credentials`).
    pub credentials: kv::Store,
    /// Registered playbooks (`noetl_catalog`).
    pub catalog: kv::Store,
    /// API tokens, hashed (`noetl_tokens`).
    pub tokens: kv::Store,
    /// Cron schedules and their firing state (`noetl_schedules`).
    pub schedules: kv::Store,
    /// Concurrency and rate limits by key (`noetl_gates`).
    pub gates: kv::Store,
}

fn setup_err(what: impl Into<String>, e: impl std::fmt::Display) -> MeshError {
    MeshError::Setup {
        what: what.into(),
        message: e.to_string(),
    }
}

/// Whether [`ensure`] may create and change the topology.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Services and `noetl admin init`: create what is missing, bring the
    /// replica count to `NOETL_REPLICAS` where JetStream allows.
    Create,
    /// Read-only and client commands: find what exists, change nothing.
    Existing,
}

/// What [`ensure`] needs.
pub struct EnsureParams<'a> {
    /// JetStream context.
    pub js: &'a jetstream::Context,
    /// Names.
    pub subjects: &'a Subjects,
    /// Settings (replicas, windows, ages).
    pub config: &'a MeshConfig,
    /// Create or only find.
    pub mode: Mode,
}

/// The buckets found or made, and what was done to each stream.
pub struct Ensured {
    /// The KV buckets.
    pub buckets: Buckets,
    /// One line per stream (KV buckets are streams `KV_<bucket>`).
    pub report: Vec<StreamReport>,
}

/// What [`ensure`] found or did for one stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamReport {
    /// Stream name (`NOETL_WORK`, `KV_noetl_exec`, ...).
    pub name: String,
    /// Replicas it has now.
    pub replicas: usize,
    /// What happened.
    pub action: Action,
}

/// What happened to one stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// It was created.
    Created,
    /// It was there as wanted (or, read-only, as it is).
    Found,
    /// Its replica count was changed from `from`.
    Rescaled {
        /// Replicas before.
        from: usize,
    },
    /// It has another replica count than wanted and could not be changed.
    Kept {
        /// Replicas wanted.
        wanted: usize,
        /// Why not.
        reason: String,
    },
}

/// What to do about an existing stream's replica count: a plain decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaDecision {
    /// Nothing.
    Keep,
    /// Update the stream to the wanted count.
    Update,
}

/// Decide whether a stream with `have` replicas is changed to `want`: only
/// in [`Mode::Create`], only when they differ (JetStream scales a stream's
/// replicas up and down in place on a cluster; a single server refuses,
/// and the stream is then kept with a warning).
pub fn replica_decision(have: usize, want: usize, mode: Mode) -> ReplicaDecision {
    if mode == Mode::Create && have != want {
        ReplicaDecision::Update
    } else {
        ReplicaDecision::Keep
    }
}

/// Create (or find) the streams and buckets.
///
/// One call site for each of `stream` and `bucket`, in loops: a debug
/// build reserves a stack slot for every future a function builds, and
/// eleven of them inline made this the deepest frame of a mesh's start
/// (about 370 KB; the whole start must fit a 2 MiB test thread).
pub async fn ensure(p: EnsureParams<'_>) -> Result<Ensured, MeshError> {
    let mut report = Vec::new();
    for want in stream_configs(p.subjects, p.config) {
        report.push(stream(&p, want).await?);
    }
    let s = p.subjects;
    let names = [
        s.exec_bucket(),
        s.ctx_bucket(),
        s.loop_bucket(),
        s.credentials_bucket(),
        s.catalog_bucket(),
        s.tokens_bucket(),
        s.schedules_bucket(),
        s.gates_bucket(),
    ];
    let mut stores = Vec::with_capacity(names.len());
    for name in &names {
        let (store, r) = bucket(&p, name).await?;
        stores.push(store);
        report.push(r);
    }
    let Ok([exec, ctx, loops, credentials, catalog, tokens, schedules, gates]) =
        <[kv::Store; 8]>::try_from(stores)
    else {
        unreachable!("one store per bucket name");
    };
    Ok(Ensured {
        buckets: Buckets {
            exec,
            ctx,
            loops,
            credentials,
            catalog,
            tokens,
            schedules,
            gates,
        },
        report,
    })
}

/// The mesh's streams as [`ensure`] wants them: the work queue, the event
/// log and the dead letters.
fn stream_configs(s: &Subjects, c: &MeshConfig) -> [stream::Config; 3] {
    [
        stream::Config {
            name: s.work_stream(),
            subjects: vec![
                s.exec_request(),
                s.tokens_all(),
                s.tasks_all(),
                s.loops_all(),
            ],
            retention: RetentionPolicy::WorkQueue,
            storage: StorageType::File,
            duplicate_window: c.duplicate_window,
            num_replicas: c.replicas,
            ..Default::default()
        },
        stream::Config {
            name: s.events_stream(),
            subjects: vec![s.events_all()],
            retention: RetentionPolicy::Limits,
            storage: StorageType::File,
            duplicate_window: c.duplicate_window,
            // No age limit: a running execution's events are never
            // dropped; the router removes expired executions whole
            // (crate::retention).
            max_age: std::time::Duration::ZERO,
            num_replicas: c.replicas,
            ..Default::default()
        },
        stream::Config {
            name: s.dlq_stream(),
            subjects: vec![s.dead_letters_all()],
            retention: RetentionPolicy::Limits,
            storage: StorageType::File,
            max_age: c.events_max_age,
            num_replicas: c.replicas,
            ..Default::default()
        },
    ]
}

fn missing(p: &EnsureParams<'_>, what: String) -> MeshError {
    MeshError::Missing {
        prefix: p.config.prefix.clone(),
        url: crate::connect::display_urls(&p.config.nats_url),
        what,
    }
}

fn is_not_found(e: &async_nats::jetstream::context::GetStreamError) -> bool {
    matches!(
        e.kind(),
        async_nats::jetstream::context::GetStreamErrorKind::JetStream(j)
            if j.error_code() == async_nats::jetstream::ErrorCode::STREAM_NOT_FOUND
    )
}

/// Find `want.name`, or create it ([`Mode::Create`]); then bring its
/// replica count to `want.num_replicas` where allowed.
async fn stream(p: &EnsureParams<'_>, want: stream::Config) -> Result<StreamReport, MeshError> {
    let name = want.name.clone();
    let what = || format!("stream {name}");
    match p.js.get_stream(&name).await {
        Ok(found) => {
            let have = retain(p, found.cached_info().config.clone(), want.max_age).await;
            rescale(p, have, want.num_replicas).await
        }
        Err(e) if is_not_found(&e) => {
            if p.mode == Mode::Existing {
                return Err(missing(p, what()));
            }
            match p.js.create_stream(want.clone()).await {
                Ok(_) => Ok(StreamReport {
                    name,
                    replicas: want.num_replicas,
                    action: Action::Created,
                }),
                // Another replica may have created it meanwhile.
                Err(create) => match p.js.get_stream(&name).await {
                    Ok(found) => {
                        rescale(p, found.cached_info().config.clone(), want.num_replicas).await
                    }
                    Err(_) => Err(setup_err(what(), replicas_hint(create, want.num_replicas))),
                },
            }
        }
        Err(e) => Err(setup_err(what(), e)),
    }
}

/// A creation error, with what to do when it is the replica count that a
/// single server cannot give.
fn replicas_hint(e: impl std::fmt::Display, replicas: usize) -> String {
    if replicas > 1 {
        format!("{e} (NOETL_REPLICAS={replicas} needs a JetStream cluster of at least {replicas} servers)")
    } else {
        e.to_string()
    }
}

/// Bring an existing stream's age limit to `max_age` (a mesh created
/// before events were kept by execution had one on its event stream),
/// when this process may change the mesh; what could not be changed is
/// logged and kept.
async fn retain(
    p: &EnsureParams<'_>,
    have: stream::Config,
    max_age: std::time::Duration,
) -> stream::Config {
    if p.mode != Mode::Create || have.max_age == max_age {
        return have;
    }
    let mut changed = have.clone();
    changed.max_age = max_age;
    match p.js.update_stream(&changed).await {
        Ok(_) => {
            tracing::info!(stream = %have.name, from_s = have.max_age.as_secs(),
                to_s = max_age.as_secs(), "stream age limit changed (0: none)");
            changed
        }
        Err(e) => {
            tracing::warn!(stream = %have.name, error = %e,
                "stream keeps its age limit; events may age out before their execution ends");
            have
        }
    }
}

async fn rescale(
    p: &EnsureParams<'_>,
    have: stream::Config,
    want: usize,
) -> Result<StreamReport, MeshError> {
    let from = have.num_replicas.max(1);
    let name = have.name.clone();
    if replica_decision(from, want, p.mode) == ReplicaDecision::Keep {
        return Ok(StreamReport {
            name,
            replicas: from,
            action: Action::Found,
        });
    }
    let mut changed = have;
    changed.num_replicas = want;
    match p.js.update_stream(changed).await {
        Ok(_) => {
            tracing::info!(stream = %name, from, to = want, "stream replicas changed");
            Ok(StreamReport {
                name,
                replicas: want,
                action: Action::Rescaled { from },
            })
        }
        Err(e) => {
            let reason = replicas_hint(e, want);
            tracing::warn!(stream = %name, replicas = from, wanted = want, %reason,
                "stream keeps its replica count; NOETL_REPLICAS is not applied to it");
            Ok(StreamReport {
                name,
                replicas: from,
                action: Action::Kept {
                    wanted: want,
                    reason,
                },
            })
        }
    }
}

async fn bucket(p: &EnsureParams<'_>, name: &str) -> Result<(kv::Store, StreamReport), MeshError> {
    let stream_name = format!("KV_{name}");
    let what = || format!("KV bucket {name}");
    let report = match p.js.get_stream(&stream_name).await {
        Ok(found) => rescale(p, found.cached_info().config.clone(), p.config.replicas).await?,
        Err(e) if is_not_found(&e) => {
            if p.mode == Mode::Existing {
                return Err(missing(p, what()));
            }
            let created =
                p.js.create_key_value(kv::Config {
                    bucket: name.to_string(),
                    history: 1,
                    storage: StorageType::File,
                    num_replicas: p.config.replicas,
                    ..Default::default()
                })
                .await;
            match created {
                // The store is opened below, after the read settings.
                Ok(_) => StreamReport {
                    name: stream_name.clone(),
                    replicas: p.config.replicas,
                    action: Action::Created,
                },
                // Another replica may have created it between our two calls.
                Err(e) => match p.js.get_stream(&stream_name).await {
                    Ok(found) => {
                        rescale(p, found.cached_info().config.clone(), p.config.replicas).await?
                    }
                    Err(_) => return Err(setup_err(what(), replicas_hint(e, p.config.replicas))),
                },
            }
        }
        Err(e) => return Err(setup_err(what(), e)),
    };
    if p.mode == Mode::Create {
        read_from_leader(p, &stream_name, report.replicas).await?;
    }
    // After the change above: the store reads the way the stream says.
    let store =
        p.js.get_key_value(name)
            .await
            .map_err(|e| setup_err(what(), e))?;
    Ok((store, report))
}

/// Direct gets (how a KV `get` reads when the stream allows them) are
/// answered by any replica, followers included, so with more than one
/// replica a read right after an acknowledged write can miss it (measured
/// on a 3-node cluster under write load: 16 and 22 of 600 reads from a
/// follower, 0 with direct gets off). The engine reads what it has just
/// written (a loop's collection chunks, plans, run records), so a
/// replicated bucket is read through its leader; a single replica keeps
/// the faster direct gets.
async fn read_from_leader(
    p: &EnsureParams<'_>,
    stream_name: &str,
    replicas: usize,
) -> Result<(), MeshError> {
    let direct = replicas <= 1;
    let what = || format!("stream {stream_name} (direct reads)");
    let found =
        p.js.get_stream(stream_name)
            .await
            .map_err(|e| setup_err(what(), e))?;
    let mut config = found.cached_info().config.clone();
    if config.allow_direct == direct {
        return Ok(());
    }
    config.allow_direct = direct;
    p.js.update_stream(config)
        .await
        .map_err(|e| setup_err(what(), e))?;
    tracing::info!(stream = %stream_name, replicas, direct, "KV reads set");
    Ok(())
}

/// Which stream a consumer reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    /// The work queue (commands).
    Work,
    /// The event log.
    Events,
}

/// A durable pull consumer to create or find.
#[derive(Debug, Clone)]
pub struct ConsumerSpec {
    /// Durable name, shared by every replica of the service.
    pub durable: String,
    /// Stream to read.
    pub stream: StreamKind,
    /// Subjects to receive.
    pub filter_subjects: Vec<String>,
    /// Upper bound of unacknowledged messages across replicas.
    pub max_ack_pending: i64,
}

/// Create or find a durable pull consumer.
pub async fn consumer(
    js: &jetstream::Context,
    s: &Subjects,
    c: &MeshConfig,
    spec: &ConsumerSpec,
) -> Result<PullConsumer, MeshError> {
    let stream_name = match spec.stream {
        StreamKind::Work => s.work_stream(),
        StreamKind::Events => s.events_stream(),
    };
    let what = format!("stream {stream_name}");
    let stream = retry_transient(
        &what,
        |e: &GetStreamError| get_stream_transient(e),
        || js.get_stream(&stream_name),
    )
    .await
    .map_err(|e| setup_err(&what, e))?;
    let durable = format!("{}-{}", s.prefix(), spec.durable);
    let config = pull::Config {
        durable_name: Some(durable.clone()),
        filter_subjects: spec.filter_subjects.clone(),
        ack_policy: AckPolicy::Explicit,
        deliver_policy: DeliverPolicy::All,
        ack_wait: c.ack_wait,
        max_deliver: -1,
        max_ack_pending: spec.max_ack_pending,
        ..Default::default()
    };
    let what = format!("consumer {durable} on {stream_name}");
    let mut consumer: PullConsumer = retry_transient(
        &what,
        |e: &ConsumerError| consumer_transient(e),
        || stream.get_or_create_consumer(&durable, config.clone()),
    )
    .await
    .map_err(|e| setup_err(&what, e))?;
    // A store kept from an older version holds the consumer with its old
    // filters: bring them up to date instead of silently missing subjects.
    let info = consumer.cached_info();
    let mut have: Vec<String> = info.config.filter_subjects.clone();
    if !info.config.filter_subject.is_empty() {
        have.push(info.config.filter_subject.clone());
    }
    have.sort();
    let mut want = spec.filter_subjects.clone();
    want.sort();
    if have != want {
        tracing::info!(consumer = %durable, ?have, ?want, "updating consumer filters");
        consumer = stream
            .update_consumer(config)
            .await
            .map_err(|e| setup_err(format!("consumer {durable} on {stream_name} (update)"), e))?;
    }
    Ok(consumer)
}

/// How long [`consumer`] retries a transient JetStream error: on a cluster,
/// a replica starting while a node restarts sees elections under way (503)
/// and requests that time out; a few seconds later the same call succeeds.
const SETUP_RETRY_FOR: Duration = Duration::from_secs(60);

/// Run `op` until it succeeds, fails for a reason `transient` does not
/// accept, or [`SETUP_RETRY_FOR`] has passed (then its last error).
async fn retry_transient<T, E, F, Fut>(
    what: &str,
    transient: impl Fn(&E) -> bool,
    mut op: F,
) -> Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = Instant::now() + SETUP_RETRY_FOR;
    let mut wait = Duration::from_millis(250);
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if transient(&e) && Instant::now() + wait < deadline => {
                tracing::warn!(%what, error = %e, retry_in_ms = wait.as_millis() as u64, "JetStream setup failed; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e),
        }
    }
}

/// 503: JetStream temporarily unavailable (no leader yet) or no responders.
fn unavailable(e: &jetstream::Error) -> bool {
    e.code() == 503
}

fn get_stream_transient(e: &GetStreamError) -> bool {
    match e.kind() {
        GetStreamErrorKind::Request => true,
        GetStreamErrorKind::JetStream(e) => unavailable(&e),
        _ => false,
    }
}

fn consumer_transient(e: &ConsumerError) -> bool {
    match e.kind() {
        ConsumerErrorKind::TimedOut | ConsumerErrorKind::Request => true,
        ConsumerErrorKind::JetStream(e) => unavailable(&e),
        _ => false,
    }
}

impl crate::Mesh {
    /// Create or find a durable pull consumer.
    pub async fn consumer(&self, spec: &ConsumerSpec) -> Result<PullConsumer, MeshError> {
        consumer(self.js(), self.subjects(), self.config(), spec).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn setup_retries_transient_errors_and_returns_others_at_once() {
        let mut calls = 0;
        let got: Result<u32, String> = retry_transient(
            "thing",
            |e: &String| e == "busy",
            || {
                calls += 1;
                let n = calls;
                async move {
                    if n < 3 {
                        Err("busy".to_string())
                    } else {
                        Ok(n)
                    }
                }
            },
        )
        .await;
        assert_eq!(got, Ok(3), "two transient failures, then success");

        let mut calls = 0;
        let got: Result<u32, String> = retry_transient(
            "thing",
            |e: &String| e == "busy",
            || {
                calls += 1;
                async { Err("bad config".to_string()) }
            },
        )
        .await;
        assert_eq!(got, Err("bad config".to_string()));
        assert_eq!(calls, 1, "a permanent error is not retried");
    }

    #[test]
    fn replicas_change_only_when_creating_and_different() {
        use ReplicaDecision::*;
        assert_eq!(replica_decision(1, 3, Mode::Create), Update);
        assert_eq!(replica_decision(3, 1, Mode::Create), Update);
        assert_eq!(replica_decision(3, 3, Mode::Create), Keep);
        assert_eq!(replica_decision(1, 3, Mode::Existing), Keep);
    }

    #[test]
    fn a_replica_error_says_a_cluster_is_needed() {
        assert!(replicas_hint("insufficient resources", 3).contains("cluster of at least 3"));
        assert_eq!(replicas_hint("boom", 1), "boom");
    }
}
