//! noetl-mesh: what every NoETL service shares to talk over NATS JetStream.
//!
//! Subject and stream names ([`subjects`]), configuration ([`config`]),
//! idempotent creation of streams, consumers and KV buckets ([`topology`]),
//! connecting with server lists, credentials and TLS ([`connect`]),
//! codecs ([`codec`]), deterministic ids ([`ids`]), KV compare-and-set
//! ([`kv`]), event construction ([`events`]), the consumer loop with graceful
//! drain and dead-lettering ([`runtime`]), its health and metrics
//! ([`health`]), the execution state kept in KV
//! ([`state`]), the per-execution plan cache ([`plan`]) and the embedded
//! `nats-server` launcher ([`server`]).

pub mod attempt;
pub mod audit;
pub mod auth_cache;
pub mod backoff;
pub mod cache;
pub mod cancel;
pub mod catalog;
pub mod cleanup;
pub mod commands;
/// Encoding of wire messages (lives in `noetl-wire`, next to the messages).
pub use noetl_wire::codec;
pub mod config;
pub mod connect;
pub mod credentials;
pub mod ctx_owners;
pub mod ctx_record;
pub mod decision_scope;
pub mod dispatch;
pub mod effects;
pub mod error;
pub mod event_type;
pub mod events;
pub mod fold;
pub mod gate;
pub mod gates;
pub mod handled;
pub mod handler;
pub mod health;
pub mod held;
pub mod id_set;
pub mod ids;
pub mod join_record;
pub mod jsz;
pub mod keys;
pub mod kv;
pub mod kv_batch;
pub mod objects;
pub mod outage;
pub mod patches;
pub mod pause;
pub mod payloads;
pub mod plan;
pub mod rebuild;
pub mod rejudge;
pub mod remote;
pub mod replay;
pub mod rerun;
pub mod result_record;
pub mod resume;
pub mod retention;
pub mod runtime;
pub mod scope;
pub mod served;
pub mod server;
pub mod signal;
pub mod state;
pub mod status;
pub mod subjects;
mod summary;
pub mod through;
pub mod token;
pub mod topology;
pub mod waiter;

use crate::event_type::EventType;
use std::sync::Arc;

use async_nats::jetstream::{self, context::PublishAckFuture, kv::Store};
use bytes::Bytes;

pub use config::MeshConfig;
pub use subjects::Subjects;

