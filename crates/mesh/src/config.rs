//! Mesh configuration: defaults, then `NOETL_*` environment variables, then
//! flags (the CLI overlays its flags on [`MeshConfig::from_env`]).

use std::path::PathBuf;
use std::time::Duration;

/// Everything a service needs to join the mesh.
#[derive(Debug, Clone)]
pub struct MeshConfig {
    /// NATS servers, comma-separated (`NOETL_NATS_URL`, else `NATS_URL`;
    /// default `nats://127.0.0.1:4222`). The client fails over between them.
    pub nats_url: String,
    /// NATS credentials and TLS (`NOETL_NATS_*`, else `NATS_*`).
    pub auth: crate::connect::NatsAuth,
    /// Replicas of every stream and KV bucket (`NOETL_REPLICAS`, 1..=5;
    /// 3 on a 3-node JetStream cluster).
    pub replicas: usize,
    /// Subject / stream / bucket prefix (`NOETL_PREFIX`, default `noetl`).
    pub prefix: String,
    /// How long a consumer waits for an ack before redelivering (`NOETL_ACK_WAIT_MS`).
    pub ack_wait: Duration,
    /// Deliveries after which a message that keeps failing is dead-lettered
    /// (once it is also [`Self::dead_letter_age`] old).
    pub max_deliveries: i64,
    /// How old (since it was first stored) a message past
    /// [`Self::max_deliveries`] must be before it is dead-lettered, so the
    /// redeliveries an outage causes (ack waits running out while a node is
    /// down, a store restarting) do not use up a young message's chances
    /// (`NOETL_DEAD_LETTER_AGE_MS`, default 120 s: about the time the
    /// backoff of ten failed deliveries takes).
    pub dead_letter_age: Duration,
    /// JetStream de-duplication window for `Nats-Msg-Id`.
    pub duplicate_window: Duration,
    /// Results above this many bytes travel by reference (`NOETL_INLINE_LIMIT`).
    pub inline_limit: usize,
    /// How long a task command waits for an executor of its kind before
    /// its step-run fails with `executor.unavailable`
    /// (`NOETL_EXECUTOR_WAIT_MS`, default 30 s).
    pub executor_wait: Duration,
    /// Local data directory (object store default root) (`NOETL_HOME`).
    pub data_dir: PathBuf,
    /// How long a terminal execution's events (and KV state) are kept
    /// after it ended (`NOETL_EVENTS_MAX_AGE_S`, default 30 days); a
    /// running execution's are never dropped ([`crate::retention`]).
    pub events_max_age: Duration,
    /// How often the router sweeps expired executions away
    /// (`NOETL_RETENTION_SWEEP_S`, default 1 hour; 0: never).
    pub retention_sweep: Duration,
    /// Where large results are stored (`NOETL_OBJECT_STORE`); `None` = the
    /// directory `objects` under `data_dir`.
    pub object_store: Option<crate::objects::StoreLocation>,
    /// Keychain entry holding the S3 keys (`NOETL_S3_CREDENTIAL`), used when
    /// the location has none: fields `access_key_id`, `secret_access_key`.
    pub s3_credential: Option<String>,
    /// Test mode (`NOETL_DELIVER_TWICE=1`): every message a consumer
    /// handles to an ack is handed back once instead, so its handler runs a
    /// second time after this delay (`NOETL_DELIVER_TWICE_DELAY_MS`, default
    /// 10). `None` in production. See docs/reliability.md.
    pub deliver_twice: Option<Duration>,
    /// How events are published (`NOETL_EVENT_ENCODING`: `protobuf`, the
    /// default, or `json`, readable by any NATS client). Readers accept both.
    pub event_encoding: EventEncoding,
    /// Most iterations of a loop window sent to the executors as one
    /// command (`NOETL_LOOP_BATCH`, default 64; 1: each on its own);
    /// docs/architecture.md "Loop windows in batches".
    pub loop_batch: usize,
    /// Environment values that could not be parsed (reported by `validate`).
    pub env_errors: Vec<String>,
}

/// Default [`MeshConfig::loop_batch`].
pub const DEFAULT_LOOP_BATCH: usize = 64;

/// Most a batch of loop iterations may hold ([`MeshConfig::loop_batch`]).
pub const MAX_LOOP_BATCH: usize = 256;

