//! noetl-testkit: the test harness. Every test gets its own real
//! `nats-server -js` on a free loopback port with a fresh store directory;
//! both are removed when the [`TestServer`] is dropped (like async-nats's own
//! test harness). Nothing is shared between tests, nothing is left behind.
//! [`TestCluster`] is the same for a three-node JetStream cluster.

use noetl_mesh::server::{NatsServerProcess, ServerOptions, SyncPolicy};

pub mod cluster;
pub mod gcs;
pub mod lagging;
pub mod moto;
pub mod s3;
pub use cluster::TestCluster;
pub use s3::S3Server;

/// A private nats-server for one test.
pub struct TestServer {
    // Field order matters: the process stops before the directory goes.
    process: NatsServerProcess,
    _store: tempfile::TempDir,
    /// Its monitoring port's address, when it has one
    /// ([`TestServer::start_monitored`]).
    monitor: Option<std::net::SocketAddr>,
}

impl TestServer {
    /// Start a server; panics with the reason (e.g. "run `make setup`").
    pub fn start() -> Self {
        Self::try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Start a server.
    pub fn try_start() -> Result<Self, noetl_mesh::server::ServerError> {
        Self::try_start_with_sync(SyncPolicy::default())
    }

    /// Start a server that writes to disk as `sync` says; panics with the
    /// reason.
    pub fn start_with_sync(sync: SyncPolicy) -> Self {
        Self::try_start_with_sync(sync).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Start a server that writes to disk as `sync` says.
    pub fn try_start_with_sync(sync: SyncPolicy) -> Result<Self, noetl_mesh::server::ServerError> {
        let store = store_dir()?;
        let opts = options(&store);
        let process = NatsServerProcess::start_with_sync(opts, sync)?;
        Ok(Self {
            process,
            _store: store,
            monitor: None,
        })
    }

    /// Start a server that writes to disk as `sync` says, with a
    /// monitoring port on loopback, whose counters [`TestServer::varz`]
    /// reads (what a benchmark's unit of work exchanged with it); panics
    /// with the reason.
    pub fn start_monitored(sync: SyncPolicy) -> Self {
        // The monitoring port is chosen before the server binds it: taken
        // meanwhile, the start fails, and another port is tried.
        let mut last = None;
        for _ in 0..5 {
            match Self::try_start_monitored(sync) {
                Ok(s) => return s,
                Err(e) => last = Some(e),
            }
        }
        panic!("{}", last.expect("five attempts"))
    }

    /// One attempt of [`TestServer::start_monitored`].
    fn try_start_monitored(sync: SyncPolicy) -> Result<Self, noetl_mesh::server::ServerError> {
        let store = store_dir()?;
        let port = cluster::free_ports(1)[0];
        let config = store.path().join("monitored.conf");
        let text = format!(
            "{}http: \"127.0.0.1:{port}\"\n",
            sync.config_text().unwrap_or_default()
        );
        std::fs::write(&config, text).map_err(|source| {
            noetl_mesh::server::ServerError::StoreDir {
                path: config.display().to_string(),
                source,
            }
        })?;
        let process = NatsServerProcess::start_with_config(options(&store), &config)?;
        Ok(Self {
            process,
            _store: store,
            monitor: Some(std::net::SocketAddr::from(([127, 0, 0, 1], port))),
        })
    }

    /// The server's `/varz` (its counters: `in_msgs`, `out_msgs`...);
    /// `None` when it has no monitoring port or does not answer.
    pub fn varz(&self) -> Option<serde_json::Value> {
        cluster::monitor_get(self.monitor?, "/varz")
    }

    /// The client URL.
    pub fn url(&self) -> String {
        self.process.url()
    }

    /// The server's process id.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// The store directory (removed on drop).
    pub fn store_dir(&self) -> &std::path::Path {
        self._store.path()
    }

    /// A connected client.
    pub async fn client(&self) -> async_nats::Client {
        async_nats::connect(self.url())
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url()))
    }
}

/// A fresh store directory, removed on drop.
fn store_dir() -> Result<tempfile::TempDir, noetl_mesh::server::ServerError> {
    tempfile::Builder::new()
        .prefix("noetl-test-nats-")
        .tempdir()
        .map_err(|source| noetl_mesh::server::ServerError::StoreDir {
            path: std::env::temp_dir().display().to_string(),
            source,
        })
}

/// A server on a free port storing into `store`, the binary searched.
fn options(store: &tempfile::TempDir) -> ServerOptions {
    ServerOptions {
        store_dir: store.path().to_path_buf(),
        port: None,
        binary: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_nats::jetstream;

    #[tokio::test]
    async fn two_servers_jetstream_and_cleanup() {
        let a = TestServer::start();
        let b = TestServer::start();
        assert_ne!(a.url(), b.url());
        let js = jetstream::new(a.client().await);
        js.get_or_create_stream(jetstream::stream::Config {
            name: "T".into(),
            subjects: vec!["t.>".into()],
            ..Default::default()
        })
        .await
        .unwrap();
        let ack = js.publish("t.x", "hi".into()).await.unwrap().await.unwrap();
        assert_eq!(ack.sequence, 1);
        let dir = a.store_dir().to_path_buf();
        assert!(dir.exists());
        drop(a);
        assert!(!dir.exists(), "store dir must be removed on drop");
    }

    #[tokio::test]
    async fn a_monitored_server_counts_what_its_clients_exchange() {
        let plain = TestServer::start();
        assert!(plain.varz().is_none(), "no monitoring port unless asked");
        let s = TestServer::start_monitored(SyncPolicy::default());
        let count = |k: &str| s.varz().unwrap()[k].as_u64().unwrap();
        let client = s.client().await;
        let mut sub = client.subscribe("c.x").await.unwrap();
        client.flush().await.unwrap();
        let (was_in, was_out) = (count("in_msgs"), count("out_msgs"));
        for _ in 0..10 {
            client.publish("c.x", "hi".into()).await.unwrap();
        }
        for _ in 0..10 {
            futures::StreamExt::next(&mut sub).await.unwrap();
        }
        assert_eq!(count("in_msgs") - was_in, 10);
        assert_eq!(count("out_msgs") - was_out, 10);
    }

    #[test]
    fn missing_binary_is_a_clear_error() {
        let err = NatsServerProcess::start(ServerOptions {
            store_dir: std::env::temp_dir().join("noetl-missing-bin"),
            port: None,
            binary: Some("/nonexistent/nats-server".into()),
        })
        .err()
        .expect("must fail");
        assert!(
            err.to_string().contains("/nonexistent/nats-server"),
            "{err}"
        );
    }
}