/// Errors talking to the mesh. Each names the subject, bucket or key involved.
#[derive(Debug, thiserror::Error)]
pub enum MeshError {
    /// Could not connect to NATS.
    #[error("cannot connect to NATS at {url}: {source}")]
    Connect {
        /// The URL tried.
        url: String,
        /// Cause.
        #[source]
        source: async_nats::ConnectError,
    },
    /// Creating or reading a stream, consumer or bucket failed.
    #[error("JetStream setup of {what} failed: {message}")]
    Setup {
        /// Which object.
        what: String,
        /// Cause.
        message: String,
    },
    /// A publish failed (after the client's own retries).
    #[error("publish to {subject} failed: {message}")]
    Publish {
        /// Subject.
        subject: String,
        /// Cause.
        message: String,
    },
    /// A KV operation failed.
    #[error("KV {bucket}/{key}: {message}")]
    Kv {
        /// Bucket.
        bucket: String,
        /// Key.
        key: String,
        /// Cause.
        message: String,
    },
    /// A message or stored value could not be decoded.
    #[error(transparent)]
    Decode(#[from] codec::DecodeError),
    /// Object storage (results by reference) failed.
    #[error(transparent)]
    Object(#[from] objects::ObjectError),
    /// Invalid configuration.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A message or record breaks the contract between the services (it
    /// decodes but names what cannot be): permanent.
    #[error("{0}")]
    Invalid(String),
    /// The mesh's streams or buckets are not there (a read-only command
    /// never creates them).
    #[error("no NoETL mesh with prefix `{prefix}` at {url}: {what} does not exist; start a service (`noetl serve`) or run `noetl admin init` there, or check --prefix / NOETL_PREFIX")]
    Missing {
        /// The prefix looked for.
        prefix: String,
        /// The servers asked (credentials removed).
        url: String,
        /// The first stream or bucket not found.
        what: String,
    },
    /// Consuming messages failed.
    #[error("consumer {consumer}: {message}")]
    Consume {
        /// Consumer name.
        consumer: String,
        /// Cause.
        message: String,
    },
    /// A stored value is not what its key must hold (it does not decode).
    /// Reading it again gives the same bytes: permanent.
    #[error("KV {bucket}/{key} holds a corrupt record: {message}")]
    Corrupt {
        /// Bucket.
        bucket: String,
        /// Key.
        key: String,
        /// Why it does not decode.
        message: String,
    },
    /// A compare-and-set lost to other writers too many times in a row.
    #[error("KV {bucket}/{key}: compare-and-set did not converge after {tries} tries")]
    Conflict {
        /// Bucket.
        bucket: String,
        /// Key.
        key: String,
        /// Attempts made.
        tries: u32,
    },
    /// The execution has no stored plan (never started here, or purged).
    #[error("execution {execution_id} has no plan stored")]
    NoPlan {
        /// The execution.
        execution_id: String,
    },
    /// A credential lookup failed.
    #[error(transparent)]
    Credential(#[from] credentials::CredentialError),
}

/// A connected mesh endpoint: client, JetStream context, names and buckets.
/// Cheap to clone.
#[derive(Clone)]
pub struct Mesh {
    inner: Arc<Inner>,
}

struct Inner {
    client: async_nats::Client,
    js: jetstream::Context,
    subjects: Subjects,
    config: MeshConfig,
    buckets: topology::Buckets,
    plans: Arc<plan::PlanCache>,
    results: objects::ResultStore,
    cancelled: Arc<cancel::Cancellations>,
    /// Paused executions, followed from first use ([`Mesh::pauses`]).
    paused: tokio::sync::OnceCell<Arc<pause::Pauses>>,
    health: Arc<health::Health>,
    served: served::ServedCache,
    outages: outage::Outages,
}

impl Mesh {
    /// Connect to `config.nats_url` and create the streams and buckets
    /// that are missing (what services and `noetl admin init` do).
    pub async fn connect(config: MeshConfig) -> Result<Self, MeshError> {
        let client = Self::client_for(&config).await?;
        Self::with_client(client, config).await
    }

    /// Connect to an existing mesh without creating anything (what
    /// read-only and client commands do): a missing stream or bucket is
    /// [`MeshError::Missing`], naming the prefix.
    pub async fn attach(config: MeshConfig) -> Result<Self, MeshError> {
        let client = Self::client_for(&config).await?;
        Self::join(client, config, topology::Mode::Existing).await
    }

    async fn client_for(config: &MeshConfig) -> Result<async_nats::Client, MeshError> {
        config.validate()?;
        connect::connect(connect::ConnectParams {
            urls: &config.nats_url,
            auth: &config.auth,
            name: "noetl",
        })
        .await
    }

    /// Join the mesh over an existing client, creating what is missing.
    pub async fn with_client(
        client: async_nats::Client,
        config: MeshConfig,
    ) -> Result<Self, MeshError> {
        Self::join(client, config, topology::Mode::Create).await
    }

    async fn join(
        client: async_nats::Client,
        config: MeshConfig,
        mode: topology::Mode,
    ) -> Result<Self, MeshError> {
        let js = jetstream::new(client.clone());
        let subjects = Subjects::new(&config.prefix);
        let buckets = topology::ensure(topology::EnsureParams {
            js: &js,
            subjects: &subjects,
            config: &config,
            mode,
        })
        .await?
        .buckets;
        // The conflict counters of the buckets services write show at 0
        // from the start (a scrape sees the series before any conflict).
        for store in [&buckets.exec, &buckets.ctx, &buckets.loops] {
            let _ = health::kv_cas_conflicts().get_or_create(&health::BucketLabels {
                bucket: store.name.clone(),
            });
        }
        let mut location = config.store_location();
        if let (objects::StoreLocation::S3(s3), Some(name)) = (&mut location, &config.s3_credential)
        {
            if s3.access_key_id.is_none() {
                // S3 keys from the keychain, decrypted here, never logged.
                let vault = credentials::Vault::new(buckets.credentials.clone(), &config);
                let cred = vault
                    .get(name)
                    .await
                    .map_err(|e| s3_credential_error(name, e))?;
                let field = |names: &[&str]| {
                    names
                        .iter()
                        .find_map(|n| cred.data.get(*n).and_then(|v| v.as_str()))
                        .map(str::to_string)
                };
                s3.access_key_id = field(&["access_key_id", "access_key", "key_id"]);
                s3.secret_access_key = field(&["secret_access_key", "secret_key", "secret"]);
                if s3.access_key_id.is_none() || s3.secret_access_key.is_none() {
                    return Err(MeshError::Config(format!(
                        "NOETL_S3_CREDENTIAL={name}: the credential needs `access_key_id` and `secret_access_key`"
                    )));
                }
            }
        }
        let results = objects::ResultStore::open(location)?;
        let plans = Arc::new(plan::PlanCache::default());
        let cancelled = cancel::watch(
            &client,
            &subjects,
            cancel::Watched {
                stopped: vec![
                    subjects.events_of_type(EventType::ExecutionCancelled.wire_name()),
                    subjects.events_of_type(EventType::ExecutionFailed.wire_name()),
                ],
                resumed: subjects.events_of_type(EventType::ExecutionResumed.wire_name()),
                plans: plans.clone(),
            },
        )
        .await?;
        Ok(Self {
            inner: Arc::new(Inner {
                client,
                js,
                subjects,
                config,
                buckets,
                plans,
                results,
                cancelled,
                paused: tokio::sync::OnceCell::new(),
                health: Default::default(),
                served: Default::default(),
                outages: Default::default(),
            }),
        })
    }

    /// A handle that does not keep the mesh alive ([`Mesh::upgrade`]).
    pub(crate) fn downgrade(&self) -> std::sync::Weak<Inner> {
        Arc::downgrade(&self.inner)
    }

    /// The mesh of a [`Mesh::downgrade`] handle, while it lives.
    pub(crate) fn upgrade(weak: &std::sync::Weak<Inner>) -> Option<Self> {
        weak.upgrade().map(|inner| Self { inner })
    }

    /// The core NATS client.
    pub fn client(&self) -> &async_nats::Client {
        &self.inner.client
    }
    /// The JetStream context.
    pub fn js(&self) -> &jetstream::Context {
        &self.inner.js
    }
    /// Names.
    pub fn subjects(&self) -> &Subjects {
        &self.inner.subjects
    }
    /// Configuration.
    pub fn config(&self) -> &MeshConfig {
        &self.inner.config
    }
    /// Kinds recently seen served ([`served`]).
    pub(crate) fn served_cache(&self) -> &served::ServedCache {
        &self.inner.served
    }
    /// When this process last saw the cluster unavailable ([`outage`]).
    pub fn outages(&self) -> &outage::Outages {
        &self.inner.outages
    }
    /// Execution-state bucket.
    pub fn exec_kv(&self) -> &Store {
        &self.inner.buckets.exec
    }
    /// `ctx` bucket.
    pub fn ctx_kv(&self) -> &Store {
        &self.inner.buckets.ctx
    }
    /// Loop-run bucket.
    pub fn loop_kv(&self) -> &Store {
        &self.inner.buckets.loops
    }
    /// The playbook catalog (`noetl_catalog`).
    pub fn catalog(&self) -> catalog::Catalog {
        catalog::Catalog::new(self.inner.buckets.catalog.clone())
    }
    /// The API tokens bucket (`noetl_tokens`: token hashes, names, roles).
    pub fn tokens_kv(&self) -> &Store {
        &self.inner.buckets.tokens
    }
    /// The cron schedules bucket (`noetl_schedules`: `noetl schedule`,
    /// `noetl serve timer`).
    pub fn schedules_kv(&self) -> &Store {
        &self.inner.buckets.schedules
    }
    /// The concurrency and rate limits bucket (`noetl_gates`, [`gate`]).
    pub fn gates_kv(&self) -> &Store {
        &self.inner.buckets.gates
    }
    /// The credential vault (encrypted `noetl_credentials` bucket).
    pub fn vault(&self) -> credentials::Vault {
        credentials::Vault::new(self.inner.buckets.credentials.clone(), &self.inner.config)
    }
    /// Executions this process has heard were cancelled or failed.
    pub fn cancellations(&self) -> &cancel::Cancellations {
        &self.inner.cancelled
    }
    /// Object storage for results by reference.
    pub fn results(&self) -> &objects::ResultStore {
        &self.inner.results
    }
    /// Per-execution plan cache.
    pub fn plans(&self) -> &plan::PlanCache {
        &self.inner.plans
    }
    /// This process's health and metrics (`noetl serve --http-addr`).
    pub fn health(&self) -> &Arc<health::Health> {
        &self.inner.health
    }

    /// Publish `payload` on `subject` with `Nats-Msg-Id: msg_id`; returns the
    /// ack future so callers can pipeline several publishes.
    pub async fn publish(
        &self,
        subject: String,
        msg_id: &str,
        payload: Bytes,
    ) -> Result<PendingAck, MeshError> {
        self.send(subject, msg_id, payload, None).await
    }

    /// Like [`Mesh::publish`], with the execution named in a header for
    /// subjects that do not carry it (task commands), so a dead-lettered
    /// message can still fail its execution.
    pub async fn publish_for_execution(
        &self,
        subject: String,
        msg_id: &str,
        execution_id: &str,
        payload: Bytes,
    ) -> Result<PendingAck, MeshError> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(runtime::HEADER_EXECUTION_ID, execution_id);
        self.send(subject, msg_id, payload, Some(headers)).await
    }

    async fn send(
        &self,
        subject: String,
        msg_id: &str,
        payload: Bytes,
        headers: Option<async_nats::HeaderMap>,
    ) -> Result<PendingAck, MeshError> {
        let mut msg = jetstream::message::PublishMessage::build().payload(payload);
        // The publishing span's trace context, so the consumer's span is its
        // child (nothing when spans are not exported).
        let trace = noetl_telemetry::propagation::current_headers();
        let headers = match (headers, trace.is_empty()) {
            (h, true) => h,
            (h, false) => {
                let mut h = h.unwrap_or_default();
                for (name, value) in trace {
                    h.insert(name, value.as_str());
                }
                Some(h)
            }
        };
        if let Some(h) = headers {
            msg = msg.headers(h);
        }
        // After the headers: `headers` replaces the map `message_id` writes
        // its `Nats-Msg-Id` into (without it JetStream cannot de-duplicate).
        let msg = msg.message_id(msg_id);
        let fut = self
            .inner
            .js
            .send_publish(subject.clone(), msg)
            .await
            .map_err(|e| MeshError::Publish {
                subject: subject.clone(),
                message: e.to_string(),
            })?;
        Ok(PendingAck { subject, fut })
    }

    /// Publish an event on `<p>.evt.<eid>.<type>` (id = `event_id`).
    pub async fn emit(&self, event: &noetl_wire::Event) -> Result<PendingAck, MeshError> {
        let subject = self
            .inner
            .subjects
            .event(&event.execution_id, &event.event_type);
        let bytes = match self.inner.config.event_encoding {
            config::EventEncoding::Protobuf => codec::encode(&events::stored_form(event)),
            config::EventEncoding::Json => codec::event_json(event)
                .map_err(|e| MeshError::Invalid(format!("event {}: {e}", event.event_id)))?
                .into(),
        };
        self.publish(subject, &event.event_id, bytes).await
    }
}

/// A publish whose JetStream ack has not been awaited yet.
pub struct PendingAck {
    subject: String,
    fut: PublishAckFuture,
}

impl PendingAck {
    /// Wait for the ack.
    pub async fn wait(self) -> Result<(), MeshError> {
        self.fut.await.map(|_| ()).map_err(|e| MeshError::Publish {
            subject: self.subject,
            message: e.to_string(),
        })
    }
}

/// A batch of publishes awaited together (one round trip for many messages).
#[derive(Default)]
pub struct Batch {
    acks: Vec<PendingAck>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }
    /// Add a pending ack.
    pub fn push(&mut self, ack: PendingAck) {
        self.acks.push(ack);
    }
    /// Wait for every ack; the first error wins.
    pub async fn wait(self) -> Result<(), MeshError> {
        let results = futures::future::join_all(self.acks.into_iter().map(|a| a.wait())).await;
        results.into_iter().collect()
    }
}

/// The error joining the mesh fails with when the S3 credential
/// `NOETL_S3_CREDENTIAL` names cannot be read: a credentials-bucket outage
/// keeps its kind (transient: a service retries joining), anything else
/// (not stored, undecryptable, misshapen) is this process's configuration.
fn s3_credential_error(name: &str, e: credentials::CredentialError) -> MeshError {
    if e.kind() == error::ErrorKind::Transient {
        MeshError::Credential(e)
    } else {
        MeshError::Config(format!("NOETL_S3_CREDENTIAL={name}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_credentials_outage_at_join_is_transient_other_credential_errors_are_config() {
        let outage = super::s3_credential_error(
            "s3",
            crate::credentials::CredentialError::Kv {
                key: "s3".into(),
                message: "timed out".into(),
            },
        );
        assert_eq!(outage.kind(), crate::error::ErrorKind::Transient);
        let missing = super::s3_credential_error(
            "s3",
            crate::credentials::CredentialError::NotFound { name: "s3".into() },
        );
        assert!(
            matches!(missing, super::MeshError::Config(ref m) if m.contains("NOETL_S3_CREDENTIAL=s3")),
            "{missing}"
        );
    }
}
