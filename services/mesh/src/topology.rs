//! Idempotent creation of the streams, consumers and KV buckets the mesh uses.

use async_nats::jetstream::{
    self,
    consumer::{pull, AckPolicy, DeliverPolicy, PullConsumer},
    kv,
    stream::{self, RetentionPolicy, StorageType},
};

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
}

fn setup_err(what: impl Into<String>, e: impl std::fmt::Display) -> MeshError {
    MeshError::Setup {
        what: what.into(),
        message: e.to_string(),
    }
}

/// Create (or find) the streams and buckets.
pub async fn ensure(
    js: &jetstream::Context,
    s: &Subjects,
    c: &MeshConfig,
) -> Result<Buckets, MeshError> {
    let work = s.work_stream();
    js.get_or_create_stream(stream::Config {
        name: work.clone(),
        subjects: vec![
            s.exec_request(),
            s.tokens_all(),
            s.tasks_all(),
            s.loops_all(),
        ],
        retention: RetentionPolicy::WorkQueue,
        storage: StorageType::File,
        duplicate_window: c.duplicate_window,
        ..Default::default()
    })
    .await
    .map_err(|e| setup_err(format!("stream {work}"), e))?;

    let events = s.events_stream();
    js.get_or_create_stream(stream::Config {
        name: events.clone(),
        subjects: vec![s.events_all()],
        retention: RetentionPolicy::Limits,
        storage: StorageType::File,
        duplicate_window: c.duplicate_window,
        max_age: c.events_max_age,
        ..Default::default()
    })
    .await
    .map_err(|e| setup_err(format!("stream {events}"), e))?;

    let dlq = s.dlq_stream();
    js.get_or_create_stream(stream::Config {
        name: dlq.clone(),
        subjects: vec![s.dead_letters_all()],
        retention: RetentionPolicy::Limits,
        storage: StorageType::File,
        max_age: c.events_max_age,
        ..Default::default()
    })
    .await
    .map_err(|e| setup_err(format!("stream {dlq}"), e))?;

    Ok(Buckets {
        exec: bucket(js, &s.exec_bucket()).await?,
        ctx: bucket(js, &s.ctx_bucket()).await?,
        loops: bucket(js, &s.loop_bucket()).await?,
        credentials: bucket(js, &s.credentials_bucket()).await?,
        catalog: bucket(js, &s.catalog_bucket()).await?,
    })
}

async fn bucket(js: &jetstream::Context, name: &str) -> Result<kv::Store, MeshError> {
    match js.get_key_value(name).await {
        Ok(store) => Ok(store),
        Err(_) => match js
            .create_key_value(kv::Config {
                bucket: name.to_string(),
                history: 1,
                storage: StorageType::File,
                ..Default::default()
            })
            .await
        {
            Ok(store) => Ok(store),
            // Another replica may have created it between our two calls.
            Err(e) => js
                .get_key_value(name)
                .await
                .map_err(|_| setup_err(format!("KV bucket {name}"), e)),
        },
    }
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
    let stream = js
        .get_stream(&stream_name)
        .await
        .map_err(|e| setup_err(format!("stream {stream_name}"), e))?;
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
    let mut consumer: PullConsumer = stream
        .get_or_create_consumer(&durable, config.clone())
        .await
        .map_err(|e| setup_err(format!("consumer {durable} on {stream_name}"), e))?;
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

impl crate::Mesh {
    /// Create or find a durable pull consumer.
    pub async fn consumer(&self, spec: &ConsumerSpec) -> Result<PullConsumer, MeshError> {
        consumer(self.js(), self.subjects(), self.config(), spec).await
    }
}