/// How events are encoded on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EventEncoding {
    /// Protobuf `Event` (compact).
    #[default]
    Protobuf,
    /// JSON, the payload inline as an object (`nats sub` prints it).
    Json,
}

impl EventEncoding {
    /// `protobuf` or `json`; anything else is an error naming the setting.
    pub fn parse(v: &str) -> Result<Self, String> {
        match v.trim().to_ascii_lowercase().as_str() {
            "protobuf" | "proto" => Ok(Self::Protobuf),
            "json" => Ok(Self::Json),
            _ => Err(format!(
                "NOETL_EVENT_ENCODING={v:?}: expected `protobuf` (the default) or `json`"
            )),
        }
    }
}

/// The NATS server used when none is configured.
pub const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";

/// Subject, stream and bucket prefix when none is given (`NOETL_PREFIX`).
pub const DEFAULT_PREFIX: &str = "noetl";

/// Messages a service replica handles at once unless `--concurrency` says
/// otherwise (`noetl serve`, `noetl run`).
pub const DEFAULT_CONCURRENCY: usize = 16;

/// How long a task waits for an executor of its kind by default
/// (`NOETL_EXECUTOR_WAIT_MS`).
pub const DEFAULT_EXECUTOR_WAIT: Duration = Duration::from_secs(30);

/// Most replicas JetStream allows for a stream.
pub const MAX_REPLICAS: usize = 5;

/// Default [`MeshConfig::dead_letter_age`].
pub const DEFAULT_DEAD_LETTER_AGE: Duration = Duration::from_secs(120);

impl Default for MeshConfig {
    fn default() -> Self {
        Self {
            nats_url: DEFAULT_NATS_URL.into(),
            auth: Default::default(),
            replicas: 1,
            prefix: DEFAULT_PREFIX.into(),
            ack_wait: Duration::from_secs(30),
            max_deliveries: 10,
            dead_letter_age: DEFAULT_DEAD_LETTER_AGE,
            duplicate_window: Duration::from_secs(120),
            inline_limit: 64 * 1024,
            executor_wait: DEFAULT_EXECUTOR_WAIT,
            data_dir: default_data_dir(),
            events_max_age: Duration::from_secs(30 * 24 * 3600),
            retention_sweep: Duration::from_secs(3600),
            object_store: None,
            s3_credential: None,
            deliver_twice: None,
            event_encoding: EventEncoding::Protobuf,
            loop_batch: DEFAULT_LOOP_BATCH,
            env_errors: Vec::new(),
        }
    }
}

/// `$NOETL_HOME`, else `$XDG_DATA_HOME/noetl`, else `~/.local/share/noetl`.
pub fn default_data_dir() -> PathBuf {
    if let Some(h) = std::env::var_os("NOETL_HOME") {
        return PathBuf::from(h);
    }
    if let Some(x) = std::env::var_os("XDG_DATA_HOME") {
        return PathBuf::from(x).join("noetl");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| ".".into());
    home.join(".local/share/noetl")
}

impl MeshConfig {
    /// Where results are stored: `object_store`, else `data_dir/objects`.
    pub fn store_location(&self) -> crate::objects::StoreLocation {
        self.object_store
            .clone()
            .unwrap_or_else(|| crate::objects::StoreLocation::Local(self.data_dir.join("objects")))
    }

    /// Defaults overlaid with `NOETL_*` environment variables.
    pub fn from_env() -> Self {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Defaults overlaid with the `NOETL_*` settings `lookup` finds.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let mut c = Self::default();
        let var = |k: &str| lookup(k).filter(|v| !v.is_empty());
        // Ours first, then the `nats` CLI's conventional name.
        let nats = |k: &str| var(&format!("NOETL_{k}")).or_else(|| var(k));
        if let Some(v) = nats("NATS_URL") {
            c.nats_url = v;
        }
        let path = |k: &str| nats(k).map(PathBuf::from);
        c.auth = crate::connect::NatsAuth {
            creds_file: path("NATS_CREDS"),
            nkey_seed_file: path("NATS_NKEY"),
            user: nats("NATS_USER"),
            password: nats("NATS_PASSWORD"),
            token: nats("NATS_TOKEN"),
            tls_ca: path("NATS_CA"),
            tls_cert: path("NATS_CERT"),
            tls_key: path("NATS_KEY"),
            require_tls: false,
        };
        if let Some(v) = var("NOETL_PREFIX") {
            c.prefix = v;
        }
        // A number that does not parse is reported by `validate`, never
        // silently replaced by the default.
        let mut number = |k: &str| -> Option<u64> {
            let v = var(k)?;
            v.trim()
                .parse::<u64>()
                .map_err(|_| {
                    c.env_errors
                        .push(format!("{k}={v:?} is not a whole number"))
                })
                .ok()
        };
        let ack_wait = number("NOETL_ACK_WAIT_MS");
        let inline_limit = number("NOETL_INLINE_LIMIT");
        let events_max_age = number("NOETL_EVENTS_MAX_AGE_S");
        let retention_sweep = number("NOETL_RETENTION_SWEEP_S");
        let replicas = number("NOETL_REPLICAS");
        let twice_delay = number("NOETL_DELIVER_TWICE_DELAY_MS");
        let executor_wait = number("NOETL_EXECUTOR_WAIT_MS");
        let loop_batch = number("NOETL_LOOP_BATCH");
        if let Some(v) = number("NOETL_DEAD_LETTER_AGE_MS") {
            c.dead_letter_age = Duration::from_millis(v);
        }
        if let Some(v) = executor_wait {
            c.executor_wait = Duration::from_millis(v);
        }
        if let Some(v) = ack_wait {
            c.ack_wait = Duration::from_millis(v);
        }
        if let Some(v) = inline_limit {
            c.inline_limit = usize::try_from(v).unwrap_or(usize::MAX);
        }
        if let Some(v) = events_max_age {
            c.events_max_age = Duration::from_secs(v);
        }
        if let Some(v) = retention_sweep {
            c.retention_sweep = Duration::from_secs(v);
        }
        if let Some(v) = replicas {
            c.replicas = usize::try_from(v).unwrap_or(usize::MAX);
        }
        if let Some(v) = loop_batch {
            c.loop_batch = usize::try_from(v).unwrap_or(usize::MAX);
        }
        if matches!(var("NOETL_DELIVER_TWICE").as_deref(), Some("1" | "true")) {
            c.deliver_twice = Some(Duration::from_millis(twice_delay.unwrap_or(10)));
        }
        if let Some(v) = var("NOETL_EVENT_ENCODING") {
            match EventEncoding::parse(&v) {
                Ok(e) => c.event_encoding = e,
                Err(e) => c.env_errors.push(e),
            }
        }
        c.s3_credential = var("NOETL_S3_CREDENTIAL");
        if let Some(v) = var("NOETL_OBJECT_STORE") {
            // A bad value is reported by `validate`, never silently ignored.
            match crate::objects::StoreLocation::parse(&v) {
                Ok(l) => c.object_store = Some(l),
                Err(e) => c.env_errors.push(e.to_string()),
            }
        }
        c
    }

    /// Reject values that cannot work, naming the setting.
    pub fn validate(&self) -> Result<(), crate::MeshError> {
        let bad = |what: &str| Err(crate::MeshError::Config(what.to_string()));
        if let Some(e) = self.env_errors.first() {
            return bad(e);
        }
        if self.prefix.is_empty()
            || !self
                .prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return bad("NOETL_PREFIX must be non-empty and use only [A-Za-z0-9_-]");
        }
        if self.ack_wait < Duration::from_millis(100) {
            return bad("NOETL_ACK_WAIT_MS must be at least 100");
        }
        if self.executor_wait < Duration::from_millis(100) {
            return bad("NOETL_EXECUTOR_WAIT_MS must be at least 100");
        }
        if !(1..=MAX_REPLICAS).contains(&self.replicas) {
            return Err(crate::MeshError::Config(format!(
                "NOETL_REPLICAS={} is out of range: JetStream keeps 1 to {MAX_REPLICAS} replicas (3 on a 3-node cluster)",
                self.replicas
            )));
        }
        if !(1..=MAX_LOOP_BATCH).contains(&self.loop_batch) {
            return Err(crate::MeshError::Config(format!(
                "NOETL_LOOP_BATCH={} is out of range: 1 (every iteration on its own) to {MAX_LOOP_BATCH}",
                self.loop_batch
            )));
        }
        crate::connect::server_list(&self.nats_url)?;
        self.auth.check().map_err(crate::MeshError::Config)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_encoding_is_protobuf_unless_json_is_asked_for() {
        let pick = |v: &'static str| {
            MeshConfig::from_lookup(move |k| (k == "NOETL_EVENT_ENCODING").then(|| v.into()))
        };
        assert_eq!(
            MeshConfig::from_lookup(|_| None).event_encoding,
            EventEncoding::Protobuf
        );
        assert_eq!(pick("json").event_encoding, EventEncoding::Json);
        assert_eq!(pick("JSON").event_encoding, EventEncoding::Json);
        assert_eq!(pick("protobuf").event_encoding, EventEncoding::Protobuf);
        let bad = pick("yaml");
        let e = bad.validate().unwrap_err().to_string();
        assert!(
            e.contains("NOETL_EVENT_ENCODING") && e.contains("json"),
            "{e}"
        );
    }

    #[test]
    fn deliver_twice_is_off_unless_asked_for() {
        assert_eq!(MeshConfig::from_lookup(|_| None).deliver_twice, None);
        let on = MeshConfig::from_lookup(|k| (k == "NOETL_DELIVER_TWICE").then(|| "1".into()));
        assert_eq!(on.deliver_twice, Some(Duration::from_millis(10)));
        let late = MeshConfig::from_lookup(|k| match k {
            "NOETL_DELIVER_TWICE" => Some("true".into()),
            "NOETL_DELIVER_TWICE_DELAY_MS" => Some("1000".into()),
            _ => None,
        });
        assert_eq!(late.deliver_twice, Some(Duration::from_secs(1)));
    }

    #[test]
    fn a_setting_that_is_not_a_number_is_reported_not_ignored() {
        let c = MeshConfig::from_lookup(|k| match k {
            "NOETL_ACK_WAIT_MS" => Some("30s".into()),
            "NOETL_INLINE_LIMIT" => Some("2048".into()),
            _ => None,
        });
        assert_eq!(c.inline_limit, 2048);
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("NOETL_ACK_WAIT_MS=\"30s\""), "{err}");
        assert!(err.contains("not a whole number"), "{err}");
        assert!(MeshConfig::from_lookup(|_| None).validate().is_ok());
    }

    #[test]
    fn nats_settings_read_ours_first_then_the_conventional_names() {
        let c = MeshConfig::from_lookup(|k| match k {
            "NATS_URL" => Some("nats://a:1,nats://b:2".into()),
            "NATS_CREDS" => Some("/etc/nats/user.creds".into()),
            "NOETL_NATS_CA" => Some("/etc/nats/ca.pem".into()),
            "NATS_CA" => Some("/ignored.pem".into()),
            "NOETL_REPLICAS" => Some("3".into()),
            _ => None,
        });
        assert_eq!(c.nats_url, "nats://a:1,nats://b:2");
        assert_eq!(c.auth.creds_file, Some("/etc/nats/user.creds".into()));
        assert_eq!(c.auth.tls_ca, Some("/etc/nats/ca.pem".into()));
        assert_eq!(c.replicas, 3);
        assert!(c.validate().is_ok());
        let d = MeshConfig::from_lookup(|k| (k == "NOETL_NATS_URL").then(|| "nats://x:9".into()));
        assert_eq!(d.nats_url, "nats://x:9");
    }

    #[test]
    fn replicas_out_of_range_are_refused_with_the_setting_named() {
        for bad in ["0", "6"] {
            let c = MeshConfig::from_lookup(|k| (k == "NOETL_REPLICAS").then(|| bad.into()));
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(&format!("NOETL_REPLICAS={bad}")), "{e}");
        }
    }

    #[test]
    fn loop_batch_is_64_unless_set_and_out_of_range_is_refused() {
        assert_eq!(MeshConfig::from_lookup(|_| None).loop_batch, 64);
        let set = |v: &'static str| {
            MeshConfig::from_lookup(move |k| (k == "NOETL_LOOP_BATCH").then(|| v.into()))
        };
        assert_eq!(set("1").loop_batch, 1);
        set("16").validate().unwrap();
        for bad in ["0", "257"] {
            let e = set(bad).validate().unwrap_err().to_string();
            assert!(e.contains(&format!("NOETL_LOOP_BATCH={bad}")), "{e}");
        }
    }
}
